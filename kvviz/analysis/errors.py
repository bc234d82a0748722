"""Quantization error of captured K/V: token x channel maps, per-layer relative error, attention-output error,
and per-token / per-channel / per-tensor / per-head scales compared on the same data.

Every function takes KV specs as kvviz.parse_kv does ("int4", "k=int8,v=int4", "kivi2"): K tensors are quantized
with the pair's K format, V with its V format. Quantization runs on one layer at a time, [kv_heads, T, head_dim],
as the cache stores it, so a per-tensor scale is one per layer and a per-head scale one per head. A preset's
full-precision residual window (kivi: the last 32 tokens) is kept exact, as the cache keeps it.

Relative error: ||x - x_hat||_F / ||x||_F.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvviz.analysis.capture import KVCapture, LayerAttention
from kvviz.formats import FORMAT_NAMES, KVSpec, get_format, parse_kv

GRANULARITY_ORDER = ("token", "channel", "head", "tensor")


def relative_error(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """||x - x_hat|| / ||x|| (Frobenius) as a float; 0 for an all-zero x that is reproduced exactly."""
    den = x.float().norm()
    num = (x.float() - x_hat.float()).norm()
    return float(num / den) if den > 0 else float(num > 0)


def _side(which: str) -> str:
    return "v" if which == "values" else "k"


def _roundtrip_layer(cap: KVCapture, kv: KVSpec, which: str, layer: int) -> torch.Tensor:
    """[kv_heads, T, D] float32: the layer's tensor after quantize + dequantize with the pair's K or V format."""
    x = cap.tensor(which)[layer]  # [Hkv, T, D]
    fmt = kv.v if which == "values" else kv.k
    x_hat = fmt.roundtrip(x).float()
    if kv.residual:
        keep = min(kv.residual, x.shape[1])
        x_hat[:, x.shape[1] - keep:] = x[:, x.shape[1] - keep:]
    return x_hat


def error_map(cap: KVCapture, spec: str, layer: int, head: int, which: str = "keys_post") -> np.ndarray:
    """|x - x_hat| for one layer and KV head: [tokens, head_dim] float32 (numpy)."""
    kv = parse_kv(spec)
    x = cap.tensor(which)
    if not (0 <= layer < x.shape[0] and 0 <= head < x.shape[1]):
        raise ValueError(f"layer must be in 0..{x.shape[0] - 1} and head in 0..{x.shape[1] - 1}; "
                         f"got layer {layer}, head {head}.")
    x_hat = _roundtrip_layer(cap, kv, which, layer)
    return (x[layer, head] - x_hat[head]).abs().numpy()


def error_maps(cap: KVCapture, specs: list[str], layer: int, head: int, which: str = "keys_post") -> dict:
    """{spec: error_map(...)} for several specs on the same layer and head."""
    return {spec: error_map(cap, spec, layer, head, which) for spec in specs}


def layer_errors(cap: KVCapture, specs: list[str]) -> dict:
    """Per-layer relative error of post-RoPE K and of V: {spec: {"k": [layers], "v": [layers]}} (numpy)."""
    out = {}
    for spec in specs:
        kv = parse_kv(spec)
        out[spec] = {
            side: np.array([relative_error(cap.tensor(which)[l], _roundtrip_layer(cap, kv, which, l))
                            for l in range(cap.layers)])
            for side, which in (("k", "keys_post"), ("v", "values"))
        }
    return out


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, how: LayerAttention) -> torch.Tensor:
    """Eager attention of one layer as the model computes it: softmax(q k^T * scaling, softcapped, masked, with a
    sink column) v. q: [Hq, T, Dk], k: [Hkv, T, Dk], v: [Hkv, T, Dv] (GQA) -> [Hq, T, Dv]."""
    groups = q.shape[0] // k.shape[0]
    assert groups * k.shape[0] == q.shape[0], f"{q.shape[0]} query heads do not share {k.shape[0]} KV heads evenly"
    k = k.repeat_interleave(groups, dim=0)  # [Hq, T, Dk]
    v = v.repeat_interleave(groups, dim=0)  # [Hq, T, Dv]
    scores = (q @ k.transpose(-1, -2)) * how.scaling  # [Hq, T, T]
    if how.softcap:
        scores = torch.tanh(scores / how.softcap) * how.softcap
    t = q.shape[1]
    allowed = how.mask if how.mask is not None else torch.ones(t, t, dtype=torch.bool).tril()
    scores = scores.masked_fill(~allowed, float("-inf"))
    if how.sinks is not None:  # one extra logit per head that takes probability mass and is dropped
        sink = how.sinks.reshape(-1, 1, 1).expand(-1, t, 1)  # [Hq, T, 1]
        return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1] @ v
    return torch.softmax(scores, dim=-1) @ v  # [Hq, T, Dv]


def attention_errors(cap: KVCapture, specs: list[str]) -> dict:
    """Relative error of each layer's attention output when K and V are quantized, for the prompt's own
    queries (exact Q; each layer's own mask, window, softcap and sinks): {spec: [layers]} (numpy). This is the
    error the next layer sees."""
    exact = [_attention(cap.queries[l], cap.keys_post[l], cap.values[l], cap.attention[l])
             for l in range(cap.layers)]
    out = {}
    for spec in specs:
        kv = parse_kv(spec)
        errs = []
        for l in range(cap.layers):
            k_hat = _roundtrip_layer(cap, kv, "keys_post", l)
            v_hat = _roundtrip_layer(cap, kv, "values", l)
            errs.append(relative_error(exact[l], _attention(cap.queries[l], k_hat, v_hat, cap.attention[l])))
        out[spec] = np.array(errs)
    return out


@dataclass(frozen=True)
class ErrorSummary:
    """One format's errors averaged over the layers: relative error of post-RoPE K and of V as stored, of the
    attention output, and the format's bits per value at the capture's head_dim."""

    spec: str
    k: float
    v: float
    attention: float
    bits_per_value: float


def error_summary(cap: KVCapture, per_layer: dict, attention: dict) -> list[ErrorSummary]:
    """Per spec of per_layer (layer_errors' result) and attention (attention_errors'), in per_layer's order."""
    return [ErrorSummary(spec, float(np.mean(per_layer[spec]["k"])), float(np.mean(per_layer[spec]["v"])),
                         float(np.mean(attention[spec])), parse_kv(spec).bits_per_value(cap.head_dim))
            for spec in per_layer]


def scale_comparison(cap: KVCapture, base: str = "int8", layer: int = 0, head: int = 0,
                     which: str = "keys_post", rot: bool = True) -> dict:
    """One element format under every scale granularity it accepts, on the same layer (lesson 2).

    Returns {spec: {"granularity": str, "rot": bool, "rel_error": float (whole layer), "error_map": [T, D] for
    `head`, "bits_per_value": float}}, ordered token, channel, head, tensor, then the same with /rot when
    rot=True and the width is a power of two. A per-tensor scale is stretched by K's outlier channels; per-token and per-channel scales are not;
    the rotation spreads the outliers out.
    """
    if base not in FORMAT_NAMES:
        raise ValueError(f"Unknown base format {base!r}; choose one of {', '.join(FORMAT_NAMES)}.")
    x = cap.tensor(which)
    d = x.shape[-1]
    rot = rot and d & (d - 1) == 0  # the Hadamard rotation needs a power-of-two width (not MLA's K of 192)
    out = {}
    for use_rot in (False, True) if rot else (False,):
        for gran in GRANULARITY_ORDER:
            spec = f"{base}/{gran}" + ("/rot" if use_rot else "")
            try:
                fmt = get_format(spec)
            except ValueError:
                continue  # this base does not take this granularity (e.g. MX FP4: token blocks only)
            kv = KVSpec(k=fmt, v=fmt, name=fmt.spec)
            x_hat = _roundtrip_layer(cap, kv, which, layer)
            out[fmt.spec] = {
                "granularity": gran,
                "rot": use_rot,
                "rel_error": relative_error(x[layer], x_hat),
                "error_map": (x[layer, head] - x_hat[head]).abs().numpy(),
                "bits_per_value": fmt.bits_per_value(x.shape[-1]),
            }
    return out
