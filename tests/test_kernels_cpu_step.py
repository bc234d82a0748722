"""The one-call CPU decode step (kernels/cpu/step.py: append the new token and attend, one numba call per layer).

Unit: a step writes the token's bytes exactly as kvviz.formats quantizes it (codes, scales, zero points; the
history rows untouched) and attends like the float64 reference within the kernels' 1e-3, with GQA, masks, sinks
and softcapping, on the calling thread and on numba's pool. End to end: a tiny Llama (left-padded batch) generates
the same greedy tokens through the fused step as through the torch reference, stores the very bytes of the
two-call path and counts the same nbytes; with a sliding window (Mistral), sinks (gpt-oss) and softcapping
(Gemma 2) too. A staged token the attention function never took is stored once by the next read of the cache.

    python -m pytest tests/test_kernels_cpu_step.py -q
"""

from __future__ import annotations

import pytest
import torch

import kvviz
import kvviz.formats as F
from kernels.cpu import step as cpu_step
from kernels.cpu.pack import quant_pack_cpu
from kernels.packed import side_from_format
from kernels.reference import decode_attention_reference
from kvviz.cache.layers import QuantizedKVLayer
from test_kernels import TOL, rel_err
from test_kernels_e2e import _model

pytestmark = pytest.mark.skipif(not cpu_step.step_usable(), reason="numba is not installed: no fused step")

