"""kvviz.ui.compare: the Compare tab: the same prompt generated through several KV formats, side by side.

Texts stream as `kvviz.quality.compare_stream` decodes all formats as one batch (the columns at most every
STREAM_EVERY_S seconds); the first divergence from the unquantized baseline is marked. When the run ends, a table
and bar charts give teacher-forced KL and top-1, cache bytes and tokens/s (each format's own cache and attention
backend). The needle test runs on demand.
api_names:
    compare(prompt, specs, custom_specs, max_new_tokens, with_perplexity, model)
      -> (columns html, metrics table, metrics figure, status, quality-against-bytes map)
      (the map: mean KL against bits per value for every format and plan run, the Pareto frontier drawn, each
      point labelled with its engine flag where an engine stores it; a generator: the columns update once per
      generated token; perplexity on WikiText-2 when asked)
    needle(specs, custom_specs, context_tokens, model) -> (needle figure, status)
The accordions under the table hold their own endpoints: fused_speed (kvviz/ui/fused.py, lesson 7),
engine_compare (kvviz/ui/engines.py) and rotation (kvviz/ui/rotation.py, lesson 9).
Cache bytes are given against the exact cache the model runs with (float32 on the CPU) and against a 16-bit cache,
which is what engines store (fp16/bf16: k8v4 is 0.39x of it); the chart shows the 16-bit ratio. Results follow the
page's language (the session's language state, English through the API).
"""

from __future__ import annotations

import html
import time

import gradio as gr

from kvviz import plots, quality
from kvviz.formats.family import REGISTRY

from . import engines, fused, rotation
from .common import (MAX_FORMATS, ScaleNotes, check_bool, check_int, check_language, check_model, check_prompt,
                     fitting_specs, get_model, model_input, on_click, prompt_input, prompt_token_ids, spec_list, table,
                     user_errors)
from .i18n import Translator, t

TAB = "compare"  # the tab id in app.py; prefixes elem_ids the browser test finds

DEFAULT_SPECS = ["fp8_e4m3", "k8v4", "k4v8", "int4"]
BASELINE = "exact (baseline)"  # the unquantized cache, in the model's dtype
MAX_NEW_TOKENS = 128
MAX_PROMPT_TOKENS = 2048  # on a 2-core CPU a longer prefill through every format takes minutes
# decode steps timed per format for tokens/s, after one untimed step (the first after a prefill also sets up its
# kernels' arguments); each step is a whole batch-1 forward: at 4 the default click's 5 runs took 25 forwards, as
# many as its whole side-by-side decode of 9 rows
SPEED_TOKENS = 2
NEEDLES_PER_DEPTH = 3  # each depth's point is a rate over this many needles (each one more prefill of the context)
PPL_WINDOWS, PPL_WINDOW = 1, 512  # one 512-token WikiText-2 window: seconds per format on a 2-core CPU
# the columns stream at most every this many seconds (the first token at once): each update is a page diff gradio
# serializes and sends, and a client parses, on the same two cores the decode's two threads run on (each such
# interruption stalls both at their next barrier): at 0.2 s a 6-format, 128-token click streamed ~80 updates
STREAM_EVERY_S = 0.5


def _divergence(text: str, baseline: str) -> int | None:
    """Character index where `text` first differs from `baseline` (None: no difference yet)."""
    for i, (a, b) in enumerate(zip(text, baseline)):
        if a != b:
            return i
    return None if len(text) == len(baseline) or len(text) < len(baseline) else len(baseline)


def _marked(text: str, baseline: str | None) -> str:
    """HTML of `text`: the word where it leaves the baseline in <mark>, what follows in the divergence colour."""
    if baseline is None:
        return html.escape(text)
    i = _divergence(text, baseline)
    if i is None:
        return html.escape(text)
    start = max(text.rfind(" ", 0, i), text.rfind("\n", 0, i)) + 1  # back to the start of the word
    end = min([j for j in (text.find(" ", i + 1), text.find("\n", i + 1)) if j != -1], default=len(text))
    return (html.escape(text[:start]) + "<mark>" + html.escape(text[start:end]) + "</mark>"
            + f"<span class='kv-after'>{html.escape(text[end:])}</span>")


