"""Eviction on a `QuantizedKVCache` layer: which of the context's tokens each KV head keeps (the plan's
`@ POLICY:KEEP`, kvviz.formats.eviction), and where the others go (dropped, or a low-bit store: mixed precision).

As NVIDIA's kvpress compresses: the prompt's context is prefilled (attending to all of itself, unquantized), then
compressed once; the question and every generated token go through the compressed cache uncompressed. Here the
context is a full-attention layer's FIRST update: `prefill(layer, keys, values)` picks, per batch row and KV head,
the same number `evict.kept(T)` of tokens (the cache stays rectangular, [B, H, kept, D]), stores those in the
layer's format, and either drops the rest or stores them in `rest` (a second pair of Sides). Sliding-window and
chunked layers keep their own window and are left as they are (QuantizedKVCache sets `evict` on full-attention
layers only).

Positions: K is cached after RoPE, so a kept token keeps its rotation; attention over a set of keys does not depend
on their order, so no index is stored (0 index bytes). The layer still counts the context's full length
(get_seq_length: new tokens get their true positions, as transformers' cache_position comes from it) and reports
the mask over what it holds with the dropped count as offset (get_mask_sizes: (held + q, dropped)), so the causal
mask among a multi-token chunk's own tokens stays exact.

Scores (higher = kept), per batch row and KV head, over the T context tokens:
- streaming: the first `sinks` tokens and the most recent kept - sinks;
- knorm: -||k||_2 (kvpress's KnormPress: small key norms carry attention);
- random: uniform from a generator seeded by (seed, layer index), the control;
- snapkv: kvpress's SnapKVPress: softmax(q k^T * scaling) of the last `window` queries (causal among themselves)
  over the keys, averaged over those queries and over the query heads of the KV head's group (GQA), then averaged
  over `kernel` neighbouring tokens (avg_pool1d, as kvpress); the window's own tokens score highest (always kept;
  the newest first when fewer than the window are kept).
  It needs the prefill's queries: the layer hands the "kvviz" attention function an `ObservedPrefill`, which
  scores and stores once the queries arrive (kvviz/attention.py). A cache loaded from an exact prefill
  (kvviz.quality.decode.load_prefill) gets them from what that prefill recorded (`prefill(..., queries=window)`).
"""

from __future__ import annotations

import torch

from kvviz.attention import ObservedPrefill
from kvviz.formats import Eviction, Format

from .sides import Side


def policy_scores(evict: Eviction, keys: torch.Tensor, layer_idx: int = 0,
                  queries: torch.Tensor | None = None, scaling: float | None = None) -> torch.Tensor:
    """Scores [B, H, T] (float32; higher = kept) of the context keys [B, H, T, D] under `evict`. snapkv takes the
    prefill's queries [B, Hq, T or at least its last window, D] (Hq a multiple of H) and the attention's scaling."""
    b, h, t, _ = keys.shape
    if evict.policy == "streaming":
        pos = torch.arange(t, device=keys.device, dtype=torch.float32)
        sinks = min(evict.sinks, evict.kept(t))
        score = torch.where(pos < sinks, float(t) + 1.0, pos)  # sinks first, then the most recent
        return score.expand(b, h, t)
    if evict.policy == "knorm":
        return -keys.float().norm(dim=-1)
    if evict.policy == "random":
        gen = torch.Generator().manual_seed(evict.seed * 1_000_003 + layer_idx)
        return torch.rand((b, h, t), generator=gen).to(keys.device)
    assert evict.policy == "snapkv", f"no scores for policy {evict.policy!r}"
    assert queries is not None and scaling is not None, "snapkv scores from the prefill's queries"
    return snapkv_scores(queries, keys, evict.window, evict.kernel, scaling)


