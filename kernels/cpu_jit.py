"""numba code of the fused CPU decode attention; the launcher is kernels/cpu.py (it imports this lazily).

Every packed buffer arrives as the flat uint8 view of its whole storage plus a byte offset and byte strides, so one
compiled signature serves every format and every capacity-strided view, and nothing is copied. Per (batch row,
KV head, token split) one thread walks the tokens in blocks of `BLOCK` (online softmax, as flash-decoding does):

    tile[t, :] = dequantize(K codes of token t)            # one block of rows: the only dequantized K/V held
    s[g, t]    = (q[g] . tile[t]) * sm_scale               # G = query heads sharing the KV head (GQA)
    m, l, acc  <- online softmax of s, then acc[g] += p[g, t] * dequantize(V codes of token t)

Blocks whose rows are all packed and live take the flat path: _flat_block unpacks each bit field of the block's
bytes in one loop over the whole block (no per-row loop). With one scale per row (token or tensor scales) the row's
affine map (scale, offset) is folded into the scores (s = sc * (q . raw) + zc * sum q) and into the softmax weights
of V (acc += (p * sc) * raw, with p * zc summed apart and added once); with several (scale groups, llama.cpp's
blocks, KIVI's channel scales) they are applied to the unpacked block in place. Other blocks (tails, masks, float
casts) take the row-by-row path below. In per-row loops nothing calls a helper with array arguments: numba counts
references of each array argument with atomic operations on every call.

A token's row dequantizes as  x = decode(code) * scale * tensor_scale + zero  (kernels/packed.py). Codes of 8 bits
or fewer decode through a small table (`lut`: 256 entries for bytes, 16 for nibbles, 4 for 2-bit codes) built by
the launcher from the format, so int, fp8 and E2M1 elements are one code path; 16/32-bit floats (casts, tails,
scales) are read from their bytes. Rows past a side's n_packed come from its full-precision tail.

llama.cpp's KV types keep their bytes: q8_0's int8 codes with one fp16 d per 32 are kvviz's int8/g32 layout byte for
byte; q4_0, q4_1 and iq4_nl are 4-bit codes with a scale group of 32 in a planar order of their own (the launcher
orders q and the output for it; meta[M_GGML] = 4 tells the tail's reader); q5_0 and q5_1 (meta[M_GGML] = 5) are
decoded 32 codes at a time from their blocks (a 4-byte qh, then 16 bytes of nibbles), in ggml's element order.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

# Element / scale storage: codes through a table, or IEEE half, bfloat16, float32 read from their bytes.
E_LUT, E_F16, E_BF16, E_F32, E_UINT, E_INT8, E_E2M1 = 0, 1, 2, 3, 4, 5, 6
S_NONE, S_TOKEN, S_CHANNEL = 0, 1, 2
# Fields of a side's int64 `meta` vector (kernels/cpu.py fills it).
(M_DIM, M_ELEM, M_PER_BYTE, M_OFFSET, M_D_OFF, M_D_SB, M_D_SH, M_D_ST,
 M_SKIND, M_SDT, M_GROUP, M_S_OFF, M_S_SB, M_S_SH, M_S_ST,
 M_ZERO, M_Z_OFF, M_Z_SB, M_Z_SH, M_Z_ST,
 M_TDT, M_T_OFF, M_T_SB, M_T_SH, M_T_ST, M_TAIL, M_GGML) = range(27)
META_LEN = 27
BLOCK = 64  # tokens per block: a [64, D] fp32 tile (16 KiB at D = 64) stays in L1/L2

# reassoc/contract let LLVM vectorize the fp32 dot products (sums reassociated); no nnan/ninf: -inf is used.
_OPTS = dict(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"}, error_model="numpy")


@intrinsic
def _as_f32(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as an IEEE float32 (a register bitcast; numpy's scalar .view
    allocates an array on every call)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value, i32 = args[0], ir.IntType(32)
        if bits.bitwidth > 32:
            value = builder.trunc(value, i32)
        elif bits.bitwidth < 32:
            value = builder.zext(value, i32)
        return builder.bitcast(value, ir.FloatType())

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


@nb.njit(inline="always", **_OPTS)
def _e2m1(c):
    """One E2M1 code (uint32, 0..15) -> float32: sign bit 3, magnitude code m = c & 7 in {0, .5, 1, 1.5, 2, 3, 4, 6}.
    For m >= 2 the code's exponent and mantissa bits, moved into a float32 with exponent bias 126, are the value;
    m = 0 and 1 are m / 2. -0 for code 8, as the table has it."""
    m = c & np.uint32(7)
    big = (m << np.uint32(22)) + np.uint32(126 << 23)
    small = m * np.uint32(0x3F000000)  # m in {0, 1}: the bits of 0.0 and of 0.5
    pick = np.uint32(0) - np.uint32(m >= np.uint32(2))  # all ones where m >= 2: a blend, no branch (vectorizes)
    return _as_f32(((c & np.uint32(8)) << np.uint32(28)) | (big & pick) | (small & ~pick))


@intrinsic
def _bits(typingctx, value):
    """The IEEE bits of a float32 as a uint32 (a register bitcast)."""
    if not isinstance(value, types.Float) or value.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(value), codegen


@nb.njit(inline="always", **_OPTS)
def _codes(data, o, elem, pb, nb_, off, lut, lo, hi, s, z, tile, j):
    """Bytes lo..hi-1 of the packed row at byte offset o -> tile[j] as decode(code) * s + z, in planar order:
    element d of a row sits at (d % pb) * (D / pb) + d // pb for pb codes per byte (identity for pb = 1), so each
    field of a byte (low nibble, high nibble, ...) fills one contiguous run and the loops vectorize.

    Indices are cast to unsigned (_U), so numba emits no negative-index wraparound in these loops. No array view
    per row (`tile[j]`): each costs two atomic reference-count calls, which kept these loops ~4x slower."""
    if elem == E_LUT:  # fp8, E2M1: codes through a table of 256 / 16 floats
        if pb == 1:
            for i in range(lo, hi):
                tile[_U(j), _U(i)] = lut[data[_U(o + i)]] * s + z
        else:  # one loop per nibble: two stores per iteration keep LLVM from vectorizing
            for i in range(lo, hi):
                tile[_U(j), _U(i)] = lut[data[_U(o + i)] & np.uint8(15)] * s + z
            for i in range(lo, hi):
                tile[_U(j), _U(nb_ + i)] = lut[data[_U(o + i)] >> np.uint8(4)] * s + z
    elif elem == E_INT8:  # int8 two's complement
        for i in range(lo, hi):
            tile[_U(j), _U(i)] = np.float32(np.int8(data[_U(o + i)])) * s + z
    elif elem == E_E2M1:  # OCP FP4, two a byte, decoded with integer arithmetic (a table gather does not vectorize)
        for i in range(lo, hi):
            tile[_U(j), _U(i)] = _e2m1(np.uint32(data[_U(o + i)]) & np.uint32(15)) * s + z
        for i in range(lo, hi):
            tile[_U(j), _U(nb_ + i)] = _e2m1(np.uint32(data[_U(o + i)]) >> np.uint32(4)) * s + z
    else:  # E_UINT: (code - offset) * s + z = code * s + c0, codes unpacked with shifts
        c0 = z - off * s
        if pb == 1:
            for i in range(lo, hi):
                tile[_U(j), _U(i)] = np.float32(np.int32(data[_U(o + i)])) * s + c0
        else:  # element pb * i + p at bits (8 / pb) * p: one loop per field, so that each vectorizes (int32 lanes)
            w = np.int32(8 // pb)
            mask = np.int32((1 << w) - 1)
            for p in range(pb):
                sh = np.int32(p) * w
                for i in range(lo, hi):
                    tile[_U(j), _U(p * nb_ + i)] = np.float32((np.int32(data[_U(o + i)]) >> sh) & mask) * s + c0


@nb.njit(inline="always", **_OPTS)
def _ggml_block(data, o, off, e0, s, z, tile, j):
    """One 32-code q5_0 / q5_1 block at byte offset o -> tile[j, e0:e0 + 32], as ggml's dequantize_row_<type>:
    (code - off) * d + m (q5_0: m = 0; q5_1: off = 0). Block bytes (kvviz/formats/ggml.py): a little-endian uint32
    qh whose bit i is bit 4 of code i, then 16 bytes qs, byte i = code i (low nibble) | code i + 16 (high nibble).
    Both nibbles fill contiguous runs of the tile, so ggml's element order is kept and the loops vectorize."""
    qh = _u16(data, o) | (_u16(data, o + 2) << 16)
    for i in range(16):
        c = np.uint32(data[_U(o + 4 + i)])
        lo = (c & np.uint32(15)) | (((qh >> np.uint32(i)) & np.uint32(1)) << np.uint32(4))
        hi = (c >> np.uint32(4)) | (((qh >> np.uint32(i + 16)) & np.uint32(1)) << np.uint32(4))
        tile[_U(j), _U(e0 + i)] = (np.float32(lo) - off) * s + z
        tile[_U(j), _U(e0 + 16 + i)] = (np.float32(hi) - off) * s + z