def _columns(baseline: str, texts: dict[str, str], meta: dict[str, str], lang: str = "en") -> str:
    """One column per format, the baseline first; meta: a line under each title, by format name (BASELINE's too)."""
    cols = [(BASELINE, baseline, None)] + [(name, txt, baseline) for name, txt in texts.items()]
    parts = []
    for name, txt, base in cols:
        title = t("r_baseline", lang) if name == BASELINE else name
        parts.append(f"<div class='kv-col'><h4>{html.escape(title)}</h4>"
                     f"<div class='kv-meta'>{html.escape(meta.get(name, ''))}</div>"
                     f"<div class='kv-text'>{_marked(txt, base)}</div></div>")
    return f"<div class='kv-columns'>{''.join(parts)}</div>"


def _ratio(x: float) -> str:
    return f"{x:.2f}×"


def _cells(row, lang: str) -> list:
    """A kvviz.quality.CompareRow as the table's cells, in the order of _metrics' headers (perplexity last)."""
    return [t("r_baseline", lang) if row.baseline else row.name, row.spec,
            round(row.bits_per_value, 3), round(row.kl_mean, 5),
            round(row.kl_median, 5), round(row.kl_p99, 5), round(100 * row.top1, 1),
            "-" if row.baseline else t("r_none", lang) if row.first_divergence is None else row.first_divergence,
            round(row.cache_bytes / 1024, 1), _ratio(row.bytes_vs_16bit), _ratio(row.bytes_vs_exact),
            None if row.tokens_per_s is None else round(row.tokens_per_s, 1),
            None if row.perplexity is None else round(row.perplexity, 3)]


def _headers(dtype: str, lang: str = "en") -> list[str]:
    """The metrics table's headers, perplexity last; dtype: what the exact baseline cache holds."""
    headers = [t(k, lang) for k in ("h_format", "h_spec", "h_bits", "h_kl", "h_kl_median", "h_kl_p99", "h_top1",
                                    "h_divergence", "h_cache_kib", "h_vs16", "h_vs_exact", "h_tps", "h_ppl")]
    headers[10] = headers[10].format(dtype=dtype)
    return headers


def _metrics(rows, dtype: str, measured_ppl: bool, lang: str = "en") -> tuple[list[str], list[list], dict]:
    """Table headers and cells (baseline first) and the bar chart's columns, from QualityReport.rows().
    dtype: the model's dtype name, which the exact baseline cache holds. The KL's median and p99 over the steps sit
    next to its mean, as llama.cpp's KLD statistics put them. Two byte ratios: against the exact cache as this model
    runs it (`dtype`, float32 on the CPU), and against a 16-bit cache, what engines store (the chart's).
    measured_ppl: whether perplexity was measured (else no empty column)."""
    headers = _headers(dtype, lang)
    cells = [_cells(r, lang) for r in rows]
    columns = {
        t("c_kl", lang): [round(r.kl_mean, 5) for r in rows],
        t("c_top1", lang): [round(100 * r.top1, 1) for r in rows],
        t("c_vs16", lang): [round(r.bytes_vs_16bit, 2) for r in rows],
        t("c_tps", lang): [None if r.tokens_per_s is None else round(r.tokens_per_s, 1) for r in rows],
    }
    if not measured_ppl:  # not measured: no empty column
        return headers[:-1], [c[:-1] for c in cells], columns
    columns[t("c_ppl", lang)] = [round(r.perplexity, 3) for r in rows]
    return headers, cells, columns


