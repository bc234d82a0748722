"""numba code that quantizes new K or V tokens and writes them, packed, into a cache's buffers; the launcher is
kernels/cpu/pack.py (it imports this lazily). The CPU twin of kernels/jit/pack.py.

One compiled signature serves every format: x arrives as fp32 [B, Hkv, T, D] (an fp16 / bf16 input converted
exactly, rotated first for /rot), each output buffer as the uint8 view of its [B, Hkv, cap, n] tensor (nothing
copied), and the format as integers. Per token and scale
group the loop reduces, encodes and stores: bytes moved per token and head are D * 4 read and D * bits / 8 codes plus
the group scales written.

Bit-exact with kvviz.formats: every step is the same fp32 operation in the same order (no fastmath: IEEE division,
no fused multiply-add), and rounding to fp16, fp8 and E2M1 is done in integer arithmetic, round half to even:
- int sym:  s = fp16(clamp(amax / qmax, 2**-24, 65504)); q = clamp(rint(x / s), +-qmax), stored q + 2**(bits-1)
            (int8: signed); an fp16 x divides in fp16 as torch does; a static (tensor / head) s is the fp32 given.
            Any width of 1..8 bits: 8 // bits codes a byte where bits divides 8, else a little-endian bit stream
            (3 bits: 8 codes in 3 bytes), as kernels/packed.py's layout says.
- int asym: s = fp16(clamp((max - min) / (2**bits - 1))), zero = fp16(min), u = clamp(rint((x - zero) / s)).
- fp8:      s = max(amax / fmax, FLT_MIN) (1 when amax = 0) or the static s; code = fp8_rne(clamp(x / s, +-fmax)).
- MX:       E8M0 byte = clamp(floor(log2 amax) - 2, -127, 127) + 127; code = e2m1(x * 2**-e).
- NV:       block = e4m3_rne(min(amax / 6 / ts, 448)); code = e2m1(x / (block * ts)).
Reductions count non-finite elements as 0; a group holding Inf or NaN stores a NaN scale (fp16 0x7E00, E8M0 0xFF,
E4M3 0x7F) and NaN elements store code 0 (int: after the sym offset, as torch's nan_to_num does), fp8's NaN 0x7F.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

# KIND codes (kernels/cpu/pack.py passes them): kernels.packed.PACKERS' order, then llama.cpp's blocks
KIND_INT_SYM, KIND_INT_ASYM, KIND_FP8, KIND_MX, KIND_NV, KIND_GGML = 0, 1, 2, 3, 4, 5
# No fastmath: every operation must round exactly as torch's does. error_model numpy: x / 0 is IEEE, not a raise.
_OPTS = dict(cache=True, nogil=True, error_model="numpy")

_F32 = np.float32
_F16_TINY = _F32(2.0**-24)  # fp16's smallest subnormal: the int scale floor
_F16_MAX = _F32(65504.0)
_F32_TINY = _F32(1.1754943508222875e-38)  # FLT_MIN: the fp8 scale floor (kvviz.formats.floats)
_RINT = _F32(12582912.0)  # 1.5 * 2**23


@intrinsic
def _bits(typingctx, value):
    """float32 -> its IEEE bits as a non-negative int64 (a register bitcast)."""
    if not isinstance(value, types.Float) or value.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.zext(builder.bitcast(args[0], ir.IntType(32)), ir.IntType(64))

    return types.int64(value), codegen


@intrinsic
def _float(typingctx, bits):
    """The low 32 bits of an integer -> the float32 they encode."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value = args[0]
        if bits.bitwidth > 32:
            value = builder.trunc(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())

    return types.float32(bits), codegen


@nb.njit(**_OPTS)
def _rint(y):
    """Round half to even for |y| < 2**22 (fp32): adding 1.5 * 2**23 leaves no fraction bits, and the add rounds."""
    return (y + _RINT) - _RINT


