"""The row-by-row path of the fused CPU decode (numba): one token's packed row at a time into a [BLOCK, D] fp32
tile, for the blocks the flat path does not take (kernels/cpu/jit/flat.py): tails, masked blocks, float casts.

Rows past a side's n_packed come from its full-precision tail. llama.cpp's KV types keep their bytes: q8_0's int8
codes with one fp16 d per 32 are kvviz's int8/g32 layout byte for byte; q4_0, q4_1 and iq4_nl are 4-bit codes with
a scale group of 32 in a planar order of their own (the launcher orders q and the output for it; meta[M_GGML] = 4
tells the tail's reader); q5_0 and q5_1 (meta[M_GGML] = 5) are decoded 32 codes at a time from their blocks (a
4-byte qh, then 16 bytes of nibbles), in ggml's element order (_ggml_block).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from kernels.cpu.jit.contract import (
    E_BF16, E_E2M1, E_F16, E_INT8, E_LUT, E_UINT, M_DIM, M_D_OFF, M_D_SB, M_D_SH, M_D_ST, M_ELEM, M_GGML, M_GROUP,
    M_OFFSET, M_PER_BYTE, M_RENORM, M_SDT, M_SKIND, M_S_OFF, M_S_SB, M_S_SH, M_S_ST, M_TDT, M_T_OFF, M_T_SB,
    M_T_SH, M_T_ST, M_UNIT, M_ZERO, M_ZP, M_Z_OFF, M_Z_SB, M_Z_SH, M_Z_ST, S_CHANNEL, S_NONE, S_TOKEN,
)
from kernels.cpu.jit.fields import _OPTS, _U, _as_f32, _bits, _channel_row, _e2m1, _half, _read, _u16, _width


@nb.njit(inline="always", **_OPTS)
def _codes(data, o, elem, pb, ub, nb_, off, lut, lo, hi, s, z, tile, j):
    """Units lo..hi-1 of the packed row at byte offset o -> tile[j] as decode(code) * s + z, in planar order:
    element d of a row sits at (d % pb) * (D / pb) + d // pb for pb codes per unit (identity for pb = 1), so each
    field of a unit (low nibble, high nibble, ...) fills one contiguous run and the loops vectorize. A unit is a
    byte, or (ub = 3, 3-bit codes) a little-endian 24-bit word of 8 codes.

    Indices are cast to unsigned (_U), so numba emits no negative-index wraparound in these loops. No array view
    per row (`tile[j]`): each costs two atomic reference-count calls, which kept these loops ~4x slower."""
    if elem == E_LUT:  # fp8, E2M1, codebooks, 3-bit / 1-bit ints: codes through a table of 2**bits floats
        if ub == 3:  # one loop per field of the 24-bit word
            for p in range(8):
                sh = np.uint32(3 * p)
                for i in range(lo, hi):
                    b = _U(o + 3 * i)
                    word = np.uint32(data[b]) | (np.uint32(data[b + _U(1)]) << np.uint32(8)) | (
                        np.uint32(data[b + _U(2)]) << np.uint32(16))
                    tile[_U(j), _U(p * nb_ + i)] = lut[(word >> sh) & np.uint32(7)] * s + z
        elif pb == 1:
            for i in range(lo, hi):
                tile[_U(j), _U(i)] = lut[data[_U(o + i)]] * s + z
        else:  # one loop per field (nibble, 2 bits, bit): two stores per iteration keep LLVM from vectorizing
            w = np.uint32(8 // pb)
            mask = (np.uint32(1) << w) - np.uint32(1)
            for p in range(pb):
                sh = w * np.uint32(p)
                for i in range(lo, hi):
                    tile[_U(j), _U(p * nb_ + i)] = lut[(np.uint32(data[_U(o + i)]) >> sh) & mask] * s + z
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
     t_base, t_st, gbits, ub, renorm, zp) = geo
    off, tsv, s_row, z_row = fl
    one, nil = np.float32(1.0), np.float32(0.0)
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
                    if zp != 0:  # vLLM int4: the zero point sits in the fp32 scale's low zp bits
                        raw = _bits(sc)
                        low = (np.uint32(1) << np.uint32(zp)) - np.uint32(1)
                        sc = _as_f32(raw & ~low)
                        z = -np.float32(raw & low) * sc
                    elif has_zero != 0:
                        z = _read(zero, z_base + t * z_st + gi * sw, sdt, slut)
                if gbits == 5:  # a q5_0 / q5_1 block: 32 codes in 20 bytes
                    _ggml_block(data, o + gi * 20, off, gi * 32, sc, z, tile, j)
                elif renorm != 0:  # codebook row / its norm, then the scale (one group per row)
                    _codes(data, o, elem, pb, ub, nb_, off, lut, gi * gp, (gi + 1) * gp, one, nil, tile, j)
                    ss = np.float32(0.0)
                    for i in range(nb_ * pb):
                        ss += tile[_U(j), _U(i)] * tile[_U(j), _U(i)]
                    f = sc / np.float32(np.sqrt(ss + np.float32(1e-16)))
                    for i in range(nb_ * pb):
                        tile[_U(j), _U(i)] = tile[_U(j), _U(i)] * f + z
                else:
                    _codes(data, o, elem, pb, ub, nb_, off, lut, gi * gp, (gi + 1) * gp, sc, z, tile, j)
        else:  # a 16 / 32-bit float cast: its bytes as a tail row's, then the tensor scale
            _tail_row(data, o, elem, _width(elem), 1, nb_, 0, tile, j)
            for i in range(nb_):
                tile[_U(j), _U(i)] = tile[_U(j), _U(i)] * s_row + z_row


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
           t_base, t_st, meta[M_GGML], meta[M_UNIT], meta[M_RENORM], meta[M_ZP])
    # (a tuple: with 30 arguments or more CPython passes them as *args, which numba cannot inline)
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