SPECS = ("int4", "int8/asym", "int4/g16/asym", "fp8_e4m3/token", "fp8_e4m3", "int4/head", "mxfp4", "nvfp4",
         "int4/rot", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q4_0/rot")

ON_THE_POOL = ("int4", "fp8_e4m3", "mxfp4", "q4_0", "q5_1")  # the rest run on the calling thread


def _buffers(fmt, q: F.QTensor, cap: int):
    """Empty buffers [B, H, cap, n] shaped like q's fields (None where q has none)."""
    def one(a):
        if a is None or a.dim() < 4:
            return None
        return torch.full((*a.shape[:2], cap, a.shape[-1] * a.element_size()), 7, dtype=torch.uint8).view(a.dtype)

    return one(q.data), one(q.scale), one(q.zero)


@pytest.mark.parametrize("spec", SPECS)
def test_step_stores_the_formats_bytes_and_attends_like_the_reference(spec):
    """History of 70 tokens packed, then one step: row 70 equals fmt.quantize's, the output the reference's."""
    fmt = F.get_format(spec)
    b, hkv, hq, d, n = 2, 2, 6, 64, 70
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(2, b, hkv, n + 1, d, generator=g) * 2
    q = torch.randn(b, hq, d, generator=g)
    want_k, want_v = fmt.quantize(k), fmt.quantize(v)  # the whole history, the new token included
    cap = n + 9
    bufs = {}
    for name, x, want in (("k", k, want_k), ("v", v, want_v)):
        bufs[name] = _buffers(fmt, want, cap)
        quant_pack_cpu(fmt, x[:, :, :n], *bufs[name], pos=0, tensor_scale=want.tensor_scale)
    mask = torch.ones(b, n + 1, dtype=torch.bool)
    mask[1, :5] = False  # left padding of row 1
    sinks, softcap = torch.randn(hq, generator=g), 30.0
    step = cpu_step.DecodeStep(fmt, fmt)
    step.bind(bufs["k"], bufs["v"], want_k.tensor_scale, want_v.tensor_scale, hq)
    out, _, _ = step.run(k[:, :, n:], v[:, :, n:], q[:, :, None], 0, n, kv_mask=mask, sm_scale=0.125, sinks=sinks,
                         softcap=softcap, parallel=spec in ON_THE_POOL)  # q [B, Hq, 1, D] -> out [B, 1, Hq, D]
    for name, want in (("k", want_k), ("v", want_v)):
        for buf, field in zip(bufs[name], (want.data, want.scale, want.zero)):
            if buf is not None:
                assert torch.equal(buf[:, :, : n + 1].view(torch.uint8), field.contiguous().view(torch.uint8)), (
                    f"{spec} {name}: stored bytes differ from kvviz.formats")
                assert bool((buf[:, :, n + 1 :].view(torch.uint8) == 7).all()), f"{spec}: wrote past the token"
    sides = [side_from_format(fmt, *bufs[name], w.tensor_scale, head_dim=d, n_packed=n + 1)
             for name, w in (("k", want_k), ("v", want_v))]
    ref = decode_attention_reference(q, *sides, n + 1, 0.125, mask, sinks=sinks, softcap=softcap)
    assert rel_err(out[:, 0], ref) <= TOL, f"{spec}: step output differs from the float64 reference"


def test_step_takes_q_and_returns_its_output_in_the_attention_function_s_layouts():
    """q [B, Hq, 1, D] in, [B, 1, Hq, D] out in q's dtype. fp32 CPU tensors go to the call as numpy views; tensors
    that require grad take the copying path, to the same output; a q of another shape is refused with the bound one."""
    fmt = F.get_format("int4")
    b, hkv, hq, d, n = 1, 2, 4, 64, 40
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(2, b, hkv, n + 2, d, generator=g)
    q = torch.randn(b, hq, 1, d, generator=g)
    outs = []
    for grad in (False, True):
        bufs = {}
        for name, x in (("k", k), ("v", v)):
            bufs[name] = _buffers(fmt, fmt.quantize(x), n + 4)
            quant_pack_cpu(fmt, x[:, :, :n], *bufs[name], pos=0)
        step = cpu_step.DecodeStep(fmt, fmt)
        step.bind(bufs["k"], bufs["v"], None, None, hq)
        kn, vn, qn = (t.clone().requires_grad_(grad) for t in (k[:, :, n : n + 1], v[:, :, n : n + 1], q))
        outs.append(step.run(kn, vn, qn, 0, n)[0])
        with pytest.raises(ValueError, match=r"bound for \(1, 4, 1, 64\)"):
            step.run(k[:, :, n + 1 :], v[:, :, n + 1 :], q[:, :, 0], 0, n + 1)  # [B, Hq, D]: not a decode query
    assert outs[0].shape == (b, 1, hq, d) and outs[0].dtype == torch.float32
    assert torch.equal(outs[0], outs[1]), "the copying path and the numpy views attend alike"
    half = step.run(k[:, :, n + 1 :].half(), v[:, :, n + 1 :].half(), q.half(), 0, n + 1)[0]
    assert half.shape == (b, 1, hq, d) and half.dtype == torch.float16


def _generate(model, ids, mask, spec, backend, stages, steps):
    """Greedy tokens, the step's call count, nbytes and every side's stored bytes."""
    calls = []
    run = cpu_step.DecodeStep.run

    def counted(self, *args, **kwargs):
        calls.append(1)
        return run(self, *args, **kwargs)

    cpu_step.DecodeStep.run = counted
    try:
        with kvviz.attention.use_backend(backend), torch.no_grad():
            cache = kvviz.QuantizedKVCache(model.config, spec)
            for layer in cache.layers:
                layer.stages = layer.stages and stages
            tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                                    cache=cache)
    finally:
        cpu_step.DecodeStep.run = run
    stored = [buf.view().contiguous().view(torch.uint8) for layer in cache.layers if isinstance(layer, QuantizedKVLayer)
              for side in (layer.k, layer.v) for buf in side.fields.values()]
    return tokens, len(calls), cache.nbytes(), stored


@pytest.mark.parametrize("arch, spec", [("llama", s) for s in ("int4", "k8v4", "mxfp4", "nvfp4", "fp8_e4m3",
                                                                 "k=q8_0,v=q4_0", "k=q5_1,v=iq4_nl", "int4/rot")]
                         + [("mistral", "int4"), ("gpt_oss", "k8v4"), ("gemma2", "int4")])
