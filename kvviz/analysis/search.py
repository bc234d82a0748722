"""The plan search: the cheapest per-layer plan, in bytes, whose mean teacher-forced KL stays within a budget, by a
greedy, sensitivity-ordered climb over a ladder of candidate specs (see `search`). It measures with
kvviz.analysis.sensitivity (one batched run per step kind) and counts bytes with kvviz.memory.

    res = search(model, tok, prompts, ["int4", "int8", "fp16"], kl_budget=0.01)
    res.plan.text, res.chosen.kl, res.chosen.bytes      # the plan found; res.steps: the whole path
    for res in search_stream(model, tok, prompts, ["int4", "fp16"], 0.01):   # the path's KL pass by pass
        show(res.steps, res.complete)
    python -m kvviz plan --candidates int4,int8,fp16 --kl-budget 0.02
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterator

from kvviz.analysis.sensitivity import _prompt_ids, kv_layers, plans_kl
from kvviz.cache import QuantizedKVCache, model_layer_types
from kvviz.formats import Plan, as_plan, spec_text
from kvviz.memory import kv_cache_bytes_for


@dataclass(frozen=True)
class SearchStep:
    """One plan on the search's path: `move` says which layer rose to which rung (step 0: every layer on the
    cheapest), `raised` the same as data, (layer, from, to), None at step 0; bytes at the search's context (the
    memory model's engine layout); kl: mean KL in nats per token."""

    step: int
    move: str
    plan: Plan
    bytes: int
    kl: float
    within_budget: bool
    raised: tuple[int, str, str] | None = None


@dataclass(frozen=True)
class SearchResult:
    """The search's outcome. chosen: the cheapest step within the budget (the all-top one when none is); steps: the
    path, bytes rising step by step (the trade-off curve); ladder: the candidates, cheapest first; sensitivity:
    {candidate: [KL per layer]} for every rung but the top (NaN: a layer without K/V), to pass back to a search
    with a new budget; bytes_fp16: an all-fp16 cache at `context` tokens; seconds: wall time. path_length: the
    plans on the whole path; a result of search_stream before its last pass holds the first of them only
    (`complete` False), and `chosen` is the cheapest within budget so far."""

    chosen: SearchStep
    steps: tuple[SearchStep, ...]
    within_budget: bool
    kl_budget: float
    ladder: tuple[str, ...]
    context: int
    bytes_fp16: int
    sensitivity: dict
    seconds: float
    path_length: int

    @property
    def plan(self) -> Plan:
        return self.chosen.plan

    @property
    def complete(self) -> bool:
        """Whether every plan on the path is measured."""
        return len(self.steps) == self.path_length


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
        raise ValueError(f"sensitivity must be a previous search's result.sensitivity for these candidates: "
                         f"{{candidate: [one KL per layer] x {n_layers}}} for {want}; got {got}. Leave it out to "
                         f"measure it.")
    return {c: [float(x) for x in sensitivity[c]] for c in want}


