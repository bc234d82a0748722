"""Decode speed of one cache on its own: the shared prefill's K/V copied in, then timed greedy steps.

The timed loop is what generation does after the prompt: model(next_token, cache=cache) per token, batch 1, with
the model's attention function (for kvviz's cache: the active backend, kvviz.attention.active_backend()).

    cache, dyn_logits = prefill(model, ids)                       # kvviz.quality.compare.prefill
    tps, cache, ids = timed_decode(model, dyn, "k8v4", first_token, 32)
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from kvviz.cache import QuantizedKVCache


def load_prefill(cache: Cache, prefilled: Cache) -> Cache:
    """Copy a prefilled batch-1 cache's K/V (e.g. a DynamicCache) into an empty cache, layer by layer, through
    its own update (which quantizes them, as its first update would). Returns `cache`."""
    for i, layer in enumerate(prefilled.layers):
        cache.update(layer.keys, layer.values, i)
    return cache


def make_cache(model, spec, scales: dict | None = None) -> Cache:
    """None -> DynamicCache; a spec string / KVSpec -> kvviz.QuantizedKVCache; a Cache instance is returned as is."""
    if spec is None:
        return DynamicCache(config=model.config)
    if isinstance(spec, Cache):
        return spec
    return QuantizedKVCache(model.config, spec, scales=scales)


@torch.no_grad()
def timed_decode(model, prefilled: Cache, spec, first_token: int, n_tokens: int, scales: dict | None = None,
                 warmup: int = 1):
    """Greedy-decode n_tokens after the prefill through a fresh cache (see make_cache), timing the steps after
    `warmup` untimed ones. Returns (tokens_per_s, cache, generated ids)."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be at least 1, got {n_tokens}.")
    cache = load_prefill(make_cache(model, spec, scales), prefilled)
    nxt = torch.tensor([[first_token]], device=model.device)  # [1, 1]
    out_ids = []
    start = None
    for step in range(warmup + n_tokens):
        if step == warmup:
            start = time.perf_counter()
        logits = model(input_ids=nxt, cache=cache, use_cache=True).logits[:, -1]
        nxt = logits.argmax(-1, keepdim=True)
        out_ids.append(int(nxt))
    seconds = time.perf_counter() - start
    return n_tokens / seconds, cache, out_ids


def decode_speed(model, prefilled: Cache, spec, first_token: int, n_tokens: int, scales: dict | None = None) -> float:
    """tokens/s of timed_decode."""
    return timed_decode(model, prefilled, spec, first_token, n_tokens, scales)[0]
