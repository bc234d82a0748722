"""Tests for kvviz.cache.QuantizedKVCache on tiny random-weight models and synthetic K/V.

Lossless specs ("fp16" on a float16 model, "bf16" on a bfloat16 one) must give DynamicCache's greedy tokens
exactly; lossy ones must hold exactly the bytes kvviz.kv_cache_bytes predicts, quantize each token once, and
survive batch > 1 with padding, GQA, beam search, reset and crop.

Building a tiny model costs more than a short generation, so each (arch, dtype) is built once per module (`_model`);
tests leave the shared models as they found them. Configs alone come from `tiny_config` (no weights).

    python -m pytest tests/test_cache.py -q
"""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import DynamicCache

import kvviz
from kvviz.cache import QuantizedKVCache, QuantizedKVLayer
from kvviz.attention import StagedStep
from kvviz.formats import QTensor
from kvviz.tiny import TINY_ARCHS, TINY_WINDOW, tiny_config, tiny_model

PROMPTS = ["hello world, this is kvviz", "hi"]  # different lengths: the short one is left-padded
ARCH_PROMPTS = ["twelve bytes", "short"]  # 12 tokens: longer than the tiny windows (8), so the prefill already cuts
ARCH_NEW = 4  # decode steps, each reading a window that has cut (15 tokens seen in the end)
TINY_KIVI = "k=int2/channel/g16/asym,v=int2/token/g16/asym"  # kivi2 with groups that fit head_dim 16
LOSSY = ["k8v4", "int4", "fp8", "fp8_e5m2/token", "int8/head", "nvfp4", "int4/rot", TINY_KIVI]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@functools.lru_cache(maxsize=None)
def _model(arch: str = "llama", dtype: torch.dtype = torch.float32):
    """tiny_model(arch, dtype=dtype), built once for the module: (model, tokenizer). Do not change it for good."""
    return tiny_model(arch, dtype=dtype)


def _generate(model, tok, cache, n=8, **kwargs):
    return model.generate(**tok(PROMPTS), max_new_tokens=n, do_sample=False, cache=cache, **kwargs)


# ------------------------------------------------------------------------------------------ exactness

# Where the "kvviz" attention function does more than SDPA on plain tensors (softcapping, sinks, the chunked mask,
# layers of different head dims, MLA's expanded K/V): its tokens are also checked against transformers' eager
# attention. On the others, plain tensors take SDPA exactly (test_attention.py), so DynamicCache's run suffices.
EAGER_ARCHS = ("gemma2", "gpt_oss", "llama4", "gemma4", "deepseek_v3")
# bf16: one architecture of each layer kind (the cast path is the same code on all of them)
BF16_ARCHS = ("llama", "mistral", "qwen2", "llama4", "qwen3_next", "falcon_h1", "gemma4", "deepseek_v3")
LOSSLESS = [(arch, torch.float16, "fp16") for arch in TINY_ARCHS] + [(a, torch.bfloat16, "bf16") for a in BF16_ARCHS]


@pytest.mark.parametrize("arch,dtype,spec", LOSSLESS)
def test_lossless_spec_matches_dynamic_cache_exactly(arch, dtype, spec):
    """fp16 / bf16 casts store the model's own dtype bit for bit: greedy tokens must equal DynamicCache's, on
    every architecture, with windows (8) and chunks shorter than the prompt (12) so that they really cut."""
    model, tok = _model(arch, dtype)
    enc = tok(ARCH_PROMPTS)
    want = model.generate(**enc, max_new_tokens=ARCH_NEW, do_sample=False, cache=DynamicCache(config=model.config))
    cache = QuantizedKVCache(model.config, spec)
    got = model.generate(**enc, max_new_tokens=ARCH_NEW, do_sample=False, cache=cache)
    assert torch.equal(got, want)
    assert cache.get_seq_length() == want.shape[1] - 1  # the last token is sampled, never fed back
    if dtype == torch.float16 and arch in EAGER_ARCHS:  # the kvviz attention agrees with transformers' eager one
        model.set_attn_implementation("eager")
        try:
            ref = model.generate(**enc, max_new_tokens=ARCH_NEW, do_sample=False,
                                 cache=DynamicCache(config=model.config))
        finally:
            model.set_attn_implementation("kvviz")
        assert torch.equal(got, ref)


