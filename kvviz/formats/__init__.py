"""The KV-cache format registry: one place that names, builds and accounts for every storage format.

Spec strings are `BASE[/GRANULARITY][/gN][/asym][/rot]` (see `spec.py`); a K/V pair is `k=SPEC,v=SPEC`, a single
spec means both, and presets (`k8v4`, `k4v8`, `kivi2`, `kivi4`) name common pairs. llama.cpp's KV cache types
(`q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `iq4_nl`, in `LLAMA_CPP_TYPES`) are bases too, bit-exact with ggml
(`ggml.py`, which documents their stored layout). `plan.py`'s Plan says what each decoder layer stores (a default
KVSpec and layer assignments, text "int4; 0,27=fp16"); `as_plan` is the one place text becomes a plan. The cache,
the kernels, the memory model, the exporter and the UI all take their formats from here; adding a format is one
entry in `spec.BASES` plus its codec branch (and kernel branch).

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

import functools
from dataclasses import dataclass

from . import engines
from .core import Format, QTensor
from .engines import ENGINE_NAMES, ENGINES, EngineRef, engine_skip_layers
from .floats import max_value
from .fp4 import e2m1_decode, e2m1_encode
from .packing import hadamard, pack, rotate, unpack
from .spec import (BASES, GRANULARITIES, KVVIZ_BASES, LLAMA_CPP_TYPES, PRESET_RESIDUAL, PRESETS, parse_spec,
                   split_pair, valid_names)

FORMAT_NAMES: tuple[str, ...] = KVVIZ_BASES  # the bare names (an engine's own rows are typed engine:value)


@functools.lru_cache(maxsize=None)
def get_format(spec: str) -> Format:
    """Parse a single-tensor spec (e.g. "int4/channel/g32/asym", or an engine's value that stores K and V alike,
    e.g. "vllm:int4_per_token_head"); ValueError listing the valid names."""
    if isinstance(spec, str) and engines.is_engine_spec(spec):
        k, v = engines.engine_sides(spec)
        if Format(k).kind != Format(v).kind or k.base != v.base:
            raise ValueError(f"{spec} stores K and V differently, so it is a K/V pair, not one format: use "
                             f"kvviz.parse_kv({spec!r}), or k={k.engine.spec} to name its K side in a pair.")
        return Format(k)
    return Format(parse_spec(spec))


def _side_format(spec: str, side: str) -> Format:
    """One side of a pair: an engine value's K or V storage (k=vllm:turboquant_k3v4_nc is its K side)."""
    if engines.is_engine_spec(spec):
        return Format(engines.engine_sides(spec)[0 if side == "k" else 1])
    return get_format(spec)


@dataclass(frozen=True)
class KVSpec:
    """The formats of K and V, as one pair. `residual`: recent tokens a preset keeps in full precision."""

    k: Format
    v: Format
    name: str
    residual: int = 0

    @property
    def spec(self) -> str:
        """Canonical pair string: the single spec when K and V match, else k=...,v=..."""
        return self.k.spec if self.k.spec == self.v.spec else f"k={self.k.spec},v={self.v.spec}"

    @property
    def engine(self) -> str | None:
        """The engine both sides model (vllm | sglang | llama.cpp), or None (kvviz's own, or a mix)."""
        return self.k.engine if self.k.engine == self.v.engine else None

    def bits_per_value(self, head_dim: int) -> float:
        """Mean stored bits per K/V element (K and V hold the same number of elements)."""
        return (self.k.bits_per_value(head_dim) + self.v.bits_per_value(head_dim)) / 2


def parse_kv(spec: "str | KVSpec") -> KVSpec:
    """A pair "k=int8,v=int4", one spec for both ("fp8_e4m3"), a preset ("kivi2"), or an engine's value
    ("vllm:turboquant_k3v4_nc": the K and V formats of a layer the preset quantizes; "llama.cpp:k=q8_0,v=q4_0")
    -> KVSpec."""
    if isinstance(spec, KVSpec):
        return spec
    if isinstance(spec, str) and engines.is_engine_spec(spec):
        k, v = engines.engine_sides(spec)
        kv = KVSpec(Format(k), Format(v), "")
        return KVSpec(kv.k, kv.v, kv.spec)
    k, v, name, residual = split_pair(spec)
    return KVSpec(_side_format(k, "k"), _side_format(v, "v"), name, residual)


# plan.py builds on KVSpec and parse_kv above: imported once they exist
from .plan import Plan, as_plan, as_plans, assigns_layers, format_plan, parse_plan, spec_key, spec_text  # noqa: E402


__all__ = [
    "BASES",
    "ENGINES",
    "ENGINE_NAMES",
    "EngineRef",
    "FORMAT_NAMES",
    "GRANULARITIES",
    "LLAMA_CPP_TYPES",
    "PRESETS",
    "PRESET_RESIDUAL",
    "Format",
    "KVSpec",
    "Plan",
    "QTensor",
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
