"""TQ-prod's 1-bit sketch of each key's and value's residual in the fused CPU decode (numba).

A TQ-prod row reads x = (c[code] * s) @ R^T + s * r * (z @ G) (kernels/packed.py, `qjl`): the codebook part goes
through the ordinary paths (rows.py, flat.py) in R's basis; this module adds the sketch part in G's. Keys: the
launcher hands q @ G^T beside the query, and each packed row's score gains s * r * (q @ G^T) . z. Values: each
weighted row's s * r * z goes into D more accumulator columns, which the launcher turns by G once per step. The sign
bits follow the codes in the data row (meta's M_QJL: their byte offset), r follows s in the token scale.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from kernels.cpu.jit.contract import (
    M_DIM, M_D_OFF, M_D_SB, M_D_SH, M_D_ST, M_QJL, M_SDT, M_S_OFF, M_S_SB, M_S_SH, M_S_ST,
)
from kernels.cpu.jit.fields import _OPTS, _floats, _width


@nb.njit(**_OPTS)
def _rows(meta, data, scale, slut, b, h, t0, n, n_packed, z, norms):
    """The block's packed rows t0 .. t0 + m - 1 (m = min(n, n_packed - t0), returned; the tail has no sketch):
    z[j, e] = +1 / -1 from bit e % 8 of sign byte e // 8; norms[j] = (s, r)."""
    n = min(n, n_packed - t0)
    if n <= 0:
        return 0
    d = meta[M_DIM]
    sdt = meta[M_SDT]
    st = meta[M_S_ST]
    _floats(scale, meta[M_S_OFF] + b * meta[M_S_SB] + h * meta[M_S_SH] + t0 * st, st, _width(sdt), sdt, slut,
            n, 2, norms)
    dst = meta[M_D_ST]
    base = meta[M_D_OFF] + b * meta[M_D_SB] + h * meta[M_D_SH] + t0 * dst + meta[M_QJL]
    for j in range(n):
        o = base + j * dst
        for k in range(d // 8):
            byte = np.int32(data[o + k])
            for bit in range(8):
                z[j, 8 * k + bit] = np.float32(((byte >> bit) & 1) * 2 - 1)
    return n


@nb.njit(**_OPTS)
def sketch_scores(meta, data, scale, slut, b, h, t0, n, n_packed, q, sm, z, norms, s):
    """s[g, j] += sm * s_j * r_j * (q[g, D:2D] . z_j) for the block's packed rows (q's second half: q @ G^T)."""
    n = _rows(meta, data, scale, slut, b, h, t0, n, n_packed, z, norms)
    d = meta[M_DIM]
    for g in range(q.shape[0]):
        for j in range(n):
            dot = np.float32(0.0)
            for i in range(d):
                dot += q[g, d + i] * z[j, i]
            s[g, j] += sm * norms[j, 0] * norms[j, 1] * dot


@nb.njit(**_OPTS)
def sketch_accumulate(meta, data, scale, slut, b, h, t0, n, n_packed, p, z, norms, acc):
    """acc[g, D + i] += p[g, j] * s_j * r_j * z_j[i] for the block's packed rows (p: the block's softmax weights)."""
    n = _rows(meta, data, scale, slut, b, h, t0, n, n_packed, z, norms)
    d = meta[M_DIM]
    for g in range(p.shape[0]):
        for j in range(n):
            w = p[g, j] * norms[j, 0] * norms[j, 1]
            for i in range(d):
                acc[g, d + i] += w * z[j, i]