def search(model, tokenizer, prompts, candidates: list[str], kl_budget: float, max_tokens: int = 256,
           context: int = 4096, rows_per_pass: int | None = None, sensitivity: dict | None = None) -> SearchResult:
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
       return the cheapest within the budget. The bytes rise along the path, so that is the first step within
       it, up to ties in bytes (search_stream measures the path in passes and yields after each).

    Both runs go through kvviz.analysis.teacher_forced as prefix trees: plans that agree on their first layers
    share them.

    prompts: one text or a list (each cut to max_tokens tokens; the KL averages over all their positions).
    candidates: single specs or presets (a KVSpec or its text), not plans; engine dtypes too ("vllm:fp8",
    "vllm:turboquant_3bit_nc"): a plan of one vLLM dtype and fp16 layers is what vLLM serves with
    --kv-cache-dtype-skip-layers (kvviz.export.export_plan).
    Returns a SearchResult; when no plan on the path meets the budget, its within_budget is False and the chosen
    step is the all-top one.
    sensitivity: a previous result's `sensitivity` for the same model, prompts, max_tokens and candidates, to
    skip step 2 (a new budget still measures the path; the path itself depends only on the sensitivities).
    """
    last = None
    for last in search_stream(model, tokenizer, prompts, candidates, kl_budget, max_tokens, context, rows_per_pass,
                              sensitivity, first_pass=0):
        pass
    assert last is not None and last.complete, "search_stream ended before the whole path was measured"
    return last


def search_stream(model, tokenizer, prompts, candidates: list[str], kl_budget: float, max_tokens: int = 256,
                  context: int = 4096, rows_per_pass: int | None = None, sensitivity: dict | None = None,
                  first_pass: int = 8) -> Iterator[SearchResult]:
    """`search`, yielding as the path's KL comes in: step 4 runs in passes, the first `first_pass` plans of the
    path, then twice as many as the pass before, and a SearchResult follows each pass (its steps: the path so far;
    the last one `complete`). first_pass=0: the whole path in one pass. A plan's KL does not depend on the pass it
    runs in (its rows are row-stable, kvviz.rowstable): the passes cost only their shared layers again, about one
    row per layer and pass. The plan found is known once a pass reaches a step within the budget."""
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
    plans = [as_plan(c) for c in candidates]
    multi = next((p for p in plans if not p.is_uniform), None)
    if multi is not None:
        raise ValueError(f"Candidates are single specs; {multi.name!r} is a per-layer plan. The search builds "
                         f"plans from candidates such as int4 and fp16.")
    kvs = {spec_text(p.default): p.default for p in plans}
    names = [spec_text(p.default) for p in plans]
    if len(kvs) != len(names):
        raise ValueError(f"The candidates {names} name the same spec twice; list each once.")
    for p in plans:
        QuantizedKVCache(config, p)  # a candidate some layer cannot hold fails here, naming it, before any compute
    layers = kv_layers(model)

    def plan_bytes(plan: Plan) -> int:
        return kv_cache_bytes_for(config, context, k=plan, layout="engine")

    types = model_layer_types(config)

    def per_layer(names_by_layer: list) -> Plan:
        # as the model stores it: an engine dtype's layer rules applied (vLLM's TurboQuant boundary layers in 16 bits)
        return as_plan([None if c is None else kvs[c] for c in names_by_layer]).fitted(n_layers, types)

    uniform = {c: plan_bytes(as_plan(kvs[c])) for c in names}
    ladder = sorted(names, key=lambda c: uniform[c])  # stable: ties keep the given order
    # layer i's bytes in c, up to a constant per layer (only differences between rungs matter): layer i in c,
    # every other layer on the top rung
    costs = {c: [plan_bytes(per_layer([c if j == i else ladder[-1] for j in range(n_layers)]))
                 for i in range(n_layers)] for c in ladder}
    ids_list = [_prompt_ids(model, tokenizer, p, max_tokens) for p in prompts]
    bases: list = []  # the exact model per prompt (kvviz.metrics.Baseline), measured once for both passes
    sens = _given_sensitivity(sensitivity, ladder, n_layers)
    if sens is None:
        variants = [per_layer([c if j == i else None for j in range(n_layers)]) for c in ladder[:-1] for i in layers]
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
    path_plans = [per_layer(p) for p in path]
    bytes_fp16 = plan_bytes(as_plan("fp16"))
    steps: list[SearchStep] = []
    size = first_pass or len(path_plans)
    while len(steps) < len(path_plans):
        done = len(steps)
        todo = path_plans[done : done + size]
        for n, (plan, kl) in enumerate(zip(todo, plans_kl(model, ids_list, todo, rows_per_pass, bases=bases)), done):
            raised = None if n == 0 else moves[n - 1]
            move = f"start: every layer {ladder[0]}" if raised is None else "layer {}: {} -> {}".format(*raised)
            steps.append(SearchStep(n, move, plan, plan_bytes(plan), kl, kl <= kl_budget, raised))
        size *= 2
        ok = [s for s in steps if s.within_budget]
        chosen = min(ok, key=lambda s: (s.bytes, s.kl)) if ok else steps[-1]
        yield SearchResult(chosen, tuple(steps), bool(ok), kl_budget, tuple(ladder), context, bytes_fp16, sens,
                           time.perf_counter() - t0, len(path_plans))
