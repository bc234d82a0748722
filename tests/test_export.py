"""Tests for kvviz.export: every base format is either mapped to the engine's real flag or reported unsupported."""

from __future__ import annotations

import pytest

from kvviz import formats
from kvviz.export import ENGINES, export_commands, export_table

# base format -> (vLLM --kv-cache-dtype or None, SGLang --kv-cache-dtype or None), default granularity.
EXPECTED = {
    "fp16": ("float16", "auto"),
    "bf16": ("bfloat16", "bf16"),
    "fp8_e4m3": ("fp8_e4m3", "fp8_e4m3"),
    "fp8_e5m2": ("fp8_e5m2", "fp8_e5m2"),
    "int8": ("int8_per_token_head", None),
    "int4": (None, None),
    "int2": (None, None),
    "mxfp4": (None, None),
    "fp4_mx_block16": (None, "fp4_mx_block16"),
    "nvfp4": ("nvfp4", "nvfp4"),
}


def test_expected_covers_every_base_format():
    assert set(EXPECTED) == set(formats.FORMAT_NAMES)


@pytest.mark.parametrize("base", formats.FORMAT_NAMES)
@pytest.mark.parametrize("engine", ENGINES)
def test_every_base_format(base, engine):
    out = export_commands(base, model="org/model")[engine]
    want = EXPECTED[base][ENGINES.index(engine)]
    assert set(out) == {"supported", "kv_cache_dtype", "cli", "python", "note"}
    assert out["supported"] is (want is not None)
    assert out["kv_cache_dtype"] == want
    assert out["note"], "every answer explains itself"
    if want is None:
        assert out["cli"] == "" and out["python"] == ""
    else:
        assert f"--kv-cache-dtype {want}" in out["cli"] and "org/model" in out["cli"]
        assert f'kv_cache_dtype="{want}"' in out["python"]


def test_sglang_fp8_scale_file():
    out = export_commands("fp8", scales_path="my_scales.json")["sglang"]
    assert out["cli"].endswith("--kv-cache-dtype fp8_e4m3 --quantization-param-path my_scales.json")
    assert 'quantization_param_path="my_scales.json"' in out["python"]
    bare = export_commands("fp8", scales_path=None)["sglang"]
    assert "--quantization-param-path" not in bare["cli"] and "1.0" in bare["note"]
    # The scale file is E4M3-only in SGLang's schema.
    assert "--quantization-param-path" not in export_commands("fp8_e5m2")["sglang"]["cli"]


def test_vllm_fp8_calculates_scales():
    out = export_commands("fp8_e4m3")["vllm"]
    assert "--calculate-kv-scales" in out["cli"] and "calculate_kv_scales=True" in out["python"]


@pytest.mark.parametrize("spec", ["k8v4", "k4v8", "kivi2", "kivi4", "k=fp8_e4m3,v=fp8_e5m2"])
def test_pairs_and_presets_are_unsupported(spec):
    out = export_commands(spec)
    for engine in ENGINES:
        assert out[engine]["supported"] is False and out[engine]["note"]


@pytest.mark.parametrize("spec,engine", [
    ("int4/token", "vllm"),              # the example: not a vLLM KV dtype
    ("fp8_e4m3/token", "sglang"),        # SGLang: per-tensor only
    ("fp8_e4m3/head", "vllm"),
    ("int8/channel", "vllm"),
    ("int8/g32", "vllm"),
    ("fp8_e4m3/rot", "sglang"),
])
def test_finer_granularities_are_not_mapped_silently(spec, engine):
    out = export_commands(spec)[engine]
    assert out["supported"] is False and out["kv_cache_dtype"] is None


def test_fp8_per_token_head_in_vllm():
    assert export_commands("fp8/token")["vllm"]["kv_cache_dtype"] == "fp8_per_token_head"


def test_bad_spec_is_value_error():
    with pytest.raises(ValueError):
        export_commands("int3")


def test_export_table():
    rows = export_table(["fp8", "k8v4"])
    assert rows == [{"spec": "fp8_e4m3", "vllm": "fp8_e4m3", "sglang": "fp8_e4m3"},
                    {"spec": "k=int8,v=int4", "vllm": None, "sglang": None}]
