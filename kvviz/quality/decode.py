"""Running one cache on its own: the prompt through a DynamicCache once (`prefill`; prompts that share their first
tokens, once each: `prefill_shared`), its K/V copied into any other cache (`load_prefill`), and timed greedy decode
steps after it (`timed_decode`; a step at a time, each timed: `Decoding`, `step_times`). Compare,
perplexity, the needle, Equal bytes and the fused against unfused timings all start from here.

A prefill serves eviction plans too (kvviz.cache.eviction): the prompt attends to its own unquantized K/V whatever
the cache stores, so its K/V do not depend on the plan, and a plan's cache loaded from it compresses them on that
first update as it would holding the prompt itself. SnapKV scores the context by the prompt's last queries, which
only the attention function sees: `prefill(..., queries=window)` keeps them (`KeptCache.queries`) and
`load_prefill` hands them to the loading layer.

Two exact caches serve as speed baselines: DynamicCache (the default; a decode step appends with torch.cat, so it
copies every layer's whole history once per token) and StaticCache (`STATIC`: preallocated to the tokens the run
will hold, written in place; SDPA reads it under a mask of the rows filled so far), the best exact cache transformers
offers for eager decode.

The timed loop is what generation does after the prompt: model(next_token, cache=cache) per token, batch 1, with
the model's attention function (for kvviz's cache: the active backend, kvviz.attention.active_backend()).

    dyn, logits = prefill(model, ids)                                  # ids [1, T] -> DynamicCache, [1, vocab]
    tps, cache, out = timed_decode(model, dyn, "k8v4", int(logits.argmax()), 32)
"""

from __future__ import annotations

import contextlib
import time

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

from kvviz import attention
from kvviz.cache import QuantizedKVCache, evicting_layers
from kvviz.cache.layers import copy_states
from kvviz.rowstable import row_stable


@torch.no_grad()
def prefill(model, ids: torch.Tensor, queries: int = 0):
    """The prompt through a DynamicCache: (cache, last-position logits [batch, vocab]).

    Its sliding-window layers keep every token, as full layers do (the model's sliding mask still hides what the
    window has passed), so that a cache loaded from it (`load_prefill`, `RowStackCache.load_prefill`) gets the
    whole prompt and evicts by its own rule, as it would have holding the prompt itself.
    queries: keep the prompt's last `queries` queries of every layer an eviction compresses (for SnapKV's window,
    see `KeptCache`); 0: none.
    """
    cache = KeptCache(model.config, queries)
    out = model(input_ids=ids.to(model.device), cache=cache, use_cache=True, logits_to_keep=1)
    cache.window = 0  # the prompt's queries, not those of tokens read through the cache later
    return cache, out.logits[:, -1].float()


class KeptCache(DynamicCache):
    """The DynamicCache `prefill` fills: its sliding-window layers keep every token (see `prefill`), and with
    `window`, it keeps the last `window` queries of each layer an eviction compresses (kvviz.cache.evicting_layers)
    with the attention's scaling: `queries` {layer: (query [B, Hq, <= window, D], scaling)}. SnapKV scores the
    context by the prompt's last queries (kvviz.cache.eviction.snapkv_scores); `load_prefill` hands them over.

    Only the attention function sees the queries: update returns the layer's states wrapped in an
    attention.ObservedPrefill, whose `observe(query, scaling)` the "kvviz" attention function calls (as it does
    for a snapkv layer of QuantizedKVCache) and which returns the states unchanged, so the prompt computes exactly as
    through a plain DynamicCache. Set window to 0 to stop recording (`prefill` does, once the prompt is in).
    """

    def __init__(self, config, window: int = 0):
        super().__init__(config=config)
        self.layers = [DynamicLayer() if type(layer) is DynamicSlidingWindowLayer else layer for layer in self.layers]
        self.window = window
        self.recorded = frozenset(evicting_layers(config)) if window else frozenset()
        self.queries: dict[int, tuple[torch.Tensor, float]] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        if not self.window or layer_idx not in self.recorded:
            return keys, values
        return _Recorded(keys, self, layer_idx), _Recorded(values)

    def record(self, layer_idx: int, query: torch.Tensor, scaling: float) -> None:
        """Keep the last `window` of the queries held for layer_idx followed by `query` [B, Hq, q_len, D]."""
        held = self.queries.get(layer_idx)
        if held is not None:  # a prompt read in chunks
            query = torch.cat([held[0], query], dim=2)
        self.queries[layer_idx] = (query[:, :, -self.window:].clone(), scaling)  # a copy: not the whole query


