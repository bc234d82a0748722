"""kvviz.ui.errors: the Quantization-error tab: where the error lands, per layer, and per scale granularity.

Numbers come from `kvviz.analysis` (error maps, per-layer relative error, attention-output error, scale
comparison) on one captured prompt. api_name `error_map`:
    error_map(prompt, format, formats, custom_formats, which, layer, head, model)
      -> (token x channel heatmap, per-layer relative error figure, granularity figure, summary markdown)
"""

from __future__ import annotations

import gradio as gr

from kvviz import analysis, plots
from kvviz.formats import parse_kv

from .common import (capture, check_choice, check_language, check_layer_head, check_model, check_prompt, check_spec,
                     follow_model, layer_head_inputs, model_input, on_click, prompt_input, single_specs, spec_list,
                     user_errors)
from .i18n import Translator, t

TAB = "errors"  # the tab id in app.py; prefixes elem_ids the browser test finds

WHICH = {"K (post-RoPE)": "keys_post", "K (pre-RoPE)": "keys_pre", "V": "values"}
FORMAT_CHOICES = ["int8", "int4", "int2", "fp8_e4m3", "fp8_e5m2", "mxfp4", "nvfp4", "int4/channel/g32/asym",
                  "int4/rot", "k8v4", "k4v8", "kivi2", "q8_0", "q4_0", "iq4_nl"]
DEFAULT_FORMATS = ["int8", "int4", "fp8_e4m3", "mxfp4"]
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
    progress(0.7, desc="Quantizing every layer in every format…")

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


def build(tr: Translator) -> dict:
    """Lay out the Quantization-error tab inside the current gr.Tab; returns its components by name."""
    c: dict = {}
    tr(gr.Markdown(t("errors_intro")), value="errors_intro")
    with gr.Row():
        with gr.Column(scale=3):
            c["model"] = model_input(tr)
            c["prompt"] = prompt_input(tr, 1)
            c["formats"] = tr(gr.CheckboxGroup(FORMAT_CHOICES, value=DEFAULT_FORMATS, label=t("error_formats")),
                              label="error_formats")
            c["custom"] = tr(gr.Textbox(label=t("custom_specs"), info=t("custom_specs_info"), lines=1),
                             label="custom_specs", info="custom_specs_info")
        with gr.Column(scale=1, min_width=240):
            c["format"] = tr(gr.Dropdown(FORMAT_CHOICES, value="int4", allow_custom_value=True,
                                         label=t("error_format")), label="error_format")
            c["which"] = tr(gr.Radio(list(WHICH), value="K (post-RoPE)", label=t("which")), label="which")
            layer, head = layer_head_inputs()
            c["layer"] = tr(layer, label="layer")
            c["head"] = tr(head, label="head")
            c["run"] = tr(gr.Button(t("run"), variant="primary", elem_id=f"{TAB}-run"), value="run")
    with gr.Row():
        c["heat"] = gr.Plot(plots.empty_figure(), label="error heatmap", show_label=False)
        c["layers_fig"] = gr.Plot(plots.empty_figure(), label="per-layer relative error", show_label=False)
    c["gran"] = gr.Plot(plots.empty_figure(), label="scale granularities", show_label=False)
    c["summary"] = gr.Markdown(elem_id="errors-summary", label="summary")
    follow_model(c["model"], c["layer"], c["head"])
    c["inputs"] = [c["prompt"], c["format"], c["formats"], c["custom"], c["which"], c["layer"], c["head"], c["model"],
                   tr.language_input()]
    c["outputs"] = [c["heat"], c["layers_fig"], c["gran"], c["summary"]]
    c["actions"] = {"run": (run, c["inputs"], c["outputs"], "model")}
    on_click(c["run"], run, c["inputs"], c["outputs"], "error_map")
    return c
