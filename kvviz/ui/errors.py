"""kvviz.ui.errors: the Quantization-error tab: where the error lands, per layer, and per scale granularity.

Numbers come from `kvviz.analysis` (error maps, per-layer relative error, attention-output error, scale
comparison) on one captured prompt. api_names `error_map` and `anatomy`:
    error_map(prompt, format, formats, custom_formats, which, layer, head, model)
      -> (token x channel heatmap, per-layer relative error figure, granularity figure, summary markdown)
    anatomy(format, side, layer, head, token, prompt, model, language)
      -> (one token's elements step by step, TurboQuant's rotated-coordinate histogram, the stored numbers in markdown)
    (kvviz.analysis.anatomy: one token and head of the real K or V through any format of the registry, the engines'
    dtypes included)
"""

from __future__ import annotations

import gradio as gr

import math

from kvviz import analysis, plots
from kvviz.analysis.anatomy import format_anatomy
from kvviz.formats import ENGINE_VALUES
from kvviz.formats.engines import VLLM_MLA_ONLY_DTYPES
from kvviz.formats.family import REGISTRY
from kvviz.formats.spec import kvviz_bases

from .common import (EXAMPLES, capture, check_choice, check_int, check_language, check_layer_head, check_model,
                     check_prompt, check_spec, follow_model, layer_head_inputs, model_input, on_click, prompt_input,
                     single_specs, spec_list, user_errors)
from .i18n import Translator, t

TAB = "errors"  # the tab id in app.py; prefixes elem_ids the browser test finds

WHICH = {"K (post-RoPE)": "keys_post", "K (pre-RoPE)": "keys_pre", "V": "values"}
DEFAULT_FORMATS = ["int8", "int4", "fp8_e4m3", "mxfp4"]
# The anatomy's formats: every kvviz base, then every engine's dtype (kvviz.formats.engines), as typed in a spec;
# not vLLM's MLA latent records: the capture holds per-head K and V, never an MLA latent.
def anatomy_choices() -> list[str]:
    return [*kvviz_bases(), *(f"{engine}:{dtype}" for engine, (dtypes, _) in ENGINE_VALUES.items() for dtype in dtypes
                              if not (engine == "vllm" and dtype in VLLM_MLA_ONLY_DTYPES))]


SIDES = ("K", "V")
ANATOMY_ROWS = 8  # elements the step table lists: the outlier channels first, then the first elements
# Panels of the granularity figure: per-token, per-channel, per-tensor, and per-tensor after a rotation.
_PANELS = (("token", False), ("channel", False), ("tensor", False), ("tensor", True))


def _label(token: str) -> str:
    return repr(token)[1:-1][:16]


@user_errors
def run(prompt, fmt, formats, custom_formats, which, layer, head, model=None, lang="en", progress=gr.Progress()):
    """Error heatmap for one format/layer/head of `model`, per-layer error for every chosen format, granularities
    side by side; titles and summary in `lang`."""
    lang = check_language(lang)
    name = check_model(model)
    prompt = check_prompt(prompt)
    tensor = WHICH[check_choice(which, "Tensor", WHICH)]
    fmt = check_spec(fmt, "Format for the heatmap")  # a kvviz.Plan; ValueError listing the valid names
    kv = fmt.default
    specs = [p.name for p in single_specs(spec_list(formats, custom_formats, limit=8), "The chart's formats",
                                          "The error maps store one format in every layer.")]
    if not specs:
        raise ValueError("Pick at least one format for the per-layer chart.")
    cap = capture(prompt, progress, name)
    layer, head = check_layer_head(cap, layer, head)
    side = "V" if tensor == "values" else "K"
    progress(0.7, desc=t("p_errors", lang))

    where = t("r_where_short", lang).format(layer=layer, head=head, model=name)
    emap = analysis.error_map(cap, kv, layer, head, tensor)  # [T, D]
    heat = plots.error_heatmap(emap, t("f_error_heat", lang).format(side=side, fmt=fmt, which=which, where=where),
                               token_labels=[_label(s) for s in cap.tokens])

    per_layer, skipped = {}, []
    for s in specs:  # a format this model's head_dim cannot hold (mxfp4 at head_dim 16) is skipped, with a note
        try:
            per_layer[s] = analysis.layer_errors(cap, [s])[s]  # {"k": [L], "v": [L]}
        except ValueError as e:
            skipped.append(f"`{s}`: {e}")
    specs = [s for s in specs if s in per_layer]
    if not specs:
        raise ValueError("None of the chosen formats fits this model: " + "; ".join(skipped))
    lines = {s: {"K": per_layer[s]["k"], "V": per_layer[s]["v"]} for s in specs}
    fig_layers = plots.layer_error_lines(lines, t("f_layer_errors", lang).format(model=name),
                                         y_title=t("f_rel_error", lang))

    base = (kv.v if tensor == "values" else kv.k).base
    note = ""
    cmp = analysis.scale_comparison(cap, base, layer, head, tensor, rot=True)
    if not cmp:  # fp16/bf16 casts have no scale to compare
        note = " " + t("r_no_scales", lang).format(base=base)
        base = "int4"
        cmp = analysis.scale_comparison(cap, base, layer, head, tensor, rot=True)
    panels = {}
    for gran, rot in _PANELS:
        hit = [s for s, r in cmp.items() if r["granularity"] == gran and r["rot"] == rot]
        if hit:
            panels[f"per-{gran}" + (" + rotation" if rot else "")] = cmp[hit[0]]
    fig_gran = plots.granularity_heatmaps(
        {k: v["error_map"] for k, v in panels.items()},
        t("f_granularity", lang).format(base=base, which=which, where=where) + note,
        subtitles={k: t("f_gran_sub", lang).format(err=v["rel_error"], bits=v["bits_per_value"])
                   for k, v in panels.items()})

    attn = analysis.attention_errors(cap, specs)  # {spec: [L]}
    rows = "\n".join(f"| `{e.spec}` | {e.k:.4f} | {e.v:.4f} | {e.attention:.4f} | {e.bits_per_value:g} |"
                     for e in analysis.error_summary(cap, per_layer, attn))
    md = (t("r_errors_head", lang).format(n=len(cap.tokens), model=name) + "\n\n"
          + t("r_errors_table", lang) + "\n|---|---|---|---|---|\n" + rows + "\n\n" + t("r_errors_note", lang))
    if skipped:
        md += f"\n\n{t('r_skipped', lang)} " + "; ".join(skipped)
    return heat, fig_layers, fig_gran, md


