"""kvviz.ui.fused: the Compare tab's fused-against-unfused view (lesson 7): the same decode through both exact caches
(DynamicCache, and StaticCache, which writes each token in place where DynamicCache copies its history at every step)
and through each format twice, fused and unfused, on the tab's model, live on this machine.

The library does the work (kvviz.quality.fused_vs_unfused): one WikiText-2 prompt, one prefill shared by every
run, each run's steps timed one by one in rounds and its median step kept. Fused is the backend that reads the packed buffers in place (on
the CPU kernels/cpu/decode.py's numba kernel, on CUDA Triton's); unfused is the torch reference, which dequantizes the whole
history at every step. Where the fused path does not run (numba missing), the result says so instead of showing the
reference twice.

Beside it, tokens/s against context: the model's recorded `python -m kvviz bench --contexts` run (1K to 8K, with
each format's byte ceiling over StaticCache; kvviz.quality.speed.recorded_by_context) as curves, this run's exact
and fused points as diamonds, so the crossover shows where it happens and why.

api_name:
    fused_speed(specs, custom_specs, context_tokens, new_tokens, model, language)
      -> (table, figure, status markdown, speed-by-context figure); the table: format, decode path, tokens/s,
         x DynamicCache, x StaticCache, MiB read per step
"""

from __future__ import annotations

import time

import gradio as gr

from kvviz import plots, quality
from kvviz.quality.decode import DYNAMIC, STATIC, WARMUP
from kvviz.quality.speed import EXACT, FUSED
from kvviz.formats.family import REGISTRY

from .common import (ScaleNotes, check_int, check_language, check_model, fitting_specs, get_model, on_click, spec_list,
                     table, user_errors)
from .i18n import Translator, t

DEFAULT_SPECS = ["int4", "k8v4"]
MAX_FORMATS = 3  # each format adds two timed runs (fused, unfused)
MIN_CONTEXT, MAX_CONTEXT, DEFAULT_CONTEXT = 128, 4096, 1024
MIN_NEW, MAX_NEW, DEFAULT_NEW = 2, 32, 6
ROUNDS = 2  # rounds of every run's timed steps (quality.step_times), median step kept
MIB = 2**20


def _path_label(run, report, lang: str) -> str:
    """The table's decode-path cell: what really decoded this run."""
    if run.path == EXACT:
        return t("fused_path_exact", lang)
    if run.path != FUSED:
        return t("fused_path_unfused", lang)
    if run.fused:
        return t("fused_path_fused", lang).format(backend=run.backend)
    return t("fused_path_fallback", lang).format(why=t(f"fused_why_{run.why or 'no_branch'}", lang))


def _headers(lang: str = "en") -> list[str]:
    return [t(k, lang) for k in ("fused_h_format", "fused_h_path", "fused_h_tps", "fused_h_vs", "fused_h_vs_static",
                                 "fused_h_mib")]


def _rows(report, lang: str) -> list[list]:
    return [[r.name, _path_label(r, report, lang), round(r.tokens_per_s, 2), f"{r.vs_exact:.2f}×",
             f"{r.vs_static:.2f}×", round(r.bytes_read / MIB, 3)] for r in report.runs]


def _status(report, seconds: float, name: str, cut: int | None, skipped: list[str], lang: str) -> str:
    """What was run, whether fused and unfused agree token for token, and whether fused really ran."""
    parts = [t("fused_done", lang).format(s=seconds, model=name, n=report.context, rounds=report.rounds,
                                          steps=report.new_tokens, backend=report.fused_backend)]
    if cut is not None:
        parts.append(t("fused_cut", lang).format(asked=cut, n=report.context))
    same = [f for f in report.formats if report.same_tokens(f)]
    differ = [f for f in report.formats if not report.same_tokens(f)]
    if same:
        parts.append(t("fused_same", lang).format(n=len(report.runs[0].tokens), formats=", ".join(f"`{f}`" for f in same)))
    if differ:
        parts.append(t("fused_differ", lang).format(formats=", ".join(f"`{f}`" for f in differ)))
    if not report.fused_available:
        parts.append(t("fused_unavailable", lang).format(backend=report.fused_backend))
    else:
        for why in ("no_branch", "lossless"):
            plain = [r.name for r in report.runs if r.path == FUSED and not r.fused and (r.why or "no_branch") == why]
            if plain:
                parts.append(t(f"fused_{why}", lang).format(formats=", ".join(f"`{f}`" for f in plain)))
    if skipped:
        parts.append(f"{t('r_skipped', lang)} " + "; ".join(skipped))
    return "\n\n".join(parts)


