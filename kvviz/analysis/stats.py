"""Per-channel statistics of captured K/V: magnitude, kurtosis, outlier channels, and the Hadamard-rotated view.

The outlier rule (one place, `outlier_mask`): a channel of one head is an outlier when its largest magnitude over
the prompt's tokens exceeds `OUTLIER_FACTOR` times the median of that head's per-channel largest magnitudes,

    amax[c] = max_t |x[t, c]|,    outlier[c] = amax[c] > OUTLIER_FACTOR * median_c(amax)

The median (not the mean) keeps the few huge channels from raising their own bar. On SmolLM2-135M post-RoPE K
carries a handful of such channels per head while V has almost none (lesson 1).

Kurtosis is Pearson's, E[(x - mu)^4] / sigma^4 over tokens: 3 for a Gaussian; heavy-tailed channels score higher.
"""

from __future__ import annotations

import numpy as np
import torch

from kvviz.analysis.capture import KVCapture
from kvviz.formats import rotate

OUTLIER_FACTOR = 4.0


def outlier_mask(amax: torch.Tensor, factor: float = OUTLIER_FACTOR) -> torch.Tensor:
    """amax [..., D] -> bool [..., D]: amax > factor * median over the last axis (see the module docstring)."""
    if not factor > 0:
        raise ValueError(f"outlier factor must be positive, got {factor}.")
    median = amax.median(dim=-1, keepdim=True).values  # [..., 1]
    return amax > factor * median


def channel_stats(x: torch.Tensor, factor: float = OUTLIER_FACTOR) -> dict:
    """Statistics per channel over the token axis. x: [..., tokens, head_dim].

    Returns numpy arrays, each [..., head_dim] unless noted:
      amax, mean_abs, kurtosis, outlier (bool);
      amax_ratio [...]: the largest amax over the median amax (how far the worst channel stands out);
      mean_kurtosis [...]: the kurtosis averaged over the channels.
    """
    x = x.float()
    amax = x.abs().amax(dim=-2)  # [..., D]
    mean_abs = x.abs().mean(dim=-2)
    centered = x - x.mean(dim=-2, keepdim=True)
    var = centered.pow(2).mean(dim=-2)
    kurt = centered.pow(4).mean(dim=-2) / var.clamp(min=1e-12).pow(2)
    median = amax.median(dim=-1).values.clamp(min=1e-12)  # [...]
    return {
        "amax": amax.numpy(),
        "mean_abs": mean_abs.numpy(),
        "kurtosis": kurt.numpy(),
        "outlier": outlier_mask(amax, factor).numpy(),
        "amax_ratio": (amax.amax(dim=-1) / median).numpy(),
        "mean_kurtosis": kurt.numpy().mean(axis=-1),
    }


def capture_stats(cap: KVCapture, which: str = "keys_post", factor: float = OUTLIER_FACTOR) -> dict:
    """channel_stats of every layer and head of one captured tensor: arrays [layers, kv_heads, head_dim]
    (amax_ratio [layers, kv_heads]), plus "outliers": {(layer, head): [channel, ...]} for the non-empty ones, and
    "layer_ids": the model's number of each captured layer (`layer` above is the position among them)."""
    stats = channel_stats(cap.tensor(which), factor)
    stats["layer_ids"] = list(cap.layer_ids)
    mask = stats["outlier"]
    stats["outliers"] = {(int(l), int(h)): np.flatnonzero(mask[l, h]).tolist()
                         for l in range(mask.shape[0]) for h in range(mask.shape[1]) if mask[l, h].any()}
    stats["factor"] = factor
    return stats


STRONGEST = 8  # outlier channels a summary names (and a chart marks): more read as a wall of numbers


def strongest_outliers(stats: dict, layer: int, head: int, n: int = STRONGEST) -> tuple[list[int], int]:
    """(the `n` outlier channels of (layer, head) with the largest |x| max, largest first; how many it has in all),
    from a capture_stats dict."""
    chans = stats["outliers"].get((layer, head), [])
    amax = stats["amax"][layer, head]  # [head_dim]
    return sorted(chans, key=lambda c: -float(amax[c]))[:n], len(chans)


def kv_outlier_summary(cap: KVCapture, factor: float = OUTLIER_FACTOR) -> dict:
    """Lesson 1 in numbers, per layer: outlier channels (summed over heads) and the worst amax ratio for
    pre-RoPE K, post-RoPE K and V. Returns {"keys_pre"|"keys_post"|"values": {"outliers": [L], "amax_ratio": [L]}}."""
    out = {}
    for which in ("keys_pre", "keys_post", "values"):
        s = channel_stats(cap.tensor(which), factor)
        out[which] = {"outliers": s["outlier"].sum(axis=(1, 2)), "amax_ratio": s["amax_ratio"].max(axis=1)}
    return out


