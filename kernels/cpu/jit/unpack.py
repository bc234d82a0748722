"""The flat path's unpacking (numba): one bit field of a block's packed codes to floats in one loop per field
(`_field`), or, where the codes and group shape allow, unpacked and scaled by each group's scale in one pass, 16 codes
per vector (`_scaled_units`, kernels/cpu/jit/simd.py's intrinsics); llama.cpp's q5_0 / q5_1 blocks 32 codes at a
time (`_ggml_fields`). kernels/cpu/jit/flat.py's `_flat_block` calls them; this file holds only the element
decoders, one branch per element storage code (contract.py's E_*).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from kernels.cpu.jit.contract import E_BF16, E_E2M1, E_F16, E_F32, E_INT8, E_LUT, E_UINT
from kernels.cpu.jit.fields import _OPTS, _U, _as_f32, _e2m1, _half
from kernels.cpu.jit.rows import _ggml_block
from kernels.cpu.jit.simd import (
    _scaled16_byte, _scaled16_e2m1_hi, _scaled16_e2m1_lo, _scaled16_hi, _scaled16_int8, _scaled16_lo,
)

@nb.njit(inline="always", **_OPTS)
def _field(data, o, nbytes, elem, pb, ub, p, lut, raw):
    """raw[p, k] = the code in field p of unit k at byte o as a float, unscaled, for k < nbytes units: field p holds
    the codes at bits (8 / pb) * p of a byte, or (ub = 3) bits 3p.. of a little-endian 24-bit word of 8 codes; a
    float cast's unit is one fp16 / bf16 / fp32 element. One
    loop per field: two stores per iteration keep LLVM from vectorizing. Unsigned codes are shifted and masked as
    uint32 and converted from int32 (numba widens int32 products to int64, and AVX2 has no vector conversion from
    unsigned ints)."""
    if elem == E_BF16:  # float casts: one element per unit, its bytes read as the rows path reads a tail
        for k in range(nbytes):
            b = _U(o + 2 * k)
            raw[_U(0), _U(k)] = _as_f32((np.uint32(data[b]) << np.uint32(16)) | (np.uint32(data[b + _U(1)]) << np.uint32(24)))
    elif elem == E_F16:
        for k in range(nbytes):
            b = _U(o + 2 * k)
            raw[_U(0), _U(k)] = _half(np.uint32(data[b]) | (np.uint32(data[b + _U(1)]) << np.uint32(8)))
    elif elem == E_F32:
        for k in range(nbytes):
            b = _U(o + 4 * k)
            raw[_U(0), _U(k)] = _as_f32(np.uint32(data[b]) | (np.uint32(data[b + _U(1)]) << np.uint32(8))
                                        | (np.uint32(data[b + _U(2)]) << np.uint32(16))
                                        | (np.uint32(data[b + _U(3)]) << np.uint32(24)))
    elif ub == 3:  # 3-bit codes (through the table)
        sh = np.uint32(3 * p)
        for k in range(nbytes):
            b = _U(o + 3 * k)
            word = np.uint32(data[b]) | (np.uint32(data[b + _U(1)]) << np.uint32(8)) | (
                np.uint32(data[b + _U(2)]) << np.uint32(16))
            raw[_U(p), _U(k)] = lut[(word >> sh) & np.uint32(7)]
    elif elem == E_INT8:
        for k in range(nbytes):
            raw[_U(p), _U(k)] = np.float32(np.int8(data[_U(o + k)]))
    elif elem == E_E2M1:  # a literal shift per field, as for 4-bit ints below
        if p == 0:
            for k in range(nbytes):
                raw[_U(0), _U(k)] = _e2m1(np.uint32(data[_U(o + k)] & np.uint8(15)))
        else:
            for k in range(nbytes):
                raw[_U(1), _U(k)] = _e2m1(np.uint32(data[_U(o + k)] >> np.uint8(4)))
    elif elem == E_LUT:
        if pb == 1:
            for k in range(nbytes):
                raw[_U(p), _U(k)] = lut[data[_U(o + k)]]
        else:
            w = np.uint32(8 // pb)
            sh = w * np.uint32(p)
            mask = (np.uint32(1) << w) - np.uint32(1)
            for k in range(nbytes):
                raw[_U(p), _U(k)] = lut[(np.uint32(data[_U(o + k)]) >> sh) & mask]
    elif pb == 1:
        for k in range(nbytes):
            raw[_U(p), _U(k)] = np.float32(np.int32(data[_U(o + k)]))
    elif pb == 2:  # 4-bit codes: a literal shift and mask (by a variable amount this loop runs ~2.5x slower)
        if p == 0:
            for k in range(nbytes):
                raw[_U(0), _U(k)] = np.float32(np.int32(data[_U(o + k)] & np.uint8(15)))
        else:
            for k in range(nbytes):
                raw[_U(1), _U(k)] = np.float32(np.int32(data[_U(o + k)] >> np.uint8(4)))
    else:
        w = np.uint32(8 // pb)
        sh = w * np.uint32(p)
        mask = (np.uint32(1) << w) - np.uint32(1)
        for k in range(nbytes):
            raw[_U(p), _U(k)] = np.float32(np.int32((np.uint32(data[_U(o + k)]) >> sh) & mask))


# Element kinds _scaled_units decodes (-1: any other, unpacked by _field and scaled in a second pass).
_K_E2M1, _K_NIBBLE, _K_BYTE, _K_INT8 = 0, 1, 2, 3


@nb.njit(inline="always", **_OPTS)
def _unit_kind(elem, pb, ub):
    """The _scaled_units kind of a side's codes, or -1."""
    if ub != 1:
        return -1
    if elem == E_E2M1 and pb == 2:
        return _K_E2M1
    if elem == E_UINT:
        return _K_NIBBLE if pb == 2 else (_K_BYTE if pb == 1 else -1)
    if elem == E_INT8 and pb == 1:
        return _K_INT8
    return -1


