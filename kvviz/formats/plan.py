"""`Plan`: what each decoder layer's KV cache stores, as one immutable value, and `as_plan`, the one function that
builds it from what a user gives (text, a KVSpec, a list of one spec per layer, or a Plan).

A plan is a default spec plus layer assignments; a uniform spec is a plan with only a default. Its text form, shared
by the UI, the CLI and the exporter, is the default followed by `;`-separated `LAYERS=SPEC` assignments:

    int4                         every layer int4
    int4; 0,27=fp16              int4, layers 0 and 27 in fp16 (Qwen2.5-7B's bias-driven outlier layers)
    k8v4; 0-3=fp16; 29=k=int8,v=int4   ranges with `-`; a K/V pair may be assigned to a layer
    0-14=int8; 15-29=int4        no default: every layer must then be named

    vllm:turboquant_4bit_nc; 5=fp16    an engine's dtype as the default (kvviz.formats.engines' names)
    int4; 5=llama.cpp:k=q8_0,v=q4_0    ... or assigned to layers

What text is a plan with layer assignments (`assigns_layers`), one rule: a `;`-part that holds `=` and whose left
side is neither `k` or `v` (those open a K/V pair spec, `k=int8,v=int4`) nor holds a `:` (an engine's name,
`llama.cpp:k=q8_0,v=q4_0`) names layers. So `int4; 0,27=fp16` assigns layers, `k=int8,v=int4`,
`llama.cpp:k=q8_0,v=q4_0` and `int4; int8` (two specs, as the app's typed lists read it) do not, and a typo such
as `int4; O=fp16` is reported as a bad layer index rather than an unknown format.

The layer indices meet the model in `resolve(num_layers, layer_types)`: an index the model lacks, or layers left
without a spec when there is no default, raise ValueError there. The engine's layer rules apply there too: a layer
given an engine dtype that the engine keeps in 16 bits on this model (vLLM's TurboQuant presets: the first and last
2 layers of a dense model, none on a hybrid; kvviz.formats.engines.engine_skip_layers) stores the engine's 16-bit
dtype instead (`vllm:auto`), so every cache and memory figure built from a resolved plan holds what the engine
holds. A plan built from a per-layer list may hold None entries: those layers are kept exact (as DynamicCache holds
them); only code builds such plans, and their text writes `exact`.

A plan may end in an eviction, `@ POLICY:KEEP[,OPTION=VALUE...]` (kvviz.formats.eviction): which of the context's
tokens every full-attention layer keeps (`int4 @ snapkv:0.5`, `fp16 @ streaming:0.25,sinks=4`, mixed precision
`int4 @ knorm:0.5,rest=int2`); it is part of the plan (`Plan.evict`), so it travels, compares and prints with it.

    plan = as_plan("int4; 0,27=fp16")      # parsed here, once; everything below takes the Plan
    plan.resolve(28)                        # (KVSpec x 28), checked against the model's layers
    plan.text                               # 'int4; 0,27=fp16' (the shortest form)
    as_plan("vllm:turboquant_4bit_nc").fitted(30).text   # 'vllm:turboquant_4bit_nc; 0-1,28-29=vllm:auto'
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from .engines import engine_skip_layers, skip_layer_spec
from .eviction import Eviction, parse_eviction
from .kv import KVSpec, parse_kv
from .spec import PRESETS

EXACT = "exact"  # how the text form writes a layer kept exact (a None entry); not parsed back


def spec_text(kv: KVSpec | None) -> str:
    """The string a plan writes for one layer's spec: a preset's name ("kivi2", "k8v4"), else the canonical spec."""
    if kv is None:
        return EXACT
    return kv.name if kv.name in PRESETS else kv.spec


def spec_key(kv: KVSpec | None) -> tuple | None:
    """What one layer stores, as a hashable key: a KVSpec's name is a label; its canonical spec and residual window
    decide. The one identity rule for specs in plans (Plan equality, shared cache rows, prefix trees)."""
    return None if kv is None else (kv.spec, kv.residual)


def assigns_layers(text: str) -> bool:
    """Whether plan text assigns layers ("int4; 0,27=fp16"): the rule in the module docstring."""
    return any(_names_layers(part) for part in text.split(";"))


def _names_layers(part: str) -> bool:
    lhs, sep, _ = part.partition("=")
    return bool(sep) and lhs.strip().lower() not in ("k", "v") and ":" not in lhs


@dataclass(frozen=True, eq=False)
class Plan:
    """What each layer stores: `default` (None: none, every layer must be assigned) and `layers`, the assignments
    ((layer, KVSpec | None), ...) in layer order, those equal to the default dropped. `num_layers`: the layer count
    a per-layer list fixed (None for text). `name`: the text as the user wrote it (a label, like KVSpec.name).
    `evict`: which context tokens full-attention layers keep (kvviz.formats.eviction), None: every token.

    Equal plans store the same thing: equality and hash go by spec_key, not by names or spelling."""

    default: KVSpec | None
    layers: tuple[tuple[int, KVSpec | None], ...] = ()
    num_layers: int | None = None
    name: str = ""
    evict: Eviction | None = None

    def __post_init__(self):
        kept = tuple(sorted((i, kv) for i, kv in dict(self.layers).items()
                            if self.default is None or spec_key(kv) != spec_key(self.default)))
        object.__setattr__(self, "layers", kept)
        if not self.name:
            object.__setattr__(self, "name", self.text)

    def _key(self) -> tuple:
        return (spec_key(self.default), tuple((i, spec_key(kv)) for i, kv in self.layers), self.num_layers,
                None if self.evict is None else self.evict.text)

    def __eq__(self, other) -> bool:
        return isinstance(other, Plan) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Plan({self.text!r})"

    @property
    def text(self) -> str:
        """The canonical text: the default, then one `LAYERS=SPEC` assignment per other spec, in layer order."""
        groups: dict[str, list[int]] = {}
        for i, kv in self.layers:
            groups.setdefault(spec_text(kv), []).append(i)
        parts = [] if self.default is None else [spec_text(self.default)]
        text = "; ".join(parts + [f"{_ranges(ids)}={s}" for s, ids in groups.items()])
        return text if self.evict is None else f"{text} @ {self.evict.text}"

    def with_eviction(self, evict: Eviction | str | None) -> Plan:
        """The same layers with another eviction (an Eviction, its text "snapkv:0.5", or None: keep every token)."""
        evict = parse_eviction(evict) if isinstance(evict, str) else evict
        return Plan(self.default, self.layers, self.num_layers, evict=evict)

    @property
    def is_uniform(self) -> bool:
        """True when every layer stores the default (a plan written as one spec)."""
        return self.default is not None and not self.layers

    @property
    def specs(self) -> tuple[KVSpec, ...]:
        """The distinct specs the plan stores (exact layers left out), default first."""
        kvs = {spec_key(kv): kv for kv in ([self.default] + [kv for _, kv in self.layers]) if kv is not None}
        return tuple(kvs.values())

    @property
    def takes_scale(self) -> bool:
        """True when a layer stores a format that fits or takes a scale for the whole cache (per-tensor or per-head
        static scales, nvfp4's global scale): a cache of this plan shared by several runs would share that scale."""
        return any(f.takes_scale for kv in self.specs for f in (kv.k, kv.v))

    def for_layer(self, i: int) -> KVSpec | None:
        """Layer i's spec (None: kept exact); ValueError when the plan gives that layer none."""
        assigned = dict(self.layers)
        if i in assigned:
            return assigned[i]
        if self.default is None:
            raise ValueError(f"Plan {self.name!r} gives no spec for layer {i}; start it with a default spec, "
                             f"e.g. 'int4; {self.name}'.")
        return self.default

    def resolve(self, num_layers: int, layer_types=None) -> tuple[KVSpec | None, ...]:
        """One spec per layer of a model with `num_layers` layers (None: kept exact), as the model stores it: a
        layer whose engine dtype the engine keeps in 16 bits on this model stores the engine's 16-bit dtype
        (the module docstring). layer_types: one string per layer (transformers' config.layer_types or
        kvviz.memory's layer kinds); None means every layer is attention (a dense model). ValueError, with what to
        write instead, for a layer the model lacks, layers left without a spec, or a per-layer list whose length
        is not num_layers."""
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}.")
        if layer_types is not None and len(layer_types) != num_layers:
            raise ValueError(f"layer_types lists {len(layer_types)} layers for a model of {num_layers}: give one "
                             f"type per layer (e.g. the config's layer_types), or None for a dense model.")
        if self.num_layers is not None and self.num_layers != num_layers:
            raise ValueError(f"The plan has {self.num_layers} entries for a model with {num_layers} layers: give "
                             f"one spec per layer, or a string such as 'int4; 0,{num_layers - 1}=fp16'.")
        beyond = [i for i, _ in self.layers if i >= num_layers]
        if beyond:
            raise ValueError(f"In plan {self.name!r}: layer {max(beyond)} does not exist; this model has layers "
                             f"0-{num_layers - 1}.")
        assigned = dict(self.layers)
        missing = [i for i in range(num_layers) if i not in assigned]
        if missing and self.default is None:
            raise ValueError(f"Plan {self.name!r} gives no spec for layers {_ranges(missing)}; start it with a "
                             f"default spec, e.g. 'int4; {self.name}'.")
        return _engine_rules([assigned.get(i, self.default) for i in range(num_layers)], layer_types)

    def fitted(self, num_layers: int, layer_types=None) -> Plan:
        """The plan as a model with `num_layers` layers (of `layer_types`, as resolve takes them) stores it, written
        the shortest way: plans that store the same thing in every layer of that model come out equal (a default
        and assignments, most common spec as the default)."""
        return _from_layers(self.resolve(num_layers, layer_types)).with_eviction(self.evict)