def rotation_view(cap: KVCapture, layer: int, head: int, which: str = "keys_post",
                  factor: float = OUTLIER_FACTOR) -> dict:
    """The same head before and after the normalized Hadamard rotation over head_dim (what `/rot` formats store).

    Returns {"original": channel_stats, "rotated": channel_stats, "x": [T, D], "x_rot": [T, D]} (numpy): the
    rotation spreads an outlier channel's energy over all channels, so amax_ratio and kurtosis fall.
    """
    x = _head(cap, which, layer, head)  # [T, D]
    x_rot = rotate(x)  # [T, D]
    return {"original": channel_stats(x, factor), "rotated": channel_stats(x_rot, factor),
            "x": x.numpy(), "x_rot": x_rot.numpy()}


def coordinate_histogram(cap: KVCapture, layer: int | None = None, head: int | None = None, bins: int = 61,
                         which: str = "keys_post") -> dict:
    """The coordinates of one head's unit vectors before and after the normalized Hadamard rotation, as histograms
    against N(0, 1/d): the density TurboQuant's Lloyd-Max codebook is built for (a coordinate of a random unit vector
    in d dimensions, arXiv 2504.19874; vLLM's turboquant/centroids.py). A rotation maps an outlier channel's share
    of the norm onto every coordinate, so the rotated coordinates follow the curve and the raw ones do not.

    Each token's vector is divided by its norm (what TurboQuant quantizes: the norm is stored apart). layer, head:
    a captured layer (by position) and a KV head; None: the pair whose raw coordinates are the most heavy-tailed
    (largest kurtosis), where the rotation has most to do. Returns plain data: {"layer", "head" (the pair shown;
    "layer_id": the model's layer number), "edges": [bins + 1] (a coordinate's value), "before", "after": [bins] densities (integrating to 1 over
    the edges' span; coordinates beyond it are counted in `outside_before` / `outside_after`, fractions),
    "curve_x", "curve_pdf": the N(0, 1/d) density, "head_dim", "tokens", "kurtosis_before", "kurtosis_after"
    (Pearson's over every coordinate: 3 for N(0, 1/d)), "max_before", "max_after" (largest |coordinate|)}.
    """
    if layer is None or head is None:
        u_all = _unit(cap.tensor(which).double())  # [layers, heads, T, D]
        kurt = (u_all**4).mean(dim=(-2, -1)) / (u_all**2).mean(dim=(-2, -1)) ** 2  # [layers, heads]
        keep = torch.ones_like(kurt, dtype=torch.bool)
        if layer is not None:
            _head(cap, which, layer, 0)  # checks the layer
            keep[torch.arange(kurt.shape[0]) != layer] = False
        if head is not None:
            _head(cap, which, 0, head)  # checks the head
            keep[:, torch.arange(kurt.shape[1]) != head] = False
        best = int(kurt.masked_fill(~keep, float("-inf")).flatten().argmax())
        layer, head = divmod(best, kurt.shape[1])
    x = _head(cap, which, layer, head).double()  # [T, D]
    d = x.shape[-1]
    u = _unit(x)  # [T, D] unit vectors
    rotated = rotate(u)  # [T, D]
    sigma = 1.0 / np.sqrt(d)
    span = 5.0 * sigma  # the curve's bulk; outliers beyond it are counted apart
    edges = np.linspace(-span, span, bins + 1)
    out = {"layer": layer, "head": head, "layer_id": cap.layer_ids[layer], "edges": edges, "head_dim": d,
           "tokens": x.shape[0]}
    for name, v in (("before", u), ("after", rotated)):
        flat = v.flatten().numpy()
        counts, _ = np.histogram(flat, edges)
        out[name] = counts / (flat.size * np.diff(edges))
        out[f"outside_{name}"] = float(np.mean(np.abs(flat) > span))
        out[f"kurtosis_{name}"] = float(np.mean(flat**4) / np.mean(flat**2) ** 2)
        out[f"max_{name}"] = float(np.abs(flat).max())
    out["curve_x"] = np.linspace(-span, span, 201)
    out["curve_pdf"] = np.exp(-0.5 * (out["curve_x"] / sigma) ** 2) / (sigma * np.sqrt(2 * np.pi))
    return out


def _unit(x: torch.Tensor) -> torch.Tensor:
    """Each vector along the last axis divided by its norm."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-30)


def _head(cap: KVCapture, which: str, layer: int, head: int) -> torch.Tensor:
    x = cap.tensor(which)
    if not (0 <= layer < x.shape[0] and 0 <= head < x.shape[1]):
        raise ValueError(f"layer must be in 0..{x.shape[0] - 1} and head in 0..{x.shape[1] - 1}; "
                         f"got layer {layer}, head {head}.")
    return x[layer, head]
