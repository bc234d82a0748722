"""`RowStackCache`: one batch whose rows each keep their own KV format, so several formats decode as one batch.

Row b of the batch is either exact (None: K/V kept as computed, what DynamicCache holds) or backed by the layer of a
`kvviz.QuantizedKVCache` for its own spec, which stores the row's tokens exactly as it would alone (quantized once,
on append; residual window; static scales). Rows of the same spec (or plan) share one such cache, batched: one set
of quantize and dequantize calls per layer and step for all of them, which on a CPU cost more than the arithmetic
(a side-by-side run holds a teacher-forced and a free-running row per format). Every row of a shared cache must
start from the same first update (`load_prefill` gives every row the prompt): a static scale fitted on the first
update, or NVFP4's global scale, is fitted over the whole batch. What attention reads is a dequantized mirror of every
row, kept in one [batch, kv_heads, capacity, head_dim] buffer per layer and side: a token is dequantized once,
when its row's cache quantizes it, and the full-precision tail (residual window, partial channel group) is copied
each step. The mirror holds exactly what the row side's `QTensor.dequantize()` returns (the reference read), so
the "kvviz" attention function gets plain tensors and runs SDPA over all rows at once. On the CPU a decode token
of the formats kernels/cpu/mirror.py reads is packed and mirrored in one numba call per side
(`QuantizedKVLayer.append_mirrored`), the same values bit for bit; other sides take `update` and the torch decode.

This serves quality metrics (teacher-forced KL, free-running text, needle retrieval, per-layer sensitivity): one set
of weight reads per step for every format. Speed of a format's own cache and backend is measured separately
(kvviz.quality.decode).

Layers without K/V of their own keep transformers' objects, batched over the rows: linear-attention and Mamba
states (Qwen3-Next, Falcon-H1's hybrid layers beside their K/V) in full precision, as QuantizedKVCache keeps them,
and Gemma 4's shared-KV layers as DummyLayer (they read what an earlier layer's update returned).

Rows per layer: by default every layer holds every row. With `layer_rows`, layer j holds its own rows, each taking
layer j of one of the given plans; kvviz.analysis.teacher_forced uses this to run many per-layer plans as a prefix
tree (plans that agree on layers 0..j share one row up to layer j), so the batch differs from layer to layer.

    stack = RowStackCache(model.config, [None, "fp8_e4m3", "k8v4"])   # row 0 exact, rows 1-2 quantized
    stack.load_prefill(dynamic_cache)                                  # the prompt's K/V, copied into every row
    out = model(next_ids, cache=stack, use_cache=True)                 # next_ids: [3, 1]
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import (DYNAMIC_LAYER_TYPE_MAPPING, Cache, CacheLayerMixin, DummyLayer,
                                      LinearAttentionCacheLayerMixin, LinearAttentionLayer, get_layer_types_and_kwargs)

from kvviz.cache.layers import _HybridMixin, copy_states
from kvviz.cache.quantized import STATE_TYPES, QuantizedKVCache
from kvviz.cache.sides import grown
from kvviz.formats import Plan

_MIN_CAPACITY = 64


class _RowStackLayer(CacheLayerMixin):
    """One decoder layer: the rows' own cache layers plus the shared dequantized mirror [B, H, capacity, D].

    row_layers: per batch row, a QuantizedKVLayer or None (exact); rows given the same layer object share it,
    that layer holding them as its batch, in row order."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, row_layers: list):
        super().__init__()
        self.n = 0
        self._set_rows(row_layers, {})

    def _set_rows(self, row_layers: list, done: dict) -> None:
        """Batch rows -> their layers; done: id(layer) -> (K, V) quantized tokens already mirrored."""
        self.rows = row_layers
        exact = [b for b, row in enumerate(row_layers) if row is None]
        self.exact = _selector(exact) if exact else None  # a slice when consecutive (row 0 in Compare): no gather
        shared: dict[int, tuple] = {}
        for b, row in enumerate(row_layers):
            if row is not None:
                shared.setdefault(id(row), (row, []))[1].append(b)
        self.members = {key: rows for key, (_, rows) in shared.items()}  # id(layer) -> its batch rows, in order
        self.groups = [(layer, _selector(rows)) for layer, rows in shared.values()]  # (layer, its batch rows)
        self.index = [np.array(rows, dtype=np.int64) for _, rows in shared.values()]  # the same, for numba
        pairs = [done.get(id(layer), (0, 0)) for layer, _ in self.groups]
        self.done = {"k": [k for k, _ in pairs], "v": [v for _, v in pairs]}  # quantized tokens mirrored

    def select_rows(self, index: list[int]) -> None:
        """Make the batch rows `index` of the current one (repeats copy a row: its packed bytes, tail and mirror,
        nothing re-quantized). A shared layer's own batch is reordered to match."""
        done = {id(layer): (self.done["k"][g], self.done["v"][g]) for g, (layer, _) in enumerate(self.groups)}
        for key, members in self.members.items():
            layer = self.rows[members[0]]
            picks = [members.index(b) for b in index if self.rows[b] is layer]
            if picks != list(range(len(members))):
                layer.reorder_cache(torch.tensor(picks, dtype=torch.long))
        if self.is_initialized:
            idx = torch.tensor(index, dtype=torch.long, device=self.keys.device)
            self.keys, self.values = self.keys.index_select(0, idx), self.values.index_select(0, idx)
        self._set_rows([self.rows[b] for b in index], done)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """The mirror for every batch row, shaped as key_states / value_states ([any rows, H, t, D])."""
        self.device, self.dtype = key_states.device, key_states.dtype
        b, h, d = len(self.rows), key_states.shape[1], key_states.shape[-1]
        self.keys = key_states.new_zeros((b, h, _MIN_CAPACITY, d))
        self.values = value_states.new_zeros((b, h, _MIN_CAPACITY, value_states.shape[-1]))
        self.is_initialized = True

    def _grow(self, need: int) -> None:
        if need <= self.keys.shape[2]:
            return
        cap = max(need, 2 * self.keys.shape[2])
        self.keys = grown(self.keys[:, :, : self.n], cap, zeros=True)
        self.values = grown(self.values[:, :, : self.n], cap, zeros=True)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states, value_states: [rows, kv_heads, t, head_dim] -> the mirror views [rows, kv_heads, n + t, D]."""
        return self._append(key_states, value_states, _same)

    def _append(self, key_states: torch.Tensor, value_states: torch.Tensor, take):
        """update, with take(states, batch rows) -> those rows' K or V (a tiled prefill maps rows onto its own)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[2]
        end = self.n + t
        self._grow(end)
        if self.exact is not None:  # exact rows: what attention reads is what came in, one copy for all of them
            self.keys[self.exact, :, self.n : end] = take(key_states, self.exact)
            self.values[self.exact, :, self.n : end] = take(value_states, self.exact)
        mirrors = None
        if t == 1 and self.keys.dtype == torch.float32 and self.keys.device.type == "cpu":
            mirrors = self.keys.numpy(), self.values.numpy()
        for g, (layer, rows) in enumerate(self.groups):
            # a decode token, everything before it mirrored: stored and mirrored in one numba call per side where
            # the format allows (the first step after a prefill syncs the prefill's tokens, mirrored raw, below)
            if (mirrors is not None and self.done["k"][g] == self.done["v"][g] == end - 1
                    and layer.append_mirrored(key_states[rows], value_states[rows], self.index[g], end - 1,
                                              *mirrors)):
                self.done["k"][g] = self.done["v"][g] = end
                continue
            out = layer.update(take(key_states, rows), take(value_states, rows))  # [rows of the group, H, t, D] each
            for side, buf, got in (("k", self.keys, out[0]), ("v", self.values, out[1])):
                if isinstance(got, torch.Tensor):  # the prefill (its own K/V), or a layer that hands back tensors
                    buf[rows, :, end - got.shape[2] : end] = got  # (MLA latents: the dequantized history)
                else:
                    self._sync(side, g, rows, got, buf, end)
        self.n = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def _sync(self, side: str, g: int, rows, packed, buf: torch.Tensor, end: int) -> None:
        """Mirror group g's rows from its side (a QTensor): dequantize newly quantized tokens once, copy the tail.

        A sliding-window (or chunked) layer's row holds only its last `seq_len` positions: what its cache evicted
        keeps its mirrored values here, where the model's sliding mask hides it, as it hides an exact row's old
        tokens. `done` counts absolute positions.
        """
        start = end - packed.seq_len  # positions the row's own cache has evicted
        assert start >= 0, f"rows {rows} hold {packed.seq_len} tokens, more than the {end} they were given"
        nq = packed.n_quantized
        m = max(self.done[side][g], start)
        if start + nq > m:
            buf[rows, :, m : start + nq] = packed.slice(m - start, nq).dequantize().to(buf.dtype)
            self.done[side][g] = start + nq
        if packed.tail.shape[2]:
            buf[rows, :, start + nq : end] = packed.tail.to(buf.dtype)

    def get_seq_length(self) -> int:
        return self.n

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.n + query_length, 0

    def get_max_length(self) -> int:
        return -1


