"""numba code that quantizes new K or V tokens as the engines' stores do and writes them, packed, into a cache's
buffers: vLLM's int8 / fp8 / int4 per-token-head and NVFP4 (kvviz/formats/vllm.py), vLLM's TurboQuant keys and
values (kvviz/formats/turboquant.py). The launcher is kernels/cpu/pack.py; kernels/cpu/jit/step.py calls it inside
the one-call decode step.

Bit-exact with kvviz.formats: the same fp32 operations in the same order (no fastmath: IEEE division, no fused
multiply-add), roundings to fp16 / bf16 / E4M3 / E2M1 in integer arithmetic (kernels/cpu/jit/pack.py's helpers):
- int8 / fp8 per token head: s = max(amax / qmax, 1e-6) (fp32), inv = 1 / s; int8: y = x * inv +- 0.5 (the sign
  of the fp32 product; the multiply-add in float64, one rounding, as an FMA), clamped to -128..127, truncated toward
  zero; E4M3: clamp(x * inv, -448, 448) to nearest even; s stored as fp32.
- int4 per token head: x * signs, the unnormalized Walsh-Hadamard butterfly in fp32 over each block of the largest
  power of two dividing D, rounded to the model's dtype;
  s = max((max - min) / 15, 1e-6), zp = round_away(-min / s) in 0..15, codes round_away(fp32(x * (1 / s) + zp)) with
  the multiply-add in float64 (one rounding, as an FMA), zp in the low 4 bits of the fp32 scale.
- NVFP4 (and 4over6): per 16 values an E4M3 block scale e4m3(min(amax * fp32(1 / 6), 448)), elements e2m1(x / scale)
  with the sign of x * (1 / scale); 4over6 keeps the divisor 4 when its squared error (fp32, pair by pair) is lower.
- TurboQuant key: formats.turboquant.key_rotation's fixed order: norm = sqrt of the squares summed in 8 fp32
  lanes, then the lanes; y = (x / (norm + 1e-8)) @ H accumulated over the rows of H, one fp32 rounding per step
  (product and sum in float64); index = the count of codebook midpoints <= y; norm stored as fp16.
- TurboQuant value: s = (max - min) / levels (at least 1e-8), codes trunc((x - min) / s + 0.5) in 0..levels; s and
  min stored as fp16.
Codes are packed little-endian, element e at bit e * bits of the token's stream (two a byte, or 8 in 3 bytes).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from kernels.cpu.jit.pack import _OPTS, _bits, _e4m3_value, _f16_bits, _f16_round, _float, _fp8, _pack_codes

_U = np.uint64  # an index known to be >= 0: no wraparound check, so the loop vectorizes

# ENGINE codes (kernels/cpu/pack.py passes them)
EN_INT8, EN_FP8, EN_INT4, EN_NVFP4, EN_NVFP4_4OVER6, EN_TQ_KEY, EN_TQ_VALUE = range(7)
# the model's dtype, for int4's rotated values (rounded to it before they are quantized)
DT_F32, DT_F16, DT_BF16 = 0, 1, 2

_F32 = np.float32
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


@nb.njit(**_OPTS)
def _bf16_round(y):
    """fp32 -> the nearest bfloat16 value as fp32 (ties to even), as torch's .to(bfloat16); NaN stays NaN."""
    b = _bits(y)
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return y
    return _float((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000)


@nb.njit(**_OPTS)
def _round_away(v):
    """Triton's where(v >= 0, trunc(v + 0.5), trunc(v - 0.5)) in fp32, v clamped to +-2**30 first."""
    v = min(max(v, _F32(-(2.0**30))), _F32(2.0**30))
    return _F32(math.trunc(v + _F32(0.5))) if v >= 0 else _F32(math.trunc(v - _F32(0.5)))


@nb.njit(**_OPTS)
def _e2m1_mag(m):
    """|v| (fp32, NaN -> 0) -> the E2M1 magnitude code 0..7, ties to the even code, saturating (fp4.e2m1_encode)."""
    if m != m:
        return 0
    return (np.int64(m > _F32(0.25)) + np.int64(m >= _F32(0.75)) + np.int64(m > _F32(1.25))
            + np.int64(m >= _F32(1.75)) + np.int64(m > _F32(2.5)) + np.int64(m >= _F32(3.5)) + np.int64(m > _F32(5.0)))


@nb.njit(**_OPTS)
def _signbit(v):
    return (_bits(v) >> 31) & 1


@nb.njit(**_OPTS)
def _put(buf, b, h, r, o, bits, width):
    """Write the low `width` bytes of `bits` at bytes o.. of row r (little-endian)."""
    for i in range(width):
        buf[b, h, r, o + i] = (bits >> (8 * i)) & 0xFF


@nb.njit(**_OPTS)
def _nvfp4_candidate(amax, divisor):
    """(E4M3 byte, the fp32 factor elements are multiplied by) for one block and divisor 6 or 4."""
    sf = _fp8(min(amax * (_F32(1.0) / _F32(divisor)), _F32(448.0)), 4)
    sf32 = _e4m3_value(sf)
    return sf, (_F32(1.0) / sf32 if sf32 != 0 else _F32(0.0))


@nb.njit(**_OPTS)
def _nvfp4_error(row, lo, out):
    """formats.vllm._sq_error for one block: the fp32 sum over pairs of dx^2 + dy^2."""
    deq = _F32(1.0) / out if out != 0 else _F32(0.0)
    err = _F32(0.0)
    for i in range(lo, lo + 16, 2):
        pair = _F32(0.0)
        for k in range(2):
            x = row[i + k]
            v = x * out
            q = _E2M1[_e2m1_mag(abs(v))]
            q = -q if _signbit(v) else q
            dx = q * deq - x if out != 0 else x
            pair = dx * dx if k == 0 else pair + dx * dx
        err = err + pair
    return err


@nb.njit(**_OPTS)
def _butterfly(w, dim):
    """The unnormalized Walsh-Hadamard transform of each block of w[0:dim] in place (blocks of the largest power of
    two dividing dim, as formats.vllm.rht), in formats.vllm.walsh_hadamard's order."""
    size = dim & -dim
    hh = 1
    while hh < size:
        for blk in range(0, dim, 2 * hh):
            for i in range(blk, blk + hh):
                a, c = w[i], w[i + hh]
                w[i] = a + c
                w[i + hh] = a - c
        hh *= 2


@nb.njit(**_OPTS)
def engine_pack_rows(x, data, scale, zero, engine, bits, pos, aux, xdt):
    """Quantize x: fp32 [B, Hkv, T, D] as an engine's store and write token t at row pos + t of the buffers, each
    the uint8 view of its [B, Hkv, cap, n] tensor. aux: fp32, int4's RHT signs [D], or a TurboQuant key's Hadamard
    matrix row by row then its sorted codebook midpoints [D * D + 2**bits - 1]; xdt: the model's dtype (DT_*), which
    int4's rotated values are rounded to."""
    n_b, n_h, n_t, dim = x.shape
    codes = np.empty(dim, np.int64)
    w32 = np.empty(dim, np.float32)
    lanes = np.empty(8, np.float32)
    for b in range(n_b):
        for h in range(n_h):
            for t in range(n_t):
                row, r = x[b, h, t], pos + t
                if engine == EN_INT8 or engine == EN_FP8:
                    qmax = _F32(127.0) if engine == EN_INT8 else _F32(448.0)
                    qmin = _F32(-128.0) if engine == EN_INT8 else _F32(-448.0)
                    amax = _F32(0.0)
                    for i in range(dim):
                        amax = max(amax, abs(row[i]))
                    s = max(amax / qmax, _F32(1e-6))
                    inv = _F32(1.0) / s
                    for i in range(dim):
                        y = row[i] * inv
                        if engine == EN_INT8:  # round half away from zero, the add fused into the multiply
                            half = 0.5 if y >= 0 else -0.5
                            y = _F32(np.float64(row[i]) * np.float64(inv) + half)
                        y = min(max(y, qmin), qmax)
                        data[b, h, r, i] = (np.int64(y) if engine == EN_INT8 else _fp8(y, 4)) & 0xFF
                    _put(scale, b, h, r, 0, _bits(s), 4)
                elif engine == EN_INT4:
                    for i in range(dim):
                        w32[i] = row[i] * aux[i]
                    _butterfly(w32, dim)
                    lo, hi = _F32(np.inf), _F32(-np.inf)
                    for i in range(dim):
                        v = w32[i]
                        if xdt == DT_F16:
                            v = _f16_round(v)
                        elif xdt == DT_BF16:
                            v = _bf16_round(v)
                        w32[i] = v
                        lo = min(lo, v)
                        hi = max(hi, v)
                    s = max((hi - lo) / _F32(15.0), _F32(1e-6))
                    zp = min(max(_round_away(-lo / s), _F32(0.0)), _F32(15.0))
                    inv = _F32(1.0) / s
                    for i in range(dim):  # x * inv + zp rounded once, as the GPU's FMA
                        y = _F32(np.float64(w32[i]) * np.float64(inv) + np.float64(zp))
                        codes[i] = np.int64(min(max(_round_away(y), _F32(0.0)), _F32(15.0)))
                    for j in range(dim // 2):
                        data[b, h, r, j] = codes[2 * j] | (codes[2 * j + 1] << 4)
                    _put(scale, b, h, r, 0, (_bits(s) & ~np.int64(15)) | np.int64(zp), 4)
                elif engine == EN_NVFP4 or engine == EN_NVFP4_4OVER6:
                    for g in range(dim // 16):
                        lo = 16 * g
                        amax = _F32(0.0)
                        for i in range(lo, lo + 16):
                            amax = max(amax, abs(row[i]))
                        sf, out = _nvfp4_candidate(amax, 6.0)
                        if engine == EN_NVFP4_4OVER6:
                            sf4, out4 = _nvfp4_candidate(amax, 4.0)
                            if _nvfp4_error(row, lo, out4) < _nvfp4_error(row, lo, out):
                                sf, out = sf4, out4
                        for i in range(lo, lo + 16):
                            v = row[i] * out
                            codes[i] = _e2m1_mag(abs(v)) | (_signbit(v) << 3)
                        scale[b, h, r, g] = sf
                    for j in range(dim // 2):
                        data[b, h, r, j] = codes[2 * j] | (codes[2 * j + 1] << 4)
                elif engine == EN_TQ_KEY:  # formats.turboquant.key_rotation's order, then the bucket search
                    for j in range(8):  # the squares in 8 lanes, then the lanes in order (fp32)
                        lanes[j] = row[j] * row[j]
                    for m in range(8, dim, 8):
                        for j in range(8):
                            lanes[j] = lanes[j] + row[m + j] * row[m + j]
                    total = lanes[0]
                    for j in range(1, 8):
                        total = total + lanes[j]
                    norm = _F32(math.sqrt(np.float64(total)))
                    den = norm + _F32(1e-8)
                    for j in range(dim):
                        w32[j] = 0.0
                    for i in range(dim):  # y_j += u_i * H[i, j], one rounding to fp32 per step (an FMA)
                        ui = np.float64(row[i] / den)
                        o = i * dim
                        for j in range(dim):
                            w32[_U(j)] = _F32(np.float64(w32[_U(j)]) + ui * np.float64(aux[_U(o + j)]))
                    n_mid = aux.size - dim * dim
                    for j in range(dim):
                        y = w32[j]
                        c = 0
                        for m in range(n_mid):  # midpoints ascending: the count of those <= y (NaN: 0)
                            c += y >= aux[dim * dim + m]
                        codes[j] = c
                    _pack_codes(codes, dim, bits, data, b, h, r)
                    _put(scale, b, h, r, 0, _f16_bits(_f16_round(norm)), 2)
                else:  # EN_TQ_VALUE
                    levels = (1 << bits) - 1
                    lo, hi = row[0], row[0]
                    for i in range(dim):
                        lo = min(lo, row[i])
                        hi = max(hi, row[i])
                    s = (hi - lo) / _F32(levels)
                    s = s if s > _F32(1e-8) else _F32(1e-8)
                    for i in range(dim):
                        y = (row[i] - lo) / s + _F32(0.5)
                        y = _F32(0.0) if y != y else min(max(y, _F32(-(2.0**30))), _F32(2.0**30))
                        codes[i] = np.int64(min(max(_F32(math.trunc(y)), _F32(0.0)), _F32(levels)))
                    _pack_codes(codes, dim, bits, data, b, h, r)
                    _put(scale, b, h, r, 0, _f16_bits(_f16_round(s)), 2)
                    _put(zero, b, h, r, 0, _f16_bits(_f16_round(lo)), 2)
