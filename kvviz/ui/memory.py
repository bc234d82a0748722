"""kvviz.ui.memory: the Memory tab: KV-cache bytes against context, what fits on which GPU, the formula.

Needs no model: every number comes from `kvviz.memory` (exact bytes, scales and residual windows included).
api_name `memory`:
    memory(model, layers, kv_heads, head_dim, params_b, batch, ctx_min, ctx_max, formats, custom_formats, gpus)
      -> (figure, table, formula markdown)
"""

from __future__ import annotations

import numpy as np
import gradio as gr

from kvviz import memory as mem
from kvviz import plots
from kvviz.formats import parse_kv

from .common import check_float, check_int, spec_list, table, user_errors
from .i18n import Translator, t

TAB = "memory"  # the tab id in app.py; prefixes elem_ids the browser test finds

CUSTOM = "custom"
FORMAT_CHOICES = ["fp16", "fp8_e4m3", "k8v4", "int4", "kivi2", "mxfp4", "nvfp4", "int4/g16", "int2", "q8_0", "q4_0"]
DEFAULT_FORMATS = ["fp16", "fp8_e4m3", "k8v4", "int4", "mxfp4"]
GPU_CHOICES = list(mem.GPU_PRESETS)
DEFAULT_GPUS = ["l4", "a100-40gb", "h100-80gb", "h200"]  # four capacities, four distinct lines
_POINTS = 48  # samples along the context axis


def _model(name, layers, kv_heads, head_dim, params_b) -> mem.ModelPreset:
    """The preset named `name`, or a custom shape from the number fields."""
    if name != CUSTOM:
        return mem.get_model_preset(name)
    return mem.ModelPreset(
        name="custom", layers=check_int(layers, "Layers", 1, 1024), kv_heads=check_int(kv_heads, "KV heads", 1, 1024),
        head_dim=check_int(head_dim, "Head dim", 2, 1024), q_heads=check_int(kv_heads, "KV heads", 1, 1024),
        params=check_float(params_b, "Parameters (billions)", 0.0, 10_000.0) * 1e9, hidden=0, max_context=None)


@user_errors
def run(model, layers, kv_heads, head_dim, params_b, batch, ctx_min, ctx_max, formats, custom_formats, gpus):
    """Memory against context for each format, the GPU-fit table and the filled-in formula."""
    m = _model(model, layers, kv_heads, head_dim, params_b)
    batch = check_int(batch, "Batch size", 1, 65536)
    lo = check_int(ctx_min, "Shortest context", 1, 1 << 24)
    hi = check_int(ctx_max, "Longest context", 1, 1 << 24)
    if lo >= hi:
        raise ValueError(f"The shortest context ({lo}) must be below the longest ({hi}).")
    specs = spec_list(formats, custom_formats, limit=10)
    if not specs:
        raise ValueError("Pick at least one format (fp16, fp8_e4m3, k8v4, ...).")
    gpu_names = [g for g in (gpus or []) if g]
    for g in gpu_names:
        mem.get_gpu_preset(g)  # ValueError listing the GPUs for an unknown name

    contexts = sorted({int(round(x)) for x in np.geomspace(lo, hi, _POINTS)})
    shape = (m.layers, m.kv_heads, m.head_dim)
    gb = {s: [mem.kv_cache_bytes(*shape, c, batch, s) / mem.GB for c in contexts] for s in specs}
    budgets = {g: mem.kv_budget_bytes(m, g) / mem.GB for g in gpu_names}
    lines = {f"{g} ({mem.GPU_PRESETS[g].memory_gb:g} GB): {b:.1f} GB for KV": b for g, b in budgets.items() if b > 0}
    title = f"KV cache of {m.name} at batch {batch} ({m.layers} layers, {m.kv_heads} KV heads, head_dim {m.head_dim})"
    fig = plots.memory_vs_context(contexts, gb, lines, title=title)

    headers = ["format", "bits/value (K / V)", f"GB at {hi:,} tokens × {batch}", "tokens vs fp16"]
    headers += [f"{g} ({mem.GPU_PRESETS[g].memory_gb:g} GB)" for g in gpu_names]
    fp16 = mem.kv_cache_bytes(*shape, hi, batch, "fp16")
    rows = []
    for s in specs:
        kv = parse_kv(s)
        nbytes = mem.kv_cache_bytes(*shape, hi, batch, s)
        row = [s, f"{kv.k.bits_per_value(m.head_dim):g} / {kv.v.bits_per_value(m.head_dim):g}",
               round(nbytes / mem.GB, 3), f"{fp16 / nbytes:.2f}×"]
        for g in gpu_names:
            row.append(f"{mem.max_context(m, g, s, batch=batch):,} tokens · batch {mem.max_batch(m, g, hi, s):,}")
        rows.append(row)
    return fig, table(rows, headers), _formula(m, batch, hi, specs, budgets)


