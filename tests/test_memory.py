"""Tests for kvviz.memory: the seeds' figures, the presets, exact bytes against the format registry, GPU fit."""

from __future__ import annotations

import pytest
import torch

import kvviz
from kvviz import memory
from kvviz.memory import kv_cache_bytes, max_batch, max_context


def test_seed_70b_fp16_32k_is_10_7_gb_per_sequence():
    nbytes = kv_cache_bytes(80, 8, 128, 32768, k="fp16")
    assert nbytes == 2 * 80 * 32768 * 8 * 128 * 2 == 10_737_418_240
    assert round(nbytes / 1e9, 1) == 10.7
    assert memory.model_kv_bytes("llama-3.1-70b", 32768, "fp16") == nbytes


@pytest.mark.parametrize("other, ratio", [("bf16", 3.56), ("fp8", 1.78)])
def test_seed_fp4_block16_holds_more_tokens(other, ratio):
    assert kvviz.get_format("fp4_mx_block16").bits_per_value(128) == 4.5
    fit = dict(gpus=4)  # 70B in bf16 needs more than one 80 GB GPU
    fp4 = max_context("llama-3.1-70b", "h100-80gb", "fp4_mx_block16", **fit)
    assert round(fp4 / max_context("llama-3.1-70b", "h100-80gb", other, **fit), 2) == ratio


# (layers, q_heads, kv_heads, head_dim, params, max_context) from the official config.json files
@pytest.mark.parametrize("name, dims", [
    ("smollm2-135m", (30, 9, 3, 64, 134.5e6, 8192)),
    ("llama-3.1-8b", (32, 32, 8, 128, 8.03e9, 131072)),
    ("llama-3.1-70b", (80, 64, 8, 128, 70.6e9, 131072)),
    ("qwen2.5-7b", (28, 28, 4, 128, 7.62e9, 32768)),
    ("mistral-7b-v0.3", (32, 32, 8, 128, 7.25e9, 32768)),
    ("gemma-2-9b", (42, 16, 8, 256, 9.24e9, 8192)),
])
def test_model_presets_match_configs(name, dims):
    m = kvviz.get_model_preset(name)
    assert (m.layers, m.q_heads, m.kv_heads, m.head_dim, m.params, m.max_context) == dims


@pytest.mark.parametrize("name", list(memory.MODEL_PRESETS))
def test_model_presets_are_consistent(name):
    m = memory.MODEL_PRESETS[name]
    assert m.name == name and m.source and m.params > 1e8 and m.max_context >= 8192
    shapes = memory.layer_shapes(m)
    assert len(shapes) == m.layers, "one shape per layer of num_hidden_layers"
    kv = [s for s in shapes if s.has_kv]
    assert kv, "every preset has attention somewhere"
    if "kv_lora_rank" not in m.config:
        assert all(m.q_heads % s.k_heads == 0 for s in kv), "GQA needs whole groups of query heads"
        assert all(s.k_dim in (64, 128, 256, 512) for s in kv)
    assert memory.kv_cache_bytes_for(name, 4096) > 0


def test_issue_list_is_covered():
    assert len(memory.MODEL_PRESETS) >= 15
    assert {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-4-scout", "qwen2.5-7b", "qwen2.5-72b",
            "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-next-80b-a3b", "gemma-3-270m",
            "gemma-3-27b", "gemma-4-31b", "gpt-oss-20b", "gpt-oss-120b", "deepseek-v3", "kimi-k2",
            "mistral-small-3-24b", "phi-4", "nemotron-3-nano-30b-a3b", "smollm2-135m"} <= set(memory.MODEL_PRESETS)


def test_gemma_4_31b_matches_an_independent_count():
    """An independent KV calculator's figure for Gemma 4 31B in bf16 at 131072 tokens (K and V both stored, 50
    sliding layers of 1024 tokens x 16 heads x 256, 10 global layers x 4 heads x 512): 11,576,279,040 bytes."""
    sliding = 50 * 1024 * 16 * 256 * 2 * 2
    full = 10 * 131072 * 4 * 512 * 2 * 2
    assert sliding + full == 11_576_279_040
    assert memory.kv_cache_bytes_for("gemma-4-31b", 131072, k="bf16") == sliding + full