@nb.njit(**_OPTS)
def _f16_round(y):
    """fp32 -> the nearest fp16 value as fp32 (ties to even, overflow to Inf): torch's .to(float16)."""
    a = _bits(y) & 0x7FFFFFFF
    if a >= 0x7F800000:
        return y
    if a < 0x38800000:  # below fp16's smallest normal 2**-14: multiples of 2**-24
        r = _rint(abs(y) * _F32(16777216.0)) * _F16_TINY
    else:
        a = (a + 0xFFF + ((a >> 13) & 1)) & ~0x1FFF  # round the mantissa to 10 bits
        r = _float(0x7F800000) if a > 0x477FE000 else _float(a)  # beyond 65504: Inf
    return -r if _bits(y) >> 31 else r


@nb.njit(**_OPTS)
def _f16_bits(v):
    """An fp16-representable fp32 (or Inf / NaN) -> its fp16 bits; NaN -> 0x7E00, torch's NaN."""
    b = _bits(v)
    a = b & 0x7FFFFFFF
    sign = (b >> 16) & 0x8000
    if a > 0x7F800000:
        return 0x7E00
    if a == 0x7F800000:
        return sign | 0x7C00
    if a < 0x38800000:
        return sign | np.int64(abs(v) * _F32(16777216.0))
    return sign | ((((a >> 23) - 112) << 10) | ((a >> 13) & 0x3FF))


@nb.njit(**_OPTS)
def _fp8(y, exp):
    """fp32 (finite within the format's range, or NaN) -> OCP fp8 byte, round to nearest even, as torch's cast.
    exp=4: E4M3FN, exp=5: E5M2. NaN -> 0x7F | sign."""
    man = 7 - exp
    b = _bits(y)
    sign = (b >> 24) & 0x80
    a = b & 0x7FFFFFFF
    if a > 0x7F800000:
        return sign | 0x7F
    if a < ((129 - (1 << (exp - 1))) << 23):  # subnormal: |y| in units of the smallest subnormal, rounded RNE
        unit = _F32(512.0) if exp == 4 else _F32(65536.0)  # 2**9, 2**16
        return sign | np.int64(_rint(_float(a) * unit))
    mag = (a + ((1 << (22 - man)) - 1) + ((a >> (23 - man)) & 1)) >> (23 - man)  # mantissa rounded to `man` bits
    return sign | (mag - ((128 - (1 << (exp - 1))) << man))  # rebase the exponent


@nb.njit(**_OPTS)
def _e4m3_value(code):
    """E4M3FN byte (not NaN) -> its fp32 value, exact."""
    e = (code >> 3) & 0xF
    m = code & 7
    v = _F32(m) * _F32(2.0**-9) if e == 0 else _float(((e + 120) << 23) | (m << 20))
    return -v if code & 0x80 else v


@nb.njit(**_OPTS)
def _e2m1(v):
    """fp32 -> E2M1 code 0..15: nearest of +-{0,.5,1,1.5,2,3,4,6}, ties to the even code, saturating; NaN -> 0.
    A midpoint between codes c and c+1 rounds up when c+1 is even (>=), else stays (>)."""
    m = abs(v)
    code = (np.int64(m > _F32(0.25)) + np.int64(m >= _F32(0.75)) + np.int64(m > _F32(1.25))
            + np.int64(m >= _F32(1.75)) + np.int64(m > _F32(2.5)) + np.int64(m >= _F32(3.5)) + np.int64(m > _F32(5.0)))
    return code | 8 if v < 0 else code


