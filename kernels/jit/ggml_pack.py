"""Triton jit code that quantizes new K or V tokens into llama.cpp's KV cache types (q8_0, q4_0, q4_1, q5_0, q5_1,
iq4_nl) and writes them, in ggml's block layout, into a cache's buffers. Jit only: the launcher is
`kernels/ggml_pack.py`.

Grid (B * Hkv, cdiv(T_new, BLOCK_T)): each program reads BLOCK_T tokens x head_dim of one head as blocks of 32
channels, and runs ggml's quantize_row_<type>_ref on each block in registers, in the fp32 operation order of
kvviz/formats/ggml.py (the launcher turns off fp fusion, so no multiply-add is contracted), so codes and fp16
scales are bit-identical to kvviz.formats (and so to llama.cpp):

    q8_0    d = amax / 127, id = 1 / d (0 when d = 0), q = roundf(x * id)
    q4_0    d = max / -8 (max: the first value of largest |x|), q = min(15, trunc(x * id + 8.5))
    q5_0    d = max / -16, q = min(31, trunc(x * id + 16.5))
    q4_1    d = (max - min) / 15, m = min (first of equal values), q = trunc((x - m) * id + 0.5) in 0..15
    q5_1    d = (max - min) / 31, likewise in 0..31
    iq4_nl  d0 = max / -127, q = nearest kvalues_iq4nl entry to x / d0 (ties upward), then
            d = sum(w q x) / sum(w q q), w = x^2, summed in channel order; a block with amax < 1e-15 stores d = 0
A block holding Inf or NaN stores d = NaN (and m = NaN); its codes come from its finite values (the rest as 0).
Bytes moved per token and head: read D * x.element_size(); write D * bits / 8 codes plus 2 (or 4) bytes per block.
"""

import triton
import triton.language as tl

from kernels.jit.elements import _iq4nl_to_f32

# TYPE codes (constexpr)
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL = 0, 1, 2, 3, 4, 5
_GROUP_MAX_EPS = tl.constexpr(1e-15)  # iq4_nl: a block whose amax is below this stores d = 0


@triton.jit
def _first_value(xb, hit):
    """[T, NB, 32] -> [T, NB]: the value at the first channel of each block where `hit` holds (ggml's scans keep
    the first of equal candidates, signed zeros included: the pick moves bit patterns, not sums of floats)."""
    idx = tl.arange(0, 32)[None, None, :]
    first = tl.min(tl.where(hit, idx, 32), axis=2)
    bits = tl.where(idx == first[:, :, None], xb.to(tl.int32, bitcast=True), 0)
    return tl.sum(bits, axis=2).to(tl.float32, bitcast=True)


@triton.jit
def _inverse(d):
    """ggml's `id = d ? 1.0f/d : 0.0f`."""
    return tl.where(d != 0, tl.math.div_rn(tl.full(d.shape, 1.0, tl.float32), tl.where(d != 0, d, 1.0)), 0.0)


@triton.jit
def _iq4nl_index(v):
    """ggml's best_index_int8 over kvalues_iq4nl: the nearest entry's index, ties to the larger (int32 0..15).
    Index j is reached once 2v >= values[j-1] + values[j] (exact in fp32)."""
    v2 = v + v
    i = (v2 >= -231.0).to(tl.int32) + (v2 >= -187.0).to(tl.int32) + (v2 >= -148.0).to(tl.int32)
    i += (v2 >= -114.0).to(tl.int32) + (v2 >= -84.0).to(tl.int32) + (v2 >= -57.0).to(tl.int32)
    i += (v2 >= -32.0).to(tl.int32) + (v2 >= -9.0).to(tl.int32) + (v2 >= 14.0).to(tl.int32)
    i += (v2 >= 38.0).to(tl.int32) + (v2 >= 63.0).to(tl.int32) + (v2 >= 91.0).to(tl.int32)
    i += (v2 >= 122.0).to(tl.int32) + (v2 >= 158.0).to(tl.int32) + (v2 >= 202.0).to(tl.int32)
    return i


