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

How kvviz runs it (the `llama.cpp:<type>` names): a cache layer (kvviz.cache) holds K and V in llama.cpp's basis
(`Layout.to_cache`: its channel order, then its rotation) as ggml blocks, and hands attention `QTensor`s whose codec
is `Stored`; the "kvviz" attention function (kvviz/attention.py) reads them with `read` (Q into the same basis and
rounded, f32 softmax and V sums, the output un-rotated). `attention` stores and reads in one call: the reference
that path is tested against, and the engine view's simulation (kvviz.engines.simulate.llamacpp_kld).

Not simulated (the figures agree with llama.cpp's within 20% without them; benchmarks/llamacpp_fidelity.py): the
order of llama.cpp's sums, q8_1's fp16 block sums, ggml's GELU through an fp16 table (Gemma), an f16 V's f16
accumulator beside a quantized K. So the simulation matches llama.cpp's statistics, not its bits.

    from kvviz import ggml_attention as ga
    q8 = ga.round_activation(x, "q8_0")                          # x [..., D], D % 32 == 0
    out = ga.attention(q, k, v, mask, scaling, "q4_0", "q4_0")   # [B, T, Hq, Dv]
    lay = ga.layout("q4_0", "q4_0", 64, 64, interleaved=True)    # how a cache layer holds them
    out = ga.read(q, stored_k, stored_v, mask, scaling, lay)     # stored_*: decoded blocks of lay.to_cache(k / v)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kvviz.formats import get_format, hadamard

F16 = "f16"
TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # llama.cpp's quantized -ctk / -ctv types kvviz stores
VEC_DOT = {F16: F16, "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q8_0", "q5_0": "q8_0", "iq4_nl": "q8_0", "q4_1": "q8_1",
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


# ------------------------------------------------------------------------------------------ the cache's basis

NORM_ROPE_MODELS = ("llama", "mistral", "mixtral")  # transformers model types llama.cpp holds RoPE-interleaved


def interleaved_model(config) -> bool:
    """Whether llama.cpp holds this transformers model's Q/K channels RoPE-interleaved (its "norm" RoPE:
    convert_hf_to_gguf permutes Llama's q/k weights, transformers un-permutes them on load), from its model_type."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return getattr(text, "model_type", None) in NORM_ROPE_MODELS


@dataclass(frozen=True)
class Layout:
    """How llama.cpp holds one layer's K and V cache, and so how its attention reads them.

    k_type, v_type: F16, "bf16" or one of TYPES; nk: the Hadamard size K and Q are rotated by (None: unrotated);
    nv: V's (None: unrotated; the output is un-rotated by it); interleaved: K and Q in llama.cpp's RoPE-interleaved
    channel order. `to_cache` maps a K or V [..., D] from the model's basis into llama.cpp's, `from_cache` back."""

    k_type: str
    v_type: str
    nk: int | None
    nv: int | None
    interleaved: bool

    @property
    def quantized(self) -> bool:
        """The one-chunk path (Q in K's vec_dot_type) runs when either side is quantized."""
        return self.k_type in TYPES or self.v_type in TYPES

    def to_cache(self, x: torch.Tensor, side: str) -> torch.Tensor:
        """x [..., D] (K or Q for side "k", V for "v"), the model's basis -> llama.cpp's, fp32."""
        x = x.float()
        if side == "k":
            if self.interleaved:  # [..., D]: channels 0, D/2, 1, D/2 + 1, ...
                x = x.unflatten(-1, (2, -1)).transpose(-1, -2).flatten(-2)
            return rotate(x, self.nk) if self.nk else x
        return rotate(x, self.nv) if self.nv else x

    def from_cache(self, x: torch.Tensor, side: str) -> torch.Tensor:
        """The inverse of to_cache (H is its own inverse), fp32."""
        x = x.float()
        if side == "v":
            return rotate(x, self.nv) if self.nv else x
        x = rotate(x, self.nk) if self.nk else x
        return x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2) if self.interleaved else x


def layout(k_type: str, v_type: str, k_dim: int, v_dim: int, rotate_kv: bool = True,
           interleaved: bool = False) -> Layout:
    """llama.cpp's Layout for K and V cache types of head dims k_dim, v_dim, with its default rotation when
    rotate_kv (False: LLAMA_ATTN_ROT_DISABLE=1): K (and Q) rotated when K is quantized and k_dim % 64 == 0, V when
    V is quantized and v_dim % 64 == 0 (llama_kv_cache::build_input_k_rot / _v_rot)."""
    nk = k_rotation(k_dim) if rotate_kv and k_type in TYPES else None
    nv = V_ROTATION if rotate_kv and v_type in TYPES and v_dim % V_ROTATION == 0 else None
    return Layout(k_type, v_type, nk, nv, interleaved)


_CACHE_TYPE = {"fp16": F16}  # a llama.cpp name's kvviz base -> llama.cpp's type (formats.engines.LLAMA_CPP_DTYPES)


def cache_layout(k_fmt, v_fmt, k_dim: int, v_dim: int, interleaved: bool) -> Layout | None:
    """The Layout a cache layer holds K and V in when both formats are llama.cpp names (`llama.cpp:q4_0`, with
    its rotation unless /norot), else None (kvviz's own formats, read by kvviz's attention)."""
    if k_fmt.engine != "llama.cpp" or v_fmt.engine != "llama.cpp":
        return None
    types = [_CACHE_TYPE.get(f.base, f.base) for f in (k_fmt, v_fmt)]
    return layout(*types, k_dim, v_dim, k_fmt.engine_rot, interleaved)


@dataclass(frozen=True)
class Stored:
    """The codec of a llama.cpp cache side's QTensor (kvviz.cache): `fmt`'s blocks of K or V (`side`) as llama.cpp
    holds them, in `layout`'s basis. dequantize returns the model's basis (what every reader of a QTensor expects:
    a mirror, an error map); `stored` the values llama.cpp's attention reads. Other attributes are fmt's."""

    fmt: object
    layout: Layout
    side: str

    granularity = property(lambda self: self.fmt.granularity)
    group = property(lambda self: self.fmt.group)

    def dequantize(self, q) -> torch.Tensor:
        """QTensor -> its quantized tokens in the model's basis, [..., n_quantized, D] in q.dtype."""
        return self.layout.from_cache(self.fmt.dequantize(q).float(), self.side).to(q.dtype)

    def stored(self, q) -> torch.Tensor:
        """A cache side (QTensor of this codec) -> its visible tokens in llama.cpp's basis, fp32
        [..., seq_len - skip, D]: the decoded blocks exactly, and the tail (in the same basis)."""
        dense = dataclasses.replace(q, fmt=self.fmt, dtype=torch.float32, tail=None, skip=0, memo=None,
                                    data=q.data.contiguous(),
                                    scale=None if q.scale is None else q.scale.contiguous(),
                                    zero=None if q.zero is None else q.zero.contiguous())
        x = self.fmt.dequantize(dense) if q.n_quantized else q.tail[..., :0, :].float()
        if q.tail is not None and q.tail.shape[-2]:
            x = torch.cat([x, q.tail.float()], dim=-2)
        return x[..., q.skip :, :]

    def __getattr__(self, name):
        return getattr(self.fmt, name)


def reads(key, value) -> bool:
    """Whether a layer's cache sides (QTensors) are llama.cpp's, to be read by `read_sides`."""
    return isinstance(key.fmt, Stored) and isinstance(value.fmt, Stored)


# ------------------------------------------------------------------------------------------ attention

def read(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float,
         lay: Layout, softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """llama.cpp's CPU flash attention over K and V as its cache holds them (in `lay`'s basis, stored values).

    query: [B, Hq, T, Dk] in the model's basis (RoPE applied); key: [B, Hkv, S, Dk], value: [B, Hkv, S, Dv] fp32,
    in lay's basis; mask: None (causal, bottom-right) or [B | 1, 1, T, S] bool (True = attend) or additive float;
    sinks: None or [Hq] logits of an extra softmax column (gpt-oss); GQA: q head h reads kv head h // (Hq // Hkv).
    Returns [B, T, Hq, Dv] in query's dtype, in the model's basis.
    """
    q = lay.to_cache(query, "k")
    if lay.quantized:  # the one-chunk path: Q converted to K's vec_dot_type
        q = round_activation(q, VEC_DOT[lay.k_type])
    k, v = key.float(), value.float()
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # [B, Hq, S, D]
    scores = (q @ k.transpose(-1, -2)) * scaling  # [B, Hq, T, S] fp32
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    t, s = scores.shape[-2:]
    if mask is None:
        mask = torch.arange(s, device=q.device)[None, :] <= torch.arange(s - t, s, device=q.device)[:, None]
    if mask.dtype == torch.bool:  # dtype min, not -inf: a fully masked row (left padding) stays finite, as in eager
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    else:
        scores = scores + mask.float()
    if sinks is not None:  # one more column per head that takes probability mass and is dropped
        column = sinks.float().reshape(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = lay.from_cache(probs @ v, "v")  # [B, Hq, T, Dv]
    return out.transpose(1, 2).to(query.dtype)


def read_sides(query: torch.Tensor, key, value, mask: torch.Tensor | None, scaling: float,
               softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """`read` over a llama.cpp cache layer's sides (QTensors whose codec is Stored: `reads(key, value)`)."""
    return read(query, key.fmt.stored(key), value.fmt.stored(value), mask, scaling, key.fmt.layout, softcap, sinks)


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
              scaling: float, k_type: str, v_type: str, rotate_kv: bool = True,
              softcap: float | None = None, interleaved: bool = False) -> torch.Tensor:
    """llama.cpp's cache and CPU flash attention in one call, the reference of the cache path (kvviz.cache holds
    `to_cache` of K/V in `Stored` sides, kvviz.attention reads them with `read`): K of `k_type` and V of `v_type`
    (F16 or one of TYPES), with its default rotation when `rotate_kv` (False: LLAMA_ATTN_ROT_DISABLE=1).
    interleaved: the model's GGUF stores Q and K with RoPE's pairs interleaved (interleaved_model), so llama.cpp's
    head_dim order is (0, D/2, 1, D/2 + 1, ...) of transformers'; the cache's blocks of 32 (and the Hadamard
    blocks) follow llama.cpp's order.

    query: [B, Hq, T, Dk]; key: [B, Hkv, S, Dk]; value: [B, Hkv, S, Dv] (the unquantized projections, RoPE applied:
    this function stores them); mask: as `read`'s. Returns [B, T, Hq, Dv] in query's dtype, as transformers'
    attention functions do.
    """
    lay = layout(k_type, v_type, key.shape[-1], value.shape[-1], rotate_kv, interleaved)
    k = store(lay.to_cache(key, "k"), k_type)
    v = store(lay.to_cache(value, "v"), v_type)
    return read(query, k, v, mask, scaling, lay, softcap)
