"""The Triton decode kernel over the engines' KV stores, against the float64 reference, in the CPU interpreter
(TRITON_INTERPRET=1): vLLM's int8 / fp8 / int4 per-token-head, NVFP4 (and 4-over-6) and TurboQuant caches and the
TurboQuant paper's TQ-mse and TQ-prod, as kernels/packed.py describes them (codebooks, 3- and 1-bit codes, the "nc"
norm correction, int4's zero point in its scale's low bits, rotations taken by the query and the output, TQ-prod's
sign sketch in a basis of its own).

Each format decodes K/V from its own `Format.quantize` of random data (an outlier channel in K), in buffers with
spare capacity (so strides include it), two batch rows of different lengths, GQA, most with the last tokens in a
full-precision tail; head_dim 64, three formats at 128. Relative error (max |out - ref| / max |ref|) <= 1e-3, as in
tests/test_kernels.py. A tiny Llama then decodes through kvviz's cache with the triton backend for TQ-mse3 and agrees
with the torch backend.

    python -m pytest tests/test_kernels_engine.py -q
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

if not torch.cuda.is_available():  # tests/conftest.py sets it first; this covers running the file on its own
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import kernels  # noqa: E402
import kvviz  # noqa: E402
from kernels import (  # noqa: E402
    PackedSide,
    decode_attention,
    decode_attention_reference,
    quant_pack_supported,
    side_from_format,
)
from kernels.decode import supports  # noqa: E402
from kvviz import attention  # noqa: E402
from test_kernels_e2e import _arch_logits, _arch_model  # noqa: E402 (tiny models at head_dim 32, one decode step)

pytestmark = pytest.mark.skipif(not kernels.triton_usable(), reason="Triton cannot run here: no CUDA, and "
                                "TRITON_INTERPRET=1 was not set before triton was imported")

TOL = 1e-3  # max |out - ref| / max |ref|, tests/test_kernels.py's bound
PROMPTS = ("The quick brown fox", "Hi")  # the cache test's two left-padded prompts
BATCH, KV_HEADS = 2, 2

# (spec, GQA ratio, length of batch row 0 (row 1: half), splits, head_dim, tail tokens): every format once, each
# meets GQA 1 / 3 / 4, a length inside one block or over three, one or two splits; three at head_dim 128, one at 96.
CASES = (
    ("vllm:int8_per_token_head", 3, 19, 2, 64, 3),
    ("vllm:fp8_per_token_head", 1, 40, 1, 64, 0),
    ("vllm:int4_per_token_head", 4, 19, 2, 128, 3),
    ("vllm:int4_per_token_head", 3, 19, 1, 96, 3),  # 96: vLLM rotates three blocks of 32
    ("vllm:nvfp4", 3, 40, 2, 64, 0),
    ("vllm:nvfp4_4over6", 1, 19, 1, 64, 3),
    ("vllm:turboquant_4bit_nc", 3, 40, 2, 64, 3),
    ("vllm:turboquant_k3v4_nc", 4, 19, 2, 128, 3),
    ("vllm:turboquant_3bit_nc", 1, 40, 1, 64, 0),
    ("vllm:turboquant_k8v4", 3, 19, 2, 64, 3),
    ("tq_mse1", 3, 40, 2, 64, 0),
    ("tq_mse2", 1, 19, 1, 64, 3),
    ("tq_mse3", 4, 19, 2, 64, 3),
    ("tq_mse4", 3, 40, 1, 64, 0),
    ("tq_prod2", 1, 40, 2, 64, 3),
    ("tq_prod3", 3, 19, 1, 64, 0),
    ("tq_prod4", 4, 40, 2, 128, 3),
    ("vllm:ultraquant_4bit", 3, 19, 2, 64, 3),
)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double().cpu() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def packed_side(fmt, x: torch.Tensor, n_packed: int, spare: int = 5) -> PackedSide:
    """x [B, Hkv, T, D]: the first n_packed tokens quantized by the format into buffers with `spare` rows of extra
    capacity (the engines' scales are per token: one scale row per token), the rest a full-precision tail."""
    q = fmt.quantize(x[:, :, :n_packed])

    def in_buffer(a: torch.Tensor | None) -> torch.Tensor | None:
        if a is None or a.dim() < 4:  # absent, or a per-tensor scale
            return a
        buf = torch.zeros(*a.shape[:2], a.shape[2] + spare, *a.shape[3:], dtype=a.dtype)
        buf[:, :, :n_packed] = a
        return buf[:, :, :n_packed]

    tail = x[:, :, n_packed:] if n_packed < x.shape[2] else None
    return side_from_format(fmt, in_buffer(q.data), in_buffer(q.scale), in_buffer(q.zero), q.tensor_scale,
                            n_packed=n_packed if tail is not None else None, tail=tail)


@pytest.mark.parametrize("spec,gqa,length,splits,head_dim,tail", CASES, ids=[c[0] for c in CASES])
def test_decode_engine_stores(spec, gqa, length, splits, head_dim, tail):
    kv = kvviz.parse_kv(spec)
    g = torch.Generator().manual_seed(head_dim + length)
    kx = torch.randn(BATCH, KV_HEADS, length, head_dim, generator=g)
    kx[..., 3] *= 8.0  # an outlier channel, as post-RoPE keys have
    vx = torch.randn(BATCH, KV_HEADS, length, head_dim, generator=g)
    k, v = packed_side(kv.k, kx, length - tail), packed_side(kv.v, vx, length - tail)
    q = torch.randn(BATCH, KV_HEADS * gqa, head_dim, generator=g)
    lengths = torch.tensor([length, (length + 1) // 2])
    out = decode_attention(q, k, v, lengths, num_splits=splits, block_n=16)
    assert out.shape == q.shape and out.dtype == q.dtype
    err = rel_err(out, decode_attention_reference(q, k, v, lengths))
    assert err <= TOL, f"{spec}: relative error {err:.2e}"


ENGINE_FAMILIES = ("vllm", "turboquant", "tq", "ultraquant")  # the engines' own stores (not vllm:auto's casts)


def test_the_decode_reads_the_engines_stores_and_the_packer_leaves_them():
    """The attention function sends every engine store to the Triton kernel; the Triton packer claims none of them
    (the cache quantizes them through the formats)."""
    for spec, *_ in CASES:
        kv = kvviz.parse_kv(spec)
        for fmt in (kv.k, kv.v):
            assert supports(fmt) and attention._fused_reads(SimpleNamespace(fmt=fmt)), f"{spec}: {fmt.spec}"
            if fmt.kind in ENGINE_FAMILIES:
                assert not quant_pack_supported(fmt, 64), f"{spec}: {fmt.spec}"


# ------------------------------------------------------------------------------------------ through the cache

@pytest.mark.parametrize("spec", ("tq_mse3", "tq_prod3"))
def test_a_cache_of_engine_stores_decodes_fused(spec, monkeypatch):
    """TQ-mse3 (3-bit codebook, a rotation) and TQ-prod3 (2-bit codebook and a sign sketch) in kvviz's cache, their
    sides (capacity strides, the codebook kept in their memo) read by the kernel: the triton backend's logits equal
    the torch backend's, and every layer's decode step took the kernel. (vLLM's TurboQuant keeps a model's first and
    last 2 layers at vllm:auto: the tiny Llama has 2.)"""
    attention._probe.cache_clear()
    model, tok = _arch_model("llama")  # head_dim 32: TQ-mse's rotation and codebook at a size worth testing
    fused, formats = attention._triton_decode, []
    monkeypatch.setattr(attention, "_triton_decode", lambda module, q, k, v, *a, **kw: formats.append(k.fmt.kind) or
                        fused(module, q, k, v, *a, **kw))
    with torch.no_grad():
        ref = _arch_logits(model, tok, spec, "torch", monkeypatch, prompts=PROMPTS)
        got = _arch_logits(model, tok, spec, "triton", monkeypatch, prompts=PROMPTS)
    attention._probe.cache_clear()
    assert len(formats) == model.config.num_hidden_layers, "every layer's decode step takes the fused kernel"
    assert set(formats) == {"tq"}
    err = rel_err(got, ref.double())
    assert torch.isfinite(got).all() and err <= TOL, f"{spec}: triton and torch logits differ by {err:.2e}"
