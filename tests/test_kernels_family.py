"""A format family the kernels have never seen, read and written through their generic path.

`toy3`: a 3-bit symmetric int with one fp16 scale per token and head, registered in a temporary registry. Its
family states only a layout (elements the kernels already decode: `elem="int"`, 3-bit codes in kvviz's little-endian
stream; the `int_sym` packer loop), so with no kernel change:
- the CPU packer (kernels/cpu/pack.py) writes the bytes the family's own quantize writes;
- the fused CPU decode (kernels/cpu/decode.py) reads them as the float64 reference (dequantize, then attention)
  does, with GQA, a tail and two rows of different lengths;
- the one-call step (kernels/cpu/step.py) appends and attends in one call, its bytes and output the same.

    python -m pytest tests/test_kernels_family.py -q
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import decode as cpu
from kernels.cpu import step as cpu_step
from kernels.cpu.pack import quant_pack_cpu, quant_pack_cpu_supported
from kernels.packed import describes_format, side_from_format, side_of
from kernels.reference import decode_attention_reference
from test_kernels import TOL, rel_err
from toy_family import toy_format

pytestmark = pytest.mark.skipif(not cpu_step.step_usable(), reason="numba is not installed: no fused CPU path")

D = 64


@pytest.fixture
def toy():
    with toy_format() as fmt:
        yield fmt


def _keys(b: int, h: int, t: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, t, D, generator=g)
    x[..., 5] *= 6.0  # an outlier channel, so that scales differ from row to row
    return x


def test_the_toy_is_described_by_its_layout_alone(toy):
    """The kernels know the toy only through its layout: a PackedSide of 3-bit int codes, offset 4, one fp16 scale
    per token; the CPU packer writes it, the Triton packer (8, 4 and 2 bits) does not."""
    assert describes_format(toy) and cpu.supports(toy)
    side = side_of(toy.quantize(_keys(1, 1, 3, 0)))
    assert (side.elem, side.bits, side.offset, side.scale_kind, side.group_size) == ("int", 3, 4, "token", D)
    assert side.data.shape[-1] == D * 3 // 8 and cpu.reads(side)
    assert quant_pack_cpu_supported(toy, D) and cpu_step.fuses(toy, D)
    assert not quant_pack_cpu_supported(toy, 4)  # 3-bit codes pack 8 to a 3-byte word: head_dim a multiple of 8


def test_the_cpu_packer_writes_the_toys_bytes(toy):
    """quant_pack_cpu (the int loop at 3 bits) writes exactly the bytes the toy's quantize writes, at any row."""
    x = _keys(2, 3, 17, 1)
    want = toy.quantize(x)
    data = torch.full((2, 3, 20, D * 3 // 8), 7, dtype=torch.uint8)
    scale = torch.zeros(2, 3, 20, 1, dtype=torch.float16)
    assert quant_pack_cpu(toy, x, data, scale, None, pos=2) == 0
    assert torch.equal(data[:, :, 2:19], want.data) and torch.equal(scale[:, :, 2:19], want.scale)
    assert bool((data[:, :, :2] == 7).all()) and bool((data[:, :, 19:] == 7).all()), "wrote outside its rows"


@pytest.mark.parametrize("parallel", (False, True))
def test_the_fused_cpu_decode_reads_the_toy_as_the_reference(toy, parallel):
    """GQA 3, two rows of 150 and 90 valid tokens (140 packed, a tail of 10): the fused decode against dequantize,
    then attention in float64, within the kernels' tolerance."""
    b, hkv, hq, n, tail = 2, 2, 6, 140, 10
    k, v = _keys(b, hkv, n + tail, 2), _keys(b, hkv, n + tail, 3)
    qk, qv = toy.quantize(k[:, :, :n]), toy.quantize(v[:, :, :n])
    q = torch.randn(b, hq, D, generator=torch.Generator().manual_seed(4))
    lengths = torch.tensor([n + tail, 90])
    sides = [side_from_format(toy, qx.data, qx.scale, None, None, head_dim=D, n_packed=n, tail=x[:, :, n:])
             for qx, x in ((qk, k), (qv, v))]
    out = cpu.decode_attention_cpu(q, *sides, lengths, parallel=parallel)
    # the reference of the issue: the family's own dequantize, then attention in float64
    keys = torch.cat([toy.dequantize(qk), k[:, :, n:]], 2).double().repeat_interleave(hq // hkv, 1)
    values = torch.cat([toy.dequantize(qv), v[:, :, n:]], 2).double().repeat_interleave(hq // hkv, 1)
    want = torch.empty(b, hq, D, dtype=torch.float64)
    for row, length in enumerate(lengths.tolist()):
        p = torch.softmax(keys[row, :, :length] @ q[row].double()[..., None] / D**0.5, dim=1)  # [Hq, L, 1]
        want[row] = (p * values[row, :, :length]).sum(1)
    assert rel_err(out, want) <= TOL, "the fused CPU decode differs from dequantize-then-attention"
    assert rel_err(out, decode_attention_reference(q, *sides, lengths)) <= TOL


def test_the_one_call_step_appends_and_attends_the_toy(toy):
    """A history of 70 tokens packed by the CPU packer, then one step: the new row's bytes are the toy's quantize,
    the output the float64 reference's."""
    b, hkv, hq, n = 2, 2, 4, 70
    k, v = _keys(b, hkv, n + 1, 5), _keys(b, hkv, n + 1, 6)
    q = torch.randn(b, hq, D, generator=torch.Generator().manual_seed(7))
    wants, bufs = {}, {}
    for name, x in (("k", k), ("v", v)):
        wants[name] = toy.quantize(x)
        bufs[name] = (torch.full((b, hkv, n + 5, D * 3 // 8), 7, dtype=torch.uint8),
                      torch.zeros(b, hkv, n + 5, 1, dtype=torch.float16), None)
        quant_pack_cpu(toy, x[:, :, :n], *bufs[name], pos=0)
    step = cpu_step.DecodeStep(toy, toy)
    step.bind(bufs["k"], bufs["v"], None, None, hq)
    out, _, _ = step.run(k[:, :, n:], v[:, :, n:], q[:, :, None], 0, n)  # q [B, Hq, 1, D] -> out [B, 1, Hq, D]
    for name in ("k", "v"):
        data, scale, _ = bufs[name]
        assert torch.equal(data[:, :, : n + 1], wants[name].data) and torch.equal(scale[:, :, : n + 1],
                                                                                wants[name].scale), name
    sides = [side_from_format(toy, *bufs[name][:2], None, None, head_dim=D, n_packed=n + 1) for name in ("k", "v")]
    assert rel_err(out[:, 0], decode_attention_reference(q, *sides, n + 1)) <= TOL
