"""kvviz.ui.engines: the Compare tab's engine view: kvviz's formats beside llama.cpp's own KLD, for the same
llama.cpp cache types on the same model and the same tokens.

llama.cpp runs in the app's llama.cpp worker process (kvviz.engines.llamacpp, llama-cpp-python: a native crash
ends the worker and comes back as a message, never the app) on the model's GGUF file; kvviz runs the
same GGUF's weights, dequantized (kvviz.engines.simulate), on the token ids llama.cpp scored, twice: its bare
format (simulate.kvviz_kld) and its simulation of llama.cpp's arithmetic (simulate.llamacpp_kld, with the llama.cpp
run's rotation setting), whose ratio to llama.cpp's mean KLD the table shows. Each is measured against its own
unquantized baseline, with llama.cpp's `--kl-divergence` statistics (kvviz.metrics). Why the bare format differs
is the static note under the chart (i18n "engine_why", after docs/engines.md).

vLLM beside llama.cpp: when the app starts with KVVIZ_VLLM_URLS set (the runtime's vllm_urls, read in build(): "baseline=URL,
fp8_e4m3=URL,..."; each name a --kv-cache-dtype, every server serving the picked model, e.g. started by
`python -m kvviz engines --vllm` or by hand), each run also measures those servers on the same number of tokens
(kvviz.engines.servers, positions 1 on) and adds a row per dtype: vLLM's top-20 KLD beside kvviz's simulation of
`vllm:<dtype>` measured the same way (kvviz.engines.verdict), with the verdict. Every row's verdict column compares
the engine's mean KLD with kvviz's simulation of that engine (llama.cpp's rows: the llama.cpp-arithmetic one).
api_name:
    engine_compare(pairs, tokens, rotate, model) -> (table, figure, status markdown, in English)
      pairs: list of specs made of PAIR_TYPES (["q8_0", "k=q8_0,v=q4_0"]); tokens: MIN_TOKENS..MAX_TOKENS of
      WikiText-2; rotate: llama.cpp's Hadamard rotation of K/V on (its default) or off (LLAMA_ATTN_ROT_DISABLE=1,
      as kvviz stores them); model: the Compare tab's picker, a model_choices() name with a GGUF (the bundled ones).
"""

from __future__ import annotations

import os
import time

import gradio as gr

from kvviz import models, plots, runtime
from kvviz.engines import llamacpp, servers, simulate, verdict
from kvviz.engines.side_by_side import side_by_side
from kvviz.formats import parse_kv

from .common import (check_bool, check_int, check_language, check_model, check_names, get_model, on_click, table,
                     user_errors)
from .i18n import Translator, t

PAIR_TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # llama.cpp's -ctk / -ctv types kvviz stores
PAIR_CHOICES = [*PAIR_TYPES, "k=q8_0,v=q4_0", "k=q8_0,v=q5_0", "k=q8_0,v=iq4_nl"]
DEFAULT_PAIRS = ["q8_0", "k=q8_0,v=q4_0", "q4_0"]
MAX_PAIRS = 6  # each pair loads the GGUF once and adds a row to kvviz's batch
MIN_TOKENS, MAX_TOKENS, DEFAULT_TOKENS = 32, 512, 128  # 256 tokens of three pairs: minutes on a busy 2-core CPU


def headers(lang: str = "en") -> list[str]:
    """The table's columns in `lang`."""
    return t("engine_headers", lang).split("|")


HEADERS = headers()  # English: what an API caller reads without a language
VLLM_ENV = "KVVIZ_VLLM_URLS"


def vllm_servers(value: str | None) -> dict[str, str] | None:
    """KVVIZ_VLLM_URLS ("baseline=http://127.0.0.1:8000,fp8_e4m3=http://127.0.0.1:8001") as servers.measure_servers's
    engine dict; None when unset or empty; ValueError saying how to write it when malformed."""
    if not value or not value.strip():
        return None
    out = {}
    for item in value.split(","):
        name, sep, url = item.partition("=")
        if not sep or not name.strip() or not url.strip():
            raise ValueError(f"{VLLM_ENV} takes NAME=URL pairs separated by commas, one named baseline, e.g. "
                             f"baseline=http://127.0.0.1:8000,fp8_e4m3=http://127.0.0.1:8001; got {item!r}.")
        out[name.strip()] = servers.base_url(url)
    if servers.BASELINE not in out or len(out) < 2:
        raise ValueError(f"{VLLM_ENV} needs baseline=URL (vLLM with --kv-cache-dtype auto) and at least one "
                         "DTYPE=URL, e.g. baseline=http://127.0.0.1:8000,fp8_e4m3=http://127.0.0.1:8001.")
    return out