def test_lossless_beam_search_matches_dynamic_cache():
    model, tok = _model("llama", torch.float16)
    want = _generate(model, tok, DynamicCache(config=model.config), n=8, num_beams=3)
    got = _generate(model, tok, QuantizedKVCache(model.config, "fp16"), n=8, num_beams=3)
    assert torch.equal(got, want)


def test_teacher_forced_chunk_against_a_cache_matches_dynamic_cache():
    """q_len > 1 over an existing cache (teacher forcing) uses the bottom-right causal mask."""
    model, tok = _model("qwen2", torch.float16)
    ids = tok(["a longer prompt for kvviz"])["input_ids"]
    logits = []
    for cache in (DynamicCache(config=model.config), QuantizedKVCache(model.config, "fp16")):
        with torch.no_grad():
            model(input_ids=ids[:, :10], cache=cache, use_cache=True)
            logits.append(model(input_ids=ids[:, 10:], cache=cache, use_cache=True).logits)
    assert torch.equal(logits[0], logits[1])


@pytest.mark.parametrize("spec", LOSSY)
def test_lossy_specs_generate_with_batch_and_padding(spec):
    model, tok = _model("mistral")
    cache = QuantizedKVCache(model.config, spec)
    out = _generate(model, tok, cache, n=6)
    assert out.shape == (2, len(PROMPTS[0]) + 6)
    # a handle, never tensors: QTensors, or on the cpu backend the staged token of the one-call step
    assert isinstance(cache.layers[0].update(*([torch.zeros(2, 2, 1, 16)] * 2))[0], (QTensor, StagedStep))
    assert isinstance(cache.layers[0].update(*([torch.zeros(2, 2, 2, 16)] * 2))[0], QTensor)


# ------------------------------------------------------------------------------------------ bytes

@pytest.mark.parametrize("spec", LOSSY + ["fp16", "fp4_mx_block16", "int8/tensor", "k=int4/channel/g16,v=int8"])
@pytest.mark.parametrize("batch,tokens", [(1, 37), (3, 16)])
def test_nbytes_equals_the_memory_model(spec, batch, tokens):
    """Synthetic fp16 K/V through every layer: the bytes held equal kv_cache_bytes for the same shape."""
    cache = QuantizedKVCache(tiny_config("llama"), spec)
    x = torch.randn(batch, 2, tokens, 16, dtype=torch.float16)
    for layer in range(2):
        cache.update(x[:, :, :-5], x[:, :, :-5], layer)
        for t in range(tokens - 5, tokens):
            cache.update(x[:, :, t : t + 1], x[:, :, t : t + 1], layer)
    want = kvviz.kv_cache_bytes(2, 2, 16, tokens, batch, k=spec)
    assert cache.nbytes() == want


@pytest.mark.parametrize("spec,residual", [(TINY_KIVI, 16), ("int4", 8), ("k=int8,v=int2/channel/g8/asym", 5)])
@pytest.mark.parametrize("tokens", [3, 29, 64])
def test_nbytes_with_a_residual_window_equals_the_memory_model(spec, residual, tokens):
    cache = QuantizedKVCache(tiny_config("llama"), spec, residual=residual)
    x = torch.randn(1, 2, tokens, 16, dtype=torch.float16)
    for layer in range(2):
        cache.update(x[:, :, :1], x[:, :, :1], layer)
        for t in range(1, tokens):
            cache.update(x[:, :, t : t + 1], x[:, :, t : t + 1], layer)
    assert cache.nbytes() == kvviz.kv_cache_bytes(2, 2, 16, tokens, 1, k=spec, residual=residual)


