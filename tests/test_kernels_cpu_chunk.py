"""The fused CPU chunk attention (kernels/cpu/chunk.py) against a float64 reference, and the "cpu" backend's chunked
passes through QuantizedKVCache against the torch reference.

Kernel: a chunk of queries at the last Tq positions of the tokens each packed side holds, causal bottom-right, for
int4, int8, a K8/V4 pair, fp8_e4m3, mxfp4, nvfp4, KIVI's channel-scaled int2 K with its partial group in the tail,
llama.cpp's q8_0 and q4_0, a Hadamard-rotated int4; GQA 1 and 3; lengths off the 64-token block and the tile; tiles
and query blocks small enough that several of each run (skipped, whole and masked ones). Then transformers-style
masks (a sliding window, left padding), skipped leading tokens, sinks, softcapping, the fallback for TQ-prod.
Model: a tiny Llama (and Gemma 3, with sliding layers) run chunk by chunk, teacher-forced, through
QuantizedKVCache: the cpu backend's logits agree with the torch reference's, and the chunk path is what ran.

    python -m pytest tests/test_kernels_cpu_chunk.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

import kvviz
import kvviz.formats as F
from kernels.cpu import chunk as cpu_chunk
from kernels.cpu import decode as cpu
from kernels.reference import dequantize_side
from kvviz.attention import use_backend
from kvviz.tiny import tiny_config
from test_kernels import kv_data, make_side, rel_err

pytestmark = pytest.mark.skipif(not cpu.cpu_usable(), reason="numba is not installed: the CPU path is the reference")

TOL = 1e-4  # fp32 compute against float64: relative error max |out - ref| / max |ref|


def reference(q, k, v, length, mask=None, start=0, sinks=None, softcap=None):
    """float64: both sides dequantized (kernels/reference.py), GQA by repetition, mask [B or 1, 1, Tq, visible]
    (None: causal bottom-right), sinks as an extra softmax column, dropped."""
    b, hq, tq, d = q.shape
    kx = dequantize_side(k, length)[:, :, start:]
    vx = dequantize_side(v, length)[:, :, start:]
    g = hq // kx.shape[1]
    kx, vx = kx.repeat_interleave(g, 1), vx.repeat_interleave(g, 1)
    s = q.double() @ kx.transpose(-1, -2) / math.sqrt(d)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    cols = kx.shape[2]
    if mask is None:
        mask = (torch.arange(cols)[None, :] <= torch.arange(cols - tq, cols)[:, None])[None, None]
    s = s.masked_fill(~mask, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.double().reshape(1, hq, 1, 1).expand(b, hq, tq, 1)], -1)
    p = torch.softmax(s, -1)[..., :cols].nan_to_num(0.0)
    return p @ vx


def sides(k_spec, v_spec, length, head_dim=32, kv_heads=2):
    """K and V quantized as a cache holds them (channel formats: whole groups packed, the rest in the tail)."""
    kx, vx = kv_data(length, head_dim, kv_heads)

    def side(spec, x):
        fmt = F.get_format(spec)
        return make_side(fmt, x, (length // fmt.group) * fmt.group if fmt.granularity == "channel" else None)

    return side(k_spec, kx), side(v_spec, vx)


def queries(hq, tq, head_dim, seed=1):
    return torch.randn(2, hq, tq, head_dim, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("k_spec, v_spec, head_dim", (
    ("int4", "int4", 32), ("int8", "int8", 32), ("int8", "int4", 32), ("fp8_e4m3", "fp8_e4m3", 32),
    ("mxfp4", "mxfp4", 32), ("nvfp4", "nvfp4", 32), ("int2/channel/g32/asym", "int2/g32/asym", 32),
    ("q8_0", "q8_0", 64), ("q4_0", "q4_0", 64), ("int4/rot", "int4/rot", 32),
))
@pytest.mark.parametrize("gqa", (1, 3))
def test_formats_match_the_reference(k_spec, v_spec, head_dim, gqa):
    """Several tiles (64 tokens) and query blocks (16 rows): whole, masked and skipped pairs all run; 301 tokens
    leave a ragged last tile and a ragged block of 64 rows; a 40-token chunk crosses a tile boundary."""
    length, tq = 301, 40
    k, v = sides(k_spec, v_spec, length, head_dim)
    q = queries(2 * gqa, tq, head_dim)
    out = cpu_chunk.chunk_attention_cpu(q, k, v, length, tile=64, rows=16)
    assert out.shape == (2, 2 * gqa, tq, v.head_dim) and out.dtype == q.dtype
    assert rel_err(out, reference(q, k, v, length)) <= TOL


@pytest.mark.parametrize("tile, rows", ((64, 3), (128, 1000), (512, 64)))
def test_tiles_and_blocks_give_one_answer(tile, rows):
    """The tiling is an implementation choice: any tile and block size gives the reference's answer."""
    length, tq = 200, 70
    k, v = sides("int4", "int4", length)
    q = queries(6, tq, 32)
    assert rel_err(cpu_chunk.chunk_attention_cpu(q, k, v, length, tile=tile, rows=rows),
                   reference(q, k, v, length)) <= TOL


