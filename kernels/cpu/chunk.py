"""Fused chunk attention on the CPU: a chunk of queries (chunked prefill, teacher forcing) over packed K/V read in
place, without a full-precision copy of the history.

    out = chunk_attention_cpu(q, k, v, length)      # q: [B, Hq, Tq, D_k] -> [B, Hq, Tq, D_v], q's dtype

The queries sit at the last Tq positions of the `length` tokens each side holds (the chunk's own tokens appended
and quantized as the cache stores them), causal bottom-right unless a mask says otherwise. The history is walked in
tiles of `tile` tokens: numba decodes a tile of every (batch row, KV head) into an fp32 buffer
(kernels/cpu/jit/chunk.py, the decode kernel's row decoder: every layout decode_attention_cpu reads), then torch's
CPU flash attention (the kernel behind SDPA, which returns each row's log-sum-exp too) attends all of the KV head's
queries to the tile at once (GQA: the G query heads x Tq positions are the rows of one matrix), and the tiles'
outputs merge exactly by their log-sum-exps. With a softcap, or a torch without that op, torch's bmm scores the tile
and an online softmax (running max, sum, accumulator) folds it in. Memory while it runs: the packed bytes, the two
tiles, one block's mask (or bmm scores), and the output.

Tiles no query of a block attends to (before a sliding window, after the causal diagonal, left padding) are
neither decoded for that block nor attended; a tile every query attends to is not masked. Sinks
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
from kernels.reference import dequantize_side

TILE = 1024  # tokens per K/V tile: a [Hkv, 1024, 64] fp32 tile is 768 KiB for SmolLM2
ROWS = 2048  # query rows (positions x G) per block: the bmm path's [Hkv, 2048, 1024] fp32 scores are 24 MiB there
# torch's CPU flash attention, which returns each row's log-sum-exp with its output, so that tiles merge exactly;
# a private op: where this torch lacks it, the scores go through bmm and the softmax below
_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


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
    # queries in K's basis and planar order; rows position-major: row r = (position r // G, head r % G)
    qk = q.detach().float()
    if k.rotation is not None:
        qk = qk @ k.rotation.float().T
    k_pb = meta.codes_per_unit(k)
    if k_pb > 1:
        qk = qk[..., torch.from_numpy(meta.planar_np(dk, k_pb, meta.ggml_nibbles(k)))]
    qk = qk.reshape(batch, hkv, gqa, tq, dk).transpose(2, 3).reshape(batch, hkv, tq * gqa, dk)
    flash = _FLASH is not None and not softcap
    if not flash:  # scores by bmm: scaled once here
        qk = qk * sm_scale
    o = torch.zeros((batch, hkv, tq * gqa, dv))  # the running output (flash) or accumulator (bmm)
    lse = torch.full((batch, hkv, tq * gqa, 1), -math.inf)  # log-sum-exp (flash) or running max (bmm)
    l = torch.zeros((batch * hkv, tq * gqa, 1))  # the bmm path's running sum
    tile = max(64, tile // 64 * 64)
    per_block = max(1, rows // gqa)  # query positions per block
    kt = torch.empty((batch, hkv, tile, dk))
    vt = torch.empty((batch, hkv, tile, dv))
    scores = None if flash else torch.empty(batch * hkv * min(tq, per_block) * gqa * tile)  # one block's
    cols = length - start
    plan = _plan(visible, per_block, tile)  # per (block, tile): 0 skip, 1 all attend, 2 masked
    for ti, c0 in enumerate(range(0, cols, tile)):
        n = min(tile, cols - c0)
        needed = [qb for qb in range(len(plan)) if plan[qb][ti]]
        if not needed:
            continue
        with cpu_decode._LOCK:
            jit_chunk.decode_rows(*k_args, hkv, start + c0, n, kt.view(batch * hkv, tile, dk).numpy())
            jit_chunk.decode_rows(*v_args, hkv, start + c0, n, vt.view(batch * hkv, tile, dv).numpy())
        kn, vn = kt[:, :, :n], vt[:, :, :n]
        for qb in needed:
            p0, p1 = qb * per_block, min(tq, (qb + 1) * per_block)
            r0, r1 = p0 * gqa, p1 * gqa
            shown = visible[:, p0:p1, c0:c0 + n] if plan[qb][ti] == 2 else None  # [Bm, P, n]
            if flash:
                _flash_block(qk[:, :, r0:r1], kn, vn, sm_scale, shown, gqa, o[:, :, r0:r1], lse[:, :, r0:r1])
                continue
            rb = (r1 - r0)
            s = scores[: batch * hkv * rb * n].view(batch * hkv, rb, n)
            torch.bmm(qk[:, :, r0:r1].reshape(batch * hkv, rb, dk), kn.reshape(batch * hkv, n, dk).transpose(1, 2),
                      out=s)
            s.div_(softcap).tanh_().mul_(softcap) if softcap else None
            if shown is not None:  # [Bm, P, n] -> over [B, Hkv, P, G, n]
                s.view(batch, hkv, p1 - p0, gqa, n).masked_fill_(~shown[:, None, :, None], -math.inf)
            _fold(s, vn.reshape(batch * hkv, n, dv), lse.view(batch * hkv, -1, 1)[:, r0:r1], l[:, r0:r1],
                  o.view(batch * hkv, -1, dv)[:, r0:r1], shown is None)
    if not flash:  # (max, sum, accumulator) -> (output, log-sum-exp); l = 0: nothing attended, output 0
        l = l.view(batch, hkv, -1, 1)
        o = o / torch.where(l > 0, l, torch.ones_like(l))
        lse = lse + torch.log(l)
    if sinks is not None:  # a sink adds exp(sink) to the denominator: out * exp(lse - logaddexp(lse, sink))
        sink = sinks.detach().float().reshape(1, hkv, 1, gqa).expand(batch, hkv, tq, gqa).reshape(batch, hkv, -1, 1)
        o = o * torch.exp(lse - torch.logaddexp(lse, sink))
    out = o
    out = out.reshape(batch, hkv, tq, gqa, dv).transpose(2, 3).reshape(batch, hq, tq, dv)
    v_pb = meta.codes_per_unit(v)
    if v_pb > 1:  # back from V's planar order
        out = out[..., torch.from_numpy(meta.unplanar_np(dv, v_pb, meta.ggml_nibbles(v)))]
    if v.rotation is not None:
        out = out @ v.rotation.float()
    return out.to(q.dtype)


def _flash_block(qb: torch.Tensor, kn: torch.Tensor, vn: torch.Tensor, sm_scale: float, shown: torch.Tensor | None,
                 gqa: int, o: torch.Tensor, lse: torch.Tensor) -> None:
    """One (query block, tile) by torch's CPU flash attention, merged into the running (o, lse) in place by their
    log-sum-exps. qb [B, Hkv, R, D_k] (R = positions x G), kn / vn [B, Hkv, n, D]; shown: None (every row attends
    to every token) or bool [Bm, R / G, n]; o [B, Hkv, R, D_v], lse [B, Hkv, R, 1]."""
    bias = None
    if shown is not None:  # an additive mask of query's dtype (the kernel takes no bool), one row per (position, head)
        rows = shown.repeat_interleave(gqa, dim=1)  # [Bm, R, n]
        bias = torch.zeros(rows.shape).masked_fill_(~rows, -math.inf)[:, None]
    out, part = _FLASH(qb, kn, vn, 0.0, False, attn_mask=bias, scale=sm_scale)
    part = part.unsqueeze(-1)  # [B, Hkv, R, 1]
    if shown is not None:  # a row that attends to nothing here: the kernel says lse 0, output 0
        part = part.masked_fill(~rows.any(-1)[:, None, :, None], -math.inf)
    total = torch.logaddexp(lse, part)
    safe = total.masked_fill(total == -math.inf, 0.0)  # nothing attended yet: exp(-inf - 0) = 0, not NaN
    o.mul_(torch.exp(lse - safe)).add_(out * torch.exp(part - safe))
    lse.copy_(total)


def _fold(s: torch.Tensor, vt: torch.Tensor, m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor,
          whole: bool) -> None:
    """One tile into the online softmax, in place: s [BH, R, n] scores (-inf: hidden; becomes the weights),
    vt [BH, n, Dv], m / l [BH, R, 1] the running max and sum, acc [BH, R, Dv]. whole: every row attends to every
    token of the tile, so every row's max is finite."""
    top = torch.maximum(m, s.amax(-1, keepdim=True))
    # a row with nothing attended yet: exp(-inf - 0) = 0, not NaN
    safe = top if whole else top.masked_fill(top == -math.inf, 0.0)
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
    every token (no mask), 2 some (masked). Reduced over the block's rows first, then over each tile's columns."""
    bm, tq, cols = visible.shape
    nq, nt = -(-tq // per_block), -(-cols // tile)
    some = torch.zeros((nq, nt * tile), dtype=torch.bool)  # padding columns: never attended, never whole
    full = torch.zeros((nq, nt * tile), dtype=torch.bool)
    for qb in range(nq):
        rows = visible[:, qb * per_block:(qb + 1) * per_block]
        some[qb, :cols] = rows.any(dim=1).any(dim=0)
        full[qb, :cols] = rows.all(dim=1).all(dim=0)
    some = some.view(nq, nt, tile).any(dim=2)
    full = full.view(nq, nt, tile)
    full = full.all(dim=2) | _ragged_whole(full, cols, tile)
    return (2 * some.to(torch.int64) - (some & full).to(torch.int64)).tolist()  # 0, 1 (whole) or 2


def _ragged_whole(full: torch.Tensor, cols: int, tile: int) -> torch.Tensor:
    """[nq, nt]: True for the last tile when its real columns (cols - (nt - 1) * tile of them) are all whole."""
    nq, nt, _ = full.shape
    out = torch.zeros((nq, nt), dtype=torch.bool)
    rest = cols - (nt - 1) * tile
    out[:, -1] = full[:, -1, :rest].all(dim=1)
    return out


def _reference(q, k, v, length, sm_scale, visible, start, sinks, softcap) -> torch.Tensor:
    """The unfused answer: both sides dequantized (kernels/reference.py, float64), then the same masked softmax."""
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
