"""`RowStackCache`: one batch whose rows each keep their own KV format, so several formats decode as one batch.

Row b of the batch is either exact (None: K/V kept as computed, what DynamicCache holds) or backed by the layer of a
batch-1 `kvviz.QuantizedKVCache` for its own spec, which stores the row's tokens exactly as it would alone
(quantized once, on append; residual window; static scales). What attention reads is a dequantized mirror of every
row, kept in one [batch, kv_heads, capacity, head_dim] buffer per layer and side: a token is dequantized once,
when its row's cache quantizes it, and the full-precision tail (residual window, partial channel group) is copied
each step. The mirror holds exactly what the row side's `QTensor.dequantize()` returns (the reference read), so
the "kvviz" attention function gets plain tensors and runs SDPA over all rows at once.

This serves quality metrics (teacher-forced KL, free-running text, needle retrieval, per-layer sensitivity): one set
of weight reads per step for every format. Speed of a format's own cache and backend is measured separately
(kvviz.quality.speed).

Rows per layer: by default every layer holds every row. With `layer_rows`, layer j holds its own rows, each taking
layer j of one of the given plans; kvviz.analysis.rows uses this to run many per-layer plans as a prefix tree (plans
that agree on layers 0..j share one row up to layer j), so the batch differs from layer to layer.

    stack = RowStackCache(model.config, [None, "fp8_e4m3", "k8v4"])   # row 0 exact, rows 1-2 quantized
    stack.load_prefill(dynamic_cache)                                  # the prompt's K/V, copied into every row
    out = model(next_ids, cache=stack, use_cache=True)                 # next_ids: [3, 1]
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvviz.cache.quantized import QuantizedKVCache, _layer_plan

_MIN_CAPACITY = 64


class _RowStackLayer(CacheLayerMixin):
    """One decoder layer: the rows' own cache layers plus the shared dequantized mirror [B, H, capacity, D]."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, row_layers: list):
        super().__init__()
        self.rows = row_layers  # QuantizedKVLayer or None (exact row) per batch row
        self.exact = [b for b, row in enumerate(row_layers) if row is None]
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
        if self.exact:  # exact rows: what attention reads is what came in, one copy for all of them
            self.keys[self.exact, :, self.n : end] = key_states[self.exact]
            self.values[self.exact, :, self.n : end] = value_states[self.exact]
        for b, row in enumerate(self.rows):
            if row is None:
                continue
            k_new, v_new = key_states[b : b + 1], value_states[b : b + 1]
            out = row.update(k_new, v_new)
            for side, buf, got in (("k", self.keys, out[0]), ("v", self.values, out[1])):
                if isinstance(got, torch.Tensor):  # the prefill (its own K/V), or a layer that hands back tensors
                    buf[b, :, end - got.shape[2] : end] = got[0]  # (MLA latents: the dequantized history)
                else:
                    self._sync(side, b, got, buf, end)
        self.n = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def _sync(self, side: str, b: int, packed, buf: torch.Tensor, end: int) -> None:
        """Mirror row b from its side (a QTensor): dequantize newly quantized tokens once, copy the tail.

        A sliding-window (or chunked) layer's row holds only its last `seq_len` positions: what its cache evicted
        keeps its mirrored values here, where the model's sliding mask hides it, as it hides an exact row's old
        tokens. `done` counts absolute positions.
        """
        start = end - packed.seq_len  # positions the row's own cache has evicted
        assert start >= 0, f"row {b} holds {packed.seq_len} tokens, more than the {end} it was given"
        nq = packed.n_quantized
        m = max(self.done[side][b], start)
        if start + nq > m:
            buf[b, :, m : start + nq] = packed.slice(m - start, nq).dequantize()[0].to(buf.dtype)
            self.done[side][b] = start + nq
        if packed.tail.shape[2]:
            buf[b, :, start + nq : end] = packed.tail[0].to(buf.dtype)

    def get_seq_length(self) -> int:
        return self.n

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.n + query_length, 0

    def get_max_length(self) -> int:
        return -1


class RowStackCache(Cache):
    """A batch of rows, each with its own KV spec (None: exact). See the module docstring.

    config: the model config. specs: one entry per batch row (per plan, with layer_rows), a spec string / KVSpec,
    a per-layer plan (a list with one spec or None per layer, or a plan string) or None.
    scales: static scales passed to every quantized row's QuantizedKVCache ({layer: (k_scale, v_scale)}).
    layer_rows: None (every layer holds one row per spec, in order) or, per layer j, the index into `specs` of
    each row layer j holds (that row stores what specs[p]'s layer j stores); a (plan, layer) pair at most once.
    """

    def __init__(self, config, specs: list, scales: dict | None = None, layer_rows: list[list[int]] | None = None):
        self.row_caches = [None if s is None else QuantizedKVCache(config, s, scales=_scales_for(config, s, scales))
                           for s in specs]
        n_layers = config.get_text_config(decoder=True).num_hidden_layers
        if layer_rows is None:
            layer_rows = [list(range(len(specs)))] * n_layers
        assert len(layer_rows) == n_layers, f"layer_rows has {len(layer_rows)} layers, the model {n_layers}"
        assert all(len(set(r)) == len(r) for r in layer_rows), "a plan's layer serves one row per layer at most"
        layers = [_RowStackLayer([self._layer(p, i) for p in rows]) for i, rows in enumerate(layer_rows)]
        super().__init__(layers=layers)

    def _layer(self, p: int, i: int):
        """Plan p's cache layer i, or None where that layer is exact (an exact row, or a plan's None entry)."""
        c = self.row_caches[p]
        return None if c is None or c.plan[i] is None else c.layers[i]

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


def _scales_for(config, spec, scales):
    """Static scales only reach rows whose formats take them (QuantizedKVCache rejects them otherwise)."""
    if not scales:
        return None
    kvs = [kv for kv in _layer_plan(spec, config.get_text_config(decoder=True).num_hidden_layers) if kv is not None]
    takes = any(f.takes_scale for kv in kvs for f in (kv.k, kv.v))
    return scales if takes else None
