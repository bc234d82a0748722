"""The KV-cache format registry: one place that names, builds and accounts for every storage format.

Spec strings are `BASE[/GRANULARITY][/gN][/asym][/rot]` (see `spec.py`); a K/V pair is `k=SPEC,v=SPEC`, a single
spec means both, and presets (`k8v4`, `k4v8`, `kivi2`, `kivi4`) name common pairs. llama.cpp's KV cache types
(`q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `iq4_nl`, in `LLAMA_CPP_TYPES`) are bases too, bit-exact with ggml
(`ggml.py`, which documents their stored layout). `plan.py`'s Plan says what each decoder layer stores (a default
KVSpec and layer assignments, text "int4; 0,27=fp16"); `as_plan` is the one place text becomes a plan. The cache,
the kernels, the memory model, the exporter and the UI all take their formats from here; adding a format is one
entry in `spec.BASES` plus its codec branch (and kernel branch).

    >>> import kvviz
    >>> kvviz.get_format("int4").bits_per_value(128)
    4.125
    >>> kvviz.parse_kv("k8v4").v.spec
    'int4'
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .core import Format, QTensor
from .floats import max_value
from .fp4 import e2m1_decode, e2m1_encode
from .packing import hadamard, pack, rotate, unpack
from .spec import BASES, GRANULARITIES, LLAMA_CPP_TYPES, PRESET_RESIDUAL, PRESETS, parse_spec, split_pair, valid_names

FORMAT_NAMES: tuple[str, ...] = tuple(BASES)


@functools.lru_cache(maxsize=None)
def get_format(spec: str) -> Format:
    """Parse a single-tensor spec (e.g. "int4/channel/g32/asym"); ValueError listing the valid names."""
    return Format(parse_spec(spec))


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
        return self.k.spec if self.k == self.v else f"k={self.k.spec},v={self.v.spec}"

    def bits_per_value(self, head_dim: int) -> float:
        """Mean stored bits per K/V element (K and V hold the same number of elements)."""
        return (self.k.bits_per_value(head_dim) + self.v.bits_per_value(head_dim)) / 2


def parse_kv(spec: "str | KVSpec") -> KVSpec:
    """A pair "k=int8,v=int4", one spec for both ("fp8_e4m3"), or a preset ("kivi2") -> KVSpec."""
    if isinstance(spec, KVSpec):
        return spec
    k, v, name, residual = split_pair(spec)
    return KVSpec(get_format(k), get_format(v), name, residual)


# plan.py builds on KVSpec and parse_kv above: imported once they exist
from .plan import Plan, as_plan, as_plans, assigns_layers, format_plan, parse_plan, spec_key, spec_text  # noqa: E402


__all__ = [
    "BASES",
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
