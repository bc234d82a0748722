"""Triton jit code that quantizes new K or V tokens and writes them, packed, into a cache's buffers. Jit only: the
launcher is `kernels/pack.py`.

Grid (B * Hkv, cdiv(T_new, BLOCK_T)): each program reads BLOCK_T tokens x head_dim of one head, reduces each scale
group in registers, encodes, packs and stores codes and scales at token rows pos .. pos + T_new - 1.
Bytes moved per token and head: read D * x.element_size(); write D * bits / 8 codes plus the group scales.

Bit-exact with kvviz.formats (the same fp32 operation order, IEEE division via div_rn, round-half-even via the
1.5 * 2**23 trick, fp8 / E2M1 / E8M0 encodings in integer arithmetic rather than the interpreter's casts):
- int sym:  s = fp16(clamp(amax / qmax, 2**-24, 65504)); q = clamp(rint(x / s), +-qmax), stored q + 2**(bits-1)
            (int8: signed); an fp16 x divides in fp16 as torch does; static (tensor / head) s is the fp32 given.
- int asym: s = fp16(clamp((max - min) / (2**bits - 1))), zero = fp16(min), u = clamp(rint((x - zero) / s)).
- fp8:      s = amax / fmax (1 when amax = 0) or the static s; code = fp8_rne(clamp(x / s, +-fmax)).
- MX:       E8M0 byte = clamp(floor(log2 amax) - 2, -127, 127) + 127; code = e2m1(x * 2**-e).
- NV:       block = e4m3_rne(min(amax / 6 / ts, 448)); code = e2m1(x / (block * ts)).
A group holding Inf or NaN stores a NaN scale (E8M0 0xFF, E4M3 0x7F), as kvviz.formats does.
"""

import triton
import triton.language as tl

from kernels.jit.elements import _fp8_to_f32

# KIND codes (constexpr)
KIND_INT_SYM, KIND_INT_ASYM, KIND_FP8, KIND_MX, KIND_NV = 0, 1, 2, 3, 4

# Globals a kernel reads must be tl.constexpr (the interpreter accepts plain floats; the compiler does not).
_F16_TINY = tl.constexpr(5.960464477539063e-08)  # 2**-24, fp16's smallest subnormal: the int scale floor
_F16_MAX = tl.constexpr(65504.0)


@triton.jit
def _rint(y):
    """Round half to even for |y| < 2**22: adding 1.5 * 2**23 leaves no fraction bits, and fp32 adds round RNE."""
    return (y + 12582912.0) - 12582912.0


@triton.jit
def _f32_to_fp8(y, EXP: tl.constexpr):
    """fp32 (finite within the format's range, or NaN) -> OCP fp8 byte as int32, round-to-nearest-even.
    EXP=4: E4M3FN, EXP=5: E5M2. NaN -> 0x7F | sign, as torch's casts."""
    MAN: tl.constexpr = 7 - EXP
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    # Normal: round the 23-bit mantissa to MAN bits (ties to even), then rebase the exponent.
    lsb = (a >> (23 - MAN)) & 1
    normal = ((a + ((1 << (22 - MAN)) - 1) + lsb) >> (23 - MAN)) - ((128 - (1 << (EXP - 1))) << MAN)
    # Subnormal (|y| < 2**(1 - bias)): the code is |y| in units of the smallest subnormal, rounded RNE.
    is_sub = a < ((129 - (1 << (EXP - 1))) << 23)
    a_sub = tl.where(is_sub, a, 0).to(tl.float32, bitcast=True)
    if EXP == 4:
        sub = _rint(a_sub * 512.0).to(tl.int32)  # units of 2**-9
    else:
        sub = _rint(a_sub * 65536.0).to(tl.int32)  # units of 2**-16
    mag = tl.where(is_sub, sub, normal)
    mag = tl.where(a > 0x7F800000, 0x7F, mag)
    return sign | mag


@triton.jit
def _e2m1_encode(v):
    """fp32 -> E2M1 code (int32 0..15): nearest of +-{0,.5,1,1.5,2,3,4,6}, ties to the even code, saturating;
    NaN -> 0. A midpoint between codes c and c+1 rounds up when c+1 is even (>=), else stays (>)."""
    m = tl.abs(v)
    code = (m > 0.25).to(tl.int32) + (m >= 0.75).to(tl.int32) + (m > 1.25).to(tl.int32)
    code += (m >= 1.75).to(tl.int32) + (m > 2.5).to(tl.int32) + (m >= 3.5).to(tl.int32) + (m > 5.0).to(tl.int32)
    return code | ((v < 0).to(tl.int32) << 3)


