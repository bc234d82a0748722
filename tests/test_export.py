"""Tests for kvviz.export: every base format is either mapped to the engine's real flag or reported unsupported.

    python -m pytest tests/test_export.py -q
"""

from __future__ import annotations

import pytest

from kvviz import formats
from kvviz.export import export_commands, export_table
from kvviz.formats import ENGINE_NAMES

# base format -> (vLLM --kv-cache-dtype, SGLang --kv-cache-dtype, llama.cpp -ctk/-ctv type; None: unsupported),
# default granularity.
EXPECTED = {
    "fp16": ("float16", "auto", "f16"),
    "bf16": ("bfloat16", "bf16", "bf16"),
    "fp8_e4m3": ("fp8_e4m3", "fp8_e4m3", None),
    "fp8_e5m2": ("fp8_e5m2", "fp8_e5m2", None),
    "int8": ("int8_per_token_head", None, None),
    "int4": (None, None, None),
    "int2": (None, None, None),
    "mxfp4": (None, None, None),
    "fp4_mx_block16": (None, "fp4_mx_block16", None),
    "nvfp4": ("nvfp4", "nvfp4", None),
    "q8_0": (None, None, "q8_0"),
    "q4_0": (None, None, "q4_0"),
    "q4_1": (None, None, "q4_1"),
    "q5_0": (None, None, "q5_0"),
    "q5_1": (None, None, "q5_1"),
    "iq4_nl": (None, None, "iq4_nl"),
    **{f"tq_mse{b}": (None, None, None) for b in (1, 2, 3, 4)},  # the TurboQuant paper's: no engine stores them
    **{f"tq_prod{b}": (None, None, None) for b in (2, 3, 4)},
}


def test_expected_covers_every_base_format():
    assert set(EXPECTED) == set(formats.FORMAT_NAMES)


@pytest.mark.parametrize("base", formats.FORMAT_NAMES)
@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_every_base_format(base, engine):
    out = export_commands(base, model="org/model")[engine]
    want = EXPECTED[base][ENGINE_NAMES.index(engine)]
    assert set(out) == {"supported", "kv_cache_dtype", "flags", "cli", "python", "note"}
    assert out["supported"] is (want is not None)
    assert out["kv_cache_dtype"] == want
    assert out["note"], "every answer explains itself"
    if want is None:
        assert out["cli"] == "" and out["python"] == "" and out["flags"] == ""
    elif engine == "llama.cpp":
        assert out["flags"].startswith(f"-ctk {want} -ctv {want}") and out["flags"] in out["cli"]
        assert "-m org/model" in out["cli"] and 'model_path="org/model"' in out["python"]
        assert f"type_k=llama_cpp.GGML_TYPE_{want.upper()}" in out["python"]
    else:
        assert out["flags"].startswith(f"--kv-cache-dtype {want}") and out["flags"] in out["cli"]
        assert "org/model" in out["cli"]
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


@pytest.mark.parametrize("spec", ["k8v4", "k4v8", "kivi2", "kivi4", "k=fp8_e4m3,v=fp8_e5m2", "k=q8_0,v=int4",
                                  "k=int8,v=q4_0"])
def test_pairs_and_presets_are_unsupported(spec):
    out = export_commands(spec)
    for engine in ENGINE_NAMES:
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
    assert rows == [{"spec": "fp8_e4m3", "vllm": "fp8_e4m3", "sglang": "fp8_e4m3", "llama.cpp": None},
                    {"spec": "k=int8,v=int4", "vllm": None, "sglang": None, "llama.cpp": None}]
    assert export_table(["k=q8_0,v=q4_0"]) == [
        {"spec": "k=q8_0,v=q4_0", "vllm": None, "sglang": None, "llama.cpp": "k=q8_0,v=q4_0"}]


