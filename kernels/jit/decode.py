"""Triton jit code for split-K ("flash-decoding") attention over a packed, quantized KV cache. Jit only: the
launcher that picks block sizes and constexpr flags is `kernels/decode.py`.

Stage 1, grid (B * Hkv, num_splits): one program owns one KV head, all G = Hq / Hkv query heads that read it
(GQA; G padded to BLOCK_G >= 16 rows for tl.dot) and one contiguous range of tokens. It streams that range in
blocks of BLOCK_N tokens, loads the packed K and V bytes once, decodes them in registers, and runs an online
softmax in base 2. Per-token scales (one scale over all of head_dim, plus tensor / head scales) are folded:
    score = (q . codes) * s_k + sum(q) * z_k,    out += (p * s_v) @ codes + sum(p * z_v)
Group scales (gN along head_dim, MX / NV blocks, channel scales along tokens) vary inside a row, so those tiles
are dequantized before the dot. Tokens past n_packed come from the full-precision tail buffer in the same loop.
A block whose tokens are all masked off (left padding, the part of a window or chunk a query no longer sees) is
skipped before its K/V bytes are read. Logit softcapping (Gemma 2) caps each score, in natural-log units, as
    score = softcap * tanh(score / softcap)
before the softmax. Writes partial (m, l, acc) per split.
Stage 2, grid (B * Hkv): merges the splits' partials of the G query heads:
    out = sum_s 2^(m_s - M) acc_s / (sum_s 2^(m_s - M) l_s + 2^(sink - M)),   M = max(max_s m_s, sink).
An attention sink (gpt-oss: one learned logit per query head) is one more softmax column that carries no value:
it joins the denominator only, like a split with m = sink, l = 1, acc = 0. Without sinks the 2^(sink - M) term
is absent. With one split, stage 1 normalizes (sink included) and writes the output itself; stage 2 is skipped.
K and V may have different head dims (DeepSeek-V3 as transformers caches it: K 192, V 128): q . k runs over
HEAD_DIM_K, the output and the partials over HEAD_DIM_V.

Bytes moved per token per KV head: K and V rows of D * bits / 8 bytes each, plus their scales; q, the partials
and the output are O(Hq * D * num_splits) per sequence, negligible at long context.

llama.cpp's KV types (GGML sides: q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) are group formats with fp16 scales (and
q4_1 / q5_1 minimums) per 32 channels: q8_0 loads its int8 codes natively; the 4 / 5-bit types unpack ggml's block
order (qh bits, then qs nibbles j and j + 16 of byte j) and iq4_nl maps its codes through kvalues_iq4nl, held in
four int32 words of constants.

The engines' stores (vLLM's per-token-head, NVFP4 and TurboQuant caches, the TurboQuant paper's TQ-mse) add three
decodes, all per token and so folded like any per-token scale: a codebook (ELEM 6: value = VALS[code], a 2**BITS
fp32 table gathered with tl.load), TurboQuant's norm correction (RENORM: the token's decoded vector over
sqrt(sum v^2 + 1e-16), summed in the same pass that decodes it, before the scale), and int4_per_token_head's zero
point in the low ZP_BITS of its fp32 scale: value = (code - zp) * cleared scale, i.e. row scale s and row zero
-zp * s. 3-bit codes (8 a 3-byte little-endian word, element e at bit 3e) unpack in words; 1, 2 and 4 bits in bytes.
Their rotations stay outside the kernel (the launcher rotates q and the output). TQ-prod's sketch (K_QJL / V_QJL:
the byte offset of a row's sign bits after its codes) is a second product per tile in a basis of its own: a key's
score gains s * r * (q @ G^T) . z, with q @ G^T handed in after q; a value's s * r * z goes into a second
accumulator, written after the output's D_v columns for the launcher to turn by G.

The element decoders (fp8, E2M1, E8M0, iq4_nl, ggml's blocks, 3-bit words) live in `kernels/jit/elements.py`.
"""

import triton
import triton.language as tl

from kernels.jit.elements import _codes3, _e2m1_to_f32, _e8m0_to_f32, _fp8_to_f32, _ggml_codes, _iq4nl_to_f32

# ELEM codes (constexpr): how one stored element becomes fp32.
ELEM_NATIVE, ELEM_UINT, ELEM_E4M3, ELEM_E5M2, ELEM_E2M1, ELEM_IQ4NL, ELEM_TABLE = 0, 1, 2, 3, 4, 5, 6
# SCALE codes (constexpr): which per-group scale tensor a side carries.
SCALE_NONE, SCALE_TOKEN, SCALE_CHANNEL = 0, 1, 2
# SCALE_FMT codes (constexpr): how a scale element becomes fp32.
SFMT_NATIVE, SFMT_E8M0, SFMT_E4M3 = 0, 1, 2

