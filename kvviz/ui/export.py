"""kvviz.ui.export: the Export tab: vLLM / SGLang / llama.cpp flags and code for a format, and calibrated SGLang scales.

Commands come from `kvviz.export`; per-layer scales from `kvviz.calibrate`, measured on the user's prompts with
the loaded model. A format an engine lacks is shown as unsupported with the engine's closest option in words.
api_names:
    export(spec, model_id, calib_prompts, model)
      -> (commands markdown, support table, scales JSON text, scales file, per-layer scales figure)
      (`model` is the picked model the scales are calibrated on; `model_id` only goes into the commands)
    (`spec` may be a per-layer plan such as "fp8_e4m3; 0,27=fp16": its layers are the picked model's, and the
      flags are kvviz.export.export_plan's)
    check_scales(file, model) -> summary markdown (a malformed file is a gr.Error naming what is wrong)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import gradio as gr

from kvviz import calibrate, plots
from kvviz import export as kv_export
from kvviz.cache import model_layer_types
from kvviz.formats import as_plan
from kvviz.formats.family import REGISTRY

from .common import (ScaleNotes, UploadFile, check_language, check_model, check_text, get_model, model_input,
                     model_layer_kinds, model_shape, on_click, table, upload_path, user_errors)
from .i18n import Translator, t

TAB = "export"  # the tab id in app.py; prefixes elem_ids the browser test finds

ENGINE_TITLES = (("vllm", "vLLM"), ("sglang", "SGLang"), ("llama.cpp", "llama.cpp"))
DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_PROMPTS = ("The KV cache stores the keys and values of every past token.\n"
                   "Quantizing it to 8 bits halves its memory.\n"
                   "Paris is the capital of France, and Seoul is the capital of South Korea.")
MAX_PROMPTS = 32
MAX_PROMPT_CHARS = 4000


def _commands_markdown(title: str, out: dict, lang: str = "en") -> str:
    parts = [f"### `{title}`"]
    for engine, title in ENGINE_TITLES:
        r = out[engine]
        if r["supported"]:
            parts.append(f"**{title}**: {t('r_supported', lang)}, `{r['flags']}`\n\n"
                         f"```bash\n{r['cli']}\n```\n```python\n{r['python']}\n```\n{r['note']}")
        else:
            parts.append(f"**{title}**: **{t('r_not_supported', lang)}.** {r['note']}")
    return "\n\n".join(parts)


def _support_headers(lang: str = "en") -> list[str]:
    return [t("h_format", lang), "vLLM --kv-cache-dtype", "SGLang --kv-cache-dtype", "llama.cpp -ctk / -ctv"]


def _support_table(model_id: str, lang: str = "en") -> list[list[str]]:
    """Every common format against each engine: the dtype flag, or ✗."""
    return [[row["spec"], *(row[engine] or t("r_unsupported", lang) for engine, _ in ENGINE_TITLES)]
            for row in kv_export.export_table(REGISTRY.choices("export_support"), model_id)]


@user_errors
def run(spec, model_id, calib_prompts, model=None, lang="en", progress=gr.Progress()):
    """Commands for `spec`, the support table and, given prompts, per-layer FP8 scales as SGLang's JSON, calibrated
    on `model`."""
    lang = check_language(lang)
    name = check_model(model)
    spec = check_text(spec, "KV format", max_chars=200)
    if not spec:
        raise ValueError("Pick a KV format (e.g. fp8_e4m3) to export.")
    model_id = check_text(model_id, "Model id", max_chars=300) or DEFAULT_MODEL_ID
    calib_prompts = check_text(calib_prompts, "Calibration prompts", max_chars=MAX_PROMPTS * MAX_PROMPT_CHARS)
    if any(c.isspace() for c in model_id):
        raise ValueError(f"The model id {model_id!r} contains spaces; give a hub id or a path without spaces.")
    plan = as_plan(spec)  # parsed here, once
    if plan.is_uniform:
        kv, title = plan.default, plan.default.spec
        out = kv_export.export_commands(kv, model_id, scales_path="scales.json")
    else:  # a per-layer plan: its layers are the picked model's
        kinds = model_layer_kinds(name) or model_layer_types(get_model(progress, name)[0].config)
        kv, title = None, plan.fitted(len(kinds), kinds).text
        out = kv_export.export_plan(plan, len(kinds), model_id, kinds)
    prompts = [p.strip() for p in calib_prompts.splitlines() if p.strip()]
    if len(prompts) > MAX_PROMPTS:
        raise ValueError(f"{len(prompts)} calibration prompts given; use at most {MAX_PROMPTS}.")
    if any(len(p) > MAX_PROMPT_CHARS for p in prompts):
        raise ValueError(f"A calibration prompt is longer than {MAX_PROMPT_CHARS} characters; split or shorten it.")
    md = _commands_markdown(title, out, lang)
    support = table(_support_table(model_id, lang), _support_headers(lang))
    if kv is None or kv.k.base != calibrate.SGLANG_BASE or kv.k.granularity != "tensor":
        return (md + "\n\n" + t("r_scales_fp8_only", lang), support, "", None,
                plots.empty_figure(t("f_scales_fp8_only", lang)))
    if not prompts:
        return (md + "\n\n" + t("r_scales_no_prompts", lang), support, "", None,
                plots.empty_figure(t("f_scales_no_prompts", lang)))
    model, tok = get_model(progress, name)
    progress(0.3, desc=t("p_calibrate", lang).format(n=len(prompts)))
    notes = ScaleNotes()  # the library warns when the prompts hold fewer than 64 tokens
    with notes.catching():
        scales = calibrate.calibrate_scales(model, tok, prompts)
    notes.toast()
    doc = calibrate.scales_to_json(scales, model_type=getattr(model.config, "model_type", None))
    text = json.dumps(doc, indent=2)
    path = Path(tempfile.mkdtemp(prefix="kvviz-scales-")) / "scales.json"
    path.write_text(text + "\n")
    fig = plots.layer_scales({"K (post-RoPE)": scales.k, "V": scales.v, "file (max of K, V)": scales.shared()},
                             t("f_scales", lang).format(n=len(prompts), model=name))
    md += "\n\n" + t("r_scales", lang).format(n=len(prompts), model=name) + notes.markdown()
    return md, support, text, str(path), fig


@user_errors
def check_scales(file, model=None):
    """Read an uploaded SGLang scale file and summarize it against `model`'s layers; a malformed one raises a clear
    message."""
    name = check_model(model)
    if file is None:
        raise ValueError("Upload a scale file (JSON) first.")
    path = upload_path(file, "The scale file")
    shape = model_shape(name)
    scales = calibrate.load_scales(path, num_layers=shape[0] if shape else None)
    shared = scales.shared()
    return (f"Valid SGLang scale file for {scales.num_layers} layers (matches `{name}`): scales from "
            f"{min(shared):.4g} to {max(shared):.4g}.")


def build(tr: Translator) -> dict:
    """Lay out the Export tab inside the current gr.Tab; returns its components by name."""
    c: dict = {}
    tr(gr.Markdown(t("export_intro")), value="export_intro")
    with gr.Row():
        with gr.Column(scale=1, min_width=280):
            c["spec"] = tr(gr.Dropdown(REGISTRY.choices("export"), value="fp8_e4m3", allow_custom_value=True,
                                       label=t("export_format"), elem_id=f"{TAB}-spec"), label="export_format")
            c["model_id"] = tr(gr.Textbox(DEFAULT_MODEL_ID, label=t("model_id")), label="model_id")
            c["model"] = model_input(tr)
            c["prompts"] = tr(gr.Textbox(DEFAULT_PROMPTS, lines=4, label=t("calib_prompts")), label="calib_prompts")
            c["run"] = tr(gr.Button(t("run"), variant="primary", elem_id=f"{TAB}-run"), value="run")
        with gr.Column(scale=2):
            c["commands"] = gr.Markdown(elem_id="export-commands", label="commands")
            c["table"] = tr(gr.Dataframe(headers=_support_headers(), label=t("support_table"), wrap=True),
                               label="support_table", headers=_support_headers)
    with gr.Row():
        with gr.Column(scale=1):
            c["scales_fig"] = gr.Plot(plots.empty_figure(), label="calibrated scales", show_label=False)
            c["file"] = gr.File(label="scales.json", interactive=False)
        with gr.Column(scale=1):
            c["json"] = tr(gr.Code(language="json", label=t("calib_file"), lines=12, max_lines=20),
                           label="calib_file")
    with gr.Row(equal_height=True):
        c["upload"] = tr(UploadFile(label=t("scale_upload"), file_types=[".json"], height=140), label="scale_upload")
        with gr.Column():
            c["check"] = tr(gr.Button(t("check"), elem_id=f"{TAB}-check"), value="check")
            c["check_out"] = gr.Markdown(label="scale file check")
    c["inputs"] = [c["spec"], c["model_id"], c["prompts"], c["model"], tr.language_input()]
    c["outputs"] = [c["commands"], c["table"], c["json"], c["file"], c["scales_fig"]]
    c["actions"] = {"run": (run, c["inputs"], c["outputs"], "model")}
    on_click(c["run"], run, c["inputs"], c["outputs"], "export")
    on_click(c["check"], check_scales, [c["upload"], c["model"]], [c["check_out"]], "check_scales",
             concurrency_id="check_scales", concurrency_limit=4)
    return c
