"""kvviz.ui.long_context: the Long context tab: how a format's damage grows with position and with generation length,
and the needle at longer contexts (lesson 10).

Numbers come from `kvviz.quality.long_context` (the chunked pass through each quantized cache, each chunk reading
the cache as stored; the free-running generation beside the exact one; the needle at length), figures from
`kvviz.plots.long_context`; this module checks the inputs, streams the library's cumulative results as chunks
finish and puts titles, axes and tables in the page's language. api_name `long_context`:
    long_context(source, text, file, specs, custom_specs, context, chunk, new_tokens, needle, needle_contexts,
                 needle_depths, model, language)
      -> (status, KL-by-position figure, top-1 figure, per-format table, generation figure, generation table,
          the generated texts side by side (html), needle figure)
      (a generator: the two position charts and the table update after every chunk; then the generation, then the
      needle when `needle` is ticked. source: "WikiText-2", "text" (the `text` argument) or "file" (an uploaded
      UTF-8 file); needle_contexts: tokens, comma-separated; needle_depths: % of the context, comma-separated)
"""

from __future__ import annotations

import time

import gradio as gr
import numpy as np

from kvviz import plots
from kvviz.formats.family import REGISTRY
from kvviz.plots import long_context as lc_plots
from kvviz.quality import long_context as lc

from . import compare
from .common import (ScaleNotes, UploadFile, check_bool, check_choice, check_int, check_language, check_model,
                     check_text, fitting_specs, get_model, model_input, on_click, spec_list, table, upload_path,
                     user_errors)
from .i18n import Translator, t

TAB = "long_context"  # the tab id in app.py; prefixes elem_ids the browser test finds

SOURCES = ("WikiText-2", "text", "file")
DEFAULT_SPECS = ["int4", "k8v4", "mxfp4"]
MAX_FORMATS = 4  # each format is one more pass over the whole context
MIN_CONTEXT, MAX_CONTEXT, DEFAULT_CONTEXT = 256, 32768, 4096  # the model's own limit is the library's check
MIN_CHUNK, MAX_CHUNK, DEFAULT_CHUNK = 64, 4096, 256  # 256: the first chart comes after 257 tokens, not 513
MAX_NEW_TOKENS, DEFAULT_NEW_TOKENS = 1024, 64
MAX_TEXT_CHARS = 400_000  # about 100K tokens: a text for the longest context with room to spare
MAX_FILE_BYTES = 4 << 20
WINDOW = 256  # the moving average the charts and crossings use (tokens)
GEN_WINDOW = 16  # the generation chart's moving average (steps)
DEFAULT_NEEDLE_CONTEXTS = "2048, 4096, 8192"
DEFAULT_NEEDLE_DEPTHS = ", ".join(f"{100 * d:.0f}" for d in lc.DEPTHS10)  # 10 depths, 0 to 100% of the context
NEEDLES_PER_DEPTH = 5
GEN_PROMPT_TOKENS = 256  # the generation continues the text's first tokens
MAX_NEEDLE_CONTEXTS, MAX_DEPTHS = 4, 20


# --- inputs ------------------------------------------------------------------------------------------------------


def _source_choices(lang: str) -> list[tuple[str, str]]:
    """The text radio's (label in `lang`, value) pairs: the value is what the API takes."""
    return [(t(k, lang), v) for k, v in zip(("lc_src_wikitext", "lc_src_text", "lc_src_file"), SOURCES)]


def _text(source, text, file) -> str | None:
    """The text to read: None for the bundled WikiText-2 slice, else the user's text or the uploaded file's."""
    source = check_choice(source, "Text", SOURCES)
    text = check_text(text, "Your text", MAX_TEXT_CHARS)  # checked either way: a wrong type is an error
    path = None if file is None else upload_path(file, "The text file")  # the same
    if source == "text":
        if not text:
            raise ValueError("Your text is empty: paste a long text, or pick WikiText-2 or a file as the text.")
        return text
    if source == "file":
        if path is None:
            raise ValueError("The text file: upload a UTF-8 text file first, or pick WikiText-2 as the text.")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ValueError(f"The uploaded file is {size:,} bytes; the limit is {MAX_FILE_BYTES:,} (a few MB of "
                             "text is far more than the longest context). Upload a shorter one.")
        try:
            return lc.read_text_file(path)
        except ValueError as err:  # the library names the path: here gradio's upload cache, the user's file name
            raise ValueError(str(err).replace(str(path), f"The uploaded file {path.name!r}")) from None
    return None


