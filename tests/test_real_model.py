"""The real default model (SmolLM2-135M-Instruct from the bundled GGUF), loaded once per session, offline:
generation through the k8v4 cache, and fp8's teacher-forced KL below int4's. Kept short (well under 2 minutes on a
2-core CPU once the converted copy is cached; the very first load converts the GGUF, ~1 minute more)."""

from __future__ import annotations

import os

import pytest
import torch

from kvviz import analysis, quality
from kvviz.cache import QuantizedKVCache
from kvviz.memory import kv_cache_bytes_for
from kvviz.models import load_model

PROMPT = ("The tower is 324 metres tall, about the same height as an 81-storey building, and the tallest structure "
          "in Paris. Its base is square, measuring 125 metres on each side. During its construction, the Eiffel "
          "Tower surpassed the Washington Monument to become the tallest man-made structure in the world.")


@pytest.fixture(scope="session")
def real():
    old = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # the bundled model needs no network
    try:
        yield load_model()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_loads_offline_with_the_expected_shape(real):
    model, _ = real
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (30, 9, 3, 64)


def test_generates_with_k8v4(real):
    model, tok = real
    enc = tok(PROMPT, return_tensors="pt")
    cache = QuantizedKVCache(model.config, "k8v4")
    with torch.no_grad():
        out = model.generate(**enc, cache=cache, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    new = out[0, enc["input_ids"].shape[1]:]
    assert new.numel() == 8 and tok.decode(new, skip_special_tokens=True).strip()
    assert cache.get_seq_length() == enc["input_ids"].shape[1] + 7  # the last token is never fed back
    # exactly what the memory model says this cache holds (transformers' layout: a sliding layer keeps W - 1)
    assert cache.nbytes() == kv_cache_bytes_for(model.config, cache.get_seq_length(), k="k8v4",
                                                layout="transformers")


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