def _engine_rules(kvs: list, layer_types) -> tuple[KVSpec | None, ...]:
    """kvs with the engine's layer rules applied: each layer given an engine dtype that the engine keeps in 16 bits
    at that layer (engine_skip_layers) stores the engine's 16-bit dtype instead."""
    out = list(kvs)
    for kv in {spec_key(kv): kv for kv in kvs if kv is not None}.values():
        skip = engine_skip_layers(kv, len(kvs), layer_types)
        for i in skip:
            if out[i] is not None and spec_key(out[i]) == spec_key(kv):
                out[i] = parse_kv(skip_layer_spec(kv))
    return tuple(out)


def as_plan(value) -> Plan:
    """A Plan from plan text ("int4", "int4; 0,27=fp16"), a spec or KVSpec, a list of one spec (or KVSpec, or None:
    kept exact) per layer, or a Plan (returned as is). The only place text becomes a plan. ValueError, with what to
    write instead, for a malformed string or spec, a layer named twice, or an empty plan."""
    if isinstance(value, Plan):
        return value
    if isinstance(value, KVSpec):
        return Plan(value)
    if isinstance(value, str):
        return _from_text(value)
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("An empty plan: give one spec per layer, or a string such as 'int4; 0,27=fp16'.")
        return _from_layers([None if s is None else parse_kv(s) for s in value])
    raise ValueError(f"A plan is text such as 'int4; 0,27=fp16', a KV spec or a list of one spec per layer; got "
                     f"{type(value).__name__}.")