def test_nbytes_counts_the_residual_window():
    fmt = kvviz.get_format("int4")
    layer = QuantizedKVLayer(fmt, fmt, residual=8)
    x = torch.randn(1, 2, 30, 64, dtype=torch.float16)
    layer.update(x, x)
    assert layer.k.n_quantized == 22 and layer.k.tail.shape[2] == 8
    assert layer.nbytes() == 2 * (fmt.nbytes_for((1, 2, 22, 64)) + 2 * 8 * 64 * 2)


# ------------------------------------------------------------------------------------------ quantize once

@pytest.mark.parametrize("spec,residual", [("int8", 0), ("int4/asym", 4), ("fp8", 0), ("nvfp4", 0),
                                           ("int4/channel/g32/asym", 0), ("int2/channel/g32/asym", 32)])
def test_each_token_is_quantized_once(spec, residual):
    fmt = kvviz.get_format(spec)
    layer = QuantizedKVLayer(fmt, fmt, residual=residual)
    x = torch.randn(2, 3, 200, 64)
    layer.update(x[:, :, :50], x[:, :, :50])
    history = layer.k.packed().data.clone()
    for t in range(50, 200):
        layer.update(x[:, :, t : t + 1], x[:, :, t : t + 1])
    packed = layer.k.packed()
    assert layer.k.tokens_quantized == packed.n_quantized  # no token went through quantize twice
    assert torch.equal(packed.data[:, :, : history.shape[2]], history)  # history never rewritten
    assert packed.seq_len == 200
    # quantizing as it arrived == quantizing all at once (per-token formats, from the prefill's static scale)
    if fmt.granularity == "token" and fmt.base != "nvfp4" and residual == 0:
        want = fmt.roundtrip(x)
        assert torch.equal(packed.dequantize(), want)


def test_buffers_grow_by_doubling_and_handles_are_views():
    fmt = kvviz.get_format("int8")
    layer = QuantizedKVLayer(fmt, fmt)
    x = torch.randn(1, 2, 300, 64)
    layer.update(x[:, :, :1], x[:, :, :1])
    capacities = set()
    for t in range(1, 300):
        layer.update(x[:, :, t : t + 1], x[:, :, t : t + 1])
        capacities.add(layer.k.fields["data"].buf.shape[2])
    assert capacities == {64, 128, 256, 512}
    packed = layer.k.packed()
    assert packed.data.data_ptr() == layer.k.fields["data"].buf.data_ptr()  # in place, no copy


def test_static_scales_from_the_prefill_then_fixed():
    fmt = kvviz.get_format("fp8")
    layer = QuantizedKVLayer(fmt, fmt)
    x = torch.randn(1, 2, 20, 64)
    layer.update(x[:, :, :10], x[:, :, :10])
    scale = layer.k.static.clone()
    assert torch.allclose(scale, x[:, :, :10].abs().amax() / 448.0)  # transformers' fp8 cache rule
    layer.update(10 * x[:, :, 10:], 10 * x[:, :, 10:])  # louder tokens saturate, the scale stays
    assert torch.equal(layer.k.static, scale)


def test_given_scales_are_used():
    cache = QuantizedKVCache(tiny_config("llama"), "fp8", scales={0: (0.5, 0.25), "1": (1.0, 1.0)})
    x = torch.randn(1, 2, 4, 16)
    cache.update(x, x, 0)
    assert float(cache.layers[0].k.static) == 0.5 and float(cache.layers[0].v.static) == 0.25


# ------------------------------------------------------------------------------------------ cache API

