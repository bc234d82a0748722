"""numba code of the fused CPU decode attention; the launcher is kernels/cpu/decode.py (it imports
this lazily).

Every packed buffer arrives as the flat uint8 view of its whole storage plus a byte offset and byte strides, so one
compiled signature serves every format and every capacity-strided view, and nothing is copied. Per (batch row,
KV head, token split) one thread walks the tokens in blocks of `BLOCK` (online softmax, as flash-decoding does):

    tile[t, :] = dequantize(K codes of token t)            # one block of rows: the only dequantized K/V held
    s[g, t]    = (q[g] . tile[t]) * sm_scale               # G = query heads sharing the KV head (GQA)
    m, l, acc  <- online softmax of s, then acc[g] += p[g, t] * dequantize(V codes of token t)

The work is split by concept: fields.py reads stored bytes (codes, halves, scales), rows.py dequantizes row by row
(tails, masks, float casts, llama.cpp's blocks), flat.py unpacks whole blocks of packed rows and folds their scales
into the scores; this module holds the online softmax and the entry points the launcher calls.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from kernels.cpu.jit.contract import BLOCK, M_DIM, M_GROUP, M_QJL, M_SKIND, S_CHANNEL
from kernels.cpu.jit.fields import _OPTS, _as_f32, _channel_row
from kernels.cpu.jit.rows import _decode_block
from kernels.cpu.jit.flat import _flat_accumulate, _flat_block, _flat_kind, _flat_scores, _flat_shape
from kernels.cpu.jit.sketch import sketch_accumulate, sketch_scores


@nb.njit(inline="always", **_OPTS)
def _exp(x):
    """exp(x) in fp32 for x <= 0 (softmax weights), as plain arithmetic that LLVM vectorizes (libm's expf does not):
    2**k * e**f with k = round(x / ln 2), |f| <= ln(2) / 2, e**f by its degree-6 Taylor polynomial (relative error
    below 3e-7). x < -87 gives about 1e-38, not 0: callers zero masked weights themselves; x > 0 is taken as 0.
    Only int32 conversions (k = trunc(x / ln 2 - 1/2), i.e. x / ln 2 rounded for x <= 0): AVX2 has no vector
    float -> int64 conversion, which math.floor would need."""
    x = min(max(x, np.float32(-87.0)), np.float32(0.0))
    ki = np.int32(x * np.float32(1.4426950408889634) - np.float32(0.5))  # 1/ln(2)
    f = x - np.float32(ki) * np.float32(0.6931471805599453)  # ln(2)
    p = np.float32(1.0) + f * (np.float32(1.0) + f * (np.float32(0.5) + f * (np.float32(1.0 / 6) + f * (
        np.float32(1.0 / 24) + f * (np.float32(1.0 / 120) + f * np.float32(1.0 / 720))))))
    return p * _as_f32((ki + np.int32(127)) << np.int32(23))


@nb.njit(**_OPTS)
def _attend(q, mask, has_mask, sm, cap, b, h, bh, start, stop,
            km, kdata, klut, kscale, kzero, kslut, kts, ktz, ktail, kn,
            vm, vdata, vlut, vscale, vzero, vslut, vts, vtz, vtail, vn,
            m, l, acc):
    """Online softmax over tokens start..stop-1 of (b, kv head h) for its G query heads q: [G, Dk] (planar).
    m, l: [G], acc: [G, Dv] f32, updated in place. Kept out of the prange body: numba compiles a parfor body
    without the fastmath flags, and the dot products then stop vectorizing.

    GQA: each K / V row is dequantized once into the block's tile and read by all G query heads while it is in
    L1; the loops run token-outer, head-inner for that reason. No array views inside the loops: each view costs
    numba two atomic reference-count calls."""
    gqa = q.shape[0]
    dk, dv = km[M_DIM], vm[M_DIM]  # a TQ-prod side adds D columns: q @ G^T after q, the sketch's sums after acc
    kq, vq = km[M_QJL] != 0, vm[M_QJL] != 0
    q = np.ascontiguousarray(q)  # a C-contiguous copy: with strided q loads the dot products stay scalar
    zq = np.empty((BLOCK, max(dk, dv)) if kq or vq else (1, 1), np.float32)  # a block's signs, +-1
    nq = np.empty((BLOCK, 2), np.float32)  # its rows' (s, r)
    ktile = np.empty((BLOCK, dk), np.float32)  # 16 KiB at D = 64: the only dequantized K held
    vtile = np.empty((BLOCK, dv), np.float32)  # rows of masked tokens: scores set to -inf, V rows zeroed
    s = np.empty((gqa, BLOCK), np.float32)  # scores, then softmax weights
    live = np.ones(BLOCK, np.bool_)
    kts_, ktz_, vts_, vtz_ = kts[bh], ktz[bh], vts[bh], vtz[bh]
    kn_, vn_ = kn[b], vn[b]
    # The flat path (_flat_block): blocks of packed, live rows of a side whose format allows it
    kflat, vflat = _flat_kind(km), _flat_kind(vm)
    kpb, knb, kgroups = _flat_shape(km)
    vpb, vnb, vgroups = _flat_shape(vm)
    kraw = np.empty((kpb, BLOCK * knb), np.float32)
    vraw = np.empty((vpb, BLOCK * vnb), np.float32)
    kgs = np.empty(BLOCK * kgroups, np.float32)  # group scales, flat; kgsc: the same memory [BLOCK, groups]
    kgz = np.empty(BLOCK * kgroups, np.float32)
    vgs = np.empty(BLOCK * vgroups, np.float32)
    vgz = np.empty(BLOCK * vgroups, np.float32)
    kgsc, kgzc = kgs.reshape(BLOCK, kgroups), kgz.reshape(BLOCK, kgroups)  # once here, not per block
    vgsc, vgzc = vgs.reshape(BLOCK, vgroups), vgz.reshape(BLOCK, vgroups)
    ksc = np.empty(BLOCK, np.float32)
    kzc = np.empty(BLOCK, np.float32)
    vsc = np.empty(BLOCK, np.float32)
    vzc = np.empty(BLOCK, np.float32)
    ones = np.ones(BLOCK, np.float32)  # the row-by-row path's tiles: one field of unit scale
    zeros = np.zeros(BLOCK, np.float32)
    bias = np.zeros(gqa, np.float32)  # V's offsets, weighted: added to acc at the end
    qsum = np.zeros(gqa, np.float32)  # q summed over K's channels
    for g in range(gqa):
        for i in range(dk):
            qsum[g] += q[g, i]
    # Constants passed as typed values, not literals: numba compiles a callee once per literal argument value, and
    # the row-by-row tiles need no specialization of their own (compile time, not speed)
    _ZERO, _ONE = np.int64(0), np.int64(1)
    kchan = km[M_SKIND] == S_CHANNEL
    kgroup = km[M_GROUP]
    qc = np.empty((gqa, dk), np.float32)  # KIVI's K: q times a scale row
    qz = np.empty(gqa, np.float32)
    ktile1 = ktile.reshape(1, BLOCK * dk)
    vtile1 = vtile.reshape(1, BLOCK * dv)
    for t0 in range(start, stop, BLOCK):
        n = min(BLOCK, stop - t0)
        n_live = n
        if has_mask:
            n_live = 0
            for j in range(n):
                live[j] = mask[b, t0 + j] != 0
                n_live += live[j]
            if n_live == 0:  # a block wholly outside the window / left padding: its bytes are never read
                continue
        kf = kflat and n_live == n and t0 + n <= kn_
        vf = vflat and n_live == n and t0 + n <= vn_
        if kf:
            _flat_block(km, kdata, klut, kscale, kzero, kslut, kts_, ktz_, b, h, t0, n, kraw, kgsc, kgzc, kgs, kgz,
                        ksc, kzc, False)
        else:
            _decode_block(km, kdata, klut, kscale, kzero, kslut, kts_, ktz_, ktail, kn_, b, h, t0, n, live, ktile)
        if vf:
            _flat_block(vm, vdata, vlut, vscale, vzero, vslut, vts_, vtz_, b, h, t0, n, vraw, vgsc, vgzc, vgs, vgz,
                        vsc, vzc, True)
        else:
            _decode_block(vm, vdata, vlut, vscale, vzero, vslut, vts_, vtz_, vtail, vn_, b, h, t0, n, live, vtile)
        if n_live < n:  # V rows of masked tokens were not decoded: zero them, so that 0 * row adds exactly 0
            for j in range(n):
                if not live[j]:
                    for i in range(dv):
                        vtile[j, i] = 0.0
        if kf and kchan:  # KIVI's K: each run of rows sharing a scale row scores against q * scales, + q . zeros
            j0 = 0
            while j0 < n:
                row = (t0 + j0) // kgroup
                j1 = min(n, (row + 1) * kgroup - t0)
                _channel_row(km, kscale, kzero, kslut, kts_, b, h, row, kgsc, kgzc)
                for g in range(gqa):
                    qz[g] = 0.0
                    for p in range(kpb):
                        for i in range(knb):
                            qc[g, p * knb + i] = q[g, p * knb + i] * kgsc[p, i]
                            qz[g] += q[g, p * knb + i] * kgzc[p, i]
                _flat_scores(qc, qz, kraw, ones, ones, knb, kpb, j0, j1, sm, s)
                j0 = j1
        elif kf:
            _flat_scores(q, qsum, kraw, ksc, kzc, knb, kpb, 0, n, sm, s)
        else:
            _flat_scores(q, qsum, ktile1, ones, zeros, dk, _ONE, _ZERO, n, sm, s)
        if kq:
            sketch_scores(km, kdata, kscale, kslut, b, h, t0, n, kn_, q, sm, zq, nq, s)
        if cap > 0:
            for g in range(gqa):
                for j in range(n):
                    s[g, j] = np.float32(cap * math.tanh(s[g, j] / cap))
        for g in range(gqa):
            if n_live < n:
                for j in range(n):
                    if not live[j]:
                        s[g, j] = -np.inf
            mx = m[g]
            for j in range(n):
                mx = max(mx, s[g, j])
            alpha = _exp(m[g] - mx) if m[g] > -np.inf else np.float32(0.0)
            m[g] = mx
            lsum = np.float32(0.0)
            for j in range(n):
                p = _exp(s[g, j] - mx)
                s[g, j] = p
                lsum += p
            if n_live < n:  # masked tokens weigh exactly 0
                for j in range(n):
                    if not live[j]:
                        lsum -= s[g, j]
                        s[g, j] = np.float32(0.0)
            l[g] = l[g] * alpha + lsum
            for i in range(acc.shape[1]):
                acc[g, i] *= alpha
            bias[g] *= alpha
        if vq:
            sketch_accumulate(vm, vdata, vscale, vslut, b, h, t0, n, vn_, s, zq, nq, acc)
        if vf:
            _flat_accumulate(s, vraw, vsc, vzc, vnb, vpb, n, acc, bias)
        else:
            _flat_accumulate(s, vtile1, ones, zeros, dv, _ONE, n, acc, bias)
    for g in range(gqa):  # the flat blocks' V offsets, once per channel
        for i in range(dv):
            acc[g, i] += bias[g]


@nb.njit(**_OPTS)
def _unit(u, q, lengths, mask, has_mask, sm, cap, n_kv, splits, per_split,
          km, kdata, klut, kscale, kzero, kslut, kts, ktz, ktail, kn,
          vm, vdata, vlut, vscale, vzero, vslut, vts, vtz, vtail, vn,
          mid_m, mid_l, mid_acc):
    """Work item u = (b, kv head, split) of stage 1: its partial softmax state into mid_*[u]."""
    gqa = q.shape[1] // n_kv
    bh = u // splits
    b = bh // n_kv
    h = bh - b * n_kv
    start = (u - bh * splits) * per_split
    stop = min(lengths[b], start + per_split)
    mid_m[u, :] = -np.inf
    mid_l[u, :] = 0.0
    mid_acc[u, :, :] = 0.0
    _attend(q[b, h * gqa:(h + 1) * gqa], mask, has_mask, sm, cap, b, h, bh, start, stop,
            km, kdata, klut, kscale, kzero, kslut, kts, ktz, ktail, kn,
            vm, vdata, vlut, vscale, vzero, vslut, vts, vtz, vtail, vn,
            mid_m[u], mid_l[u], mid_acc[u])


@nb.njit(parallel=True, **_OPTS)
def decode_partials(q, lengths, mask, has_mask, sm_scale, softcap, n_kv, splits, per_split,
                    km, kdata, klut, kscale, kzero, kslut, kts, ktz, ktail, kn,
                    vm, vdata, vlut, vscale, vzero, vslut, vts, vtz, vtail, vn,
                    mid_m, mid_l, mid_acc):
    """Stage 1: partial softmax state of each (b, kv head, split), one parallel work item each.

    q: [B, Hq, Dk] f32 in K's planar order; lengths: [B] int64; mask: [B, L] uint8 (read when has_mask);
    kn / vn: [B] int64 packed tokens per side. Writes mid_m, mid_l: [B * Hkv * splits, G] f32 (m = -inf: no
    token) and mid_acc: [B * Hkv * splits, G, Dv] f32 in V's planar order.
    """
    sm = np.float32(sm_scale)  # every value stays fp32: a float64 would make numba widen the dot products
    cap = np.float32(softcap)
    for u in nb.prange(q.shape[0] * n_kv * splits):
        _unit(u, q, lengths, mask, has_mask, sm, cap, n_kv, splits, per_split,
              km, kdata, klut, kscale, kzero, kslut, kts, ktz, ktail, kn,
              vm, vdata, vlut, vscale, vzero, vslut, vts, vtz, vtail, vn, mid_m, mid_l, mid_acc)


@nb.njit(**_OPTS)
def decode_partials_serial(q, lengths, mask, has_mask, sm_scale, softcap, n_kv, splits, per_split,
                           km, kdata, klut, kscale, kzero, kslut, kts, ktz, ktail, kn,
                           vm, vdata, vlut, vscale, vzero, vslut, vts, vtz, vtail, vn,
                           mid_m, mid_l, mid_acc):
    """decode_partials on the calling thread: for small work, where waking the thread pool costs more than the
    work (and, on a busy machine, waits for a descheduled worker)."""
    sm = np.float32(sm_scale)
    cap = np.float32(softcap)
    for u in range(q.shape[0] * n_kv * splits):
        _unit(u, q, lengths, mask, has_mask, sm, cap, n_kv, splits, per_split,
              km, kdata, klut, kscale, kzero, kslut, kts, ktz, ktail, kn,
              vm, vdata, vlut, vscale, vzero, vslut, vts, vtz, vtail, vn, mid_m, mid_l, mid_acc)


@nb.njit(**_OPTS)
def combine(mid_m, mid_l, mid_acc, sinks, has_sinks, n_kv, splits, out):
    """Stage 2: merge the splits of each (b, kv head) and normalize. out: [B, Hq, Dv] f32 (zeros where no token
    was attended to). A sink adds exp(sink - m) to the denominator and nothing to the numerator."""
    batch, hq, dv = out.shape
    gqa = hq // n_kv
    for bh in range(batch * n_kv):
        b = bh // n_kv
        h = bh - b * n_kv
        for g in range(gqa):
            mx = -np.inf
            for sp in range(splits):
                mx = max(mx, mid_m[bh * splits + sp, g])
            if mx == -np.inf:
                for i in range(dv):
                    out[b, h * gqa + g, i] = 0.0
                continue
            if has_sinks:
                mx = max(mx, sinks[h * gqa + g])
            denom = math.exp(sinks[h * gqa + g] - mx) if has_sinks else 0.0
            for i in range(dv):
                out[b, h * gqa + g, i] = 0.0
            for sp in range(splits):
                u = bh * splits + sp
                if mid_m[u, g] == -np.inf:
                    continue
                w = math.exp(mid_m[u, g] - mx)
                denom += w * mid_l[u, g]
                for i in range(dv):
                    out[b, h * gqa + g, i] += w * mid_acc[u, g, i]
            for i in range(dv):
                out[b, h * gqa + g, i] /= denom