def snapkv_scores(queries: torch.Tensor, keys: torch.Tensor, window: int, kernel: int,
                  scaling: float) -> torch.Tensor:
    """kvpress's SnapKVPress scores [B, H, T]: queries [B, Hq, T', D] (the prompt's last T' >= window, as the prefill
    or kvviz.quality.decode.prefill's record holds them), keys [B, H, T, D] (post-RoPE), the last `window` queries
    scoring keys 0..T-window-1, pooled over `kernel` tokens; the window scores above all."""
    b, hq, held, d = queries.shape
    assert held >= window, f"snapkv's window of {window} queries, given the last {held}"
    h, t = keys.shape[1], keys.shape[2]
    group = hq // h
    q = queries[:, :, held - window:].float().reshape(b, h, group, window, d)  # [B, H, g, w, D]
    logits = torch.einsum("bhgwd,bhtd->bhgwt", q, keys.float()) * scaling  # [B, H, g, w, T]
    causal = torch.arange(t, device=keys.device)[None, :] > torch.arange(t - window, t, device=keys.device)[:, None]
    logits = logits.masked_fill(causal, float("-inf"))  # window query i sees keys up to its own position
    probs = torch.softmax(logits, dim=-1)[..., : t - window]  # [B, H, g, w, T - w]
    scores = probs.mean(dim=3)  # over the window's queries: [B, H, g, T - w]
    scores = torch.nn.functional.avg_pool1d(scores.reshape(b * h * group, 1, t - window), kernel_size=kernel,
                                            padding=kernel // 2, stride=1).reshape(b, h, group, t - window)
    scores = scores.mean(dim=2)  # over the KV head's group of query heads (GQA): [B, H, T - w]
    top = (scores.amax() if scores.numel() else scores.new_zeros(())) + 1.0
    recent = top + torch.arange(window, device=keys.device, dtype=torch.float32)  # the newest first, if few are kept
    return torch.cat([scores, recent.expand(b, h, window)], dim=-1)


def kept_indices(scores: torch.Tensor, kept: int) -> torch.Tensor:
    """The `kept` best tokens of each row and head, in position order: [B, H, kept] (int64). Ties go to the
    earlier token (a stable sort), so equal scores pick the same tokens everywhere."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :kept]
    return order.sort(dim=-1).values


def dropped_indices(kept: torch.Tensor, t: int) -> torch.Tensor:
    """The complement of kept [B, H, k] in 0..t-1, in position order: [B, H, t - k]."""
    mask = torch.ones((*kept.shape[:2], t), dtype=torch.bool, device=kept.device)
    mask.scatter_(-1, kept, False)
    return torch.nonzero(mask)[:, 2].reshape(*kept.shape[:2], t - kept.shape[2])


def gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] at the tokens index [B, H, k] -> [B, H, k, D]."""
    return x.gather(2, index[..., None].expand(-1, -1, -1, x.shape[-1]))


class RestStore:
    """Mixed precision: the context tokens a policy did not keep, stored in `fmt` (K and V) instead of dropped.
    They never change after the prefill, so their dequantized values are kept for attention to read
    (the bytes counted are the packed ones, as for every side)."""

    def __init__(self, fmt: Format, name: str):
        self.k = Side(fmt, 0, None, f"{name} K (rest)")
        self.v = Side(fmt, 0, None, f"{name} V (rest)")
        self._read: tuple | None = None

    def store(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        for side, x in ((self.k, keys), (self.v, values)):
            side.init(x)
            side.append(x)
        self._read = (self.k.packed().dequantize(), self.v.packed().dequantize())

    @property
    def tokens(self) -> int:
        return self.k.seen

    def joined(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rest's tokens before the main store's (k, v [B, H, n, D]): older than every new token, as the mask
        (causal among the newest) expects."""
        rk, rv = self._read
        return torch.cat([rk.to(k.dtype), k], dim=2), torch.cat([rv.to(v.dtype), v], dim=2)

    def nbytes(self, one_row: bool = False) -> int:
        return self.k.nbytes(one_row) + self.v.nbytes(one_row)

    def map_batch(self, fn) -> None:
        self.k.map_batch(fn)
        self.v.map_batch(fn)
        self._read = (fn(self._read[0]), fn(self._read[1]))


class _Observed(ObservedPrefill):
    """A snapkv layer's prefill, K and V alike: the attention function hands over the queries (observe), the layer
    scores, compresses and stores, and attention runs over the uncompressed states."""

    __slots__ = ("layer", "keys", "values", "states")

    def __init__(self, layer, keys: torch.Tensor, values: torch.Tensor, states: torch.Tensor):
        self.layer, self.keys, self.values, self.states = layer, keys, values, states

    def observe(self, query: torch.Tensor, scaling: float) -> torch.Tensor:
        if self.layer._observing is self:
            self.layer._observing = None
            scores = policy_scores(self.layer.evict, self.keys, queries=query, scaling=scaling)
            _compress(self.layer, self.keys, self.values, scores)
        return self.states


def prefill(layer, keys: torch.Tensor, values: torch.Tensor):
    """A full-attention layer's first update under `layer.evict`: store the kept tokens (the rest in `rest` or
    nowhere) and return what attention reads: the uncompressed states (or, for snapkv, the ObservedPrefill pair that
    stores once the queries come). keys: [B, H, T, Dk], values: [B, H, T, Dv]."""
    evict: Eviction = layer.evict
    t = keys.shape[2]
    evict.check_context(t)
    if layer.layout is not None or layer.materialize:
        raise ValueError(f"{layer.name}: eviction (@ {evict.text}) runs on kvviz's own formats over per-head K/V; "
                         f"drop it for llama.cpp names and latent (MLA) caches.")
    layer._context = t
    if evict.policy == "snapkv" and evict.kept(t) < t:
        layer._observing = _Observed(layer, keys, values, keys)
        return layer._observing, _Observed(layer, keys, values, values)
    everything = evict.kept(t) >= t  # keeps every token: no scores needed, the cache holds what it would without
    scores = keys.new_zeros(keys.shape[:3]) if everything else policy_scores(evict, keys, layer.layer_idx)
    _compress(layer, keys, values, scores)
    return keys, values


def _compress(layer, keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor) -> None:
    """Store the `kept` best-scored tokens of each head in the layer's sides; the others in its rest store, or
    dropped (counted in layer._dropped)."""
    evict: Eviction = layer.evict
    t = keys.shape[2]
    kept = kept_indices(scores, evict.kept(t))
    layer.kept_index = kept  # [B, H, kept]: which context tokens each head holds (for tests and views)
    layer.k.append(gather(keys, kept))
    layer.v.append(gather(values, kept))
    n_rest = t - kept.shape[2]
    if evict.rest is not None and n_rest:
        drop = dropped_indices(kept, t)
        layer._rest = RestStore(evict.rest, layer.name)
        layer._rest.store(gather(keys, drop), gather(values, drop))
    else:
        layer._dropped = n_rest
    layer._stored()
