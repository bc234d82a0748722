"""Triton jit element decoders: packed bytes to fp32 values, shared by the decode kernel (kernels/jit/decode.py)
and the packers (kernels/jit/pack.py, kernels/jit/ggml_pack.py), which use them to round-trip. Jit only.

They use integer bit arithmetic (fp8, E2M1, E8M0, iq4_nl) so results are bit-exact on every backend, including the
CPU interpreter. Layouts are kernels/packed.py's.
"""

import triton
import triton.language as tl

# ggml's kvalues_iq4nl as int8 bytes, four codes per little-endian int32 word (codes 4w .. 4w + 3 in word w);
# the first two words are negative as int32.
_IQ4NL_W0 = tl.constexpr(0xBFAD9881 - (1 << 32))  # -127, -104, -83, -65
_IQ4NL_W1 = tl.constexpr(0xF6EADDCF - (1 << 32))  # -49, -35, -22, -10
_IQ4NL_W2 = tl.constexpr(0x26190D01)  # 1, 13, 25, 38
_IQ4NL_W3 = tl.constexpr(0x71594535)  # 53, 69, 89, 113


@triton.jit
def _fp8_to_f32(b, EXP: tl.constexpr):
    """OCP fp8 bytes (int32 0..255) to fp32. EXP=4: E4M3FN (no inf; S.1111.111 is NaN); EXP=5: E5M2."""
    MAN: tl.constexpr = 7 - EXP
    e = (b >> MAN) & ((1 << EXP) - 1)
    m = b & ((1 << MAN) - 1)
    # Normal numbers: rebuild the fp32 bit pattern, exponent rebased from bias 2^(EXP-1)-1 to 127.
    normal = (((e + (128 - (1 << (EXP - 1)))) << 23) | (m << (23 - MAN))).to(tl.float32, bitcast=True)
    if EXP == 4:
        sub = m.to(tl.float32) * 0.001953125  # subnormal: m * 2^-9
        mag = tl.where(e == 0, sub, normal)
        mag = tl.where((b & 0x7F) == 0x7F, float("nan"), mag)
    else:
        sub = m.to(tl.float32) * 1.52587890625e-05  # subnormal: m * 2^-16
        mag = tl.where(e == 0, sub, normal)
        mag = tl.where(e == 31, tl.where(m == 0, float("inf"), float("nan")), mag)
    return tl.where((b & 0x80) != 0, -mag, mag)


@triton.jit
def _e2m1_to_f32(c):
    """FP4 E2M1 codes (int32 0..15: sign, 2 exponent bits, 1 mantissa bit) to fp32: +-{0,.5,1,1.5,2,3,4,6}."""
    e = (c >> 1) & 3
    m = c & 1
    normal = (((e + 126) << 23) | (m << 22)).to(tl.float32, bitcast=True)  # (1 + m/2) * 2^(e-1)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.5, normal)
    return tl.where((c & 8) != 0, -mag, mag)


@triton.jit
def _e8m0_to_f32(b):
    """E8M0 scale bytes (int32) to fp32: 2^(b-127); 0xFF is NaN; b = 0 is the fp32 subnormal 2^-127."""
    x = (b << 23).to(tl.float32, bitcast=True)
    x = tl.where(b == 0, 5.877471754111438e-39, x)
    return tl.where(b == 255, float("nan"), x)


@triton.jit
def _iq4nl_to_f32(c):
    """iq4_nl codes (int32 0..15) to fp32 kvalues_iq4nl[c]: pick the table word, shift its byte down, sign-extend
    (three selects and no memory lookup)."""
    word = tl.where(c < 8, tl.where(c < 4, _IQ4NL_W0, _IQ4NL_W1), tl.where(c < 12, _IQ4NL_W2, _IQ4NL_W3))
    byte = (word.to(tl.int32) >> ((c & 3) * 8)) & 0xFF
    return (byte - ((byte & 0x80) << 1)).to(tl.float32)


@triton.jit
def _ggml_codes(data, stride_dt, offs_n, in_packed, BITS: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Codes (int32 [BLOCK_N, BLOCK_D], 0 .. 2**BITS - 1) of llama.cpp's 4 / 5-bit blocks: per 32 channels,
    (BITS 5: qh, 4 bytes, bit j = bit 4 of code j, then) qs, 16 bytes, byte j = code j | code j + 16 << 4.
    Reads each of the BLOCK_N * HEAD_DIM * BITS / 8 bytes once."""
    NB: tl.constexpr = BLOCK_D // 32  # blocks per row (lanes past HEAD_DIM are masked off)
    BB: tl.constexpr = 4 * BITS  # bytes per block
    blk = tl.arange(0, NB)
    j = tl.arange(0, 16)
    row = data + offs_n[:, None, None] * stride_dt + blk[None, :, None] * BB  # [BLOCK_N, NB, 1]
    live = in_packed[:, None, None] & (blk < HEAD_DIM // 32)[None, :, None]
    qs = tl.load(row + (BB - 16) + j[None, None, :], mask=live, other=0).to(tl.int32)  # [BLOCK_N, NB, 16]
    half = tl.arange(0, 2)
    codes = (qs[:, :, None, :] >> (half * 4)[None, None, :, None]) & 15  # [BLOCK_N, NB, 2, 16]: code 16h + j
    if BITS == 5:
        k = tl.arange(0, 4)
        qh_b = tl.load(row + k[None, None, :], mask=live, other=0).to(tl.int32)  # [BLOCK_N, NB, 4]
        qh = tl.sum(qh_b << (k * 8)[None, None, :], axis=2)  # [BLOCK_N, NB]: the little-endian uint32
        bit = half[:, None] * 16 + j[None, :]  # [2, 16]
        codes = codes | (((qh[:, :, None, None] >> bit[None, None, :, :]) & 1) << 4)
    return tl.reshape(codes, [BLOCK_N, BLOCK_D])


@triton.jit
def _codes3(data, stride_dt, offs_n, in_packed, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
            HEAD_DIM: tl.constexpr):
    """3-bit codes (int32 [BLOCK_N, BLOCK_D], 0..7): each 8 elements a little-endian 3-byte word, element 8w + j at
    bits 3j of word w (vLLM TurboQuant's layout). Reads each of the BLOCK_N * HEAD_DIM * 3 / 8 bytes once."""
    offs_w = tl.arange(0, BLOCK_D // 8)
    mask = in_packed[:, None] & (offs_w < HEAD_DIM // 8)[None, :]
    ptrs = data + offs_n[:, None] * stride_dt + offs_w[None, :] * 3  # [BLOCK_N, BLOCK_D / 8]: byte 0 of word w
    word = tl.load(ptrs, mask=mask, other=0).to(tl.int32)
    word |= tl.load(ptrs + 1, mask=mask, other=0).to(tl.int32) << 8
    word |= tl.load(ptrs + 2, mask=mask, other=0).to(tl.int32) << 16
    codes = (word[:, :, None] >> (tl.arange(0, 8) * 3)[None, None, :]) & 7  # [BLOCK_N, BLOCK_D / 8, 8]
    return tl.reshape(codes, [BLOCK_N, BLOCK_D])
