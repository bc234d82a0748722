"""kvviz.ui.picker: the model picker every model tab opens with, the layer and head sliders sized to the picked
model, and the page header that names the model, device and attention backend behind its numbers.

- `model_input(tr)`, `check_model(value)`, `get_model(progress, model)`: the picker's value is its endpoints'
  `model` argument; the model loads on first use with a progress bar and stays resident in the runtime's model pool
  (kvviz/ui/registry.py: which models are allowed; kvviz.runtime: the pool, LRU of KVVIZ_MAX_MODELS, one load per
  name). Models are read-only once loaded; every result a user sees is returned from their own call, so users
  never share results.
- `model_shape(model)`, `layer_head_inputs`, `follow_model`: the layer and head inputs fit the picked model's shape,
  known before loading where kvviz.shapes knows it.
"""

from __future__ import annotations

import gradio as gr
import torch

from kvviz import attention, runtime, shapes

from . import registry, zerogpu
from .i18n import lang_code, t

DEFAULT_MODEL = registry.DEFAULT_MODEL  # kvviz.models.DEFAULT_MODEL: the bundled SmolLM2-135M-Instruct


def model_name() -> str:
    """The default model: env KVVIZ_MODEL, else the bundled SmolLM2 (what a page selects when it opens)."""
    return registry.default_model()


def model_choices() -> list[str]:
    """The models a user may pick in the page, the served default (model_name()) first."""
    return registry.listed_models()


def check_model(value) -> str:
    """The picked model's name: one of model_choices() (or, with KVVIZ_ALLOW_ANY_MODEL=1, any hub id); None or ""
    means the default (ValueError otherwise)."""
    return registry.check_model(value)


def model_input(tr) -> gr.Dropdown:
    """The model picker every model tab opens with (its value is the `model` argument of the tab's endpoints).
    With KVVIZ_ALLOW_ANY_MODEL=1 it also takes a typed hub id; otherwise only the listed models exist."""
    free = registry.allow_any_model()
    return tr(gr.Dropdown(model_choices(), value=model_name(), label=t("model"), elem_classes=["kv-model"],
                          allow_custom_value=free, info=t("model_info_any") if free else None),
              label="model", **({"info": "model_info_any"} if free else {}))


def get_model(progress: gr.Progress | None = None, model: str | None = None):
    """(model, tokenizer) of the picked `model` (a check_model name; None: the default), loaded on first use.
    ValueError for a name that is not allowed, too large, or fails to load (the other models keep serving)."""
    loaded, tokenizer = registry.models_pool().get(check_model(model), progress, loader=registry.load)
    return zerogpu.to_device(loaded), tokenizer


def _resident(name: str):
    pair = registry.models_pool().peek(name)
    return None if pair is None else pair[0]


def model_shape(model: str | None = None) -> tuple[int, int] | None:
    """(layers, kv_heads) of `model` (None: the default) without loading its weights, when cheaply known; else None
    (kvviz.shapes.known_shape; a local directory only when it is one of the listed models)."""
    name = model_name() if model is None else model
    return shapes.known_shape(name, _resident(name), read_local=name in model_choices())


def model_layer_kinds(model: str) -> list[str] | None:
    """One layer type per decoder layer of `model` without loading its weights, when cheaply known, else None
    (kvviz.shapes.known_layer_kinds)."""
    return shapes.known_layer_kinds(model, _resident(model))


# 0.62: layer 18 of SmolLM2's 30, where post-RoPE K's outlier channels stand out most against V's.
DEFAULT_LAYER_FRACTION = 0.62


def layer_head_inputs(default_layer_fraction: float = DEFAULT_LAYER_FRACTION, model: str | None = None):
    """(layer, head) input components sized to `model` (None: the default): sliders when its shape is known, else
    numbers. layer_head_updates resizes them when the tab's model changes."""
    shape = model_shape(model)
    if shape is None:
        return (gr.Number(0, label="Layer", precision=0, minimum=0),
                gr.Number(0, label="KV head", precision=0, minimum=0))
    layer, head = _slider_ranges(shape, default_layer_fraction)
    return gr.Slider(**layer, step=1, label="Layer"), gr.Slider(**head, step=1, label="KV head")