@nb.njit(**_OPTS)
def _group_codes(row, lo, hi, kind, bits, exp, static, half_div, ts, codes):
    """Quantize row[lo:hi] (one scale group of one token) into codes[lo:hi]; returns (scale bits, zero bits)
    as stored (fp16 / fp32 bits, an E8M0 or E4M3 byte), -1 for none."""
    amax, mn, mx, bad = _F32(0.0), _F32(0.0), _F32(0.0), False
    for i in range(lo, hi):
        v = row[i]
        if not abs(v) < _F32(np.inf):  # Inf or NaN: counts as 0 in the reductions, makes the group's scale NaN
            v, bad = _F32(0.0), True
        amax = max(amax, abs(v))
        mn = v if i == lo else min(mn, v)
        mx = v if i == lo else max(mx, v)
    s_bits, z_bits = np.int64(-1), np.int64(-1)
    if kind == KIND_INT_SYM or kind == KIND_INT_ASYM:
        zero = _F32(0.0)
        if kind == KIND_INT_SYM:
            qmax = (1 << (bits - 1)) - 1
            lo_q, hi_q = -qmax, qmax
            if static:
                s = ts
            else:
                s = _f16_round(min(max(amax / _F32(qmax), _F16_TINY), _F16_MAX))
        else:
            lo_q, hi_q = 0, (1 << bits) - 1
            s = _f16_round(min(max((mx - mn) / _F32(hi_q), _F16_TINY), _F16_MAX))
            zero = _f16_round(min(max(mn, -_F16_MAX), _F16_MAX))
            z_bits = 0x7E00 if bad else _f16_bits(zero)
        offset = 1 << (bits - 1) if kind == KIND_INT_SYM and bits < 8 else 0
        for i in range(lo, hi):
            y = (row[i] - zero) / s if kind == KIND_INT_ASYM else row[i] / s
            if half_div:  # torch divides fp16 by fp16: the fp32 quotient rounded to fp16
                y = _f16_round(y)
            if y != y:  # NaN: torch's nan_to_num after round, clamp and the sym offset
                codes[i] = 0
            else:
                codes[i] = np.int64(_rint(min(max(y, _F32(lo_q)), _F32(hi_q)))) + offset
        if not static:
            s_bits = 0x7E00 if bad else _f16_bits(s)
    elif kind == KIND_FP8:
        fmax = _F32(448.0) if exp == 4 else _F32(57344.0)
        if static:
            s = ts
        else:
            s = max(amax / fmax, _F32_TINY) if amax > 0 else _F32(1.0)
            s_bits = _bits(s)
        for i in range(lo, hi):
            y = row[i] / s
            y = min(max(y, -fmax), fmax) if abs(y) < _F32(np.inf) else _F32(np.nan)
            codes[i] = _fp8(y, exp)
    elif kind == KIND_MX:
        e = ((_bits(amax) >> 23) & 0xFF) - 129 if amax > 0 else -127  # floor(log2 amax) - 2 (E2M1's emax)
        e = min(max(e, -127), 127)
        inv = _float((127 - e) << 23)  # 2**-e, exact
        for i in range(lo, hi):
            codes[i] = _e2m1(row[i] * inv)
        s_bits = 0xFF if bad else e + 127
    else:  # NV: an E4M3 block scale relative to the tensor scale ts
        block = _fp8(min(amax / _F32(6.0) / ts, _F32(448.0)), 4)
        eff = _e4m3_value(block) * ts
        for i in range(lo, hi):
            codes[i] = _e2m1(row[i] / eff) if eff > 0 and not bad else 0
        s_bits = 0x7F if bad else block
    return s_bits, z_bits