def test_llama_8b_fp16_is_128_kib_per_token():
    assert memory.model_kv_bytes("llama-3.1-8b", 1) == 131072


def test_gpu_presets_are_decimal_gb():
    assert kvviz.GPU_PRESETS["h100-80gb"].bytes == 80 * 10**9
    assert memory.get_gpu_preset("H200").memory_gb == 141
    assert set(kvviz.GPU_PRESETS) >= {"l4", "a10g", "a100-40gb", "a100-80gb", "h100-80gb", "h200", "rtx-4090", "b200"}


@pytest.mark.parametrize("spec", ["fp16", "bf16", "fp8", "fp8_e5m2/token", "int8", "int4/g32/asym", "int2",
                                  "mxfp4", "fp4_mx_block16", "nvfp4", "int8/tensor"])
@pytest.mark.parametrize("seq_len", [0, 1, 100, 4096])
def test_bytes_equal_the_registry_for_one_sequence(spec, seq_len):
    fmt = kvviz.get_format(spec)
    layers, heads, dim = 3, 4, 64
    assert kv_cache_bytes(layers, heads, dim, seq_len, k=spec) == layers * 2 * fmt.nbytes_for((1, heads, seq_len, dim))


def test_static_scales_are_counted_once_per_layer():
    fmt = kvviz.get_format("int8/head")
    one = fmt.nbytes_for((1, 4, 100, 64))
    static = fmt.static_bytes((1, 4, 100, 64))
    assert static == 4 * 4  # one fp32 scale per head
    assert kv_cache_bytes(2, 4, 64, 100, batch=3, k="int8/head") == 2 * 2 * (3 * one - 2 * static)


@pytest.mark.parametrize("seq_len", [0, 31, 32, 33, 100, 128])
def test_channel_formats_keep_an_fp16_residual_window(seq_len):
    fmt = kvviz.get_format("int2/channel/g32/asym")
    residual = seq_len % 32
    expected = fmt.nbytes_for((2, 4, seq_len - residual, 64)) + 2 * 4 * residual * 64 * 2
    assert kv_cache_bytes(1, 4, 64, seq_len, batch=2, k="int2/channel/g32/asym", v="fp16") == \
        expected + kvviz.get_format("fp16").nbytes_for((2, 4, seq_len, 64))


@pytest.mark.parametrize("spec", ["k8v4", "k=int8,v=int4", "kivi2"])
def test_pair_specs_and_presets(spec):
    assert kv_cache_bytes(2, 4, 64, 64, k=kvviz.get_format("int4")) == kv_cache_bytes(2, 4, 64, 64, k="int4")
    kv = kvviz.parse_kv(spec)
    assert kv_cache_bytes(2, 4, 64, 64, k=spec) == kv_cache_bytes(2, 4, 64, 64, k=kv.k.spec, v=kv.v.spec,
                                                              residual=kv.residual)
    assert kv_cache_bytes(2, 4, 64, 64, k=kv) == kv_cache_bytes(2, 4, 64, 64, k=spec)


@pytest.mark.parametrize("spec", ["fp16", "fp8", "int4/asym", "nvfp4", "int4/head"])
def test_bytes_match_a_real_quantized_tensor(spec):
    x = torch.randn(1, 2, 48, 64)  # [batch, kv_heads, seq, head_dim]
    q = kvviz.get_format(spec).quantize(x)
    assert kv_cache_bytes(1, 2, 64, 48, k=spec) == 2 * q.nbytes


def test_max_context_grows_as_bits_shrink():
    specs = ["fp16", "fp8/token", "int8", "fp8", "k8v4", "kivi4", "fp4_mx_block16", "nvfp4", "mxfp4", "int4",
             "int4/head", "kivi2", "int2"]
    specs.sort(key=lambda s: -kvviz.parse_kv(s).bits_per_value(128))
    longest = [max_context("llama-3.1-8b", "l4", s) for s in specs]
    assert longest == sorted(longest), dict(zip(specs, longest))
    assert longest[0] < longest[-1]


