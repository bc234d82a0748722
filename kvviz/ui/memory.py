"""kvviz.ui.memory: the Memory tab: KV-cache bytes against context, per layer kind, what fits on which GPU.

Needs no model: every number comes from `kvviz.memory` (exact bytes per layer, scales and residual windows
included). The model is a preset, an uploaded config.json (at most 1 MB), a hub id (when the Space has network),
or custom dimensions. api_name `memory`:
    memory(model, layers, kv_heads, head_dim, params_b, batch, ctx_min, ctx_max, formats, custom_formats, gpus,
           config_file, hf_id, layout, lang)
      -> (figure, GPU-fit table, formula markdown, per-layer-kind table), in `lang` (default English)
Every argument is checked here (preprocess=False): a wrong type or range comes back as a message naming it.
"""

from __future__ import annotations

import gradio as gr

from kvviz import memory as mem
from kvviz import plots
from kvviz.formats.family import REGISTRY

from .checks import check_choice, check_float, check_int, check_language, check_names, check_text, spec_list
from .common import UploadFile, on_click, table, upload_path, user_errors
from .i18n import Translator, t

TAB = "memory"  # the tab id in app.py; prefixes elem_ids the browser test finds

CUSTOM = "custom"
MODEL_CHOICES = [*mem.MODEL_PRESETS, CUSTOM]
DEFAULT_FORMATS = ["fp16", "fp8_e4m3", "k8v4", "int4", "mxfp4"]
GPU_CHOICES = list(mem.GPU_PRESETS)
DEFAULT_GPUS = ["l4", "a100-40gb", "h100-80gb", "h200"]  # four capacities, four distinct lines
DEFAULT_CONTEXT = 131072  # tokens: the chart's right end, where the tables count


def _model(name, layers, kv_heads, head_dim, params_b, config_file, hf_id) -> mem.ModelPreset:
    """The uploaded config.json, else the hub id, else the preset named `name` or custom dimensions."""
    params_b = check_float(params_b, "Parameters (billions)", 0.0, 100_000.0)
    params = params_b * 1e9 if params_b else None  # 0: unknown
    hf_id = check_text(hf_id, "Hub id", max_chars=200)
    if config_file is not None:
        path = upload_path(config_file, "The config.json")
        size = path.stat().st_size
        if size > mem.MAX_CONFIG_BYTES:
            raise ValueError(f"The uploaded file is {size:,} bytes; a config.json is a few KB (limit 1 MB).")
        m = mem.resolve_model(path, params)
        return mem.ModelPreset(path.stem if m.name == "config" else m.name, m.config, m.params, "uploaded config.json")
    if hf_id:
        return mem.resolve_model(hf_id, params)
    name = check_choice(name, "Model", MODEL_CHOICES)
    if name != CUSTOM:
        return mem.get_model_preset(name)
    return mem.ModelPreset.from_dims("custom", check_int(layers, "Layers", 1, 1024),
                                     check_int(kv_heads, "KV heads", 1, 1024), check_int(head_dim, "Head dim", 2, 1024),
                                     params)


