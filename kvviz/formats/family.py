"""Format families: each family is one module that holds its behaviour, and `REGISTRY` is the one place that lists them.

A family (`Family`) owns a set of base names (`BaseInfo`: the parse rules spec.py reads) and everything that
depends on them: its codec (encode / decode / scale fitting / byte accounting, a module such as `ints`), its packed
layout (`Layout`: what the kernels read), its engine values (the vLLM / SGLang / llama.cpp dtype that stores
the same thing, for the exporter), its doc rows (docs/formats.md's table) and its UI choices (`Choice`: spec
strings with the views that offer them). Nothing outside a family's module branches on its base names: the
parser, `Format`, the cache, the anatomy, the memory model, the exporter and the UI ask the registry.

    from kvviz.formats.family import REGISTRY, register
    REGISTRY.of_base("int4").name        # 'int'
    REGISTRY.choices("compare")          # the Compare tab's formats, in order
    with REGISTRY.temporary():           # tests: a registry that forgets what is registered inside it
        register(my_family)

Adding a family: one module with its codec, its `FAMILY = Family(...)`, a line in families.py, and its tests
(docs/formats.md, "Adding a format family").
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping

import torch

from .packing import hadamard

ENGINE_NAMES = ("vllm", "sglang", "llama.cpp")  # the engines kvviz models, in the order every view lists them
# vLLM's CPU build stores fp8 rounded toward zero, its CUDA and Triton stores round to nearest even (docs/engines.md,
# "vLLM's fp8 on the CPU"): `vllm:fp8_e4m3` is the GPU's store, `vllm:fp8_e4m3/cpu` the CPU build's.
VLLM_CPU = "/cpu"
VIEWS = ("compare", "errors", "export", "export_support", "fused", "memory", "sensitivity", "candidates", "rotation")
_LAST = 10**6  # a choice's rank in a view when its family gives none: after the others, in registration order


@dataclass(frozen=True)
class BaseInfo:
    """What a base format is to the parser: element bits, which scale layouts it accepts, and its parse rules."""

    kind: str  # the family's name (Format.kind)
    bits: int  # bits per stored element
    default_granularity: str | None  # None: a plain cast, no scale
    granularities: tuple[str, ...]  # accepted granularities
    block: int | None = None  # fixed block along head_dim (MX / NV FP4, llama.cpp); None: free
    zero: bool = False  # stores a per-block minimum by design (llama.cpp's q4_1, q5_1), without /asym
    engine: str | None = None  # the engine whose store path this is; reached only by its engine name (engines.py)
    asym: bool = False  # accepts /asym (the int formats)
    scale_source: bool = False  # its static scale has a source (/first, /unit, /calibrated, /dynamic): FP8
    global_scale: bool = False  # a cache fits one fp32 scale on its first states and passes it in (NVFP4)
    block_hint: str = ""  # what to use instead of another /gN (the fixed-block error's hint)
    aliases: tuple[str, ...] = ()  # other names a spec may use for it ("fp8" for fp8_e4m3)
    elements: str = ""  # docs/formats.md: how an element is stored
    scales: str = ""  # docs/formats.md: its scale (default granularity)


@dataclass(frozen=True)
class Layout:
    """How one side's packed buffers hold a format at one head_dim: everything a kernel reads, no name to branch
    on. Field names follow kernels.packed.PackedSide; docs/kernels.md ("What the kernels read of a format") lists
    what each field means to the kernels."""

    elem: str  # "float" (native load) | "int" (u - offset) | "fp8_e4m3" | "fp8_e5m2" | "e2m1" | "iq4_nl" | "table"
    bits: int  # bits per stored code
    storage: str = "kvviz"  # element order: "kvviz" or "ggml" (llama.cpp's blocks of 32)
    per_unit: int = 1  # codes per packing unit
    unit_bytes: int = 1  # bytes per packing unit (3 for 3-bit codes: 8 codes in a little-endian 24-bit word)
    offset: int = 0  # elem "int": value = u - offset
    scale_kind: str | None = None  # None | "token" | "channel" | "tensor" | "head"
    scale_dtype: str | None = None  # "fp16" | "fp32" | "e8m0" | "e4m3"
    group: int | None = None  # token: channels per scale; channel: tokens per scale row
    zero: bool = False  # a zero point beside each scale, same shape and dtype
    zp_bits: int = 0  # a zero point in the low bits of each fp32 token scale
    values: torch.Tensor | None = None  # fp32 [2**bits] lookup table (elem "table")
    renorm: bool = False  # each token's decoded codebook vector divided by its norm before the scale
    rotation: torch.Tensor | None = None  # fp32 [D, D]: x = dequantize(stored) @ rotation
    qjl: torch.Tensor | None = None  # fp32 [D, D]: TQ-prod's sketch of the residual (signs after the codes)
    global_scale: bool = False  # takes a per-tensor / per-head fp32 scale passed in (tensor_scale)
    packer: str | None = None  # the packer loop that writes it ("int_sym", "fp8", "nv", "engine:EN_INT8", ...)
    pack_table: torch.Tensor | None = None  # fp32 table an engine packer reads
    fp8_exp: int = 0  # exponent bits of an fp8 element
    fmax: float = 0.0  # largest finite value of an fp8 element
    ggml_type: str | None = None  # llama.cpp's type for storage "ggml"

    def kernel_fields(self) -> dict:
        """kernels.packed.PackedSide's keyword arguments beyond the buffers (data / scale / zero / tensor_scale)."""
        return dict(elem=self.elem, bits=self.bits, offset=self.offset,
                    scale_kind=self.scale_kind if self.scale_kind in ("token", "channel") else None,
                    group=self.group if self.scale_kind in ("token", "channel") else None, layout=self.storage,
                    values=self.values, renorm=self.renorm, zp_bits=self.zp_bits, qjl=self.qjl,
                    rotation=self.rotation)


