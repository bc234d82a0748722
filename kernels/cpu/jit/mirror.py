"""numba code of one batched-rows append (kvviz.cache.row_stack): quantize and pack the new token of one side into row
`pos` of its buffers (kernels/cpu/jit/step.py's `_append`, the packers' exact loops), then read that row back into
the rows' full-precision mirror, value for value what kvviz.formats' torch decode returns for it. The launcher is
kernels/cpu/mirror.py.

The read is exact, not the fused decode's arithmetic (no fastmath here): each value is table[code] * scale, then
+ zero for asymmetric ints, each an fp32 operation rounded on its own, as the torch decode's multiply and add are.
The launcher builds the tables from the format (codes: int values, fp8 and E2M1 values; scales: every fp16 bit
pattern, E8M0 or E4M3 bytes), so the only arithmetic here is the multiply, NVFP4's block scale times its global
scale, and the add.

    append_mirror(x, pk, data, scale, zero, pos, codes, bits, group, skind, stab, ts, nv, asym, rows, at, mirror)
"""

from __future__ import annotations

import numba as nb
import numpy as np

from kernels.cpu.jit.fields import _as_f32
from kernels.cpu.jit.pack import _OPTS
from kernels.cpu.jit.step import _append

S_STATIC = 0  # the tensor / head scale ts (or none: ts = 1)
S_BYTE = 1  # one byte per group through stab (E8M0, E4M3)
S_HALF = 2  # fp16 bits through stab (65,536 entries)
S_F32 = 3  # fp32 bits


@nb.njit(inline="always", **_OPTS)
def _scale(buf, b, h, pos, gi, skind, stab):
    if skind == S_BYTE:
        return stab[buf[b, h, pos, gi]]
    if skind == S_HALF:
        return stab[np.uint32(buf[b, h, pos, 2 * gi]) | (np.uint32(buf[b, h, pos, 2 * gi + 1]) << np.uint32(8))]
    o = 4 * gi
    return _as_f32(np.uint32(buf[b, h, pos, o]) | (np.uint32(buf[b, h, pos, o + 1]) << np.uint32(8))
                   | (np.uint32(buf[b, h, pos, o + 2]) << np.uint32(16))
                   | (np.uint32(buf[b, h, pos, o + 3]) << np.uint32(24)))


@nb.njit(**_OPTS)
def append_mirror(x, pk, data, scale, zero, pos, codes, bits, group, skind, stab, ts, nv, asym, rows, at, mirror):
    """Pack x: fp32 [B, Hkv, 1, D] into row pos of the buffers (uint8 views [B, Hkv, cap, n]; pk: the packing plan,
    kernels/cpu/step.py's), then write its values into mirror[rows[b], h, at, :] (fp32 [rows, Hkv, cap, D]).

    codes: fp32 [2**bits], a code's value; group: channels per scale; ts: the static scale, 1, Hkv or B * Hkv
    values (NVFP4: its global scale, multiplied into each block scale, nv); asym: add the zero (fp16, like the
    scale). Returns the values saturated under a static fp8 scale (the packer's count)."""
    over = _append(x, pk, data, scale, zero, pos)
    batch, heads = data.shape[0], data.shape[1]
    dim = x.shape[3]
    per = 8 // bits
    mask = np.uint32((1 << bits) - 1)
    for b in range(batch):
        for h in range(heads):
            if ts.size == 1:
                t = ts[0]
            elif ts.size == heads:
                t = ts[h]
            else:
                t = ts[b * heads + h]
            for gi in range(dim // group):
                s = t
                if skind != S_STATIC:
                    s = _scale(scale, b, h, pos, gi, skind, stab)
                    if nv:
                        s = s * t
                z = np.float32(0.0)
                if asym:
                    z = _scale(zero, b, h, pos, gi, skind, stab)
                for e in range(gi * group, (gi + 1) * group):
                    code = (np.uint32(data[b, h, pos, e // per]) >> np.uint32(bits * (e % per))) & mask
                    v = codes[code] * s
                    if asym:
                        v = v + z
                    mirror[rows[b], h, at, e] = v
    return over
