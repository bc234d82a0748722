"""What fits on a GPU: the longest context and the largest batch per format, with the weights counted.

The weights take `params x weight_bytes_per_param` (bf16: 2), and `reserve_fraction` of the memory (default 10%,
as vLLM's `gpu_memory_utilization=0.9`) is left for activations, the CUDA context and fragmentation; the cache
gets the rest. With `gpus` > 1 the model is sharded (tensor parallel) and the memory of all the GPUs adds up.
Recurrent layers' fixed state (state_bytes_for) is charged per sequence beside the K/V.
GPU capacities are the vendors' figures, read as decimal GB (1 GB = 10**9 bytes), as the vendors write them.
"""

from __future__ import annotations

import math

from kvviz.formats import POLICIES, Plan, as_plan

from .bytes import CacheModel, _check_count, _kv_formats, state_bytes_for
from .configs import config_dict
from .presets import GB, MODEL_PRESETS, ModelPreset, get_gpu_preset

_EVICT_OPTIONS = {*(o for opts in POLICIES.values() for o in opts), "rest"}
CONTEXT_CAP = 1 << 40  # tokens: the answer for a model whose cache stops growing (every layer slides or recurs)


def resolve_model(model, params: float | None = None) -> ModelPreset:
    """A ModelPreset for anything kvviz.memory accepts; `params` (parameter count) overrides the preset's."""
    if isinstance(model, ModelPreset):
        m = model
    elif isinstance(model, str) and model.strip().lower() in MODEL_PRESETS:
        m = MODEL_PRESETS[model.strip().lower()]
    else:
        name, cfg = config_dict(model)
        m = ModelPreset(name, cfg, None, "config")
    if params is not None:
        if isinstance(params, bool) or not isinstance(params, (int, float)) or not params >= 0:
            raise ValueError(f"params must be a parameter count >= 0, got {params!r}.")
        m = ModelPreset(m.name, m.config, float(params), m.source)
    return m


def model_kv_bytes(model, seq_len: int, k="fp16", v=None, batch: int = 1, layout: str = "engine") -> int:
    """kv_cache_bytes_for a model (preset name, ModelPreset or any config)."""
    return CacheModel(resolve_model(model), k, v, layout).bytes(seq_len, batch)


def kv_budget_bytes(model, gpu, gpus: int = 1, weight_bytes_per_param: float = 2,
                    reserve_fraction: float = 0.1) -> int:
    """Bytes left for the cache on `gpus` x `gpu` beside the weights and the reserve (may be negative)."""
    m, g = resolve_model(model), get_gpu_preset(gpu)
    _check_count(gpus, "gpus", 1)
    if not 0 <= reserve_fraction < 1:
        raise ValueError(f"reserve_fraction must be in [0, 1), got {reserve_fraction!r}.")
    if not weight_bytes_per_param >= 0:
        raise ValueError(f"weight_bytes_per_param must be >= 0, got {weight_bytes_per_param!r}.")
    if m.params is None:
        raise ValueError(f"The parameter count of {m.name!r} is unknown (a config.json does not state it): give "
                         "params (in the CLI --params, in billions) to count the weights.")
    usable = gpus * g.bytes * (1 - reserve_fraction)
    return int(usable - m.params * weight_bytes_per_param)


def _largest(fits, step: int = 1, cap: int = CONTEXT_CAP) -> int:
    """Largest n in [0, cap] with fits(n) (0 when none), where fits(n) only fails from some n on among multiples of
    `step`, and no n past the first failing multiple fits (it may fail and hold again between two multiples)."""
    ok = lambda n: n <= cap and fits(n)  # noqa: E731
    lo, hi = 0, 1  # invariant: ok(lo * step), not ok(hi * step), once hi is found
    while ok(hi * step):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid * step) else (lo, mid)
    return max(n for n in range(lo * step, (lo + 1) * step) if n == lo * step or ok(n))


def _channel_step(k, v) -> int:
    """Channel formats' bytes drop when a group fills: search on whole groups of K and V, then inside one."""
    if isinstance(k, (Plan, list, tuple)):  # a per-layer plan
        fmts = [f for kv in as_plan(k).specs for f in (kv.k, kv.v)]
    else:
        fmts = _kv_formats(k, v)
    return math.lcm(*[f.group for f in fmts if f.granularity == "channel"], 1)