def _numbers(value, what: str, lo: float, hi: float, limit: int, whole: bool) -> list:
    """A comma-separated list of numbers from `lo` to `hi` (at most `limit` of them); ValueError naming the field."""
    text = check_text(value, what, 400)
    items = [s.strip() for s in text.replace(";", ",").split(",") if s.strip()]
    if not items:
        raise ValueError(f"{what} is empty: give numbers from {lo:g} to {hi:g}, separated by commas.")
    if len(items) > limit:
        raise ValueError(f"{what} holds {len(items)} numbers; give at most {limit}.")
    out = []
    for s in items:
        try:
            x = float(s)
        except ValueError:
            raise ValueError(f"{what} must be numbers separated by commas; {s!r} is not a number.") from None
        if not lo <= x <= hi or (whole and not x.is_integer()):
            kind = "whole numbers" if whole else "numbers"
            raise ValueError(f"{what} must be {kind} from {lo:g} to {hi:g}; {s} is out of range.")
        out.append(int(x) if whole else x)
    return list(dict.fromkeys(out))


# --- results in the page's language ------------------------------------------------------------------------------


def _quarters(kl: np.ndarray) -> tuple[float, float]:
    """Mean KL over the first and the last quarter of the positions measured."""
    q = max(1, len(kl) // 4)
    return float(np.mean(kl[:q])), float(np.mean(kl[-q:]))


def _position_headers(lang: str) -> list[str]:
    return [t("lc_h_format", lang), t("lc_h_mean_kl", lang), t("lc_h_kl_first", lang), t("lc_h_kl_last", lang),
            t("lc_h_growth", lang), *(t("lc_h_cross", lang).format(x=x) for x in lc.THRESHOLDS),
            t("lc_h_top1", lang)]


def _position_rows(drift, lang: str) -> list[list]:
    crossings = drift.crossings(lc.THRESHOLDS, WINDOW)
    rows = []
    for name in drift.names:
        kl = np.asarray(drift.kl[name], dtype=float)
        first, last = _quarters(kl)
        cross = [t("lc_never", lang) if crossings[name][x] is None else int(crossings[name][x])
                 for x in lc.THRESHOLDS]
        rows.append([name, round(float(kl.mean()), 5), round(first, 5), round(last, 5),
                     round(last / first, 2) if first > 0 else None, *cross,
                     round(100 * float(np.mean(drift.top1[name])), 1)])
    return rows


def _position_outputs(drift, name: str, lang: str):
    """(KL figure, top-1 figure, table) of a PositionDrift, in `lang`."""
    axis_x = t("lc_f_kl_x", lang)
    kl_fig = lc_plots.position_figure(drift.smoothed(WINDOW), drift.crossings(lc.THRESHOLDS, WINDOW), lc.THRESHOLDS,
                                      t("lc_f_kl", lang).format(model=name, n=drift.done_tokens, w=WINDOW),
                                      (axis_x, t("lc_f_kl_y", lang)), context=drift.context)
    top1 = {n: lc.smooth(np.asarray(drift.top1[n], dtype=float), WINDOW) for n in drift.names}
    top_fig = lc_plots.top1_figure(top1, t("lc_f_top1", lang).format(model=name, w=WINDOW),
                                   (axis_x, t("lc_f_top1_y", lang)), context=drift.context)
    return kl_fig, top_fig, table(_position_rows(drift, lang), _position_headers(lang))


def _position_summary(drift, lang: str) -> str:
    x = lc.THRESHOLDS[len(lc.THRESHOLDS) // 2]
    crossings = drift.crossings(lc.THRESHOLDS, WINDOW)
    growth, cross = [], []
    for name in drift.names:
        first, last = _quarters(np.asarray(drift.kl[name], dtype=float))
        growth.append(f"`{name}` {last / first:.1f}×" if first > 0 else f"`{name}` -")
        at = crossings[name][x]
        cross.append(f"`{name}` " + (t("lc_never", lang) if at is None else f"{int(at):,}"))
    return t("lc_r_pos", lang).format(n=drift.done_tokens, growth=", ".join(growth), x=x, cross=", ".join(cross))


def _generation_headers(lang: str) -> list[str]:
    return [t("lc_h_format", lang), t("lc_h_first_div", lang), t("lc_h_differ", lang), t("lc_h_rep", lang),
            t("lc_h_rep_last", lang)]


def _generation_rows(gen, lang: str) -> list[list]:
    base = gen.repetition["baseline"]
    rows = [[t("lc_exact", lang), "-", 0.0, round(100 * base["whole"], 1), round(100 * base["last_half"], 1)]]
    for name in gen.names:
        div = gen.first_divergence[name]
        rep = gen.repetition[name]
        rows.append([name, t("lc_none", lang) if div is None else int(div), round(100 * gen.top1_differ[name], 1),
                     round(100 * rep["whole"], 1), round(100 * rep["last_half"], 1)])
    return rows


def _generation_figure(gen, name: str, lang: str):
    kl = {n: lc.smooth(gen.kl[n], GEN_WINDOW) for n in gen.names}
    return lc_plots.generation_figure(kl, gen.first_divergence, t("lc_f_gen", lang).format(model=name, w=GEN_WINDOW),
                                      (t("lc_f_gen_x", lang), t("lc_f_gen_y", lang)))


def _needle_figure(res, name: str, lang: str):
    return lc_plots.needle_figure(res.depths, res.found, res.total,
                                  t("lc_f_needle", lang).format(model=name, per=res.needles_per_depth),
                                  (t("lc_f_needle_x", lang), t("lc_f_needle_y", lang)),
                                  context_label=t("lc_f_needle_ctx", lang))


def _generation_summary(gen, tok, lang: str) -> str:
    divs = ", ".join(f"`{n}` " + (t("lc_none", lang) if gen.first_divergence[n] is None else
                                  str(gen.first_divergence[n])) for n in gen.names)
    prompt = tok(gen.prompt_text, return_tensors="pt")["input_ids"].shape[1]
    return t("lc_r_gen", lang).format(n=gen.new_tokens, p=prompt, div=divs)


def _needle_summary(res, lang: str) -> str:
    found = "; ".join(
        f"{ctx:,}: " + ", ".join(f"`{n}` {sum(res.found[ctx][n])}/{sum(res.total[ctx])}" for n in res.names)
        for ctx in res.contexts if ctx in res.found)
    return t("lc_r_needle", lang).format(found=found)


def _notes(note: str, lang: str) -> str:
    """The library's note on the text (repeated?) and the model (sliding windows?): as it is in English; in Korean
    the same facts from the tab's own strings."""
    if not note:
        return ""
    if lang == "en":
        return f"\n\n_{note}_"
    lines = []
    if "repeat" in note:
        lines.append(t("lc_r_repeats", lang))
    if "sliding" in note:
        lines.append(t("lc_r_sliding", lang))
    return "".join(f"\n\n_{line}_" for line in lines)


# --- the endpoint ------------------------------------------------------------------------------------------------


@user_errors
def run(source, text, file, specs, custom_specs, context, chunk, new_tokens, needle=False,
        needle_contexts=DEFAULT_NEEDLE_CONTEXTS, needle_depths=DEFAULT_NEEDLE_DEPTHS, model=None, lang="en",
        progress=gr.Progress()):
    """Stream the damage by position through every chosen format on `model` (one update per chunk), then the
    generation-length panel, then (when `needle`) the needle at length; titles, tables and status in `lang`."""
    started = time.perf_counter()
    lang = check_language(lang)
    name = check_model(model)
    body = _text(source, text, file)
    plans = spec_list(specs, custom_specs, MAX_FORMATS)
    if not plans:
        raise ValueError("Pick at least one format to read the long text through beside the exact cache.")
    context = check_int(context, "Context length", MIN_CONTEXT, MAX_CONTEXT)
    chunk = check_int(chunk, "Chunk size", MIN_CHUNK, MAX_CHUNK)
    new_tokens = check_int(new_tokens, "New tokens", 2, MAX_NEW_TOKENS)
    needle = check_bool(needle, "Needle at length")
    contexts = _numbers(needle_contexts, "Needle contexts", MIN_CONTEXT, MAX_CONTEXT, MAX_NEEDLE_CONTEXTS, True)
    depths = lc.check_depths([d / 100 for d in _numbers(needle_depths, "Needle depths (%)", 0, 100, MAX_DEPTHS,
                                                        False)])
    llm, tok = get_model(progress, name)
    plans, skipped = fitting_specs(lc.parse_formats(plans, llm), llm)
    if not plans:
        raise ValueError("None of the chosen formats fits this model: " + "; ".join(skipped))
    # the library checks each part's input when it is called, before any compute: all three are called here, so a
    # bad needle context is refused now, not after the minutes the position pass takes
    positions = lc.position_drift(llm, tok, plans, context=context, chunk=chunk, text=body)
    prompt = None if body is None else tok.decode(
        tok(body, return_tensors="pt")["input_ids"][0, :GEN_PROMPT_TOKENS].tolist())
    generation = lc.generation_drift(llm, tok, plans, new_tokens=new_tokens, prompt=prompt,
                                     prompt_tokens=GEN_PROMPT_TOKENS)
    needles = lc.needle_at_length(llm, tok, plans, contexts=tuple(contexts), depths=depths,
                                  needles_per_depth=NEEDLES_PER_DEPTH, text=body) if needle else None

    skip, notes = gr.skip(), ScaleNotes()
    wait = plots.empty_figure(t("lc_gen_off", lang))
    needle_fig = plots.empty_figure(t("lc_needle_off", lang))
    status = t("lc_p_start", lang).format(model=name, n=context, chunk=chunk, formats=len(plans))
    yield status, skip, skip, skip, wait, skip, "", needle_fig
    progress(0.0, desc=status.replace("`", ""))  # after the yield: the page shows the bar while the work runs
    first = drift = None
    for drift in notes.watch(positions):
        first = first if first is not None else time.perf_counter() - started
        status = t("lc_p_chunk", lang).format(model=name, done=drift.done_tokens, n=context, formats=len(plans),
                                              s=time.perf_counter() - started)
        position = _position_outputs(drift, name, lang)
        yield (status, *position, skip, skip, skip, skip)
        progress(0.6 * drift.fraction, desc=status.replace("`", ""))
    summary = _position_summary(drift, lang) + _notes(drift.note, lang)
    if skipped:
        summary += f"\n\n{t('r_skipped', lang)} " + "; ".join(skipped)

    gen = None
    for gen in notes.watch(generation):
        status = t("lc_p_gen", lang).format(model=name, n=new_tokens, done=gen.steps_done)
        yield (status + "\n\n" + summary, skip, skip, skip, skip, skip,
               compare._columns(gen.baseline_text, gen.texts, {}, lang), skip)
        progress(0.6 + (0.2 if needle else 0.4) * gen.fraction, desc=status.replace("`", ""))
    summary += "\n\n" + _generation_summary(gen, tok, lang)
    gen_outputs = (_generation_figure(gen, name, lang), table(_generation_rows(gen, lang), _generation_headers(lang)),
                   compare._columns(gen.baseline_text, gen.texts, {}, lang))

    if needles is not None:
        res = None
        for res in notes.watch(needles):
            status = t("lc_p_needle", lang).format(model=name, contexts=", ".join(f"{c:,}" for c in contexts),
                                                   per=NEEDLES_PER_DEPTH)
            yield status + "\n\n" + summary, skip, skip, skip, *gen_outputs, _needle_figure(res, name, lang)
            progress(0.8 + 0.2 * res.fraction, desc=status.replace("`", ""))
        needle_fig = _needle_figure(res, name, lang)
        summary += "\n\n" + _needle_summary(res, lang)
    done = t("lc_r_done", lang).format(s=time.perf_counter() - started, model=name, n=context, chunk=chunk,
                                       first=first)
    notes.toast()
    # the last update holds every output: what an API caller's result and a lesson's run read
    yield done + "\n\n" + summary + notes.markdown(), *position, *gen_outputs, needle_fig


# --- the tab -----------------------------------------------------------------------------------------------------


def build(tr: Translator) -> dict:
    """Lay out the Long context tab inside the current gr.Tab; returns its components by name."""
    c: dict = {}
    tr(gr.Markdown(t("lc_intro")), value="lc_intro")
    with gr.Row():
        with gr.Column(scale=3):
            c["model"] = model_input(tr)
            c["source"] = tr(gr.Radio(_source_choices("en"), value="WikiText-2", label=t("lc_source"),
                                      elem_id=f"{TAB}-source"), label="lc_source", choices=_source_choices)
            c["text"] = tr(gr.Textbox(lines=3, label=t("lc_text"), placeholder=t("lc_text_ph"),
                                      max_length=MAX_TEXT_CHARS), label="lc_text", placeholder="lc_text_ph")
            c["file"] = tr(UploadFile(label=t("lc_file"), file_types=[".txt", ".md"], height=110,
                                      elem_id=f"{TAB}-file"), label="lc_file")
        with gr.Column(scale=2, min_width=280):
            c["specs"] = tr(gr.CheckboxGroup(REGISTRY.choices("fused"), value=DEFAULT_SPECS, label=t("lc_formats"),
                                             elem_id=f"{TAB}-specs"), label="lc_formats")
            c["custom"] = tr(gr.Textbox(label=t("custom_specs"), info=t("custom_specs_info"), lines=1,
                                        elem_id=f"{TAB}-custom"), label="custom_specs", info="custom_specs_info")
            c["context"] = tr(gr.Slider(MIN_CONTEXT, MAX_CONTEXT, value=DEFAULT_CONTEXT, step=256,
                                        label=t("lc_context"), elem_id=f"{TAB}-context"), label="lc_context")
            c["new_tokens"] = tr(gr.Slider(2, MAX_NEW_TOKENS, value=DEFAULT_NEW_TOKENS, step=1,
                                           label=t("lc_new_tokens"), elem_id=f"{TAB}-new-tokens"),
                                 label="lc_new_tokens")
            c["advanced"] = tr(gr.Accordion(t("lc_advanced"), open=False, elem_id=f"{TAB}-advanced"),
                               label="lc_advanced")
            with c["advanced"]:
                c["chunk"] = tr(gr.Slider(MIN_CHUNK, MAX_CHUNK, value=DEFAULT_CHUNK, step=64, label=t("lc_chunk")),
                                label="lc_chunk")
                c["needle"] = tr(gr.Checkbox(False, label=t("lc_needle")), label="lc_needle")
                c["needle_contexts"] = tr(gr.Textbox(DEFAULT_NEEDLE_CONTEXTS, label=t("lc_needle_contexts"), lines=1),
                                          label="lc_needle_contexts")
                c["needle_depths"] = tr(gr.Textbox(DEFAULT_NEEDLE_DEPTHS, label=t("lc_needle_depths"), lines=1),
                                        label="lc_needle_depths")
            c["run"] = tr(gr.Button(t("lc_run"), variant="primary", elem_id=f"{TAB}-run"), value="lc_run")
    c["status"] = gr.Markdown(elem_id=f"{TAB}-status", label="status")
    with gr.Row():
        c["kl_fig"] = gr.Plot(plots.empty_figure(), label="KL by position", show_label=False,
                              elem_id=f"{TAB}-kl")
        c["top1_fig"] = gr.Plot(plots.empty_figure(), label="top-1 by position", show_label=False,
                                elem_id=f"{TAB}-top1")
    c["table"] = tr(gr.Dataframe(headers=_position_headers("en"), label=t("lc_table"), wrap=True,
                                 elem_id=f"{TAB}-table"), label="lc_table", headers=_position_headers)
    tr(gr.Markdown(f"#### {t('lc_gen_title')}"), value=lambda lang: f"#### {t('lc_gen_title', lang)}")
    with gr.Row():
        c["gen_fig"] = gr.Plot(plots.empty_figure(), label="generation", show_label=False,
                               elem_id=f"{TAB}-gen")
        c["gen_table"] = tr(gr.Dataframe(headers=_generation_headers("en"), label=t("lc_gen_table"), wrap=True,
                                         elem_id=f"{TAB}-gen-table"), label="lc_gen_table",
                            headers=_generation_headers)
    c["columns"] = tr(gr.HTML(label=t("outputs"), elem_id=f"{TAB}-columns"), label="outputs")
    c["needle_box"] = tr(gr.Accordion(t("lc_needle_title"), open=False, elem_id=f"{TAB}-needle"),
                         label="lc_needle_title")
    with c["needle_box"]:
        c["needle_fig"] = gr.Plot(plots.empty_figure(), label="needle at length", show_label=False,
                                  elem_id=f"{TAB}-needle-fig")
    lang = tr.language_input()
    c["inputs"] = [c["source"], c["text"], c["file"], c["specs"], c["custom"], c["context"], c["chunk"],
                   c["new_tokens"], c["needle"], c["needle_contexts"], c["needle_depths"], c["model"], lang]
    c["outputs"] = [c["status"], c["kl_fig"], c["top1_fig"], c["table"], c["gen_fig"], c["gen_table"], c["columns"],
                    c["needle_fig"]]
    c["actions"] = {"run": (run, c["inputs"], c["outputs"], "model")}
    c["progress_on"] = [c["status"]]  # the bar over the status only: the charts stay readable as they stream
    on_click(c["run"], run, c["inputs"], c["outputs"], "long_context", progress_on=c["progress_on"])
    return c
