"""Spec strings: `BASE[/GRANULARITY][/gN][/asym][/rot][/SCALE]`, pairs `k=SPEC,v=SPEC`, presets.

This module only parses and validates; it reads the base formats' rules (which granularities each accepts, its
fixed block, whether it takes /asym or a scale source) from the family registry (`BASES`, family.py) and knows
nothing about how values are encoded.

    >>> parse_spec("int4/channel/g32/asym")
    SpecParts(base='int4', granularity='channel', group=32, asym=True, rot=False, scale=None)
    >>> parse_spec("fp8_e4m3/tensor/unit").canonical
    'fp8_e4m3/unit'

SCALE names where an FP8 per-tensor / per-head scale comes from (`SCALE_SOURCES`); without it, `first`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from .family import REGISTRY, BaseInfo, BasesView


GRANULARITIES = ("token", "channel", "tensor", "head")
STATIC_GRANULARITIES = ("tensor", "head")  # one scale fixed for every token (Format.static_scale)
ALIASES = {"fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "float16": "fp16", "bfloat16": "bf16"}
CHANNEL_GROUP = 32  # KIVI's group of tokens for per-channel scales
# Where an FP8 per-tensor / per-head scale comes from. kvviz's default is "first"; vLLM's and SGLang's is "unit".
SCALE_SOURCES: dict[str, str] = {
    "first": "fitted on the first update (the prefill), then fixed (kvviz's default; vLLM --calculate-kv-scales)",
    "unit": "1.0: vLLM's and SGLang's default when the checkpoint has no k_scale / v_scale and none is computed",
    "calibrated": "given: kvviz.calibrate's scales or an SGLang --quantization-param-path file (scales=)",
    "dynamic": "computed from the values at every write: what per-token FP8 does (fp8_e4m3/token = /token/dynamic)",
}
DEFAULT_SCALE_SOURCE = "first"


# Every base name -> its BaseInfo, a live view of the family registry (family.py): each family module declares
# its own bases (floats, ints, fp4, ggml, tq_paper; vLLM's store paths vllm, turboquant, ultraquant, ds_mla, reached
# only as vllm:<kv-cache-dtype> through engines.py, never bare).
BASES: Mapping[str, BaseInfo] = BasesView()


def kvviz_bases() -> tuple[str, ...]:
    """The bare base names a user types (every registered base but the engines' own rows)."""
    return tuple(name for name, info in BASES.items() if info.engine is None)


def llama_cpp_types() -> tuple[str, ...]:
    """llama.cpp's KV cache types (the bases of the family whose native engine it is)."""
    return tuple(name for f in REGISTRY.families() if f.native_engine == "llama.cpp" for name in f.bases)


LLAMA_CPP_TYPES = llama_cpp_types()
KVVIZ_BASES = kvviz_bases()  # the built-in ones; kvviz_bases() also lists families registered later

PRESETS: dict[str, str] = {
    "k8v4": "k=int8,v=int4",
    "k4v8": "k=int4,v=int8",
    "kivi2": "k=int2/channel/g32/asym,v=int2/token/g32/asym",
    "kivi4": "k=int4/channel/g32/asym,v=int4/token/g32/asym",
}
# KIVI keeps the most recent tokens in full precision; its presets carry that window.
PRESET_RESIDUAL: dict[str, int] = {"kivi2": 32, "kivi4": 32}

_GROUP = re.compile(r"^g(\d+)$")


NOROT = "/norot"  # llama.cpp:TYPE/norot: its read path with the rotation off (LLAMA_ATTN_ROT_DISABLE=1)


def llama_cpp_quantized(dtype: str) -> bool:
    """Whether a llama.cpp value ("q4_0", "k=q8_0,v=f16") quantizes either side (its rotation applies only then)."""
    types = [part.partition("=")[2] or part for part in dtype.split(",")]
    return any(t not in ("f16", "bf16") for t in types)


@dataclass(frozen=True)
class EngineRef:
    """Which engine value a format models. engine: one of ENGINE_NAMES; dtype: the engine's own value, as typed
    ("turboquant_k3v4_nc", "q4_0", "k=q8_0,v=q4_0"); side: "k" / "v" (the side of `dtype` this format stores);
    rotates: llama.cpp's Hadamard rotation of Q, K and V in its read path (on unless /norot; False elsewhere)."""

    engine: str
    dtype: str
    side: str
    rotates: bool = False

    @property
    def spec(self) -> str:
        """The engine-qualified name this side came from (both sides of one value share it)."""
        rot_off = self.engine == "llama.cpp" and not self.rotates and llama_cpp_quantized(self.dtype)
        return f"{self.engine}:{self.dtype}{NOROT if rot_off else ''}"


@dataclass(frozen=True)
class SpecParts:
    """A parsed single-tensor spec."""

    base: str
    granularity: str | None
    group: int | None
    asym: bool
    rot: bool
    scale: str | None = None  # "unit" or "calibrated" when the spec says so; None: the granularity's own rule
    engine: EngineRef | None = None  # set for an engine-qualified name (vllm:..., llama.cpp:...): engines.py

    @property
    def static_scale(self) -> bool:
        """One fp32 scale per tensor or per head, fixed for every token (not recomputed as tokens arrive)."""
        return self.granularity in STATIC_GRANULARITIES

    @property
    def scale_source(self) -> str | None:
        """Where an FP8 scale comes from: unit / calibrated when the spec says so, else first (per-tensor and
        per-head) or dynamic (per-token and per-channel); None for formats other than FP8."""
        if self.scale is not None:
            return self.scale
        if not BASES[self.base].scale_source or self.granularity is None:
            return None
        return DEFAULT_SCALE_SOURCE if self.static_scale else "dynamic"

    @property
    def canonical(self) -> str:
        """The shortest spec string naming this format (defaults left out); an engine's name for its formats."""
        if self.engine is not None:
            return self.engine.spec
        info = BASES[self.base]
        parts = [self.base]
        if self.granularity != info.default_granularity:
            parts.append(self.granularity)
        if self.group is not None and self.group != _default_group(info, self.granularity):
            parts.append(f"g{self.group}")
        if self.asym:
            parts.append("asym")
        if self.rot:
            parts.append("rot")
        if self.scale is not None:
            parts.append(self.scale)
        return "/".join(parts)


def _default_group(info: BaseInfo, granularity: str | None) -> int | None:
    if info.block is not None:
        return info.block
    if granularity == "channel":
        return CHANNEL_GROUP
    return None


def valid_names() -> str:
    """One sentence listing what a spec may contain, for error messages."""
    return (
        f"base formats: {', '.join(kvviz_bases())} (alias fp8 = fp8_e4m3); options: /{'|/'.join(GRANULARITIES)}, /gN, "
        f"/asym (int only), /rot, /{'|/'.join(SCALE_SOURCES)} (fp8 scale source); pairs: k=SPEC,v=SPEC; "
        f"presets: {', '.join(PRESETS)}"
    )


def parse_spec(spec: str) -> SpecParts:
    """Parse one spec string; ValueError with the valid names when it is not one."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"Empty KV format spec. Use one of the {valid_names()}.")
    fields = [f.strip().lower() for f in spec.strip().split("/")]
    base = ALIASES.get(fields[0], fields[0])
    if base not in BASES or BASES[base].engine is not None:
        raise ValueError(f"Unknown KV format {fields[0]!r} in {spec!r}. Valid {valid_names()}; an engine's own "
                         "dtype is written with its engine, e.g. vllm:int4_per_token_head or llama.cpp:q4_0.")
    info = BASES[base]
    granularity, group, asym, rot, scale = None, None, False, False, None
    for field in fields[1:]:
        match = _GROUP.match(field)
        if field in GRANULARITIES:
            if granularity is not None:
                raise ValueError(f"{spec!r} names two granularities; give at most one of {', '.join(GRANULARITIES)}.")
            granularity = field
        elif match:
            group = int(match.group(1))
            if group < 1:
                raise ValueError(f"Group size in {spec!r} must be a positive integer, like /g32.")
        elif field == "asym":
            asym = True
        elif field == "rot":
            rot = True
        elif field in SCALE_SOURCES:
            if scale is not None:
                raise ValueError(f"{spec!r} names two scale sources; give at most one of {', '.join(SCALE_SOURCES)}.")
            scale = field
        else:
            raise ValueError(f"Unknown option {field!r} in {spec!r}. Valid {valid_names()}.")
    if info.default_granularity is None and (granularity or group or asym):
        raise ValueError(f"{base} is a plain cast with no scales: drop the options from {spec!r} (only /rot applies).")
    granularity = granularity or info.default_granularity
    if granularity is not None and granularity not in info.granularities:
        raise ValueError(
            f"{base} takes only a per-token block scale; {spec!r} asks for {granularity!r}. Drop that option."
        )
    if asym and not info.asym:
        raise ValueError(f"/asym applies to int formats only, not {base} ({spec!r}).")
    if info.block is not None and group not in (None, info.block):
        raise ValueError(
            f"{base} uses a fixed block of {info.block} along head_dim; drop /g{group} ({info.block_hint})."
        )
    if group is not None and granularity in STATIC_GRANULARITIES:
        raise ValueError(f"/g{group} needs token or channel granularity, not {granularity!r} ({spec!r}).")
    if group is None:
        group = _default_group(info, granularity)
    if scale is not None:
        _check_scale_source(spec, base, info, granularity, scale)
        if scale in (DEFAULT_SCALE_SOURCE, "dynamic"):
            scale = None  # what the granularity does anyway: one Format, one canonical name
    return SpecParts(base, granularity, group, asym, rot, scale)


def _check_scale_source(spec: str, base: str, info: BaseInfo, granularity: str | None, scale: str) -> None:
    if not info.scale_source or info.default_granularity is None:
        raise ValueError(f"/{scale} names where an FP8 scale comes from; {base} has none ({spec!r}): drop it.")
    if scale == "dynamic" and granularity not in ("token", "channel"):
        raise ValueError(f"A {granularity} scale is fixed once written, so it cannot be dynamic ({spec!r}): an "
                         f"append-only cache cannot rescale what it holds. Use {base}/token (a scale computed per "
                         f"token at every write, what dynamic means here) or {base}/{granularity}/first.")
    if scale != "dynamic" and granularity not in STATIC_GRANULARITIES:
        raise ValueError(f"/{scale} applies to a per-tensor or per-head scale; {base}/{granularity} computes a scale "
                         f"per {granularity} at every write ({spec!r}): drop /{scale}, or write {base}/tensor/{scale}.")


def split_pair(spec: str) -> tuple[str, str, str, int]:
    """Split a pair spec, a single spec or a preset into (k_spec, v_spec, display name, residual window)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"Empty KV spec. Use a preset ({', '.join(PRESETS)}), one spec, or k=SPEC,v=SPEC.")
    text = spec.strip()
    key = text.lower()
    if key in PRESETS:
        k, v, _, _ = split_pair(PRESETS[key])
        return k, v, key, PRESET_RESIDUAL.get(key, 0)
    if "=" not in text:
        return text, text, text, 0
    sides: dict[str, str] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep or name not in ("k", "v") or name in sides or not value.strip():
            raise ValueError(f"Malformed pair spec {spec!r}: write it as k=SPEC,v=SPEC, e.g. k=int8,v=int4.")
        sides[name] = value.strip()
    if set(sides) != {"k", "v"}:
        raise ValueError(f"Pair spec {spec!r} must name both k= and v=, e.g. k=int8,v=int4.")
    return sides["k"], sides["v"], text, 0