@dataclass(frozen=True)
class Choice:
    """A spec string a view offers, and its rank in each view that offers it (lower first)."""

    spec: str
    views: Mapping[str, int]


def choice(spec: str, **views: int) -> Choice:
    """`choice("int4", compare=5, memory=3)`: the rank is the position in that view's list."""
    unknown = set(views) - set(VIEWS)
    assert not unknown, f"unknown views {sorted(unknown)}; the views are {VIEWS}"
    ranks = {view: _LAST if rank is True else rank for view, rank in views.items()}  # True: after the ranked ones
    return Choice(spec, MappingProxyType(ranks))


@dataclass(frozen=True)
class Family:
    """One format family: its bases and all their behaviour. Callables take the parsed `Format` first."""

    name: str  # Format.kind
    bases: Mapping[str, BaseInfo]  # the base names it owns, in the order docs and errors list them
    codec: Any  # encode(fmt, x, scale) -> QTensor fields; decode(fmt, q) -> fp32; optional fit_scale,
    #             token_head_bytes (fixed bytes per token and head), check_head_dim, given_scale
    layout: Callable[[Any, int], Layout] | None = None  # the packed layout at a head_dim; None: no kernel reads it
    scale_bytes: int = 0  # bytes of one stored per-group scale (and of one zero point)
    # (dtype or None, note) for an engine ("vllm", "sglang", "llama.cpp"); dtype None says why not
    engine_value: Callable[[Any, str], tuple[str | None, str]] = lambda fmt, engine: engine_default(fmt, engine)
    # the engines' own values this family stores: {"vllm" | "sglang": {value: (K storage spec, V storage spec)},
    # "llama.cpp": {-ctk / -ctv value: kvviz base}} (formats/engines.py reads them)
    engine_dtypes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    rotation_note: Callable[[Any, int], str] | None = None  # the anatomy's sentence for a codebook key's rotation
    choices: tuple[Choice, ...] = ()
    doc: str = ""  # one line: what the family is (docs/formats.md)
    native_engine: str | None = None  # the engine whose own storage types these are (llama.cpp's ggml blocks)
    extra: Mapping[str, Any] = field(default_factory=dict)  # anything a family's own tests want to carry