@pytest.mark.parametrize("spec", ["fp16", "fp8", "k8v4", "kivi2", "int2/channel/g32/asym",
                                  "k=int4/channel/g16/asym,v=int2/channel/g24"])
@pytest.mark.parametrize("batch", [1, 3])
def test_max_context_is_the_longest_that_fits(spec, batch):
    m = kvviz.get_model_preset("llama-3.1-8b")
    budget = memory.kv_budget_bytes(m, "a10g")  # dense model: no recurrent state
    t = max_context(m, "a10g", spec, batch=batch)
    assert kv_cache_bytes(m.layers, m.kv_heads, m.head_dim, t, batch, spec) <= budget
    for longer in range(t + 1, t + 97):  # channel formats shrink when a group fills: look past whole groups
        assert kv_cache_bytes(m.layers, m.kv_heads, m.head_dim, longer, batch, spec) > budget


@pytest.mark.parametrize("spec", ["fp16", "mxfp4", "kivi4"])
def test_max_batch_is_the_largest_that_fits(spec):
    m = kvviz.get_model_preset("qwen2.5-7b")
    budget = memory.kv_budget_bytes(m, "a100-80gb")
    b = max_batch(m, "a100-80gb", 8192, spec)
    assert b > 1
    assert kv_cache_bytes(m.layers, m.kv_heads, m.head_dim, 8192, b, spec) <= budget
    assert kv_cache_bytes(m.layers, m.kv_heads, m.head_dim, 8192, b + 1, spec) > budget


def test_nothing_fits_when_the_weights_do_not():
    assert memory.kv_budget_bytes("llama-3.1-70b", "h100-80gb") < 0
    assert max_context("llama-3.1-70b", "h100-80gb", "fp16") == 0
    assert max_batch("llama-3.1-70b", "h100-80gb", 1024, "fp16") == 0
    assert max_context("llama-3.1-70b", "h100-80gb", "fp16", weight_bytes_per_param=0.5) > 0


def test_memory_table_rows():
    rows = memory.memory_table("llama-3.1-70b", "fp16,k=int8,v=int4,mxfp4", 32768, "h100-80gb", gpus=4)
    assert [r["format"] for r in rows] == ["fp16", "k=int8,v=int4", "mxfp4"]
    assert rows[0]["bytes"] == 10_737_418_240 and rows[0]["tokens_vs_fp16"] == 1
    assert (rows[1]["k_bits"], rows[1]["v_bits"]) == (8.125, 4.125)
    assert rows[2]["max_context"] == max_context("llama-3.1-70b", "h100-80gb", "mxfp4", gpus=4)
    assert rows[2]["beyond_model_context"] is True
    assert memory.memory_table("smollm2-135m", ["fp8"], 512)[0]["max_batch"] is None


def test_memory_table_at_a_batch():
    (row,) = memory.memory_table("llama-3.1-8b", ["k8v4"], 4096, "l4", batch=3)
    assert row["bytes"] == memory.model_kv_bytes("llama-3.1-8b", 4096, "k8v4", batch=3)
    assert row["max_context"] == max_context("llama-3.1-8b", "l4", "k8v4", batch=3)
    assert row["max_batch"] == max_batch("llama-3.1-8b", "l4", 4096, "k8v4")


def test_split_formats_keeps_pairs_whole():
    assert memory.split_formats(" fp16, k=int8 , v=int4,kivi2,") == ["fp16", "k=int8,v=int4", "kivi2"]
    assert memory.split_formats("vllm:fp8,llama.cpp:k=q8_0,v=q4_0/norot,q4_0") == [
        "vllm:fp8", "llama.cpp:k=q8_0,v=q4_0/norot", "q4_0"]  # an engine's pair name stays whole


