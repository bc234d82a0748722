"""The contract between the fused CPU decode's launcher (kernels/cpu/decode.py, kernels/cpu/meta.py) and its numba
code (kernels/cpu/jit/): storage codes, the fields of a side's int64 `meta` vector, the block size. No numba here,
so the launcher reads them without importing numba. Every field is filled from the side a format's layout describes
(kernels/packed.py), never from the format's name.
"""

# Element / scale storage: codes through a table, or IEEE half, bfloat16, float32 read from their bytes.
E_LUT, E_F16, E_BF16, E_F32, E_UINT, E_INT8, E_E2M1 = 0, 1, 2, 3, 4, 5, 6
S_NONE, S_TOKEN, S_CHANNEL = 0, 1, 2
# Fields of a side's int64 `meta` vector (kernels/cpu/meta.py fills it).
(M_DIM, M_ELEM, M_PER_BYTE, M_OFFSET, M_D_OFF, M_D_SB, M_D_SH, M_D_ST,
 M_SKIND, M_SDT, M_GROUP, M_S_OFF, M_S_SB, M_S_SH, M_S_ST,
 M_ZERO, M_Z_OFF, M_Z_SB, M_Z_SH, M_Z_ST,
 M_TDT, M_T_OFF, M_T_SB, M_T_SH, M_T_ST, M_TAIL, M_GGML,
 M_UNIT, M_RENORM, M_ZP, M_QJL) = range(31)
META_LEN = 31
# M_PER_BYTE: codes per packing unit; M_UNIT: bytes per unit (1, or 3 for 3-bit codes: 8 in a little-endian
# 24-bit word); M_RENORM: divide each token's decoded row by its norm (vLLM TurboQuant "nc"); M_ZP: low bits of the
# fp32 token scale holding a zero point (vLLM int4_per_token_head), 0 for none; M_QJL: byte offset, within a data
# row, of TQ-prod's sign bits (the token scale's second column its residual norm), 0 for none.
BLOCK = 64  # tokens per block: a [64, D] fp32 tile (16 KiB at D = 64) stays in L1/L2
