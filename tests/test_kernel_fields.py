"""The engines' stores as the kernels see them: a PackedSide built from `Format.kernel_fields` dequantizes (through
the float64 reference, kernels/reference.py) to what the format's own decode reads back.

This is the contract the fused kernels (numba on the CPU, Triton) are written against for vLLM's per-token-head,
NVFP4 and TurboQuant caches and the paper's TQ-mse and TQ-prod: codebook elements, 3- and 1-bit packing, the "nc"
norm correction, a zero point in the scale's low bits, TQ-prod's 1-bit sketch of the residual, and the rotations the
query takes instead of the cache."""

from __future__ import annotations

import pytest
import torch

from kernels.packed import describes_format, side_of
from kernels.reference import decode_attention_reference, decode_elements, dequantize_side
from kvviz import parse_kv

ENGINE_SPECS = [
    "vllm:int8_per_token_head", "vllm:fp8_per_token_head", "vllm:int4_per_token_head", "vllm:nvfp4",
    "vllm:nvfp4_4over6", "vllm:turboquant_4bit_nc", "vllm:turboquant_k3v4_nc", "vllm:turboquant_3bit_nc",
    "vllm:turboquant_k8v4", "tq_mse1", "tq_mse2", "tq_mse3", "tq_mse4", "tq_prod2", "tq_prod3", "tq_prod4",
]


def _sides(spec: str):
    kv = parse_kv(spec)
    return {"k": kv.k, "v": kv.v}


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("spec", ENGINE_SPECS)
def test_a_packed_side_reads_back_what_the_format_decodes(spec, head_dim):
    torch.manual_seed(head_dim)
    x = torch.randn(1, 2, 5, head_dim, dtype=torch.bfloat16) * 2
    x[..., 3] *= 8  # an outlier channel
    for name, fmt in _sides(spec).items():
        assert describes_format(fmt), f"{spec} {name}"
        q = fmt.quantize(x)
        side = side_of(q)
        got = dequantize_side(side, 5)
        want = fmt.dequantize(q).double()  # the format's decode, in the model's dtype
        # The formats round TurboQuant's key to fp16 and the output to bf16 before the rotation; the reference
        # keeps float64 throughout: agreement to bf16's precision.
        assert torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(x.abs().max())), f"{spec} {name}"
        assert (got - want).abs().mean() < 2e-3 * float(x.abs().max()), f"{spec} {name}"


def test_tq_prods_score_is_two_dot_products_in_two_bases():
    """TQ-prod's key read as the kernels score it: (q @ R^T) . (c[codes] * s) + s * r * (q @ G^T) . z, the query
    turned once into the codebook's basis and once into the sketch's, equals q . the key the format decodes."""
    torch.manual_seed(1)
    fmt = parse_kv("tq_prod3").k
    x = torch.randn(1, 1, 6, 64)
    side = side_of(fmt.quantize(x))
    assert side.bits == 2 and side.qjl is not None and side.data.shape[-1] == 64 * 2 // 8 + 64 // 8
    q = torch.randn(64, dtype=torch.float64)
    norms = side.scale[0, 0].double()  # [6, 2]: s, r
    codes = decode_elements(side)[0, 0] * norms[:, :1]  # c[codes] * s
    signs = ((side.data[0, 0, :, 16:].long().unsqueeze(-1) >> torch.arange(8)) & 1).flatten(-2) * 2 - 1
    scores = codes @ (side.rotation.double() @ q) + norms[:, 0] * norms[:, 1] * (signs.double() @ (side.qjl.double() @ q))
    want = fmt.dequantize(fmt.quantize(x))[0, 0].double() @ q
    assert torch.allclose(scores, want, rtol=1e-5, atol=1e-5)


def test_the_query_takes_the_rotation_the_cache_does_not():
    """score = (q @ R^T) . stored: attention over the stored (rotated) codes with a rotated query equals attention
    over the un-rotated keys."""
    torch.manual_seed(0)
    kv = parse_kv("vllm:turboquant_4bit_nc")
    k, v = torch.randn(1, 1, 7, 64), torch.randn(1, 1, 7, 64)
    ks, vs = side_of(kv.k.quantize(k)), side_of(kv.v.quantize(v))
    q = torch.randn(1, 2, 64, dtype=torch.float64)
    out = decode_attention_reference(q, ks, vs, 7)
    keys = dequantize_side(ks, 7)  # un-rotated, [1, 1, 7, 64]
    stored = keys @ ks.rotation.double().T  # back in the rotated domain
    scores = (q @ ks.rotation.double().T) @ stored[0, 0].T / 8.0
    want = torch.softmax(scores, -1) @ dequantize_side(vs, 7)[0, 0]
    assert torch.allclose(out[0], want, atol=1e-9)