@nb.njit(**_OPTS)
def _pack_codes(codes, dim, bits, data, b, h, r):
    """codes[0:dim] -> row r of data: element e at bit e * bits of the row's little-endian stream (8 codes a word)."""
    for w in range(dim // 8):
        word = np.int64(0)
        for j in range(8):
            word |= codes[8 * w + j] << (bits * j)
        for i in range(bits):
            data[b, h, r, w * bits + i] = (word >> (8 * i)) & 0xFF


@nb.njit(**_OPTS)
def quant_pack_rows(x, ts, data, scale, zero, kind, bits, exp, group, static, half_div, pos, count):
    """Quantize x: fp32 [B, Hkv, T, D] and write token t at row pos + t of the buffers, each the uint8 view of its
    [B, Hkv, cap, n] tensor (data: codes; scale / zero: the bytes of D / group scales and zero points).
    ts: fp32 static or global scales, 1, Hkv or B * Hkv of them. Returns how many values saturated
    (|x| > fmax * s * (1 + 1e-6)) when `count` is set (static fp8), else 0."""
    n_b, n_h, n_t, dim = x.shape
    s_width = 2 if kind <= KIND_INT_ASYM else (4 if kind == KIND_FP8 else 1)
    fmax = _F32(448.0) if exp == 4 else _F32(57344.0)
    per_byte = 8 // bits if bits < 8 else 1
    codes = np.empty(dim, np.int64)
    saturated = 0
    for b in range(n_b):
        for h in range(n_h):
            s_h = ts[(b * n_h + h) % ts.size]
            limit = (fmax * s_h) * _F32(1.000001)  # kvviz.cache's slack: amax / fmax * fmax may round down
            for t in range(n_t):
                row, r = x[b, h, t], pos + t
                for g in range(dim // group):
                    s_bits, z_bits = _group_codes(row, g * group, (g + 1) * group, kind, bits, exp, static, half_div,
                                                  s_h, codes)
                    for i in range(s_width if s_bits >= 0 else 0):  # little-endian bytes
                        scale[b, h, r, g * s_width + i] = (s_bits >> (8 * i)) & 0xFF
                    if z_bits >= 0:
                        zero[b, h, r, 2 * g] = z_bits & 0xFF
                        zero[b, h, r, 2 * g + 1] = z_bits >> 8
                if 8 % bits == 0:
                    for j in range(dim // per_byte):  # element per_byte * j + k at bits * k of byte j
                        byte = 0
                        for k in range(per_byte):
                            byte |= codes[per_byte * j + k] << (bits * k)
                        data[b, h, r, j] = byte & 0xFF
                else:  # element e at bit e * bits of the row's little-endian stream: 8 codes in `bits` bytes
                    _pack_codes(codes, dim, bits, data, b, h, r)
                if count:
                    for i in range(dim):
                        saturated += abs(row[i]) > limit
    return saturated


# ------------------------------------------------------------------------------------------ llama.cpp's types

# GGML codes (kernels/cpu/pack.py passes them): the type's base
GGML_Q8_0, GGML_Q4_0, GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_IQ4_NL = range(6)
_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
_GROUP_MAX_EPS = _F32(1e-15)


@nb.njit(**_OPTS)
def _inverse(d):
    """ggml's `id = d ? 1.0f/d : 0.0f`."""
    return _F32(1.0) / d if d != 0 else _F32(0.0)


@nb.njit(**_OPTS)
def _code(y, top):
    """trunc(y) clamped to 0..top as an int, as torch's trunc, clamp and int cast give it; NaN (0 * an infinite 1/d)
    -> 0."""
    if y != y:
        return 0
    return np.int64(min(max(y, _F32(0.0)), _F32(top)))


@nb.njit(**_OPTS)
def _ggml_block(v, base, values, mids2, codes):
    """One block of 32 finite fp32 values -> codes[0:32] and (d, m) in fp32 before their fp16 rounding, as
    kvviz.formats.ggml (ggml's quantize_row_<type>_ref), operation for operation."""
    amax, mx = _F32(0.0), _F32(0.0)  # the largest |x| and the signed value that first reaches it
    lo, hi = v[0], v[0]  # the first min and the first max
    for i in range(32):
        a = abs(v[i])
        if a > amax:
            amax, mx = a, v[i]
        if v[i] < lo:
            lo = v[i]
        if v[i] > hi:
            hi = v[i]
    m = _F32(0.0)
    if base == GGML_Q8_0:
        d = amax / _F32(127.0)
        inv = _inverse(d)
        for i in range(32):  # C's roundf: halves away from zero. An infinite 1/d (subnormal d) gives code 0, as
            y = v[i] * inv  # torch's cast of +-Inf and NaN to int16 does on x86
            if abs(y) < _F32(np.inf):
                r = _F32(np.int64(y))
                codes[i] = np.int64(r) + (np.int64(1 if y > 0 else -1) if abs(y - r) >= _F32(0.5) else 0)
            else:
                codes[i] = 0
    elif base == GGML_Q4_1 or base == GGML_Q5_1:
        top = 15 if base == GGML_Q4_1 else 31
        d = (hi - lo) / _F32(top)
        inv = _inverse(d)
        m = lo
        for i in range(32):
            codes[i] = _code((v[i] - lo) * inv + _F32(0.5), top)
    elif base == GGML_Q4_0 or base == GGML_Q5_0:
        off = 8 if base == GGML_Q4_0 else 16
        d = mx / _F32(-off)
        inv = _inverse(d)
        for i in range(32):
            codes[i] = _code(v[i] * inv + _F32(off + 0.5), 2 * off - 1)
    else:  # iq4_nl, ntry = -1: d0 = max / -127, nearest table entries, then the weighted least-squares d
        if not amax >= _GROUP_MAX_EPS:
            for i in range(32):
                codes[i] = 0
            return _F32(0.0), m
        inv = _F32(1.0) / (mx / _F32(-127.0))
        sumqx, sumq2 = _F32(0.0), _F32(0.0)
        for i in range(32):
            y = inv * v[i]
            c = 0
            for j in range(15):  # index j + 1 once 2y >= values[j] + values[j + 1]: ties to the larger
                c += (y + y) >= mids2[j]
            codes[i] = c
            q = values[c]
            wq = (v[i] * v[i]) * q
            sumqx = sumqx + wq * v[i]
            sumq2 = sumq2 + wq * q
        d = sumqx / sumq2 if sumq2 > 0 else _F32(0.0)
    return d, m


@nb.njit(**_OPTS)
def ggml_pack_rows(x, data, scale, zero, base, bits, pos):
    """Quantize x: fp32 [B, Hkv, T, D] as one of llama.cpp's types and write token t at row pos + t of the buffers
    (uint8 views of their [B, Hkv, cap, n] tensors), in kvviz.formats.ggml's layout: data q8_0 int8 codes in order,
    else per block of 32 (qh: bit i of a little-endian uint32 = bit 4 of code i, for 5 bits) then qs (byte i = code
    i | code i + 16 << 4); scale / zero: d / m as fp16 per block. A block holding Inf or NaN stores d (and m) NaN,
    its codes from the block with those values taken as 0."""
    n_b, n_h, n_t, dim = x.shape
    values = _IQ4NL
    mids2 = values[:-1] + values[1:]
    v = np.empty(32, np.float32)
    codes = np.empty(32, np.int64)
    bb = 32 if base == GGML_Q8_0 else 4 * bits  # data bytes per block
    for b in range(n_b):
        for h in range(n_h):
            for t in range(n_t):
                r = pos + t
                for k in range(dim // 32):
                    bad = False
                    for i in range(32):
                        e = x[b, h, t, 32 * k + i]
                        if not abs(e) < _F32(np.inf):
                            e, bad = _F32(0.0), True
                        v[i] = e
                    d, m = _ggml_block(v, base, values, mids2, codes)
                    d_bits = 0x7E00 if bad else _f16_bits(_f16_round(d))
                    scale[b, h, r, 2 * k] = d_bits & 0xFF
                    scale[b, h, r, 2 * k + 1] = d_bits >> 8
                    if base == GGML_Q4_1 or base == GGML_Q5_1:
                        m_bits = 0x7E00 if bad else _f16_bits(_f16_round(m))
                        zero[b, h, r, 2 * k] = m_bits & 0xFF
                        zero[b, h, r, 2 * k + 1] = m_bits >> 8
                    o = k * bb
                    if base == GGML_Q8_0:
                        for i in range(32):
                            data[b, h, r, o + i] = codes[i] & 0xFF
                        continue
                    if bits == 5:
                        qh = 0
                        for i in range(32):
                            qh |= ((codes[i] >> 4) & 1) << i
                        for i in range(4):
                            data[b, h, r, o + i] = (qh >> (8 * i)) & 0xFF
                        o += 4
                    for i in range(16):
                        data[b, h, r, o + i] = (codes[i] & 15) | ((codes[i + 16] & 15) << 4)
