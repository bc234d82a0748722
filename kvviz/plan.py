"""Per-layer mixed-precision KV plans: one K/V spec per decoder layer, their string form, and the search for the
cheapest plan within a KL budget.

A plan is a list of one spec per layer (`num_hidden_layers` entries). Its string form, shared by the UI, the CLI
and the exporter, is a default spec followed by `;`-separated layer assignments:

    int4                         every layer int4
    int4; 0,27=fp16              int4, layers 0 and 27 in fp16 (Qwen2.5-7B's bias-driven outlier layers)
    k8v4; 0-3=fp16; 29=k=int8,v=int8   ranges with `-`; a K/V pair may be assigned to a layer
    0-14=int8; 15-29=int4        no default: every layer must then be named

A layer named twice is an error, as is an index outside 0..num_layers-1 or a missing default with unnamed layers.
`format_plan` writes the shortest such string (the most common spec as the default).

    plan = parse_plan("int4; 0,27=fp16", 28)            # [KVSpec x 28]
    kvviz.QuantizedKVCache(model.config, plan)           # or the string itself
    kvviz.kv_cache_bytes_for(model.config, 4096, k=plan)  # the memory model counts plans
    best = search(model, tok, prompts, ["int4", "int8", "fp16"], kl_budget=0.01)   # see search()

kvviz.cache imports this module for parsing, so its module-level imports stay at the formats layer; search()
imports the analysis and quality layers when it runs.
"""

from __future__ import annotations

from collections import Counter

from kvviz.formats import PRESETS, KVSpec, parse_kv

def spec_text(kv: KVSpec) -> str:
    """The string a plan writes for one layer's spec: a preset's name ("kivi2", "k8v4"), else the canonical spec."""
    return kv.name if kv.name in PRESETS else kv.spec


def _layer_list(text: str, num_layers: int, where: str) -> list[int]:
    """"0,3-5, 27" -> [0, 3, 4, 5, 27]; ValueError for indices outside 0..num_layers-1 or malformed ranges."""
    layers: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.strip().isdigit() or (sep and not hi.strip().isdigit()):
            raise ValueError(f"{where}: {part!r} is not a layer index or range; write layers as 0,27 or 0-3.")
        a, b = int(lo), int(hi) if sep else int(lo)
        if a > b:
            raise ValueError(f"{where}: the range {part!r} runs backwards; write it low-high, e.g. {b}-{a}.")
        if b >= num_layers:
            raise ValueError(f"{where}: layer {b} does not exist; this model has layers 0-{num_layers - 1}.")
        layers.extend(range(a, b + 1))
    return layers


def parse_plan(text, num_layers: int) -> list[KVSpec]:
    """A plan string, one spec (every layer), a KVSpec, or a list of one spec per layer -> [KVSpec] * num_layers.

    Raises ValueError, with what to write instead, for a malformed string, a layer index out of range or named
    twice, a list of the wrong length, or layers left without a spec when there is no default.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}.")
    if isinstance(text, (list, tuple)):
        if len(text) != num_layers:
            raise ValueError(f"The plan has {len(text)} entries for a model with {num_layers} layers: give one "
                             f"spec per layer, or a string such as 'int4; 0,{num_layers - 1}=fp16'.")
        return [parse_kv(s) for s in text]
    if isinstance(text, KVSpec):
        return [text] * num_layers
    if not isinstance(text, str) or not text.strip():
        raise ValueError("Empty plan: give one spec ('int4') or a default and layer assignments "
                         "('int4; 0,27=fp16').")
    default: KVSpec | None = None
    assigned: dict[int, KVSpec] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        lhs, sep, rhs = part.partition("=")
        if sep and lhs.strip().lower() not in ("k", "v"):  # "k=..." opens a pair spec, anything else names layers
            kv = parse_kv(rhs)
            for i in _layer_list(lhs, num_layers, f"In plan {text!r}"):
                if i in assigned:
                    raise ValueError(f"Plan {text!r} names layer {i} twice; give each layer one spec.")
                assigned[i] = kv
        elif default is not None:
            raise ValueError(f"Plan {text!r} has two defaults ({spec_text(default)!r} and {part!r}); give one "
                             f"default first, then LAYERS=SPEC assignments such as 0,27=fp16.")
        else:
            default = parse_kv(part)
    missing = [i for i in range(num_layers) if i not in assigned]
    if missing and default is None:
        raise ValueError(f"Plan {text!r} gives no spec for layers {_ranges(missing)}; start it with a default "
                         f"spec, e.g. 'int4; {text}'.")
    return [assigned.get(i, default) for i in range(num_layers)]


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


def format_plan(plan) -> str:
    """The shortest plan string: the most common spec as the default (the first such layer's on a tie), then one
    `LAYERS=SPEC` assignment per other spec, in layer order. parse_plan(format_plan(p), len(p)) gives p back."""
    specs = [spec_text(parse_kv(s)) for s in plan]
    if not specs:
        raise ValueError("An empty plan has no string form; give one spec per layer.")
    counts = Counter(specs)
    default = max(counts, key=lambda s: (counts[s], -specs.index(s)))
    parts = [default]
    for s in dict.fromkeys(specs):  # first-appearance order
        if s != default:
            parts.append(f"{_ranges([i for i, x in enumerate(specs) if x == s])}={s}")
    return "; ".join(parts)


def is_uniform(plan) -> bool:
    """True when every layer has the same spec."""
    return len({spec_text(parse_kv(s)) for s in plan}) == 1