@pytest.mark.parametrize("call, match", [
    (lambda: kvviz.get_model_preset("gpt-5"), "llama-3.1-8b"),
    (lambda: memory.kv_cache_bytes_for("gpt-5", 10), "Unknown model 'gpt-5'"),
    (lambda: memory.get_gpu_preset("h900"), "h100-80gb"),
    (lambda: kv_cache_bytes(32, 8, 128, -1), "seq_len"),
    (lambda: kv_cache_bytes(0, 8, 128, 10), "layers"),
    (lambda: kv_cache_bytes(32, 8, 128, 10, k="int5"), "Unknown KV format"),
    (lambda: max_context("llama-3.1-8b", "l4", reserve_fraction=1.0), "reserve_fraction"),
    (lambda: max_batch("llama-3.1-8b", "l4", 0), "context"),
    (lambda: memory.memory_table("llama-3.1-8b", "", 10), "at least one"),
])
def test_bad_arguments_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("seq_len", [10, 32, 100, 1000])
def test_preset_residual_window_is_counted(seq_len):
    kv = kvviz.parse_kv("kivi2")
    excess = max(seq_len - 32, 0)
    quantized = excess - excess % 32  # K is per channel in groups of 32 tokens
    k = kv.k.nbytes_for((1, 4, quantized, 64)) + 4 * (seq_len - quantized) * 64 * 2
    v = kv.v.nbytes_for((1, 4, excess, 64)) + 4 * (seq_len - excess) * 64 * 2
    assert kvviz.kv_cache_bytes(1, 4, 64, seq_len, k="kivi2") == k + v
    assert kvviz.kv_cache_bytes(1, 4, 64, seq_len, k="kivi2", residual=0) < k + v or seq_len < 32


# -- llama.cpp's KV cache types (kvviz/formats/ggml.py): blocks of 32 values, fp16 d (+ fp16 m) per block -----------
@pytest.mark.parametrize("spec, bits", [("q8_0", 8.5), ("q4_0", 4.5), ("q4_1", 5.0), ("q5_0", 5.5), ("q5_1", 6.0),
                                        ("iq4_nl", 4.5)])
def test_llama_cpp_types_bits_and_bytes(spec, bits):
    for head_dim in (64, 128, 256):  # the block scales do not depend on head_dim: 16 (or 32) bits per 32 values
        assert kvviz.get_format(spec).bits_per_value(head_dim) == bits
    fp16 = kv_cache_bytes(80, 8, 128, 32768, k="fp16")
    assert kv_cache_bytes(80, 8, 128, 32768, k=spec) * 16 == fp16 * bits
    assert memory.model_kv_bytes("llama-3.1-70b", 32768, spec) * 16 == fp16 * bits


def test_llama_cpp_pair_counts_each_side():
    # k=q8_0,v=q4_0: (8.5 + 4.5) / 2 = 6.5 bits per value on average
    fp16 = kv_cache_bytes(80, 8, 128, 32768, k="fp16")
    assert kv_cache_bytes(80, 8, 128, 32768, k="k=q8_0,v=q4_0") * 16 == fp16 * 6.5
    assert kv_cache_bytes(80, 8, 128, 32768, k="q8_0", v="q4_0") * 16 == fp16 * 6.5


def test_memory_table_takes_a_per_layer_plan():
    """A plan (one spec per layer) is one row: its bytes are its layers' sum, its bits per value their mean."""
    plan = ["fp16"] * 16 + ["int4"] * 16
    fp16, int4, mixed = memory.memory_table("llama-3.1-8b", ["fp16", "int4", plan], 4096)
    assert mixed["format"] == "fp16; 16-31=int4"
    assert mixed["bytes"] == (fp16["bytes"] + int4["bytes"]) // 2
    assert mixed["k_bits"] == pytest.approx((fp16["k_bits"] + int4["k_bits"]) / 2)
    assert mixed["v_bits"] == pytest.approx((fp16["v_bits"] + int4["v_bits"]) / 2)
    with pytest.raises(ValueError, match="31 entries for a model with 32 layers"):
        memory.memory_table("llama-3.1-8b", [plan[:31]], 4096)