@triton.jit
def _ggml_pack_kernel(
    X, stride_xb, stride_xh, stride_xt,
    DATA, stride_db, stride_dh, stride_dt,
    SCALE, stride_sb, stride_sh, stride_st,
    ZERO, stride_zb, stride_zh, stride_zt,
    pos, n_tokens, n_heads,
    TYPE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, HEAD_DIM)
    t_mask = offs_t < n_tokens
    NB: tl.constexpr = HEAD_DIM // 32

    x = tl.load(X + b * stride_xb + h * stride_xh + offs_t[:, None] * stride_xt + offs_d[None, :],
                mask=t_mask[:, None], other=0.0).to(tl.float32)  # [BLOCK_T, HEAD_DIM]
    finite = tl.abs(x) < float("inf")
    xb = tl.reshape(tl.where(finite, x, 0.0), [BLOCK_T, NB, 32])  # the quantizer sees non-finite values as 0
    bad = tl.max(tl.reshape((~finite).to(tl.int32), [BLOCK_T, NB, 32]), axis=2) > 0  # [BLOCK_T, NB]
    rows = pos + offs_t
    blk = tl.arange(0, NB)
    s_ptrs = SCALE + b * stride_sb + h * stride_sh + rows[:, None] * stride_st + blk[None, :]
    amax = tl.max(tl.abs(xb), axis=2)  # [BLOCK_T, NB]
    zero = tl.zeros([BLOCK_T, NB], dtype=tl.float32)

    if TYPE == 0:
        d = tl.math.div_rn(amax, zero + 127.0)
        v = xb * _inverse(d)[:, :, None]
        r = v.to(tl.int32)  # trunc; roundf adds the sign where |fraction| >= 0.5
        frac = v - r.to(tl.float32)
        codes = r + tl.where(tl.abs(frac) >= 0.5, tl.where(v < 0, -1, 1), 0)
    elif TYPE == 1 or TYPE == 3:
        if TYPE == 1:
            OFFSET: tl.constexpr = 8
            TOP: tl.constexpr = 15
        else:
            OFFSET: tl.constexpr = 16
            TOP: tl.constexpr = 31
        mx = tl.where(amax > 0, _first_value(xb, tl.abs(xb) == amax[:, :, None]), 0.0)
        d = tl.math.div_rn(mx, zero - OFFSET)
        v = xb * _inverse(d)[:, :, None] + (OFFSET + 0.5)
        codes = tl.minimum(tl.maximum(v, 0.0), TOP * 1.0).to(tl.int32)  # v >= 0: the cast truncates
    elif TYPE == 2 or TYPE == 4:
        if TYPE == 2:
            TOP: tl.constexpr = 15
        else:
            TOP: tl.constexpr = 31
        lo = _first_value(xb, xb == tl.min(xb, axis=2)[:, :, None])
        hi = _first_value(xb, xb == tl.max(xb, axis=2)[:, :, None])
        d = tl.math.div_rn(hi - lo, zero + TOP)
        v = (xb - lo[:, :, None]) * _inverse(d)[:, :, None] + 0.5
        codes = tl.minimum(tl.maximum(v, 0.0), TOP * 1.0).to(tl.int32)
        z_ptrs = ZERO + b * stride_zb + h * stride_zh + rows[:, None] * stride_zt + blk[None, :]
        tl.store(z_ptrs, tl.where(bad, float("nan"), lo).to(ZERO.dtype.element_ty), mask=t_mask[:, None])
    else:
        live = amax >= _GROUP_MAX_EPS
        mx = tl.where(live, _first_value(xb, tl.abs(xb) == amax[:, :, None]), 1.0)
        d0 = tl.math.div_rn(mx, zero - 127.0)
        codes = _iq4nl_index(tl.math.div_rn(zero + 1.0, d0)[:, :, None] * xb)  # [BLOCK_T, NB, 32]
        q = _iq4nl_to_f32(codes)
        wq = (xb * xb) * q
        prod_qx = wq * xb
        prod_q2 = wq * q
        idx = tl.arange(0, 32)[None, None, :]
        sumqx = zero
        sumq2 = zero
        for j in tl.static_range(32):  # in channel order, as ggml's loop adds (one term per sum is nonzero)
            sumqx = sumqx + tl.sum(tl.where(idx == j, prod_qx, 0.0), axis=2)
            sumq2 = sumq2 + tl.sum(tl.where(idx == j, prod_q2, 0.0), axis=2)
        d = tl.where(sumq2 > 0, tl.math.div_rn(sumqx, tl.where(sumq2 > 0, sumq2, 1.0)), 0.0)
        d = tl.where(live, d, 0.0)
        codes = tl.where(live[:, :, None], codes, 0)
    tl.store(s_ptrs, tl.where(bad, float("nan"), d).to(SCALE.dtype.element_ty), mask=t_mask[:, None])

    d_row = DATA + b * stride_db + h * stride_dh + rows * stride_dt  # [BLOCK_T]
    if TYPE == 0:
        tl.store(d_row[:, None] + offs_d[None, :], tl.reshape(codes, [BLOCK_T, HEAD_DIM]).to(DATA.dtype.element_ty),
                 mask=t_mask[:, None])
    else:
        if TYPE == 3 or TYPE == 4:
            BB: tl.constexpr = 20  # bytes per block: qh (4), then qs (16)
        else:
            BB: tl.constexpr = 16
        j = tl.arange(0, 16)
        half = tl.arange(0, 2)
        c = tl.reshape(codes, [BLOCK_T, NB, 2, 16])  # code 16 * half + j
        qs = tl.sum((c & 15) << (half * 4)[None, None, :, None], axis=2)  # [BLOCK_T, NB, 16]
        block = d_row[:, None, None] + blk[None, :, None] * BB  # [BLOCK_T, NB, 1]
        tl.store(block + (BB - 16) + j[None, None, :], qs.to(DATA.dtype.element_ty), mask=t_mask[:, None, None])
        if BB == 20:
            k = tl.arange(0, 4)
            i = tl.arange(0, 8)
            high = (tl.reshape(codes, [BLOCK_T, NB, 4, 8]) >> 4) & 1  # code 8k + i -> qh byte k, bit i
            qh = tl.sum(high << i[None, None, None, :], axis=3)  # [BLOCK_T, NB, 4]
            tl.store(block + k[None, None, :], qh.to(DATA.dtype.element_ty), mask=t_mask[:, None, None])