class _Recorded(attention.ObservedPrefill):
    """A KeptCache layer's states, K or V, as update returns them while the cache records queries: observe hands the
    query to the cache (K's only) and returns the states, which attention then reads as it would have."""

    __slots__ = ("states", "cache", "layer_idx")

    def __init__(self, states: torch.Tensor, cache: KeptCache | None = None, layer_idx: int = -1):
        self.states, self.cache, self.layer_idx = states, cache, layer_idx

    def observe(self, query: torch.Tensor, scaling: float) -> torch.Tensor:
        if self.cache is not None:
            self.cache.record(self.layer_idx, query, scaling)
        return self.states


_MIN_FORK = 16  # tokens: a shared run shorter than this is computed by each prompt (one pass less per fork)


@torch.no_grad()
def prefill_shared(model, prompts: list[torch.Tensor]) -> Cache:
    """Several prompts (ids [1, T] each, one T) through one DynamicCache, each run of tokens that prompts share from
    their start computed once: K/V [len(prompts), kv_heads, T, head_dim] per layer, rows in the given order, as
    `prefill` of their batch holds them (every token kept).

    The prompts form a trie; each of its edges (the tokens from one fork to the next, or to the end; a run shared
    for fewer than _MIN_FORK tokens is not forked for) runs once, reading its parent edge's K/V as the cache it
    continues, and edges over the same positions run as one batch.
    Haystacks hiding a needle at several depths of one filler share the filler up to the shallowest needle: lesson 5's
    five depths of one filler run 1,760 of their 2,480 tokens. A prompt continued from a cache gets the K/V of a
    prefill in chunks, equal to one prefill's up to float32 rounding (the matrix products' shapes differ).
    Only for models whose every layer holds K/V (full or sliding attention): a linear-attention or Mamba state
    cannot be cut at a fork."""
    ids = torch.cat(prompts)  # [P, T]
    t = ids.shape[1]
    edges: list[tuple[int, int, int, int | None]] = []  # (start, end, a prompt it holds, parent edge)
    leaf = [0] * len(prompts)  # each prompt's last edge

    def split(rows: list[int], start: int, parent: int | None) -> None:
        same = (ids[rows, start:] == ids[rows[0], start:]).all(0)  # [T - start]: positions every row agrees on
        end = start + int(same.logical_not().int().argmax()) if not bool(same.all()) else t
        by_token: dict[int, list[int]] = {}
        for r in rows if end < t else ():
            by_token.setdefault(int(ids[r, end]), []).append(r)
        if end - start < _MIN_FORK and end < t:  # too short to be worth a pass of its own: each branch reruns it
            for group in by_token.values():
                split(group, start, parent)
            return
        edges.append((start, end, rows[0], parent))
        node = len(edges) - 1
        for r in rows if end == t else ():
            leaf[r] = node
        for group in by_token.values():
            split(group, end, node)

    split(list(range(len(prompts))), 0, None)
    held: dict[int, tuple[Cache, int]] = {}  # edge -> (the cache of its batch, its row there)
    spans: dict[tuple[int, int], list[int]] = {}
    for e, (start, end, _, _) in enumerate(edges):  # parents precede children; one batch per span
        spans.setdefault((start, end), []).append(e)
    pending = list(spans.items())
    while pending:
        ready = [(span, es) for span, es in pending if all(edges[e][3] is None or edges[e][3] in held for e in es)]
        assert ready, "an edge's parent is never computed"
        pending = [p for p in pending if p not in ready]
        for (start, end), es in ready:
            cache = KeptCache(model.config)
            if start:  # the parents' K/V up to the fork, one row per edge
                parents = [held[edges[e][3]] for e in es]
                for i, layer in enumerate(cache.layers):
                    assert isinstance(layer, DynamicLayer), f"layer {i} ({type(layer).__name__}) holds no K/V to fork"
                    layer.update(torch.cat([c.layers[i].keys[r : r + 1, :, :start] for c, r in parents]),
                                 torch.cat([c.layers[i].values[r : r + 1, :, :start] for c, r in parents]))
            batch = ids[[edges[e][2] for e in es], start:end].to(model.device)  # [edges, end - start]
            model(input_ids=batch, cache=cache, use_cache=True, logits_to_keep=1)
            held.update({e: (cache, r) for r, e in enumerate(es)})
    rows = [held[leaf[p]] for p in range(len(prompts))]
    if all(c is rows[0][0] for c, _ in rows) and [r for _, r in rows] == list(range(len(prompts))):
        return rows[0][0]  # one batch already in the prompts' order (nothing shared)
    out = KeptCache(model.config)
    for i, layer in enumerate(out.layers):
        layer.update(torch.cat([c.layers[i].keys[r : r + 1] for c, r in rows]),
                     torch.cat([c.layers[i].values[r : r + 1] for c, r in rows]))
    return out