def _positions(model) -> int:
    """The model's position limit (max_position_embeddings), or a huge number when the config lacks one."""
    return int(getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", 0) or 1 << 30)


def _check_prompt_fits(tok, model, prompt: str, new_tokens: int) -> int:
    limit = min(MAX_PROMPT_TOKENS, _positions(model) - new_tokens)
    return len(prompt_token_ids(tok, prompt, limit))


@user_errors
def run(prompt, specs, custom_specs, max_new_tokens, with_perplexity=False, model=None, lang="en",
        progress=gr.Progress()):
    """Stream every format's text side by side on `model`; end with the metrics table and chart (in `lang`)."""
    started = time.perf_counter()  # "Done in": all the click waited for (model load, speed runs, tables, charts)
    lang = check_language(lang)
    name = check_model(model)
    prompt = check_prompt(prompt)
    new_tokens = check_int(max_new_tokens, "Max new tokens", 2, MAX_NEW_TOKENS)
    with_perplexity = check_bool(with_perplexity, "Perplexity on WikiText-2")
    plans = spec_list(specs, custom_specs, MAX_FORMATS)  # parsed here, once; the library takes the Plans
    if not plans:
        raise ValueError("Pick at least one format to compare with the unquantized baseline.")
    model, tok = get_model(progress, name)
    n_prompt = _check_prompt_fits(tok, model, prompt, new_tokens)
    plans, skipped = fitting_specs(plans, model)
    skip_note = f"\n\n{t('r_skipped', lang)} " + "; ".join(skipped) if skipped else ""
    empty = plots.empty_figure(t("r_metrics_later", lang))
    status = t("r_prefill", lang).format(n=n_prompt, formats=len(plans), model=name)
    yield _columns("", {p.name: "" for p in plans}, {}, lang), None, empty, status, empty
    notes = ScaleNotes()  # the library's static-scale warnings, one line per format
    stream = quality.compare_stream(model, tok, prompt, plans, new_tokens, speed_tokens=SPEED_TOKENS)
    shown = 0.0  # when the columns last streamed
    for update in notes.watch(stream):
        if update.report is None:
            if update.step and time.perf_counter() - shown < STREAM_EVERY_S:
                continue
            shown = time.perf_counter()
            yield (_columns(update.baseline, update.texts, {}, lang), gr.skip(), gr.skip(),
                   t("r_token", lang).format(i=update.step + 1, n=new_tokens, model=name), gr.skip())
            continue
        report = update.report
        ppl = None
        if with_perplexity:
            yield gr.skip(), gr.skip(), gr.skip(), t("r_ppl_running", lang), gr.skip()
            with notes.catching():
                ppl = quality.perplexity(model, tok, plans, windows=PPL_WINDOWS, window=PPL_WINDOW)["ppl"]
        rows = report.rows(ppl)
        headers, cells, columns = _metrics(rows, report.dtype, ppl is not None, lang)
        meta = {r.name: t("r_meta", lang).format(kl=round(r.kl_mean, 5), top1=round(100 * r.top1, 1),
                                                 vs16=_ratio(r.bytes_vs_16bit)) for r in rows[1:]}
        meta[BASELINE] = t("r_meta_base", lang).format(n=report.prompt_tokens, dtype=report.dtype)
        fig = plots.metrics_bars([c[0] for c in cells], columns, title=t("f_metrics", lang).format(model=name),
                                 x_title=t("f_format_axis", lang))
        points = quality.quality_map(rows)
        fig_map = plots.quality_map([p.name for p in points], [p.bits_per_value for p in points],
                                    [p.kl_mean for p in points], [p.frontier for p in points],
                                    [p.engine_flag for p in points], t("f_quality_map", lang).format(model=name),
                                    axis_titles=(t("f_quality_map_x", lang), t("f_quality_map_y", lang)))
        done = t("r_done", lang).format(s=time.perf_counter() - started, model=name, metrics=report.metrics_backend,
                                        speed=report.speed_backend, steps=SPEED_TOKENS) + skip_note + notes.markdown()
        notes.toast()
        yield (_columns(report.baseline_text, {f.name: f.text for f in report.formats}, meta, lang),
               table(cells, headers), fig, done, fig_map)


@user_errors
def needle(specs, custom_specs, context_tokens, model=None, lang="en", progress=gr.Progress()):
    """Retrieval rate against needle depth for the chosen formats (and the unquantized baseline) on `model`."""
    lang = check_language(lang)
    name = check_model(model)
    plans = spec_list(specs, custom_specs, MAX_FORMATS)
    if not plans:
        raise ValueError("Pick at least one format for the needle test.")
    context = check_int(context_tokens, "Context length", 256, 8192)
    model, tok = get_model(progress, name)
    positions = _positions(model)
    if context + 32 > positions:
        raise ValueError(f"A {context}-token haystack plus the question does not fit in this model's "
                         f"{positions} positions; use at most {positions - 32} tokens.")
    plans, skipped = fitting_specs(plans, model)
    progress(0.2, desc=t("p_needle", lang).format(per=NEEDLES_PER_DEPTH, n=context, formats=len(plans) + 1))
    notes = ScaleNotes()
    with notes.catching():
        result = quality.needle(model, tok, plans, context_tokens=context, needles_per_depth=NEEDLES_PER_DEPTH)
    notes.toast()
    per, depths = result["needles_per_depth"], len(result["depths"])
    fig = plots.needle_chart([100 * d for d in result["depths"]], result["depth_rates"], result["context_tokens"],
                             title=t("f_needle", lang).format(n=result["context_tokens"], model=name, per=per),
                             axis_titles=(t("f_needle_x", lang), t("f_needle_y", lang)))
    found = ", ".join(f"`{n}` {100 * r:.0f}% ({sum(result['retrieved'][n])}/{per * depths})"
                      for n, r in result["rate"].items())
    return fig, (t("r_needle", lang).format(n=context, model=name, found=found, per=per, depths=depths)
                 + (f"\n\n{t('r_skipped', lang)} " + "; ".join(skipped) if skipped else "") + notes.markdown())


def build(tr: Translator) -> dict:
    """Lay out the Compare tab inside the current gr.Tab; returns its components by name."""
    c: dict = {}
    tr(gr.Markdown(t("compare_intro")), value="compare_intro")
    with gr.Row():
        with gr.Column(scale=3):
            c["model"] = model_input(tr)
            c["prompt"] = prompt_input(tr, 3)
        with gr.Column(scale=2, min_width=280):
            c["specs"] = tr(gr.CheckboxGroup(REGISTRY.choices("compare"), value=DEFAULT_SPECS, label=t("specs")),
                            label="specs")
            c["custom"] = tr(gr.Textbox(label=t("custom_specs"), info=t("custom_specs_info"), lines=1,
                                        elem_id=f"{TAB}-custom"), label="custom_specs", info="custom_specs_info")
            c["max_new"] = tr(gr.Slider(2, MAX_NEW_TOKENS, value=24, step=1, label=t("max_new_tokens")),
                              label="max_new_tokens")
            c["ppl"] = tr(gr.Checkbox(False, label=t("with_ppl")), label="with_ppl")
            c["run"] = tr(gr.Button(t("run"), variant="primary", elem_id=f"{TAB}-run"), value="run")
    c["status"] = gr.Markdown(elem_id="compare-status", label="status")
    c["columns"] = tr(gr.HTML(label=t("outputs"), elem_id="compare-columns"), label="outputs")
    with gr.Row():
        # headers before the first run (without them gradio shows placeholder columns "1 2 3")
        c["table"] = tr(gr.Dataframe(headers=_headers(t("h_model_dtype"))[:-1], label=t("metrics"), wrap=True,
                                     elem_id=f"{TAB}-table"), label="metrics",
                        headers=lambda lang: _headers(t("h_model_dtype", lang), lang)[:-1])
    with gr.Row():
        c["fig"] = gr.Plot(plots.empty_figure(), label="metrics per format", show_label=False)
        c["map"] = gr.Plot(plots.empty_figure(), label="quality against bytes", show_label=False)
    c["needle_box"] = tr(gr.Accordion(t("needle_title"), open=False, elem_id=f"{TAB}-needle"), label="needle_title")
    with c["needle_box"]:
        tr(gr.Markdown(t("needle_intro")), value="needle_intro")
        with gr.Row():
            c["needle_ctx"] = tr(gr.Slider(256, 8192, value=768, step=128, label=t("needle_context")),
                                 label="needle_context")
            c["needle_run"] = tr(gr.Button(t("needle_run"), elem_id=f"{TAB}-needle-run"), value="needle_run")
        c["needle_status"] = gr.Markdown(label="needle status", elem_id=f"{TAB}-needle-status")
        c["needle_fig"] = gr.Plot(plots.empty_figure(), label="needle in a haystack", show_label=False)
    lang = tr.language_input()
    c["inputs"] = [c["prompt"], c["specs"], c["custom"], c["max_new"], c["ppl"], c["model"], lang]
    c["outputs"] = [c["columns"], c["table"], c["fig"], c["status"], c["map"]]
    needle_io = ([c["specs"], c["custom"], c["needle_ctx"], c["model"], lang], [c["needle_fig"], c["needle_status"]])
    c["actions"] = {"run": (run, c["inputs"], c["outputs"], "model"), "needle": (needle, *needle_io, "model")}
    # queue position and progress over the status line: the streamed columns stay readable
    on_click(c["run"], run, c["inputs"], c["outputs"], "compare", progress_on=[c["status"]])
    on_click(c["needle_run"], needle, *needle_io, "needle")
    c |= fused.build(tr, c["actions"], c["model"], lang)  # fused against unfused decode, lesson 7 (fused_speed)
    c |= engines.build(tr, c["actions"], c["model"])  # kvviz beside llama.cpp on the tab's model (engine_compare)
    c |= rotation.build(tr, c["actions"], c["model"], lang)  # rotate, then quantize: lesson 9 (rotation)
    return c
