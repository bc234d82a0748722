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

The attention over a decoded block, for rows of a multiple of 16 channels per field (the flat path's
_flat_scores and _flat_accumulate):

    _scores16(q, qo, raw, ro, w, nb, pb, sc, zc, j, qs, sm, s, so)   # 16 rows' scores, one vector
    _weighted16(wt, wo, raw, ro, w, nb, pb, n, acc, ao)              # acc += the block's rows, weighted

Compiled from loops, a row's score was a 16-lane vector reduced on its own (four dependent shuffle-and-add steps,
as many as the row's multiply-adds), and V's accumulator was loaded and stored once per four rows. Here 16 rows'
score vectors are summed by one transpose-and-add tree, and the accumulator stays in registers over the block.
"""

from __future__ import annotations

import platform
import struct

import llvmlite.binding as llvm
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

_LANES = 16
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # OCP MX v1.0 FP4 magnitudes by code & 7
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


def _broadcast(builder, x):
    """A float vector of x in every lane."""
    undef = ir.Constant(_VF, ir.Undefined)
    return builder.shuffle_vector(builder.insert_element(undef, x, ir.Constant(_I32, 0)), undef,
                                  ir.Constant(_V32, [0] * _LANES))


def _fma(builder):
    """llvm.fma on 16-float vectors (a fused multiply-add, whatever the caller's fast-math flags)."""
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3), "llvm.fma.v16f32")


def _vector_at(builder, base, offset):
    """The 16 floats at base[offset] as a vector pointer."""
    return builder.bitcast(builder.gep(base, [offset]), _VF.as_pointer())


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


def _e2m1_bytes(byte: int) -> ir.Constant:
    """Byte `byte` (3: the top one) of the float32 bits of each of the 16 E2M1 values, by code: a shuffle table."""
    return ir.Constant(_V8, [struct.pack("<f", -E2M1[c & 7] if c & 8 else E2M1[c])[byte] for c in range(16)])


# x86's byte shuffle (SSSE3) looks 16 codes up in a 16-byte table in one instruction. The float32 bits of every E2M1
# value have two zero low bytes, so two lookups (the top byte, the next) give them whole, -0 of code 8 included.
_SHUFFLE_BYTES = "llvm.x86.ssse3.pshuf.b.128"
_TABLE_TOP, _TABLE_NEXT = _e2m1_bytes(3), _e2m1_bytes(2)
_X86_FEATURES = (llvm.get_host_cpu_features() if platform.machine().lower() in ("x86_64", "amd64")
                 else {})  # the host's x86 features (none elsewhere): which table lookups compile
_BYTE_SHUFFLE = bool(_X86_FEATURES.get("ssse3"))


def _e2m1_shuffled(builder, c8):
    """16 E2M1 codes (i8 lanes, 0..15) -> their float32 values through two byte shuffles: the table's top and next
    bytes interleaved into 16-bit words, then moved up into the top half of each float32 (4 vector operations
    against e2m1_bits' 10)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8, [_V8, _V8]), _SHUFFLE_BYTES)
    top, nxt = builder.call(fn, [_TABLE_TOP, c8]), builder.call(fn, [_TABLE_NEXT, c8])
    pairs = builder.shuffle_vector(nxt, top, ir.Constant(ir.VectorType(_I32, 2 * _LANES),
                                                         [i // 2 + _LANES * (i % 2) for i in range(2 * _LANES)]))
    words = builder.bitcast(pairs, ir.VectorType(ir.IntType(16), _LANES))  # little-endian: top << 8 | next
    return builder.bitcast(builder.shl(builder.zext(words, _V32), _splat(16)), _VF)


# AVX-512's lane permute (vpermps) looks 16 int32 indices up in a 16-float table held in one register: one
# instruction from codes to values, where the byte shuffles need five.
_PERMUTE_FLOATS = "llvm.x86.avx512.permvar.sf.512"
_TABLE_FLOATS = ir.Constant(_VF, [-E2M1[c & 7] if c & 8 else E2M1[c] for c in range(16)])
_LANE_PERMUTE = bool(_X86_FEATURES.get("avx512f"))


def _e2m1_permuted(builder, c32):
    """16 E2M1 codes (i32 lanes, 0..15) -> their float32 values: one lane permute of the value table."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF, _V32]), _PERMUTE_FLOATS)
    return builder.call(fn, [_TABLE_FLOATS, c32])