def test_seq_length_reset_mask_sizes_and_crop():
    model, tok = _model("llama")
    cache = QuantizedKVCache(model.config, "k8v4", residual=4)
    _generate(model, tok, cache, n=5)
    n = len(PROMPTS[0]) + 4
    assert cache.get_seq_length() == n and cache.get_mask_sizes(1, 0) == (n + 1, 0)
    cache.crop(-2)
    assert cache.get_seq_length() == n - 2
    cache.crop(-10)  # into the quantized part: per-token formats just drop rows
    assert cache.get_seq_length() == n - 12
    cache.reset()
    assert cache.get_seq_length() == 0 and cache.nbytes() == 0
    _generate(model, tok, cache, n=3)  # reusable after reset
    assert cache.get_seq_length() == len(PROMPTS[0]) + 2


def test_reorder_cache_moves_rows():
    fmt = kvviz.get_format("int4/channel/g32/asym")
    layer = QuantizedKVLayer(fmt, fmt, residual=3)
    x = torch.randn(3, 2, 40, 64)
    layer.update(x, x)
    before = layer.k.packed().dequantize()
    layer.reorder_cache(torch.tensor([2, 0, 0]))
    after = layer.k.packed().dequantize()
    assert torch.equal(after, before[[2, 0, 0]])


@pytest.mark.parametrize("spec,kwargs,match", [
    ("int3", {}, "int"),
    ("k=int8", {}, "both k= and v="),
    ("kivi2", {}, "head_dim"),  # g32 groups do not fit the tiny model's head_dim 16
    ("int8", {"residual": -1}, "residual"),
    ("int8", {"scales": {0: (1.0, 1.0), 1: (1.0, 1.0)}}, "Static scales"),
    ("fp8", {"scales": {0: (1.0, 1.0)}}, "layer 1"),
    ("int8/tensor/asym", {}, "zero point"),
])
def test_bad_arguments_raise_value_error(spec, kwargs, match):
    with pytest.raises(ValueError, match=match):
        QuantizedKVCache(tiny_config("llama"), spec, **kwargs)


def test_packed_handle_refuses_other_attention_functions():
    model, tok = _model("llama")
    model.set_attn_implementation("sdpa")
    try:
        with pytest.raises(AttributeError, match="set_attn_implementation"):
            _generate(model, tok, QuantizedKVCache(model.config, "int8"), n=3)
    finally:
        model.set_attn_implementation("kvviz")


# ------------------------------------------------------------------------------------------ every architecture

# through the real models: per-token, channel + token groups, micro-scaled blocks with a static global scale (fp16,
# int4, kivi2 and llama.cpp's types hold their bytes in the synthetic test below, with heads wide enough for them)
ARCH_SPECS = ["k8v4", TINY_KIVI, "k=fp4_mx_block16,v=nvfp4"]


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_quantized_specs_generate_and_hold_the_memory_models_bytes(arch):
    """Lossy specs run on every architecture, and the bytes held equal kvviz.memory's transformers layout."""
    from kvviz.memory import kv_cache_bytes_for

    model, tok = _model(arch)
    enc = tok(ARCH_PROMPTS)
    for spec in ARCH_SPECS:
        cache = QuantizedKVCache(model.config, spec)
        out = model.generate(**enc, max_new_tokens=ARCH_NEW, do_sample=False, cache=cache)
        assert out.shape == (2, len(ARCH_PROMPTS[0]) + ARCH_NEW), spec
        seen = out.shape[1] - 1
        want = kv_cache_bytes_for(model.config, seen, batch=2, k=spec, layout="transformers")
        assert cache.nbytes() == want, (spec, cache.nbytes(), want)