@user_errors
def run(model, layers, kv_heads, head_dim, params_b, batch, ctx_min, ctx_max, formats, custom_formats, gpus,
        config_file=None, hf_id="", layout="engine", lang="en"):
    """Memory against context for each format, the GPU-fit table, the formula and the per-layer-kind table, in
    `lang`."""
    lang = check_language(lang)
    m = _model(model, layers, kv_heads, head_dim, params_b, config_file, hf_id)
    batch = check_int(batch, "Batch size", 1, 65536)
    lo = check_int(ctx_min, "Shortest context", 1, 1 << 24)
    hi = check_int(ctx_max, "Longest context", 1, 1 << 24)
    layout = check_choice(layout, "Layout", mem.LAYOUTS)
    if lo >= hi:
        raise ValueError(f"The shortest context ({lo}) must be below the longest ({hi}).")
    plans = spec_list(formats, custom_formats, limit=10)  # kvviz.Plans, parsed here once
    if not plans:
        raise ValueError("Pick at least one format (fp16, fp8_e4m3, k8v4, ...).")
    gpu_names = check_names(gpus, "GPUs")
    for g in gpu_names:
        mem.get_gpu_preset(g)  # ValueError listing the GPUs for an unknown name
    if m.params is None:
        gpu_names = []  # the weights are unknown: no fit (the formula says so)

    for plan in plans:
        plan.resolve(m.layers)  # a plan naming a layer this model lacks raises here
    plans = {p.name: p for p in plans}
    curves = mem.memory_curves(m, plans, lo, hi, batch, layout)  # the numbers: kvviz/memory/curves.py
    windowed = {t("mem_windowed", lang).format(fmt=s): gb for s, gb in curves.windowed_gb.items()}
    state = mem.state_bytes_for(m, batch, "transformers" if layout == "transformers" else "engine")
    budgets = {g: (mem.kv_budget_bytes(m, g) - state) / mem.GB for g in gpu_names}
    lines = {t("mem_gpu_line", lang).format(gpu=g, gb=mem.GPU_PRESETS[g].memory_gb, kv=b): b
             for g, b in budgets.items() if b > 0}
    title = t("mem_title", lang).format(model=m.name, batch=batch, layers=m.layers, layout=layout)
    fig = plots.memory_vs_context(curves.contexts, curves.gb, lines, title=title, dashed=windowed,
                                  axis_titles=(t("mem_x", lang), t("mem_y", lang)))

    headers = _fit_headers(hi, batch, gpu_names, lang)
    rows = []
    for s, r in zip(plans, mem.memory_table(m, list(plans.values()), hi, batch=batch, layout=layout)):
        bits = " / ".join("-" if b is None else f"{b:g}" for b in (r["k_bits"], r["v_bits"]))
        row = [s, bits, round(r["gb"], 3),
               "-" if r["tokens_vs_fp16"] is None else f"{r['tokens_vs_fp16']:.2f}×"]
        for g in gpu_names:
            longest = mem.max_context(m, g, plans[s], batch=batch, layout=layout)
            shown = t("mem_any", lang) if longest >= mem.CONTEXT_CAP else f"{longest:,}"
            row.append(t("mem_fit_cell", lang).format(
                tokens=shown, batch=f"{mem.max_batch(m, g, hi, plans[s], layout=layout):,}"))
        rows.append(row)
    return (fig, table(rows, headers), _formula(m, batch, hi, plans, budgets, state, layout, lang),
            _breakdown(curves.caches, hi, batch, lang))


def _fit_headers(tokens: int, batch: int, gpu_names: list[str], lang: str = "en") -> list[str]:
    """The GPU-fit table's columns: the format, its bits, its GB at `tokens` x `batch`, then one per GPU."""
    return (t("mem_fit_headers", lang).format(tokens=f"{tokens:,}", batch=batch).split("|")
            + [f"{g} ({mem.GPU_PRESETS[g].memory_gb:g} GB)" for g in gpu_names])


def _breakdown_headers(tokens: int, formats: list[str], lang: str = "en") -> list[str]:
    """The per-layer-kind table's columns: the layer kind, its shape, then each format's GB."""
    return [*t("mem_breakdown_headers", lang).format(tokens=f"{tokens:,}").split("|"), *[f"{s} GB" for s in formats]]


def _breakdown(caches: dict, tokens: int, batch: int, lang: str = "en"):
    """Per layer kind: layers, tokens each holds at `tokens`, K and V per token, GB per format."""
    per_format = {s: c.breakdown(tokens, batch) for s, c in caches.items()}
    first = next(iter(per_format.values()))
    headers = _breakdown_headers(tokens, list(per_format), lang)
    rows = []
    for i, r in enumerate(first):
        kind = r["kind"] + (t("mem_window", lang).format(window=f"{r['window']:,}") if r["window"] else "")
        rows.append([kind, r["layers"], r["tokens"], f"{r['k_heads']} × {r['k_dim']}" if r["k_heads"] else "-",
                     f"{r['v_heads']} × {r['v_dim']}" if r["v_heads"] else "-",
                     *[round(rows_[i]["bytes"] / mem.GB, 4) for rows_ in per_format.values()]])
    return table(rows, headers)


def _formula(m: mem.ModelPreset, batch: int, tokens: int, plans: dict, budgets: dict[str, float],
             state: int, layout: str, lang: str = "en") -> str:
    """The memory formula, once in symbols and once per format and layer kind with this model's numbers in it."""
    out = [t("mem_formula", lang).format(layout=layout) + "\n"]
    for s, plan in plans.items():
        cache = mem.CacheModel(m, plan, None, layout)
        rows = cache.breakdown(tokens, batch)
        exact = sum(r["bytes"] for r in rows)
        if not cache.uniform:  # a per-layer plan, or an engine's rule (16-bit layers): each layer's own bits
            own = "" if not plan.is_uniform else t("mem_engine_16bit", lang)
            out.append(t("mem_per_layer", lang).format(fmt=s, own=own, layers=m.layers, batch=batch,
                                                       gb=f"{exact / mem.GB:.4g}", bytes=f"{exact:,}"))
            continue
        bits = plan.default.bits_per_value(m.head_dim)
        parts = [f"{r['layers']} × ({r['k_heads']}×{r['k_dim']} + {r['v_heads']}×{r['v_dim']}) × {r['tokens']:,}"
                 for r in rows if r["k_heads"]]
        out.append(f"- `{s}`: [{' + '.join(parts)}] × {batch} × {bits:g} ÷ 8 = **{exact / mem.GB:.4g} GB** "
                   + t("mem_bytes", lang).format(bytes=f"{exact:,}"))
    if state:
        out.append("\n" + t("mem_state", lang).format(mb=f"{state / 1e6:,.1f}", batch=batch))
    if m.params is None:
        out.append("\n" + t("mem_no_params", lang))
    gone = [g for g, b in budgets.items() if b <= 0]
    if gone:
        out.append("\n" + t("mem_weights_too_big", lang).format(gb=f"{m.params * 2 / mem.GB:.1f}",
                                                                 gpus=", ".join(gone)))
    return "\n".join(out)


