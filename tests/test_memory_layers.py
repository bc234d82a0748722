"""Tests for kvviz.memory's per-layer model: each layer kind by a hand-worked example, the presets' structure and
figures from their own config fields, transformers' config classes, engine vs transformers layouts, bad configs."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from kvviz import memory
from kvviz.memory import kv_cache_bytes_for, layer_shapes, state_bytes_for

FP16 = 2  # bytes


def _kinds(config) -> Counter:
    return Counter(s.kind for s in layer_shapes(config))


def _tiny(**fields) -> dict:
    return {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8} | fields


# --- each layer kind, by hand ---------------------------------------------------------------------------------


def test_full_attention_by_hand():
    assert kv_cache_bytes_for(_tiny(), 10, batch=3) == 4 * 2 * 3 * 10 * 2 * 8 * FP16


@pytest.mark.parametrize("layout, held", [("engine", 4), ("transformers", 3)])
def test_sliding_window_holds_w_in_engines_and_w_minus_1_in_transformers(layout, held):
    cfg = _tiny(sliding_window=4)  # Mistral v0.1 style: every layer slides
    assert [s.kind for s in layer_shapes(cfg)] == ["sliding_attention"] * 4
    assert kv_cache_bytes_for(cfg, 10, layout=layout) == 4 * 2 * held * 2 * 8 * FP16
    assert kv_cache_bytes_for(cfg, 2, layout=layout) == 4 * 2 * 2 * 2 * 8 * FP16  # shorter than the window


@pytest.mark.parametrize("seq_len, k_held", [(2, 2), (8, 4), (9, 5), (10, 6), (11, 3), (12, 4)])
def test_a_channel_format_in_a_sliding_layer_keeps_its_oldest_group_whole(seq_len, k_held):
    """transformers layout, window 4 (3 tokens visible), K = int4/channel/g4/asym, V = int8 (per token).
    K's groups of 4 are counted from position 0 and stay whole: at seq_len 10 the first visible position is 7, so
    K keeps positions 4..9 (6 tokens: one quantized group and 2 in the fp16 tail); V keeps 7..9 (3 tokens).
    This is kvviz.cache.held_tokens, the rule QuantizedKVCache follows. The engine layout is unchanged."""
    cfg = _tiny(sliding_window=4)
    k_group = 4 * 2 * 8 // 2 + 2 * 8 * (FP16 + FP16)  # 4 tokens x 2 x 8 at 4 bits, scale + zero per channel
    k_bytes = (k_held // 4) * k_group + (k_held % 4) * 2 * 8 * FP16  # whole groups, the partial one in fp16
    v_held = min(seq_len, 3)
    v_bytes = v_held * 2 * (8 + FP16)  # int8 per token: 8 bytes and an fp16 scale per head
    got = kv_cache_bytes_for(cfg, seq_len, k="int4/channel/g4/asym", v="int8", layout="transformers")
    assert got == 4 * (k_bytes + v_bytes)
    from kvviz import get_format
    from kvviz.cache import held_tokens  # the cache's own rule

    k_fmt, shape = get_format("int4/channel/g4/asym"), layer_shapes(cfg)[0]
    assert shape.held(seq_len, k_fmt, "transformers") == held_tokens(k_fmt, seq_len, 4) == k_held
    assert shape.held(seq_len, k_fmt, "engine") == min(seq_len, 4)  # engines keep the window, groups or not


def test_chunked_attention_by_hand():
    cfg = _tiny(model_type="llama4_text", attention_chunk_size=5, no_rope_layers=[1, 1, 1, 0])
    assert [s.kind for s in layer_shapes(cfg)] == ["chunked_attention"] * 3 + ["full_attention"]
    per_token = 2 * 2 * 8 * FP16
    assert kv_cache_bytes_for(cfg, 100) == (3 * 5 + 100) * per_token
    assert kv_cache_bytes_for(cfg, 100, layout="transformers") == (3 * 4 + 100) * per_token


def test_linear_attention_holds_no_kv_and_a_fixed_state():
    cfg = _tiny(model_type="qwen3_next", full_attention_interval=2, linear_num_key_heads=2, linear_key_head_dim=4,
                linear_num_value_heads=3, linear_value_head_dim=5, linear_conv_kernel_dim=4)
    assert [s.kind for s in layer_shapes(cfg)] == ["linear_attention", "full_attention"] * 2
    assert kv_cache_bytes_for(cfg, 7) == 2 * 2 * 7 * 2 * 8 * FP16
    conv_dim = 2 * 2 * 4 + 3 * 5  # q and k of every key head, v of every value head
    per_layer = conv_dim * (4 - 1) * FP16 + 3 * 4 * 5 * FP16  # conv [conv_dim, kernel-1] + state [v_heads, k, v]
    assert state_bytes_for(cfg, batch=2) == 2 * 2 * per_layer
    assert state_bytes_for(cfg, layout="transformers") == 2 * (conv_dim * 4 * FP16 + 3 * 4 * 5 * FP16)


def test_mamba_hybrid_and_mlp_layers():
    cfg = {"model_type": "nemotron_h", "hybrid_override_pattern": "M*-E", "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8, "hidden_size": 32,
           "mamba_num_heads": 4, "mamba_head_dim": 6, "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4}
    assert [s.kind for s in layer_shapes(cfg)] == ["linear_attention", "full_attention", "mlp", "mlp"]
    assert kv_cache_bytes_for(cfg, 9) == 2 * 9 * 1 * 8 * FP16
    conv = (4 * 6 + 2 * 2 * 16) * 3  # [heads*head_dim + 2*groups*state, d_conv - 1]
    assert state_bytes_for(cfg) == conv * FP16 + 4 * 6 * 16 * FP16
    assert state_bytes_for(cfg | {"mamba_ssm_cache_dtype": "float32"}) == conv * FP16 + 4 * 6 * 16 * 4


def test_falcon_h1_layers_hold_kv_and_state():
    cfg = _tiny(model_type="falcon_h1", hidden_size=32, mamba_d_ssm=48, mamba_n_heads=4, mamba_d_head=12,
                mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4)
    assert _kinds(cfg) == {"hybrid": 4}
    assert kv_cache_bytes_for(cfg, 5) == 4 * 2 * 5 * 2 * 8 * FP16
    assert state_bytes_for(cfg) == 4 * ((48 + 2 * 8) * 3 + 4 * 12 * 8) * FP16


def test_kv_shared_layers_hold_nothing_and_gemma4_global_layers_use_their_own_heads():
    cfg = _tiny(model_type="gemma4_text", num_hidden_layers=6, sliding_window=3, num_kv_shared_layers=2,
                global_head_dim=16, num_global_key_value_heads=1, attention_k_eq_v=True,
                layer_types=["sliding_attention", "full_attention"] * 3)
    shapes = layer_shapes(cfg)
    assert [s.kind for s in shapes] == ["sliding_attention", "full_attention"] * 2 + ["shared"] * 2
    assert (shapes[1].k_heads, shapes[1].k_dim) == (1, 16) and (shapes[0].k_heads, shapes[0].k_dim) == (2, 8)
    assert kv_cache_bytes_for(cfg, 10) == 2 * 2 * 3 * 2 * 8 * FP16 + 2 * 2 * 10 * 1 * 16 * FP16


@pytest.mark.parametrize("layout, k, v", [("engine", (1, 576), (0, 0)), ("transformers", (1, 512), (1, 64)),
                                          ("decompressed", (128, 192), (128, 128))])
def test_mla_layouts(layout, k, v):
    (shape, *_) = layer_shapes("deepseek-v3", layout)
    assert ((shape.k_heads, shape.k_dim), (shape.v_heads, shape.v_dim)) == (k, v)
    c = memory.MODEL_PRESETS["deepseek-v3"].config
    per_token = {"engine": c["kv_lora_rank"] + c["qk_rope_head_dim"],
                 "transformers": c["kv_lora_rank"] + c["qk_rope_head_dim"],
                 "decompressed": c["num_attention_heads"] * (c["qk_nope_head_dim"] + 2 * c["qk_rope_head_dim"]
                                                             + c["v_head_dim"] - c["qk_rope_head_dim"])}[layout]
    assert kv_cache_bytes_for("deepseek-v3", 1000, layout=layout) == c["num_hidden_layers"] * 1000 * per_token * FP16


def test_mla_engine_latent_takes_k_format():
    assert kv_cache_bytes_for("kimi-k2", 100, k="fp8") == 61 * 100 * 576 * 1 + 61 * 4  # one fp32 static scale


def test_a_per_layer_plan_is_summed_layer_by_layer():
    plan = ["fp16", "int8", "k8v4", "fp8"]
    expected = sum(kv_cache_bytes_for(_tiny(num_hidden_layers=1), 33, k=s) for s in plan)
    assert kv_cache_bytes_for(_tiny(), 33, k=plan) == expected
    with pytest.raises(ValueError, match="3 entries for a model with 4 layers"):
        kv_cache_bytes_for(_tiny(), 33, k=plan[:3])


# --- presets: structure, and figures from their own fields -----------------------------------------------------


def test_structural_facts():
    assert _kinds("gemma-3-27b") == {"sliding_attention": 52, "full_attention": 10}  # 5 sliding per 6
    assert [s.kind for s in layer_shapes("gemma-3-270m")][:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert [s.kind for s in layer_shapes("gpt-oss-20b")][:4] == ["sliding_attention", "full_attention"] * 2
    assert _kinds("gpt-oss-120b") == {"sliding_attention": 18, "full_attention": 18}
    assert [s.kind for s in layer_shapes("qwen3-next-80b-a3b")][:4] == ["linear_attention"] * 3 + ["full_attention"]
    assert _kinds("qwen3-next-80b-a3b") == {"linear_attention": 36, "full_attention": 12}
    assert [s.kind for s in layer_shapes("llama-4-scout")][:4] == ["chunked_attention"] * 3 + ["full_attention"]
    assert _kinds("gemma-2-9b") == {"sliding_attention": 21, "full_attention": 21}
    assert _kinds("nemotron-3-nano-30b-a3b")["full_attention"] == 6
    assert _kinds("qwen2.5-7b") == {"full_attention": 28}  # use_sliding_window false


@pytest.mark.parametrize("name", ["gemma-3-27b", "gpt-oss-120b", "llama-4-scout", "gemma-2-9b"])
@pytest.mark.parametrize("layout", ["engine", "transformers"])
def test_windowed_presets_by_hand_from_their_fields(name, layout):
    c = memory.MODEL_PRESETS[name].config
    t = 131072
    window = c.get("sliding_window") or c.get("attention_chunk_size")
    n_window = sum(s.window is not None for s in layer_shapes(name))
    held = window - 1 if layout == "transformers" else window
    per_token = 2 * c["num_key_value_heads"] * c["head_dim"] * FP16
    expected = (c["num_hidden_layers"] - n_window) * t * per_token + n_window * held * per_token
    assert kv_cache_bytes_for(name, t, layout=layout) == expected


def test_gemma_3_27b_is_a_sixth_of_counting_every_layer_in_full():
    c = memory.MODEL_PRESETS["gemma-3-27b"].config
    full = memory.kv_cache_bytes(c["num_hidden_layers"], c["num_key_value_heads"], c["head_dim"], 131072)
    assert kv_cache_bytes_for("gemma-3-27b", 131072) / full == pytest.approx((10 * 131072 + 52 * 1024) / (62 * 131072))
    assert round(full / 1e9, 2) == 66.57 and 1 / 6.1 < kv_cache_bytes_for("gemma-3-27b", 131072) / full < 1 / 5.9


def test_qwen3_next_and_nemotron_count_only_attention_layers():
    c = memory.MODEL_PRESETS["qwen3-next-80b-a3b"].config
    assert kv_cache_bytes_for("qwen3-next-80b-a3b", 1000) == 12 * 2 * 1000 * c["num_key_value_heads"] * 256 * FP16
    conv = (2 * 16 * 128 + 32 * 128) * 3 * FP16
    assert state_bytes_for("qwen3-next-80b-a3b") == 36 * (conv + 32 * 128 * 128 * FP16)
    assert kv_cache_bytes_for("nemotron-3-nano-30b-a3b", 1000) == 6 * 2 * 1000 * 2 * 128 * FP16


def test_a_config_file_and_a_preset_give_the_same_figure(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": memory.MODEL_PRESETS["gemma-3-27b"].config,
                                "vision_config": {"image_size": 896}}))
    assert kv_cache_bytes_for(path, 50000) == kv_cache_bytes_for(str(path), 50000) \
        == kv_cache_bytes_for(tmp_path, 50000) == kv_cache_bytes_for("gemma-3-27b", 50000)


# --- GPU fit for windowed models -------------------------------------------------------------------------------


def test_max_context_of_a_sliding_window_model_is_exact():
    budget = memory.kv_budget_bytes("gemma-3-27b", "h100-80gb")
    t = memory.max_context("gemma-3-27b", "h100-80gb", "fp8")
    assert kv_cache_bytes_for("gemma-3-27b", t, k="fp8") <= budget < kv_cache_bytes_for("gemma-3-27b", t + 1, k="fp8")


def test_a_cache_that_stops_growing_fits_any_context():
    m = memory.resolve_model(_tiny(sliding_window=4096), params=1e9)
    assert memory.max_context(m, "l4") == memory.CONTEXT_CAP
    assert memory.max_batch(m, "l4", 10**6) == memory.max_batch(m, "l4", 4096)


def test_recurrent_state_is_charged_per_sequence():
    budget = memory.kv_budget_bytes("qwen3-next-80b-a3b", "b200")
    b = memory.max_batch("qwen3-next-80b-a3b", "b200", 32768)
    per_seq = kv_cache_bytes_for("qwen3-next-80b-a3b", 32768) + state_bytes_for("qwen3-next-80b-a3b")
    assert b * per_seq <= budget < (b + 1) * per_seq


def test_a_config_without_params_needs_them_for_a_gpu():
    with pytest.raises(ValueError, match="parameter count"):
        memory.max_context(_tiny(), "l4")
    assert memory.max_context(memory.resolve_model(_tiny(), params=1e9), "l4") > 0


# --- transformers' config classes ------------------------------------------------------------------------------

_TF_KIND = {"dummy": ("shared", "mlp"), "hybrid": ("hybrid",)}


def _transformers_configs():
    import transformers as tf

    return {
        "gemma3": tf.Gemma3TextConfig(num_hidden_layers=12, sliding_window=64),
        "gemma2": tf.Gemma2Config(num_hidden_layers=4),
        "gemma3n": tf.Gemma3nTextConfig(),
        "gemma4": tf.Gemma4TextConfig(num_hidden_layers=12, num_kv_shared_layers=4),
        "gemma4_global_heads": tf.Gemma4TextConfig(num_hidden_layers=6, num_global_key_value_heads=1,
                                                   attention_k_eq_v=True),
        "gpt_oss": tf.GptOssConfig(num_hidden_layers=6),
        "llama4": tf.Llama4TextConfig(num_hidden_layers=8),
        "qwen3_next": tf.Qwen3NextConfig(num_hidden_layers=8),
        "qwen2_sliding": tf.Qwen2Config(num_hidden_layers=6, use_sliding_window=True, sliding_window=32,
                                        max_window_layers=2),
        "mistral": tf.MistralConfig(num_hidden_layers=2),
        "falcon_h1": tf.FalconH1Config(num_hidden_layers=3),
        "granite_h": tf.GraniteMoeHybridConfig(num_hidden_layers=4, layer_types=["mamba", "attention"] * 2),
        "nemotron_h": tf.NemotronHConfig(),
        "deepseek_v3": tf.DeepseekV3Config(num_hidden_layers=3),
    }


@pytest.fixture(scope="module")
def tf_configs():
    return _transformers_configs()


@pytest.mark.parametrize("name", ["gemma3", "gemma2", "gemma3n", "gemma4", "gemma4_global_heads", "gpt_oss", "llama4",
                                  "qwen3_next", "qwen2_sliding", "mistral", "falcon_h1", "granite_h", "nemotron_h",
                                  "deepseek_v3"])
def test_transformers_configs_give_transformers_layer_kinds(tf_configs, name):
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = tf_configs[name]
    theirs, kwargs = get_layer_types_and_kwargs(config)
    ours = layer_shapes(config, "transformers")
    assert len(ours) == len(theirs)
    for shape, kind, kw, layer_cfg in zip(ours, theirs, kwargs, config.per_layer_config):
        assert shape.kind in _TF_KIND.get(kind, (kind,)), (shape.index, shape.kind, kind)
        assert shape.window == kw.get("sliding_window"), shape
        if shape.has_kv and "kv_lora_rank" not in config.to_dict():
            head_dim = getattr(layer_cfg, "head_dim", None) or layer_cfg.hidden_size // layer_cfg.num_attention_heads
            assert (shape.k_heads, shape.k_dim) == (layer_cfg.num_key_value_heads, head_dim), shape
    # the same fields saved as config.json (what save_pretrained writes) give the same shapes
    assert layer_shapes(json.loads(config.to_json_string()), "transformers") == ours


def test_transformers_kinds_have_the_documented_counts(tf_configs):
    assert _kinds(tf_configs["gemma3"]) == {"sliding_attention": 10, "full_attention": 2}
    assert _kinds(tf_configs["gemma4"]) == {"sliding_attention": 7, "full_attention": 1, "shared": 4}
    assert _kinds(tf_configs["llama4"]) == {"chunked_attention": 6, "full_attention": 2}
    assert _kinds(tf_configs["qwen3_next"]) == {"linear_attention": 6, "full_attention": 2}
    shapes = layer_shapes(tf_configs["gemma4_global_heads"])
    assert (shapes[5].k_heads, shapes[5].k_dim) == (1, 512) and shapes[0].k_dim == 256


def test_dense_transformers_layout_equals_the_quantized_cache(tf_configs):
    import torch

    from kvviz import QuantizedKVCache, tiny_model

    model, _ = tiny_model("llama")
    for spec in ("fp16", "int8", "k8v4"):
        cache = QuantizedKVCache(model.config, spec)
        with torch.no_grad():
            model(torch.randint(0, 256, (2, 37)), past_key_values=cache, use_cache=True)
            model(torch.randint(0, 256, (2, 1)), past_key_values=cache, use_cache=True)
        assert cache.nbytes() == kv_cache_bytes_for(model.config, 38, batch=2, k=spec, layout="transformers"), spec


# --- bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config, says", [
    ({"model_type": "siglip_vision_model", "image_size": 224, "patch_size": 14, "num_hidden_layers": 12,
      "num_attention_heads": 12}, "vision encoder"),
    ({"model_type": "llava", "vision_config": {"image_size": 336}}, "no text_config"),
    ({"model_type": "bert", "architectures": ["BertForMaskedLM"], "num_hidden_layers": 12,
      "num_attention_heads": 12, "vocab_size": 30522}, "encoder"),
    ({"hello": "world"}, "num_hidden_layers"),
    (_tiny(layer_types=["full_attention"] * 3), "3 entries for 4 layers"),
    (_tiny(layer_types=["telepathy"] * 4), "Unknown layer type"),
    (_tiny(num_key_value_heads="eight"), "num_key_value_heads"),
    (_tiny(model_type="gpt_oss", layer_types=["sliding_attention"] * 4), "sliding_window"),
    ("", "Give a model"),
    (42, "Give a model"),
])
def test_bad_configs_say_what_is_missing(config, says):
    with pytest.raises(ValueError, match=says):
        kv_cache_bytes_for(config, 10)


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match="No config file"):
        kv_cache_bytes_for(tmp_path / "nope" / "config.json", 10)
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe not text")
    with pytest.raises(ValueError, match="Cannot read"):
        kv_cache_bytes_for(bad, 10)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        kv_cache_bytes_for(bad, 10)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON list"):
        kv_cache_bytes_for(bad, 10)
    bad.write_text(" " * (memory.MAX_CONFIG_BYTES + 1))
    with pytest.raises(ValueError, match="limit 1 MB"):
        kv_cache_bytes_for(bad, 10)


def test_an_unreachable_hub_id_fails_fast_and_names_the_id(monkeypatch):
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="Cannot reach the Hugging Face hub for 'nobody/no-such-model'"):
        kv_cache_bytes_for("nobody/no-such-model", 10)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "https://127.0.0.1:9")  # a closed port: refused at once
    start = time.monotonic()
    with pytest.raises(ValueError, match="nobody/no-such-model"):
        kv_cache_bytes_for("nobody/no-such-model", 10)
    assert time.monotonic() - start < 10


def test_memory_curves_sample_the_window_edge_and_sum_the_windowed_layers():
    """kvviz.memory.curves (the Memory tab's chart): geometric contexts plus each window's edge; every point is the
    cache model's own bytes; the windowed series holds the sliding layers alone and flattens past the window."""
    from kvviz.formats import as_plan

    gemma, llama = memory.get_model_preset("gemma-3-270m"), memory.get_model_preset("llama-3.1-8b")
    plan = as_plan("int4")
    plan.resolve(gemma.layers)
    plans = {"int4": plan}
    curves = memory.memory_curves(gemma, plans, lo=64, hi=4096, batch=2, points=8)
    assert 512 in curves.contexts and curves.contexts == sorted(set(curves.contexts)) and len(curves.contexts) == 9
    cache = curves.caches["int4"]
    assert curves.gb["int4"] == [cache.bytes(x, 2) / memory.GB for x in curves.contexts]
    windowed = curves.windowed_gb["int4"]
    assert windowed == [memory.windowed_bytes(cache, x, 2) / memory.GB for x in curves.contexts]
    assert 0 < windowed[0] < curves.gb["int4"][0] and windowed[-1] == windowed[curves.contexts.index(512) + 1]
    flat = memory.memory_curves(llama, {"int4": as_plan("int4")}, 64, 4096)
    assert flat.windowed_gb == {} and len(flat.contexts) == memory.curves.POINTS
