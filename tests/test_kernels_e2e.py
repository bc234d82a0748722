"""End to end: a tiny random Llama decodes through a kvviz.QuantizedKVCache with the fused Triton backend and with
the torch reference backend, and both give the same logits, for every format (and the presets' K/V pairs); and
tiny Gemma 3, gpt-oss, Llama 4, Mistral and Gemma 2 models (sliding windows, sinks, chunks, softcapping) do the
same for int4 and k=mxfp4,v=nvfp4 (relative error <= 1e-3), and llama.cpp's k=q8_0,v=q4_0 on a tiny Llama, packed
and read by the kernels (1e-3).

On a CPU the Triton kernels run in the interpreter: tests/conftest.py sets TRITON_INTERPRET=1 before triton is first
imported (triton decorates its own library functions then). The prompts are left-padded
(the kernel's kv_mask) and long enough that KIVI's 32-token residual window and channel groups both fill.

    python -m pytest tests/test_kernels_e2e.py -q
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

if not torch.cuda.is_available():  # tests/conftest.py sets it first; this covers running the file on its own
    os.environ.setdefault("TRITON_INTERPRET", "1")

import kernels  # noqa: E402
import kvviz  # noqa: E402
from kvviz import attention  # noqa: E402

pytestmark = pytest.mark.skipif(not kernels.triton_usable(), reason="Triton cannot run here: no CUDA, and "
                                "TRITON_INTERPRET=1 was not set before triton was imported")

# Every base format at its default granularity, the other granularities, asym, rot, and the presets' pairs.
SPECS = (
    "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3/token", "fp8_e5m2/head", "int8", "int8/asym", "int8/tensor",
    "int4", "int4/g8/asym", "int4/head", "int2", "int2/asym", "int4/channel/g16/asym", "fp4_mx_block16", "nvfp4",
    "int4/rot", "k8v4", "kivi2", "kivi4",
)
SHORT = ("The quick brown fox jumps", "Hello")  # left padding: the second row's first tokens are masked
LONG = ("The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs, then", "Hello")
STEPS = 2
TOL = 1e-4  # max |logits_triton - logits_torch| / max |logits_torch|, fp32 model


@pytest.fixture(autouse=True)
def _fresh_probe():
    """The attention module caches its Triton probe: refresh it around each test."""
    attention._probe.cache_clear()
    yield
    attention._probe.cache_clear()


def _model(head_dim: int):
    model, tok = kvviz.tiny_model("llama")
    if head_dim != model.config.head_dim:  # MX blocks of 32 need a wider head than the tiny model's 16
        from transformers import AutoModelForCausalLM

        config = model.config
        config.head_dim = head_dim
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attention.ATTN_NAME).eval()
    return model, tok


def _decode_logits(model, tok, spec: str, backend: str, monkeypatch) -> torch.Tensor:
    """Prefill the left-padded prompts, then STEPS teacher-forced decode steps: logits [STEPS, B, vocab]."""
    monkeypatch.setattr(kvviz.runtime.default(), "backend", backend)
    assert attention.active_backend() == backend
    kv = kvviz.parse_kv(spec)
    long = kv.residual or "channel" in (kv.k.granularity, kv.v.granularity)  # so that groups and windows fill
    enc = tok(list(LONG if long else SHORT), return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    cache = kvviz.QuantizedKVCache(model.config, spec)
    out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    logits = []
    forced = torch.tensor([[101, 102], [32, 33]])  # fixed next tokens: both backends see the same
    with torch.no_grad():
        for step in range(STEPS):
            mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype)], dim=1)
            out = model(input_ids=forced[step][:, None], attention_mask=mask, past_key_values=cache, use_cache=True)
            logits.append(out.logits[:, -1].float())
    return torch.stack(logits)


@pytest.mark.parametrize("spec", SPECS + ("mxfp4",))
def test_triton_and_torch_backends_agree(spec, monkeypatch):
    kv = kvviz.parse_kv(spec)
    wide = any(f.granularity == "token" and (f.group or 0) > 16 for f in (kv.k, kv.v))  # mxfp4, kivi's g32
    model, tok = _model(32 if wide else 16)
    with torch.no_grad():
        ref = _decode_logits(model, tok, spec, "torch", monkeypatch)
        got = _decode_logits(model, tok, spec, "triton", monkeypatch)
    assert torch.isfinite(got).all()
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert err <= TOL, f"{spec}: triton and torch logits differ by {err:.2e} (relative)"


def test_llama_cpp_types_packed_and_read_fused(monkeypatch):
    """k=q8_0,v=q4_0 (llama.cpp's -ctk q8_0 -ctv q4_0) at head_dim 32 (one ggml block): with the triton backend every
    append quantizes through kernels.quant_pack and every decode step reads ggml's blocks in the fused kernel."""
    import kernels.pack

    spec = "k=q8_0,v=q4_0"
    model, tok = _model(32)
    packs, reads = [], []
    quant_pack, fused = kernels.pack.quant_pack, attention._triton_decode
    monkeypatch.setattr(kernels.pack, "quant_pack", lambda fmt, *a, **kw: packs.append(fmt.base) or
                        quant_pack(fmt, *a, **kw))
    monkeypatch.setattr(attention, "_triton_decode", lambda *a, **kw: reads.append(1) or fused(*a, **kw))
    with torch.no_grad():
        ref = _decode_logits(model, tok, spec, "torch", monkeypatch)
        assert not packs and not reads
        got = _decode_logits(model, tok, spec, "triton", monkeypatch)
    assert {"q8_0", "q4_0"} <= set(packs), "the cache packs llama.cpp's types with the kernel"
    assert len(reads) == STEPS * model.config.num_hidden_layers, "every decode step reads them fused"
    assert torch.isfinite(got).all()
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert err <= 1e-3, f"{spec}: triton and torch logits differ by {err:.2e} (relative)"


# ------------------------------------------------------------------------------------------ attention architectures

# Tiny random models (kvviz.tiny) whose windows / chunks (8 tokens) are shorter than the prompt, so the cache's
# window and transformers' mask really cut: sliding windows (Mistral, Gemma 3, gpt-oss with sinks), chunked
# attention (Llama 4: the mask keeps the current chunk of the held tokens) and logit softcapping (Gemma 2).
# DeepSeek-V3 is not here: transformers caches its latent and expands K/V after the cache, so its attention never
# reads packed K/V (test_kernels.py covers K and V of different widths).
ARCHS = ("gemma3", "gpt_oss", "llama4", "mistral", "gemma2")
ARCH_SPECS = ("int4", "k=mxfp4,v=nvfp4")
ARCH_PROMPTS = ("The quick brown fox jumps over the lazy dog", "Pack my box with")  # 43 and 16 bytes
ARCH_TOL = 1e-3  # max |logits_triton - logits_torch| / max |logits_torch|


@functools.lru_cache(maxsize=None)
def _arch_model(arch: str):
    """kvviz.tiny_model(arch) widened to head_dim 32, so that MX blocks of 32 fit."""
    from transformers import AutoModelForCausalLM

    from kvviz.tiny import ByteTokenizer, tiny_config

    config = tiny_config(arch)
    config.head_dim = 32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attention.ATTN_NAME).eval()
    return model, ByteTokenizer()


