"""`QuantizedKVCache`: a transformers Cache that stores K and V packed, quantizing each token once, on append.

transformers' own `QuantizedCache` re-quantizes the whole history whenever its residual window fills and
dequantizes all of it at every step. Here each token is quantized exactly once, when it enters the quantized
store, and appended to preallocated buffers that grow by doubling along the token axis. The buffers are laid out
[batch, kv_heads, tokens(capacity), ...] exactly as kvviz's QTensor lays out data / scale / zero, so the fused
Triton decode kernel reads them in place (see `PackedKV` in kvviz/attention.py for the handle it gets).

Semantics (as vLLM): the first `update` (the prompt) returns the raw K/V, so the prompt attends to its own
unquantized states; what is stored is quantized; every later `update` (decode, or a teacher-forced chunk with
q_len > 1) stores its tokens and returns two `PackedKV` handles over the whole history, which the "kvviz" attention
function reads (torch backend: dequantize + SDPA, the reference; triton: the fused kernel).

Storage per layer and side (K, V), tokens in order:
- quantized part: whole tokens (token / tensor / head granularity, casts) or whole groups of N tokens (channel);
- tail: full-precision tokens not quantized yet, [batch, kv_heads, r, head_dim]: the `residual` most recent tokens
  (KIVI's window; 0 = none) plus, for channel formats, the partial group waiting to fill. A token leaves the tail
  (is quantized) as soon as it is older than the window (channel: as soon as a whole group has left it). The tail
  is 16-bit: the model dtype when that is fp16/bf16, else fp16, as kvviz.kv_cache_bytes counts it.
- static scales (per-tensor, per-head, NVFP4's global scale): from `scales` when given, else computed once from the
  first update (the prefill: amax / max, as transformers' fp8 cache does), then fixed and shared by the batch.

Appends quantize with kvviz.formats (the reference), or, with the Triton backend on a device Triton runs on, with
the fused kernels.quant_pack that writes straight into the buffers (bit-identical; channel formats excepted).

    cache = QuantizedKVCache(model.config, "k8v4")
    out = model.generate(**enc, cache=cache, max_new_tokens=32)   # model: attn_implementation="kvviz"
    cache.nbytes()   # bytes really held == kvviz.kv_cache_bytes(...) for the same shape

Speed, bytes and quality against DynamicCache and transformers' QuantizedCache: `python -m kvviz bench`.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from kvviz.attention import PackedKV, active_backend
from kvviz.formats import Format, KVSpec, parse_kv

__all__ = ["PackedKV", "QuantizedKVCache", "QuantizedKVLayer"]

_MIN_CAPACITY = 64  # tokens; buffers then double


class _Buffer:
    """A tensor [batch, heads, capacity, *rest] filled along dim 2, grown by doubling (amortized O(1) append)."""

    def __init__(self, template: torch.Tensor):
        self.buf = template[:, :, :0].clone()  # [B, H, 0, *rest], dtype and trailing shape of the field
        self.n = 0

    def reserve(self, t: int) -> torch.Tensor:
        """Make room for t more rows; returns the whole buffer (rows self.n .. self.n + t - 1 are free)."""
        need = self.n + t
        if need > self.buf.shape[2]:
            cap = max(need, 2 * self.buf.shape[2], _MIN_CAPACITY)
            new = self.buf.new_empty((*self.buf.shape[:2], cap, *self.buf.shape[3:]))
            new[:, :, : self.n] = self.buf[:, :, : self.n]
            self.buf = new
        return self.buf

    def append(self, x: torch.Tensor) -> None:
        """x: [B, H, t, *rest]."""
        self.reserve(x.shape[2])[:, :, self.n : self.n + x.shape[2]] = x
        self.n += x.shape[2]

    def view(self) -> torch.Tensor:
        return self.buf[:, :, : self.n]  # a view: strides keep the spare capacity

    def truncate(self, n: int) -> None:
        assert 0 <= n <= self.n, f"cannot truncate {self.n} rows to {n}"
        self.n = n

    def nbytes(self) -> int:
        v = self.view()
        return v.numel() * v.element_size()

    def map_batch(self, fn) -> None:
        self.buf = fn(self.buf)


class _Side:
    """One side (K or V) of one layer: quantized buffers, the full-precision tail and the static scale."""

    def __init__(self, fmt: Format, residual: int, static_scale):
        self.fmt, self.residual, self.given_scale = fmt, residual, static_scale
        self.static: torch.Tensor | None = None  # fp32 [] or [1, H, 1, 1], shared by the batch
        self.nv_amax: torch.Tensor | None = None  # nvfp4: the prefill amax that fixes the global scale
        self.fields: dict[str, _Buffer] = {}
        self.tail: torch.Tensor | None = None  # [B, H, r, D], 16-bit
        self.dtype = torch.float32
        self.tokens_quantized = 0  # every token is quantized once: this ends equal to the quantized length
        self.quantize_calls = 0

    # -- setup -------------------------------------------------------------------------------------------------
    def init(self, x: torch.Tensor) -> None:
        """First states seen (the prefill), x: [B, H, T, D]: fix static scales, shape the buffers."""
        fmt = self.fmt
        self.dtype = x.dtype
        tail_dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else torch.float16
        self.tail = x.new_zeros((*x.shape[:2], 0, x.shape[3]), dtype=tail_dtype)
        if fmt.granularity in ("tensor", "head"):
            self.static = self._static_from(x)
        elif fmt.base == "nvfp4":
            self.nv_amax = x.detach().float().abs().amax()  # same reduction the format uses for its global scale
            if self.given_scale is not None:
                self.nv_amax = torch.as_tensor(self.given_scale, dtype=torch.float32, device=x.device) * 448.0 * 6.0
        probe_len = fmt.group if fmt.granularity == "channel" else 1
        probe = self._quantize_raw(x.new_zeros((*x.shape[:2], probe_len, x.shape[3])))
        self.fields = {name: _Buffer(t) for name in ("data", "scale", "zero")
                       if (t := getattr(probe, name)) is not None}
        if fmt.base == "nvfp4":
            self.static = probe.tensor_scale  # the global scale the anchor pins (see _quantize_raw)
        if self.static is None and probe.tensor_scale is not None:
            raise AssertionError(f"{fmt.spec}: unexpected tensor scale without a static-scale rule")

    def _static_from(self, x: torch.Tensor) -> torch.Tensor:
        if self.given_scale is not None:
            s = torch.as_tensor(self.given_scale, dtype=torch.float32, device=x.device)
            if self.fmt.granularity == "tensor":
                return s.reshape(())
            return s.reshape(1, -1, 1, 1).expand(1, x.shape[1], 1, 1).contiguous()  # one per head
        if self.fmt.granularity == "tensor":
            return self.fmt.quantize(x).tensor_scale.reshape(())
        heads = x.shape[1]  # one scale per head over the whole batch: [1, H, B * T, D]
        pooled = x.transpose(0, 1).reshape(1, heads, -1, x.shape[3])
        return self.fmt.quantize(pooled).tensor_scale.reshape(1, heads, 1, 1)

    # -- append ------------------------------------------------------------------------------------------------
    def _quantize_raw(self, x: torch.Tensor):
        """Quantize x [B, H, t, D] with this side's static scale (if any)."""
        if self.fmt.base == "nvfp4" and self.nv_amax is not None:
            # The format derives NVFP4's global scale from its input's amax. Prepending one anchor element equal
            # to the prefill amax (and saturating x to it, as a static scale would) pins the global scale to the
            # prefill's; block scales are per token, so the anchor row changes nothing else and is dropped.
            amax = self.nv_amax.to(x.device)
            x = torch.where(torch.isfinite(x), x.clamp(-amax, amax), x)
            anchor = x.new_zeros((*x.shape[:2], 1, x.shape[3]))
            anchor[0, 0, 0, 0] = amax
            q = self.fmt.quantize(torch.cat([anchor, x], dim=2))
            return _drop_first_token(q)
        return self.fmt.quantize(x, scale=self.static if self.fmt.granularity in ("tensor", "head") else None)

    def append(self, x: torch.Tensor) -> None:
        """Add new tokens x: [B, H, t, D] (model dtype); quantize every token that leaves the tail, once."""
        work = torch.cat([self.tail.to(x.dtype), x], dim=2) if self.tail.shape[2] else x
        excess = work.shape[2] - self.residual
        n_q = excess - excess % self.fmt.group if self.fmt.granularity == "channel" else excess
        if n_q > 0:
            if not self._pack_in_place(work[:, :, :n_q]):
                q = self._quantize_raw(work[:, :, :n_q])
                for name, buf in self.fields.items():
                    buf.append(getattr(q, name))
            self.tokens_quantized += n_q
            self.quantize_calls += 1
        self.tail = work[:, :, max(n_q, 0):].to(self.tail.dtype).contiguous()

    def _pack_in_place(self, x: torch.Tensor) -> bool:
        """With the Triton backend, quantize x [B, H, t, D] and write it straight into the buffers with the fused
        kernels.quant_pack (bit-identical to _quantize_raw); False when that path does not apply."""
        if active_backend() != "triton":
            return False
        from kernels._triton import triton_usable
        from kernels.pack import quant_pack, quant_pack_supported

        # auto picks triton whenever CUDA exists, but a model left on the CPU has CPU states: formats path then
        if not (triton_usable(x.device) and quant_pack_supported(self.fmt, x.shape[3])):
            return False
        t = x.shape[2]
        bufs = {name: buf.reserve(t) for name, buf in self.fields.items()}
        quant_pack(self.fmt, x, bufs["data"], bufs.get("scale"), bufs.get("zero"), pos=self.fields["data"].n,
                   tensor_scale=self.static)
        for buf in self.fields.values():
            buf.n += t
        return True

    # -- read ----------------------------------------------------------------------------------------------------
    def packed(self) -> PackedKV:
        f = self.fields
        return PackedKV(
            fmt=self.fmt, data=f["data"].view(), scale=f["scale"].view() if "scale" in f else None,
            zero=f["zero"].view() if "zero" in f else None, tensor_scale=self.static, tail=self.tail,
            dtype=self.dtype,
        )

    @property
    def n_quantized(self) -> int:
        return self.fields["data"].n if self.fields else 0

    @property
    def seq_len(self) -> int:
        return self.n_quantized + (self.tail.shape[2] if self.tail is not None else 0)

    def nbytes(self) -> int:
        if self.tail is None:
            return 0
        held = sum(b.nbytes() for b in self.fields.values()) + self.tail.numel() * self.tail.element_size()
        return held + (self.static.numel() * 4 if self.static is not None else 0)

    def map_batch(self, fn) -> None:
        for buf in self.fields.values():
            buf.map_batch(fn)
        self.tail = fn(self.tail)

    def crop(self, n_remove: int) -> None:
        keep = max(self.seq_len - n_remove, 0)
        if keep >= self.n_quantized:
            self.tail = self.tail[:, :, : keep - self.n_quantized]
            return
        channel = self.fmt.granularity == "channel"
        if channel and keep % self.fmt.group:
            raise ValueError(f"Cannot crop {self.fmt.spec} to {keep} tokens: it would split a quantized "
                             f"group of {self.fmt.group}; crop to a multiple of {self.fmt.group}.")
        for name, buf in self.fields.items():
            buf.truncate(keep // self.fmt.group if channel and name != "data" else keep)  # channel scales: per group
        self.tail = self.tail[:, :, :0]
        self.tokens_quantized = keep


def _drop_first_token(q):
    """QTensor of [B, H, 1 + t, D] (token granularity) -> its last t tokens' fields."""
    import dataclasses

    cut = {name: getattr(q, name)[:, :, 1:] for name in ("data", "scale") if getattr(q, name) is not None}
    shape = (*q.shape[:2], q.shape[2] - 1, q.shape[3])
    return dataclasses.replace(q, shape=shape, **cut)


class QuantizedKVLayer(CacheLayerMixin):
    """One decoder layer's packed K and V. update() returns raw states on the first call, PackedKV after."""

    is_compileable = False
    is_croppable = False  # tokens pushed out of the residual window stay quantized: crop cannot undo that
    is_sliding = False
    supports_early_init = False  # static scales come from the first real states, not from an empty tensor

    def __init__(self, k_fmt: Format, v_fmt: Format, residual: int = 0, scales=None):
        super().__init__()
        k_scale, v_scale = scales if scales is not None else (None, None)
        self.k = _Side(k_fmt, residual, k_scale)
        self.v = _Side(v_fmt, residual, v_scale)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.k.init(key_states)
        self.v.init(value_states)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states, value_states: [batch, kv_heads, q_len, head_dim] (post-RoPE K).

        Returns (key_states, value_states) unchanged on the first call (the prompt attends to its raw states),
        else (PackedKV, PackedKV) over every cached token, this call's included.
        """
        first = not self.is_initialized or self.get_seq_length() == 0
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.k.append(key_states)
        self.v.append(value_states)
        if first:
            return key_states, value_states
        return self.k.packed(), self.v.packed()

    def get_seq_length(self) -> int:
        return self.k.seq_len if self.is_initialized else 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        """Forget every token (static scales too: the next prefill computes them again, unless given)."""
        self.k = _Side(self.k.fmt, self.k.residual, self.k.given_scale)
        self.v = _Side(self.v.fmt, self.v.residual, self.v.given_scale)
        self.is_initialized = False

    def _map_batch(self, fn) -> None:
        if self.is_initialized:
            self.k.map_batch(fn)
            self.v.map_batch(fn)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: reorder the batch. Packed codes move as they are, nothing is re-quantized."""
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_batch(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove tokens (a negative count, as DynamicLayer takes)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove, as transformers' DynamicLayer.")
        if tokens_to_remove and self.is_initialized:
            self.k.crop(-tokens_to_remove)
            self.v.crop(-tokens_to_remove)

    def nbytes(self) -> int:
        return self.k.nbytes() + self.v.nbytes()


class QuantizedKVCache(Cache):
    """A transformers Cache holding packed, quantized K/V (see the module docstring).

    config: the model config (full-attention layers only). spec: "k=int8,v=int4", one spec for both
    ("fp8_e4m3"), a preset ("k8v4", "kivi2") or a KVSpec. residual: full-precision recent tokens (None: the
    preset's, e.g. 32 for kivi2; else 0). scales: {layer: (k_scale, v_scale)} static scales for per-tensor /
    per-head formats (and NVFP4's global scale), e.g. calibrated or loaded from an SGLang scale file.
    """

    def __init__(self, config, spec: str | KVSpec, residual: int | None = None, scales: dict | None = None):
        self.spec = parse_kv(spec)
        self.residual = self.spec.residual if residual is None else int(residual)
        if self.residual < 0:
            raise ValueError(f"residual is a number of recent tokens kept in full precision (>= 0), got {residual}.")
        text = config.get_text_config(decoder=True)
        layer_types, _ = get_layer_types_and_kwargs(text)
        if set(layer_types) - {"full_attention"}:
            raise ValueError(f"QuantizedKVCache supports full-attention layers only; this model has "
                             f"{sorted(set(layer_types))}. Use a model without sliding-window layers.")
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        for fmt in (self.spec.k, self.spec.v):
            _check_format(fmt, heads, head_dim)
        scales = scales or {}
        if scales and not any(f.granularity in ("tensor", "head") or f.base == "nvfp4"
                              for f in (self.spec.k, self.spec.v)):
            raise ValueError(f"Static scales apply to per-tensor / per-head formats; {self.spec.spec} computes "
                             f"its own scales. Drop `scales`, or pick e.g. fp8_e4m3.")
        layers = [QuantizedKVLayer(self.spec.k, self.spec.v, self.residual,
                                   _layer_scales(scales, i, self.spec))
                  for i in range(text.num_hidden_layers)]
        super().__init__(layers=layers)

    def nbytes(self) -> int:
        """Bytes really held (in use, not capacity): packed data, scales, zeros, tails and static scales."""
        return sum(layer.nbytes() for layer in self.layers)

    def __repr__(self) -> str:
        return f"QuantizedKVCache({self.spec.spec!r}, residual={self.residual}, layers={len(self.layers)})"


def _check_format(fmt: Format, heads: int, head_dim: int) -> None:
    """Fail at construction, with the format's own message, rather than mid-generation."""
    if fmt.asym and fmt.granularity in ("tensor", "head"):
        raise ValueError(f"{fmt.spec}: a per-tensor / per-head zero point cannot stay fixed while tokens are "
                         f"appended; use {fmt.base}/token/asym or a symmetric format.")
    fmt.nbytes_for((1, heads, fmt.group if fmt.granularity == "channel" else 1, head_dim))


def _layer_scales(scales: dict, i: int, spec: KVSpec):
    if not scales:
        return None
    pair = scales.get(i, scales.get(str(i)))
    if pair is None:
        raise ValueError(f"`scales` has no entry for layer {i}; give (k_scale, v_scale) for every layer.")
    k_scale, v_scale = pair
    takes = [f.granularity in ("tensor", "head") or f.base == "nvfp4" for f in (spec.k, spec.v)]
    return (k_scale if takes[0] else None, v_scale if takes[1] else None)
