"""The KV-cache memory model: exact cache bytes for real model shapes, and what fits on real GPUs.

    bytes = 2 (K, V) x layers x batch x kv_heads x seq_len x head_dim x bits_per_value / 8  + static scales

Per-group scales and zero points are part of `bits_per_value` (from the format registry, `kvviz.formats`), so
the figure is what the cache really holds, not the element bits alone. Conventions:

- Static per-tensor / per-head scales (fp8's default, `/tensor`, `/head`) are calibrated once per layer and
  shared by every sequence, as vLLM's and SGLang's `k_scale` / `v_scale` are: counted once, not per sequence.
- `channel` granularity (KIVI) quantizes whole groups of `group` tokens only; the `seq_len % group` most recent
  tokens wait in a full-precision residual window, counted here as fp16.
- GPU capacities are the vendors' figures, read as decimal GB (1 GB = 10**9 bytes), as the vendors write them.
- Fitting on a GPU: the weights take `params x weight_bytes_per_param` (bf16: 2), and `reserve_fraction` of the
  memory (default 10%, as vLLM's `gpu_memory_utilization=0.9`) is left for activations, the CUDA context and
  fragmentation; the KV cache gets the rest. With `gpus` > 1 the model is sharded (tensor parallel) and the
  memory of all the GPUs adds up.

Seed check: a 70B-class model (80 layers, 8 KV heads, head_dim 128) at 32K tokens in fp16 holds
2 x 80 x 32768 x 8 x 128 x 2 = 10.74e9 bytes (10.7 GB) per sequence.

    >>> kv_cache_bytes(80, 8, 128, 32768, k="fp16")
    10737418240
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvviz.formats import Format, get_format, parse_kv

GB = 10**9  # decimal gigabyte: GPU vendors' unit, and the unit of every figure this module reports
_FP16_BYTES = 2  # residual-window tokens are held in fp16


@dataclass(frozen=True)
class ModelPreset:
    """A model's KV-cache shape and size, from its official config.json."""

    name: str
    layers: int  # num_hidden_layers
    kv_heads: int  # num_key_value_heads
    head_dim: int  # head_dim, else hidden_size / num_attention_heads
    q_heads: int  # num_attention_heads
    params: float  # parameter count, for the weights' bytes
    hidden: int  # hidden_size
    max_context: int | None  # max_position_embeddings (the trained window); None: unknown
    source: str = ""  # where the figures come from


@dataclass(frozen=True)
class GpuPreset:
    """A GPU's memory as its vendor states it, in decimal GB."""

    name: str
    memory_gb: float

    @property
    def bytes(self) -> int:
        return int(self.memory_gb * GB)


_MODELS = [
    ModelPreset("smollm2-135m", 30, 3, 64, 9, 134.5e6, 576, 8192,
                "HuggingFaceTB/SmolLM2-135M-Instruct config.json (kvviz's bundled default model)"),
    ModelPreset("llama-3.2-1b", 16, 8, 64, 32, 1.24e9, 2048, 131072, "meta-llama/Llama-3.2-1B config.json"),
    ModelPreset("llama-3.2-3b", 28, 8, 128, 24, 3.21e9, 3072, 131072, "meta-llama/Llama-3.2-3B config.json"),
    ModelPreset("llama-3.1-8b", 32, 8, 128, 32, 8.03e9, 4096, 131072, "meta-llama/Llama-3.1-8B config.json"),
    ModelPreset("llama-3.1-70b", 80, 8, 128, 64, 70.6e9, 8192, 131072, "meta-llama/Llama-3.1-70B config.json"),
    ModelPreset("qwen2.5-7b", 28, 4, 128, 28, 7.62e9, 3584, 32768,
                "Qwen/Qwen2.5-7B-Instruct config.json (131072 with YaRN rope scaling)"),
    ModelPreset("qwen2.5-72b", 80, 8, 128, 64, 72.7e9, 8192, 32768,
                "Qwen/Qwen2.5-72B-Instruct config.json (131072 with YaRN rope scaling)"),
    ModelPreset("mistral-7b-v0.3", 32, 8, 128, 32, 7.25e9, 4096, 32768, "mistralai/Mistral-7B-v0.3 config.json"),
    ModelPreset("gemma-2-9b", 42, 8, 256, 16, 9.24e9, 3584, 8192,
                "google/gemma-2-9b config.json (every layer counted in full; half use a 4096-token sliding window)"),
]
MODEL_PRESETS: dict[str, ModelPreset] = {m.name: m for m in _MODELS}

_GPUS = [
    GpuPreset("l4", 24), GpuPreset("a10g", 24), GpuPreset("rtx-4090", 24),
    GpuPreset("a100-40gb", 40), GpuPreset("a100-80gb", 80), GpuPreset("h100-80gb", 80),
    GpuPreset("h200", 141),
    GpuPreset("b200", 192),  # the B200 datasheet's figure; DGX B200 systems list 1,440 GB for 8 GPUs (180 each)
]
GPU_PRESETS: dict[str, GpuPreset] = {g.name: g for g in _GPUS}