def _e2m1_lo(builder, b):
    if _LANE_PERMUTE:
        return _e2m1_permuted(builder, _nibble_lo(builder, b))
    if _BYTE_SHUFFLE:
        return _e2m1_shuffled(builder, builder.and_(b, ir.Constant(_V8, [15] * _LANES)))
    return _e2m1_of(builder, _nibble_lo(builder, b))


def _e2m1_hi(builder, b):
    if _LANE_PERMUTE:
        return _e2m1_permuted(builder, _nibble_hi(builder, b))
    if _BYTE_SHUFFLE:
        return _e2m1_shuffled(builder, builder.lshr(b, ir.Constant(_V8, [4] * _LANES)))
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


# ------------------------------------------------------------------------------------------ 16 rows' scores

_ROWS = 16


def _sum_rows(builder, vectors):
    """16 float vectors -> one whose lane r is the sum of vectors[r]'s lanes: a transpose-and-add tree (each level
    pairs two vectors and adds the halves of their row chunks: 15 adds and 30 shuffles in all) instead of 16
    horizontal reductions of 4 dependent steps each."""
    level = [(v, [r], _LANES) for r, v in enumerate(vectors)]  # (vector, rows of its chunks, chunk width)
    mask_type = ir.VectorType(_I32, _LANES)
    while len(level) > 1:
        nxt = []
        for (x, xrows, w), (y, yrows, _) in zip(level[0::2], level[1::2]):
            half = w // 2
            chunks = [k * w for k in range(len(xrows))] + [_LANES + k * w for k in range(len(yrows))]
            first = [c + i for c in chunks for i in range(half)]
            second = [c + half + i for c in chunks for i in range(half)]
            a = builder.shuffle_vector(x, y, ir.Constant(mask_type, first))
            b = builder.shuffle_vector(x, y, ir.Constant(mask_type, second))
            nxt.append((builder.fadd(a, b), xrows + yrows, half))
        level = nxt
    total, rows, _ = level[0]
    lane_of = {row: lane for lane, row in enumerate(rows)}
    return builder.shuffle_vector(total, total, ir.Constant(mask_type, [lane_of[r] for r in range(_ROWS)]))


@intrinsic
def _scores16(typingctx, q, qo, raw, ro, w, nb, pb, sc, zc, j, qs, sm, s, so):
    """s.flat[so + r] = (dot_r * sc[j + r] + zc[j + r] * qs) * sm for 16 rows r, where dot_r = sum over fields
    p < pb and i < nb of q.flat[qo + p * nb + i] * raw.flat[ro + p * w + r * nb + i] (nb a multiple of 16; w: the
    length of one field of raw). The 16 dot products accumulate as 16 vectors (fused multiply-adds) and are
    summed by _sum_rows; the scaling runs as one vector."""
    floats = (q, raw, sc, zc, s)
    if not all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in floats):
        return None

    def codegen(context, builder, signature, args):
        ptr = {}
        for name, i in (("q", 0), ("raw", 2), ("sc", 7), ("zc", 8), ("s", 12)):
            ptr[name] = context.make_array(signature.args[i])(context, builder, args[i]).data
        ints = {name: context.cast(builder, args[i], signature.args[i], types.int64)
                for name, i in (("qo", 1), ("ro", 3), ("w", 4), ("nb", 5), ("pb", 6), ("j", 9), ("so", 13))}
        qs_v = context.cast(builder, args[10], signature.args[10], types.float32)
        sm_v = context.cast(builder, args[11], signature.args[11], types.float32)
        i64 = ir.IntType(64)

        def vload(name, offset):
            return builder.load(_vector_at(builder, ptr[name], offset), align=4)

        fma = _fma(builder)
        zero = ir.Constant(_VF, [0.0] * _LANES)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(_ROWS)]
        chunks = builder.udiv(ints["nb"], ir.Constant(i64, _LANES))
        with cgutils.for_range(builder, ints["pb"]) as field:
            p = field.index
            q_base = builder.add(ints["qo"], builder.mul(p, ints["nb"]))
            r_base = builder.add(ints["ro"], builder.mul(p, ints["w"]))
            with cgutils.for_range(builder, chunks) as chunk:
                c = builder.mul(chunk.index, ir.Constant(i64, _LANES))
                qv = vload("q", builder.add(q_base, c))
                row = builder.add(r_base, c)
                for r in range(_ROWS):
                    rv = vload("raw", row)
                    builder.store(builder.call(fma, [qv, rv, builder.load(accs[r])]), accs[r])
                    row = builder.add(row, ints["nb"])
        dots = _sum_rows(builder, [builder.load(a) for a in accs])
        y = builder.fadd(builder.fmul(dots, vload("sc", ints["j"])),
                         builder.fmul(vload("zc", ints["j"]), _broadcast(builder, qs_v)))
        y = builder.fmul(y, _broadcast(builder, sm_v))
        builder.store(y, _vector_at(builder, ptr["s"], ints["so"]), align=4)
        return context.get_dummy_value()

    return types.void(q, qo, raw, ro, w, nb, pb, sc, zc, j, qs, sm, s, so), codegen