def as_plans(values, num_layers: int | None = None) -> list[Plan]:
    """as_plan of every entry of a list of specs or plans (a library function's `specs`), each checked against a
    model of `num_layers` layers when given (before any compute); ValueError for a bare string or an empty list."""
    if isinstance(values, str) or not isinstance(values, (list, tuple)) or not values:
        raise ValueError("specs must be a non-empty list of KV specs or plans, e.g. ['fp8_e4m3', 'int4; 0=fp16'].")
    plans = [as_plan(v) for v in values]
    if num_layers is not None:
        for plan in plans:
            plan.resolve(num_layers)
    return plans


def _from_layers(kvs) -> Plan:
    """Per-layer KVSpecs (None: exact) -> Plan with the most common spec as default (the first such layer's on a
    tie), every layer's count fixed."""
    keys = [spec_key(kv) for kv in kvs]
    counts = Counter(k for k in keys if k is not None)
    default = None
    if counts:
        best = max(counts, key=lambda k: (counts[k], -keys.index(k)))
        default = kvs[keys.index(best)]
    return Plan(default, tuple(enumerate(kvs)), num_layers=len(kvs))


def _from_text(text: str) -> Plan:
    """Plan text -> Plan (see the module docstring); layer indices are checked against a model by resolve()."""
    if not text.strip():
        raise ValueError("Empty plan: give one spec ('int4') or a default and layer assignments "
                         "('int4; 0,27=fp16').")
    layers_text, at, evict_text = text.partition("@")
    evict = None
    if at:
        if "@" in evict_text or ";" in evict_text:
            raise ValueError(f"Plan {text!r}: write one eviction, last, after the layers: e.g. "
                             f"'int4; 0=fp16 @ snapkv:0.5'.")
        evict = parse_eviction(evict_text)
        if not layers_text.strip():
            raise ValueError(f"Plan {text!r} names no format before '@': e.g. 'fp16 @ {evict.text}'.")
        return replace(_from_text(layers_text).with_eviction(evict), name=text.strip())
    default: KVSpec | None = None
    assigned: dict[int, KVSpec] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        if _names_layers(part):
            lhs, _, rhs = part.partition("=")
            kv = parse_kv(rhs)
            for i in _layer_list(lhs, f"In plan {text!r}"):
                if i in assigned:
                    raise ValueError(f"Plan {text!r} names layer {i} twice; give each layer one spec.")
                assigned[i] = kv
        elif default is not None:
            raise ValueError(f"Plan {text!r} has two defaults ({spec_text(default)!r} and {part!r}); give one "
                             f"default first, then LAYERS=SPEC assignments such as 0,27=fp16.")
        else:
            default = parse_kv(part)
    if default is None and not assigned:
        raise ValueError("Empty plan: give one spec ('int4') or a default and layer assignments "
                         "('int4; 0,27=fp16').")
    return Plan(default, tuple(assigned.items()), name=text.strip())


