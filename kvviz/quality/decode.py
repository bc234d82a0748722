"""Running one cache on its own: the prompt through a DynamicCache once (`prefill`), its K/V copied into any other
cache (`load_prefill`), and timed greedy decode steps after it (`timed_decode`). Compare, perplexity and the fused
against unfused timings all start from here.

The timed loop is what generation does after the prompt: model(next_token, cache=cache) per token, batch 1, with
the model's attention function (for kvviz's cache: the active backend, kvviz.attention.active_backend()).

    dyn, logits = prefill(model, ids)                                  # ids [1, T] -> DynamicCache, [1, vocab]
    tps, cache, out = timed_decode(model, dyn, "k8v4", int(logits.argmax()), 32)
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

from kvviz.cache import QuantizedKVCache
from kvviz.cache.layers import copy_states


@torch.no_grad()
def prefill(model, ids: torch.Tensor):
    """The prompt through a DynamicCache: (cache, last-position logits [1, vocab]).

    Its sliding-window layers keep every token, as full layers do (the model's sliding mask still hides what the
    window has passed), so that a cache loaded from it (`load_prefill`, `RowStackCache.load_prefill`) gets the
    whole prompt and evicts by its own rule, as it would have holding the prompt itself.
    """
    cache = DynamicCache(config=model.config)
    cache.layers = [DynamicLayer() if type(layer) is DynamicSlidingWindowLayer else layer for layer in cache.layers]
    out = model(input_ids=ids.to(model.device), cache=cache, use_cache=True, logits_to_keep=1)
    return cache, out.logits[:, -1].float()


def load_prefill(cache: Cache, prefilled: Cache) -> Cache:
    """Copy a prefilled batch-1 cache's K/V (e.g. a DynamicCache) into an empty cache, layer by layer, through
    its own update (which quantizes them, as its first update would), and its linear-attention / Mamba states as
    they are. Returns `cache`."""
    for i, layer in enumerate(prefilled.layers):
        if getattr(layer, "keys", None) is not None:  # attention (not a state layer, nor Gemma 4's shared KV)
            cache.update(layer.keys, layer.values, i)
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            copy_states(layer, cache.layers[i])
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
                 warmup: int = 1, on_timed=lambda: None):
    """Greedy-decode n_tokens after the prefill through a fresh cache (see make_cache), timing the steps after
    `warmup` untimed ones (`on_timed()` is called when the timed steps begin). Returns (tokens_per_s, cache,
    generated ids)."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be at least 1, got {n_tokens}.")
    cache = load_prefill(make_cache(model, spec, scales), prefilled)
    nxt = torch.tensor([[first_token]], device=model.device)  # [1, 1]
    out_ids = []
    start = None
    for step in range(warmup + n_tokens):
        if step == warmup:
            on_timed()
            start = time.perf_counter()
        logits = model(input_ids=nxt, cache=cache, use_cache=True).logits[:, -1]
        nxt = logits.argmax(-1, keepdim=True)
        out_ids.append(int(nxt))
    seconds = time.perf_counter() - start
    return n_tokens / seconds, cache, out_ids


def decode_speed(model, prefilled: Cache, spec, first_token: int, n_tokens: int, scales: dict | None = None) -> float:
    """tokens/s of timed_decode."""
    return timed_decode(model, prefilled, spec, first_token, n_tokens, scales)[0]