def check_pairs(value, rotate: bool | None = None) -> list[str]:
    """The chosen llama.cpp type pairs: each one of PAIR_TYPES or `k=A,v=B` of two of them, or llama.cpp's own name
    for one (`llama.cpp:q4_0`, `llama.cpp:k=q8_0,v=q4_0/norot`: given as the bare pair), deduplicated; ValueError
    naming the types for anything else, for another engine's name, for a llama.cpp name whose rotation is not the
    view's `rotate` (when given), and for none or more than MAX_PAIRS."""
    out, seen = [], set()
    for name in check_names(value, "llama.cpp cache types"):
        kv = parse_kv(name) if ":" in name else None  # an engine's name: its own message when malformed
        if kv is not None and kv.engine != "llama.cpp":
            raise ValueError(f"The engine view runs llama.cpp; {name!r} is another engine's dtype. Compare it with "
                             "kvviz's formats in the table above, or pick llama.cpp types here.")
        if kv is not None and rotate is not None and kv.k.engine_rot != rotate and (kv.k.base, kv.v.base) != (
                "fp16", "fp16"):
            flip = "untick" if rotate else "tick"
            raise ValueError(f"{name} {'keeps K/V unrotated' if rotate else 'rotates K/V (llama.cpp default)'}: "
                             f"{flip} 'Rotate K/V in llama.cpp' to run it, or write it "
                             f"{'without' if rotate else 'with'} /norot.")
        if kv is not None:
            name = kv.k.base if kv.k.base == kv.v.base else f"k={kv.k.base},v={kv.v.base}"
        try:
            kv = parse_kv(name)
        except ValueError:
            kv = None
        if kv is None or kv.k.spec not in PAIR_TYPES or kv.v.spec not in PAIR_TYPES:
            raise ValueError(f"llama.cpp cache types must be one of {', '.join(PAIR_TYPES)}, or a pair of them such "
                             f"as k=q8_0,v=q4_0 (or written llama.cpp:q4_0); got {name!r}.")
        if kv.spec not in seen:
            seen.add(kv.spec)
            out.append(name)
    if not out:
        raise ValueError("Pick at least one llama.cpp cache type (e.g. q8_0) to compare.")
    if len(out) > MAX_PAIRS:
        raise ValueError(f"{len(out)} cache types chosen; compare at most {MAX_PAIRS} at once (untick some).")
    return out


def _gguf(model: str):
    """The GGUF llama.cpp loads for the served model; ValueError saying what to serve when it has none."""
    if model.startswith("tiny-"):
        raise ValueError(f"The engine view runs llama.cpp on the model's GGUF file; {model} is a random test model "
                         f"built in code and has none. Serve a bundled model: KVVIZ_MODEL="
                         f"{' or '.join(models.BUNDLED)}.")
    return llamacpp.resolve_gguf(model)


def _verdict(text: str, lang: str) -> str:
    """A kvviz.engines.verdict sentence in `lang`."""
    return t("engine_verdict_" + str(verdict.VERDICTS.index(text)), lang)


def _cells(row, lang: str = "en") -> list:
    """A kvviz.engines.side_by_side.EngineRow as the table's cells (headers())."""
    return [row.format, round(row.kvviz_mean, 5), round(row.kvviz_p99, 4), round(100 * row.kvviz_same_top, 1),
            round(row.engine_mean, 5), round(row.engine_p99, 4), round(100 * row.engine_same_top, 1),
            round(row.sim_mean, 5), round(row.sim_ratio, 2),
            _verdict(verdict.verdict(row.engine_mean, row.sim_mean), lang)]


