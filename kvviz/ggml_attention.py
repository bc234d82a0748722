"""llama.cpp's arithmetic in torch: its CPU flash attention over a quantized KV cache, its Hadamard rotation of
Q/K/V, and the rounding of every weight matmul's input, so that kvviz can run what llama.cpp runs (the
`llama.cpp:<type>` names) rather than only what it stores.

Followed from the llama.cpp that llama-cpp-python 0.3.36 vendors:

- Rotation (src/llama-kv-cache.cpp, src/llama-graph.cpp `build_attn`, PR 21038): when the K cache type is
  quantized and head_dim % 64 == 0, Q and K are multiplied by an orthonormal Sylvester Hadamard matrix (ggml's
  `ggml_gen_hadamard`, symmetric, H H = I) block by block along head_dim, of size the largest power of two >= 64
  dividing head_dim (`k_rotation`); when the V type is quantized, V is rotated by 64-wide blocks and the attention
  output multiplied by the same matrix again (un-rotated). `LLAMA_ATTN_ROT_DISABLE=1` turns both off (`rotate=False`).
- Storage: the batch's K and V are written into the cache (`ggml_set_rows`, f32 -> the cache type) before
  attention reads them, so every position, the prompt's included, reads K/V as stored (`store`).
- Attention (ggml/src/ggml-cpu/ops.cpp `ggml_compute_forward_flash_attn_ext_f16`): with an f16 K and V and a batch
  of queries, the tiled path: Q in f32, K and V widened from f16, scores, softmax and V sums in f32. With a
  quantized K or V, `..._one_chunk`: Q is converted to K's `vec_dot_type` (f16 for f16, q8_0 for q8_0 / q4_0 /
  q5_0 / iq4_nl, q8_1 for q4_1 / q5_1: `VEC_DOT`), each score is K's dot product with that (integer sums times the
  fp16 scales: exact in fp32 but for the order of the sum), online softmax in f32, V dequantized to f32 and summed
  in f32. (An f16 V beside a quantized K is summed in an f16 accumulator there; not simulated: f32 here.)
- Matmuls (ggml-cpu.c `ggml_compute_forward_mul_mat`): a quantized weight multiplies its input converted to the
  weight type's `vec_dot_type` (q8_0 / q8_1 in blocks of 32, q8_K in blocks of 256): the activations entering every
  projection are rounded to 8 bits (`round_activation`). This is the cause of most of the gap between llama.cpp's
  KLD and kvviz's unrotated formats: a KV error, however small, flips some of those roundings in every later layer,
  so the output moves by about a rounding step where it would have moved by the KV error itself.

Not simulated (the figures agree with llama.cpp's within 20% without them; benchmarks/llamacpp_fidelity.py): the
order of llama.cpp's sums, q8_1's fp16 block sums, ggml's GELU through an fp16 table (Gemma), an f16 V's f16
accumulator beside a quantized K. So the simulation matches llama.cpp's statistics, not its bits.

    from kvviz import ggml_attention as ga
    q8 = ga.round_activation(x, "q8_0")                          # x [..., D], D % 32 == 0
    out = ga.attention(q, k, v, mask, scaling, "q4_0", "q4_0")   # [B, T, Hq, Dv]
"""

from __future__ import annotations

import torch

from kvviz.formats import get_format, hadamard

F16 = "f16"
TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # llama.cpp's quantized -ctk / -ctv types kvviz stores
VEC_DOT = {F16: F16, "q8_0": "q8_0", "q4_0": "q8_0", "q5_0": "q8_0", "iq4_nl": "q8_0", "q4_1": "q8_1",
           "q5_1": "q8_1"}  # ggml-cpu.c type_traits_cpu[type].vec_dot_type, KV cache types
WEIGHT_VEC_DOT = {**VEC_DOT, "F32": "f32", "F16": F16, "BF16": "bf16", "Q4_0": "q8_0", "Q4_1": "q8_1",
                  "Q5_0": "q8_0", "Q5_1": "q8_1", "Q8_0": "q8_0", "IQ4_NL": "q8_0", "Q2_K": "q8_K", "Q3_K": "q8_K",
                  "Q4_K": "q8_K", "Q5_K": "q8_K", "Q6_K": "q8_K"}  # the same table for GGUF weight types
V_ROTATION = 64  # llama_kv_cache::build_input_v_rot: always 64 ("smaller rotation matrices for V seem beneficial")