def test_one_call_generates_as_the_reference_and_stores_the_same_bytes(arch, spec):
    """Greedy tokens equal the torch reference's; bytes and nbytes equal the two-call path's (one call per layer
    and step)."""
    model = _model(32)[0] if arch == "llama" else kvviz.tiny_model(arch)[0]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 256, (2, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    steps = 10
    fused = _generate(model, ids, mask, spec, "cpu", True, steps)
    two_calls = _generate(model, ids, mask, spec, "cpu", False, steps)
    reference = _generate(model, ids, mask, spec, "torch", True, steps)
    layers = model.config.num_hidden_layers
    assert fused[1] == (steps - 1) * layers and two_calls[1] == 0 == reference[1], "one fused call per layer and step"
    assert torch.equal(fused[0], reference[0]), f"{arch} {spec}: greedy tokens differ from the torch reference"
    assert torch.equal(fused[0], two_calls[0]) and fused[2] == two_calls[2] == reference[2]
    assert all(torch.equal(a, b) for a, b in zip(fused[3], two_calls[3], strict=True)), "stored bytes differ"


@pytest.mark.parametrize("beams", [1, 2])
def test_one_call_rebinds_when_the_buffers_grow_or_a_beam_search_reorders_them(beams):
    """A layer keeps its step bound over the buffers between steps: past a doubling (a 60-token prompt decoding
    over 64 rows) and across beam search's reorders (new tensors every step) it binds again, and the beams and
    bytes equal the two-call path's."""
    model, _ = _model(16)
    ids = torch.randint(1, 256, (1, 60), generator=torch.Generator().manual_seed(1))
    got = []
    with kvviz.attention.use_backend("cpu"), torch.no_grad():
        for stage in (True, False):
            cache = kvviz.QuantizedKVCache(model.config, "int4", stage=stage)
            tokens = model.generate(input_ids=ids, max_new_tokens=8, num_beams=beams, do_sample=False,
                                    cache=cache)
            got.append((tokens, [buf.view().contiguous().view(torch.uint8) for layer in cache.layers
                                 for side in (layer.k, layer.v) for buf in side.fields.values()]))
            if stage:
                layer = cache.layers[0]
                assert layer.k.fields["data"].buf.shape[2] == 128 and layer._step is not None, "grew past 64 rows"
    (fused, fused_bytes), (two_calls, two_call_bytes) = got
    assert torch.equal(fused, two_calls), f"{beams} beam(s) through the fused step differ from the two-call path"
    assert all(torch.equal(a, b) for a, b in zip(fused_bytes, two_call_bytes, strict=True)), "stored bytes differ"


def test_a_staged_token_is_stored_once_when_the_cache_is_read_first():
    """update() stages a decode token; reading the cache before attention stores it, once, as update would."""
    model, _ = _model(16)
    ids = torch.randint(1, 256, (1, 9))
    with kvviz.attention.use_backend("cpu"), torch.no_grad():
        cache = kvviz.QuantizedKVCache(model.config, "int4")
        model(input_ids=ids, cache=cache, use_cache=True)
        layer = cache.layers[0]
        before = cache.nbytes()
        k = torch.randn(1, model.config.num_key_value_heads, 1, 16)
        staged, staged_v = layer.update(k, k.clone())
        assert isinstance(staged, kvviz.attention.StagedStep) and isinstance(staged_v, kvviz.attention.StagedStep)
        assert layer.get_seq_length() == 10 and layer.k.n_quantized == 9  # counted, not yet stored
        assert cache.nbytes() > before and layer.k.n_quantized == 10 and layer.k.tokens_quantized == 10
        with pytest.raises(AssertionError, match="attended once"):
            staged.attend(torch.randn(1, 4, 1, 16), None, 0.25, None, None)
        with pytest.raises(AttributeError, match="set_attn_implementation"):
            staged.shape  # noqa: B018 - another attention function reading it as a tensor


def test_a_staged_handle_read_as_a_qtensor_is_the_qtensor_update_would_have_returned():
    """A caller of update() that reads what it returned (static scales, the packed data) gets K's and V's QTensors
    as without staging: the token is stored first, once."""
    model, _ = _model(16)
    ids = torch.randint(1, 256, (1, 9))
    k = torch.randn(1, model.config.num_key_value_heads, 1, 16)
    with kvviz.attention.use_backend("cpu"), torch.no_grad():
        got = []
        for stage in (True, False):
            cache = kvviz.QuantizedKVCache(model.config, "k8v4", stage=stage)
            model(input_ids=ids, cache=cache, use_cache=True)
            got.append(cache.layers[0].update(k, 2 * k))
    (staged_k, staged_v), (qk, qv) = got
    assert isinstance(staged_k, kvviz.attention.StagedStep) and not isinstance(qk, kvviz.attention.StagedStep)
    assert torch.equal(staged_k.data, qk.data) and torch.equal(staged_v.data, qv.data)
    assert torch.equal(staged_k.dequantize(), qk.dequantize()) and torch.equal(staged_v.dequantize(), qv.dequantize())