def _vllm_cells(row: verdict.VerdictRow, lang: str = "en") -> list:
    """A vLLM dtype's verdict row as the table's cells: kvviz's simulation (top-k, like with like) in the kvviz and
    engine-simulation columns, vLLM's measurement in the engine columns."""
    sim, eng = row.sim, row.engine
    return [t("engine_vllm_row", lang).format(spec=row.spec), round(sim["mean"], 5), round(sim["p99"], 4),
            round(100 * sim["same_top_p"], 1), round(eng["mean"], 5), round(eng["p99"], 4),
            round(100 * eng["same_top_p"], 1), round(sim["mean"], 5),
            round(sim["mean"] / eng["mean"], 2) if eng["mean"] > 0 else None, _verdict(row.verdict, lang)]


def _check_vllm_model(urls: dict[str, str], model: str) -> None:
    """ValueError when the vLLM baseline serves another model than the picked one (before anything runs)."""
    served, _ = servers.vllm_model(urls[servers.BASELINE], timeout=10)
    if os.path.basename(served.rstrip("/")) != model:  # vllm_local serves it by name, a hand start by its directory
        raise ValueError(f"The vLLM servers in {VLLM_ENV} serve {served!r}, not {model!r}: pick {served!r} in the "
                         "model picker, or start the servers on this model (python -m kvviz engines --vllm ... "
                         f"--model {model} --serve).")


def _vllm_rows(urls: dict[str, str], tokens: int, lm, lang: str = "en") -> tuple[list[verdict.VerdictRow], str]:
    """vLLM's servers measured on `tokens` tokens (positions 1 on) and judged against kvviz's simulation on `lm`."""
    results = servers.measure_servers(urls, tokens=tokens, api="vllm", score_from=1)
    first = next(iter(results.values()))
    rows = verdict.rows(results, lm)
    capped = f" {first['capped']}." if first.get("capped") else ""
    note = " " + t("engine_vllm_status", lang).format(
        urls=", ".join(urls[n] for n in results), baseline=urls[servers.BASELINE], k=first["top_k"], n=first["n"],
        tolerance=f"{verdict.TOLERANCE:g}") + capped
    return rows, note


@user_errors
def run(pairs, tokens, rotate, model=None, lang="en", progress=gr.Progress(), vllm: dict[str, str] | None = None):
    """llama.cpp's KLD of each pair beside kvviz's simulation of it on `model` (the Compare tab's picker): table,
    grouped bars, what was run (in `lang`). vllm: servers.measure_servers's engine dict of vLLM servers
    (vllm_servers) whose dtypes are measured too and judged (kvviz.engines.verdict), or None."""
    lang = check_language(lang)
    model = check_model(model)
    tokens = check_int(tokens, "Tokens", MIN_TOKENS, MAX_TOKENS)
    rotate = check_bool(rotate, "Rotate K/V in llama.cpp")
    pairs = check_pairs(pairs, rotate)
    if vllm:
        _check_vllm_model(vllm, model)
    try:
        llamacpp.check_installed()
    except ValueError as err:
        raise ValueError(f"The engine view runs llama.cpp, which this app cannot load: {err} Then restart the app; "
                         "kvviz's own figures are in the Compare tab above.") from err
    gguf = _gguf(model)
    start = time.perf_counter()
    progress(0.05, desc=t("engine_p_baseline", lang).format(tokens=tokens))

    def on_pair(i: int, spec: str) -> None:  # llama.cpp's share of the bar: 0.05 to 0.5
        progress(0.05 + 0.45 * (i + 1) / (len(pairs) + 1), desc=t("engine_p_pair", lang).format(tokens=tokens,
                                                                                                  spec=spec))

    ids, theirs = llamacpp.run(pairs, model=str(gguf), tokens=tokens, rotate=rotate, on_pair=on_pair)
    lm, _ = get_model(progress, model=model)
    progress(0.5, desc=t("engine_p_kvviz", lang).format(tokens=len(ids), formats=len(pairs)))
    ours = simulate.kvviz_kld(pairs, ids, lm)
    progress(0.75, desc=t("engine_p_sim", lang).format(runs=len(pairs) + 1))
    rows = side_by_side(pairs, ours, theirs, simulate.llamacpp_kld(pairs, ids, lm, gguf, rotate=rotate))
    vllm_rows, vllm_note = [], ""
    if vllm:
        progress(0.9, desc=t("engine_p_vllm", lang).format(tokens=tokens, servers=len(vllm)))
        vllm_rows, vllm_note = _vllm_rows(vllm, tokens, lm, lang)
    fig = _bars(pairs, rows, vllm_rows, t("engine_rotated" if rotate else "engine_unrotated", lang), lang)
    status = t("engine_status", lang).format(
        seconds=f"{time.perf_counter() - start:.0f}", model=model, engine=rows[0].engine, gguf=gguf.name,
        last=len(ids) - 2, rotation=rows[0].rotation, rot=t("engine_status_rot", lang) if rotate else "",
        tokens=len(ids)) + vllm_note
    cells = [_cells(r, lang) for r in rows] + [_vllm_cells(r, lang) for r in vllm_rows]
    return table(cells, headers(lang)), fig, status


