"""Torch references for the kernels: dequantize a `PackedSide` and run decode attention, in float64.

Written for clarity, not speed: every element decodes through a lookup built from torch's own dtypes (fp8 via
`view`, E2M1 from the OCP MX table, E8M0 as 2**(byte - 127)), so the reference shares no code with the kernels.

    x = dequantize_side(side, lengths)                       # [B, Hkv, T, D] float64, T = max(lengths)
    out = decode_attention_reference(q, k, v, lengths)       # [B, Hq, D_v] float64
"""

from __future__ import annotations

import math

import torch

from kernels.packed import IQ4NL_VALUES, PackedSide

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # OCP MX v1.0 FP4 magnitudes by code & 7


def _as_lengths(lengths, batch: int) -> torch.Tensor:
    if isinstance(lengths, int):
        return torch.full((batch,), lengths, dtype=torch.int64)
    return torch.as_tensor(lengths).to(device="cpu", dtype=torch.int64).reshape(batch)


def _per_head(t: torch.Tensor | None, batch: int, heads: int) -> torch.Tensor | None:
    """A per-tensor / per-head scalar as [B, Hkv, 1, 1] float64."""
    if t is None:
        return None
    t = t.detach().to("cpu", torch.float64).reshape(-1)
    if t.numel() == 1:
        t = t.expand(batch * heads)
    elif t.numel() == heads:
        t = t.repeat(batch)
    assert t.numel() == batch * heads, f"tensor scale holds {t.numel()} values; want 1, Hkv or B*Hkv"
    return t.reshape(batch, heads, 1, 1)


def decode_elements(side: PackedSide) -> torch.Tensor:
    """Decode every stored element: [B, Hkv, cap, D] float64 (before scales)."""
    data = side.data.detach().cpu()
    if side.layout == "ggml" and side.bits < 8:
        return _ggml_elements(side, data)
    if side.elem == "float":
        return data.to(torch.float64)
    if side.elem in ("fp8_e4m3", "fp8_e5m2"):
        dtype = torch.float8_e4m3fn if side.elem == "fp8_e4m3" else torch.float8_e5m2
        return data.view(torch.uint8).view(dtype).to(torch.float64)
    bit = torch.arange(8, dtype=torch.int64)
    stream = ((data.to(torch.int64).unsqueeze(-1) >> bit) & 1).flatten(-2)  # [B, Hkv, cap, 8 * bytes], LSB first
    stream = stream[..., : side.head_dim * side.bits].reshape(*data.shape[:-1], side.head_dim, side.bits)
    codes = (stream << torch.arange(side.bits, dtype=torch.int64)).sum(-1)  # [B, Hkv, cap, D]: element e from
    #                                                                          bits e * bits .. of the row's stream
    if side.elem == "int":
        return (codes - side.offset).to(torch.float64)
    if side.elem == "table":
        values = side.values.detach().cpu().to(torch.float64)[codes]
        if side.renorm:
            values = values / torch.sqrt((values * values).sum(-1, keepdim=True) + 1e-16)
        return values
    table = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    mag = table[codes & 7]
    return torch.where((codes & 8) != 0, -mag, mag)