# ------------------------------------------------------------------------------------------ weighted rows

@intrinsic
def _weighted16(typingctx, wt, wo, raw, ro, w, nb, pb, n, acc, ao):
    """acc.flat[ao + p * nb + i] += sum over rows j < n of wt.flat[wo + j] * raw.flat[ro + p * w + j * nb + i],
    for fields p < pb and channels i < nb (nb a multiple of 16; w: the length of one field of raw). Per 16
    channels the rows run as four chains of fused multiply-adds (rows j, j + 4, ...), added at the end, so the
    accumulator stays in registers over the whole block."""
    if not all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in (wt, raw, acc)):
        return None

    def codegen(context, builder, signature, args):
        ptr = {name: context.make_array(signature.args[i])(context, builder, args[i]).data
               for name, i in (("wt", 0), ("raw", 2), ("acc", 8))}
        ints = {name: context.cast(builder, args[i], signature.args[i], types.int64)
                for name, i in (("wo", 1), ("ro", 3), ("w", 4), ("nb", 5), ("pb", 6), ("n", 7), ("ao", 9))}
        i64 = ir.IntType(64)
        fma = _fma(builder)

        def vptr(name, offset):
            return _vector_at(builder, ptr[name], offset)

        def weight(j):  # wt[wo + j] in every lane
            return _broadcast(builder, builder.load(builder.gep(ptr["wt"], [builder.add(ints["wo"], j)])))

        zero = ir.Constant(_VF, [0.0] * _LANES)
        chains = [cgutils.alloca_once(builder, _VF) for _ in range(4)]
        chunks = builder.udiv(ints["nb"], ir.Constant(i64, _LANES))
        quads = builder.udiv(ints["n"], ir.Constant(i64, 4))
        with cgutils.for_range(builder, ints["pb"]) as field:
            p = field.index
            with cgutils.for_range(builder, chunks) as chunk:
                c = builder.mul(chunk.index, ir.Constant(i64, _LANES))
                first = builder.add(builder.add(ints["ro"], builder.mul(p, ints["w"])), c)  # row 0's channels
                for a in chains:
                    builder.store(zero, a)
                with cgutils.for_range(builder, quads) as quad:
                    j = builder.mul(quad.index, ir.Constant(i64, 4))
                    for k, a in enumerate(chains):
                        jk = builder.add(j, ir.Constant(i64, k))
                        row = builder.load(vptr("raw", builder.add(first, builder.mul(jk, ints["nb"]))), align=4)
                        builder.store(builder.call(fma, [weight(jk), row, builder.load(a)]), a)
                with cgutils.for_range(builder, ints["n"], start=builder.mul(quads, ir.Constant(i64, 4))) as rest:
                    jk = rest.index
                    row = builder.load(vptr("raw", builder.add(first, builder.mul(jk, ints["nb"]))), align=4)
                    builder.store(builder.call(fma, [weight(jk), row, builder.load(chains[0])]), chains[0])
                a0, a1, a2, a3 = (builder.load(a) for a in chains)
                total = builder.fadd(builder.fadd(a0, a1), builder.fadd(a2, a3))
                out = vptr("acc", builder.add(builder.add(ints["ao"], builder.mul(p, ints["nb"])), c))
                builder.store(builder.fadd(builder.load(out, align=4), total), out, align=4)
        return context.get_dummy_value()

    return types.void(wt, wo, raw, ro, w, nb, pb, n, acc, ao), codegen