LOG2E = 1.4426950408889634  # 1/ln(2): softmax runs on exp2 (the launcher scales q, sinks and softcap by it)


@triton.jit
def _tanh(x):
    """tanh in fp32 without overflow: sign(x) * (1 - e) / (1 + e), e = exp(-2|x|) = 2^(-2|x| / ln 2)."""
    e = tl.exp2(-2.8853900817779268 * tl.abs(x))  # 2 / ln(2)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _load_scale(ptrs, mask, SFMT: tl.constexpr):
    """Load scale elements and decode them to fp32 (masked lanes: 0). SFMT 1: E8M0 bytes, 2: E4M3 bytes."""
    raw = tl.load(ptrs, mask=mask, other=0)
    if SFMT == 1:
        return _e8m0_to_f32(raw.to(tl.int32))
    if SFMT == 2:
        return _fp8_to_f32(raw.to(tl.int32), 4)
    return raw.to(tl.float32)


@triton.jit
def _load_side(
    data, stride_dt, scale, stride_st, zero, stride_zt, tail, stride_tt, ts, tz, vals,
    offs_n, offs_d, n_packed, n_valid,
    ELEM: tl.constexpr, BITS: tl.constexpr, OFFSET: tl.constexpr,
    SCALE: tl.constexpr, SFMT: tl.constexpr, GROUP: tl.constexpr, FOLD: tl.constexpr,
    HAS_ZERO: tl.constexpr, HAS_TAIL: tl.constexpr, GGML: tl.constexpr, RENORM: tl.constexpr,
    ZP_BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """One [BLOCK_N, BLOCK_D] tile of one side, as (x, row_scale, row_zero) with value = x * row_scale + row_zero.

    FOLD (a scale per token over all of head_dim, or none): x holds the decoded codes and the token's scale and
    zero come back per row, for the caller to fold into scores / probabilities. Otherwise x is fully dequantized
    and row_scale is the tensor scale. Tail rows (n_packed <= t < n_valid) hold the full-precision tokens with
    row_scale 1, row_zero 0; rows past n_valid are 0.
    GGML: llama.cpp's block layout (BITS 4 or 5; BITS 8 is plain int8); codes decode as code - OFFSET, or through
    the iq4_nl table (ELEM 5), and the caller's GROUP-32 token scales and zeros apply as for any group format.
    ELEM 6: codes index `vals` (fp32 [2**BITS]); RENORM divides each token's decoded vector by its norm (folded
    into row_scale); ZP_BITS > 0: `scale` holds the fp32 token scales as int32, their low ZP_BITS a zero point.
    Bytes read: BLOCK_N * HEAD_DIM * BITS / 8 of data, plus BLOCK_N * HEAD_DIM / GROUP scales (and zeros).
    """
    in_packed = offs_n < n_packed  # [BLOCK_N]
    d_mask = offs_d < HEAD_DIM  # [BLOCK_D]
    if BITS < 8:
        if GGML:
            codes = _ggml_codes(data, stride_dt, offs_n, in_packed, BITS, BLOCK_N, BLOCK_D, HEAD_DIM)
        elif BITS == 3:
            codes = _codes3(data, stride_dt, offs_n, in_packed, BLOCK_N, BLOCK_D, HEAD_DIM)
        else:
            PER_BYTE: tl.constexpr = 8 // BITS
            offs_b = tl.arange(0, BLOCK_D // PER_BYTE)
            mask_b = in_packed[:, None] & (offs_b < HEAD_DIM // PER_BYTE)[None, :]
            raw = tl.load(data + offs_n[:, None] * stride_dt + offs_b[None, :], mask=mask_b, other=0).to(tl.int32)
            shifts = tl.arange(0, PER_BYTE) * BITS
            codes = (raw[:, :, None] >> shifts[None, None, :]) & ((1 << BITS) - 1)  # [BLOCK_N, BLOCK_D/PB, PB]
            codes = tl.reshape(codes, [BLOCK_N, BLOCK_D])  # element PB*i + j: byte i, bits j*BITS..
        if ELEM == 4:
            x = _e2m1_to_f32(codes)
        elif ELEM == 5:
            x = _iq4nl_to_f32(codes)
        elif ELEM == 6:  # a codebook of 2**BITS fp32 values; lanes past head_dim or n_packed: 0
            x = tl.load(vals + codes, mask=in_packed[:, None] & d_mask[None, :], other=0.0)
        else:
            x = (codes - OFFSET).to(tl.float32)
    else:
        mask = in_packed[:, None] & d_mask[None, :]
        ptrs = data + offs_n[:, None] * stride_dt + offs_d[None, :]
        if ELEM == 0:
            x = tl.load(ptrs, mask=mask, other=0).to(tl.float32)
        elif ELEM == 1:
            x = (tl.load(ptrs, mask=mask, other=0).to(tl.int32) - OFFSET).to(tl.float32)
        else:
            x = _fp8_to_f32(tl.load(ptrs, mask=mask, other=0).to(tl.int32), ELEM + 2)
    if RENORM:  # vLLM TurboQuant's "nc": v / sqrt(sum v^2 + 1e-16), the sum taken from the tile just decoded
        inv_norm = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) + 1e-16)  # [BLOCK_N]
        if not FOLD:
            x = x * inv_norm[:, None]

    row_scale = tl.zeros([BLOCK_N], dtype=tl.float32) + ts
    row_zero = tl.zeros([BLOCK_N], dtype=tl.float32) + tz
    if SCALE == 1:
        if FOLD and ZP_BITS > 0:  # (code - zp) * s: s the fp32 scale with its low ZP_BITS cleared
            raw_s = tl.load(scale + offs_n * stride_st, mask=in_packed, other=0)  # int32 bits of the fp32 scale
            zp = raw_s & ((1 << ZP_BITS) - 1)
            row_scale = row_scale * (raw_s - zp).to(tl.float32, bitcast=True)
            row_zero = -zp.to(tl.float32) * row_scale
        elif FOLD:
            if SFMT == 0:  # a plain float scale per token: no decode helper (cheap in the interpreter too)
                row_scale = row_scale * tl.load(scale + offs_n * stride_st, mask=in_packed, other=0.0).to(tl.float32)
            else:
                row_scale = row_scale * _load_scale(scale + offs_n * stride_st, in_packed, SFMT)
            if HAS_ZERO:
                row_zero = tl.load(zero + offs_n * stride_zt, mask=in_packed, other=0.0).to(tl.float32)
        else:
            s_mask = in_packed[:, None] & d_mask[None, :]
            s_ptrs = scale + offs_n[:, None] * stride_st + (offs_d // GROUP)[None, :]
            if SFMT == 0:
                x = x * tl.load(s_ptrs, mask=s_mask, other=0.0).to(tl.float32)
            else:
                x = x * _load_scale(s_ptrs, s_mask, SFMT)
            if HAS_ZERO:
                # x = u * s * ts + z: the zero goes in ahead of the tensor scale (ts is 1 when zeros exist).
                z_ptrs = zero + offs_n[:, None] * stride_zt + (offs_d // GROUP)[None, :]
                x = x + tl.load(z_ptrs, mask=s_mask, other=0.0).to(tl.float32)
    elif SCALE == 2:
        s_mask = in_packed[:, None] & d_mask[None, :]
        rows = offs_n // GROUP
        x = x * tl.load(scale + rows[:, None] * stride_st + offs_d[None, :], mask=s_mask, other=0.0).to(tl.float32)
        if HAS_ZERO:
            x = x + tl.load(zero + rows[:, None] * stride_zt + offs_d[None, :], mask=s_mask, other=0.0).to(tl.float32)

    if RENORM and FOLD:
        row_scale = row_scale * inv_norm

    if HAS_TAIL:
        in_tail = (offs_n >= n_packed) & (offs_n < n_valid)
        t_rows = tl.maximum(offs_n - n_packed, 0)
        t = tl.load(tail + t_rows[:, None] * stride_tt + offs_d[None, :], mask=in_tail[:, None] & d_mask[None, :],
                    other=0.0).to(tl.float32)
        x = tl.where(in_packed[:, None], x, t)
        row_scale = tl.where(in_packed, row_scale, 1.0)
        row_zero = tl.where(in_packed, row_zero, 0.0)
    else:
        x = tl.where(in_packed[:, None], x, 0.0)
    return x, row_scale, row_zero


@triton.jit
def _sketch(data, stride_dt, scale, stride_st, offs_n, in_packed, QJL: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):
    """TQ-prod's sketch of a tile: (z, r) with z [BLOCK_N, BLOCK_D] the +-1 signs (bit e % 8 of byte e // 8, the
    bytes at QJL past each row's codes) and r [BLOCK_N] the residual norm, the token scale's second column. Rows
    outside the packed range: r = 0, so they add nothing."""
    offs_b = tl.arange(0, BLOCK_D // 8)
    raw = tl.load(data + QJL + offs_n[:, None] * stride_dt + offs_b[None, :],
                  mask=in_packed[:, None] & (offs_b < HEAD_DIM // 8)[None, :], other=0).to(tl.int32)
    bits = (raw[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1  # [BLOCK_N, BLOCK_D / 8, 8]
    z = tl.reshape(bits, [BLOCK_N, BLOCK_D]).to(tl.float32) * 2.0 - 1.0
    r = tl.load(scale + offs_n * stride_st + 1, mask=in_packed, other=0.0).to(tl.float32)
    return z, r


@triton.jit
def _decode_stage1(
    Q, stride_qb, stride_qh,
    K, stride_kb, stride_kh, stride_kt, KS, stride_ksb, stride_ksh, stride_kst, KZ, stride_kzb, stride_kzh,
    stride_kzt, KT, stride_ktb, stride_kth, stride_ktt, K_TS, K_TZ, K_NP, K_VALS,
    V, stride_vb, stride_vh, stride_vt, VS, stride_vsb, stride_vsh, stride_vst, VZ, stride_vzb, stride_vzh,
    stride_vzt, VT, stride_vtb, stride_vth, stride_vtt, V_TS, V_TZ, V_NP, V_VALS,
    LENGTHS, MASK, stride_mb, SINKS, MID_O, MID_ML, OUT, qk_scale, softcap, tokens_per_split, num_splits,
    H_KV: tl.constexpr, GQA: tl.constexpr, HEAD_DIM_K: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr, HAS_MASK: tl.constexpr, HAS_SINKS: tl.constexpr, SOFTCAP: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    K_ELEM: tl.constexpr, K_BITS: tl.constexpr, K_OFFSET: tl.constexpr, K_SCALE: tl.constexpr,
    K_SFMT: tl.constexpr, K_GROUP: tl.constexpr, K_FOLD: tl.constexpr, K_ZERO: tl.constexpr,
    K_TENSOR: tl.constexpr, K_TZERO: tl.constexpr, K_TAIL: tl.constexpr, K_GGML: tl.constexpr,
    K_RENORM: tl.constexpr, K_ZP: tl.constexpr, K_QJL: tl.constexpr,
    V_ELEM: tl.constexpr, V_BITS: tl.constexpr, V_OFFSET: tl.constexpr, V_SCALE: tl.constexpr,
    V_SFMT: tl.constexpr, V_GROUP: tl.constexpr, V_FOLD: tl.constexpr, V_ZERO: tl.constexpr,
    V_TENSOR: tl.constexpr, V_TZERO: tl.constexpr, V_TAIL: tl.constexpr, V_GGML: tl.constexpr,
    V_RENORM: tl.constexpr, V_ZP: tl.constexpr, V_QJL: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // H_KV
    h = pid_bh % H_KV
    length = tl.load(LENGTHS + b)
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, length)
    k_np = tl.minimum(tl.load(K_NP + b), length)
    v_np = tl.minimum(tl.load(V_NP + b), length)
    # Per-tensor / per-head scale and zero of this (b, h): fp32 [B * Hkv] each, read only when present.
    k_ts = 1.0
    k_tz = 0.0
    v_ts = 1.0
    v_tz = 0.0
    if K_TENSOR:
        k_ts = tl.load(K_TS + pid_bh)
    if K_TZERO:
        k_tz = tl.load(K_TZ + pid_bh)
    if V_TENSOR:
        v_ts = tl.load(V_TS + pid_bh)
    if V_TZERO:
        v_tz = tl.load(V_TZ + pid_bh)

    offs_g = tl.arange(0, BLOCK_G)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    g_mask = offs_g < GQA
    # q rows h*G .. h*G+G-1: [BLOCK_G, BLOCK_DK], pre-scaled by sm_scale / ln 2 for exp2.
    q = tl.load(Q + b * stride_qb + (h * GQA + offs_g)[:, None] * stride_qh + offs_dk[None, :],
                mask=g_mask[:, None] & (offs_dk < HEAD_DIM_K)[None, :], other=0.0).to(tl.float32) * qk_scale
    q_sum = tl.sum(q, axis=1)  # [BLOCK_G]: multiplies per-token K zero points
    q_sketch = q  # TQ-prod: q @ G^T, the sketch's basis, sits after q in the row (read only with K_QJL)
    if K_QJL > 0:
        q_sketch = tl.load(Q + b * stride_qb + (h * GQA + offs_g)[:, None] * stride_qh + HEAD_DIM_K + offs_dk[None, :],
                           mask=g_mask[:, None] & (offs_dk < HEAD_DIM_K)[None, :], other=0.0).to(tl.float32) * qk_scale

    k_base = K + b * stride_kb + h * stride_kh
    ks_base = KS + b * stride_ksb + h * stride_ksh
    kz_base = KZ + b * stride_kzb + h * stride_kzh
    kt_base = KT + b * stride_ktb + h * stride_kth
    v_base = V + b * stride_vb + h * stride_vh
    vs_base = VS + b * stride_vsb + h * stride_vsh
    vz_base = VZ + b * stride_vzb + h * stride_vzh
    vt_base = VT + b * stride_vtb + h * stride_vth

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], dtype=tl.float32)
    acc_sketch = tl.zeros([BLOCK_G, BLOCK_DV], dtype=tl.float32)  # TQ-prod V: sum of p * s * r * z (V_QJL only)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        valid = offs_n < end
        if HAS_MASK:  # attention mask (left padding, sliding window, chunk): 1 byte per token
            valid &= tl.load(MASK + b * stride_mb + offs_n, mask=valid, other=0) != 0
        if tl.max(valid.to(tl.int32), axis=0) > 0:  # a block with no live token reads no K/V bytes
            k, k_rs, k_rz = _load_side(
                k_base, stride_kt, ks_base, stride_kst, kz_base, stride_kzt, kt_base, stride_ktt, k_ts, k_tz,
                K_VALS, offs_n, offs_dk, k_np, length,
                K_ELEM, K_BITS, K_OFFSET, K_SCALE, K_SFMT, K_GROUP, K_FOLD, K_ZERO, K_TAIL, K_GGML, K_RENORM, K_ZP,
                BLOCK_N, BLOCK_DK, HEAD_DIM_K,
            )  # k: [BLOCK_N, BLOCK_DK]
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BLOCK_G, BLOCK_N], log2 units
            s = s * k_rs[None, :] + q_sum[:, None] * k_rz[None, :]
            if K_QJL > 0:  # + s * r * (q @ G^T) . z
                z, r = _sketch(k_base, stride_kt, ks_base, stride_kst, offs_n, offs_n < k_np, K_QJL, BLOCK_N,
                               BLOCK_DK, HEAD_DIM_K)
                s += tl.dot(q_sketch, tl.trans(z), input_precision=PRECISION) * (k_rs * r)[None, :]
            if SOFTCAP:  # softcap * tanh(score / softcap), with softcap given in log2 units as the score is
                s = softcap * _tanh(s / softcap)
            s = tl.where(valid[None, :], s, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing live yet must not make NaNs
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])  # [BLOCK_G, BLOCK_N]
            l_i = l_i * alpha + tl.sum(p, axis=1)

            v, v_rs, v_rz = _load_side(
                v_base, stride_vt, vs_base, stride_vst, vz_base, stride_vzt, vt_base, stride_vtt, v_ts, v_tz,
                V_VALS, offs_n, offs_dv, v_np, length,
                V_ELEM, V_BITS, V_OFFSET, V_SCALE, V_SFMT, V_GROUP, V_FOLD, V_ZERO, V_TAIL, V_GGML, V_RENORM, V_ZP,
                BLOCK_N, BLOCK_DV, HEAD_DIM_V,
            )  # v: [BLOCK_N, BLOCK_DV]
            acc = acc * alpha[:, None] + tl.dot(p * v_rs[None, :], v, input_precision=PRECISION)
            acc += tl.sum(p * v_rz[None, :], axis=1)[:, None]
            if V_QJL > 0:
                z, r = _sketch(v_base, stride_vt, vs_base, stride_vst, offs_n, offs_n < v_np, V_QJL, BLOCK_N,
                               BLOCK_DV, HEAD_DIM_V)
                acc_sketch = acc_sketch * alpha[:, None] + tl.dot(p * (v_rs * r)[None, :], z,
                                                                  input_precision=PRECISION)
            m_i = m_new

    rows = pid_bh * GQA + offs_g  # == b * Hq + h * G + g
    PARTS: tl.constexpr = 2 if V_QJL > 0 else 1  # TQ-prod V: the sketch's sums follow the output's D_v columns
    if SINGLE_SPLIT:  # one split per row: normalize and write the output, no stage 2
        if HAS_SINKS:  # the sink's column joins the denominator: l += 2^(sink - m), m = max(m, sink)
            sink = tl.load(SINKS + h * GQA + offs_g, mask=g_mask, other=0.0)  # [BLOCK_G], log2 units
            m_f = tl.maximum(m_i, sink)
            alpha = tl.exp2(m_i - m_f)
            acc = acc * alpha[:, None]
            acc_sketch = acc_sketch * alpha[:, None]
            l_i = l_i * alpha + tl.exp2(sink - m_f)
        inv = 1.0 / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o = OUT + rows[:, None] * (PARTS * HEAD_DIM_V) + offs_dv[None, :]
        o_mask = g_mask[:, None] & (offs_dv < HEAD_DIM_V)[None, :]
        tl.store(o, (acc * inv).to(OUT.dtype.element_ty), mask=o_mask)
        if V_QJL > 0:
            tl.store(o + HEAD_DIM_V, (acc_sketch * inv).to(OUT.dtype.element_ty), mask=o_mask)
    else:  # partials: MID_ML [B*Hq, num_splits, 2] (m, l), MID_O [B*Hq, num_splits, PARTS * BLOCK_DV], fp32
        ml = MID_ML + (rows * num_splits + split) * 2
        tl.store(ml, m_i, mask=g_mask)
        tl.store(ml + 1, l_i, mask=g_mask)
        o = MID_O + (rows[:, None] * num_splits + split) * (PARTS * BLOCK_DV) + offs_dv[None, :]
        tl.store(o, acc, mask=g_mask[:, None])
        if V_QJL > 0:
            tl.store(o + BLOCK_DV, acc_sketch, mask=g_mask[:, None])


@triton.jit
def _decode_stage2(
    MID_O, MID_ML, SINKS, OUT, num_splits,
    H_KV: tl.constexpr, GQA: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr, HAS_SINKS: tl.constexpr, PARTS: tl.constexpr,
):
    """Grid (B * Hkv,): merge the splits of the G query heads of one KV head, and the sinks of those heads
    (SINKS: fp32 [Hq] in log2 units). Reads num_splits * (PARTS * D_v + 2) fp32 per query head, writes PARTS * D_v
    values in OUT's dtype (OUT: contiguous [B, Hq, PARTS * D_v]; PARTS 2: a TQ-prod V's sketch sums after the
    output)."""
    offs_g = tl.arange(0, BLOCK_G)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_DV)
    g_mask = offs_g < GQA
    rows = tl.program_id(0) * GQA + offs_g  # b * Hq + query head
    gs_mask = g_mask[:, None] & (offs_s < num_splits)[None, :]  # [BLOCK_G, BLOCK_S]
    ml = MID_ML + (rows[:, None] * num_splits + offs_s[None, :]) * 2
    m = tl.load(ml, mask=gs_mask, other=float("-inf"))  # empty splits hold -inf
    l = tl.load(ml + 1, mask=gs_mask, other=0.0)
    m_max = tl.max(m, axis=1)
    if HAS_SINKS:
        sink = tl.load(SINKS + (tl.program_id(0) % H_KV) * GQA + offs_g, mask=g_mask, other=0.0)  # [BLOCK_G]
        m_max = tl.maximum(m_max, sink)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # a row with nothing to attend to: every weight 0
    w = tl.exp2(m - m_max[:, None])  # [BLOCK_G, BLOCK_S]
    den = tl.sum(l * w, axis=1)
    if HAS_SINKS:
        den += tl.exp2(sink - m_max)
    inv = 1.0 / tl.where(den > 0, den, 1.0)[:, None]
    for part in tl.static_range(PARTS):
        o = (MID_O + (rows[:, None, None] * num_splits + offs_s[None, :, None]) * (PARTS * BLOCK_DV)
             + part * BLOCK_DV + offs_d[None, None, :])
        acc = tl.load(o, mask=gs_mask[:, :, None], other=0.0)  # [BLOCK_G, BLOCK_S, BLOCK_DV]
        num = tl.sum(acc * w[:, :, None], axis=1)  # [BLOCK_G, BLOCK_DV]
        tl.store(OUT + rows[:, None] * (PARTS * HEAD_DIM_V) + part * HEAD_DIM_V + offs_d[None, :],
                 (num * inv).to(OUT.dtype.element_ty), mask=g_mask[:, None] & (offs_d < HEAD_DIM_V)[None, :])
