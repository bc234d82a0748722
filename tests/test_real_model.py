"""The two bundled real models, each loaded once per session, offline: SmolLM2-135M-Instruct (the default, 30
full-attention layers) and Gemma 3 270M (sliding windows on 15 of 18 layers, QK-norm, one KV head of 256). For each:
generation through the k8v4 cache, a teacher-forced KL ordering, and K/V capture with outlier statistics. Kept short
(well under 2 minutes on a 2-core CPU once the converted copies are cached; the very first load of each converts
its GGUF, 1 to 3 minutes more). Gemma's tests skip when its packages are not installed.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from kvviz import analysis, quality
from kvviz.cache import QuantizedKVCache
from kvviz.memory import kv_cache_bytes_for
from kvviz.models import BUNDLED, describe_model, load_model

README = Path(__file__).resolve().parent.parent / "README.md"
BENCHMARKS = README.parent / "docs" / "benchmarks.md"  # the measured figures, the K outlier table among them
PROMPT = ("The tower is 324 metres tall, about the same height as an 81-storey building, and the tallest structure "
          "in Paris. Its base is square, measuring 125 metres on each side. During its construction, the Eiffel "
          "Tower surpassed the Washington Monument to become the tallest man-made structure in the world.")


def _offline_load(name=None):
    old = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # the bundled models need no network
    try:
        return load_model(name)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def real():
    return _offline_load()


@pytest.fixture(scope="session")
def gemma():
    if any(importlib.util.find_spec(p) is None for p in BUNDLED["gemma-3-270m"].packages):
        pytest.skip(f"Gemma 3 270M is not installed ({BUNDLED['gemma-3-270m'].install})")
    return _offline_load("gemma-3-270m")


def test_loads_offline_with_the_expected_shape(real):
    model, _ = real
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (30, 9, 3, 64)


def _generates_with_k8v4(model, tok, new_tokens: int) -> None:
    """Greedy generation through a k8v4 cache writes text, and the cache holds what the memory model says."""
    enc = tok(PROMPT, return_tensors="pt")
    cache = QuantizedKVCache(model.config, "k8v4")
    with torch.no_grad():
        out = model.generate(**enc, cache=cache, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False)
    new = out[0, enc["input_ids"].shape[1]:]
    assert new.numel() == new_tokens and tok.decode(new, skip_special_tokens=True).strip()
    # the last token is never fed back
    assert cache.get_seq_length() == enc["input_ids"].shape[1] + new_tokens - 1
    # exactly what the memory model says this cache holds (transformers' layout: a sliding layer keeps W - 1)
    assert cache.nbytes() == kv_cache_bytes_for(model.config, cache.get_seq_length(), k="k8v4",
                                                layout="transformers")


def test_generates_with_k8v4(real):
    _generates_with_k8v4(*real, new_tokens=8)


def test_fp8_kl_below_int4(real):
    model, tok = real
    report = quality.compare(model, tok, PROMPT, ["fp8_e4m3", "int4"], max_new_tokens=13, free_running=False)
    fp8, int4 = report.formats
    assert 0 < fp8.mean_kl < int4.mean_kl
    assert fp8.top1_rate >= int4.top1_rate


def test_post_rope_k_has_outlier_channels_v_fewer(real):
    model, tok = real
    cap = analysis.capture_kv(model, tok, PROMPT)
    summary = analysis.kv_outlier_summary(cap)
    assert summary["keys_post"]["outliers"].sum() > summary["values"]["outliers"].sum()


# ---------------------------------------------------------------------------------------------- Gemma 3 270M

def test_gemma_loads_offline_with_the_expected_shape(gemma):
    model, tok = gemma
    info = describe_model(model)
    assert (info["arch"], info["layers"], info["heads"], info["kv_heads"], info["head_dim"]) == \
        ("gemma3_text", 18, 4, 1, 256)
    assert info["layer_kinds"] == {"sliding_attention": 15, "full_attention": 3} and info["window"] == 512
    assert info["qk_norm"] and info["name"] == "google/gemma-3-270m"
    shown = re.search(r'describe_model\(model\)\["summary"\]\s+# \'(.*?)\'', README.read_text()).group(1)
    assert info["summary"] == shown  # the README's Models example prints this
    assert 260e6 < info["params"] < 280e6 and info["dtype"] == "float32"
    enc = tok(["The Eiffel Tower is in the city of"], return_tensors="pt")
    assert enc["input_ids"][0, 0] == tok.bos_token_id  # Gemma needs its <bos>; the converted tokenizer adds it
    out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0, enc["input_ids"].shape[1]:])


def test_gemma_generates_with_k8v4(gemma):
    _generates_with_k8v4(*gemma, new_tokens=6)


def test_gemma_int8_kl_below_per_tensor_int4(gemma):
    model, tok = gemma
    report = quality.compare(model, tok, PROMPT, ["int8", "int4/tensor"], max_new_tokens=5, free_running=False)
    int8, int4_tensor = report.formats
    assert 0 < int8.mean_kl < int4_tensor.mean_kl


def test_gemma_capture_k_after_qk_norm_and_outlier_stats(gemma):
    """On docs/benchmarks.md's 256 WikiText-2 tokens: capture sees Gemma's K after k_norm (before RoPE, what the
    rotation turns into the cached K) in every layer, and that page's largest / median K channel figures are what
    the capture measures."""
    model, tok = gemma
    layer = 5  # the first full-attention layer
    attn = model.model.layers[layer].self_attn
    seen = {}
    hook = attn.register_forward_pre_hook(lambda m, a, kw: seen.update(x=kw["hidden_states"]), with_kwargs=True)
    try:
        cap = analysis.capture_ids(model, tok(quality.wikitext(), return_tensors="pt")["input_ids"][:, :256], tok)
    finally:
        hook.remove()
    assert cap.layer_ids == list(range(18)) and cap.keys_post.shape[1:] == (1, 256, 256)
    with torch.no_grad():
        k = attn.k_norm(attn.k_proj(seen["x"][0]).view(-1, 1, 256)).transpose(0, 1)  # [1, T, 256]
    torch.testing.assert_close(cap.keys_pre[layer], k, rtol=1e-5, atol=1e-5)
    summary = analysis.kv_outlier_summary(cap)
    assert summary["keys_post"]["outliers"].sum() > summary["values"]["outliers"].sum()
    ratio = summary["keys_post"]["amax_ratio"]  # [18], the one KV head
    row = next(line for line in BENCHMARKS.read_text().splitlines() if line.startswith("| Gemma 3 270M |"))
    full, sliding, values = row.split("|")[2:5]
    shown_full = [float(x) for x in re.findall(r"([\d.]+)x", full)]  # layers 5, 11, 17
    assert np.allclose(ratio[[5, 11, 17]], shown_full, atol=0.06), ratio[[5, 11, 17]]
    lo, hi = (float(x) for x in re.findall(r"([\d.]+)x", sliding)[:2])
    slide = np.delete(ratio, [5, 11, 17])
    assert abs(slide.min() - lo) <= 0.06 and abs(slide.max() - hi) <= 0.06, slide
    v_lo, v_hi = (float(x) for x in re.findall(r"([\d.]+)x", values))
    v = summary["values"]["amax_ratio"]
    assert abs(v.min() - v_lo) <= 0.06 and abs(v.max() - v_hi) <= 0.06, v