def k_rotation(head_dim: int) -> int | None:
    """The Hadamard size llama.cpp rotates a quantized K (and Q) by: the largest power of two >= 64 that divides
    head_dim (llama_kv_cache::build_input_k_rot); None when head_dim % 64 != 0 (no rotation)."""
    if head_dim % 64:
        return None
    n = 64
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def rotate(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [..., D] times the orthonormal Hadamard H [n, n] on each of its D / n blocks (llama_mul_mat_hadamard),
    fp32. H is symmetric and its own inverse: rotate(rotate(x, n), n) == x up to rounding."""
    blocks = x.float().unflatten(-1, (-1, n))  # [..., D / n, n]
    return (blocks @ hadamard(n, x.device)).flatten(-2)


def _round_q8(x: torch.Tensor, block: int, scale_fp16: bool) -> torch.Tensor:
    """x [..., D] through 8-bit blocks as ggml-cpu's AVX2 quantize_row_q8_0 / q8_1 (scale_fp16: d = amax / 127
    stored as fp16, codes round(x * 127 / amax), halves to even) or quantize_row_q8_K (block 256, fp32
    d = 1 / (-127 / max) with max the signed value of largest |x|, codes clamped at 127). Returns the
    dequantized values d * q, fp32 [..., D]."""
    b = x.float().unflatten(-1, (-1, block))  # [..., D / block, block]
    amax = b.abs().amax(-1, keepdim=True)
    if scale_fp16:
        d = (amax / 127).half().float()
        q = torch.round(b * torch.where(amax > 0, 127 / amax, torch.zeros_like(amax)))
        return (q * d).flatten(-2)
    signed = b.gather(-1, (b.abs() == amax).to(torch.int32).argmax(-1, keepdim=True))
    iscale = torch.where(amax > 0, -127 / signed, torch.zeros_like(amax))
    q = torch.round(b * iscale).clamp(max=127)
    return (q * torch.where(amax > 0, 1 / iscale, torch.zeros_like(amax))).flatten(-2)


def round_activation(x: torch.Tensor, vec_dot: str) -> torch.Tensor:
    """x [..., D] as ggml's CPU matmul reads it against a weight whose vec_dot_type is `vec_dot` (WEIGHT_VEC_DOT's
    values): "q8_0" / "q8_1" (blocks of 32; q8_1's fp16 block sum, used only with the weight's minimum, is not
    rounded here), "q8_K" (blocks of 256), "f16" / "bf16" (a cast), "f32" (unchanged). Returns x's dtype."""
    if vec_dot in ("q8_0", "q8_1"):
        return _round_q8(x, 32, True).to(x.dtype)
    if vec_dot == "q8_K":
        return _round_q8(x, 256, False).to(x.dtype)
    if vec_dot in (F16, "bf16"):
        return x.to(torch.float16 if vec_dot == F16 else torch.bfloat16).to(x.dtype)
    assert vec_dot == "f32", f"no activation rounding for vec_dot_type {vec_dot!r}"
    return x


def store(x: torch.Tensor, cache_type: str) -> torch.Tensor:
    """K or V [..., D] as the cache holds and attention reads them: fp16 for "f16", else ggml's block quantizer
    (kvviz.formats.ggml, bit-exact) and its dequantization. fp32 out."""
    if cache_type == F16:
        return x.half().float()
    fmt = get_format(cache_type)
    return fmt.dequantize(fmt.quantize(x.float())).float()


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
              scaling: float, k_type: str, v_type: str, rotate_kv: bool = True,
              softcap: float | None = None, interleaved: bool = False) -> torch.Tensor:
    """llama.cpp's CPU flash attention over a K cache of `k_type` and a V cache of `v_type` (F16 or one of TYPES),
    with its default rotation when `rotate_kv` (False: LLAMA_ATTN_ROT_DISABLE=1). interleaved: the model's GGUF
    stores Q and K with RoPE's pairs interleaved (llama.cpp's "norm" RoPE: convert_hf_to_gguf permutes Llama's
    q/k weights, transformers un-permutes them on load), so llama.cpp's head_dim order is (0, D/2, 1, D/2 + 1, ...)
    of transformers'; the cache's blocks of 32 (and the Hadamard blocks) follow llama.cpp's order.

    query: [B, Hq, T, Dk]; key: [B, Hkv, S, Dk]; value: [B, Hkv, S, Dv] (the unquantized projections, RoPE applied:
    this function stores them); mask: None (causal, bottom-right) or [B | 1, 1, T, S] bool (True = attend) or
    additive float; GQA: q head h reads kv head h // (Hq // Hkv). Returns [B, T, Hq, Dv] in query's dtype, as
    transformers' attention functions do.
    """
    q, k, v = query.float(), key.float(), value.float()
    if interleaved:  # Q.K is unchanged by the same permutation of both
        q, k = (x.unflatten(-1, (2, -1)).transpose(-1, -2).flatten(-2) for x in (q, k))  # [..., D]: 0, D/2, 1, ...
    nk = k_rotation(k.shape[-1]) if rotate_kv and k_type != F16 else None
    nv = V_ROTATION if rotate_kv and v_type != F16 and v.shape[-1] % V_ROTATION == 0 else None
    if nk:
        q, k = rotate(q, nk), rotate(k, nk)
    if nv:
        v = rotate(v, nv)
    k, v = store(k, k_type), store(v, v_type)
    if k_type != F16 or v_type != F16:  # the one-chunk path: Q converted to K's vec_dot_type
        q = round_activation(q, VEC_DOT[k_type])
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # [B, Hq, S, D]
    scores = (q @ k.transpose(-1, -2)) * scaling  # [B, Hq, T, S] fp32
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    t, s = scores.shape[-2:]
    if mask is None:
        mask = torch.arange(s, device=q.device)[None, :] <= torch.arange(s - t, s, device=q.device)[:, None]
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask.float()
    out = torch.softmax(scores, dim=-1) @ v  # [B, Hq, T, Dv]
    if nv:
        out = rotate(out, nv)
    return out.transpose(1, 2).to(query.dtype)