def test_window_padding_and_skipped_tokens():
    """transformers' mask [B, 1, Tq, visible]: row 0 a sliding window of 50 tokens (whole tiles before it are never
    read), row 1 left-padded by 30 tokens; 7 leading stored tokens skipped (a QTensor's skip). An additive float
    mask reads the same."""
    length, tq, start = 260, 24, 7
    cols = length - start
    k, v = sides("int8", "int4", length)
    q = queries(6, tq, 32)
    pos = torch.arange(cols - tq, cols)[:, None]
    col = torch.arange(cols)[None, :]
    causal = col <= pos
    mask = torch.stack([causal & (col > pos - 50), causal & (col >= 30)])[:, None]  # [2, 1, Tq, cols]
    ref = reference(q, k, v, length, mask=mask, start=start)
    out = cpu_chunk.chunk_attention_cpu(q, k, v, length, mask=mask, start=start, tile=64, rows=12)
    assert rel_err(out, ref) <= TOL
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    out = cpu_chunk.chunk_attention_cpu(q, k, v, length, mask=additive, start=start, tile=64, rows=12)
    assert rel_err(out, ref) <= TOL


def test_sinks_softcap_and_half_queries():
    length, tq = 150, 33
    k, v = sides("nvfp4", "int4", length)
    q = queries(6, tq, 32)
    sinks = torch.linspace(-1.0, 2.0, 6)
    ref = reference(q, k, v, length, sinks=sinks, softcap=5.0)
    out = cpu_chunk.chunk_attention_cpu(q, k, v, length, sinks=sinks, softcap=5.0, tile=64, rows=20)
    assert rel_err(out, ref) <= TOL
    half = cpu_chunk.chunk_attention_cpu(q.bfloat16(), k, v, length, sinks=sinks, softcap=5.0)
    assert half.dtype == torch.bfloat16 and rel_err(half.float(), ref) <= 1e-2


def test_a_side_without_a_chunk_branch_takes_the_reference(monkeypatch):
    """TQ-prod's sketch (a second basis per row) has no chunk branch: `reads` says no, and the answer is the
    float64 reference's, never numba's."""
    k, v = sides("int4", "int4", 90)
    monkeypatch.setattr(cpu_chunk, "reads", lambda side: False)
    monkeypatch.setattr(cpu_chunk.meta, "side_args", lambda *a: pytest.fail("the numba path ran"))
    q = queries(4, 10, 32)
    assert rel_err(cpu_chunk.chunk_attention_cpu(q, k, v, 90), reference(q, k, v, 90)) <= 1e-6


def test_a_chunk_longer_than_the_sides_is_refused():
    k, v = sides("int4", "int4", 20)
    with pytest.raises(ValueError, match="visible tokens"):
        cpu_chunk.chunk_attention_cpu(queries(4, 21, 32), k, v, 20)


def _chunked_logits(model, ids, spec, backend, chunk):
    cache = kvviz.QuantizedKVCache(model.config, spec)
    with use_backend(backend), torch.no_grad():
        return torch.cat([model(input_ids=ids[:, i:i + chunk], past_key_values=cache).logits
                          for i in range(0, ids.shape[1], chunk)], 1)


@pytest.mark.parametrize("arch, specs", (("llama", ("int4", "kivi2", "k8v4", "mxfp4")), ("gemma3", ("int4", "nvfp4"))))
def test_chunked_teacher_forcing_matches_the_reference(arch, specs, monkeypatch):
    """A 90-token text in chunks of 16 (Gemma 3's sliding layers: windows of 8) through QuantizedKVCache: the cpu
    backend (the chunk path, every chunk after the first, every layer) gives the torch reference's logits up to float
    rounding (which can move a quantized code of a later layer: the bound is loose, the kernel tests above are not)."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, head_dim=32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="kvviz").eval()
    ids = torch.randint(1, 256, (1, 90), generator=torch.Generator().manual_seed(0))
    calls = []
    real = cpu_chunk.chunk_attention_cpu
    monkeypatch.setattr(cpu_chunk, "chunk_attention_cpu", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    for spec in specs:
        calls.clear()
        fused = _chunked_logits(model, ids, spec, "cpu", 16)
        assert len(calls) == 5 * config.num_hidden_layers, f"{spec}: the chunk path ran {len(calls)} times"
        ref = _chunked_logits(model, ids, spec, "torch", 16)
        assert rel_err(fused, ref.double()) <= 1e-3, spec