def _units_loop(vec):
    """_scaled_units' loops for one of kernels/cpu/jit/simd.py's intrinsics."""

    @nb.njit(inline="always", **_OPTS)
    def loop(data, o, raw, base, gs, gz, units, gp):
        if gp == 8:
            for u in range(0, units, 2):
                k = u * 8
                vec(data, o + k, raw, base + k, gs[u], gs[u + 1], gz[u], gz[u + 1])
        else:
            for u in range(units):
                a, c = gs[u], gz[u]
                for v in range(0, gp, 16):
                    k = u * gp + v
                    vec(data, o + k, raw, base + k, a, a, c, c)

    return loop


_units_e2m1_lo, _units_e2m1_hi = _units_loop(_scaled16_e2m1_lo), _units_loop(_scaled16_e2m1_hi)
_units_lo, _units_hi = _units_loop(_scaled16_lo), _units_loop(_scaled16_hi)
_units_byte, _units_int8 = _units_loop(_scaled16_byte), _units_loop(_scaled16_int8)


@nb.njit(**_OPTS)
def _scaled_units(data, o, kind, p, gs, gz, units, gp, raw):
    """raw[p, u * gp + i] = code * gs[u] + gz[u] for the codes of field p of `units` groups of gp bytes (8, or a
    multiple of 16; 8: an even count) from byte o: one pass, each group's scale applied as its codes are unpacked,
    16 codes per vector (kernels/cpu/jit/simd.py). The kind is branched on outside the loops: a branch inside them
    costs 2-3x."""
    base = p * raw.shape[1]
    if kind == _K_E2M1:
        if p == 0:
            _units_e2m1_lo(data, o, raw, base, gs, gz, units, gp)
        else:
            _units_e2m1_hi(data, o, raw, base, gs, gz, units, gp)
    elif kind == _K_NIBBLE:
        if p == 0:
            _units_lo(data, o, raw, base, gs, gz, units, gp)
        else:
            _units_hi(data, o, raw, base, gs, gz, units, gp)
    elif kind == _K_BYTE:
        _units_byte(data, o, raw, base, gs, gz, units, gp)
    else:
        _units_int8(data, o, raw, base, gs, gz, units, gp)


@nb.njit(inline="always", **_OPTS)
def _ggml_fields(data, o, n, ngroups, gsc, gzc, raw):
    """n rows of q5_0 / q5_1 blocks at byte offset o -> raw[0, (j * groups + gi) * 32 + e], element e of the block
    in ggml's order, as code * gsc[j, gi] + gzc[j, gi] (the offset folded into gzc): _ggml_block per block."""
    for j in range(n):
        for gi in range(ngroups):
            u = j * ngroups + gi
            _ggml_block(data, o + u * 20, np.float32(0.0), u * 32, gsc[j, gi], gzc[j, gi], raw, 0)
