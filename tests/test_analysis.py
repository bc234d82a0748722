"""Tests for kvviz.analysis: capture shapes and exactness, outlier detection on a planted channel, error maps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from kvviz import analysis
from kvviz.models import TINY_ARCHS, tiny_model

PROMPT = "The quick brown fox jumps over the lazy dog. " * 2


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def cap(tiny):
    model, tok = tiny
    return analysis.capture_kv(model, tok, PROMPT)


def _planted(layers=2, heads=2, tokens=64, dim=32, channel=5, size=40.0, seed=0) -> analysis.KVCapture:
    """A synthetic capture whose K has one huge channel in every head; V is plain Gaussian."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(layers, heads, tokens, dim, generator=g)
    k[..., channel] *= size
    v = torch.randn(layers, heads, tokens, dim, generator=g)
    q = torch.randn(layers, heads * 2, tokens, dim, generator=g)
    return analysis.KVCapture(keys_pre=k.clone(), keys_post=k, values=v, queries=q, tokens=[str(i) for i in range(tokens)],
                              token_ids=list(range(tokens)), scaling=dim ** -0.5)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_capture_shapes_and_matches_cache(arch):
    model, tok = tiny_model(arch)
    cap = analysis.capture_kv(model, tok, PROMPT)
    cfg = model.config
    t = len(tok.encode(PROMPT))
    assert cap.keys_post.shape == (cfg.num_hidden_layers, cfg.num_key_value_heads, t, cfg.head_dim)
    assert cap.keys_pre.shape == cap.keys_post.shape == cap.values.shape
    assert cap.queries.shape == (cfg.num_hidden_layers, cfg.num_attention_heads, t, cfg.head_dim)
    assert cap.keys_post.dtype == torch.float32 and len(cap.tokens) == t
    # post-RoPE K and V are exactly what a DynamicCache stores
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        model(tok(PROMPT, return_tensors="pt")["input_ids"], cache=cache, use_cache=True)
    for layer in range(cfg.num_hidden_layers):
        torch.testing.assert_close(cache.layers[layer].keys[0], cap.keys_post[layer])
        torch.testing.assert_close(cache.layers[layer].values[0], cap.values[layer])
    # RoPE leaves position 0 unrotated and rotates later positions
    torch.testing.assert_close(cap.keys_pre[:, :, 0], cap.keys_post[:, :, 0])
    assert not torch.allclose(cap.keys_pre[:, :, 1:], cap.keys_post[:, :, 1:])


def test_capture_truncates_and_rejects_empty(tiny):
    model, tok = tiny
    assert analysis.capture_kv(model, tok, PROMPT, max_tokens=10).keys_post.shape[2] == 10
    with pytest.raises(ValueError):
        analysis.capture_kv(model, tok, "")


def test_planted_outlier_channel_is_found():
    cap = _planted(channel=5)
    stats = analysis.capture_stats(cap, "keys_post")
    assert stats["amax"].shape == (2, 2, 32) and stats["kurtosis"].shape == (2, 2, 32)
    assert set(stats["outliers"]) == {(l, h) for l in range(2) for h in range(2)}
    assert all(chans == [5] for chans in stats["outliers"].values())
    assert (stats["amax_ratio"] > 10).all()
    assert not analysis.capture_stats(cap, "values")["outliers"], "plain Gaussian V has no outlier channel"
    summary = analysis.kv_outlier_summary(cap)
    assert summary["keys_post"]["outliers"].tolist() == [2, 2] and summary["values"]["outliers"].tolist() == [0, 0]


def test_channel_stats_values():
    x = torch.tensor([[1.0, -2.0], [-3.0, 2.0]])  # [T=2, D=2]
    s = analysis.channel_stats(x)
    np.testing.assert_allclose(s["amax"], [3.0, 2.0])
    np.testing.assert_allclose(s["mean_abs"], [2.0, 2.0])
    np.testing.assert_allclose(s["kurtosis"], [1.0, 1.0], rtol=1e-5)  # two-point distribution
    with pytest.raises(ValueError):
        analysis.outlier_mask(torch.ones(4), factor=0)


def test_rotation_spreads_the_outlier():
    cap = _planted()
    view = analysis.rotation_view(cap, layer=0, head=1)
    assert view["original"]["amax_ratio"] > 10 > 3 > view["rotated"]["amax_ratio"]
    assert view["x_rot"].shape == (64, 32)
    with pytest.raises(ValueError):
        analysis.rotation_view(cap, layer=2, head=0)


def test_per_tensor_scale_is_ruined_by_outliers():
    cap = _planted()
    cmp = analysis.scale_comparison(cap, "int4", layer=0, head=0)
    err = {spec: row["rel_error"] for spec, row in cmp.items()}
    assert err["int4/channel"] < err["int4"] < err["int4/tensor"]
    assert err["int4/tensor/rot"] < err["int4/tensor"]
    assert cmp["int4"]["error_map"].shape == (64, 32)
    # MX FP4 only takes token blocks: the comparison lists what exists
    assert list(analysis.scale_comparison(cap, "mxfp4", rot=False)) == ["mxfp4"]
    with pytest.raises(ValueError):
        analysis.scale_comparison(cap, "int3")


def test_error_maps_and_layer_errors(cap):
    maps = analysis.error_maps(cap, ["fp16", "int4", "k=int8,v=int2"], layer=1, head=0)
    t, d = cap.keys_post.shape[2:]
    assert all(m.shape == (t, d) for m in maps.values())
    assert maps["fp16"].max() < 1e-2 < maps["int4"].max()
    errs = analysis.layer_errors(cap, ["fp16", "int8", "int4", "k=int8,v=int2"])
    assert errs["int4"]["k"].shape == (cap.layers,)
    assert (errs["fp16"]["k"] < 1e-3).all()
    assert (errs["int8"]["k"] < errs["int4"]["k"]).all()
    assert (errs["k=int8,v=int2"]["k"] == errs["int8"]["k"]).all()  # K side uses the pair's K format
    assert (errs["k=int8,v=int2"]["v"] > errs["int4"]["v"]).all()


def test_residual_window_is_exact(cap):
    last = analysis.error_map(cap, "kivi2", layer=0, head=0)
    assert last[-min(32, last.shape[0]):].max() == 0.0


def test_attention_errors(cap):
    errs = analysis.attention_errors(cap, ["fp16", "int8", "int2"])
    assert errs["int8"].shape == (cap.layers,)
    assert (errs["fp16"] < 1e-3).all() and (errs["int8"] < errs["int2"]).all()
