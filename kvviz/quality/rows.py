"""`RowStackCache`: one batch whose rows each keep their own KV format, so several formats decode as one batch.

Row b of the batch is either exact (None: K/V kept as computed, what DynamicCache holds) or backed by the layer of a
batch-1 `kvviz.QuantizedKVCache` for its own spec, which stores the row's tokens exactly as it would alone
(quantized once, on append; residual window; static scales). What attention reads is a dequantized mirror of every
row, kept in one [batch, kv_heads, capacity, head_dim] buffer per layer and side: a token is dequantized once,
when its row's cache quantizes it, and the full-precision tail (residual window, partial channel group) is copied
each step. The mirror holds exactly what `QTensor.dequantize()` of the row's side returns (the torch backend's reference read), so
the "kvviz" attention function gets plain tensors and runs SDPA over all rows at once.

This serves quality metrics (teacher-forced KL, free-running text, needle retrieval): one set of weight reads per
step for every format. Speed of a format's own cache and backend is measured separately (kvviz.quality.speed).

    stack = RowStackCache(model.config, [None, "fp8_e4m3", "k8v4"])   # row 0 exact, rows 1-2 quantized
    stack.load_prefill(dynamic_cache)                                  # the prompt's K/V, copied into every row
    out = model(next_ids, cache=stack, use_cache=True)                 # next_ids: [3, 1]
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvviz.cache import QuantizedKVCache

_MIN_CAPACITY = 64


class _RowStackLayer(CacheLayerMixin):
    """One decoder layer: the rows' own cache layers plus the shared dequantized mirror [B, H, capacity, D]."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, row_layers: list):
        super().__init__()
        self.rows = row_layers  # QuantizedKVLayer or None (exact row) per batch row
        self.n = 0
        self.done = {"k": [0] * len(row_layers), "v": [0] * len(row_layers)}  # quantized tokens mirrored per row

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        b, h, _, d = key_states.shape
        assert b == len(self.rows), f"batch {b} but {len(self.rows)} rows"
        self.keys = key_states.new_zeros((b, h, _MIN_CAPACITY, d))
        self.values = value_states.new_zeros((b, h, _MIN_CAPACITY, value_states.shape[-1]))
        self.is_initialized = True

    def _grow(self, need: int) -> None:
        if need <= self.keys.shape[2]:
            return
        cap = max(need, 2 * self.keys.shape[2])
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((*old.shape[:2], cap, old.shape[3]))
            new[:, :, : self.n] = old[:, :, : self.n]
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states, value_states: [rows, kv_heads, t, head_dim] -> the mirror views [rows, kv_heads, n + t, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[2]
        end = self.n + t
        self._grow(end)
        for b, row in enumerate(self.rows):
            k_new, v_new = key_states[b : b + 1], value_states[b : b + 1]
            out = (k_new, v_new) if row is None else row.update(k_new, v_new)
            for side, buf, got, raw in (("k", self.keys, out[0], k_new), ("v", self.values, out[1], v_new)):
                if isinstance(got, torch.Tensor):  # exact row, or a row cache's first (prefill) update
                    buf[b, :, self.n : end] = raw[0]
                else:
                    self._sync(side, b, got, buf, end)
        self.n = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def _sync(self, side: str, b: int, packed, buf: torch.Tensor, end: int) -> None:
        """Mirror row b from its side (a QTensor): dequantize newly quantized tokens once, copy the tail."""
        nq, m = packed.n_quantized, self.done[side][b]
        assert packed.seq_len == end, f"row {b} holds {packed.seq_len} tokens, expected {end}"
        if nq > m:
            buf[b, :, m:nq] = packed.slice(m, nq).dequantize()[0].to(buf.dtype)
            self.done[side][b] = nq
        if packed.tail.shape[2]:
            buf[b, :, nq:end] = packed.tail[0].to(buf.dtype)

    def get_seq_length(self) -> int:
        return self.n

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.n + query_length, 0

    def get_max_length(self) -> int:
        return -1


class RowStackCache(Cache):
    """A batch of rows, each with its own KV spec (None: exact). See the module docstring.

    config: the model config. specs: one entry per batch row, a spec string / KVSpec or None.
    scales: static scales passed to every quantized row's QuantizedKVCache ({layer: (k_scale, v_scale)}).
    """

    def __init__(self, config, specs: list, scales: dict | None = None):
        self.row_caches = [None if s is None else QuantizedKVCache(config, s, scales=_scales_for(s, scales))
                           for s in specs]
        n_layers = config.get_text_config(decoder=True).num_hidden_layers
        layers = [_RowStackLayer([None if c is None else c.layers[i] for c in self.row_caches])
                  for i in range(n_layers)]
        super().__init__(layers=layers)

    def load_prefill(self, cache: Cache) -> None:
        """Copy a batch-1 prefilled cache (e.g. a DynamicCache) into every row: each row's cache stores (and
        quantizes) the prompt's K/V as its own first update would."""
        for i, layer in enumerate(self.layers):
            k, v = cache.layers[i].keys, cache.layers[i].values  # [1, H, T, D]
            rows = len(layer.rows)
            layer.update(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1))

    def row_nbytes(self, row: int) -> int | None:
        """Bytes held by row `row`'s own quantized cache (None for an exact row)."""
        c = self.row_caches[row]
        return None if c is None else c.nbytes()


def _scales_for(spec, scales):
    """Static scales only reach rows whose formats take them (QuantizedKVCache rejects them otherwise)."""
    if not scales:
        return None
    from kvviz.formats import parse_kv

    kv = parse_kv(spec)
    return scales if kv.k.takes_scale or kv.v.takes_scale else None