def _slider_range(n: int, value: int) -> dict:
    """A 0..n-1 slider's settings. gradio refuses a slider whose minimum equals its maximum, so a model with one
    KV head (Gemma 3 270M) or one layer gets 0..1 held at 0 and locked (not interactive)."""
    return dict(minimum=0, maximum=max(1, n - 1), value=value, interactive=n > 1)


def _slider_ranges(shape: tuple[int, int], default_layer_fraction: float) -> tuple[dict, dict]:
    layers, heads = shape
    return _slider_range(layers, int(default_layer_fraction * (layers - 1))), _slider_range(heads, 0)


def layer_head_updates(model, default_layer_fraction: float = DEFAULT_LAYER_FRACTION):
    """(layer, head) updates that fit the sliders to the newly picked `model`'s shape; no change when its shape is
    not known before loading (the call then checks the range: check_layer_head)."""
    try:
        shape = model_shape(check_model(model))
    except ValueError:  # a half-typed hub id: nothing to resize to yet
        shape = None
    if shape is None:
        return gr.update(), gr.update()
    layer, head = _slider_ranges(shape, default_layer_fraction)
    return gr.update(**layer), gr.update(**head)


def follow_model(model: gr.Dropdown, layer, head, default_layer_fraction: float = DEFAULT_LAYER_FRACTION) -> None:
    """Resize a tab's layer and head inputs whenever its model picker changes."""
    model.change(lambda m: layer_head_updates(m, default_layer_fraction), model, [layer, head],
                 api_visibility="private", queue=False)


# --- the header ----------------------------------------------------------------------------------------------


def device_name() -> str:
    """The device computations run on: "cuda (NVIDIA ...)", "cpu", or ZeroGPU's lent GPU."""
    if zerogpu.active():
        return zerogpu.device_note()
    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return "cpu"


def warming() -> bool:
    """Whether a launch warm-up is running now (the page's header then refreshes itself until it ends)."""
    rt = runtime.current()
    with rt.warmup_lock:
        return "warming" in rt.warmups.values()


def backend_name(lang: str = "en") -> str:
    """The attention backend that decodes from the quantized cache: "triton", "cpu" or "torch" (on ZeroGPU:
    triton, which each call's lent GPU runs). Never compiles: before the CPU kernels have loaded, it says so (in
    `lang`)."""
    if zerogpu.active():
        return "triton"
    settled = attention.settled_backend()
    if settled is not None:
        return settled
    return t("hdr_backend_compiling" if warming() else "hdr_backend_first_use", lang)


def header_markdown(model: str | None = None, lang: str = "en") -> str:
    """One line: which model (the picked one; None: the default), device and attention backend produce the page's
    numbers, and which models are loaded now (switching to one of those is instant); in `lang` (the radio's choice
    or a code)."""
    lang = lang_code(lang)
    try:
        name = check_model(model)
    except ValueError:  # a half-typed hub id: the header keeps naming what the page would use
        name = model_name()
    rt = runtime.current()
    with rt.warmup_lock:
        warm = rt.warmups.get(name, "")
    pool = registry.models_pool()
    if warm == "warming":
        state = t("hdr_warming", lang)
    elif pool.peek(name) is not None:
        state = t("hdr_loaded", lang)
    elif warm.startswith("failed"):
        state = t("hdr_failed", lang).format(why=warm.removeprefix("failed: "))
    else:
        state = t("hdr_first_use", lang)
    others = [m for m in pool.resident() if m != name]
    also = t("hdr_also", lang).format(models=", ".join(f"`{m}`" for m in others)) if others else ""
    return t("hdr_line", lang).format(model=name, state=state, also=also, device=device_name(),
                                      backend=backend_name(lang))
