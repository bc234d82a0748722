"""The flat path of the fused CPU decode (numba): blocks whose rows are all packed and live.

_flat_block unpacks each bit field of the block's bytes in one loop over the whole block (no per-row loop). With
one scale per row (token or tensor scales) the row's affine map (scale, offset) is folded into the scores
(s = sc * (q . raw) + zc * sum q, _flat_scores) and into the softmax weights of V (acc += (p * sc) * raw, with
p * zc summed apart and added once, _flat_accumulate); with several (scale groups, llama.cpp's blocks, KIVI's
channel scales) they are applied to the block: as each group's codes unpack, 16 codes per vector, where the codes
and group shape allow, else in place after the unpacking (the unpacking loops: kernels/cpu/jit/unpack.py). Where a
field's row is a multiple of 16 channels the scores take 16 rows per call and the weighted V rows accumulate in
registers over the block (simd.py's _scores16 and _weighted16); other widths run the loops below.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from kernels.cpu.jit.contract import (
    E_BF16, E_E2M1, E_F16, E_F32, E_INT8, E_LUT, E_UINT, M_DIM, M_D_OFF, M_D_SB, M_D_SH, M_D_ST, M_ELEM, M_GGML, M_GROUP, M_OFFSET,
    M_PER_BYTE, M_RENORM, M_SDT, M_SKIND, M_S_OFF, M_S_SB, M_S_SH, M_S_ST, M_UNIT, M_ZERO, M_ZP, M_Z_OFF, M_Z_SB,
    M_Z_SH, M_Z_ST, S_CHANNEL, S_NONE, S_TOKEN,
)
from kernels.cpu.jit.fields import _OPTS, _U, _as_f32, _bits, _channel_row, _floats, _half, _width
from kernels.cpu.jit.simd import _scores16, _weighted16
from kernels.cpu.jit.unpack import _field, _ggml_fields, _scaled_units, _unit_kind


@nb.njit(**_OPTS)
def _flat_kind(meta):
    """Whether a side's blocks of packed, all-live rows take the flat path (_flat_block): code elements (int8,
    unsigned ints, E2M1, a table), q5_0 / q5_1 blocks or 16 / 32-bit float casts, with rows one contiguous run of
    bytes."""
    elem = meta[M_ELEM]
    pb = meta[M_PER_BYTE]
    d = meta[M_DIM]
    if meta[M_GGML] == 5:
        return meta[M_D_ST] == d * 5 // 8
    if elem == E_F16 or elem == E_BF16 or elem == E_F32:
        return meta[M_D_ST] == d * _width(elem)
    code = ((elem == E_INT8 and pb == 1) or (elem == E_UINT and meta[M_UNIT] == 1) or (elem == E_E2M1 and pb == 2)
            or elem == E_LUT)
    return code and meta[M_D_ST] == d // pb * meta[M_UNIT]


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
def _row_floats(buf, base, st, dt, lut, n, out):
    """out[j] = the stored float of row j (byte offset base + j * st, storage type dt): _floats for one group per
    row, with the common strides (a row's own fp16 or fp32 scale) as literals, so that the loads vectorize."""
    if dt == E_LUT and st == 1:  # E8M0 / UE4M3 scales: one byte each
        for j in range(n):
            out[_U(j)] = lut[buf[_U(base + j)]]
    elif dt == E_F16 and st == 2:
        for j in range(n):
            o = _U(base + 2 * j)
            out[_U(j)] = _half(np.uint32(buf[o]) | (np.uint32(buf[o + _U(1)]) << np.uint32(8)))
    elif dt == E_F32 and st == 4:
        for j in range(n):
            o = _U(base + 4 * j)
            out[_U(j)] = _as_f32(np.uint32(buf[o]) | (np.uint32(buf[o + _U(1)]) << np.uint32(8))
                                 | (np.uint32(buf[o + _U(2)]) << np.uint32(16))
                                 | (np.uint32(buf[o + _U(3)]) << np.uint32(24)))
    else:
        _floats(buf, base, st, _width(dt), dt, lut, n, 1, out.reshape(out.shape[0], 1))


@nb.njit(inline="always", **_OPTS)
def _group_floats(buf, base, st, sw, dt, lut, n, ngroups, out, flat):
    """_floats into out [BLOCK, ngroups] (flat: the same memory, one dimension): where the rows' groups lie back
    to back (st = ngroups * sw, as a cache's buffers hold them), as one run of n * ngroups floats."""
    if st == ngroups * sw:
        _row_floats(buf, base, sw, dt, lut, n * ngroups, flat)
    else:
        _floats(buf, base, st, sw, dt, lut, n, ngroups, out)


@nb.njit(inline="always", **_OPTS)
def _zero_points(gs, gz, m, zp):
    """vLLM int4: each of the m fp32 scales' low zp bits are a zero point: gs[k] becomes the cleared scale and gz[k]
    -(zero point) * it, so x = code * gs + gz = (code - zp) * the cleared scale."""
    low = (np.uint32(1) << np.uint32(zp)) - np.uint32(1)
    for k in range(m):
        bits = _bits(gs[k])
        gs[k] = _as_f32(bits & ~low)
        gz[k] = -np.float32(bits & low) * gs[k]


@nb.njit(inline="always", **_OPTS)
def _renorm(raw, pb, nb_, n, sc):
    """vLLM TurboQuant "nc": sc[j] /= the norm of row j's codebook values (raw), so the row is the codebook row
    over its norm, times the stored norm."""
    for j in range(n):
        ss = np.float32(0.0)
        for p in range(pb):
            r = j * nb_
            for i in range(nb_):
                ss += raw[_U(p), _U(r + i)] * raw[_U(p), _U(r + i)]
        sc[j] = sc[j] / np.float32(np.sqrt(ss + np.float32(1e-16)))


@nb.njit(**_OPTS)
def _flat_block(meta, data, lut, scale, zero, slut, tsv, tzv, b, h, t0, n, raw, gsc, gzc, gs, gz, sc, zc,
                apply_channels):
    """The flat path's decode of packed tokens t0..t0+n-1 of (b, h) into raw[p, j * nb + i] (channel p * nb + i of
    token j, planar order; q5_0 / q5_1 blocks in ggml's order) and sc / zc [BLOCK]: the token's channel is
    raw * sc[j] + zc[j]. With one scale per row (token or tensor scales) raw holds the bare codes, each field of
    the whole block unpacked in one loop, and consumers fold sc / zc into the scores and the softmax weights.
    With several scales per row (groups, llama.cpp's blocks, KIVI's channel scales) they are applied to the block
    (groups: as they unpack where _unit_kind allows, q5_0 / q5_1: while unpacking each block), and sc / zc are
    1 / 0; channel scales only if apply_channels (else raw holds the bare codes). gsc / gzc [BLOCK, groups]:
    scratch for the stored scales; gs / gz: the same memory, flat (group gi of row j at j * groups + gi)."""
    d = meta[M_DIM]
    elem = meta[M_ELEM]
    pb = meta[M_PER_BYTE]
    nb_ = d // pb
    gbits = meta[M_GGML]
    off = np.float32(meta[M_OFFSET]) if elem == E_UINT else np.float32(0.0)
    o = meta[M_D_OFF] + b * meta[M_D_SB] + h * meta[M_D_SH] + t0 * meta[M_D_ST]
    one, nil = np.float32(1.0), np.float32(0.0)
    ub = meta[M_UNIT]
    skind = meta[M_SKIND]
    grouped = skind == S_TOKEN and gbits != 5 and meta[M_GROUP] < d
    if not grouped:  # every field of the block's codes, unscaled, one loop each (q5 blocks: _ggml_fields below)
        if gbits != 5:
            for p in range(pb):
                _field(data, o, n * nb_, elem, pb, ub, p, lut, raw)
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
    zp = meta[M_ZP]
    if skind == S_TOKEN and meta[M_GROUP] == d and gbits != 5:  # one stored scale per row: straight into sc, zc
        _row_floats(scale, s_base + t0 * s_st, s_st, sdt, slut, n, sc)
        if has_zero:  # zero points share the scales' storage type
            _row_floats(zero, z_base + t0 * z_st, z_st, sdt, slut, n, zc)
        if zp != 0:
            _zero_points(sc, zc, n, zp)
            has_zero = True
        for j in range(n):  # as below: x = code * s * tensor_scale + z - offset * s * tensor_scale
            a = sc[j] * tsv
            sc[j] = a
            zc[j] = (zc[j] if has_zero else nil) - off * a
        if meta[M_RENORM] != 0:
            _renorm(raw, pb, nb_, n, sc)
        return
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
    units = n * ngroups
    _group_floats(scale, s_base + t0 * s_st, s_st, sw, sdt, slut, n, ngroups, gsc, gs)
    if has_zero:  # zero points share the scales' storage type
        _group_floats(zero, z_base + t0 * z_st, z_st, sw, sdt, slut, n, ngroups, gzc, gz)
    if zp != 0:
        _zero_points(gs, gz, units, zp)
        has_zero = True
    for k in range(units):  # x = code * s * tensor_scale + z - offset * s * tensor_scale
        a = gs[k] * tsv
        gs[k] = a
        gz[k] = (gz[k] if has_zero else nil) - off * a
    if gbits == 5:
        _ggml_fields(data, o, n, ngroups, gsc, gzc, raw)
    else:  # group gi of row j: bytes j * nb + gi * gp + [0, gp) of each field (planar: the group's channels)
        gp = nb_ // ngroups
        code = _unit_kind(elem, pb, ub)
        if code >= 0 and (gp % 16 == 0 or (gp == 8 and units % 2 == 0)):
            for p in range(pb):
                _scaled_units(data, o, code, p, gs, gz, units, gp, raw)
            return
        for p in range(pb):  # any other group: unpacked, then scaled in place
            _field(data, o, n * nb_, elem, pb, ub, p, lut, raw)
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
    raw[p, j * nb + i] * sc[j] + zc[j]): the dot with raw, then * sc + zc * qsum (sum(q) over the channels). 16 K
    rows per call where nb is a multiple of 16 (_scores16), then four at a time."""
    gqa = q.shape[0]
    j = j0
    if nb_ % 16 == 0:  # 16 rows per call, their dot products summed as one vector (simd.py)
        w, dq, ds = raw.shape[1], q.shape[1], s.shape[1]
        while j + 16 <= n:
            for g in range(gqa):
                _scores16(q, g * dq, raw, j * nb_, w, nb_, pb, sc, zc, j, qsum[g], sm, s, g * ds + j)
            j += 16
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
    offsets, added to every channel once at the end) over a flat-path V block. Where nb is a multiple of 16 the
    weights s * sc are formed in s and _weighted16 adds every row; else four V rows per pass."""
    gqa = acc.shape[0]
    if nb_ % 16 == 0:  # the weights first (s becomes s * sc), then every row into acc in registers (simd.py)
        ds, da = s.shape[1], acc.shape[1]
        for g in range(gqa):
            bz = np.float32(0.0)
            for j in range(n):
                bz += s[g, j] * zc[j]
                s[g, j] *= sc[j]
            bias[g] += bz
            _weighted16(s, g * ds, raw, 0, raw.shape[1], nb_, pb, n, acc, g * da)
        return
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