@triton.jit
def _group_reduce(x, BLOCK_T: tl.constexpr, NG: tl.constexpr, GROUP: tl.constexpr, OP: tl.constexpr):
    """[BLOCK_T, NG * GROUP] -> [BLOCK_T, NG]: max (OP=0) or min (OP=1) over each group of GROUP channels."""
    g = tl.reshape(x, [BLOCK_T, NG, GROUP])
    if OP == 0:
        return tl.max(g, axis=2)
    return tl.min(g, axis=2)


@triton.jit
def _expand(s, BLOCK_T: tl.constexpr, NG: tl.constexpr, GROUP: tl.constexpr):
    """[BLOCK_T, NG] -> [BLOCK_T, NG * GROUP]: each group's value over its channels."""
    return tl.reshape(tl.broadcast_to(s[:, :, None], [BLOCK_T, NG, GROUP]), [BLOCK_T, NG * GROUP])


@triton.jit
def _quant_pack_kernel(
    X, stride_xb, stride_xh, stride_xt,
    DATA, stride_db, stride_dh, stride_dt,
    SCALE, stride_sb, stride_sh, stride_st,
    ZERO, stride_zb, stride_zh, stride_zt,
    TS, pos, n_tokens, n_heads,
    KIND: tl.constexpr, BITS: tl.constexpr, FP8_EXP: tl.constexpr, GROUP: tl.constexpr, STATIC: tl.constexpr,
    HALF_DIV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, HEAD_DIM)
    t_mask = offs_t < n_tokens
    NG: tl.constexpr = HEAD_DIM // GROUP

    # x: [BLOCK_T, HEAD_DIM], read once: D * element_size bytes per token.
    x = tl.load(X + b * stride_xb + h * stride_xh + offs_t[:, None] * stride_xt + offs_d[None, :],
                mask=t_mask[:, None], other=0.0)
    xf = x.to(tl.float32)
    finite = tl.abs(xf) < float("inf")  # False for +-Inf and NaN
    xz = tl.where(finite, xf, 0.0)  # reductions count non-finite elements as 0
    bad = _group_reduce((~finite).to(tl.int32), BLOCK_T, NG, GROUP, 0) > 0  # [BLOCK_T, NG]
    rows = pos + offs_t
    s_ptrs = SCALE + b * stride_sb + h * stride_sh + rows[:, None] * stride_st + tl.arange(0, NG)[None, :]

    if KIND == 0 or KIND == 1:
        if KIND == 0:
            QMAX: tl.constexpr = (1 << (BITS - 1)) - 1
            if STATIC:
                s = tl.load(TS + pid_bh)
                y = tl.math.div_rn(xf, s)
            else:
                amax = _group_reduce(tl.abs(xz), BLOCK_T, NG, GROUP, 0)
                s = tl.minimum(tl.maximum(tl.math.div_rn(amax, QMAX * 1.0), _F16_TINY), _F16_MAX)
                s = s.to(tl.float16).to(tl.float32)
                y = tl.math.div_rn(xf, _expand(s, BLOCK_T, NG, GROUP))
                if HALF_DIV:  # torch divides fp16 by fp16: one fp32 quotient rounded to fp16
                    y = y.to(tl.float16).to(tl.float32)
            LO: tl.constexpr = -QMAX
            HI: tl.constexpr = QMAX
        else:
            HI: tl.constexpr = (1 << BITS) - 1
            LO: tl.constexpr = 0
            lo = _group_reduce(xz, BLOCK_T, NG, GROUP, 1)
            hi = _group_reduce(xz, BLOCK_T, NG, GROUP, 0)
            s = tl.minimum(tl.maximum(tl.math.div_rn(hi - lo, HI * 1.0), _F16_TINY), _F16_MAX)
            s = s.to(tl.float16).to(tl.float32)
            zero = tl.minimum(tl.maximum(lo, -_F16_MAX), _F16_MAX).to(tl.float16).to(tl.float32)
            xe = xf - _expand(zero, BLOCK_T, NG, GROUP)
            y = tl.math.div_rn(xe, _expand(s, BLOCK_T, NG, GROUP))
            z_ptrs = ZERO + b * stride_zb + h * stride_zh + rows[:, None] * stride_zt + tl.arange(0, NG)[None, :]
            tl.store(z_ptrs, tl.where(bad, float("nan"), zero).to(ZERO.dtype.element_ty), mask=t_mask[:, None])
        y = tl.where(y == y, y, 0.0)  # NaN codes become 0 (torch: nan_to_num after round and clamp)
        y = tl.minimum(tl.maximum(y, LO - 1.0), HI + 1.0)  # keeps _rint in range; same result after the clamp
        codes = tl.minimum(tl.maximum(_rint(y), LO * 1.0), HI * 1.0).to(tl.int32)
        if BITS < 8 and KIND == 0:
            codes += 1 << (BITS - 1)
        if not STATIC:
            tl.store(s_ptrs, tl.where(bad, float("nan"), s).to(SCALE.dtype.element_ty), mask=t_mask[:, None])
    elif KIND == 2:
        if FP8_EXP == 4:
            FMAX: tl.constexpr = 448.0
        else:
            FMAX: tl.constexpr = 57344.0
        if STATIC:
            y = tl.math.div_rn(xf, tl.load(TS + pid_bh))
        else:
            amax = _group_reduce(tl.abs(xz), BLOCK_T, NG, GROUP, 0)
            s = tl.where(amax > 0, tl.math.div_rn(amax, FMAX), 1.0)
            y = tl.math.div_rn(xf, _expand(s, BLOCK_T, NG, GROUP))
            tl.store(s_ptrs, s.to(SCALE.dtype.element_ty), mask=t_mask[:, None])
        y = tl.where(tl.abs(y) < float("inf"), y, float("nan"))
        y = tl.where(y == y, tl.minimum(tl.maximum(y, -FMAX), FMAX), y)
        codes = _f32_to_fp8(y, FP8_EXP)
    elif KIND == 3:
        amax = _group_reduce(tl.abs(xz), BLOCK_T, NG, GROUP, 0)
        e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 129  # floor(log2 amax) - 2 (E2M1's emax)
        e = tl.minimum(tl.maximum(tl.where(amax > 0, e, -127), -127), 127)
        inv = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2**-e, exact
        codes = _e2m1_encode(xf * _expand(inv, BLOCK_T, NG, GROUP))
        tl.store(s_ptrs, tl.where(bad, 255, e + 127).to(SCALE.dtype.element_ty), mask=t_mask[:, None])
    else:
        ts = tl.load(TS + pid_bh)
        amax = _group_reduce(tl.abs(xz), BLOCK_T, NG, GROUP, 0)
        block = tl.minimum(tl.math.div_rn(tl.math.div_rn(amax, 6.0), ts), 448.0)
        block_code = tl.where(bad, 0x7F, _f32_to_fp8(block, 4))
        eff = _fp8_to_f32(block_code, 4) * ts  # NaN for a bad block: its codes become 0
        eff = _expand(eff, BLOCK_T, NG, GROUP)
        codes = _e2m1_encode(tl.where(eff > 0, tl.math.div_rn(xf, tl.where(eff > 0, eff, 1.0)), 0.0))
        tl.store(s_ptrs, block_code.to(SCALE.dtype.element_ty), mask=t_mask[:, None])

    d_ptrs = DATA + b * stride_db + h * stride_dh + rows[:, None] * stride_dt
    if BITS < 8:
        PER_BYTE: tl.constexpr = 8 // BITS
        shifts = tl.arange(0, PER_BYTE) * BITS
        packed = tl.sum(tl.reshape(codes, [BLOCK_T, HEAD_DIM // PER_BYTE, PER_BYTE]) << shifts[None, None, :], axis=2)
        tl.store(d_ptrs + tl.arange(0, HEAD_DIM // PER_BYTE)[None, :], packed.to(DATA.dtype.element_ty),
                 mask=t_mask[:, None])
    else:
        tl.store(d_ptrs + offs_d[None, :], codes.to(DATA.dtype.element_ty), mask=t_mask[:, None])
