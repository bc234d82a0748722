"""Exact K/V cache bytes, layer by layer, for any model; and the fixed state of recurrent layers.

    bytes of one layer = K: tokens x k_heads x k_dim  +  V: tokens x v_heads x v_dim, each x batch x bits / 8
                         + scales (static ones once per layer)

where `tokens` is what the layer holds at the context (LayerShape.tokens: the context for full attention, at most
the window for sliding and chunked layers, nothing for recurrent, shared and MLP-only layers). Per-group scales and
zero points are part of the format's bits (kvviz.formats), so the figure is what the cache really holds:

- Static per-tensor / per-head scales (fp8's default, `/tensor`, `/head`) are calibrated once per layer and shared
  by every sequence, as vLLM's and SGLang's `k_scale` / `v_scale` are: counted once, not per sequence.
- `channel` granularity (KIVI) quantizes whole groups of `group` tokens only; the partial group and the
  `residual` most recent tokens wait in a full-precision window, counted as fp16.
- A plan's eviction (`int4 @ snapkv:0.5`, kvviz.formats.eviction) holds `evict.kept(context)` tokens per head in
  full-attention (and hybrid) layers, in the plan's format, plus, with `rest=FMT`, the other context tokens in FMT;
  sliding and chunked layers keep their window. No index is stored (K carries its RoPE position): 0 index bytes.
  The whole `seq_len` counts as the context (what the cache compresses on its first update).
- MLA in the engine layout stores one latent per token in K's format (there is no separate V), except vLLM's
  DeepSeek records (vllm:fp8_ds_mla, vllm:nvfp4_ds_mla): the latent in K's format, the RoPE key in V's.
"""

from __future__ import annotations

from collections import Counter

from kvviz.formats import Format, Plan, as_plan, get_format, parse_kv
from kvviz.formats.ds_mla import is_latent
from kvviz.formats.engines import check_model

from .configs import config_dict, state_shapes
from .layers import LAYOUTS, LayerShape, shapes_of