@nb.njit(inline="always", **_OPTS)
def _tail_row(tail, o, tdt, tw, pb, nb_, gbits, tile, j):
    """The tail's row at byte offset o (fp16, bf16 or fp32) -> tile[j] in planar order (gbits = 4: ggml's nibble
    blocks' order). Read from the bytes here, one loop per storage type: _read is a call with array arguments."""
    for i in range(nb_):
        for p in range(pb):
            e = pb * i + p if gbits != 4 else 2 * (i - i % 16) + 16 * p + i % 16
            b = _U(o + e * tw)
            if tdt == E_F16:
                tile[_U(j), _U(p * nb_ + i)] = _half(np.uint32(tail[b]) | (np.uint32(tail[b + _U(1)]) << np.uint32(8)))
            elif tdt == E_BF16:
                tile[_U(j), _U(p * nb_ + i)] = _as_f32((np.uint32(tail[b]) << np.uint32(16))
                                                       | (np.uint32(tail[b + _U(1)]) << np.uint32(24)))
            else:
                tile[_U(j), _U(p * nb_ + i)] = _as_f32(np.uint32(tail[b]) | (np.uint32(tail[b + _U(1)]) << np.uint32(8))
                                                       | (np.uint32(tail[b + _U(2)]) << np.uint32(16))
                                                       | (np.uint32(tail[b + _U(3)]) << np.uint32(24)))


