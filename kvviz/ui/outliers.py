"""kvviz.ui.outliers: the K-outliers tab: which channels of K carry huge magnitudes, before and after RoPE, against V.

Statistics come from `kvviz.analysis` (capture, per-channel amax, the outlier rule, the Hadamard-rotated view).
api_name `outliers`:
    outliers(prompt, layer, head, model)
      -> (pre vs post RoPE figure, K vs V figure, rotated figure, layer x channel heatmap, outlier summary markdown)
"""

from __future__ import annotations

import gradio as gr

from kvviz import plots
from kvviz.analysis.stats import OUTLIER_FACTOR, capture_stats, rotation_view, strongest_outliers

from .common import (capture, check_language, check_layer_head, check_model, follow_model, layer_head_inputs,
                     model_input, on_click, prompt_input, user_errors)
from .i18n import Translator, t

TAB = "outliers"  # the tab id in app.py; prefixes elem_ids the browser test finds


def _channels(stats: dict, layer: int, head: int, lang: str = "en") -> str:
    """'3 (12.1), 17 (9.8) · 2 in all': a head's strongest outlier channels with their |x| max, largest first, and
    how many it has; or 'none'."""
    chans, total = strongest_outliers(stats, layer, head)
    if not chans:
        return t("r_none", lang)
    amax = stats["amax"][layer, head]
    listed = ", ".join(f"{c} ({amax[c]:.3g})" for c in chans)
    return listed + " · " + t("r_outlier_count", lang).format(shown=len(chans), total=total)


@user_errors
def run(prompt, layer, head, model=None, lang="en", progress=gr.Progress()):
    """Per-channel magnitudes of K and V for one layer/head of `model`, the rotated view and the layer x channel
    map; titles and summary in `lang`."""
    lang = check_language(lang)
    name = check_model(model)
    cap = capture(prompt, progress, name)
    layer, head = check_layer_head(cap, layer, head)
    stats = {w: capture_stats(cap, w) for w in ("keys_pre", "keys_post", "values")}
    where = t("r_where", lang).format(layer=layer, head=head, n=len(cap.tokens), model=name)

    amax = {w: stats[w]["amax"][layer, head] for w in stats}  # each [head_dim]
    post_outliers = strongest_outliers(stats["keys_post"], layer, head)[0]
    k_max, x_max = t("f_k_max", lang), t("f_x_max", lang)
    fig_rope = plots.channel_profile({"K pre-RoPE": amax["keys_pre"], "K post-RoPE": amax["keys_post"]},
                                     t("f_rope", lang).format(where=where), y_title=k_max, outliers=post_outliers)
    fig_kv = plots.channel_profile({"K post-RoPE": amax["keys_post"], "V": amax["values"]},
                                   t("f_kv", lang).format(where=where), y_title=x_max, outliers=post_outliers)
    rot = rotation_view(cap, layer, head, "keys_post")
    fig_rot = plots.channel_profile({"K post-RoPE": rot["original"]["amax"],
                                     "K post-RoPE, Hadamard-rotated": rot["rotated"]["amax"]},
                                    t("f_rot", lang).format(where=where), y_title=k_max)
    heat = plots.layer_channel_heatmap(stats["keys_post"]["amax"][:, head, :],
                                       t("f_heat", lang).format(head=head, model=name), z_title=t("f_k_z", lang))

    ratio = {w: float(stats[w]["amax_ratio"][layer, head]) for w in stats}
    md = t("r_outliers", lang).format(
        factor=f"{OUTLIER_FACTOR:g}", where=where, k_post=_channels(stats["keys_post"], layer, head, lang),
        r_post=ratio["keys_post"], k_pre=_channels(stats["keys_pre"], layer, head, lang), r_pre=ratio["keys_pre"],
        v=_channels(stats["values"], layer, head, lang), r_v=ratio["values"],
        rot_before=float(rot["original"]["amax_ratio"]), rot_after=float(rot["rotated"]["amax_ratio"]),
        kurt_before=float(rot["original"]["mean_kurtosis"]), kurt_after=float(rot["rotated"]["mean_kurtosis"]),
        n_k=sum(map(len, stats["keys_post"]["outliers"].values())),
        n_v=sum(map(len, stats["values"]["outliers"].values())))
    return fig_rope, fig_kv, fig_rot, heat, md


def build(tr: Translator) -> dict:
    """Lay out the K-outliers tab inside the current gr.Tab; returns its components by name."""
    c: dict = {}
    tr(gr.Markdown(t("outliers_intro")), value="outliers_intro")
    with gr.Row():
        with gr.Column(scale=3):
            c["model"] = model_input(tr)
            c["prompt"] = prompt_input(tr, 1)
        with gr.Column(scale=1, min_width=220):
            layer, head = layer_head_inputs()
            c["layer"] = tr(layer, label="layer")
            c["head"] = tr(head, label="head")
            c["run"] = tr(gr.Button(t("run"), variant="primary", elem_id=f"{TAB}-run"), value="run")
    c["summary"] = gr.Markdown(elem_id="outliers-summary", label="outlier channels")
    with gr.Row():
        c["fig_rope"] = gr.Plot(plots.empty_figure(), label="K pre vs post RoPE", show_label=False)
        c["fig_kv"] = gr.Plot(plots.empty_figure(), label="K beside V", show_label=False)
    with gr.Row():
        c["fig_rot"] = gr.Plot(plots.empty_figure(), label="Hadamard-rotated K", show_label=False)
        c["heat"] = gr.Plot(plots.empty_figure(), label="layer x channel heatmap", show_label=False)
    tr(gr.Markdown(t("outliers_why")), value="outliers_why")
    follow_model(c["model"], c["layer"], c["head"])
    c["inputs"] = [c["prompt"], c["layer"], c["head"], c["model"], tr.language_input()]
    c["outputs"] = [c["fig_rope"], c["fig_kv"], c["fig_rot"], c["heat"], c["summary"]]
    c["actions"] = {"run": (run, c["inputs"], c["outputs"], "model")}
    on_click(c["run"], run, c["inputs"], c["outputs"], "outliers")
    return c
