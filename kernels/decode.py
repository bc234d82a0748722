"""Launcher for the split-K quantized decode attention in `kernels/jit/decode.py`.

`decode_attention` checks shapes, picks block sizes and the split count, turns each side's optional tensors into
constexpr flags, applies rotations outside the kernel (stored K and V are x @ R^T: q . x = (q @ R^T) . stored;
out = (P stored) @ R), and launches the two stages. Attention sinks (gpt-oss) and logit softcapping (Gemma 2) are
optional; K and V may have different head dims (DeepSeek-V3: K 192, V 128). llama.cpp's KV types (q8_0, q4_0, q4_1,
q5_0, q5_1, iq4_nl: sides with layout "ggml") are read in ggml's block order; the engines' stores (vLLM's int8 /
fp8 / int4 per-token-head, NVFP4 and TurboQuant caches, TQ-mse, TQ-prod) through their codebooks, norm
corrections, zero points and TQ-prod's sign sketch (`supports` says which formats). Without a usable Triton (no
CUDA, no TRITON_INTERPRET=1, or triton not installed) it runs the float64 reference instead, so the CPU path always
works.

    out = decode_attention(q, k, v, lengths)   # q: [B, Hq, D_k] -> out: [B, Hq, D_v], q's dtype
"""

from __future__ import annotations

import functools
import math

import torch

from kernels._triton import triton_usable
from kernels.packed import PackedSide, describes_format, per_head
from kernels.reference import decode_attention_reference
from kernels.splits import next_pow2, split_tokens

_MAX_SPLITS = 64  # stage 2 holds every split of one row in registers


def supports(fmt) -> bool:
    """Whether this kernel decodes a kvviz-like format (duck-typed `kind`, `base`): kvviz's own families and the
    engines' stores (vLLM's per-token-head, NVFP4 and TurboQuant caches, TQ-mse, TQ-prod). Which formats the Triton
    packer writes is kernels.pack.quant_pack_supported's answer."""
    return describes_format(fmt)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1  # the interpreter runs programs one after another: fewer is faster


def _side_args(side: PackedSide, lengths: torch.Tensor, batch: int, heads: int, head_dim: int):
    """(pointer and stride arguments, constexpr flags) of one side, in the order _decode_stage1 takes them."""
    assert side.data.shape[:2] == (batch, heads), (
        f"packed data is [B, Hkv, cap, packed_dim] = {tuple(side.data.shape)}; want B={batch}, Hkv={heads}"
    )
    assert side.head_dim == head_dim, f"side head_dim {side.head_dim} != expected {head_dim} (K: q's, V: v's)"
    data = side.data
    if data.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        data = data.view(torch.uint8)  # decoded with integer bit arithmetic in the kernel
    assert data.stride(-1) == 1, "packed data must be contiguous along its last dim"
    scale, zero, sfmt = side.scale, None, 0  # SFMT_NATIVE
    if side.scale_kind is not None:
        assert scale.stride(-1) == 1, "scales must be contiguous along their last dim"
        if side.zp_bits:
            scale = scale.view(torch.int32)  # the kernel splits the fp32 bits: zero point low, scale above
        elif scale.dtype == torch.uint8:
            sfmt = 1  # SFMT_E8M0
        elif scale.dtype == torch.float8_e4m3fn:
            scale, sfmt = scale.view(torch.uint8), 2  # SFMT_E4M3: NV FP4 block scales
        zero = side.zero
        if zero is not None:
            assert zero.shape == side.scale.shape and zero.stride(-1) == 1, "zero must be shaped as scale"
    tensor_scale = per_head(side.tensor_scale, batch, heads, data.device)
    tensor_zero = per_head(side.zero, batch, heads, data.device) if side.scale_kind is None else None
    assert not ((zero is not None or tensor_zero is not None) and tensor_scale is not None and side.scale_kind), (
        "a group zero point together with a tensor scale is not a kvviz layout"
    )
    group = side.group_size
    fold = side.scale_kind is None or (side.scale_kind == "token" and group >= head_dim)
    assert not side.zp_bits or (fold and zero is None and tensor_scale is None), (
        "a zero point in the scale's low bits is read for one scale per token, without zeros or tensor scales")
    n_packed = lengths if side.n_packed is None else torch.as_tensor(side.n_packed, device=data.device)
    n_packed = n_packed.to(device=data.device, dtype=torch.int32).expand(batch).contiguous()
    tail = side.tail
    if tail is not None:
        assert tail.dim() == 4 and tail.shape[:2] == (batch, heads) and tail.shape[3] == head_dim, (
            f"tail must be [B, Hkv, R, D], got {tuple(tail.shape)}"
        )
        assert tail.stride(-1) == 1, "tail must be contiguous along head_dim"
    s = scale if scale is not None else data  # placeholders for absent tensors are never read
    z = zero if zero is not None else s
    t = tail if tail is not None else data
    args = [
        data, data.stride(0), data.stride(1), data.stride(2),
        s, s.stride(0), s.stride(1), s.stride(2),
        z, z.stride(0), z.stride(1), z.stride(2),
        t, t.stride(0), t.stride(1), t.stride(2),
        tensor_scale if tensor_scale is not None else n_packed,
        tensor_zero if tensor_zero is not None else n_packed,
        n_packed,
        _codebook(side, data.device) if side.elem == "table" else n_packed,
    ]
    from kernels.jit import decode as jit

    elem = {"float": jit.ELEM_NATIVE, "int": jit.ELEM_UINT, "fp8_e4m3": jit.ELEM_E4M3, "fp8_e5m2": jit.ELEM_E5M2,
            "e2m1": jit.ELEM_E2M1, "iq4_nl": jit.ELEM_IQ4NL, "table": jit.ELEM_TABLE}[side.elem]
    scale_code = {None: jit.SCALE_NONE, "token": jit.SCALE_TOKEN, "channel": jit.SCALE_CHANNEL}[side.scale_kind]
    flags = dict(
        ELEM=elem, BITS=min(side.bits, 16), OFFSET=side.offset,
        SCALE=scale_code, SFMT=sfmt, GROUP=max(group, 1), FOLD=fold,
        ZERO=zero is not None, TENSOR=tensor_scale is not None, TZERO=tensor_zero is not None, TAIL=tail is not None,
        GGML=side.layout == "ggml", RENORM=side.renorm, ZP=side.zp_bits,
        QJL=head_dim * side.bits // 8 if side.qjl is not None else 0,  # TQ-prod: its signs' offset in a row
    )
    return args, flags