def build(tr: Translator) -> dict:
    """Lay out the Memory tab inside the current gr.Tab; returns its components by name."""
    c: dict = {}
    tr(gr.Markdown(t("memory_intro")), value="memory_intro")
    with gr.Row():
        with gr.Column(scale=1, min_width=280):
            c["model"] = tr(gr.Dropdown(MODEL_CHOICES, value="llama-3.1-8b", label=t("model_preset")),
                            label="model_preset")
            with tr(gr.Accordion(t("memory_config_source"), open=False), label="memory_config_source"):
                c["config_file"] = tr(UploadFile(label=t("memory_config_file"), file_types=[".json"], height=120,
                                                 elem_id=f"{TAB}-config-file"), label="memory_config_file")
                c["hf_id"] = tr(gr.Textbox(label=t("memory_hf_id"), info=t("memory_hf_id_info"), lines=1,
                                           elem_id=f"{TAB}-hf-id"), label="memory_hf_id", info="memory_hf_id_info")
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
                c["ctx_max"] = tr(gr.Number(DEFAULT_CONTEXT, label=t("ctx_max"), precision=0), label="ctx_max")
            c["formats"] = tr(gr.CheckboxGroup(REGISTRY.choices("memory"), value=DEFAULT_FORMATS,
                                               label=t("memory_formats")),
                              label="memory_formats")
            c["custom"] = tr(gr.Textbox(label=t("custom_specs"), info=t("custom_specs_info"), lines=1,
                                        elem_id=f"{TAB}-custom"), label="custom_specs", info="custom_specs_info")
            c["gpus"] = tr(gr.CheckboxGroup(GPU_CHOICES, value=DEFAULT_GPUS, label=t("gpus")), label="gpus")
            c["layout"] = tr(gr.Radio(list(mem.LAYOUTS), value="engine", label=t("memory_layout"),
                                      info=t("memory_layout_info")), label="memory_layout", info="memory_layout_info")
            c["run"] = tr(gr.Button(t("run"), variant="primary", elem_id=f"{TAB}-run"), value="run")
        with gr.Column(scale=3):
            c["plot"] = gr.Plot(plots.empty_figure(), label="memory vs context", show_label=False, elem_id="memory-plot")
            c["formula"] = gr.Markdown(elem_id="memory-formula", label="formula")
            # headers for the default inputs before the first run (without them gradio shows columns "1 2 3")
            c["breakdown"] = tr(gr.Dataframe(headers=_breakdown_headers(DEFAULT_CONTEXT, DEFAULT_FORMATS),
                                             label=t("memory_breakdown"), wrap=True, elem_id=f"{TAB}-breakdown"),
                                headers=lambda lang: _breakdown_headers(DEFAULT_CONTEXT, DEFAULT_FORMATS, lang),
                                label="memory_breakdown")
    c["table"] = tr(gr.Dataframe(headers=_fit_headers(DEFAULT_CONTEXT, 1, DEFAULT_GPUS), label=t("fit_table"),
                                 wrap=True, elem_id=f"{TAB}-fit"),
                    headers=lambda lang: _fit_headers(DEFAULT_CONTEXT, 1, DEFAULT_GPUS, lang), label="fit_table")
    c["inputs"] = [*(c[k] for k in ("model", "layers", "kv_heads", "head_dim", "params_b", "batch", "ctx_min",
                                    "ctx_max", "formats", "custom", "gpus", "config_file", "hf_id", "layout")),
                   tr.language_input()]
    c["outputs"] = [c["plot"], c["table"], c["formula"], c["breakdown"]]
    c["actions"] = {"run": (run, c["inputs"], c["outputs"], "memory")}
    on_click(c["run"], run, c["inputs"], c["outputs"], "memory", concurrency_id="memory", concurrency_limit=4)
    return c
