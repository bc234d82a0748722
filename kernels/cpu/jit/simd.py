"""Explicit 16-lane vector code for the fused CPU decode (numba intrinsics written in LLVM IR).

LLVM fully unrolls a loop of 16 or 32 iterations before it vectorizes, and its SLP pass then leaves most code kinds
scalar: one int -> float conversion per code. A group-scaled block (llama.cpp's q4_0 / q8_0, MX / NV FP4, int
groups) unpacks each group with its own scale, so its loops are that short. These intrinsics unpack 16 codes and
apply their group's scale as one vector each, whatever the optimizer decides:

    _scaled16_<kind>(data, o, raw, k, a0, a1, c0, c1)
        raw.flat[k + i] = decode(code i of the 16 bytes data[o:o + 16]) * a + c,  (a, c) = (a0, c0) for i < 8
        and (a1, c1) for i >= 8 (pass a1 = a0, c1 = c0 for one group of 16 or more bytes)

`decode` per kind: the low or the high nibble as an unsigned int (q4_0, int4 groups) or as an E2M1 code (MX / NV
FP4), the byte as an unsigned or a signed int (q8_0, int8 groups). The product and the sum are separate fp32
operations (no fused multiply-add), as the torch decode rounds them.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

_LANES = 16
_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
_V8, _V32, _VF = ir.VectorType(_I8, _LANES), ir.VectorType(_I32, _LANES), ir.VectorType(_F32, _LANES)


def _splat(value: int) -> ir.Constant:
    return ir.Constant(_V32, [value] * _LANES)


def _halves(builder, lo, hi):
    """A float vector of lo in lanes 0..7 and hi in lanes 8..15 (one shuffle of a two-lane vector)."""
    pair = ir.Constant(ir.VectorType(_F32, 2), ir.Undefined)
    pair = builder.insert_element(pair, lo, ir.Constant(_I32, 0))
    pair = builder.insert_element(pair, hi, ir.Constant(_I32, 1))
    half = _LANES // 2
    return builder.shuffle_vector(pair, pair, ir.Constant(ir.VectorType(_I32, _LANES), [0] * half + [1] * half))


def _nibble_lo(builder, b):
    return builder.and_(builder.zext(b, _V32), _splat(15))


def _nibble_hi(builder, b):
    return builder.lshr(builder.zext(b, _V32), _splat(4))


def _lo(builder, b):
    return builder.sitofp(_nibble_lo(builder, b), _VF)


def _hi(builder, b):
    return builder.sitofp(_nibble_hi(builder, b), _VF)


def _byte(builder, b):
    return builder.sitofp(builder.zext(b, _V32), _VF)


def _int8(builder, b):
    return builder.sitofp(builder.sext(b, _V32), _VF)


def e2m1_bits(builder, c, const):
    """E2M1 codes c (i32, or a vector of i32; 0..15) -> the bits of their float32 values: sign bit 3, magnitude
    code m = c & 7 in {0, .5, 1, 1.5, 2, 3, 4, 6}. For m >= 2 the code's exponent and mantissa bits, moved into a
    float32 with exponent bias 126, are the value; m = 0 and 1 are 0.0 and 0.5; code 8 is -0, as the table has it.
    const(v): a constant of c's type. Blends, no branches; 32-bit lanes (numba's own integer arithmetic is 64-bit)."""
    m = builder.and_(c, const(7))
    big = builder.add(builder.shl(m, const(22)), const(126 << 23))
    small = builder.select(builder.icmp_unsigned("==", m, const(1)), const(0x3F000000), const(0))
    mag = builder.select(builder.icmp_unsigned(">=", m, const(2)), big, small)
    return builder.or_(mag, builder.shl(builder.and_(c, const(8)), const(28)))


def _e2m1_of(builder, c):
    return builder.bitcast(e2m1_bits(builder, c, _splat), _VF)


def _e2m1_lo(builder, b):
    return _e2m1_of(builder, _nibble_lo(builder, b))


def _e2m1_hi(builder, b):
    return _e2m1_of(builder, _nibble_hi(builder, b))


def _scaled16(decode):
    """The intrinsic for one decode (see the module docstring)."""

    @intrinsic
    def scaled16(typingctx, data, o, raw, k, a0, a1, c0, c1):
        if not (isinstance(data, types.Array) and data.dtype == types.uint8 and isinstance(raw, types.Array)
                and raw.dtype == types.float32 and raw.layout == "C"):
            return None

        def codegen(context, builder, signature, args):
            data_v, o_v, raw_v, k_v, a0_v, a1_v, c0_v, c1_v = args
            src = context.make_array(signature.args[0])(context, builder, data_v).data
            dst = context.make_array(signature.args[2])(context, builder, raw_v).data
            o_v = context.cast(builder, o_v, signature.args[1], types.int64)
            k_v = context.cast(builder, k_v, signature.args[3], types.int64)
            scalars = [context.cast(builder, v, t, types.float32) for v, t in zip((a0_v, a1_v, c0_v, c1_v),
                                                                                   signature.args[4:])]
            p_src = builder.bitcast(builder.gep(src, [o_v]), _V8.as_pointer())
            codes = builder.load(p_src, align=1)
            x = decode(builder, codes)
            a = _halves(builder, scalars[0], scalars[1])
            c = _halves(builder, scalars[2], scalars[3])
            y = builder.fadd(builder.fmul(x, a), c)
            p_dst = builder.bitcast(builder.gep(dst, [k_v]), _VF.as_pointer())
            builder.store(y, p_dst, align=4)
            return context.get_dummy_value()

        return types.void(data, o, raw, k, a0, a1, c0, c1), codegen

    return scaled16


_scaled16_lo = _scaled16(_lo)
_scaled16_hi = _scaled16(_hi)
_scaled16_byte = _scaled16(_byte)
_scaled16_int8 = _scaled16(_int8)
_scaled16_e2m1_lo = _scaled16(_e2m1_lo)
_scaled16_e2m1_hi = _scaled16(_e2m1_hi)
