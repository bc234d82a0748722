"""Tests for kvviz.calibrate: scales from a tiny model, SGLang JSON round trip, malformed files rejected clearly."""

from __future__ import annotations

import json

import pytest
import torch

from kvviz import analysis
from kvviz.cache import QuantizedKVCache
from kvviz.calibrate import (KVScales, calibrate_scales, load_scales, save_scales, scales_from_json,
                             scales_to_json)
from kvviz.models import tiny_model

PROMPTS = ["Hello there, general.", "A longer prompt, with more tokens to calibrate on. " * 3]


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")


def test_amax_scales_match_the_capture(tiny):
    model, tok = tiny
    scales = calibrate_scales(model, tok, PROMPTS)
    assert scales.num_layers == model.config.num_hidden_layers and scales.method == "amax"
    caps = [analysis.capture_kv(model, tok, p) for p in PROMPTS]
    for layer in range(scales.num_layers):
        k_amax = max(c.keys_post[layer].abs().max().item() for c in caps)
        v_amax = max(c.values[layer].abs().max().item() for c in caps)
        assert scales.k[layer] == pytest.approx(k_amax / 448, rel=1e-6)
        assert scales.v[layer] == pytest.approx(v_amax / 448, rel=1e-6)
    for_cache = scales.for_cache()
    assert for_cache == {i: (scales.k[i], scales.v[i]) for i in range(scales.num_layers)}


def test_scales_feed_the_cache(tiny):
    model, tok = tiny
    scales = calibrate_scales(model, tok, PROMPTS)
    cache = QuantizedKVCache(model.config, "fp8_e4m3", scales=scales.for_cache())
    ids = tok(PROMPTS[1], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        model(input_ids=ids, cache=cache, use_cache=True)
    heads, dim = model.config.num_key_value_heads, model.config.head_dim
    packed_k, packed_v = cache.update(torch.zeros(1, heads, 1, dim), torch.zeros(1, heads, 1, dim), 1)
    assert packed_k.tensor_scale.item() == pytest.approx(scales.k[1])
    assert packed_v.tensor_scale.item() == pytest.approx(scales.v[1])


def test_percentile_scales_are_smaller(tiny):
    model, tok = tiny
    amax = calibrate_scales(model, tok, PROMPTS)
    p99 = calibrate_scales(model, tok, PROMPTS, percentile=99.0)
    assert p99.method == "p99" and all(a < b for a, b in zip(p99.k, amax.k))
    e5m2 = calibrate_scales(model, tok, PROMPTS, base="fp8_e5m2")
    assert e5m2.k[0] == pytest.approx(amax.k[0] * 448 / 57344)


@pytest.mark.parametrize("kwargs", [dict(base="int8"), dict(percentile=0), dict(percentile=101)])
def test_calibrate_rejects_bad_arguments(tiny, kwargs):
    model, tok = tiny
    with pytest.raises(ValueError):
        calibrate_scales(model, tok, PROMPTS, **kwargs)


@pytest.mark.parametrize("prompts", [[], "a bare string", [""]])
def test_calibrate_rejects_bad_prompts(tiny, prompts):
    model, tok = tiny
    with pytest.raises(ValueError, match="prompt"):
        calibrate_scales(model, tok, prompts)


def test_sglang_json_round_trip(tmp_path):
    scales = KVScales(k=(0.5, 0.25, 1e-3), v=(0.1, 0.75, 2e-3))
    path = save_scales(scales, tmp_path / "scales.json", tp_size=2, model_type="llama")
    doc = json.loads(path.read_text())
    assert doc == {"model_type": "llama", "kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {
        "0": {"0": 0.5, "1": 0.75, "2": 2e-3}, "1": {"0": 0.5, "1": 0.75, "2": 2e-3}}}}
    loaded = load_scales(path, num_layers=3)
    assert loaded.k == loaded.v == scales.shared() == (0.5, 0.75, 2e-3)
    # a second round trip is the identity
    assert load_scales(save_scales(loaded, tmp_path / "again.json")) == loaded


def test_reads_the_seed_example():
    doc = {"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1.0, "1": 1.0}}}}
    assert scales_from_json(doc).k == (1.0, 1.0)


def test_e5m2_scales_cannot_be_saved_for_sglang():
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        scales_to_json(KVScales(k=(1.0,), v=(1.0,), base="fp8_e5m2"))
    with pytest.raises(ValueError, match="tp_size"):
        scales_to_json(KVScales(k=(1.0,), v=(1.0,)), tp_size=0)


def _doc(**kv):
    base = {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1.0, "1": 2.0}}}
    base.update(kv)
    return {"kv_cache": base}


@pytest.mark.parametrize("doc,match", [
    ([], "kv_cache"),
    ({"scaling_factor": {}}, "kv_cache"),
    (_doc(dtype="float8_e5m2"), "float8_e4m3fn"),
    (_doc(dtype=None), "dtype"),
    (_doc(scaling_factor={}), "non-empty"),
    (_doc(scaling_factor=[1.0]), "non-empty"),
    (_doc(scaling_factor={"zero": {"0": 1.0}}), "rank 'zero' is not an integer"),
    (_doc(scaling_factor={"0": 1.0}), "scaling_factor"),
    (_doc(scaling_factor={"0": {"a": 1.0}}), "layer 'a' is not an integer"),
    (_doc(scaling_factor={"0": {"-1": 1.0}}), "non-negative"),
    (_doc(scaling_factor={"0": {"0": 0.0}}), "positive"),
    (_doc(scaling_factor={"0": {"0": "1.0"}}), "positive"),
    (_doc(scaling_factor={"0": {"0": float("nan")}}), "finite"),
    (_doc(scaling_factor={"0": {"0": True}}), "positive"),
    (_doc(scaling_factor={"0": {"0": 1.0, "2": 1.0}}), "missing \\[1\\]"),
    (_doc(scaling_factor={"0": {"0": 1.0}, "1": {"1": 1.0}}), "different layers"),
])
def test_malformed_documents(doc, match):
    with pytest.raises(ValueError, match=match):
        scales_from_json(doc)


def test_malformed_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_scales(bad)
    with pytest.raises(ValueError, match="Cannot read"):
        load_scales(tmp_path / "missing.json")
    good = save_scales(KVScales(k=(1.0, 1.0), v=(1.0, 1.0)), tmp_path / "good.json")
    with pytest.raises(ValueError, match="2 layers but the model has 30"):
        load_scales(good, num_layers=30)