@nb.njit(inline="always", **_OPTS)
def _rows(data, lut, scale, zero, slut, tail, live, tile, elem, geo, fl, npk, t0, n):
    """The row loop of _decode_block (see there), inlined once per element kind."""
    (pb, nb_, d_base, d_st, skind, sdt, sw, gp, ngroups, has_zero, s_base, s_st, z_base, z_st, tdt, tw,
     t_base, t_st, gbits) = geo
    off, tsv, s_row, z_row = fl
    for j in range(n):
        if not live[j]:
            continue
        t = t0 + j
        if t >= npk:  # the full-precision tail, written in planar order
            _tail_row(tail, t_base + (t - npk) * t_st, tdt, tw, pb, nb_, gbits, tile, j)
            continue
        o = d_base + t * d_st
        if elem == E_LUT or elem >= E_UINT:
            for gi in range(ngroups):
                sc, z = s_row, z_row
                if skind == S_TOKEN:
                    sc = _read(scale, s_base + t * s_st + gi * sw, sdt, slut) * tsv
                    if has_zero != 0:
                        z = _read(zero, z_base + t * z_st + gi * sw, sdt, slut)
                if gbits == 5:  # a q5_0 / q5_1 block: 32 codes in 20 bytes
                    _ggml_block(data, o + gi * 20, off, gi * 32, sc, z, tile, j)
                else:
                    _codes(data, o, elem, pb, nb_, off, lut, gi * gp, (gi + 1) * gp, sc, z, tile, j)
        else:
            for i in range(nb_ * pb):
                tile[j, i] = _read(data, o + i * _width(elem), elem, lut) * s_row + z_row


