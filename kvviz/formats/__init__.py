"""KV-cache formats: one place that names, builds and accounts for every storage format.

Spec strings are `BASE[/GRANULARITY][/gN][/asym][/rot][/SCALE]` (spec.py); a K/V pair is `k=SPEC,v=SPEC`, a single
spec means both, and presets (`k8v4`, `k4v8`, `kivi2`, `kivi4`) name common pairs. llama.cpp's KV cache types
(`q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `iq4_nl`, in `LLAMA_CPP_TYPES`) are bases too, bit-exact with ggml
(`ggml.py`, which documents their stored layout). `plan.py`'s Plan says what each decoder layer stores (a default
KVSpec and layer assignments, text "int4; 0,27=fp16"); `as_plan` is the one place text becomes a plan. The cache,
the kernels, the memory model, the exporter and the UI all take their formats from here. Each format family is one
module holding its behaviour (codec, packed layout, engine values, UI choices), registered in `family.REGISTRY`;
adding a family is one module and its tests (docs/formats.md, "Adding a format family").

An engine's own KV dtype is written with its engine: `vllm:turboquant_k3v4_nc`, `vllm:int4_per_token_head`,
`sglang:fp4_mx_block16`, `llama.cpp:q4_0`, `llama.cpp:k=q8_0,v=q4_0/norot` (the table: `engines.py`). Such a format
stores what the engine's store path stores (`vllm.py`, `turboquant.py`) and says which engine it models
(`Format.engine`, `Format.engine_rot`, `KVSpec.engine`). The TurboQuant paper's quantizers are kvviz formats
`tq_mse1`..`tq_mse4` and `tq_prod2`..`tq_prod4` (`tq_paper.py`).

    >>> import kvviz
    >>> kvviz.get_format("int4").bits_per_value(128)
    4.125
    >>> kvviz.parse_kv("k8v4").v.spec
    'int4'
"""

from __future__ import annotations

from . import families  # noqa: F401  (first: registers the built-in families the modules below read)
from . import engines
from .core import Format, QTensor
from .engines import ENGINE_NAMES, ENGINE_VALUES, EngineRef, engine_skip_layers
from .family import REGISTRY, BaseInfo, Family, Layout
from .floats import max_value
from .fp4 import e2m1_decode, e2m1_encode
from .kv import KVSpec, get_format, parse_kv
from .packing import hadamard, pack, rotate, unpack
from .eviction import POLICIES, Eviction, parse_eviction
from .plan import Plan, as_plan, as_plans, assigns_layers, format_plan, parse_plan, spec_key, spec_text
from .spec import (BASES, GRANULARITIES, KVVIZ_BASES, LLAMA_CPP_TYPES, PRESET_RESIDUAL, PRESETS, parse_spec,
                   split_pair, valid_names)

FORMAT_NAMES: tuple[str, ...] = KVVIZ_BASES  # the bare names (an engine's own rows are typed engine:value)


__all__ = [
    "BASES",
    "BaseInfo",
    "ENGINE_VALUES",
    "ENGINE_NAMES",
    "EngineRef",
    "FORMAT_NAMES",
    "Family",
    "GRANULARITIES",
    "LLAMA_CPP_TYPES",
    "PRESETS",
    "PRESET_RESIDUAL",
    "Eviction",
    "Format",
    "KVSpec",
    "Layout",
    "POLICIES",
    "Plan",
    "QTensor",
    "REGISTRY",
    "as_plan",
    "as_plans",
    "assigns_layers",
    "e2m1_decode",
    "e2m1_encode",
    "engine_skip_layers",
    "format_plan",
    "get_format",
    "hadamard",
    "max_value",
    "pack",
    "parse_kv",
    "parse_plan",
    "parse_spec",
    "rotate",
    "spec_key",
    "spec_text",
    "unpack",
    "valid_names",
]