def max_context(model, gpu, k="fp16", v=None, batch: int = 1, gpus: int = 1, weight_bytes_per_param: float = 2,
                reserve_fraction: float = 0.1, layout: str = "engine") -> int:
    """Longest context (tokens per sequence) whose cache for `batch` sequences fits beside the weights.

    Not capped at the model's trained window (`max_position_embeddings`): that is memory, not quality. 0 when
    the weights alone do not fit; CONTEXT_CAP when the cache stops growing (all layers slide or recur).
    """
    m = resolve_model(model)
    budget = kv_budget_bytes(m, gpu, gpus, weight_bytes_per_param, reserve_fraction)
    _check_count(batch, "batch", 1)
    cache = CacheModel(m, k, v, layout)
    budget -= state_bytes_for(m, batch, layout if layout == "transformers" else "engine")
    if budget <= 0:
        return 0
    return _largest(lambda t: cache.bytes(t, batch) <= budget, _channel_step(k, v))


def max_batch(model, gpu, context: int, k="fp16", v=None, gpus: int = 1, weight_bytes_per_param: float = 2,
              reserve_fraction: float = 0.1, layout: str = "engine") -> int:
    """Largest number of sequences of `context` tokens whose cache (K/V and recurrent state) fits (0: none)."""
    m = resolve_model(model)
    _check_count(context, "context (tokens)", 1)
    budget = kv_budget_bytes(m, gpu, gpus, weight_bytes_per_param, reserve_fraction)
    cache = CacheModel(m, k, v, layout)
    state = state_bytes_for(m, 1, layout if layout == "transformers" else "engine")
    if budget <= 0:
        return 0
    return _largest(lambda b: b == 0 or cache.bytes(context, b) + b * state <= budget)


def split_formats(text: str) -> list[str]:
    """Split a comma-separated list of KV specs, keeping pair specs whole (an engine's pair name too).

    An eviction's options stay with it: "int4 @ snapkv:0.5,window=16,fp16" is two entries.

    >>> split_formats("fp16,k=int8,v=int4,mxfp4,llama.cpp:k=q8_0,v=q4_0")
    ['fp16', 'k=int8,v=int4', 'mxfp4', 'llama.cpp:k=q8_0,v=q4_0']
    """
    items: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        opens = items and (items[-1].lower().startswith("k=") or ":k=" in items[-1].lower())
        if items and "@" in items[-1] and part.partition("=")[0].strip() in _EVICT_OPTIONS:
            items[-1] = f"{items[-1]},{part}"
        elif part.lower().startswith("v=") and opens and "," not in items[-1]:
            items[-1] = f"{items[-1]},{part}"
        elif part:
            items.append(part)
    return items


def _bits(cache: CacheModel, k_fmt, v_fmt) -> tuple[float | None, float | None]:
    """Bits per value of K and V at the first layer that caches each (MLA engine layout has no V: None)."""
    k_dim = next((s.k_dim for s in cache.shapes if s.k_heads), None)
    v_dim = next((s.v_dim for s in cache.shapes if s.v_heads), None)
    return (k_fmt.bits_per_value(k_dim) if k_dim else None, v_fmt.bits_per_value(v_dim) if v_dim else None)


def _plan_bits(cache: CacheModel) -> tuple[float | None, float | None]:
    """Bits per value of K and V averaged over every value a plan's layers hold (None: no layer holds that side)."""
    sums = {"k": [0.0, 0], "v": [0.0, 0]}
    for (_, _, k_heads, k_dim, v_heads, v_dim, (k_fmt, v_fmt, _)), count in cache.groups.items():
        for side, values, dim, fmt in (("k", k_heads * k_dim, k_dim, k_fmt), ("v", v_heads * v_dim, v_dim, v_fmt)):
            if values:
                sums[side][0] += count * values * fmt.bits_per_value(dim)
                sums[side][1] += count * values
    return tuple(bits / n if n else None for bits, n in sums.values())