def _layer_list(text: str, where: str) -> list[int]:
    """"0,3-5, 27" -> [0, 3, 4, 5, 27]; ValueError for malformed or backwards ranges."""
    layers: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.strip().isdigit() or (sep and not hi.strip().isdigit()):
            raise ValueError(f"{where}: {part!r} is not a layer index or range; write layers as 0,27 or 0-3.")
        a, b = int(lo), int(hi) if sep else int(lo)
        if a > b:
            raise ValueError(f"{where}: the range {part!r} runs backwards; write it low-high, e.g. {b}-{a}.")
        layers.extend(range(a, b + 1))
    return layers


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    out, start = [], None
    for j, i in enumerate(layers):
        if start is None:
            start = i
        if j + 1 == len(layers) or layers[j + 1] != i + 1:
            out.append(str(start) if start == i else f"{start}-{i}")
            start = None
    return ",".join(out)


def parse_plan(text, num_layers: int) -> list[KVSpec]:
    """One spec per layer from plan text, a spec, a KVSpec or a per-layer list: as_plan(text).resolve(num_layers)."""
    return list(as_plan(text).resolve(num_layers))


def format_plan(plan) -> str:
    """The shortest text of a plan given as one spec per layer (or anything as_plan takes); parse_plan(format_plan(p),
    len(p)) gives p back."""
    return as_plan(plan).text