def _arch_logits(model, tok, spec: str, backend: str, monkeypatch, prompts=ARCH_PROMPTS) -> torch.Tensor:
    """Prefill the left-padded prompts (two; ARCH_PROMPTS' windows already cut), then one decode step: logits
    [B, vocab]."""
    monkeypatch.setattr(kvviz.runtime.default(), "backend", backend)
    enc = tok(list(prompts), return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    cache = kvviz.QuantizedKVCache(model.config, spec)
    model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype)], dim=1)
    out = model(input_ids=torch.tensor([[101], [32]]), attention_mask=mask, past_key_values=cache, use_cache=True)
    return out.logits[:, -1].float()


@pytest.mark.parametrize("spec", ARCH_SPECS)
@pytest.mark.parametrize("arch", ARCHS)
def test_triton_and_torch_agree_across_architectures(arch, spec, monkeypatch):
    model, tok = _arch_model(arch)
    calls = []
    fused = attention._triton_decode
    monkeypatch.setattr(attention, "_triton_decode", lambda *a, **kw: calls.append(1) or fused(*a, **kw))
    with torch.no_grad():
        ref = _arch_logits(model, tok, spec, "torch", monkeypatch)
        got = _arch_logits(model, tok, spec, "triton", monkeypatch)
    n_attention = sum(t != "linear_attention" for t in getattr(model.config, "layer_types", None) or
                      ["full_attention"] * model.config.num_hidden_layers)
    assert len(calls) == n_attention, "every decode step of every attention layer takes the fused kernel"
    assert torch.isfinite(got).all()
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    print(f"{arch} {spec}: relative error {err:.2e}")
    assert err <= ARCH_TOL, f"{arch} {spec}: triton and torch logits differ by {err:.2e} (relative)"