@nb.njit(**_OPTS)
def _decode_block(meta, data, lut, scale, zero, slut, tsv, tzv, tail, npk, b, h, t0, n, live, tile):
    """Dequantize tokens t0..t0+n-1 (where live) of (batch b, kv head h) into tile[:n, :D] (planar order, see
    _codes). Token scales and tensor scales are applied while unpacking, one (scale, zero) per group of a row;
    channel scales (one per channel and token group) afterwards by _scale_channels."""
    d = meta[M_DIM]
    elem = meta[M_ELEM]
    pb = meta[M_PER_BYTE]
    nb_ = d // pb
    skind = meta[M_SKIND]
    off = np.float32(meta[M_OFFSET]) if skind != S_CHANNEL else np.float32(0.0)  # channels: in their zeros
    d_base = meta[M_D_OFF] + b * meta[M_D_SB] + h * meta[M_D_SH]
    d_st = meta[M_D_ST]
    sdt = meta[M_SDT]
    sw = _width(sdt)
    group = meta[M_GROUP] if skind == S_TOKEN else d  # channels sharing one (scale, zero) in a row
    gp = group // pb  # bytes of one group (planar: its channels sit at p * nb_ + [gi * gp, (gi + 1) * gp))
    has_zero = meta[M_ZERO]
    s_base = meta[M_S_OFF] + b * meta[M_S_SB] + h * meta[M_S_SH]
    s_st = meta[M_S_ST]
    z_base = meta[M_Z_OFF] + b * meta[M_Z_SB] + h * meta[M_Z_SH]
    z_st = meta[M_Z_ST]
    tdt = meta[M_TDT]
    tw = _width(tdt)
    t_base = meta[M_T_OFF] + b * meta[M_T_SB] + h * meta[M_T_SH]
    t_st = meta[M_T_ST]
    s_row = tsv if skind == S_NONE else np.float32(1.0)  # S_NONE: x = decode * tensor_scale + tensor zero
    z_row = tzv if skind == S_NONE else np.float32(0.0)
    ngroups = d // group
    geo = (pb, nb_, d_base, d_st, skind, sdt, sw, gp, ngroups, has_zero, s_base, s_st, z_base, z_st, tdt, tw,
           t_base, t_st, meta[M_GGML])  # fewer than 30 arguments: CPython passes more as *args, which numba cannot inline
    fl = (off, tsv, s_row, z_row)
    # One copy of the row loop per element kind, each with its kind a compile-time constant: with the kind only
    # known at run time LLVM leaves the unpacking loops scalar (measured 4x slower).
    if elem == E_UINT:
        _rows(data, lut, scale, zero, slut, tail, live, tile, E_UINT, geo, fl, npk, t0, n)
    elif elem == E_LUT:
        _rows(data, lut, scale, zero, slut, tail, live, tile, E_LUT, geo, fl, npk, t0, n)
    elif elem == E_INT8:
        _rows(data, lut, scale, zero, slut, tail, live, tile, E_INT8, geo, fl, npk, t0, n)
    elif elem == E_E2M1:
        _rows(data, lut, scale, zero, slut, tail, live, tile, E_E2M1, geo, fl, npk, t0, n)
    else:  # a 16 / 32-bit float cast
        _rows(data, lut, scale, zero, slut, tail, live, tile, elem, geo, fl, npk, t0, n)
    if skind == S_CHANNEL:
        _scale_channels(meta, scale, zero, slut, tsv, b, h, t0, n, npk, live, tile)


@nb.njit(**_OPTS)
def _scale_channels(meta, scale, zero, slut, tsv, b, h, t0, n, npk, live, tile):
    """Channel scales (KIVI's K) on rows of bare codes: packed row t takes scale row t // group, one (scale, zero)
    per channel, decoded once (_channel_row) for the run of tokens sharing it, so the per-token loop is a plain
    multiply-add that vectorizes."""
    d = meta[M_DIM]
    pb = meta[M_PER_BYTE]
    nb_ = d // pb
    group = meta[M_GROUP]
    srow = np.empty((pb, nb_), np.float32)
    zrow = np.empty((pb, nb_), np.float32)
    row = -1
    for j in range(n):
        t = t0 + j
        if not live[j] or t >= npk:
            continue
        if t // group != row:
            row = t // group
            _channel_row(meta, scale, zero, slut, tsv, b, h, row, srow, zrow)
        for p in range(pb):
            for i in range(nb_):
                tile[_U(j), _U(p * nb_ + i)] = tile[_U(j), _U(p * nb_ + i)] * srow[_U(p), _U(i)] + zrow[_U(p), _U(i)]


