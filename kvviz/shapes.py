"""A model's shape without loading its weights, and which plans a loaded model can hold.

    known_shape("gemma-3-270m")               # (18, 1): layers, KV heads, from kvviz.memory's presets
    known_layer_kinds("tiny-llama")           # ["full_attention", ...] from the tiny model's config
    fit, skipped = fitting_plans(plans, model)
"""

from __future__ import annotations

import functools
from pathlib import Path

from kvviz import memory, tiny
from kvviz.cache import model_layer_types
from kvviz.formats import Plan
from kvviz.models import describe_model


@functools.lru_cache(maxsize=16)
def _tiny_shape(arch: str) -> tuple[int, int]:
    config = tiny.tiny_config(arch)
    return config.num_hidden_layers, config.num_key_value_heads


def known_shape(name: str, loaded=None, read_local: bool = False) -> tuple[int, int] | None:
    """(layers, kv_heads) of the model `name` when cheaply known, else None: `loaded` (the model itself, when
    resident) is described directly, tiny-<arch> from its config, the bundled models and other presets from
    kvviz.memory's presets, a local directory from its config.json when `read_local` (the caller trusts the path)."""
    if loaded is not None:
        d = describe_model(loaded)
        return d["layers"], d["kv_heads"]
    if name.startswith("tiny-"):
        return _tiny_shape(name.removeprefix("tiny-"))
    if name in memory.MODEL_PRESETS:
        p = memory.MODEL_PRESETS[name]
        return p.layers, p.kv_heads
    if read_local and (Path(name).expanduser() / "config.json").is_file():
        try:
            p = memory.resolve_model(str(Path(name).expanduser() / "config.json"))
            return p.layers, p.kv_heads
        except ValueError:
            return None
    return None


def known_layer_kinds(name: str, loaded=None) -> list[str] | None:
    """One layer type per decoder layer of `name` without loading its weights, when cheaply known (as known_shape
    knows it), else None: what Plan.resolve takes to apply an engine's layer rules (vLLM's TurboQuant keeps a dense
    model's first and last 2 layers in 16 bits, a hybrid's none)."""
    if loaded is not None:
        return model_layer_types(loaded.config)
    if name.startswith("tiny-"):
        return model_layer_types(tiny.tiny_config(name.removeprefix("tiny-")))
    if name in memory.MODEL_PRESETS:
        return [s.kind for s in memory.layer_shapes(memory.MODEL_PRESETS[name])]
    return None


def fitting_plans(plans: list[Plan], model) -> tuple[list[Plan], list[str]]:
    """(the plans this loaded model can hold, one "`name`: why not" line per other plan).

    A format with 32-value blocks cannot store a head_dim of 16 (the tiny test model): such formats are skipped
    with a note rather than failing the whole comparison. A plan naming a layer this model lacks raises
    (Plan.resolve); ValueError too when none fits.
    """
    head_dim = describe_model(model)["head_dim"]
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    fit, skipped = [], []
    for plan in plans:
        plan.resolve(n_layers)
        try:
            for fmt in (f for kv in plan.specs for f in (kv.k, kv.v)):
                fmt.nbytes_for((1, 1, 64, head_dim))  # [batch, kv_heads, tokens, head_dim]
            fit.append(plan)
        except ValueError as e:
            skipped.append(f"`{plan.name}`: {e}")
    if not fit:
        raise ValueError("None of the chosen formats fits this model: " + "; ".join(skipped))
    return fit, skipped
