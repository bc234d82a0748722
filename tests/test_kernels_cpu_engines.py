"""The fused CPU decode and one-call step over the engines' stores: vLLM's per-token-head, NVFP4 and TurboQuant
caches and the paper's TQ-mse and TQ-prod (kernels/packed.py's codebook elements, 3- and 1-bit packing, the "nc"
norm correction, the zero point in the scale's low bits, TQ-prod's sign sketch, the query rotated instead of the
cache).

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
    "vllm:turboquant_k8v4", "tq_mse1", "tq_mse2", "tq_mse3", "tq_mse4", "tq_prod2", "tq_prod3", "tq_prod4",
    "vllm:ultraquant_4bit",  # no CPU packer (quantized by its encode), read by the e2m1 branch with E8M0 scales
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


# ------------------------------------------------------------------------------------------ the one-call step

STEP_SPECS = ENGINE_SPECS[:9]  # vLLM's stores; the paper's TQ-mse and TQ-prod have no CPU packer: two calls


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("spec", STEP_SPECS)
def test_step_stores_the_formats_bytes_and_attends_like_the_reference(spec, dtype):
    """History packed by quant_pack_cpu, then one step: every stored byte equals fmt.quantize's, the output the
    reference's."""
    from kernels.cpu import step as cpu_step
    from kernels.cpu.pack import quant_pack_cpu

    kv = parse_kv(spec)
    b, hkv, hq, d, n = 2, 2, 6, 64, 40
    g = torch.Generator().manual_seed(3)
    spread = torch.exp(torch.randn(2, b, hkv, n + 1, 1, generator=g))  # token norms over a wide range
    k, v = (torch.randn(2, b, hkv, n + 1, d, generator=g) * spread).to(dtype)
    k[0, 0, n, :] = torch.arange(d) % 16  # the new token: ties on the codes' and scales' rounding
    q = torch.randn(b, hq, d, generator=g)
    bufs, wants = {}, {}
    for name, fmt, x in (("k", kv.k, k), ("v", kv.v, v)):
        assert cpu_step.fuses(fmt, d), f"{spec} {name}: no one-call step"
        want = wants[name] = fmt.quantize(x)  # the whole history, the new token included
        bufs[name] = tuple(None if a is None or a.dim() < 4 else
                           torch.full((b, hkv, n + 4, a.shape[-1] * a.element_size()), 7, dtype=torch.uint8).view(a.dtype)
                           for a in (want.data, want.scale, want.zero))
        quant_pack_cpu(fmt, x[:, :, :n], *bufs[name], pos=0, tensor_scale=want.tensor_scale)
    step = cpu_step.DecodeStep(kv.k, kv.v)
    step.bind(bufs["k"], bufs["v"], wants["k"].tensor_scale, wants["v"].tensor_scale, hq)
    out, _, _ = step.run(k[:, :, n:], v[:, :, n:], q[:, :, None], 0, n)  # q [B, Hq, 1, D] -> out [B, 1, Hq, D]
    for name in ("k", "v"):
        for buf, field in zip(bufs[name], (wants[name].data, wants[name].scale, wants[name].zero)):
            if buf is not None:
                assert torch.equal(buf[:, :, : n + 1].view(torch.uint8), field.contiguous().view(torch.uint8)), (
                    f"{spec} {name}: stored bytes differ from kvviz.formats")
                assert bool((buf[:, :, n + 1:].view(torch.uint8) == 7).all()), f"{spec}: wrote past the token"
    sides = [side_from_format(fmt, *bufs[name], wants[name].tensor_scale, head_dim=d, n_packed=n + 1)
             for name, fmt in (("k", kv.k), ("v", kv.v))]
    assert rel_err(out[:, 0], decode_attention_reference(q, *sides, n + 1)) <= TOL, spec