def _lookup(table: dict, name, what: str):
    if not isinstance(name, str) or name.strip().lower() not in table:
        raise ValueError(f"Unknown {what} {name!r}. Choose one of: {', '.join(table)}.")
    return table[name.strip().lower()]


def get_model_preset(name: str | ModelPreset) -> ModelPreset:
    """The preset named `name` (case-insensitive); a ModelPreset passes through. ValueError lists the names."""
    return name if isinstance(name, ModelPreset) else _lookup(MODEL_PRESETS, name, "model preset")


def get_gpu_preset(name: str | GpuPreset) -> GpuPreset:
    """The GPU named `name` (case-insensitive, e.g. "h100-80gb"); a GpuPreset passes through."""
    return name if isinstance(name, GpuPreset) else _lookup(GPU_PRESETS, name, "GPU")


def _kv_formats(k, v):
    """(K Format, V Format) from one spec / pair / preset / KVSpec in `k`, or a K and a V spec."""
    if v is None:
        if isinstance(k, Format):
            return k, k
        kv = parse_kv(k)
        return kv.k, kv.v
    return (k if isinstance(k, Format) else get_format(k)), (v if isinstance(v, Format) else get_format(v))


def _preset_residual(k, v) -> int:
    """The full-precision window a preset or KVSpec in `k` carries (kivi2: 32); 0 for explicit formats."""
    return parse_kv(k).residual if v is None and not hasattr(k, "nbytes_for") else 0


def _check_count(value, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}.")
    return value


def _tensor_bytes(fmt, batch: int, kv_heads: int, head_dim: int, seq_len: int, residual: int = 0) -> int:
    """Bytes one layer's K (or V) cache holds in `fmt`: [batch, kv_heads, seq_len, head_dim].

    As kvviz.QuantizedKVCache stores it: the `residual` most recent tokens stay in full precision (fp16); older
    tokens are quantized, channel formats only in whole groups (the partial group waits in the fp16 tail too).
    """
    excess = max(seq_len - residual, 0)
    quantized_tokens = excess - excess % fmt.group if fmt.granularity == "channel" else excess
    tail = seq_len - quantized_tokens
    quantized = (batch, kv_heads, quantized_tokens, head_dim)
    # static scales are per layer (and head), shared by the batch: counted for one sequence only
    dynamic = fmt.nbytes_for(quantized) - fmt.static_bytes(quantized)
    static = fmt.static_bytes((1, kv_heads, seq_len, head_dim))
    return dynamic + static + batch * kv_heads * tail * head_dim * _FP16_BYTES


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, seq_len: int, batch: int = 1,
                   k="fp16", v=None, residual: int | None = None) -> int:
    """Exact bytes of a KV cache: K and V of every layer, each [batch, kv_heads, seq_len, head_dim].

    `k` is a format spec ("int4/channel/g32/asym"), a pair spec ("k=int8,v=int4"), a preset ("k8v4") or a
    KVSpec; with `v` given, `k` and `v` are the K and V format specs. Includes scales, zero points, static
    scales (once per layer) and the fp16 full-precision tail: the `residual` most recent tokens (None: the
    preset's window, e.g. 32 for kivi2; else 0) plus the partial group of `channel` formats.
    """
    for value, what in ((layers, "layers"), (kv_heads, "kv_heads"), (head_dim, "head_dim"), (batch, "batch")):
        _check_count(value, what, 1)
    _check_count(seq_len, "seq_len (context length in tokens)")
    k_fmt, v_fmt = _kv_formats(k, v)
    if residual is None:
        residual = _preset_residual(k, v)
    _check_count(residual, "residual (full-precision tokens)")
    per_layer = sum(_tensor_bytes(f, batch, kv_heads, head_dim, seq_len, residual) for f in (k_fmt, v_fmt))
    return layers * per_layer


def model_kv_bytes(model, seq_len: int, k="fp16", v=None, batch: int = 1) -> int:
    """kv_cache_bytes for a model preset (name or ModelPreset)."""
    m = get_model_preset(model)
    return kv_cache_bytes(m.layers, m.kv_heads, m.head_dim, seq_len, batch, k, v)


def kv_budget_bytes(model, gpu, gpus: int = 1, weight_bytes_per_param: float = 2,
                    reserve_fraction: float = 0.1) -> int:
    """Bytes left for the KV cache on `gpus` x `gpu` beside the weights and the reserve (may be negative)."""
    m, g = get_model_preset(model), get_gpu_preset(gpu)
    _check_count(gpus, "gpus", 1)
    if not 0 <= reserve_fraction < 1:
        raise ValueError(f"reserve_fraction must be in [0, 1), got {reserve_fraction!r}.")
    if not weight_bytes_per_param >= 0:
        raise ValueError(f"weight_bytes_per_param must be >= 0, got {weight_bytes_per_param!r}.")
    usable = gpus * g.bytes * (1 - reserve_fraction)
    return int(usable - m.params * weight_bytes_per_param)


