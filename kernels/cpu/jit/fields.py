"""How the fused CPU decode reads stored bytes (numba): the shared codes, the `meta` vector, bit casts, IEEE half
and bfloat16 reads, E2M1 codes, stored scale rows. Every other module of kernels/cpu/jit/ builds on these.

A token's row dequantizes as  x = decode(code) * scale * tensor_scale + zero  (kernels/packed.py). Codes of 8 bits
or fewer decode through a small table (`lut`: 256 entries for bytes, 16 for nibbles, 4 for 2-bit codes) built by
the launcher (kernels/cpu/decode.py) from the format, so int, fp8 and E2M1 elements are one code path; 16/32-bit
floats (casts, tails, scales) are read from their bytes. In per-row loops nothing calls a helper with array
arguments: numba counts references of each array argument with atomic operations on every call.

numba's on-disk cache (cache=True) keys each function on its own file: after editing a helper here, clear
__pycache__ (or NUMBA_CACHE_DIR) so that the modules that inline it recompile; the same holds for simd.py's intrinsics.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from kernels.cpu.jit.contract import (
    E_BF16, E_F16, E_F32, E_LUT, E_UINT, M_DIM, M_ELEM, M_OFFSET, M_PER_BYTE, M_SDT, M_S_OFF, M_S_SB, M_S_SH,
    M_S_ST, M_ZERO, M_Z_OFF, M_Z_SB, M_Z_SH, M_Z_ST,
)
from kernels.cpu.jit.simd import e2m1_bits

# reassoc/contract let LLVM vectorize the fp32 dot products (sums reassociated); no nnan/ninf: -inf is used.
_OPTS = dict(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, error_model="numpy")


def _low32(builder, value, ty):
    """An integer IR value of numba type ty as i32: its low 32 bits, or zero-extended."""
    i32 = ir.IntType(32)
    if ty.bitwidth > 32:
        return builder.trunc(value, i32)
    return builder.zext(value, i32) if ty.bitwidth < 32 else value


@intrinsic
def _as_f32(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as an IEEE float32 (a register bitcast; numpy's scalar .view
    allocates an array on every call)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(_low32(builder, args[0], bits), ir.FloatType())

    return types.float32(bits), codegen


_U = np.uint64  # an index known to be >= 0: numba adds no wraparound for unsigned indices (see _codes)


@nb.njit(**_OPTS)
def _u16(buf, o):
    return np.uint32(buf[o]) | (np.uint32(buf[o + 1]) << 8)


@nb.njit(inline="always", **_OPTS)
def _half(h):
    """IEEE binary16 bits (uint32) -> float32, exact (subnormals, inf, nan), without branches (it vectorizes): the
    exponent and mantissa bits moved to float32's places read as 2**-112 times the value (a float32 subnormal for
    a subnormal half), so one multiply by 2**112 rescales; exponent 31 (inf / nan) is blended in as all ones."""
    em = (h & np.uint32(0x7FFF)) << np.uint32(13)
    v = _bits(_as_f32(em) * np.float32(5.192296858534828e33))  # 2**112
    special = np.uint32(0) - np.uint32(em >= np.uint32(0x0F800000))  # all ones for inf / nan
    return _as_f32(((h & np.uint32(0x8000)) << np.uint32(16)) | (v & ~special) | ((em | np.uint32(0x7F800000)) & special))


@nb.njit(**_OPTS)
def _read(buf, o, dt, lut):
    """One stored float at byte offset o, of storage type dt (E_LUT: one byte through `lut`)."""
    if dt == E_LUT:
        return lut[buf[o]]
    if dt == E_F16:
        return _half(_u16(buf, o))
    if dt == E_BF16:
        return _as_f32(_u16(buf, o) << 16)
    u = _u16(buf, o) | (_u16(buf, o + 2) << 16)
    return _as_f32(u)


@nb.njit(**_OPTS)
def _width(dt):
    return 1 if dt == E_LUT else (4 if dt == E_F32 else 2)


@intrinsic
def _e2m1(typingctx, code):
    """One E2M1 code (an integer 0..15) -> float32 (kernels/cpu/jit/simd.py's e2m1_bits). In 32-bit LLVM IR: numba
    would widen the integer arithmetic to 64 bits, halving the vector lanes of the loops that call it (3x slower)."""
    if not isinstance(code, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        c = _low32(builder, args[0], code)
        return builder.bitcast(e2m1_bits(builder, c, lambda v: ir.Constant(ir.IntType(32), v)), ir.FloatType())

    return types.float32(code), codegen


@intrinsic
def _bits(typingctx, value):
    """The IEEE bits of a float32 as a uint32 (a register bitcast)."""
    if not isinstance(value, types.Float) or value.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(value), codegen



@nb.njit(**_OPTS)
def _floats(buf, base, st, sw, dt, lut, n, ngroups, out):
    """out[j, gi] = the stored float of group gi of row j (byte offset base + j * st + gi * sw, storage type dt).
    Read from the bytes in this loop, not through _read: a call with array arguments in a per-row loop costs
    numba two atomic reference counts per array. One loop per storage type, with no branch inside."""
    if dt == E_LUT:
        for j in range(n):
            for gi in range(ngroups):
                out[_U(j), _U(gi)] = lut[buf[_U(base + j * st + gi * sw)]]
    elif dt == E_F16:
        for j in range(n):
            for gi in range(ngroups):
                o = _U(base + j * st + gi * sw)
                out[_U(j), _U(gi)] = _half(np.uint32(buf[o]) | (np.uint32(buf[o + _U(1)]) << np.uint32(8)))
    elif dt == E_BF16:
        for j in range(n):
            for gi in range(ngroups):
                o = _U(base + j * st + gi * sw)
                out[_U(j), _U(gi)] = _as_f32((np.uint32(buf[o]) << np.uint32(16)) | (np.uint32(buf[o + _U(1)]) << np.uint32(24)))
    else:
        for j in range(n):
            for gi in range(ngroups):
                o = _U(base + j * st + gi * sw)
                out[_U(j), _U(gi)] = _as_f32(np.uint32(buf[o]) | (np.uint32(buf[o + _U(1)]) << np.uint32(8))
                                             | (np.uint32(buf[o + _U(2)]) << np.uint32(16))
                                             | (np.uint32(buf[o + _U(3)]) << np.uint32(24)))


@nb.njit(**_OPTS)
def _channel_row(meta, scale, zero, slut, tsv, b, h, row, gsc, gzc):
    """Channel scales' row `row` (tokens row * group ..) of (b, h) -> gsc / gzc [p, i] for the channel at planar
    position p * nb + i (stored channel pb * i + p), the tensor scale and the code offset folded in: x = code * gsc +
    gzc."""
    d = meta[M_DIM]
    pb = meta[M_PER_BYTE]
    nb_ = d // pb
    sdt = meta[M_SDT]
    sw = _width(sdt)
    has_zero = meta[M_ZERO] != 0
    off = np.float32(meta[M_OFFSET]) if meta[M_ELEM] == E_UINT else np.float32(0.0)
    _floats(scale, meta[M_S_OFF] + b * meta[M_S_SB] + h * meta[M_S_SH] + row * meta[M_S_ST], sw, sw * pb, sdt, slut,
            pb, nb_, gsc)
    if has_zero:
        _floats(zero, meta[M_Z_OFF] + b * meta[M_Z_SB] + h * meta[M_Z_SH] + row * meta[M_Z_ST], sw, sw * pb, sdt, slut,
                pb, nb_, gzc)
    for p in range(pb):
        for i in range(nb_):
            gsc[p, i] *= tsv
            gzc[p, i] = (gzc[p, i] if has_zero else np.float32(0.0)) - off * gsc[p, i]