_EVICTS = ("full_attention", "hybrid")  # the layer kinds a plan's eviction compresses (kvviz.cache.eviction)
_FP16_BYTES = 2  # residual-window tokens are held in fp16
_MODEL_DTYPE_BYTES = 2  # bf16 / fp16 weights and activations: the dtype of conv states


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
    if kv_heads == 0:
        return 0
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
    """Exact bytes of a uniform KV cache: K and V of every layer, each [batch, kv_heads, seq_len, head_dim].

    `k` is a format spec ("int4/channel/g32/asym"), a pair spec ("k=int8,v=int4"), a preset ("k8v4") or a
    KVSpec; with `v` given, `k` and `v` are the K and V format specs. Includes scales, zero points, static
    scales (once per layer) and the fp16 full-precision tail: the `residual` most recent tokens (None: the
    preset's window, e.g. 32 for kivi2; else 0) plus the partial group of `channel` formats.
    For a real model (sliding windows, MLA, hybrids) use kv_cache_bytes_for.
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


def _layer_formats(k, v, residual, kinds: list[str]) -> list[tuple[Format, Format, int]]:
    """(K format, V format, residual) per layer of a model whose layers are `kinds` (LayerShape.kind): one spec for
    all, or a plan (a kvviz.Plan, plan text, or a list of one spec per layer, which kvviz.as_plan turns into one).
    A spec or plan (not a K and a V Format) is resolved as the cache resolves it: the engine's layer rules apply
    (vLLM's TurboQuant keeps a dense model's boundary layers in 16 bits)."""
    if residual is not None:
        _check_count(residual, "residual (full-precision tokens)")
    if v is not None or isinstance(k, Format):
        if isinstance(k, (Plan, list, tuple)):
            raise ValueError("With a per-layer plan in `k`, leave `v` out: each entry names its K and V.")
        k_fmt, v_fmt = _kv_formats(k, v)
        return [(k_fmt, v_fmt, 0 if residual is None else residual)] * len(kinds)
    plan = as_plan(k)
    kvs = plan.resolve(len(kinds), kinds)
    if None in kvs:
        raise ValueError(f"The plan {plan.name!r} keeps some layers exact; the memory model counts formats: "
                         f"give every layer a spec (fp16 for the model's own 16-bit values).")
    return [(kv.k, kv.v, kv.residual if residual is None else residual) for kv in kvs]


def _layer_bytes(shape: LayerShape, seq_len: int, batch: int, k_fmt, v_fmt, residual: int, layout: str) -> int:
    # K and V may hold different token counts: a channel format keeps its oldest group whole (LayerShape.held)
    return (_tensor_bytes(k_fmt, batch, shape.k_heads, shape.k_dim, shape.held(seq_len, k_fmt, layout), residual)
            + _tensor_bytes(v_fmt, batch, shape.v_heads, shape.v_dim, shape.held(seq_len, v_fmt, layout), residual))


class CacheModel:
    """A model's per-layer shapes with their formats, grouped so that a figure costs one product per group.

    Build once, then ask `bytes(seq_len, batch)` many times (the GPU-fit searches do).
    """

    def __init__(self, config, k="fp16", v=None, layout: str = "engine", residual: int | None = None):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}.")
        self.layout = layout
        _, cfg = config_dict(config)
        self.shapes = shapes_of(cfg, "transformers" if layout == "transformers" else layout)
        self.formats = formats = _layer_formats(k, v, residual, [s.kind for s in self.shapes])  # per layer
        for fmts in {(k_fmt, v_fmt) for k_fmt, v_fmt, _ in formats}:
            check_model(fmts, mla=bool(cfg.get("kv_lora_rank")))  # what vLLM refuses on this model
        if layout == "engine" and any(is_latent(k_fmt) for k_fmt, _, _ in formats):
            # vLLM's DeepSeek layouts hold the latent and the RoPE key in one record, each part in its own format:
            # those layers count K as the latent (kv_lora_rank) and V as the RoPE key (qk_rope_head_dim)
            split = shapes_of(cfg, "transformers")
            self.shapes = [t if is_latent(f[0]) else s for s, t, f in zip(self.shapes, split, formats)]
        self.evict = None if (v is not None or isinstance(k, Format)) else as_plan(k).evict
        if self.evict is not None and not any(s.kind in _EVICTS and s.has_kv for s in self.shapes):
            raise ValueError(f"Every K/V layer of this model keeps a window already: eviction (@ {self.evict.text}) "
                             f"applies to full-attention layers and would change nothing. Drop '@ {self.evict.text}'.")
        self.uniform = len(set(formats)) == 1  # False also where an engine's layer rules keep layers in 16 bits
        # layers with equal shape and formats hold equal bytes: count them once
        self.groups = Counter((s.kind, s.window, s.k_heads, s.k_dim, s.v_heads, s.v_dim, f)
                              for s, f in zip(self.shapes, formats))

    def bytes(self, seq_len: int, batch: int = 1) -> int:
        _check_count(seq_len, "seq_len (context length in tokens)")
        _check_count(batch, "batch", 1)
        total = 0
        for (kind, window, *dims, fmts), count in self.groups.items():
            total += count * self._group_bytes(LayerShape(-1, kind, window, *dims), seq_len, batch, fmts)
        return total

    def _group_bytes(self, shape: LayerShape, seq_len: int, batch: int, fmts: tuple) -> int:
        """One layer's bytes: under eviction, a full-attention layer holds kept tokens in its formats and (mixed
        precision) the other context tokens in the rest format."""
        evict = self.evict
        if evict is None or shape.kind not in _EVICTS:
            return _layer_bytes(shape, seq_len, batch, *fmts, self.layout)
        kept = evict.kept(seq_len)
        held = _layer_bytes(shape, kept, batch, *fmts, self.layout)
        if evict.rest is not None and seq_len > kept:
            held += _layer_bytes(shape, seq_len - kept, batch, evict.rest, evict.rest, 0, self.layout)
        return held

    @property
    def grows(self) -> bool:
        """True when some layer holds every token (full attention): the cache grows without bound."""
        return any(s.has_kv and s.window is None for s in self.shapes)

    def breakdown(self, seq_len: int, batch: int = 1) -> list[dict]:
        """One row per layer kind and shape: kind, layers (how many), window, tokens (each holds), K and V heads
        and dims, bytes (all those layers together, for `batch` sequences)."""
        rows: dict[tuple, dict] = {}
        for (kind, window, *dims, fmts), count in self.groups.items():
            shape = LayerShape(-1, kind, window, *dims)
            key = (kind, window, *dims)
            row = rows.setdefault(key, {"kind": kind, "layers": 0, "window": window,
                                        "tokens": (self.evict.kept(seq_len) if self.evict and kind in _EVICTS
                                                   else shape.tokens(seq_len, self.layout)), "k_heads": dims[0],
                                        "k_dim": dims[1], "v_heads": dims[2], "v_dim": dims[3], "bytes": 0})
            row["layers"] += count
            row["bytes"] += count * self._group_bytes(shape, seq_len, batch, fmts)
        order = {k: i for i, k in enumerate(("full_attention", "hybrid", "sliding_attention", "chunked_attention",
                                             "linear_attention", "shared", "mlp"))}
        return sorted(rows.values(), key=lambda r: (order.get(r["kind"], 99), -(r["window"] or 0)))


def kv_cache_bytes_for(config, seq_len: int, batch: int = 1, k="fp16", v=None, layout: str = "engine",
                       residual: int | None = None) -> int:
    """Exact bytes of the K/V cache of `config` after `seq_len` tokens, for `batch` sequences, built per layer.

    `config`: a preset name, a transformers PretrainedConfig, a config.json dict or path, or a hub id (online).
    `k`, `v`: as kv_cache_bytes, or `k` a plan: a kvviz.Plan or a list of one spec (or KVSpec) per layer, `v` None.
    `layout`: "engine" (vLLM / SGLang: sliding and chunked layers hold W tokens, MLA its latent), "transformers"
    (what kvviz.QuantizedKVCache and transformers' caches hold: W - 1 tokens, MLA's latent as two tensors) or
    "decompressed" (MLA as per-head K and V). Recurrent state is apart: see state_bytes_for.
    """
    return CacheModel(config, k, v, layout, residual).bytes(seq_len, batch)


def layer_breakdown(config, seq_len: int, batch: int = 1, k="fp16", v=None, layout: str = "engine",
                    residual: int | None = None) -> list[dict]:
    """Per layer kind: how many layers, the tokens each holds at `seq_len`, and their bytes (CacheModel.breakdown)."""
    return CacheModel(config, k, v, layout, residual).breakdown(seq_len, batch)


def _ssm_dtype_bytes(config) -> int:
    _, cfg = config_dict(config)
    named = str(cfg.get("mamba_ssm_cache_dtype") or cfg.get("mamba_ssm_dtype") or "").lower()
    return 4 if named in ("float32", "fp32", "torch.float32") else _MODEL_DTYPE_BYTES


def state_bytes_for(config, batch: int = 1, layout: str = "engine", dtype_bytes: int | None = None) -> int:
    """Bytes of the fixed-size state of recurrent layers (Mamba-2, Gated DeltaNet), for `batch` sequences.

    Per layer: conv state [conv_dim, d_conv - 1] (engine: vLLM) or [conv_dim, d_conv] (transformers), in the
    model's dtype (bf16: 2 bytes), plus the SSM / recurrent state in `dtype_bytes`; None reads the config's
    `mamba_ssm_cache_dtype` / `mamba_ssm_dtype` (float32: 4 bytes, as vLLM honours it), else bf16 (2 bytes).
    It does not grow with the context. 0 for models without such layers.
    """
    _check_count(batch, "batch", 1)
    ssm_bytes = _ssm_dtype_bytes(config) if dtype_bytes is None else _check_count(dtype_bytes, "dtype_bytes", 1)
    total = 0
    for _, conv, ssm in state_shapes(config, layout):
        total += _prod(conv) * _MODEL_DTYPE_BYTES + _prod(ssm) * ssm_bytes
    return batch * total


def _prod(shape) -> int:
    out = 1
    for n in shape:
        out *= n
    return out
