"""numba code of the fused CPU chunk attention: packed K or V rows of a token range into an fp32 tile; the launcher
is kernels/cpu/chunk.py, which multiplies the tiles with torch's GEMM under an online softmax.

A chunk of Tq queries against T stored tokens costs Hq * Tq * T * D multiply-adds twice, which BLAS does several
times faster than scalar numba loops; what numba does well is turning packed rows back into floats. So each call
decodes tokens t0..t0+n-1 of every (batch row, KV head) through the decode kernel's row decoder
(rows.py's _decode_block: every element kind, group, token, tensor and channel scales, zero points, llama.cpp's
blocks, the full-precision tail past n_packed), BLOCK rows per work item, in the decode kernel's planar order.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from kernels.cpu.jit.contract import BLOCK
from kernels.cpu.jit.fields import _OPTS
from kernels.cpu.jit.rows import _decode_block


@nb.njit(**_OPTS)
def _tile_unit(u, blocks, n_kv, t0, n, meta, data, lut, scale, zero, slut, ts, tz, tail, npk, out):
    """Work item u = (batch row b, KV head h, block): tokens t0 + [j0, j0 + BLOCK) of (b, h) into out[b * n_kv + h].
    Kept out of the prange body: numba compiles a parfor body without the fastmath flags."""
    bh = u // blocks
    j0 = (u - bh * blocks) * BLOCK
    m = min(BLOCK, n - j0)
    b = bh // n_kv
    h = bh - b * n_kv
    live = np.ones(BLOCK, np.bool_)
    _decode_block(meta, data, lut, scale, zero, slut, ts[bh], tz[bh], tail, npk[b], b, h, t0 + j0, m, live,
                  out[bh, j0:j0 + m])


@nb.njit(parallel=True, **_OPTS)
def decode_rows(meta, data, lut, scale, zero, slut, ts, tz, tail, npk, n_kv, t0, n, out):
    """out[b * n_kv + h, j, :D] = token t0 + j of (batch row b, KV head h), dequantized to fp32 in planar order, for
    j < n (out: [B * Hkv, >= n, D] f32, C-contiguous). The side's arguments are kernels/cpu/meta.py's side_args;
    npk: [B] int64 packed tokens per row (later tokens come from the tail)."""
    blocks = (n + BLOCK - 1) // BLOCK
    for u in nb.prange(out.shape[0] * blocks):
        _tile_unit(u, blocks, n_kv, t0, n, meta, data, lut, scale, zero, slut, ts, tz, tail, npk, out)
