"""Tests for kvviz.analysis: capture shapes and exactness, outlier detection on a planted channel, error maps; and
capture on every architecture of kvviz.tiny (sliding windows, softcap, sinks, chunks, hybrids, MLA's K/V of
different widths, Gemma 4's layers of two widths), checked against DynamicCache and transformers' eager attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from kvviz import analysis
from kvviz import tiny as tinies  # tiny models of every architecture
from kvviz.models import tiny_model

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


@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # full attention: every architecture is tested further down
def test_capture_shapes_and_matches_cache(arch):
    model, tok = tinies.tiny_model(arch)
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
    assert s["mean_kurtosis"] == pytest.approx(1.0, rel=1e-5)
    with pytest.raises(ValueError):
        analysis.outlier_mask(torch.ones(4), factor=0)


def test_rotation_spreads_the_outlier():
    cap = _planted()
    view = analysis.rotation_view(cap, layer=0, head=1)
    assert view["original"]["amax_ratio"] > 10 > 3 > view["rotated"]["amax_ratio"]
    assert view["x_rot"].shape == (64, 32)
    with pytest.raises(ValueError):
        analysis.rotation_view(cap, layer=2, head=0)


def test_coordinate_histogram_against_the_codebooks_density():
    """Lesson 9's data: one huge channel makes a unit vector's coordinates heavy-tailed; after the rotation they
    follow N(0, 1/d). The densities integrate to the share inside the plotted span; the curve integrates to ~1."""
    cap = _planted(size=1.0)
    cap.keys_post[1, 0, :, 5] *= 40.0  # one head stands out: the auto pick finds it
    h = analysis.coordinate_histogram(cap)
    assert (h["layer"], h["head"], h["layer_id"], h["head_dim"], h["tokens"]) == (1, 0, 1, 32, 64)
    assert h["kurtosis_before"] > 10 > 4 > h["kurtosis_after"]  # N(0, 1/d): 3; a bare basis vector rotated: 1
    assert h["max_before"] > 0.9 > 0.5 > h["max_after"]
    width = np.diff(h["edges"])
    for side in ("before", "after"):
        assert (h[side] * width).sum() == pytest.approx(1 - h[f"outside_{side}"], abs=1e-9)
    assert np.trapezoid(h["curve_pdf"], h["curve_x"]) == pytest.approx(1, abs=1e-3)  # +-5 sigma
    assert analysis.coordinate_histogram(cap, layer=0, head=1)["head"] == 1
    with pytest.raises(ValueError, match="layer must be in 0..1"):
        analysis.coordinate_histogram(cap, layer=2)


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
    per_layer = analysis.layer_errors(cap, ["int8", "int2"])
    summary = analysis.error_summary(cap, per_layer, errs)  # the means over layers, per format
    assert [e.spec for e in summary] == ["int8", "int2"] and summary[0].bits_per_value > summary[1].bits_per_value > 2
    assert summary[1].k == pytest.approx(float(np.mean(per_layer["int2"]["k"])))
    assert summary[1].attention == pytest.approx(float(np.mean(errs["int2"])))
    assert summary[1].attention > summary[0].attention


# ------------------------------------------------------------------------- every architecture kvviz caches

ARCHS = tinies.TINY_ARCHS
WIDE = "The quick brown fox jumps over the lazy dog."  # 44 byte tokens: longer than the tiny models' windows (8)
MLA = ("deepseek_v3",)  # transformers caches MLA's compressed latent, not the per-head K/V attention reads
MIXED = ("gemma4",)  # full-attention layers twice as wide as the sliding ones: captured one shape at a time


def _capture(arch, attn=None, layers=None):
    model, tok = tinies.tiny_model(arch)
    if attn is not None:
        model.set_attn_implementation(attn)
    if layers is None and arch in MIXED:
        layers = _attention_layers(model)[:1]
    return model, tok, analysis.capture_kv(model, tok, WIDE, layers=layers)


def _attention_layers(model) -> list[int]:
    """The model's layers that run attention on K/V of their own, from its config (the test's own reading)."""
    cfg = model.config.get_text_config(decoder=True)
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    own = [i for i, t in enumerate(types) if t == "hybrid" or ("attention" in t and "linear" not in t)]
    shared = getattr(cfg, "num_kv_shared_layers", 0) or 0
    return own[:len(types) - shared] if shared else own


@pytest.mark.parametrize("arch", [a for a in ARCHS if a not in MLA + MIXED])
def test_capture_every_arch_is_what_the_cache_holds(arch):
    """Post-RoPE K and V of every attention layer equal a DynamicCache's, including the sliding layers' last
    window-1 tokens; linear-attention layers of hybrids are skipped and captured layers keep their numbers."""
    model, tok, cap = _capture(arch)
    t = len(tok.encode(WIDE))
    assert cap.layer_ids == _attention_layers(model)
    assert cap.keys_post.shape[:3] == (len(cap.layer_ids), model.config.num_key_value_heads, t)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(tok(WIDE, return_tensors="pt")["input_ids"], cache=cache, use_cache=True)
    for i, layer in enumerate(cap.layer_ids):
        k, v = cache.layers[layer].keys[0], cache.layers[layer].values[0]  # [Hkv, held, D]
        held = k.shape[1]
        assert held == (t if cap.attention[i].mask is None or "chunk" in arch else held)
        torch.testing.assert_close(cap.keys_post[i][:, t - held:], k, rtol=0, atol=0)
        torch.testing.assert_close(cap.values[i][:, t - held:], v, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_recomputed_from_the_capture_matches_the_models(arch, monkeypatch):
    """errors._attention on the captured Q/K/V, mask, scale, softcap and sinks reproduces each layer's attention
    output as transformers' eager attention (the modeling module's own eager_attention_forward) computes it."""
    import sys

    from kvviz.analysis.errors import _attention

    model, tok = tinies.tiny_model(arch)
    model.set_attn_implementation("eager")
    modeling = sys.modules[type(model).__module__]
    eager, outs = modeling.eager_attention_forward, {}

    def recording(module, *args, **kwargs):
        out = eager(module, *args, **kwargs)
        outs[module.layer_idx] = out[0][0]  # [T, Hq, Dv]
        return out

    monkeypatch.setattr(modeling, "eager_attention_forward", recording)
    cap = analysis.capture_kv(model, tok, WIDE, layers=_attention_layers(model)[:1] if arch in MIXED else None)
    assert set(cap.layer_ids) <= set(outs)
    for i, layer in enumerate(cap.layer_ids):
        got = _attention(cap.queries[i], cap.keys_post[i], cap.values[i], cap.attention[i])  # [Hq, T, Dv]
        torch.testing.assert_close(got, outs[layer].transpose(0, 1).float(), rtol=1e-4, atol=1e-5)


def test_sliding_masks_are_windows():
    _, _, cap = _capture("mistral")
    w = tinies.TINY_WINDOW
    for how in cap.attention:
        assert how.mask is not None
        attended = how.mask.sum(-1)  # keys each query reads
        assert attended.tolist() == [min(q + 1, w) for q in range(how.mask.shape[0])]


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_pre_rope_k_is_after_the_k_norm(arch):
    """keys_pre is k_norm(k_proj(x)): what RoPE rotates, recomputed here from each layer's input."""
    model, tok = tinies.tiny_model(arch)
    inputs = {}
    attns = [layer.self_attn for layer in model.model.layers]
    hooks = [a.register_forward_pre_hook(lambda mod, args, kwargs, i=i: inputs.__setitem__(i, kwargs["hidden_states"]),
                                         with_kwargs=True) for i, a in enumerate(attns)]
    try:
        cap = analysis.capture_kv(model, tok, WIDE)
    finally:
        for h in hooks:
            h.remove()
    for i, attn in enumerate(attns):
        k = attn.k_proj(inputs[i][0]).view(inputs[i].shape[1], -1, attn.head_dim)  # [T, Hkv, D]
        want = attn.k_norm(k).transpose(0, 1)
        torch.testing.assert_close(cap.keys_pre[i], want, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(cap.keys_pre[i][:, 1:], cap.keys_post[i][:, 1:])


@pytest.mark.parametrize("arch, rotated", [("cohere2", [True, False]), ("llama4", [True, False])])
def test_layers_without_rope_have_pre_equal_post(arch, rotated):
    _, _, cap = _capture(arch)
    assert [not torch.equal(cap.keys_pre[i], cap.keys_post[i]) for i in range(cap.layers)] == rotated


def test_mla_k_and_v_of_different_widths():
    """DeepSeek-V3: K is qk_nope channels without position then qk_rope rotated ones (shared by the heads), V is
    v_head_dim wide, narrower than K; every analysis function takes the two widths."""
    model, _, cap = _capture("deepseek_v3")
    cfg = model.config
    nope, rope = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    assert cap.keys_post.shape[-1] == nope + rope and cap.values.shape[-1] == cfg.v_head_dim != nope + rope
    assert cap.queries.shape[-1] == nope + rope and cap.kv_heads == cfg.num_attention_heads
    assert torch.equal(cap.keys_pre[..., :nope], cap.keys_post[..., :nope])
    # position 0 is not rotated, but interleaved RoPE (rope_interleave) reorders the rotated channels
    pre0, post0 = cap.keys_pre[:, :, 0, nope:], cap.keys_post[:, :, 0, nope:]
    torch.testing.assert_close(pre0.sort(-1).values, post0.sort(-1).values)
    assert not torch.allclose(cap.keys_pre[..., 1:, nope:], cap.keys_post[..., 1:, nope:])
    assert analysis.error_map(cap, "int4", 0, 0, "values").shape == (cap.keys_post.shape[2], cfg.v_head_dim)
    errs = analysis.layer_errors(cap, ["int8", "int4"])
    assert (errs["int8"]["v"] < errs["int4"]["v"]).all() and (errs["int8"]["k"] < errs["int4"]["k"]).all()
    attn = analysis.attention_errors(cap, ["fp16", "int4"])
    assert (attn["fp16"] < 1e-3).all() and (attn["int4"] > attn["fp16"]).all()
    assert analysis.capture_stats(cap, "values")["amax"].shape[-1] == cfg.v_head_dim
    assert analysis.scale_comparison(cap, "int8", which="values", rot=False)["int8"]["error_map"].shape[-1] == 16
    d = cap.head_dim
    rows = analysis.scale_comparison(cap, "int8", which="keys_post")  # the rotation only where the width allows
    assert rows and any(row["rot"] for row in rows.values()) == (d & (d - 1) == 0)
    rows = analysis.scale_comparison(_planted(dim=24), "int8")  # 24 channels: no Hadamard matrix, no /rot rows
    assert rows and not any(row["rot"] for row in rows.values())


def test_layers_of_different_shapes_are_captured_one_shape_at_a_time():
    """Gemma 4: sliding layers head_dim 16, full layers 32, and KV-shared layers that hold nothing."""
    model, tok = tinies.tiny_model("gemma4")
    with pytest.raises(ValueError, match="layers=") as err:
        analysis.capture_kv(model, tok, WIDE)
    own = _attention_layers(model)
    widths = {}
    for layer in own:
        cap = analysis.capture_kv(model, tok, WIDE, layers=[layer])
        assert cap.layer_ids == [layer]
        widths[layer] = cap.head_dim
    assert len(set(widths.values())) == 2 and str(sorted(set(widths.values()))[1]) in str(err.value)
    shared = [i for i in range(model.config.num_hidden_layers) if i not in own]
    assert shared
    with pytest.raises(ValueError, match="hold no K/V"):
        analysis.capture_kv(model, tok, WIDE, layers=shared[:1])


def test_hybrid_analysis_reports_the_models_layer_numbers():
    model, _, cap = _capture("qwen3_next")
    assert cap.layer_ids == _attention_layers(model) and cap.layers < model.config.num_hidden_layers
    summary = analysis.kv_outlier_summary(cap)
    assert summary["keys_post"]["outliers"].shape == (cap.layers,)
    assert analysis.capture_stats(cap)["layer_ids"] == cap.layer_ids
    assert analysis.layer_errors(cap, ["int4"])["int4"]["k"].shape == (cap.layers,)


def test_strongest_outliers_are_the_largest_few_and_the_count():
    from kvviz.analysis.stats import strongest_outliers

    amax = np.ones((1, 2, 64))  # [layers, kv_heads, head_dim]
    amax[0, 0, :20] = np.arange(20) + 10.0  # 20 outlier channels, channel 19 the largest
    stats = {"amax": amax, "outliers": {(0, 0): list(range(20))}}
    chans, total = strongest_outliers(stats, 0, 0)
    assert chans == list(range(19, 11, -1)) and total == 20
    assert strongest_outliers(stats, 0, 1) == ([], 0)
