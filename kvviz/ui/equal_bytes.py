"""kvviz.ui.equal_bytes: the Equal bytes tab: every way to spend one KV-cache byte budget, side by side.

Drop bits (int4, int2 on every token), drop tokens (16 bits under each eviction policy), both, or keep the dropped
tokens in int2 (mixed precision): each candidate fitted to the same bytes and measured on the same context by
`kvviz.quality.equal_bytes` (bytes from its cache, teacher-forced KL against the exact run, the needle at five
depths). Rows stream into the table as each candidate finishes; the needle runs last.
api_name `equal_bytes`:
    equal_bytes(budget_pct, context_tokens, continuation_tokens, policies, combine, window, custom, needles_per_depth,
                model, language)
      -> (quality-against-bytes chart, quantization map, table, status), in `language` (default English)
Every argument is checked here (preprocess=False): a wrong type or range comes back as a message naming it; the
library's own messages (an unknown policy, a keep ratio outside (0, 1], a window not shorter than the context, a
budget no candidate meets, a policy on a model whose layers all slide) reach the user as they are.
"""

from __future__ import annotations

import time

import gradio as gr

from kvviz import plots
from kvviz.cache import model_layer_types
from kvviz.formats.eviction import POLICIES
from kvviz.plots import equal_bytes as eb_plots
from kvviz.quality import equal_bytes as eb

from .common import (check_choice, check_float, check_int, check_language, check_model, check_names, get_model,
                     model_input, on_click, spec_list, table, user_errors)
from .i18n import Translator, t

TAB = "equal_bytes"  # the tab id in app.py; prefixes elem_ids the browser test finds

DEFAULT_BUDGET = 25.0  # % of the 16-bit cache: int4's nominal share, a quarter of the tokens at 16 bits
DEFAULT_CONTEXT = 256  # tokens: lesson 11's context
DEFAULT_CONTINUATION = 32
DEFAULT_WINDOW = 32  # snapkv's own default (kvviz.formats.eviction)
MAX_CONTEXT = 2048
MAX_CUSTOM = 4


def _headers(lang: str = "en") -> list[str]:
    return t("eb_headers", lang).split("|")


def _cells(row: eb.Row, lang: str) -> list:
    found = "-" if row.found is None else f"{row.found}/{row.needles}"
    return [row.spec, t(f"eb_kind_{row.candidate.kind}", lang), round(100 * row.candidate.keep, 1),
            round(row.nbytes / 1024, 1), round(row.pct_16bit, 1), round(row.kl, 4), found]


def _sliding_note(model, name: str, lang: str) -> str:
    """What a policy does on a model with sliding-window layers (they already drop: the policies leave them)."""
    kinds = model_layer_types(model.config)
    sliding = sum(k == "sliding_attention" for k in kinds)
    if not sliding:
        return ""
    window = getattr(model.config.get_text_config(decoder=True), "sliding_window", None) or 0
    return t("eb_sliding", lang).format(model=name, sliding=sliding, layers=len(kinds), window=window,
                                        full=sum(k == "full_attention" for k in kinds))


def _figures(rows: list[eb.Row], budget: float, context: int, name: str, lang: str, tokens: list[str]):
    kinds = {k: t(f"eb_kind_{k}", lang) for k in eb.KINDS}
    found = [r.found for r in rows]
    total = max((r.needles for r in rows), default=0)
    chart = eb_plots.equal_bytes_chart(
        [r.spec for r in rows], [r.candidate.kind for r in rows], [r.pct_16bit for r in rows], [r.kl for r in rows],
        found, total, budget, t("eb_chart", lang).format(model=name, budget=budget, n=context), kind_labels=kinds,
        axis_titles=(t("eb_chart_x", lang), t("eb_chart_y", lang), t("eb_chart_needle", lang)),
        budget_label=t("eb_budget_line", lang))
    mapped = [r for r in rows if r.token_bits is not None]
    if not mapped:
        return chart, plots.empty_figure(t("eb_no_map", lang))
    fig_map = eb_plots.token_bits_map([r.spec for r in mapped], [list(r.token_bits) for r in mapped],
                                      t("eb_map", lang).format(model=name), token_labels=tokens,
                                      axis_titles=(t("eb_map_x", lang), t("eb_map_y", lang), t("eb_map_z", lang)))
    return chart, fig_map