@nb.njit(**_OPTS)
def _flat_kind(meta):
    """Whether a side's blocks of packed, all-live rows take the flat path (_flat_block): code elements (int8,
    unsigned ints, E2M1, a table) or q5_0 / q5_1 blocks, with rows one contiguous run of bytes."""
    elem = meta[M_ELEM]
    pb = meta[M_PER_BYTE]
    d = meta[M_DIM]
    if meta[M_GGML] == 5:
        return meta[M_D_ST] == d * 5 // 8
    code = ((elem == E_INT8 and pb == 1) or elem == E_UINT or (elem == E_E2M1 and pb == 2)
            or (elem == E_LUT and pb <= 2))
    return code and meta[M_D_ST] == d // pb


@nb.njit(**_OPTS)
def _flat_shape(meta):
    """(fields per byte, elements per field of a row, scales per row) of a side on the flat path: the shapes of
    _flat_block's raw [fields, BLOCK * elements] and group scales [BLOCK, scales]."""
    if not _flat_kind(meta):
        return 1, 1, 1
    d = meta[M_DIM]
    pb = meta[M_PER_BYTE]
    skind = meta[M_SKIND]
    groups = d // meta[M_GROUP] if skind == S_TOKEN else (d if skind == S_CHANNEL else 1)
    return pb, d // pb, groups