class Registry:
    """The format families kvviz knows, in registration order. kvviz/formats/families.py registers the built-in
    ones into REGISTRY as the package loads."""

    def __init__(self):
        self._families: dict[str, Family] = {}
        self._bases: dict[str, BaseInfo] = {}
        self._listeners: list[Callable[[], None]] = []

    def register(self, family: Family) -> Family:
        """Add a family; ValueError when its name or one of its bases is taken."""
        if family.name in self._families:
            raise ValueError(f"A format family named {family.name!r} is registered already; pick another name.")
        taken = sorted(set(family.bases) & set(self._bases))
        if taken:
            raise ValueError(f"Base names {taken} belong to another family already; a base has one family.")
        for name, info in family.bases.items():
            assert info.kind == family.name, f"{name}: BaseInfo.kind {info.kind!r} is not its family {family.name!r}"
        self._families[family.name] = family
        self._bases.update(family.bases)
        self._changed()
        return family

    def on_change(self, fn: Callable[[], None]) -> None:
        """Call fn (e.g. a cache's cache_clear) whenever the registry changes."""
        self._listeners.append(fn)

    def _changed(self) -> None:
        for fn in self._listeners:
            fn()

    @contextlib.contextmanager
    def temporary(self) -> Iterator["Registry"]:
        """A scope whose registrations are undone when it exits (tests register toy families in it)."""
        families, bases = dict(self._families), dict(self._bases)
        try:
            yield self
        finally:
            self._families, self._bases = families, bases
            self._changed()

    # -- queries -------------------------------------------------------------------------------------------------
    def families(self) -> tuple[Family, ...]:
        return tuple(self._families.values())

    def family(self, name: str) -> Family:
        return self._families[name]

    def of_base(self, base: str) -> Family:
        """The family a base name belongs to; KeyError when none does."""
        return self.family(self.bases[base].kind)

    @property
    def aliases(self) -> dict[str, str]:
        """Every alias -> its base name."""
        return {alias: name for name, info in self.bases.items() for alias in info.aliases}

    @property
    def bases(self) -> Mapping[str, BaseInfo]:
        """Every base name -> its BaseInfo (spec.BASES reads this)."""
        return self._bases

    def engine_dtypes(self, engine: str) -> dict:
        """An engine's values -> the storage they map to, over every family in registration order."""
        return {value: storage for f in self.families() for value, storage in f.engine_dtypes.get(engine, {}).items()}

    def choices(self, view: str) -> list[str]:
        """The spec strings a view offers, in its order (families' ranks; unranked ones last, in family order)."""
        assert view in VIEWS, f"unknown view {view!r}; the views are {VIEWS}"
        found = [(c.views[view], i, c.spec) for i, c in enumerate(c for f in self.families() for c in f.choices)
                 if view in c.views]
        return [spec for _, _, spec in sorted(found)]


REGISTRY = Registry()
register = REGISTRY.register


class BasesView(Mapping):
    """A live read-only view of the registry's bases: what `spec.BASES` is."""

    def __getitem__(self, name: str) -> BaseInfo:
        return REGISTRY.bases[name]

    def __iter__(self):
        return iter(REGISTRY.bases)

    def __len__(self) -> int:
        return len(REGISTRY.bases)

    def __repr__(self) -> str:
        return f"BasesView({list(REGISTRY.bases)})"


def units(bits: int) -> tuple[int, int]:
    """(codes per packing unit, bytes per unit) of the kvviz storage order for `bits`-bit codes."""
    if bits >= 8:
        return 1, bits // 8
    if bits in (3, 5, 6, 7):
        return 8, bits  # 8 codes in a little-endian word of `bits` bytes
    return 8 // bits, 1


def layout(elem: str, bits: int, **fields) -> Layout:
    """A Layout in the kvviz storage order, its packing unit derived from `bits`."""
    per_unit, unit_bytes = units(bits)
    return Layout(elem=elem, bits=bits, per_unit=per_unit, unit_bytes=unit_bytes, **fields)


def rotation_of(fmt, head_dim: int) -> torch.Tensor | None:
    """The /rot matrix a format's layout carries (x = stored @ H, H the normalized Hadamard), or None."""
    return hadamard(head_dim) if fmt.rot else None


def engine_default(fmt, engine: str) -> tuple[str | None, str]:
    """What an engine offers for a format no family value names: nothing, and why (the exporter's note)."""
    if engine == "vllm":
        if fmt.rot:
            return None, f"vLLM has no Hadamard-rotated {fmt.base} KV cache; drop /rot."
        return None, f"vLLM has no {fmt.base} KV cache dtype."
    if engine == "sglang":
        if fmt.rot:
            return None, "SGLang has no Hadamard-rotated KV cache; drop /rot."
        return None, f"SGLang has no integer KV cache dtype ({fmt.spec}); its options are FP8 and FP4."
    return None, (f"llama.cpp has no {fmt.base} KV cache type; its -ctk / -ctv take f32, f16, bf16, q8_0, q4_0, "
                  f"q4_1, iq4_nl, q5_0, q5_1.")