def load_prefill(cache: Cache, prefilled: Cache, row: int | None = None) -> Cache:
    """Copy a prefilled cache's K/V (e.g. a DynamicCache; `row`: its batch row `row` only) into an empty cache,
    layer by layer, through its own update (which quantizes them, as its first update would), and its linear-attention
    / Mamba states as they are (from a batch-1 prefill). Returns `cache`.

    A layer that scores the context by its queries before storing it (an eviction under snapkv: update returns an
    attention.ObservedPrefill) gets the prompt's last queries kept by `prefill(..., queries=window)` (KeptCache),
    and stores what it would have after that prefill; ValueError when the prefill kept none."""
    pick = (lambda x: x) if row is None else (lambda x: x[row : row + 1])  # noqa: E731
    for i, layer in enumerate(prefilled.layers):
        if getattr(layer, "keys", None) is not None:  # attention (not a state layer, nor Gemma 4's shared KV)
            keys, _ = cache.update(pick(layer.keys), pick(layer.values), i)
            if isinstance(keys, attention.ObservedPrefill):
                held = getattr(prefilled, "queries", {}).get(i)
                if held is None:
                    raise ValueError(f"Layer {i} scores the context by the prompt's last queries (snapkv), which this "
                                     f"prefill did not keep: prefill with kvviz.quality.decode.prefill(model, ids, "
                                     f"queries=window) before loading it.")
                keys.observe(pick(held[0]), held[1])  # scores, compresses and stores (V's observe has nothing to add)
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            copy_states(layer, cache.layers[i])
    return cache


DYNAMIC, STATIC = "DynamicCache", "StaticCache"  # the exact caches' names as speed baselines (not KV formats)


def make_cache(model, spec, scales: dict | None = None, capacity: int | None = None) -> Cache:
    """None or DYNAMIC -> DynamicCache; STATIC -> StaticCache of `capacity` tokens; a spec string / KVSpec ->
    kvviz.QuantizedKVCache; a Cache instance is returned as is."""
    if spec is None or (isinstance(spec, str) and spec == DYNAMIC):
        return DynamicCache(config=model.config)
    if isinstance(spec, str) and spec == STATIC:
        if not capacity or capacity < 1:
            raise ValueError("A StaticCache is preallocated: give the tokens it must hold (capacity).")
        return StaticCache(config=model.config, max_cache_len=capacity)
    if isinstance(spec, Cache):
        return spec
    return QuantizedKVCache(model.config, spec, scales=scales)