def _formula(m: mem.ModelPreset, batch: int, tokens: int, specs: list[str], budgets: dict[str, float]) -> str:
    """The memory formula, once in symbols and once per format with this model's numbers in it."""
    shape = (m.layers, m.kv_heads, m.head_dim)
    out = ["**bytes = 2 (K and V) × layers × batch × KV heads × tokens × head_dim × bits per value ÷ 8**"
           " (+ per-layer static scales; bits per value include per-group scales and zero points)\n"]
    for s in specs:
        kv = parse_kv(s)
        bits = kv.bits_per_value(m.head_dim)
        exact = mem.kv_cache_bytes(*shape, tokens, batch, s)
        out.append(f"- `{s}`: 2 × {m.layers} × {batch} × {m.kv_heads} × {tokens:,} × {m.head_dim} × "
                   f"{bits:g} ÷ 8 = **{exact / mem.GB:.4g} GB** ({exact:,} bytes)")
    gone = [g for g, b in budgets.items() if b <= 0]
    if gone:
        out.append(f"\nThe weights alone ({m.params * 2 / mem.GB:.1f} GB in bf16) do not fit on: {', '.join(gone)}.")
    return "\n".join(out)


def build(tr: Translator) -> dict:
    """Lay out the Memory tab inside the current gr.Tab; returns its components by name."""
    c: dict = {}
    tr(gr.Markdown(t("memory_intro")), value="memory_intro")
    with gr.Row():
        with gr.Column(scale=1, min_width=280):
            c["model"] = tr(gr.Dropdown([*mem.MODEL_PRESETS, CUSTOM], value="llama-3.1-8b", label=t("model_preset")),
                            label="model_preset")
            with tr(gr.Accordion(t("custom_dims"), open=False), label="custom_dims"):
                with gr.Row():
                    c["layers"] = tr(gr.Number(32, label=t("layers"), precision=0), label="layers")
                    c["kv_heads"] = tr(gr.Number(8, label=t("kv_heads"), precision=0), label="kv_heads")
                with gr.Row():
                    c["head_dim"] = tr(gr.Number(128, label=t("head_dim"), precision=0), label="head_dim")
                    c["params_b"] = tr(gr.Number(8.0, label=t("params_b")), label="params_b")
            c["batch"] = tr(gr.Number(1, label=t("batch"), precision=0), label="batch")
            with gr.Row():
                c["ctx_min"] = tr(gr.Number(1024, label=t("ctx_min"), precision=0), label="ctx_min")
                c["ctx_max"] = tr(gr.Number(131072, label=t("ctx_max"), precision=0), label="ctx_max")
            c["formats"] = tr(gr.CheckboxGroup(FORMAT_CHOICES, value=DEFAULT_FORMATS, label=t("memory_formats")),
                              label="memory_formats")
            c["custom"] = tr(gr.Textbox(label=t("custom_specs"), info=t("custom_specs_info"), lines=1,
                                        elem_id=f"{TAB}-custom"), label="custom_specs", info="custom_specs_info")
            c["gpus"] = tr(gr.CheckboxGroup(GPU_CHOICES, value=DEFAULT_GPUS, label=t("gpus")), label="gpus")
            c["run"] = tr(gr.Button(t("run"), variant="primary", elem_id=f"{TAB}-run"), value="run")
        with gr.Column(scale=3):
            c["plot"] = gr.Plot(plots.empty_figure(), label="memory vs context", show_label=False, elem_id="memory-plot")
            c["formula"] = gr.Markdown(elem_id="memory-formula", label="formula")
    c["table"] = tr(gr.Dataframe(label=t("fit_table"), wrap=True), label="fit_table")
    c["inputs"] = [c[k] for k in ("model", "layers", "kv_heads", "head_dim", "params_b", "batch", "ctx_min",
                                  "ctx_max", "formats", "custom", "gpus")]
    c["outputs"] = [c["plot"], c["table"], c["formula"]]
    c["actions"] = {"run": (run, c["inputs"], c["outputs"], "memory")}
    c["run"].click(run, c["inputs"], c["outputs"], api_name="memory", concurrency_id="memory", concurrency_limit=4)
    return c
