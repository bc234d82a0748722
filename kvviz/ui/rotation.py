"""kvviz.ui.rotation: the Compare tab's "rotate, then quantize" view (lesson 9): six 4-bit-class formats at nearly
the same bytes, with and without a rotation, and one head's K coordinates before and after the rotation.

The formats: int4 per token (kvviz's own), `int4/rot` (the same after a Hadamard rotation), vLLM's
`int4_per_token_head` (asymmetric after a rotation) and `turboquant_4bit_nc` (a Lloyd-Max codebook for the rotated
coordinates, norm-corrected; vLLM keeps a dense model's first and last 2 layers in 16 bits), and the TurboQuant
paper's TQ-mse 4-bit and TQ-prod 4-bit (TQ-mse at 3 bits plus a 1-bit QJL sketch of the residual: an unbiased
inner product). Their teacher-forced KL on WikiText-2 comes from `kvviz.quality.kld`, their bits per value from
`kvviz.memory` (the engine's 16-bit layers included); the histogram from `kvviz.analysis.coordinate_histogram`.
api_name:
    rotation(tokens, model, language) -> (table, KL figure, histogram figure, status markdown)
      the table: format, bits per value, mean KL (nats/token), its standard error, p99 KL, same top (%)
"""

from __future__ import annotations

import time

import gradio as gr

from kvviz import plots, quality
from kvviz.analysis import capture_kv, coordinate_histogram
from kvviz.formats import as_plan
from kvviz.memory import kv_cache_bytes_for
from kvviz.quality.corpus import wikitext
from kvviz.formats.family import REGISTRY

from .common import check_int, check_language, check_model, fitting_specs, get_model, on_click, table, user_errors
from .i18n import Translator, t

MIN_TOKENS, MAX_TOKENS, DEFAULT_TOKENS = 32, 512, 256  # one WikiText-2 window; its second half is scored


def _headers(lang: str = "en") -> list[str]:
    return [t(k, lang) for k in ("h_format", "rot_h_bits", "h_kl", "rot_h_se", "h_kl_p99", "h_top1")]


def _status(kl: dict, hist: dict, name: str, tokens: int, seconds: float, skipped: list[str], lang: str) -> str:
    """What was measured, in numbers: the rotation's effect on the coordinates, and TQ-prod against TQ-mse."""
    parts = [t("rot_done", lang).format(model=name, n=tokens, s=seconds)]
    parts.append(t("rot_hist_note", lang).format(layer=hist["layer_id"], head=hist["head"], d=hist["head_dim"],
                                                 kb=hist["kurtosis_before"], ka=hist["kurtosis_after"],
                                                 mb=hist["max_before"], ma=hist["max_after"]))
    if "tq_prod4" in kl and "tq_mse4" in kl:
        prod, mse = kl["tq_prod4"], kl["tq_mse4"]
        key = "rot_prod_worse" if prod["mean"] > mse["mean"] else "rot_prod_better"
        parts.append(t(key, lang).format(prod=prod["mean"], mse=mse["mean"], ratio=prod["mean"] / max(mse["mean"],
                                                                                                       1e-12)))
    if skipped:
        parts.append(f"{t('r_skipped', lang)} " + "; ".join(skipped))
    return "\n\n".join(parts)


@user_errors
def run(tokens, model=None, lang="en", progress=gr.Progress()):
    """KL and bits of the rotation view's formats (REGISTRY.choices("rotation")) on `tokens` WikiText-2 tokens of
    `model`, and one head's K coordinates before and after the rotation against N(0, 1/d): table, KL bars,
    histogram, status (in `lang`)."""
    lang = check_language(lang)
    name = check_model(model)
    tokens = check_int(tokens, "Tokens", MIN_TOKENS, MAX_TOKENS)
    lm, tok = get_model(progress, name)
    plans, skipped = fitting_specs([as_plan(f) for f in REGISTRY.choices("rotation")], lm)
    start = time.perf_counter()
    progress(0.1, desc=t("p_rotation", lang).format(formats=len(plans), n=tokens))
    text = wikitext()
    kl = quality.kld(lm, tok, plans, text=text, windows=1, window_tokens=tokens)
    progress(0.8, desc=t("p_rotation_capture", lang))
    hist = coordinate_histogram(capture_kv(lm, tok, text, max_tokens=tokens))
    fp16 = kv_cache_bytes_for(lm.config, tokens, k="fp16", layout="transformers")
    bits = {p.name: 16 * kv_cache_bytes_for(lm.config, tokens, k=p, layout="transformers") / fp16 for p in plans}
    names = [p.name for p in plans]
    rows = [[n, round(bits[n], 3), round(kl[n]["mean"], 5), round(kl[n]["mean_se"], 5), round(kl[n]["p99"], 4),
             round(100 * kl[n]["same_top_p"], 1)] for n in names]
    headers = _headers(lang)
    kl_fig = plots.metrics_bars(names, {t("c_kl", lang): [kl[n]["mean"] for n in names],
                                        t("rot_c_bits", lang): [bits[n] for n in names]},
                                title=t("rot_kl_title", lang).format(model=name, n=tokens),
                                x_title=t("f_format_axis", lang))
    hist_fig = plots.coordinate_histogram(
        hist["edges"], {t("rot_before", lang): hist["before"], t("rot_after", lang): hist["after"]},
        hist["curve_x"], hist["curve_pdf"],
        t("rot_hist_title", lang).format(model=name, layer=hist["layer_id"], head=hist["head"], d=hist["head_dim"]),
        curve_name=t("rot_curve", lang), axis_titles=(t("rot_hist_x", lang), t("rot_hist_y", lang)))
    status = _status(kl, hist, name, tokens, time.perf_counter() - start, skipped, lang)
    return table(rows, headers), kl_fig, hist_fig, status


def build(tr: Translator, actions: dict, model: gr.Dropdown, lang: gr.Radio) -> dict:
    """Lay out the view (an accordion inside the current tab) on the tab's model picker `model` and the page's
    language `lang`; adds its action to `actions` as "rotation"; returns its components, keys prefixed "rot_"."""
    c: dict = {}
    c["rot_box"] = tr(gr.Accordion(t("rot_title"), open=False, elem_id="compare-rotation"), label="rot_title")
    with c["rot_box"]:
        tr(gr.Markdown(t("rot_intro")), value="rot_intro")
        with gr.Row():
            c["rot_tokens"] = tr(gr.Slider(MIN_TOKENS, MAX_TOKENS, value=DEFAULT_TOKENS, step=32,
                                           label=t("rot_tokens")), label="rot_tokens")
            c["rot_run"] = tr(gr.Button(t("rot_run"), elem_id="compare-rotation-run"), value="rot_run")
        c["rot_status"] = gr.Markdown(elem_id="compare-rotation-status", label="rotation status")
        c["rot_table"] = tr(gr.Dataframe(headers=_headers(), label=t("rot_table"), wrap=True,
                                         elem_id="compare-rotation-table"),
                            label="rot_table", headers=_headers)
        with gr.Row():
            c["rot_kl_fig"] = gr.Plot(plots.empty_figure(), label="KL per format", show_label=False)
            c["rot_hist_fig"] = gr.Plot(plots.empty_figure(), label="K coordinates before and after the rotation",
                                        show_label=False, elem_id="compare-rotation-hist")
    inputs = [c["rot_tokens"], model, lang]
    outputs = [c["rot_table"], c["rot_kl_fig"], c["rot_hist_fig"], c["rot_status"]]
    actions["rotation"] = (run, inputs, outputs, "model")
    on_click(c["rot_run"], run, inputs, outputs, "rotation")
    return c
