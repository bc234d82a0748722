"""Where an FP8 per-tensor / per-head scale comes from (`/first`, `/unit`, `/calibrated`, `/dynamic`), and the
warnings about it: a static scale fitted on fewer than 64 tokens, and K / V beyond the format's range under the
chosen scale (with the count of saturated values)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

from kvviz.cache.sides import MIN_FIT_TOKENS, Side
from kvviz.formats import get_format, parse_spec


@pytest.mark.parametrize("spec, canonical, source", [
    ("fp8_e4m3", "fp8_e4m3", "first"),
    ("fp8_e4m3/tensor/first", "fp8_e4m3", "first"),
    ("fp8_e4m3/tensor/unit", "fp8_e4m3/unit", "unit"),
    ("fp8/head/unit", "fp8_e4m3/head/unit", "unit"),
    ("e5m2/calibrated", "fp8_e5m2/calibrated", "calibrated"),
    ("fp8_e4m3/token/dynamic", "fp8_e4m3/token", "dynamic"),
    ("fp8_e4m3/token", "fp8_e4m3/token", "dynamic"),
    ("int8/tensor", "int8/tensor", None),
    ("q8_0", "q8_0", None),
])
def test_spec_names_the_scale_source(spec, canonical, source):
    parts = parse_spec(spec)
    assert parts.canonical == canonical and parts.scale_source == source
    assert get_format(canonical).scale_source == source  # the canonical name keeps it


@pytest.mark.parametrize("spec, message", [
    ("fp8_e4m3/dynamic", "cannot be dynamic"),
    ("fp8_e4m3/token/unit", "applies to a per-tensor or per-head scale"),
    ("int8/unit", "int8 has none"),
    ("fp8/unit/calibrated", "two scale sources"),
])
def test_bad_scale_sources(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_spec(spec)


def _states(tokens: int, amax: float, heads: int = 2, dim: int = 16, seed: int = 0) -> torch.Tensor:
    """[1, heads, tokens, dim] with largest magnitude exactly `amax`."""
    x = torch.randn(1, heads, tokens, dim, generator=torch.Generator().manual_seed(seed))
    return x / x.abs().max() * amax


def _side(spec: str, x: torch.Tensor, scale=None):
    side = Side(get_format(spec), 0, scale, "layer 0 K")
    side.init(x)
    side.append(x)
    return side


def test_unit_scale_saturates_large_k_and_counts_it():
    x = _states(MIN_FIT_TOKENS, 1000.0)
    expected = int((x.abs() > 448).sum())
    assert expected > 0
    with pytest.warns(UserWarning, match=f"layer 0 K: {expected} of {x.numel()} values exceed fp8_e4m3/unit's range "
                                         "under its unit scale"):
        side = _side("fp8_e4m3/tensor/unit", x)
    assert float(side.static) == 1.0 and side.saturated == expected
    stored = side.fmt.dequantize(side.fmt.quantize(x, scale=side.static))
    assert float(stored.abs().max()) == 448.0  # saturated, not scaled


def test_unit_scale_within_range_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        side = _side("fp8_e4m3/unit", _states(8, 300.0))  # a unit scale fits no tokens: nothing to warn about
    assert side.saturated == 0


def test_first_scale_from_one_token_warns_then_counts_what_saturates():
    first = _states(1, 1.0)
    side = Side(get_format("fp8_e4m3"), 0, None, "layer 3 V")
    with pytest.warns(UserWarning, match="layer 3 V: fp8_e4m3's static scale was fitted on the first update, 1 "
                                         "token\\(s\\) \\(fewer than 64\\)"):
        side.init(first)
    side.append(first)
    assert side.saturated == 0  # the first update fits its own scale
    later = _states(16, 5.0, seed=1)
    with pytest.warns(UserWarning, match="values exceed fp8_e4m3's range under its first scale"):
        side.append(later)
    assert side.saturated == int((later.abs() > 1.0 * (1 + 1e-6)).sum()) > 0


def test_first_scale_from_64_tokens_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _side("fp8_e4m3", _states(MIN_FIT_TOKENS, 3.0))


def test_calibrated_needs_scales_and_uses_them():
    x = _states(4, 10.0)
    with pytest.raises(ValueError, match="needs calibrated scales: pass scales="):
        _side("fp8_e4m3/calibrated", x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # given scales: no fit warning, and 10 / 448 * 448 covers |x| <= 10
        side = _side("fp8_e4m3/calibrated", x, scale=10.0 / 448)
    assert float(side.static) == pytest.approx(10.0 / 448)
    with pytest.raises(ValueError, match="uses a scale of 1.0"):
        _side("fp8_e4m3/unit", x, scale=0.5)


def test_calibration_on_few_tokens_warns():
    from kvviz.calibrate import calibrate_scales
    from kvviz.tiny import tiny_model

    model, tok = tiny_model()
    with pytest.warns(UserWarning, match="calibrated on 5 tokens \\(fewer than 64\\)"):
        calibrate_scales(model, tok, ["hello"])


@pytest.mark.parametrize("spec, vllm_flags, sglang_flags", [
    ("fp8_e4m3", "--kv-cache-dtype fp8_e4m3 --calculate-kv-scales",
     "--kv-cache-dtype fp8_e4m3 --quantization-param-path scales.json"),
    ("fp8_e4m3/unit", "--kv-cache-dtype fp8_e4m3", "--kv-cache-dtype fp8_e4m3"),
    ("fp8_e4m3/calibrated", "--kv-cache-dtype fp8_e4m3",
     "--kv-cache-dtype fp8_e4m3 --quantization-param-path scales.json"),
])
def test_export_follows_the_scale_source(spec, vllm_flags, sglang_flags):
    from kvviz.export import export_commands

    rows = export_commands(spec)
    assert rows["vllm"]["flags"] == vllm_flags and rows["sglang"]["flags"] == sglang_flags
    assert not export_commands("fp8_e4m3/calibrated", scales_path=None)["sglang"]["supported"]


def test_export_warns_about_vllm_float16_cache_on_a_bf16_model():
    from kvviz.export import export_commands

    with pytest.warns(UserWarning, match="float16 on a bfloat16 model .*vLLM pull request 54338"):
        rows = export_commands("fp16", model_dtype="bf16")
    assert "54338" in rows["vllm"]["note"] and rows["vllm"]["supported"]
    with pytest.warns(UserWarning, match="bfloat16 on a float16 model"):
        export_commands("bf16", model_dtype="float16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for spec, dtype in (("fp16", "float16"), ("bf16", "bfloat16"), ("fp8_e4m3", "bfloat16"), ("fp16", None)):
            assert "54338" not in export_commands(spec, model_dtype=dtype)["vllm"]["note"]


def test_a_k_beyond_448_saturates_under_a_unit_scale_and_not_under_a_calibrated_one():
    """Lesson 4's note: on the tiny Qwen2 with a large k_proj bias (benchmarks/fp8_unit_scale.py), a unit scale
    saturates K and multiplies its error; a calibrated scale does not saturate."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from fp8_unit_scale import biased_qwen2, measure

    from kvviz.quality.perplexity import wikitext

    r = measure(*biased_qwen2(), wikitext())
    assert r["max_k"] > 448 and r["headroom"] < 1, r
    assert 0.01 < r["saturated"] / r["values"] < 0.2, r  # the biased channels, where RoPE leaves them large
    assert r["rel_unit"] > 5 * r["rel_calibrated"], r
    assert r["rel_calibrated"] < 0.05, r  # E4M3's own rounding: about 2-3% relative error