# Wider heads (32; Gemma 4's global layers 64; DeepSeek-V3's RoPE key 32) so that the real presets fit: kivi2's
# channel groups of 32 and llama.cpp's blocks of 32.
WIDE = {"head_dim": 32, "global_head_dim": 64, "qk_rope_head_dim": 32, "kv_lora_rank": 64}
WIDE_SPECS = ["fp16", "int4", "k8v4", "kivi2", "k=q8_0,v=q4_0"]


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_long_synthetic_runs_hold_the_memory_models_bytes(arch):
    """Each layer's K/V fed as the model would (a prefill, single tokens, a teacher-forced chunk of 18) far past the
    window and past kivi2's channel groups and residual window of 32: nbytes() equals kvviz.memory's figure."""
    from kvviz.memory import kv_cache_bytes_for, layer_shapes

    wide = {key: value for key, value in WIDE.items() if key in ("head_dim", "global_head_dim")}
    if arch == "deepseek_v3":
        wide = {key: WIDE[key] for key in ("qk_rope_head_dim", "kv_lora_rank")}
    config = tiny_config(arch, **wide)
    shapes = [s for s in layer_shapes(config, "transformers") if s.has_kv]
    assert shapes and {s.kind for s in shapes} <= {"full_attention", "sliding_attention", "chunked_attention", "hybrid"}
    gen = torch.Generator().manual_seed(0)
    for spec in WIDE_SPECS:
        cache = QuantizedKVCache(config, spec)
        seen = 0
        for step in [20] + [1] * 21 + [18] + [1] * 6:  # 65 tokens: 8 windows, two kivi2 groups and a bit
            for s in shapes:
                k = torch.randn(2, s.k_heads, step, s.k_dim, generator=gen)
                v = torch.randn(2, s.v_heads, step, s.v_dim, generator=gen)
                cache.update(k, v, s.index)
            seen += step
            if seen in (20, 21, 31, 32, 33, 39, 40, 41, 59, 63, 64, 65):
                want = kv_cache_bytes_for(config, seen, batch=2, k=spec, layout="transformers")
                assert cache.nbytes() == want, (spec, seen, cache.nbytes(), want)


@pytest.mark.parametrize("spec", ["int4", TINY_KIVI, "fp8"])
def test_sliding_layers_hold_only_the_window(spec):
    """Mistral's layers all slide (window 8): bytes and buffer capacity stop growing once the window is full,
    and what is held is exactly DynamicCache's window (the attention sees the same tokens)."""
    model, tok = _model("mistral")
    cache = QuantizedKVCache(model.config, spec)
    enc = tok(["x"])
    model.generate(**enc, max_new_tokens=TINY_WINDOW + 2, do_sample=False, cache=cache)
    full = cache.nbytes()
    ids = enc["input_ids"]
    for _ in range(60):  # 60 more single-token steps, far past the window
        with torch.no_grad():
            model(input_ids=ids[:, -1:], cache=cache, use_cache=True)
    assert cache.nbytes() == full
    for layer in cache.layers:
        for side in (layer.k, layer.v):
            assert side.seq_len <= TINY_WINDOW - 1 + side.fmt.group if side.fmt.granularity == "channel" else \
                side.seq_len == TINY_WINDOW - 1
            assert all(buf.buf.shape[2] <= 4 * 64 for buf in side.fields.values())  # capacity bounded too
    assert cache.get_seq_length() == 1 + TINY_WINDOW + 1 + 60
    assert cache.get_mask_sizes(1, 0) == (TINY_WINDOW, cache.get_seq_length() - TINY_WINDOW + 1)


def test_channel_format_in_a_window_keeps_its_group_whole_and_hides_it():
    """A channel group straddling the window start stays stored (skip > 0) but is never shown to attention."""
    fmt_k, fmt_v = kvviz.get_format("int4/channel/g4/asym"), kvviz.get_format("int8")
    from kvviz.cache import QuantizedSlidingLayer, held_tokens

    layer = QuantizedSlidingLayer(fmt_k, fmt_v, sliding_window=8)
    x = torch.randn(1, 2, 30, 16)
    layer.update(x[:, :, :10], x[:, :, :10])
    for t in range(10, 30):
        k, v = layer.update(x[:, :, t : t + 1], x[:, :, t : t + 1])
        visible = min(t, 7) + 1  # what DynamicSlidingWindowLayer returns: 7 held + the new one
        assert k.dequantize().shape[2] == v.dequantize().shape[2] == visible
        torch.testing.assert_close(v.dequantize(), fmt_v.roundtrip(x[:, :, t + 1 - visible : t + 1]))
        assert layer.k.seq_len == held_tokens(fmt_k, t + 1, 8) and layer.v.seq_len == held_tokens(fmt_v, t + 1, 8)
    assert k.skip > 0 or layer.k.seq_len == 7  # the K side really kept a straddling group at some point