def _largest(fits, step: int = 1) -> int:
    """Largest n >= 0 with fits(n) (0 when none), where fits(n) only fails from some n on among multiples of
    `step`, and no n past the first failing multiple fits (it may fail and hold again between two multiples)."""
    lo, hi = 0, 1  # invariant: fits(lo * step), not fits(hi * step), once hi is found
    while fits(hi * step):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * step) else (lo, mid)
    return max(n for n in range(lo * step, (lo + 1) * step) if n == lo * step or fits(n))


def max_context(model, gpu, k="fp16", v=None, batch: int = 1, gpus: int = 1, weight_bytes_per_param: float = 2,
                reserve_fraction: float = 0.1) -> int:
    """Longest context (tokens per sequence) whose KV cache for `batch` sequences fits beside the weights.

    Not capped at the model's trained window (`ModelPreset.max_context`): that is memory, not quality. 0 when
    the weights alone do not fit.
    """
    m = get_model_preset(model)
    budget = kv_budget_bytes(m, gpu, gpus, weight_bytes_per_param, reserve_fraction)
    k_fmt, v_fmt = _kv_formats(k, v)
    _check_count(batch, "batch", 1)
    # channel formats' bytes drop when a group fills (the fp16 residual turns into packed data): search on
    # whole groups of both K and V, then extend inside the next one.
    step = math.lcm(*[f.group for f in (k_fmt, v_fmt) if f.granularity == "channel"], 1)
    if budget <= 0:
        return 0
    residual = _preset_residual(k, v)
    return _largest(lambda t: kv_cache_bytes(m.layers, m.kv_heads, m.head_dim, t, batch, k_fmt, v_fmt, residual)
                    <= budget,
                    step)


def max_batch(model, gpu, context: int, k="fp16", v=None, gpus: int = 1, weight_bytes_per_param: float = 2,
              reserve_fraction: float = 0.1) -> int:
    """Largest number of sequences of `context` tokens whose KV cache fits beside the weights (0: none)."""
    m = get_model_preset(model)
    _check_count(context, "context (tokens)", 1)
    budget = kv_budget_bytes(m, gpu, gpus, weight_bytes_per_param, reserve_fraction)
    k_fmt, v_fmt = _kv_formats(k, v)
    if budget <= 0:
        return 0
    residual = _preset_residual(k, v)
    return _largest(lambda b: kv_cache_bytes(m.layers, m.kv_heads, m.head_dim, context, b, k_fmt, v_fmt, residual)
                    <= budget)


def split_formats(text: str) -> list[str]:
    """Split a comma-separated list of KV specs, keeping pair specs whole.

    >>> split_formats("fp16,k=int8,v=int4,mxfp4")
    ['fp16', 'k=int8,v=int4', 'mxfp4']
    """
    items: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part.lower().startswith("v=") and items and items[-1].lower().startswith("k=") and "," not in items[-1]:
            items[-1] = f"{items[-1]},{part}"
        elif part:
            items.append(part)
    return items


def memory_table(model, formats, context: int, gpu=None, batch: int = 1, gpus: int = 1,
                 weight_bytes_per_param: float = 2, reserve_fraction: float = 0.1) -> list[dict]:
    """One row (a plain dict) per KV format for `model`, `batch` sequences of `context` tokens: what the CLI
    and the UI show. `formats`: a list of specs, or one comma-separated string (see split_formats).

    Keys: format, k_bits, v_bits (bits per value, scales included), bytes and gb (the whole cache),
    tokens_vs_fp16 (how many times the tokens of fp16 fit in the same bytes), and with a `gpu`: max_context
    (longest context at `batch`), beyond_model_context (max_context > the model's trained window) and max_batch
    (largest batch at `context`); those three are None without a GPU.
    """
    m = get_model_preset(model)
    if isinstance(formats, str):
        formats = split_formats(formats)
    if not formats:
        raise ValueError("Give at least one KV format, e.g. fp16, fp8 or k8v4.")
    _check_count(context, "context (tokens)", 1)
    _check_count(batch, "batch", 1)
    fp16 = model_kv_bytes(m, context, "fp16", batch=batch)
    fit = dict(gpus=gpus, weight_bytes_per_param=weight_bytes_per_param, reserve_fraction=reserve_fraction)
    rows = []
    for spec in formats:
        k_fmt, v_fmt = _kv_formats(spec, None)
        nbytes = model_kv_bytes(m, context, k_fmt, v_fmt, batch=batch)
        row = {
            "format": spec if isinstance(spec, str) else getattr(spec, "name", str(spec)),
            "k_bits": k_fmt.bits_per_value(m.head_dim),
            "v_bits": v_fmt.bits_per_value(m.head_dim),
            "bytes": nbytes,
            "gb": nbytes / GB,
            "tokens_vs_fp16": fp16 / nbytes,
            "max_context": None,
            "beyond_model_context": None,
            "max_batch": None,
        }
        if gpu is not None:
            longest = max_context(m, gpu, k_fmt, v_fmt, batch=batch, **fit)
            row["max_context"] = longest
            row["beyond_model_context"] = m.max_context is not None and longest > m.max_context
            row["max_batch"] = max_batch(m, gpu, context, k_fmt, v_fmt, **fit)
        rows.append(row)
    return rows