@user_errors
def run(budget_pct, context_tokens, continuation_tokens, policies, combine, window, custom, needles_per_depth=1,
        model=None, lang="en", progress=gr.Progress()):
    """Every candidate of the budget on `model`: rows stream in as each is measured; the needle last (in `lang`)."""
    started = time.perf_counter()
    lang = check_language(lang)
    name = check_model(model)
    budget = check_float(budget_pct, "Budget (% of the 16-bit cache)", 0.01, 100.0)
    context = check_int(context_tokens, "Context", 64, MAX_CONTEXT)
    continuation = check_int(continuation_tokens, "Continuation", 2, 256)
    picked = check_names(policies, "Eviction policies")
    unknown = [p for p in picked if p not in POLICIES]
    if unknown:
        raise ValueError(f"Unknown eviction policy {unknown[0]!r}; the policies are {', '.join(POLICIES)}.")
    combine = check_choice(combine, "Policy for int8/int4 with eviction", POLICIES)
    window = check_int(window, "SnapKV window", 1, MAX_CONTEXT)
    per = check_int(needles_per_depth, "Needles per depth", 0, 3)
    extra = spec_list([], custom, MAX_CUSTOM, "More candidates")
    loaded, tok = get_model(progress, name)
    note = _sliding_note(loaded, name, lang)
    steps = eb.run(loaded, tok, budget / 100, context, continuation, picked, combine, window, extra, per)
    tokens = eb.context_labels(tok, context)
    for step in steps:
        rows = step.rows
        if not step.done:
            progress(len(rows) / (step.total + 1), desc=t("eb_progress", lang).format(
                spec=rows[-1].spec, i=len(rows), n=step.total))
            status = t("eb_status_running", lang).format(i=len(rows), n=step.total, model=name)
            yield gr.skip(), gr.skip(), table([_cells(r, lang) for r in rows], _headers(lang)), status
            continue
        chart, fig_map = _figures(rows, budget, context, name, lang, tokens)
        full = rows[0].nbytes_16bit if rows else 0
        args = dict(s=time.perf_counter() - started, model=name, n=len(rows), budget=budget, ctx=context,
                    target=f"{budget / 100 * full / 1024:,.1f}", full=f"{full / 1024:,.1f}")
        status = (t("eb_status", lang).format(exact=step.exact_found, needles=rows[0].needles, **args)
                  if step.exact_found is not None else t("eb_status_no_needle", lang).format(**args))
        within = [r for r in rows if r.pct_16bit <= budget + 1e-9]
        if within:
            best = min(within, key=lambda r: r.kl)
            status += "\n\n" + t("eb_best", lang).format(spec=best.spec, kl=best.kl)
        over = [f"`{r.spec}` ({r.pct_16bit:.1f}%)" for r in rows if r.pct_16bit > budget + 1e-9]
        if over:
            status += "\n\n" + t("eb_over", lang).format(specs=", ".join(over))
        if step.left:
            status += "\n\n" + t("eb_left", lang) + "\n" + "\n".join(f"- {line}" for line in step.left)
        if note:
            status += "\n\n" + note
        yield chart, fig_map, table([_cells(r, lang) for r in rows], _headers(lang)), status


def build(tr: Translator) -> dict:
    """Lay out the Equal bytes tab inside the current gr.Tab; returns its components by name."""
    c: dict = {}
    tr(gr.Markdown(t("eb_intro")), value="eb_intro")
    with gr.Row():
        with gr.Column(scale=2):
            c["model"] = model_input(tr)
            c["budget"] = tr(gr.Slider(1, 100, value=DEFAULT_BUDGET, step=0.5, label=t("eb_budget"),
                                       elem_id=f"{TAB}-budget"), label="eb_budget")
            with gr.Row():
                c["context"] = tr(gr.Slider(64, MAX_CONTEXT, value=DEFAULT_CONTEXT, step=64, label=t("eb_context")),
                                  label="eb_context")
                c["continuation"] = tr(gr.Slider(2, 256, value=DEFAULT_CONTINUATION, step=1,
                                                 label=t("eb_continuation")), label="eb_continuation")
            c["needles"] = tr(gr.Slider(0, 3, value=1, step=1, label=t("eb_needles")), label="eb_needles")
        with gr.Column(scale=2, min_width=280):
            c["policies"] = tr(gr.CheckboxGroup(list(POLICIES), value=list(POLICIES), label=t("eb_policies")),
                               label="eb_policies")
            c["combine"] = tr(gr.Radio(list(POLICIES), value="snapkv", label=t("eb_combine")), label="eb_combine")
            c["window"] = tr(gr.Number(DEFAULT_WINDOW, precision=0, minimum=1, label=t("eb_window")),
                             label="eb_window")
            c["custom"] = tr(gr.Textbox(label=t("eb_custom"), lines=1, elem_id=f"{TAB}-custom"), label="eb_custom")
            c["run"] = tr(gr.Button(t("eb_run"), variant="primary", elem_id=f"{TAB}-run"), value="eb_run")
    c["status"] = gr.Markdown(elem_id=f"{TAB}-status", label="status")
    with gr.Row():
        c["chart"] = gr.Plot(plots.empty_figure(), label="quality against bytes", show_label=False,
                             elem_id=f"{TAB}-chart")
        c["map"] = gr.Plot(plots.empty_figure(), label="quantization map", show_label=False, elem_id=f"{TAB}-map")
    c["table"] = tr(gr.Dataframe(headers=_headers(), label=t("eb_table"), wrap=True, elem_id=f"{TAB}-table"),
                    headers=_headers, label="eb_table")
    lang = tr.language_input()
    c["inputs"] = [c[k] for k in ("budget", "context", "continuation", "policies", "combine", "window", "custom",
                                  "needles", "model")] + [lang]
    c["outputs"] = [c["chart"], c["map"], c["table"], c["status"]]
    c["actions"] = {"run": (run, c["inputs"], c["outputs"], "model")}
    c["progress_on"] = [c["status"]]  # the bar over the status only: the charts stay readable as they stream
    on_click(c["run"], run, c["inputs"], c["outputs"], "equal_bytes", progress_on=c["progress_on"])
    return c