def _bars(pairs: list[str], rows: list, vllm_rows: list[verdict.VerdictRow], engine: str, lang: str = "en"):
    """The mean KLDs as grouped bars: per llama.cpp pair kvviz's bare format, llama.cpp and kvviz's simulation of
    llama.cpp; per vLLM dtype kvviz's simulation of its store and vLLM (a series of its own, gaps elsewhere)."""
    gap = [None] * len(vllm_rows)
    series = {t("engine_s_kvviz", lang): [round(r.kvviz_mean, 5) for r in rows]
              + [round(r.sim_mean, 5) for r in vllm_rows],
              engine: [round(r.engine_mean, 5) for r in rows] + gap,
              t("engine_s_sim", lang): [round(r.sim_mean, 5) for r in rows] + gap}
    if vllm_rows:
        series[t("engine_s_vllm", lang)] = [None] * len(rows) + [round(r.engine_mean, 5) for r in vllm_rows]
    return plots.engine_bars(pairs + [f"{r.spec} (vLLM)" for r in vllm_rows], series, title=t("engine_bars", lang))


def build(tr: Translator, actions: dict, model: gr.Dropdown) -> dict:
    """Lay out the engine view (an accordion, inside the current tab), on the tab's model picker `model`; adds its
    action to `actions` as "engine"; returns its components, keys prefixed "engine_"."""
    c: dict = {}
    vllm = vllm_servers(runtime.current().vllm_urls)  # the app's runtime, built from the environment as it starts
    c["engine_box"] = tr(gr.Accordion(t("engine_title"), open=False, elem_id="compare-engine"), label="engine_title")
    with c["engine_box"]:
        tr(gr.Markdown(t("engine_intro")), value="engine_intro")
        if vllm:
            tr(gr.Markdown(t("engine_vllm_note")), value="engine_vllm_note")
        with gr.Row():
            with gr.Column(scale=2, min_width=280):
                c["engine_pairs"] = tr(gr.CheckboxGroup(PAIR_CHOICES, value=DEFAULT_PAIRS, label=t("engine_pairs")),
                                       label="engine_pairs")
            with gr.Column(scale=1, min_width=220):
                c["engine_tokens"] = tr(gr.Slider(MIN_TOKENS, MAX_TOKENS, value=DEFAULT_TOKENS, step=32,
                                                  label=t("engine_tokens")), label="engine_tokens")
                c["engine_rotate"] = tr(gr.Checkbox(False, label=t("engine_rotate")), label="engine_rotate")
                c["engine_run"] = tr(gr.Button(t("engine_run"), elem_id="compare-engine-run"), value="engine_run")
        c["engine_status"] = gr.Markdown(elem_id="compare-engine-status", label="engine status")
        c["engine_table"] = tr(gr.Dataframe(headers=HEADERS, label=t("engine_table"), wrap=True), headers=headers,
                               label="engine_table")
        c["engine_fig"] = gr.Plot(plots.empty_figure(), label="kvviz against the engines", show_label=False)
        tr(gr.Markdown(t("engine_why")), value="engine_why")
    inputs = [c["engine_pairs"], c["engine_tokens"], c["engine_rotate"], model, tr.language_input()]
    outputs = [c["engine_table"], c["engine_fig"], c["engine_status"]]

    def run_view(pairs, tokens, rotate, model=None, lang="en", progress=gr.Progress()):
        return run(pairs, tokens, rotate, model, lang, progress, vllm=vllm)

    actions["engine"] = (run_view, inputs, outputs, "model")
    on_click(c["engine_run"], run_view, inputs, outputs, "engine_compare")
    return c