@user_errors
def run(specs, custom_specs, context_tokens, new_tokens, model=None, lang="en", progress=gr.Progress()):
    """tokens/s and bytes read per decode step of the exact caches and of each format fused and unfused, on `model`:
    table, bars, status (in `lang`)."""
    lang = check_language(lang)
    name = check_model(model)
    names = spec_list(specs, custom_specs, MAX_FORMATS)  # kvviz.Plans, parsed here once
    if not names:
        raise ValueError("Pick at least one format to decode fused and unfused (e.g. int4).")
    plans = [n for n in names if not n.is_uniform]
    if plans:
        raise ValueError(f"{plans[0].name!r} is a per-layer plan; this view times one format for every layer. Type "
                         "a single K/V spec such as k=int8,v=int4, or compare the plan in the table above.")
    context = check_int(context_tokens, "Prompt tokens", MIN_CONTEXT, MAX_CONTEXT)
    new = check_int(new_tokens, "Decode tokens", MIN_NEW, MAX_NEW)
    lm, tok = get_model(progress, name)
    names, skipped = fitting_specs(names, lm)
    positions = int(getattr(lm.config.get_text_config(decoder=True), "max_position_embeddings", 0) or 1 << 30)
    cut = None
    if context + WARMUP + new + 1 > positions:  # warm-up steps, timed steps and one spare
        cut, context = context, positions - WARMUP - new - 1
    progress(0.1, desc=t("p_fused", lang).format(n=context, runs=1 + 2 * len(names), rounds=ROUNDS))
    start = time.perf_counter()
    notes = ScaleNotes()
    with notes.catching():
        report = quality.fused_vs_unfused(lm, quality.wikitext_ids(tok, context), names, new, ROUNDS)
    notes.toast()
    rows = _rows(report, lang)
    headers = _headers(lang)
    labels = [r.name if r.path == EXACT else f"{r.name} · {t('fused_' + r.path, lang)}" for r in report.runs]
    fig = plots.metrics_bars(labels, {t("fused_c_tps", lang): [round(r.tokens_per_s, 2) for r in report.runs],
                                      t("fused_c_mib", lang): [round(r.bytes_read / MIB, 3) for r in report.runs]},
                             title=t("fused_fig", lang).format(model=name, n=report.context),
                             x_title=t("fused_fig_x", lang))
    curve, note = _by_context(report, name, lang)
    status = _status(report, time.perf_counter() - start, name, cut, skipped, lang) + notes.markdown()
    return table(rows, headers), fig, status + "\n\n" + note, curve


def _by_context(report, name: str, lang: str):
    """(figure, its note): the recorded speed-by-context curves of the formats this run timed fused (and of the exact
    caches), their byte ceilings dashed (StaticCache's speed times the ceiling; DynamicCache's in a record made
    before StaticCache joined), and this run's exact and fused points."""
    live = {r.name: (report.context, round(r.tokens_per_s, 2)) for r in report.runs if r.path in (EXACT, FUSED)}
    recorded = quality.recorded_by_context(name)
    contexts, tps, ceilings = [], {}, {}
    if recorded is not None:
        by_context = recorded["contexts"]
        contexts = sorted(int(c) for c in by_context)
        base_name = STATIC if all(STATIC in by_context[str(x)] for x in contexts) else DYNAMIC
        base = [by_context[str(x)][base_name]["tokens_per_s"] for x in contexts]
        exact = {r.name for r in report.runs if r.path == EXACT}
        shown = [c for c in live if all(c in by_context[str(x)] for x in contexts)]
        for cache in shown:
            rows = [by_context[str(x)][cache] for x in contexts]
            tps[cache] = [r["tokens_per_s"] for r in rows]
            if cache not in exact:
                ceilings[cache] = [b * r["ceiling"] for b, r in zip(base, rows)]
        note = t("fused_ctx_recorded", lang).format(command=recorded["command"], machine=recorded["machine"],
                                                    date=recorded["date"])
    else:
        note = t("fused_ctx_none", lang).format(model=name)
    fig = plots.speed_by_context(contexts, tps, ceilings, live, t("fused_ctx_fig", lang).format(model=name),
                                 x_title=t("fused_ctx_x", lang), y_title=t("fused_c_tps", lang))
    return fig, note


def build(tr: Translator, actions: dict, model: gr.Dropdown, lang: gr.Radio) -> dict:
    """Lay out the view (an accordion, inside the current tab) on the tab's model picker `model` and the page's
    language `lang`; adds its action to `actions` as "fused"; returns its components, keys prefixed "fused_"."""
    c: dict = {}
    c["fused_box"] = tr(gr.Accordion(t("fused_title"), open=False, elem_id="compare-fused"), label="fused_title")
    with c["fused_box"]:
        tr(gr.Markdown(t("fused_intro")), value="fused_intro")
        with gr.Row():
            with gr.Column(scale=2, min_width=280):
                c["fused_specs"] = tr(gr.CheckboxGroup(REGISTRY.choices("fused"), value=DEFAULT_SPECS,
                                                       label=t("fused_specs")),
                                      label="fused_specs")
                c["fused_custom"] = tr(gr.Textbox(label=t("custom_specs"), lines=1, elem_id="compare-fused-custom"),
                                       label="custom_specs")
            with gr.Column(scale=1, min_width=220):
                c["fused_context"] = tr(gr.Slider(MIN_CONTEXT, MAX_CONTEXT, value=DEFAULT_CONTEXT, step=128,
                                                  label=t("fused_context")), label="fused_context")
                c["fused_new"] = tr(gr.Slider(MIN_NEW, MAX_NEW, value=DEFAULT_NEW, step=1, label=t("fused_new")),
                                    label="fused_new")
                c["fused_run"] = tr(gr.Button(t("fused_run"), elem_id="compare-fused-run"), value="fused_run")
        c["fused_status"] = gr.Markdown(elem_id="compare-fused-status", label="fused status")
        c["fused_table"] = tr(gr.Dataframe(headers=_headers(), label=t("fused_table"), wrap=True,
                                           elem_id="compare-fused-table"),
                              label="fused_table", headers=_headers)
        c["fused_fig"] = gr.Plot(plots.empty_figure(), label="fused against unfused", show_label=False)
        c["fused_ctx_fig"] = gr.Plot(plots.empty_figure(), label="speed against context", show_label=False,
                                     elem_id="compare-fused-context")
    inputs = [c["fused_specs"], c["fused_custom"], c["fused_context"], c["fused_new"], model, lang]
    outputs = [c["fused_table"], c["fused_fig"], c["fused_status"], c["fused_ctx_fig"]]
    actions["fused"] = (run, inputs, outputs, "model")
    on_click(c["fused_run"], run, inputs, outputs, "fused_speed")
    return c
