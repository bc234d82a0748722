"""Per-layer storage of `QuantizedKVCache`, one class per transformers layer kind (cache_utils' DynamicCache split).

- `QuantizedKVLayer`: full attention (transformers' DynamicLayer): every token, quantized once on append.
- `QuantizedSlidingLayer`: sliding-window and chunked attention (DynamicSlidingWindowLayer): keeps the last
  window - 1 tokens, as transformers does; get_seq_length / get_mask_sizes / cumulative_length behave identically,
  so transformers' masks line up, and evicted tokens leave the packed buffers, scales and tail.
- `QuantizedHybridLayer`, `QuantizedHybridSlidingLayer`: a layer holding a linear-attention / Mamba state beside
  attention (Falcon-H1's "hybrid"): transformers' own LinearAttentionLayer keeps the state, in full precision;
  only the attention K/V are quantized.

Every layer's update(key_states, value_states) takes [batch, kv_heads, q_len, head_dim] (K and V head dims may
differ) and returns the raw states on the first call (the prompt attends to its own unquantized states), else one
`QTensor` per side (kvviz/formats/qtensor.py) over the tokens attention may see (kvviz/attention.py reads
them). A layer of `llama.cpp:` names holds K and V as llama.cpp does (kvviz.ggml_attention.Layout: its channel
order and rotation) and returns its sides from the first call on, as llama.cpp's attention reads what it stored
(kvviz.ggml_attention.Stored). On the cpu backend a single decode token is staged instead (`_Staged`, an
attention.StagedStep): the attention function stores it and attends in one numba call (kernels/cpu/step.py); any
other read stores it first.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers.cache_utils import CacheLayerMixin, LinearAttentionLayer

from kernels.cpu.step import DecodeStep
from kvviz import attention, ggml_attention, runtime
from kvviz.formats import Format, QTensor

from . import eviction
from .sides import Side


class _Staged(attention.StagedStep):
    """What `QuantizedKVLayer.update` returns for K (side "k") and V ("v") when it staged a decode token: K and V
    [B, H, 1, D], held by the layer (`_pending`) and not yet stored. One pair per layer, returned step after step.

    The attention function calls `attend`, which stores the token and attends in one call. Read as a QTensor (any
    attribute but `shape`), each stores the token as update would have and answers for its side: a caller of
    update that reads what it returned sees exactly the QTensors it would have got without staging."""

    __slots__ = ("layer", "side")

    def __init__(self, layer, side: str):
        self.layer, self.side = layer, side

    def attend(self, query, kv_mask, scaling, sinks, softcap):
        return self.layer._append_attend(query, kv_mask, scaling, sinks, softcap)

    def __getattr__(self, name):
        if name == "shape" or name.startswith("__"):
            return super().__getattr__(name)
        layer = self.layer
        layer._flush()  # stored as update would have stored it (nothing, when attend already did)
        k, v = layer._read(layer.k.packed(layer._visible_from), layer.v.packed(layer._visible_from))
        return getattr(k if self.side == "k" else v, name)


class QuantizedKVLayer(CacheLayerMixin):
    """One full-attention layer's packed K and V. update() returns raw states on the first call, QTensors after.

    k_fmt, v_fmt: formats of K and V; residual: recent tokens kept in 16 bits; scales: (k_scale, v_scale) static
    scales or None; name: "layer 3", for error messages. materialize: return dequantized tensors instead of
    QTensor handles, for models that transform the cache's return before attention (MLA models cache the
    compressed latent and expand it after the cache: DeepSeek-V2/V3, Kimi, GLM-4-MoE-Lite, ...).
    """

    is_compileable = False
    is_croppable = False  # tokens pushed out of the residual window stay quantized: crop cannot undo that
    is_sliding = False
    supports_early_init = False  # static scales come from the first real states, not from an empty tensor

    def __init__(self, k_fmt: Format, v_fmt: Format, residual: int = 0, scales=None, name: str = "layer",
                 materialize: bool = False):
        super().__init__()
        self.name, self.materialize = name, materialize
        if residual and k_fmt.engine == "llama.cpp":
            raise ValueError(f"{name}: llama.cpp keeps no full-precision window; drop residual for {k_fmt.spec}.")
        self._scales = scales if scales is not None else (None, None)
        self._new_sides(k_fmt, v_fmt, residual)

    # Whether update() may stage a decode token for the fused CPU step (see _stages); QuantizedKVCache turns it on
    # where nothing else reads what update returned (no shared-KV layers, no latent caches)
    stages = False
    # llama.cpp holds this model's K RoPE-interleaved (ggml_attention.interleaved_model); QuantizedKVCache sets it
    interleaved = False
    layout: ggml_attention.Layout | None = None  # llama.cpp names: how K and V are held (set on the first update)
    # the plan's eviction (kvviz.cache.eviction: which context tokens the first update keeps); QuantizedKVCache sets
    # it, and layer_idx, on full-attention layers
    evict = None
    layer_idx = 0

    def _new_sides(self, k_fmt: Format, v_fmt: Format, residual: int) -> None:
        self.k = Side(k_fmt, residual, self._scales[0], f"{self.name} K")
        self.v = Side(v_fmt, residual, self._scales[1], f"{self.name} V")
        self._pending: tuple | None = None  # a staged decode token: (key_states, value_states, keep_from)
        self._visible_from: int | None = None  # the staged token's first visible position (sliding layers)
        self._staged = (_Staged(self, "k"), _Staged(self, "v"))  # what update returns for a staged token
        self._staging = False  # whether update stages decode tokens now (_can_stage; asked after every store)
        self._step: DecodeStep | None = None
        self._step_data = None  # K's data _Buffer once the step is bound over the buffers (None: bind first)
        self._dropped = 0  # context tokens each head dropped (eviction): counted as seen, not held
        self._rest: eviction.RestStore | None = None  # mixed precision: the context tokens not kept, low-bit
        self._observing = None  # snapkv: the prefill waiting for its queries (eviction.prefill)
        self._context = 0  # the context's length (eviction)

    # -- the fused CPU decode step ------------------------------------------------------------------------------
    def _can_stage(self) -> bool:
        """Whether a decode token may go to the fused CPU step (append and attend in one numba call,
        kernels/cpu/step.py) instead of being stored at once: fixed by the layer once it holds tokens (the cache
        turned staging on, no llama.cpp layout, both sides fusable: the CPU packer, token scales, no residual
        window); update checks the rest per token (one token, CPU states, the cpu backend)."""
        return (self.stages and self.is_initialized and self.layout is None and self.k.seen > 0
                and self._rest is None and self.k.fuses() and self.v.fuses())

    def _stage(self, key_states: torch.Tensor, value_states: torch.Tensor, keep_from: int | None = None,
               visible_from: int | None = None):
        """Hold this decode token for the attention function's fused call, or return None where it is stored now
        (see _can_stage). Returns the pair update returns."""
        if not (self._staging and key_states.shape[2] == 1 and key_states.is_cpu
                and attention.active_backend() == "cpu"):
            return None
        self._pending, self._visible_from = (key_states, value_states, keep_from), visible_from
        return self._staged

    def _append_attend(self, query, kv_mask, scaling, sinks, softcap) -> torch.Tensor:
        """Store the staged token and attend over the layer's tokens in one call; see attention.StagedStep."""
        pending, self._pending = self._pending, None
        assert pending is not None, f"{self.name}: a staged token is attended once, right after its update"
        k_new, v_new, keep_from = pending
        data, step = self._step_data, self._step
        if data is None or data.n >= step.capacity or query.shape[1] != step.q_heads:
            step = self._bind_step(query.shape[1])  # new or full buffers: they grow here, never inside the step
            data = self._step_data
        parallel = step.rows * (data.n + 1 - data.start) >= runtime.current().cpu_parallel_rows  # numba's pool
        out, over_k, over_v = step.run(k_new, v_new, query, data.start, data.n, kv_mask, scaling, sinks, softcap,
                                       parallel)
        self.k.commit_row(k_new, over_k)
        self.v.commit_row(v_new, over_v)
        if keep_from is not None:
            self.k.evict(keep_from)
            self.v.evict(keep_from)
        return out

    def _bind_step(self, q_heads: int) -> DecodeStep:
        """Room for one more row in every buffer, and the fused step bound over them (kept while they stay)."""
        k_bufs, v_bufs = self.k.reserve_row(), self.v.reserve_row()
        k_data, v_data = self.k.fields["data"], self.v.fields["data"]
        assert (k_data.start, k_data.n) == (v_data.start, v_data.n), "K and V hold the same rows"
        if self._step is None:
            self._step = DecodeStep(self.k.fmt, self.v.fmt)
        if not self._step.bound(k_bufs, v_bufs, q_heads):
            self._step.bind(k_bufs, v_bufs, self.k.static, self.v.static, q_heads)
        self._step_data = k_data
        return self._step

    def _stored(self) -> None:
        """After tokens were stored outside the fused step (buffers may have grown or moved): bind again before
        the next step, and ask again whether decode tokens stage."""
        self._step_data = None
        self._staging = self._can_stage()

    def append_mirrored(self, key_states: torch.Tensor, value_states: torch.Tensor, rows, at: int, k_mirror,
                        v_mirror) -> bool:
        """A decode token of batched rows (kvviz.cache.row_stack): store K and V as update would and write their
        dequantized values into the rows' mirrors at position `at`, one numba call per side (Side.append_mirrored).
        Returns False, having done nothing, where that path does not apply (then call update)."""
        if (type(self) is not QuantizedKVLayer or self.materialize or self.layout is not None
                or self._pending is not None or not self.is_initialized or self.k.seen == 0 or key_states.shape[2] != 1
                or key_states.device.type != "cpu" or not (self.k.mirrors() and self.v.mirrors())):
            return False
        self.k.append_mirrored(key_states, rows, at, k_mirror)
        self.v.append_mirrored(value_states, rows, at, v_mirror)
        self._step_data = None  # its row may have grown the buffers: a fused step binds again
        return True

    def _flush(self) -> None:
        """Store a staged token the attention function never took (the cache read in between): as update would."""
        pending, self._pending = self._pending, None
        if pending is not None:
            k_new, v_new, keep_from = pending
            self.k.append(k_new)
            self.v.append(v_new)
            if keep_from is not None:
                self.k.evict(keep_from)
                self.v.evict(keep_from)
            self._stored()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.layout = None if self.materialize else ggml_attention.cache_layout(
            self.k.fmt, self.v.fmt, key_states.shape[-1], value_states.shape[-1], self.interleaved)
        self.k.init(key_states)
        self.v.init(value_states)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states: [batch, kv_heads, q_len, k_head_dim] (post-RoPE), value_states: [..., v_head_dim].

        Returns (key_states, value_states) unchanged on the first call (the prompt attends to its raw states),
        else (QTensor, QTensor) over every cached token, this call's included.
        """
        self._flush()
        if self._observing is not None:
            raise ValueError(f"{self.name}: snapkv scores the context by its queries, which this cache never got: "
                             f"prefill the context through the model (attn_implementation='kvviz'), or load it with "
                             f"kvviz.quality.decode.load_prefill from a prefill that kept them (queries=window).")
        staged = self._stage(key_states, value_states)
        if staged is not None:
            return staged
        first = not self.is_initialized or self.get_seq_length() == 0
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if first and self.evict is not None:
            return eviction.prefill(self, key_states, value_states)
        key_states, value_states = self._held(key_states, value_states)
        self.k.append(key_states)
        self.v.append(value_states)
        self._stored()
        if first and self.layout is None:
            return key_states, value_states
        return self._read(self.k.packed(), self.v.packed())

    def _held(self, key_states: torch.Tensor, value_states: torch.Tensor):
        """K and V in the basis this layer stores them in: llama.cpp's for its names (fp32), else as they came."""
        if self.layout is None:
            return key_states, value_states
        return self.layout.to_cache(key_states, "k"), self.layout.to_cache(value_states, "v")

    def _read(self, k: QTensor, v: QTensor):
        """What update returns after the prefill: the handles, or (materialize) their reference read; a
        llama.cpp layer's handles carry its Layout (ggml_attention.Stored)."""
        if self.layout is not None:
            k = dataclasses.replace(k, fmt=ggml_attention.Stored(k.fmt, self.layout, "k"))
            v = dataclasses.replace(v, fmt=ggml_attention.Stored(v.fmt, self.layout, "v"))
        if self._rest is not None:  # mixed precision: the low-bit context tokens first, read by the reference
            return self._rest.joined(k.dequantize(), v.dequantize())
        return (k.dequantize(), v.dequantize()) if self.materialize else (k, v)

    def get_seq_length(self) -> int:
        """Tokens seen: stored, staged, and (eviction) the context's dropped and low-bit ones."""
        if not self.is_initialized:
            return 0
        if self._observing is not None:
            return self._context
        rest = self._rest.tokens if self._rest is not None else 0
        return self.k.seen + (self._pending is not None) + self._dropped + rest

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) for the mask of a query of query_length new tokens, as DynamicLayer's; after
        eviction, the tokens held, offset by those dropped (so new tokens stay causal among themselves)."""
        return self.get_seq_length() - self._dropped + query_length, self._dropped

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        """Forget every token (static scales too: the next prefill computes them again, unless given)."""
        self._pending = None
        self._new_sides(self.k.fmt, self.v.fmt, self.k.residual)
        self.is_initialized = False

    def _map_batch(self, fn) -> None:
        self._flush()
        if self.is_initialized:
            self.k.map_batch(fn)
            self.v.map_batch(fn)
            if self._rest is not None:
                self._rest.map_batch(fn)
            self._stored()

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
        self._flush()
        if tokens_to_remove and self.is_initialized:
            self.k.crop(-tokens_to_remove)
            self.v.crop(-tokens_to_remove)
            self._stored()

    def offload(self):  # the packed buffers stay where they are: kvviz does not offload
        pass

    def prefetch(self):
        pass

    def nbytes(self, one_row: bool = False) -> int:
        """Bytes held: packed data, scales, zero points, 16-bit tails and static scales of K and V (one_row: one
        batch row's, static scales counted once)."""
        self._flush()
        rest = self._rest.nbytes(one_row) if self._rest is not None else 0
        return self.k.nbytes(one_row) + self.v.nbytes(one_row) + rest if self.is_initialized else 0


class QuantizedSlidingLayer(QuantizedKVLayer):
    """A sliding-window (or chunked) layer: holds the last sliding_window - 1 tokens, as transformers'
    DynamicSlidingWindowLayer (chunked attention reuses it with the chunk size; the mask does the rest)."""

    is_sliding = True

    def __init__(self, k_fmt: Format, v_fmt: Format, sliding_window: int, residual: int = 0, scales=None,
                 name: str = "layer", materialize: bool = False):
        super().__init__(k_fmt, v_fmt, residual, scales, name, materialize)
        self.sliding_window = int(sliding_window)
        self.cumulative_length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """As QuantizedKVLayer.update; the handles cover what transformers' layer returns: the window - 1 tokens
        held before this call plus this call's tokens. Afterwards only the last window - 1 tokens stay."""
        self._flush()
        first = not self.is_initialized or self.cumulative_length == 0
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keep = self.sliding_window - 1
        visible_from = max(self.cumulative_length - keep, 0)
        keep_from = max(self.cumulative_length + key_states.shape[-2] - keep, 0)
        staged = self._stage(key_states, value_states, keep_from, visible_from)  # visible_from: the side's base
        self.cumulative_length += key_states.shape[-2]
        if staged is not None:
            return staged
        key_states, value_states = self._held(key_states, value_states)
        if first and self.layout is not None:  # the whole prompt reads it as stored, evicted or not (llama.cpp)
            out = self._read(self.k.fmt.quantize(key_states), self.v.fmt.quantize(value_states))
        if first:
            self.k.append(key_states, keep_from=keep_from)
            self.v.append(value_states, keep_from=keep_from)
            out = (key_states, value_states) if self.layout is None else out
        else:
            self.k.append(key_states)
            self.v.append(value_states)
            out = self._read(self.k.packed(visible_from), self.v.packed(visible_from))
        self.k.evict(keep_from)
        self.v.evict(keep_from)
        self._stored()
        return out

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Exactly DynamicSlidingWindowLayer.get_mask_sizes."""
        kv_offset = max(self.cumulative_length - self.sliding_window + 1, 0)
        if self.cumulative_length >= self.sliding_window:
            return self.sliding_window - 1 + query_length, kv_offset
        return self.cumulative_length + query_length, kv_offset

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return self.sliding_window

    def reset(self) -> None:
        super().reset()
        self.cumulative_length = 0

    def crop(self, tokens_to_remove: int) -> None:
        """Only before the window filled, as transformers' layer without past recording."""
        if self.cumulative_length >= self.sliding_window and tokens_to_remove:
            raise ValueError(f"{self.name} is a sliding-window layer past its window of {self.sliding_window} "
                             "tokens: the evicted tokens are gone, so it cannot be cropped. Start a new cache.")
        super().crop(tokens_to_remove)
        self.cumulative_length = self.k.seen if self.is_initialized else 0


class _HybridMixin:
    """Dispatch between transformers' LinearAttentionLayer (conv / recurrent states, full precision, untouched)
    and a quantized attention layer, as transformers' LinearAttentionAndFullAttentionLayer does."""

    def lazy_initialization(self, *args, **kwargs) -> None:
        if len(args) == 2 and not kwargs:  # the attention path: (key_states, value_states)
            self._attention_cls.lazy_initialization(self, *args)
        elif not args:  # update_conv_state / update_recurrent_state pass keywords
            LinearAttentionLayer.lazy_initialization(self, **kwargs)

    def reset(self) -> None:
        LinearAttentionLayer.reset(self)
        self._attention_cls.reset(self)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        LinearAttentionLayer.reorder_cache(self, beam_idx)
        self._attention_cls.reorder_cache(self, beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        LinearAttentionLayer.crop(self, tokens_to_remove)
        self._attention_cls.crop(self, tokens_to_remove)

    def offload(self):
        pass

    def prefetch(self):
        pass


class QuantizedHybridLayer(_HybridMixin, LinearAttentionLayer, QuantizedKVLayer):
    """"hybrid": a linear-attention / Mamba state (transformers' own) plus quantized full-attention K/V."""

    _attention_cls = QuantizedKVLayer
    is_compileable = False

    def __init__(self, k_fmt: Format, v_fmt: Format, residual: int = 0, scales=None, name: str = "layer",
                 materialize: bool = False, number_of_states: int = 1):
        QuantizedKVLayer.__init__(self, k_fmt, v_fmt, residual, scales, name, materialize)
        LinearAttentionLayer.__init__(self, number_of_states=number_of_states)


class QuantizedHybridSlidingLayer(_HybridMixin, LinearAttentionLayer, QuantizedSlidingLayer):
    """"hybrid_sliding": a linear-attention / Mamba state plus quantized sliding-window K/V."""

    _attention_cls = QuantizedSlidingLayer
    is_compileable = False

    def __init__(self, k_fmt: Format, v_fmt: Format, sliding_window: int, residual: int = 0, scales=None,
                 name: str = "layer", materialize: bool = False, number_of_states: int = 1):
        QuantizedSlidingLayer.__init__(self, k_fmt, v_fmt, sliding_window, residual, scales, name, materialize)
        LinearAttentionLayer.__init__(self, number_of_states=number_of_states)


def copy_states(src: LinearAttentionLayer, dst: LinearAttentionLayer, rows: int = 1) -> None:
    """Give dst (empty) the linear-attention / Mamba states of src, a batch-1 prefilled layer, in each of `rows`
    batch rows: the conv and recurrent states, as they are (they are not K/V, so nothing is quantized)."""
    for i in range(src.number_of_states):
        held = [s for s in (src.conv_states[i], src.recurrent_states[i]) if s is not None]
        if any(s.shape[0] != 1 for s in held):
            raise ValueError("linear-attention / Mamba states copy from a batch-1 prefill only; prefill one prompt.")
        if src.is_conv_states_initialized[i]:
            conv = src.conv_states[i].expand(rows, *src.conv_states[i].shape[1:])
            dst.lazy_initialization(conv_states=conv, state_idx=i, conv_kernel_size=src.conv_kernel_size[i])
            dst.conv_states[i].copy_(conv)
        if src.is_recurrent_states_initialized[i]:
            state = src.recurrent_states[i].expand(rows, *src.recurrent_states[i].shape[1:])
            dst.lazy_initialization(recurrent_states=state, state_idx=i)
            dst.recurrent_states[i].copy_(state)
        dst.has_previous_state[i] = src.has_previous_state[i]