@pytest.mark.parametrize("spec", ("vllm:turboquant_4bit_nc", "vllm:int4_per_token_head"))
def test_a_tiny_model_generates_through_the_one_call_step_as_the_reference(spec):
    """Greedy tokens through the cpu backend's fused step (one call per quantized layer and step) equal the torch
    reference's. Six layers, head_dim 32: TurboQuant keeps the first and last two in 16 bits."""
    from transformers import AutoModelForCausalLM

    import kvviz
    from kernels.cpu import step as cpu_step
    from kvviz.formats import engine_skip_layers
    from test_kernels_cpu_step import _generate

    config = kvviz.tiny_model("llama")[0].config
    config.head_dim, config.num_hidden_layers = 32, 6
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=kvviz.attention.ATTN_NAME).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 256, (2, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    steps = 6
    kv = parse_kv(spec)
    assert cpu_step.fuses(kv.k, 32) and cpu_step.fuses(kv.v, 32)
    quantized = 6 - len(engine_skip_layers(kv, 6))
    fused = _generate(model, ids, mask, spec, "cpu", True, steps)
    reference = _generate(model, ids, mask, spec, "torch", True, steps)
    assert fused[1] == (steps - 1) * quantized > 0, "one fused call per quantized layer and step"
    assert torch.equal(fused[0], reference[0]), f"{spec}: greedy tokens differ from the torch reference"
    assert fused[2] == reference[2], f"{spec}: nbytes differ"


@pytest.mark.parametrize("spec", ("tq_mse3", "tq_prod3"))
def test_tq_mse_and_prod_decode_fused_after_the_formats_quantize(spec, monkeypatch):
    """The paper's TQ-mse and TQ-prod have no CPU packer: their tokens are stored by the format's quantize and
    decode runs in the fused CPU kernel (two calls; TQ-prod's sketch in its own basis), with the torch reference's
    greedy tokens."""
    from test_kernels_cpu_step import _generate
    from test_kernels_e2e import _model

    calls = []
    fused = cpu.decode_attention_cpu

    def counted(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(cpu, "decode_attention_cpu", counted)
    model = _model(32)[0]
    ids = torch.randint(1, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    got = _generate(model, ids, mask, spec, "cpu", True, 4)
    assert len(calls) == 3 * model.config.num_hidden_layers and got[1] == 0, "two calls, the decode fused"
    calls.clear()
    assert torch.equal(got[0], _generate(model, ids, mask, spec, "torch", True, 4)[0]) and not calls


@pytest.mark.parametrize("head_dim", (96,))
def test_int4_per_token_head_decodes_at_a_head_dim_that_is_not_a_power_of_two(head_dim):
    """vLLM rotates blocks of the largest power of two dividing head_dim (96: three of 32): the fused decode reads
    the block-diagonal rotation as it reads the full one."""
    test_engine_stores_decode_like_the_reference("vllm:int4_per_token_head", head_dim)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_int4_packer_rotates_blocks_at_a_head_dim_that_is_not_a_power_of_two(dtype):
    """The numba store (pack_engines.engine_pack_rows, called directly: quant_pack_cpu takes engines' stores at
    power-of-two head_dims only) rotates each block of 32 at head_dim 96 as formats.vllm does: the same bytes."""
    from kernels.cpu.jit import pack_engines
    from kernels.cpu.pack import DTYPE_CODES

    fmt = parse_kv("vllm:int4_per_token_head").k
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 2, 6, 96, generator=g) * torch.exp(torch.randn(2, 2, 6, 1, generator=g))).to(dtype)
    x[0, 0, 0] = torch.arange(96) % 16  # ties on the codes' rounding
    want = fmt.quantize(x)
    data, scale = torch.zeros_like(want.data), torch.zeros_like(want.scale)
    pack_engines.engine_pack_rows(x.float().numpy(), data.numpy(), scale.view(torch.uint8).numpy(),
                                  torch.zeros(1, 1, 1, 1, dtype=torch.uint8).numpy(), pack_engines.EN_INT4, 4, 0,
                                  fmt.pack_table(96).numpy(), DTYPE_CODES[dtype])
    assert torch.equal(data, want.data)
    assert torch.equal(scale.view(torch.int32), want.scale.view(torch.int32))