def test_hybrid_and_linear_layers_keep_transformers_state_objects():
    from transformers.cache_utils import DummyLayer, LinearAttentionLayer

    from kvviz.cache import QuantizedHybridLayer

    cache = QuantizedKVCache(tiny_config("qwen3_next"), "int4")
    assert type(cache.layers[0]) is LinearAttentionLayer and isinstance(cache.layers[1], QuantizedKVLayer)
    cache = QuantizedKVCache(tiny_config("falcon_h1"), "int4")
    assert all(isinstance(layer, QuantizedHybridLayer) for layer in cache.layers)
    assert all(isinstance(layer, LinearAttentionLayer) for layer in cache.layers)  # Mamba state: transformers'
    cache = QuantizedKVCache(tiny_config("gemma4"), "int4")
    assert [type(layer).__name__ for layer in cache.layers] == [
        "QuantizedSlidingLayer", "QuantizedKVLayer", "DummyLayer", "DummyLayer"]
    assert isinstance(cache.layers[3], DummyLayer)


def test_mla_caches_the_latent_and_reads_it_as_tensors():
    """DeepSeek-V3 expands its cached latent after the cache: the layers hand back dequantized tensors."""
    model, tok = _model("deepseek_v3")
    cache = QuantizedKVCache(model.config, "int8")
    model.generate(**tok(["abc"]), max_new_tokens=3, do_sample=False, cache=cache)
    k, v = cache.layers[0].update(torch.zeros(1, 1, 1, 32), torch.zeros(1, 1, 1, 16))
    assert isinstance(k, torch.Tensor) and k.shape == (1, 1, 6, 32) and v.shape == (1, 1, 6, 16)


# ------------------------------------------------------------------------------------------ bad input

def test_a_spec_a_layer_cannot_hold_names_the_layer_and_the_fix():
    config = tiny_config("gemma4")  # sliding layers head_dim 16, full layers 32
    with pytest.raises(ValueError, match=r"Layer 0 \(sliding_attention\) K \(head_dim 16\).*int4/g32.*/g16"):
        QuantizedKVCache(config, "int4/token/g32")
    QuantizedKVCache(config, "int4/token/g16")  # fits every layer


def test_unknown_layer_type_and_model_raise_value_error():
    config = tiny_config("llama")
    config.layer_types = ["full_attention", "heavily_compressed_attention"]
    with pytest.raises(ValueError, match="heavily_compressed_attention.*full_attention, sliding_attention"):
        QuantizedKVCache(config, "int8")
    with pytest.raises(ValueError, match="model config"):
        QuantizedKVCache({"model_type": "llama"}, "int8")
    from transformers import T5Config

    with pytest.raises(ValueError, match="encoder-decoder"):
        QuantizedKVCache(T5Config(), "int8")


def test_the_packer_is_chosen_once_per_side(monkeypatch):
    """The backend choice is read when a side first sees a device, not on every append."""
    from kvviz import attention

    calls = []
    monkeypatch.setattr(attention, "active_backend", lambda: calls.append(1) or "torch")
    fmt = kvviz.get_format("int4")
    layer = QuantizedKVLayer(fmt, fmt)
    for t in (5, 1, 1, 3, 1):
        layer.update(torch.randn(1, 2, t, 16), torch.randn(1, 2, t, 16))
    assert len(calls) == 2, "one choice for K, one for V"