def memory_table(model, formats, context: int, gpu=None, batch: int = 1, gpus: int = 1,
                 weight_bytes_per_param: float = 2, reserve_fraction: float = 0.1,
                 layout: str = "engine") -> list[dict]:
    """One row (a plain dict) per KV format for `model`, `batch` sequences of `context` tokens: what the CLI
    and the UI show. `formats`: a list of specs (an entry may be a per-layer plan: a kvviz.Plan, or a list of one
    spec per layer), or one comma-separated string (see split_formats).

    Keys: format, k_bits, v_bits (bits per value, scales included; None where the layout has no V), bytes and gb
    (the K/V cache), state_bytes (recurrent layers' fixed state), tokens_vs_fp16 (how many times the tokens of
    fp16 fit in the same bytes; None for a model without K/V), and with a `gpu`: max_context (longest context at
    `batch`), beyond_model_context (max_context > the model's trained window) and max_batch (largest batch at
    `context`); those three are None without a GPU.
    """
    m = resolve_model(model)
    if isinstance(formats, str):
        formats = split_formats(formats)
    if not formats:
        raise ValueError("Give at least one KV format, e.g. fp16, fp8 or k8v4.")
    formats = [as_plan(f) for f in formats]  # each entry parsed here, once
    _check_count(context, "context (tokens)", 1)
    _check_count(batch, "batch", 1)
    fp16 = CacheModel(m, "fp16", None, layout).bytes(context, batch)
    state = state_bytes_for(m, batch, layout if layout == "transformers" else "engine")
    fit = dict(gpus=gpus, weight_bytes_per_param=weight_bytes_per_param, reserve_fraction=reserve_fraction,
               layout=layout)
    rows = []
    for spec in formats:
        cache = CacheModel(m, spec, None, layout)
        nbytes = cache.bytes(context, batch)
        if cache.uniform:
            k_bits, v_bits = _bits(cache, *cache.formats[0][:2])
        else:  # a per-layer plan (or an engine's 16-bit layers): each side's bits averaged over the values held
            k_bits, v_bits = _plan_bits(cache)
        row = {
            "format": spec.name,
            "k_bits": k_bits, "v_bits": v_bits,
            "bytes": nbytes, "gb": nbytes / GB, "state_bytes": state,
            "tokens_vs_fp16": fp16 / nbytes if nbytes else None,
            "max_context": None, "beyond_model_context": None, "max_batch": None,
        }
        if gpu is not None:
            longest = max_context(m, gpu, spec, batch=batch, **fit)
            row["max_context"] = longest
            row["beyond_model_context"] = m.max_context is not None and longest > m.max_context
            row["max_batch"] = max_batch(m, gpu, context, spec, **fit)
        rows.append(row)
    return rows


def fit_keep(config, plan, budget_bytes: int, context: int, batch: int = 1, layout: str = "transformers") -> float:
    """The largest keep ratio at which `plan`'s cache of `batch` sequences of `context` tokens takes at most
    `budget_bytes` (kept tokens x the format's bytes + scales, + the rest format's for mixed precision): k / context
    for the largest kept count k that fits, 1.0 when every token fits. `plan`: plan text or a Plan, with an eviction
    (its policy and options are kept, its ratio replaced) or without (then `streaming`). ValueError, saying what
    to change, when even one token per head does not fit.

        fit_keep("SmolLM2-135M", "fp16 @ snapkv:1", budget_bytes=kv_cache_bytes_for(cfg, 1024, k="fp16") // 4,
                 context=1024)   # 0.25
    """
    plan = as_plan(plan)
    if plan.evict is None:
        plan = plan.with_eviction("streaming:1")
    _check_count(context, "context (tokens)", 1)
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)) or budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be a positive number of bytes, got {budget_bytes!r}.")
    cache = CacheModel(config, plan, None, layout)
    evict = plan.evict

    def fits(kept: int) -> bool:
        cache.evict = evict.with_keep(kept / context)
        return cache.bytes(context, batch) <= budget_bytes

    if not fits(1):
        need = cache.bytes(context, batch)
        raise ValueError(f"No keep ratio of {plan.with_eviction(None).text!r} @ {evict.policy} fits "
                         f"{budget_bytes:,.0f} bytes at {context} tokens: even one token per head takes {need:,} "
                         f"bytes (with what the policy does not drop: sliding layers' windows, a rest format). Raise "
                         f"the budget, or pick a smaller format.")
    lo, hi = 1, context  # fits(lo); find the largest kept count that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo / context
