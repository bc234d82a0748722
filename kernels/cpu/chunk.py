"""Fused chunk attention on the CPU: a chunk of queries (chunked prefill, teacher forcing) over packed K/V read in
place, without a full-precision copy of the history.

    out = chunk_attention_cpu(q, k, v, length)      # q: [B, Hq, Tq, D_k] -> [B, Hq, Tq, D_v], q's dtype

The queries sit at the last Tq positions of the `length` tokens each side holds (the chunk's own tokens appended
and quantized as the cache stores them), causal bottom-right unless a mask says otherwise. The history is walked in
tiles of `tile` tokens: numba decodes a tile of every (batch row, KV head) into an fp32 buffer
(kernels/cpu/jit/chunk.py, the decode kernel's row decoder: every layout decode_attention_cpu reads), then torch's
GEMM scores the tile against all of its KV head's queries at once (GQA: the G query heads x Tq positions are the
rows of one matrix), and an online softmax (running max m, sum l, accumulator) folds it in. Memory while it runs:
the packed bytes, the two tiles, the [rows, tile] scores of one block of query rows, and the output.

Tiles no query of a block attends to (before a sliding window, after the causal diagonal, left padding) are
neither decoded for that block's scores nor multiplied; a tile every query attends to is not masked. Sinks
(gpt-oss) join the denominator at the end, the softcap (Gemma 2) applies to the tile's scores; Hadamard rotations
as the decode launcher applies them (q H for K, out H^T back for V). TQ-prod's sketch has no chunk branch:
`reads` says no and the caller takes the reference.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kernels.cpu import decode as cpu_decode
from kernels.cpu import meta
from kernels.packed import PackedSide

TILE = 512  # tokens per K/V tile: a [Hkv, 512, 64] fp32 tile is 384 KiB for SmolLM2
ROWS = 1024  # query rows (positions x G) per score block: [Hkv, 1024, 512] fp32 scores are 6 MiB for SmolLM2


def reads(side: PackedSide) -> bool:
    """Whether the chunk path reads a packed side: what the decode kernel reads (cpu_decode.reads), TQ-prod's
    sketch excepted."""
    return side.qjl is None and cpu_decode.reads(side)


def chunk_attention_cpu(
    q: torch.Tensor,
    k: PackedSide,
    v: PackedSide,
    length: int,
    sm_scale: float | None = None,
    *,
    mask: torch.Tensor | None = None,
    start: int = 0,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
    tile: int = TILE,
    rows: int = ROWS,
) -> torch.Tensor:
    """Attention of a chunk of queries over packed K/V, fused on the CPU.

    q:        [B, Hq, Tq, D_k] float CPU tensor (fp32 compute); Hq a multiple of Hkv (q head i reads kv head i // G)
    k, v:     PackedSide (kernels/packed.py), CPU tensors, each holding `length` tokens per row (packed, then tail)
    length:   tokens held; query i sits at position length - Tq + i
    sm_scale: softmax scale, default 1/sqrt(D_k)
    mask:     optional [B or 1, 1, Tq, length - start] (bool, True = attend, or an additive float mask whose
              finite entries attend): transformers' mask, causal, windows and padding included. None: causal
              bottom-right over tokens start..length-1
    start:    leading stored tokens never attended (a QTensor's skip)
    sinks:    optional [Hq] logits that join the softmax denominator with no value (gpt-oss)
    softcap:  optional float > 0: scores = softcap * tanh(scores / softcap) (Gemma 2); None / 0 off
    tile:     tokens per decoded K/V tile (a multiple of 64); rows: query rows (positions x G) per score block
    Returns [B, Hq, Tq, D_v] in q's dtype (zeros for a query that attends to nothing). Without numba, or for a
    side it has no branch for (`reads`), it returns the reference's answer (dequantize, then the same softmax).
    """
    batch, hq, tq, dk = q.shape
    hkv = k.data.shape[1]
    if hq % hkv:
        raise ValueError(f"Query heads ({hq}) must be a multiple of KV heads ({hkv}).")
    if not 0 < tq <= length - start:
        raise ValueError(f"A chunk of {tq} queries needs 1..{length - start} visible tokens; the sides hold {length} "
                         f"({start} skipped).")
    sm_scale = 1.0 / math.sqrt(dk) if sm_scale is None else float(sm_scale)
    visible = _visible(mask, batch, tq, length, start)  # bool [Bm, Tq, length - start]
    jit = cpu_decode._jit()
    if jit is None or not (reads(k) and reads(v)):
        return _reference(q, k, v, length, sm_scale, visible, start, sinks, softcap)
    from kernels.cpu.jit import chunk as jit_chunk

    gqa, dv = hq // hkv, v.head_dim
    lengths = np.full(batch, length, dtype=np.int64)
    k_args = meta.side_args(k, lengths, batch, hkv, dk)
    v_args = meta.side_args(v, lengths, batch, hkv, dv)
    # queries in K's basis and planar order, scaled; rows position-major: row r = (position r // G, head r % G)
    qk = q.detach().float()
    if k.rotation is not None:
        qk = qk @ k.rotation.float().T
    k_pb = meta.codes_per_unit(k)
    if k_pb > 1:
        qk = qk[..., torch.from_numpy(meta.planar_np(dk, k_pb, meta.ggml_nibbles(k)))]
    qk = (qk * sm_scale).reshape(batch, hkv, gqa, tq, dk).transpose(2, 3).reshape(batch * hkv, tq * gqa, dk)
    m = torch.full((batch * hkv, tq * gqa, 1), -math.inf)
    l = torch.zeros((batch * hkv, tq * gqa, 1))
    acc = torch.zeros((batch * hkv, tq * gqa, dv))
    tile = max(64, tile // 64 * 64)
    per_block = max(1, rows // gqa)  # query positions per score block
    kt = torch.empty((batch * hkv, tile, dk))
    vt = torch.empty((batch * hkv, tile, dv))
    scores = torch.empty(batch * hkv * min(tq, per_block) * gqa * tile)  # one block's, contiguous per shape
    cols = length - start
    plan = _plan(visible, per_block, tile)  # per (block, tile): 0 skip, 1 all attend, 2 masked
    for ti, c0 in enumerate(range(0, cols, tile)):
        n = min(tile, cols - c0)
        needed = [qb for qb in range(len(plan)) if plan[qb][ti]]
        if not needed:
            continue
        with cpu_decode._LOCK:
            jit_chunk.decode_rows(*k_args, hkv, start + c0, n, kt.numpy())
            jit_chunk.decode_rows(*v_args, hkv, start + c0, n, vt.numpy())
        kn, vn = kt[:, :n], vt[:, :n]
        for qb in needed:
            p0, p1 = qb * per_block, min(tq, (qb + 1) * per_block)
            r0, r1 = p0 * gqa, p1 * gqa
            s = scores[: batch * hkv * (r1 - r0) * n].view(batch * hkv, r1 - r0, n)
            torch.bmm(qk[:, r0:r1], kn.transpose(1, 2), out=s)
            if softcap:
                s.div_(softcap).tanh_().mul_(softcap)
            if plan[qb][ti] == 2:  # [Bm, P, n] -> over [B, Hkv, P, G, n]
                hidden = ~visible[:, p0:p1, c0:c0 + n]
                s.view(batch, hkv, p1 - p0, gqa, n).masked_fill_(hidden[:, None, :, None], -math.inf)
            _fold(s, vn, m[:, r0:r1], l[:, r0:r1], acc[:, r0:r1])
    if sinks is not None:
        sink = sinks.detach().float().reshape(1, hkv, 1, gqa).expand(batch, hkv, tq, gqa).reshape(batch * hkv, -1, 1)
        top = torch.maximum(m, sink)
        alpha = torch.exp(m - top)
        l = l * alpha + torch.exp(sink - top)
        acc = acc * alpha
    out = acc / torch.where(l > 0, l, torch.ones_like(l))  # l = 0: no token attended, out stays 0
    out = out.reshape(batch, hkv, tq, gqa, dv).transpose(2, 3).reshape(batch, hq, tq, dv)
    v_pb = meta.codes_per_unit(v)
    if v_pb > 1:  # back from V's planar order
        out = out[..., torch.from_numpy(meta.unplanar_np(dv, v_pb, meta.ggml_nibbles(v)))]
    if v.rotation is not None:
        out = out @ v.rotation.float()
    return out.to(q.dtype)


def _fold(s: torch.Tensor, vt: torch.Tensor, m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> None:
    """One tile into the online softmax, in place: s [BH, R, n] scores (-inf: hidden; becomes the weights),
    vt [BH, n, Dv], m / l [BH, R, 1] the running max and sum, acc [BH, R, Dv]."""
    top = torch.maximum(m, s.amax(-1, keepdim=True))
    safe = top.masked_fill(top == -math.inf, 0.0)  # a row with nothing attended yet: exp(-inf - 0) = 0, not NaN
    s.sub_(safe).exp_()
    alpha = (m - safe).exp_()
    l.mul_(alpha).add_(s.sum(-1, keepdim=True))
    acc.mul_(alpha).baddbmm_(s, vt)
    m.copy_(top)


def _visible(mask: torch.Tensor | None, batch: int, tq: int, length: int, start: int) -> torch.Tensor:
    """bool [B or 1, Tq, length - start], True = query i attends to visible token c (stored token start + c)."""
    cols = length - start
    if mask is None:
        pos = torch.arange(cols - tq, cols)[:, None]  # query i at visible position cols - tq + i
        return (torch.arange(cols)[None, :] <= pos)[None]
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != tq or mask.shape[3] != cols or mask.shape[0] not in (1, batch):
        raise ValueError(f"mask must be [B or 1, 1, Tq, visible tokens] = [{batch} or 1, 1, {tq}, {cols}]; got "
                         f"{tuple(mask.shape)}.")
    if mask.dtype != torch.bool:  # additive: finite entries attend (transformers' min-value fill hides)
        mask = mask > torch.finfo(mask.dtype).min / 2
    return mask[:, 0]


def _plan(visible: torch.Tensor, per_block: int, tile: int) -> list[list[int]]:
    """Per (block of query positions, tile of tokens): 0 no query attends to any token (skipped), 1 every query to
    every token (no mask), 2 some (masked)."""
    bm, tq, cols = visible.shape
    nq, nt = -(-tq // per_block), -(-cols // tile)
    flags = []
    for pad in (False, True):  # padding that neither makes a block attended nor keeps it from being whole
        padded = torch.full((bm, nq * per_block, nt * tile), pad, dtype=torch.bool)
        padded[:, :tq, :cols] = visible
        blocks = padded.view(bm, nq, per_block, nt, tile).transpose(0, 1).reshape(nq, bm * per_block, nt, tile)
        flags.append(blocks.any(dim=3).any(dim=1) if not pad else blocks.all(dim=3).all(dim=1))
    some, full = flags
    return (2 * some.to(torch.int64) - (some & full).to(torch.int64)).tolist()  # 0, 1 (whole) or 2


def _reference(q, k, v, length, sm_scale, visible, start, sinks, softcap) -> torch.Tensor:
    """The unfused answer: both sides dequantized (kernels/reference.py, float64), then the same masked softmax."""
    from kernels.reference import dequantize_side

    batch, hq, tq, _ = q.shape
    kx = dequantize_side(k, length)[:, :, start:]
    vx = dequantize_side(v, length)[:, :, start:]
    gqa = hq // kx.shape[1]
    kx, vx = kx.repeat_interleave(gqa, 1), vx.repeat_interleave(gqa, 1)
    s = (q.double() @ kx.transpose(-1, -2)) * sm_scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~visible[:, None], -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.double().reshape(1, hq, 1, 1).expand(batch, hq, tq, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., : vx.shape[2]].nan_to_num(0.0)
    return (p @ vx).to(q.dtype)