# -- llama.cpp -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, flags", [
    ("k=q8_0,v=q4_0", "-ctk q8_0 -ctv q4_0 -fa on"),
    ("k=q4_0,v=q8_0", "-ctk q4_0 -ctv q8_0 -fa on"),
    ("iq4_nl", "-ctk iq4_nl -ctv iq4_nl -fa on"),
    ("k=q5_1,v=fp16", "-ctk q5_1 -ctv f16"),  # only a quantized V needs flash attention
    ("k=fp16,v=q5_0", "-ctk f16 -ctv q5_0 -fa on"),
    ("bf16", "-ctk bf16 -ctv bf16"),
])
def test_llama_cpp_flags(spec, flags):
    out = export_commands(spec, model="model.gguf")["llama.cpp"]
    assert out["supported"] and out["flags"] == flags
    assert out["cli"].endswith(f"llama-server -m model.gguf {flags}")
    quantized = "q" in flags
    # kvviz's formats are unrotated: llama.cpp (since April 2026) rotates a quantized cache unless told not to
    assert out["cli"].startswith("LLAMA_ATTN_ROT_DISABLE=1 ") is quantized
    assert ('os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"' in out["python"]) is quantized
    assert ("flash_attn=True" in out["python"]) is flags.endswith("-fa on")
    assert "GGUF" not in out["note"]  # a .gguf path needs no conversion hint


@pytest.mark.parametrize("spec", ["q8_0", "k=q8_0,v=q4_0", "iq4_nl"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_llama_cpp_types_are_never_mapped_to_vllm_or_sglang(spec, engine):
    out = export_commands(spec)[engine]
    assert out["supported"] is False and out["kv_cache_dtype"] is None and out["cli"] == ""
    assert "llama.cpp" in out["note"]


@pytest.mark.parametrize("spec, fragment", [
    ("q4_0/rot", "Hadamard"),  # llama.cpp's own rotation is not checked against kvviz's /rot
    ("int8", "closest is q8_0"),
    ("fp8_e4m3", "no fp8_e4m3 KV cache type"),
    ("kivi2", "residual window"),
    ("fp16/rot", "drop /rot"),
])
def test_llama_cpp_refusals_say_why(spec, fragment):
    out = export_commands(spec)["llama.cpp"]
    assert out["supported"] is False and out["cli"] == "" and fragment in out["note"]
    assert out["note"].count("llama.cpp has no") <= 1  # one format for K and V is explained once


@pytest.mark.parametrize("spec, warned", [
    ("q8_0", False), ("q4_0", False), ("fp16", False), ("bf16", False),
    ("k=q8_0,v=q4_0", True), ("q5_1", True), ("iq4_nl", True), ("k=fp16,v=q4_0", True),
])
def test_llama_cpp_warns_where_cuda_flash_attention_needs_all_quants(spec, warned):
    """A default CUDA build compiles flash attention for f16/f16, q8_0/q8_0 and q4_0/q4_0 only; other pairs fall
    back to CPU attention without a word (llama.cpp issue 24485)."""
    out = export_commands(spec, model="m.gguf")["llama.cpp"]
    assert out["supported"] and ("GGML_CUDA_FA_ALL_QUANTS" in out["note"]) is warned


@pytest.mark.parametrize("spec,engine,flags", [
    ("vllm:turboquant_k3v4_nc", "vllm", "--kv-cache-dtype turboquant_k3v4_nc"),
    ("vllm:int4_per_token_head", "vllm", "--kv-cache-dtype int4_per_token_head"),
    ("vllm:fp8_e5m2/cpu", "vllm", "--kv-cache-dtype fp8_e5m2"),
    ("sglang:fp4_mx_block16", "sglang", "--kv-cache-dtype fp4_mx_block16"),
    ("llama.cpp:q4_0", "llama.cpp", "-ctk q4_0 -ctv q4_0 -fa on"),
])
def test_engine_names_export_exactly_that_flag(spec, engine, flags):
    out = export_commands(spec, model="org/model")
    assert out[engine]["supported"] and out[engine]["flags"] == flags
    others = [e for e in ENGINE_NAMES if e != engine]
    assert not any(out[e]["supported"] for e in others)
    assert all(f"{e}:" in out[e]["note"] for e in others)


def test_llama_cpp_rotation_follows_the_name():
    """llama.cpp:<type> is llama.cpp's default (rotated); /norot and bare ggml types disable the rotation."""
    assert "LLAMA_ATTN_ROT_DISABLE" not in export_commands("llama.cpp:q4_0")["llama.cpp"]["cli"]
    assert export_commands("llama.cpp:q4_0/norot")["llama.cpp"]["cli"].startswith("LLAMA_ATTN_ROT_DISABLE=1 ")
    assert export_commands("q4_0")["llama.cpp"]["cli"].startswith("LLAMA_ATTN_ROT_DISABLE=1 ")