def _codebook(side: PackedSide, device: torch.device) -> torch.Tensor:
    """A table side's codebook as contiguous fp32 [2**bits] on `device`: copied once per side's memo (a cache side
    keeps one), so a decode step does no host-to-device copy. Formats may build the table anew on each call
    (TQ-mse's), so a held copy serves while its values are equal."""
    memo = side.memo if side.memo is not None else {}
    held = memo.get("triton_codebook")
    values = side.values
    if held is None or held[1].device != device or not (held[0] is values or (
            held[0].device == values.device and held[0].shape == values.shape and torch.equal(held[0], values))):
        held = (values, values.detach().to(device=device, dtype=torch.float32).contiguous())
        memo["triton_codebook"] = held
    return held[1]


def decode_attention(
    q: torch.Tensor,
    k: PackedSide,
    v: PackedSide,
    lengths: torch.Tensor | int,
    num_splits: int | None = None,
    sm_scale: float | None = None,
    *,
    kv_mask: torch.Tensor | None = None,
    max_length: int | None = None,
    block_n: int | None = None,
    precision: str = "ieee",
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Decode attention of one new query token per sequence over a packed, quantized KV cache.

    q:        [B, Hq, D_k] float (fp32 compute inside); Hq a multiple of Hkv (GQA: q head i reads kv head i // G)
    k, v:     PackedSide (see kernels/packed.py): data [B, Hkv, cap, D * bits / 8], scales, zeros, tail, rotation;
              k.head_dim == D_k, v.head_dim == D_v (may differ from D_k)
    lengths:  [B] int (or one int): valid tokens per sequence; token t reads the packed buffers when
              t < side.n_packed[b], else the side's full-precision tail at t - n_packed[b]
    num_splits: token-range splits per (b, kv head); None picks one from the SM count and max_length
    sm_scale: softmax scale, default 1/sqrt(D_k)
    kv_mask:  optional bool [B, >= max(lengths)] (True = attend): left padding, the tokens of a sliding window or
              of the current chunk; blocks with no live token are skipped unread
    max_length: an upper bound on lengths, to size splits without a device sync (default lengths.max())
    precision: tl.dot input precision on GPU: "ieee" (fp32), "tf32x3" or "tf32"
    sinks:    optional [Hq] float: one extra logit per query head in the softmax denominator, no value (gpt-oss)
    softcap:  optional float > 0: scores (after sm_scale) become softcap * tanh(scores / softcap) (Gemma 2);
              None or 0 is off
    Returns [B, Hq, D_v] in q's dtype.
    """
    if q.dim() != 3:
        raise ValueError(f"decode_attention takes one query token per sequence, q: [B, Hq, D]; got {tuple(q.shape)}.")
    batch, hq, head_dim = q.shape
    hkv = k.data.shape[1]
    if hq % hkv:
        raise ValueError(f"Query heads ({hq}) must be a multiple of KV heads ({hkv}).")
    if k.head_dim != head_dim:
        raise ValueError(f"K head_dim ({k.head_dim}) must equal the query's ({head_dim}); V's may differ.")
    if v.data.shape[1] != hkv:
        raise ValueError(f"K and V must have the same number of KV heads; got {hkv} and {v.data.shape[1]}.")
    if sinks is not None and sinks.numel() != hq:
        raise ValueError(f"sinks holds {sinks.numel()} values; pass one logit per query head ({hq}).")
    if softcap is not None and not softcap >= 0:
        raise ValueError(f"softcap must be a positive number (or 0 / None for no capping); got {softcap}.")
    softcap = float(softcap) if softcap else None
    head_dim_v = v.head_dim
    if isinstance(lengths, int):
        max_length = lengths if max_length is None else max_length  # no device sync to size the splits
        lengths = torch.full((batch,), lengths, dtype=torch.int32, device=q.device)
    lengths = lengths.to(device=q.device, dtype=torch.int32).reshape(batch).contiguous()
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    if not triton_usable(q.device):
        ref = decode_attention_reference(q, k, v, lengths, sm_scale, kv_mask, sinks=sinks, softcap=softcap)
        return ref.to(device=q.device, dtype=q.dtype)

    from kernels.jit.decode import LOG2E, _decode_stage1, _decode_stage2

    # score = q . (stored @ R) = (q @ R^T) . stored: the query turns, the cache is read as stored.
    qk = q if k.rotation is None else (q.float() @ k.rotation.to(q.device, torch.float32).T)  # [B, Hq, D]
    if k.qjl is not None:  # TQ-prod: q in the sketch's basis, q @ G^T, after q in each row
        qk = torch.cat([qk.float(), q.float() @ k.qjl.to(q.device, torch.float32).T], dim=-1).contiguous()
    assert qk.stride(-1) == 1, "q must be contiguous along head_dim"
    gqa = hq // hkv
    block_dk, block_dv = max(16, next_pow2(head_dim)), max(16, next_pow2(head_dim_v))
    block_n = block_n or (64 if max(block_dk, block_dv) <= 64 else 32)
    block_g = max(16, next_pow2(gqa))
    if max_length is None:
        max_length = int(lengths.max()) if batch else 0
    num_splits, tokens_per_split = split_tokens(max_length, batch * hkv, _sm_count(q.device), block_n, num_splits,
                                                _MAX_SPLITS)

    k_args, k_flags = _side_args(k, lengths, batch, hkv, head_dim)
    v_args, v_flags = _side_args(v, lengths, batch, hkv, head_dim_v)
    flags = {f"K_{name}": value for name, value in k_flags.items()}
    flags.update({f"V_{name}": value for name, value in v_flags.items()})
    if kv_mask is not None:
        assert kv_mask.dim() == 2 and kv_mask.shape[0] == batch and kv_mask.shape[1] >= max_length, (
            f"kv_mask must be [B, >= max(lengths)] = [{batch}, >= {max_length}], got {tuple(kv_mask.shape)}"
        )
        mask = kv_mask.to(device=q.device, dtype=torch.uint8).contiguous()  # [B, L]: 1 byte per token
    else:
        mask = lengths  # placeholder, never read
    # The kernel's scores are in log2 units (exp2 softmax): sinks and the cap are scaled alike.
    sinks_log2 = lengths if sinks is None else (sinks.detach().to(q.device, torch.float32).reshape(hq) * LOG2E)
    sinks_log2 = sinks_log2.contiguous()
    parts = 2 if v.qjl is not None else 1  # TQ-prod V: its sketch's sums come back after the output's columns
    out = torch.empty(batch, hq, parts * head_dim_v, device=q.device,
                      dtype=torch.float32 if v.rotation is not None else q.dtype)
    single = num_splits == 1
    # Partials (m, l, acc) per query head and split, fp32; one split writes `out` directly.
    mid_o = torch.empty(batch * hq, 1 if single else num_splits, parts * block_dv, device=q.device,
                        dtype=torch.float32)
    mid_ml = torch.empty(batch * hq, 1 if single else num_splits, 2, device=q.device, dtype=torch.float32)
    _decode_stage1[(batch * hkv, num_splits)](
        qk, qk.stride(0), qk.stride(1), *k_args, *v_args,
        lengths, mask, mask.stride(0), sinks_log2, mid_o, mid_ml, out, sm_scale * LOG2E,
        (softcap or 0.0) * LOG2E, tokens_per_split, num_splits,
        H_KV=hkv, GQA=gqa, HEAD_DIM_K=head_dim, HEAD_DIM_V=head_dim_v, BLOCK_G=block_g, BLOCK_N=block_n,
        BLOCK_DK=block_dk, BLOCK_DV=block_dv, PRECISION=precision, HAS_MASK=kv_mask is not None,
        HAS_SINKS=sinks is not None, SOFTCAP=softcap is not None, SINGLE_SPLIT=single, num_warps=4, **flags,
    )
    if not single:
        _decode_stage2[(batch * hkv,)](
            mid_o, mid_ml, sinks_log2, out, num_splits,
            H_KV=hkv, GQA=gqa, HEAD_DIM_V=head_dim_v, BLOCK_G=block_g, BLOCK_S=max(2, next_pow2(num_splits)),
            BLOCK_DV=block_dv, HAS_SINKS=sinks is not None, PARTS=parts, num_warps=4,
        )
    if v.qjl is not None:
        out, sketch = out[..., :head_dim_v], out[..., head_dim_v:]
    if v.rotation is not None:
        out = out @ v.rotation.to(q.device, torch.float32)
    if v.qjl is not None:
        out = out + sketch @ v.qjl.to(q.device, torch.float32)
    return out.to(q.dtype)

