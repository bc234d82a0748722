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

import math
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


def _move_order(sens: dict[str, list[float]], costs: dict[str, list[int]], ladder: list[str],
                layers: list[int]) -> list[tuple[int, str, str]]:
    """The greedy path: moves (layer, from, to), each raising one layer one rung up the ladder (cheapest ->
    most precise), in order of the largest estimated KL reduction per byte added. sens[c][i]: the KL with only
    layer i in candidate c (the top rung counts as 0); costs[c][i]: layer i's bytes in c."""
    rung = {i: 0 for i in layers}
    moves = []
    while True:
        best, best_gain = None, -math.inf
        for i in layers:
            r = rung[i]
            if r + 1 >= len(ladder):
                continue
            lo, hi = ladder[r], ladder[r + 1]
            saved = sens[lo][i] - (sens[hi][i] if r + 1 < len(ladder) - 1 else 0.0)
            added = max(costs[hi][i] - costs[lo][i], 1)
            gain = saved / added
            if gain > best_gain:
                best, best_gain = (i, lo, hi), gain
        if best is None:
            return moves
        moves.append(best)
        rung[best[0]] += 1


def _given_sensitivity(sensitivity, ladder: list[str], n_layers: int) -> dict | None:
    """A previous search's sensitivities, checked against this ladder (None when not given)."""
    if sensitivity is None:
        return None
    want = ladder[:-1]
    if not isinstance(sensitivity, dict) or sorted(sensitivity) != sorted(want) or \
            any(len(sensitivity[c]) != n_layers for c in want):
        got = sorted(sensitivity) if isinstance(sensitivity, dict) else type(sensitivity).__name__
        raise ValueError(f"sensitivity must be a previous search's result['sensitivity'] for these candidates: "
                         f"{{candidate: [one KL per layer] x {n_layers}}} for {want}; got {got}. Leave it out to "
                         f"measure it.")
    return {c: [float(x) for x in sensitivity[c]] for c in want}


def search(model, tokenizer, prompts, candidates: list[str], kl_budget: float, max_tokens: int = 256,
           context: int = 4096, rows_per_pass: int | None = None, sensitivity: dict | None = None) -> dict:
    """The cheapest plan, in bytes, whose mean teacher-forced KL stays within `kl_budget` (nats), by a greedy,
    sensitivity-ordered climb:

    1. Order the candidates by the bytes a uniform plan of each holds at `context` tokens (the memory model's
       engine layout): the ladder, cheapest rung first. Ties keep the order given.
    2. For every rung but the top, measure each layer's sensitivity: the KL with only that layer (K and V) in
       that candidate, everything else exact (one batched run for all rungs, the exact row among them).
    3. Start with every layer on the cheapest rung. Repeatedly raise one layer one rung: the move with the
       largest estimated KL reduction (its sensitivity at the current rung minus at the next; the top counts as
       0) per byte added. This fixes a path of L x (rungs - 1) + 1 plans, from all-cheapest to all-top.
    4. Measure the KL of every plan on the path (one batched run, the exact log-probs of step 2 reused), and
       return the cheapest within the budget.

    Both runs go through kvviz.analysis.rows as prefix trees: plans that agree on their first layers share them.

    prompts: one text or a list (each cut to max_tokens tokens; the KL averages over all their positions).
    Returns {"plan": [spec per layer], "plan_text", "kl", "bytes", "bytes_fp16", "within_budget", "kl_budget",
    "candidates" (the ladder), "context", "sensitivity": {candidate: [L]}, "steps": [{"step", "move",
    "plan_text", "bytes", "kl", "within_budget"}] (bytes rise step by step: the trade-off curve), "seconds"}.
    When no plan on the path meets the budget, "within_budget" is False and the plan is the all-top one.
    sensitivity: a previous result's "sensitivity" for the same model, prompts, max_tokens and candidates, to
    skip step 2 (a new budget still measures the path; the path itself depends only on the sensitivities).
    """
    import time

    from kvviz.analysis.sensitivity import _prompt_ids, kv_layers, plans_kl
    from kvviz.memory import kv_cache_bytes_for

    t0 = time.perf_counter()
    if isinstance(candidates, str) or len(candidates) < 1:
        raise ValueError("candidates must be a list of one or more specs, e.g. ['int4', 'int8', 'fp16'].")
    if not (isinstance(kl_budget, (int, float)) and kl_budget >= 0):
        raise ValueError(f"kl_budget is a mean KL in nats (>= 0), e.g. 0.01; got {kl_budget!r}.")
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts:
        raise ValueError("Give at least one prompt to measure the KL on.")
    config = model.config
    n_layers = config.get_text_config(decoder=True).num_hidden_layers
    names = [spec_text(parse_kv(c)) for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError(f"The candidates {names} name the same spec twice; list each once.")
    from kvviz.cache import QuantizedKVCache

    for c in names:
        QuantizedKVCache(config, c)  # a candidate some layer cannot hold fails here, naming it, before any compute
    layers = kv_layers(model)

    def plan_bytes(plan: list[str]) -> int:
        return kv_cache_bytes_for(config, context, k=plan, layout="engine")

    uniform = {c: plan_bytes([c] * n_layers) for c in names}
    ladder = sorted(names, key=lambda c: uniform[c])  # stable: ties keep the given order
    # layer i's bytes in c, up to a constant per layer (only differences between rungs matter): layer i in c,
    # every other layer on the top rung
    costs = {c: [plan_bytes([c if j == i else ladder[-1] for j in range(n_layers)]) for i in range(n_layers)]
             for c in ladder}
    ids_list = [_prompt_ids(model, tokenizer, p, max_tokens) for p in prompts]
    bases: list = []  # the exact log-probs per prompt, measured once
    sens = _given_sensitivity(sensitivity, ladder, n_layers)
    if sens is None:
        variants = [[c if j == i else None for j in range(n_layers)] for c in ladder[:-1] for i in layers]
        kls = plans_kl(model, ids_list, variants, rows_per_pass, bases=bases)
        sens = {c: [math.nan] * n_layers for c in ladder[:-1]}
        for (c, i), kl in zip([(c, i) for c in ladder[:-1] for i in layers], kls):
            sens[c][i] = kl
    sens_for_order = {c: [0.0 if math.isnan(x) else x for x in v] for c, v in sens.items()}
    moves = _move_order(sens_for_order, costs, ladder, layers)
    path = [[ladder[0]] * n_layers]
    for i, _, hi in moves:
        nxt = list(path[-1])
        nxt[i] = hi
        path.append(nxt)
    kls = plans_kl(model, ids_list, path, rows_per_pass, bases=bases)
    steps = []
    for n, (plan, kl) in enumerate(zip(path, kls)):
        move = "start: every layer " + ladder[0] if n == 0 else f"layer {moves[n - 1][0]}: {moves[n - 1][1]} -> " \
                                                                 f"{moves[n - 1][2]}"
        steps.append({"step": n, "move": move, "plan_text": format_plan(plan), "bytes": plan_bytes(plan),
                      "kl": kl, "within_budget": kl <= kl_budget})
    ok = [s for s in steps if s["within_budget"]]
    best = min(ok, key=lambda s: (s["bytes"], s["kl"])) if ok else steps[-1]
    plan = path[best["step"]]
    return {"plan": plan, "plan_text": best["plan_text"], "kl": best["kl"], "bytes": best["bytes"],
            "bytes_fp16": plan_bytes(["fp16"] * n_layers), "within_budget": bool(ok), "kl_budget": kl_budget,
            "candidates": ladder, "context": context, "sensitivity": sens, "steps": steps,
            "seconds": time.perf_counter() - t0}