class _RowStackHybridLayer(_HybridMixin, LinearAttentionLayer, _RowStackLayer):
    """A layer with a linear-attention / Mamba state beside attention (Falcon-H1's "hybrid"): the rows' K/V as in
    _RowStackLayer, the states in transformers' own LinearAttentionLayer, one batch row per row, full precision."""

    _attention_cls = _RowStackLayer
    is_compileable = False
    is_croppable = False

    def __init__(self, row_layers: list, number_of_states: int = 1):
        _RowStackLayer.__init__(self, row_layers)
        LinearAttentionLayer.__init__(self, number_of_states=number_of_states)


class RowStackCache(Cache):
    """A batch of rows, each with its own KV spec (None: exact). See the module docstring.

    config: the model config. specs: one entry per batch row (per plan, with layer_rows), a kvviz.Plan (its None
    layers kept exact) or None (an exact row).
    scales: static scales passed to every quantized row's QuantizedKVCache ({layer: (k_scale, v_scale)}), or a
    list with one such dict (or None) per entry of `specs` (kvviz.quality.divergence fits one per plan).
    layer_rows: None (every layer holds one row per spec, in order) or, per layer j, the index into `specs` of
    each row layer j holds (that row stores what specs[p]'s layer j stores); a (plan, layer) pair at most once.
    own: with layer_rows None, rows that get a cache of their own though their plan equals another row's (a
    per-tensor or global scale is fitted on a cache's first update, over its whole batch: a row that stands for
    a run of its own, such as one needle's haystack, must fit its own).
    """

    def __init__(self, config, specs: list, scales: dict | list | None = None,
                 layer_rows: list[list[int]] | None = None, own: frozenset[int] | set[int] = frozenset()):
        n_layers = config.get_text_config(decoder=True).num_hidden_layers
        assert all(s is None or isinstance(s, Plan) for s in specs), "RowStackCache rows are kvviz.Plans or None"
        evicting = next((s for s in specs if s is not None and s.evict is not None), None)
        if evicting is not None:  # rows of one batch hold the same tokens; an eviction keeps fewer per head
            raise ValueError(f"{evicting.name!r} evicts context tokens, which rows of one batch cannot: run it in "
                             f"its own QuantizedKVCache (kvviz.compare and kvviz.needle do), or drop "
                             f"'@ {evicting.evict.text}'.")
        kinds, kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        if layer_rows is None:  # rows of one spec share one cache, batched (see the module docstring)
            # equal plans (as this model stores them, the engine's layer rules applied): one cache
            keys = [None if s is None else (s.fitted(n_layers, kinds), i if i in own else -1)
                    for i, s in enumerate(specs)]
            # stage=False: the rows read each update's return (their mirrors), so nothing may be left staged
            caches = {k: QuantizedKVCache(config, s, scales=_scales_for(s, scales, i), stage=False)
                      for i, (k, s) in enumerate(zip(keys, specs)) if k is not None and keys.index(k) == i}
            self.row_caches = [None if k is None else caches[k] for k in keys]
        else:  # a layer's rows are distinct plans (kvviz.analysis.teacher_forced' prefix tree): one cache per plan
            self.row_caches = [None if s is None else QuantizedKVCache(config, s, scales=_scales_for(s, scales, i),
                                                                       stage=False) for i, s in enumerate(specs)]
        self.uniform = layer_rows is None  # every layer holds every row, in the same order
        if layer_rows is None:
            layer_rows = [list(range(len(specs)))] * n_layers
        assert len(layer_rows) == n_layers, f"layer_rows has {len(layer_rows)} layers, the model {n_layers}"
        assert all(len(set(r)) == len(r) for r in layer_rows), "a plan's layer serves one row per layer at most"
        self.batch = [len(rows) for rows in layer_rows]  # rows per layer
        layers = []
        for i, (rows, kind, kw) in enumerate(zip(layer_rows, kinds, kwargs)):
            if kind in STATE_TYPES:  # linear attention / Mamba: no K/V, the states of every row, as they are
                layers.append(DYNAMIC_LAYER_TYPE_MAPPING[kind](**kw))
            elif kind == "dummy":  # Gemma 4's shared-KV layers read what an earlier layer's update returned
                layers.append(DummyLayer())
            elif kind.startswith("hybrid"):
                layers.append(_RowStackHybridLayer([self._layer(p, i) for p in rows], kw.get("number_of_states", 1)))
            else:
                layers.append(_RowStackLayer([self._layer(p, i) for p in rows]))
        super().__init__(layers=layers)

    def _layer(self, p: int, i: int):
        """Plan p's cache layer i, or None where that layer is exact (an exact row, or a plan's None entry)."""
        c = self.row_caches[p]
        return None if c is None or c.plan[i] is None else c.layers[i]

    def load_prefill(self, cache: Cache, reserve: int = 0) -> None:
        """Copy a prefilled cache (e.g. a DynamicCache) into every row: each row's cache stores (and quantizes) the
        prompt's K/V as its own first update would; linear-attention / Mamba states are copied.

        The prefill holds one prompt (batch 1: every row gets it) or P prompts, P dividing every layer's rows:
        row r gets prompt r % P (the rows tiled format-major, each format's rows holding every prompt), read from
        the prefill's rows in place (no tiled copy). Linear-attention / Mamba states load from batch 1 only.
        reserve: tokens still to come (a question and its answer), for which the mirror is sized now: growing it
        later copies every row's mirror into a new buffer."""
        for i, (layer, rows) in enumerate(zip(self.layers, self.batch)):
            src = cache.layers[i]
            if isinstance(layer, _RowStackLayer):
                keys, values = src.keys, src.values  # [P, H, T, D]
                if rows % keys.shape[0]:
                    raise ValueError(f"a prefill of {keys.shape[0]} prompts does not tile layer {i}'s {rows} rows; "
                                     "give one prompt, or a number of prompts that divides the rows.")
                if reserve and not layer.is_initialized:
                    layer.lazy_initialization(keys, values)
                    layer._grow(keys.shape[2] + reserve)
                layer._append(keys, values, _tiled(keys.shape[0]))
            if isinstance(layer, LinearAttentionCacheLayerMixin):  # linear-attention / Mamba states, as they are
                copy_states(src, layer, rows)

    def select_rows(self, index: list[int]) -> None:
        """Make the batch rows `index` of the current one, in every layer (a row may repeat: the copy holds what
        the row holds, and decodes on from there as its own row)."""
        if not self.uniform:
            raise ValueError("select_rows needs every layer to hold every row (RowStackCache without layer_rows).")
        picks = torch.tensor(index, dtype=torch.long)
        for layer in self.layers:  # a hybrid layer is both
            if isinstance(layer, _RowStackLayer):
                layer.select_rows(index)
            if isinstance(layer, LinearAttentionCacheLayerMixin):  # its states only (the mirror moved above)
                LinearAttentionLayer.reorder_cache(layer, picks)
        self.row_caches = [self.row_caches[b] for b in index]
        self.batch = [len(index)] * len(self.layers)

    def attention_layers(self) -> list[_RowStackLayer]:
        """The layers that hold K/V (not linear-attention / Mamba states, nor Gemma 4's shared-KV layers)."""
        return [layer for layer in self.layers if isinstance(layer, _RowStackLayer)]

    def row_nbytes(self, row: int) -> int | None:
        """Bytes row `row`'s quantized cache holds for it, as a batch-1 cache of its spec would (None for an exact
        row)."""
        c = self.row_caches[row]
        return None if c is None else c.nbytes(one_row=True)


def _same(states: torch.Tensor, rows) -> torch.Tensor:
    """The given states' batch rows `rows` (a _selector)."""
    return states[rows]


def _tiled(p: int):
    """take() for states of p prompts over rows tiled format-major (row r holds prompt r % p): a batch-1 prompt
    expands (a view); p > 1 reads rows in place where they are consecutive, else gathers them."""
    def take(states: torch.Tensor, rows) -> torch.Tensor:
        index = range(rows.start, rows.stop) if isinstance(rows, slice) else rows.tolist()
        if p == 1:
            return states.expand(len(index), *states.shape[1:])
        return states[_selector([r % p for r in index])]
    return take


def _selector(rows: list[int]):
    """Batch rows as an index: a slice (views, no copies) when they are consecutive, else a tensor of them."""
    if rows == list(range(rows[0], rows[-1] + 1)):
        return slice(rows[0], rows[-1] + 1)
    return torch.tensor(rows)


def _scales_for(plan: Plan, scales, row: int):
    """Static scales only reach rows whose formats take them (QuantizedKVCache rejects them otherwise); a list
    gives each row its own."""
    if isinstance(scales, list):
        scales = scales[row]
    if not scales:
        return None
    return scales if plan.takes_scale else None