def _bits_cell(bits: str) -> str:
    return f"`{bits}`"


def _anatomy_markdown(a, lang: str) -> str:
    """The stored numbers and the first elements step by step, as markdown tables."""
    head = t("r_anatomy_head", lang).format(
        fmt=a.format, side=a.side, layer=a.layer, head=a.head, token=a.token, text=_label(a.token_text),
        bpv=a.bits_per_value, err=a.rel_error, domain=a.domain)
    parts = [head]
    if a.rotation:
        parts.append(t("r_anatomy_rotation", lang).format(rotation=a.rotation))
    if a.codebook is not None:
        parts.append(t("r_anatomy_codebook", lang).format(
            n=len(a.codebook), codebook=", ".join(f"{c:.4g}" for c in a.codebook), norm=a.norm))
    if a.scales:
        shown = a.scales[:16]
        rows = "\n".join(f"| {s.name} | {s.value:.6g} | {s.dtype} | {_bits_cell(s.bits)} | {s.elements[0]}–"
                         f"{s.elements[1] - 1} |" for s in shown)
        more = "" if len(a.scales) <= len(shown) else "\n\n" + t("r_anatomy_more", lang).format(
            n=len(a.scales) - len(shown))
        parts.append(t("r_anatomy_scales", lang) + "\n|---|---|---|---|---|\n" + rows + more)
    else:
        parts.append(t("r_anatomy_no_scale", lang))
    picked = list(dict.fromkeys([*a.outliers[:ANATOMY_ROWS // 2], *range(a.head_dim)]))[:ANATOMY_ROWS]
    rows = "\n".join(
        f"| {i}{' ▼' if i in a.outliers else ''} | {a.inputs[i]:.5g} | {a.quantized_input[i]:.5g} | "
        f"{_bits_cell(a.code_bits[i])} ({a.codes[i]}) | {a.arithmetic[i]} | {a.reconstructed[i]:.5g} | "
        f"{a.error[i]:+.3g} |" for i in picked)
    parts.append(t("r_anatomy_steps", lang) + "\n|---|---|---|---|---|---|---|\n" + rows)
    parts.extend(a.notes)
    return "\n\n".join(parts)


@user_errors
def anatomy(fmt, side="K", layer=0, head=0, token=5, prompt=EXAMPLES[1], model=None, lang="en",
            progress=gr.Progress()):
    """One token and KV head of the real K (post-RoPE) or V of `prompt` on `model`, through the format `fmt` (a
    spec, a K/V pair or an engine dtype; the side's format is shown), step by step. The page's defaults: the tab's
    layer slider, token 5 of the tab's example prompt."""
    lang = check_language(lang)
    name = check_model(model)
    kv = check_spec(fmt, "Format for the anatomy").default
    side = check_choice(side, "Side", SIDES)
    prompt = check_prompt(prompt)
    cap = capture(prompt, progress, name)
    layer, head = check_layer_head(cap, layer, head)
    token = check_int(token, "Token", 0, len(cap.tokens) - 1)
    a = format_anatomy(cap, kv.k if side == "K" else kv.v, side, layer, head, token)
    where = t("r_where_short", lang).format(layer=layer, head=head, model=name)
    title = t("f_anatomy", lang).format(fmt=a.format, side=side, token=token, text=_label(a.token_text), where=where)
    fig = plots.format_anatomy(a.inputs, a.quantized_input, a.levels, a.quantized_output, a.reconstructed, a.codes,
                               a.code_bits, a.arithmetic, title, domain=a.domain, outliers=a.outliers)
    if a.rotated_all is None:
        hist = plots.empty_figure(t("r_anatomy_no_codebook", lang))
    else:
        scale = math.sqrt(a.head_dim)
        hist = plots.rotated_histogram(a.rotated_all, a.codebook, t("f_rotated_hist", lang).format(fmt=a.format,
                                       where=where), token=[v * scale for v in a.quantized_input], scale=scale)
    return fig, hist, _anatomy_markdown(a, lang)


def _which_choices(lang: str) -> list[tuple[str, str]]:
    """The tensor radio's (label in `lang`, value) pairs: the value is what the API takes, in English."""
    return [(t(f"which_{v}", lang), k) for k, v in WHICH.items()]


def build(tr: Translator) -> dict:
    """Lay out the Quantization-error tab inside the current gr.Tab; returns its components by name."""
    c: dict = {}
    tr(gr.Markdown(t("errors_intro")), value="errors_intro")
    with gr.Row():
        with gr.Column(scale=3):
            c["model"] = model_input(tr)
            c["prompt"] = prompt_input(tr, 1)
            c["formats"] = tr(gr.CheckboxGroup(REGISTRY.choices("errors"), value=DEFAULT_FORMATS,
                                               label=t("error_formats")),
                              label="error_formats")
            c["custom"] = tr(gr.Textbox(label=t("custom_specs"), info=t("custom_specs_info"), lines=1),
                             label="custom_specs", info="custom_specs_info")
        with gr.Column(scale=1, min_width=240):
            c["format"] = tr(gr.Dropdown(REGISTRY.choices("errors"), value="int4", allow_custom_value=True,
                                         label=t("error_format")), label="error_format")
            c["which"] = tr(gr.Radio(_which_choices("en"), value="K (post-RoPE)", label=t("which")), label="which",
                            choices=_which_choices)
            layer, head = layer_head_inputs()
            c["layer"] = tr(layer, label="layer")
            c["head"] = tr(head, label="head")
            c["run"] = tr(gr.Button(t("run"), variant="primary", elem_id=f"{TAB}-run"), value="run")
    with gr.Row():
        c["heat"] = gr.Plot(plots.empty_figure(), label="error heatmap", show_label=False)
        c["layers_fig"] = gr.Plot(plots.empty_figure(), label="per-layer relative error", show_label=False)
    c["gran"] = gr.Plot(plots.empty_figure(), label="scale granularities", show_label=False)
    c["summary"] = gr.Markdown(elem_id="errors-summary", label="summary")
    c["anatomy_box"] = tr(gr.Accordion(t("anatomy_title"), open=False, elem_id=f"{TAB}-anatomy"),
                          label="anatomy_title")
    with c["anatomy_box"]:
        tr(gr.Markdown(t("anatomy_intro")), value="anatomy_intro")
        with gr.Row():
            c["anatomy_format"] = tr(gr.Dropdown(anatomy_choices(), value="int4", allow_custom_value=True,
                                                 label=t("anatomy_format"), elem_classes=["kv-anatomy-format"]),
                                     label="anatomy_format")
            c["anatomy_side"] = tr(gr.Radio(list(SIDES), value="K", label=t("anatomy_side")), label="anatomy_side")
            c["anatomy_token"] = tr(gr.Number(5, precision=0, minimum=0, label=t("anatomy_token")),
                                    label="anatomy_token")
            c["anatomy_run"] = tr(gr.Button(t("anatomy_run"), elem_id=f"{TAB}-anatomy-run"), value="anatomy_run")
        c["anatomy_fig"] = gr.Plot(plots.empty_figure(), label="format anatomy", show_label=False)
        c["anatomy_hist"] = gr.Plot(plots.empty_figure(), label="rotated coordinates", show_label=False)
        c["anatomy_md"] = gr.Markdown(elem_id=f"{TAB}-anatomy-summary", label="anatomy")
    follow_model(c["model"], c["layer"], c["head"])
    lang = tr.language_input()
    c["inputs"] = [c["prompt"], c["format"], c["formats"], c["custom"], c["which"], c["layer"], c["head"], c["model"],
                   lang]
    c["outputs"] = [c["heat"], c["layers_fig"], c["gran"], c["summary"]]
    anatomy_io = ([c["anatomy_format"], c["anatomy_side"], c["layer"], c["head"], c["anatomy_token"], c["prompt"],
                   c["model"], lang], [c["anatomy_fig"], c["anatomy_hist"], c["anatomy_md"]])
    c["actions"] = {"run": (run, c["inputs"], c["outputs"], "model"), "anatomy": (anatomy, *anatomy_io, "model")}
    on_click(c["run"], run, c["inputs"], c["outputs"], "error_map")
    on_click(c["anatomy_run"], anatomy, *anatomy_io, "anatomy")
    return c