@nb.njit(inline="always", **_OPTS)
def _field(data, o, nbytes, elem, pb, p, lut, raw):
    """raw[p, k] = the code in field p of byte o + k as a float, unscaled, for k < nbytes: field p holds the codes
    at bits (8 / pb) * p. One loop per field: two stores per iteration keep LLVM from vectorizing. Unsigned codes are
    shifted and masked as uint32 and converted from int32 (numba widens int32 products to int64, and AVX2 has no
    vector conversion from unsigned ints)."""
    if elem == E_INT8:
        for k in range(nbytes):
            raw[_U(p), _U(k)] = np.float32(np.int8(data[_U(o + k)]))
    elif elem == E_E2M1:
        sh = np.uint32(4 * p)
        for k in range(nbytes):
            raw[_U(p), _U(k)] = _e2m1((np.uint32(data[_U(o + k)]) >> sh) & np.uint32(15))
    elif elem == E_LUT:
        if pb == 1:
            for k in range(nbytes):
                raw[_U(p), _U(k)] = lut[data[_U(o + k)]]
        else:
            sh = np.uint32(4 * p)
            for k in range(nbytes):
                raw[_U(p), _U(k)] = lut[(np.uint32(data[_U(o + k)]) >> sh) & np.uint32(15)]
    elif pb == 1:
        for k in range(nbytes):
            raw[_U(p), _U(k)] = np.float32(np.int32(data[_U(o + k)]))
    else:
        w = np.uint32(8 // pb)
        sh = w * np.uint32(p)
        mask = (np.uint32(1) << w) - np.uint32(1)
        for k in range(nbytes):
            raw[_U(p), _U(k)] = np.float32(np.int32((np.uint32(data[_U(o + k)]) >> sh) & mask))


@nb.njit(inline="always", **_OPTS)
def _ggml_fields(data, o, n, ngroups, gsc, gzc, raw):
    """n rows of q5_0 / q5_1 blocks at byte offset o -> raw[0, (j * groups + gi) * 32 + e], element e of the block
    in ggml's order, as code * gsc[j, gi] + gzc[j, gi] (the offset folded into gzc): _ggml_block per block."""
    for j in range(n):
        for gi in range(ngroups):
            u = j * ngroups + gi
            _ggml_block(data, o + u * 20, np.float32(0.0), u * 32, gsc[j, gi], gzc[j, gi], raw, 0)


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


@nb.njit(**_OPTS)
def _flat_block(meta, data, lut, scale, zero, slut, tsv, tzv, b, h, t0, n, raw, gsc, gzc, sc, zc, apply_channels):
    """The flat path's decode of packed tokens t0..t0+n-1 of (b, h) into raw[p, j * nb + i] (channel p * nb + i of
    token j, planar order; q5_0 / q5_1 blocks in ggml's order) and sc / zc [BLOCK]: the token's channel is
    raw * sc[j] + zc[j]. With one scale per row (token or tensor scales) raw holds the bare codes, each field of
    the whole block unpacked in one loop, and consumers fold sc / zc into the scores and the softmax weights.
    With several scales per row (groups, llama.cpp's blocks, KIVI's channel scales) they are applied to the unpacked
    block (q5_0 / q5_1: while unpacking each block), and sc / zc are 1 / 0; channel scales only if apply_channels
    (else raw holds the bare codes). gsc / gzc [BLOCK, groups]: scratch for the stored scales."""
    d = meta[M_DIM]
    elem = meta[M_ELEM]
    pb = meta[M_PER_BYTE]
    nb_ = d // pb
    gbits = meta[M_GGML]
    off = np.float32(meta[M_OFFSET]) if elem == E_UINT else np.float32(0.0)
    o = meta[M_D_OFF] + b * meta[M_D_SB] + h * meta[M_D_SH] + t0 * meta[M_D_ST]
    one, nil = np.float32(1.0), np.float32(0.0)
    if gbits != 5:  # every field of the block's codes, unscaled, one loop each (q5 blocks: _ggml_fields below)
        for p in range(pb):
            _field(data, o, n * nb_, elem, pb, p, lut, raw)
    skind = meta[M_SKIND]
    if skind == S_NONE:
        for j in range(n):
            sc[j] = tsv
            zc[j] = tzv - off * tsv
        return
    sdt = meta[M_SDT]
    sw = _width(sdt)
    has_zero = meta[M_ZERO] != 0
    s_st, z_st = meta[M_S_ST], meta[M_Z_ST]
    s_base = meta[M_S_OFF] + b * meta[M_S_SB] + h * meta[M_S_SH]
    z_base = meta[M_Z_OFF] + b * meta[M_Z_SB] + h * meta[M_Z_SH]
    for j in range(n):
        sc[j] = one
        zc[j] = nil
    if skind == S_CHANNEL:  # KIVI's K: scale row t // group, one (scale, zero) per channel
        if not apply_channels:  # the caller folds them into q (_attend)
            return
        group = meta[M_GROUP]
        row = -1
        for j in range(n):
            if (t0 + j) // group != row:
                row = (t0 + j) // group
                _channel_row(meta, scale, zero, slut, tsv, b, h, row, gsc, gzc)
            for p in range(pb):
                r = j * nb_
                for i in range(nb_):
                    raw[_U(p), _U(r + i)] = raw[_U(p), _U(r + i)] * gsc[_U(p), _U(i)] + gzc[_U(p), _U(i)]
        return
    ngroups = d // meta[M_GROUP]
    _floats(scale, s_base + t0 * s_st, s_st, sw, sdt, slut, n, ngroups, gsc)
    if has_zero:  # zero points share the scales' storage type
        _floats(zero, z_base + t0 * z_st, z_st, sw, sdt, slut, n, ngroups, gzc)
    for j in range(n):  # x = code * s * tensor_scale + z - offset * s * tensor_scale
        for gi in range(ngroups):
            gsc[j, gi] *= tsv
            gzc[j, gi] = (gzc[j, gi] if has_zero else nil) - off * gsc[j, gi]
    if gbits == 5:
        _ggml_fields(data, o, n, ngroups, gsc, gzc, raw)
    elif ngroups == 1:
        for j in range(n):
            sc[j] = gsc[j, 0]
            zc[j] = gzc[j, 0]
    else:  # group gi of row j (bytes j * nb + gi * gp + [0, gp), planar: each field's channels of the group) scaled
        gp = nb_ // ngroups  # in place, after the unpacking: loops of one group's length unpack slowly
        for p in range(pb):
            for j in range(n):
                for gi in range(ngroups):
                    a = gsc[j, gi]
                    c = gzc[j, gi]
                    r = j * nb_ + gi * gp
                    for i in range(gp):
                        raw[_U(p), _U(r + i)] = raw[_U(p), _U(r + i)] * a + c


@nb.njit(**_OPTS)
def _flat_scores(q, qsum, raw, sc, zc, nb_, pb, j0, n, sm, s):
    """s[g, j] = (q[g] . row j) * sm for rows j0..n-1 of a flat-path K block (row j of channel p * nb + i =
    raw[p, j * nb + i] * sc[j] + zc[j]): the dot with raw, then * sc + zc * qsum (sum(q) over the channels). Four K
    rows at a time."""
    gqa = q.shape[0]
    j = j0
    while j + 4 <= n:
        r0 = j * nb_
        for g in range(gqa):
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for p in range(pb):
                qo = p * nb_
                for i in range(nb_):
                    qi = q[_U(g), _U(qo + i)]
                    a0 += qi * raw[_U(p), _U(r0 + i)]
                    a1 += qi * raw[_U(p), _U(r0 + nb_ + i)]
                    a2 += qi * raw[_U(p), _U(r0 + 2 * nb_ + i)]
                    a3 += qi * raw[_U(p), _U(r0 + 3 * nb_ + i)]
            qs = qsum[g]
            s[g, j] = (a0 * sc[j] + zc[j] * qs) * sm
            s[g, j + 1] = (a1 * sc[j + 1] + zc[j + 1] * qs) * sm
            s[g, j + 2] = (a2 * sc[j + 2] + zc[j + 2] * qs) * sm
            s[g, j + 3] = (a3 * sc[j + 3] + zc[j + 3] * qs) * sm
        j += 4
    for jj in range(j, n):
        for g in range(gqa):
            a = np.float32(0.0)
            for p in range(pb):
                qo = p * nb_
                ro = jj * nb_
                for i in range(nb_):
                    a += q[_U(g), _U(qo + i)] * raw[_U(p), _U(ro + i)]
            s[g, jj] = (a * sc[jj] + zc[jj] * qsum[g]) * sm


@nb.njit(**_OPTS)
def _flat_accumulate(s, raw, sc, zc, nb_, pb, n, acc, bias):
    """acc[g, channel] += sum over j < n of (s[g, j] * sc[j]) * raw, and bias[g] += s[g, j] * zc[j] (the rows'
    offsets, added to every channel once at the end) over a flat-path V block. Four V rows per pass."""
    gqa = acc.shape[0]
    j = 0
    while j + 4 <= n:
        r0 = j * nb_
        for g in range(gqa):
            w0 = s[g, j] * sc[j]
            w1 = s[g, j + 1] * sc[j + 1]
            w2 = s[g, j + 2] * sc[j + 2]
            w3 = s[g, j + 3] * sc[j + 3]
            bias[g] += (s[g, j] * zc[j] + s[g, j + 1] * zc[j + 1]) + (s[g, j + 2] * zc[j + 2] + s[g, j + 3] * zc[j + 3])
            for p in range(pb):
                ao = p * nb_
                for i in range(nb_):
                    acc[_U(g), _U(ao + i)] += (w0 * raw[_U(p), _U(r0 + i)] + w1 * raw[_U(p), _U(r0 + nb_ + i)]) + (
                        w2 * raw[_U(p), _U(r0 + 2 * nb_ + i)] + w3 * raw[_U(p), _U(r0 + 3 * nb_ + i)])
        j += 4
    for jj in range(j, n):
        for g in range(gqa):
            w = s[g, jj] * sc[jj]
            bias[g] += s[g, jj] * zc[jj]
            for p in range(pb):
                ao = p * nb_
                ro = jj * nb_
                for i in range(nb_):
                    acc[_U(g), _U(ao + i)] += w * raw[_U(p), _U(ro + i)]


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
    gqa, dk = q.shape
    dv = acc.shape[1]
    q = np.ascontiguousarray(q)  # a C-contiguous copy: with strided q loads the dot products stay scalar
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
    kgsc = np.empty((BLOCK, kgroups), np.float32)
    kgzc = np.empty((BLOCK, kgroups), np.float32)
    vgsc = np.empty((BLOCK, vgroups), np.float32)
    vgzc = np.empty((BLOCK, vgroups), np.float32)
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
            _flat_block(km, kdata, klut, kscale, kzero, kslut, kts_, ktz_, b, h, t0, n, kraw, kgsc, kgzc, ksc, kzc, False)
        else:
            _decode_block(km, kdata, klut, kscale, kzero, kslut, kts_, ktz_, ktail, kn_, b, h, t0, n, live, ktile)
        if vf:
            _flat_block(vm, vdata, vlut, vscale, vzero, vslut, vts_, vtz_, b, h, t0, n, vraw, vgsc, vgzc, vsc, vzc, True)
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
            _flat_scores(q, qsum, ktile1, ones, zeros, dk, 1, 0, n, sm, s)
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
            for i in range(dv):
                acc[g, i] *= alpha
            bias[g] *= alpha
        if vf:
            _flat_accumulate(s, vraw, vsc, vzc, vnb, vpb, n, acc, bias)
        else:
            _flat_accumulate(s, vtile1, ones, zeros, dv, 1, n, acc, bias)
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
