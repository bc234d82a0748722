"""kvviz.formats.kv: a spec string -> its Format (one tensor) or its KVSpec (the K and V formats of a layer).

    get_format("int4/channel/g32/asym")     # one Format; ValueError listing the valid names
    parse_kv("k=int8,v=int4")                # KVSpec(k=Format('int8'), v=Format('int4'), ...)
    parse_kv("vllm:turboquant_k3v4_nc")      # an engine's value: the K and V storage of a layer it quantizes
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from . import engines
from .core import Format
from .family import REGISTRY
from .spec import parse_spec, split_pair


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


REGISTRY.on_change(get_format.cache_clear)  # a family registered (or a temporary registry undone): parse anew


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


def format_table(head_dims: tuple[int, int] = (128, 64)) -> str:
    """docs/formats.md's table of the bare bases, one row per base from its family (tests/test_format_family.py
    checks the page against it)."""
    rows = ["| base | elements | scale (default granularity) | bits/value at head_dim "
            f"{' / '.join(map(str, head_dims))} |", "|---|---|---|---|"]
    for name, info in REGISTRY.bases.items():
        if info.engine is not None:
            continue
        label = f"`{name}`" + (f" ({', '.join(f'`{a}`' for a in info.aliases)})" if info.aliases else "")
        bits = " / ".join(f"{get_format(name).bits_per_value(d):g}" for d in head_dims)
        rows.append(f"| {label} | {info.elements} | {info.scales} | {bits} |")
    return "\n".join(rows)