def _ggml_elements(side: PackedSide, data: torch.Tensor) -> torch.Tensor:
    """llama.cpp's 4 / 5-bit blocks, bit by bit: block i of a token is bytes [i * n, (i + 1) * n), n = 4 * bits;
    code j (0..31) = low nibble of qs[j] (j < 16) or high nibble of qs[j - 16], plus 16 * bit j of the
    little-endian qh. Returns [B, Hkv, cap, D] float64 values before d and m."""
    blocks = data.to(torch.int64).reshape(*data.shape[:-1], side.head_dim // 32, 4 * side.bits)  # [..., nb, n]
    qs = blocks[..., -16:]
    qh = sum(blocks[..., i] << (8 * i) for i in range(4))  # uint32 from 4 little-endian bytes (5 bits only)
    codes = torch.empty(*blocks.shape[:-1], 32, dtype=torch.int64)
    for j in range(32):
        codes[..., j] = (qs[..., j % 16] >> (4 * (j // 16))) & 15
        if side.bits == 5:
            codes[..., j] += ((qh >> j) & 1) << 4
    codes = codes.reshape(*data.shape[:-1], side.head_dim)
    if side.elem == "iq4_nl":
        return torch.tensor(IQ4NL_VALUES, dtype=torch.float64)[codes]
    return (codes - side.offset).to(torch.float64)


def decode_scale(scale: torch.Tensor) -> torch.Tensor:
    """Scale tensor to float64: uint8 is E8M0 (2**(b-127), 255 = NaN); float8_e4m3fn and floats cast."""
    scale = scale.detach().cpu()
    if scale.dtype == torch.uint8:
        out = torch.pow(2.0, scale.to(torch.float64) - 127)
        return torch.where(scale == 255, torch.full_like(out, float("nan")), out)
    return scale.to(torch.float64)


def dequantize_side(side: PackedSide, lengths) -> torch.Tensor:
    """Logical tokens 0..max(lengths)-1 of one side: [B, Hkv, T, D] float64 (packed, then tail; zeros past a
    batch row's length)."""
    b, h, cap, _ = side.data.shape
    lengths = _as_lengths(lengths, b)
    t_max = int(lengths.max()) if b else 0
    x = decode_elements(side)  # [B, Hkv, cap, D]
    d = side.head_dim
    if side.zp_bits:  # the zero point in the scale's low bits: (code - zp) * the scale with them cleared
        raw = side.scale.detach().cpu().view(torch.int32)
        zp = (raw & ((1 << side.zp_bits) - 1)).to(torch.float64)
        x = (x - zp.repeat_interleave(side.group_size, dim=-1)[..., :d]) * (raw & -(1 << side.zp_bits)).view(
            torch.float32).to(torch.float64).repeat_interleave(side.group_size, dim=-1)[..., :d]
    elif side.scale_kind == "token":
        s = decode_scale(side.scale).repeat_interleave(side.group_size, dim=-1)[..., :d]  # [B, Hkv, cap, D]
        x = x * s[..., :cap, :]
    elif side.scale_kind == "channel":
        s = decode_scale(side.scale).repeat_interleave(side.group_size, dim=-2)[..., :cap, :]  # [B, Hkv, cap, D]
        x = x * s
    ts = _per_head(side.tensor_scale, b, h)
    if ts is not None:
        x = x * ts
    if side.zero is not None:
        if side.scale_kind == "token":
            x = x + decode_scale(side.zero).repeat_interleave(side.group_size, dim=-1)[..., :cap, :d]
        elif side.scale_kind == "channel":
            x = x + decode_scale(side.zero).repeat_interleave(side.group_size, dim=-2)[..., :cap, :]
        else:
            x = x + _per_head(side.zero, b, h)
    n_packed = lengths if side.n_packed is None else _as_lengths(side.n_packed, b)
    out = torch.zeros(b, h, t_max, d, dtype=torch.float64)
    for i in range(b):
        n, length = int(n_packed[i]), int(lengths[i])
        assert n <= cap, f"n_packed {n} exceeds the packed capacity {cap}"
        take = min(n, length)
        out[i, :, :take] = x[i, :, :take]
        if length > n:
            assert side.tail is not None and side.tail.shape[2] >= length - n, "tokens past n_packed need a tail"
            out[i, :, n:length] = side.tail[i, :, : length - n].detach().cpu().to(torch.float64)
    if side.rotation is not None:
        out = out @ side.rotation.detach().cpu().to(torch.float64)
    if side.qjl is not None:  # TQ-prod's sketch, in its own basis: + s * r * (z @ G) on the packed rows
        sketch = _sketch_term(side)
        for i in range(b):
            take = min(int(n_packed[i]), int(lengths[i]))
            out[i, :, :take] += sketch[i, :, :take]
    return out


def _sketch_term(side: PackedSide) -> torch.Tensor:
    """s * r * (z @ G) of every packed row: [B, Hkv, cap, D] float64 (z = +-1 from the sign bits after the codes)."""
    d = side.head_dim
    start = d * side.bits // 8
    signs = side.data.detach().cpu()[..., start:start + d // 8].to(torch.int64)
    bits = ((signs.unsqueeze(-1) >> torch.arange(8)) & 1).flatten(-2)  # element e: bit e % 8 of byte e // 8
    norms = decode_scale(side.scale)  # [B, Hkv, cap, 2]: s, r
    return norms[..., :1] * norms[..., 1:2] * ((bits * 2 - 1).to(torch.float64) @ side.qjl.detach().cpu().double())


def decode_attention_reference(
    q: torch.Tensor, k: PackedSide, v: PackedSide, lengths, sm_scale: float | None = None,
    kv_mask: torch.Tensor | None = None, *, sinks: torch.Tensor | None = None, softcap: float | None = None,
) -> torch.Tensor:
    """Decode attention in float64, as transformers' eager attention computes it.

    q: [B, Hq, D_k]; k, v: PackedSide with head dims D_k and D_v; kv_mask: optional bool [B, >= max(lengths)],
    True = attend; sinks: optional [Hq], one extra logit per query head that joins the softmax and carries no
    value (gpt-oss); softcap: scores = softcap * tanh(scores / softcap) before the mask (Gemma 2), None / 0 off.
    Returns [B, Hq, D_v] float64 (zeros for a row with no token to attend to)."""
    b, hq, d = q.shape
    hkv = k.data.shape[1]
    assert hq % hkv == 0, f"q heads {hq} must be a multiple of kv heads {hkv}"
    lengths = _as_lengths(lengths, b)
    keys, values = dequantize_side(k, lengths), dequantize_side(v, lengths)  # [B, Hkv, T, D_k], [B, Hkv, T, D_v]
    assert keys.shape[-1] == d, f"K head_dim {keys.shape[-1]} != q head_dim {d}"
    dv = v.head_dim
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    qd = q.detach().cpu().to(torch.float64).view(b, hkv, hq // hkv, d)  # [B, Hkv, G, D_k]
    sink = None if sinks is None else sinks.detach().cpu().to(torch.float64).reshape(hkv, hq // hkv, 1)
    out = torch.zeros(b, hkv, hq // hkv, dv, dtype=torch.float64)
    for i in range(b):
        n = int(lengths[i])
        if n == 0:
            continue
        scores = qd[i] @ keys[i, :, :n].transpose(-1, -2) * scale  # [Hkv, G, n]
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        if kv_mask is not None:
            keep = kv_mask[i, :n].detach().cpu().bool()
            if not bool(keep.any()):
                continue
            scores = scores.masked_fill(~keep, float("-inf"))
        if sink is not None:  # [Hkv, G, n + 1]: the sink's probability is dropped after the softmax
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :n]
        else:
            probs = torch.softmax(scores, dim=-1)
        out[i] = probs @ values[i, :, :n]  # [Hkv, G, D_v]
    return out.view(b, hq, dv)