class Decoding:
    """One cache's greedy decode after a shared prefill, a step at a time: a fresh cache (make_cache) loaded from
    the prefill, then `step()` per token (`ids`: the tokens it picked). backend: the attention backend its steps
    run under (kvviz.attention.use_backend; None: the active one). steps: the steps the run will take, which sizes
    a StaticCache (spec STATIC) to exactly the prompt plus them (a longer one makes SDPA read masked rows).
    `step_times` times its steps one by one (caches side by side); timed_decode times a run of them.

        run = Decoding(model, dyn, "int4", int(logits.argmax()))
        ids = [run.step() for _ in range(8)]
    """

    @torch.no_grad()
    def __init__(self, model, prefilled: Cache, spec, first_token: int, scales: dict | None = None,
                 backend: str | None = None, steps: int | None = None):
        self.model, self.backend = model, backend
        capacity = None if steps is None else prefilled.get_seq_length() + steps
        self.cache = load_prefill(make_cache(model, spec, scales, capacity), prefilled)
        self.next = torch.tensor([[first_token]], device=model.device)  # [1, 1]
        self.ids: list[int] = []

    @torch.no_grad()
    def step(self) -> int:
        """One token through the model and the cache; returns the id it picks (greedy). The linear layers run
        as a server runs them, inside a row-stable run too."""
        backend = attention.use_backend(self.backend) if self.backend else contextlib.nullcontext()
        with backend, row_stable(self.model, False):
            logits = self.model(input_ids=self.next, cache=self.cache, use_cache=True).logits[:, -1]
        self.next = logits.argmax(-1, keepdim=True)
        self.ids.append(int(self.next))
        return self.ids[-1]


WARMUP = 2  # untimed steps of a Decoding before step_times times any


def rotated(items: list, r: int) -> list:
    """Round r's order of the runs timed side by side: each round starts one run later than the one before."""
    return items[r % len(items):] + items[: r % len(items)]


def step_times(run: Decoding, steps: int, warmup: int = WARMUP) -> list[float]:
    """Seconds of each of `steps` consecutive decode steps of `run`, after `warmup` untimed ones.

    Side by side (`python -m kvviz bench --contexts`, lesson 7) every cache takes its steps alone, one cache after
    another in rounds, and a cache's speed is one over its median step: a burst of other work on a shared machine
    lands on a few steps and the median sets it aside. Alone, not in turn: DynamicCache's step replaces every
    layer's K/V with a new tensor (torch.cat), and with other caches' steps in between its median step at 4K was 2-8%
    slower than alone (five checks), the allocator's blocks taken by the others. The untimed steps absorb what the
    previous cache left (with one warm-up step, DynamicCache's first timed step at 4K once took 0.53 s and 46K page
    faults against 0.1 s and ~12 faults after) and a format's first-call kernel load."""
    for _ in range(warmup):
        run.step()
    seconds = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run.step()
        seconds.append(time.perf_counter() - t0)
    return seconds


@torch.no_grad()
def timed_decode(model, prefilled: Cache, spec, first_token: int, n_tokens: int, scales: dict | None = None,
                 warmup: int = 1, on_timed=lambda: None):
    """Greedy-decode n_tokens after the prefill through a fresh cache (see make_cache), timing the steps after
    `warmup` untimed ones (`on_timed()` is called when the timed steps begin). Returns (tokens_per_s, cache,
    generated ids)."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be at least 1, got {n_tokens}.")
    run = Decoding(model, prefilled, spec, first_token, scales)
    for _ in range(warmup):
        run.step()
    on_timed()
    start = time.perf_counter()
    for _ in range(n_tokens):
        run.step()
    seconds = time.perf_counter() - start
    return n_tokens / seconds, run.cache, run.ids


def decode_speed(model, prefilled: Cache, spec, first_token: int, n_tokens: int, scales: dict | None = None) -> float:
    """tokens/s of timed_decode."""
    return timed_decode(model, prefilled, spec, first_token, n_tokens, scales)[0]
