"""Tests for kvviz.analysis.anatomy: one token through a format agrees with the format's own quantize/dequantize."""

from __future__ import annotations

import math

import pytest
import torch

from kvviz.analysis.anatomy import format_anatomy
from kvviz.analysis.capture import KVCapture
from kvviz.formats import ENGINE_VALUES, FORMAT_NAMES, parse_kv
from kvviz.formats.engines import VLLM_MLA_ONLY_DTYPES

L, H, T, D = 2, 2, 32, 64  # [layers, kv_heads, tokens, head_dim]


def _capture(d: int = D) -> KVCapture:
    g = torch.Generator().manual_seed(0)
    k = torch.randn(L, H, T, d, generator=g)
    k[..., 5] *= 25  # one outlier channel, as post-RoPE K has
    return KVCapture(keys_pre=k, keys_post=k, values=torch.randn(L, H, T, d, generator=g),
                     queries=torch.randn(L, 2 * H, T, d, generator=g), tokens=[f"t{i}" for i in range(T)],
                     token_ids=list(range(T)), scaling=d**-0.5)


CAP = _capture()
# the app's anatomy choices (kvviz/ui/errors.py): every format but vLLM's MLA latent records (no capture holds a latent)
EVERY_FORMAT = [*FORMAT_NAMES, *(f"{e}:{dtype}" for e, (dtypes, _) in ENGINE_VALUES.items() for dtype in dtypes
                                 if not (e == "vllm" and dtype in VLLM_MLA_ONLY_DTYPES))]


def _stored_value(bits: str, dtype: str) -> float:
    """The number a stored bit string holds, read as `dtype`."""
    n = int(bits, 2)
    if dtype in ("float16", "bfloat16"):
        return float(torch.tensor(n - (1 << 16) * (n >> 15), dtype=torch.int16).view(getattr(torch, dtype)))
    if dtype == "float32":
        return float(torch.tensor(n - (1 << 32) * (n >> 31), dtype=torch.int32).view(torch.float32))
    return float(torch.tensor(n, dtype=torch.uint8).view(getattr(torch, dtype)))


@pytest.mark.parametrize("side", ["K", "V"])
@pytest.mark.parametrize("spec", EVERY_FORMAT)
def test_reconstruction_is_the_formats_own_dequantize(spec, side):
    a = format_anatomy(CAP, spec, side, layer=1, head=1, token=7)
    kv = parse_kv(spec)
    fmt = kv.k if side == "K" else kv.v
    x = CAP.tensor("keys_post" if side == "K" else "values")[1, 1][None, None]  # [1, 1, T, D]
    want = fmt.dequantize(fmt.quantize(x))[0, 0, 7].float()
    torch.testing.assert_close(torch.tensor(a.reconstructed), want, rtol=0, atol=0)
    assert len(a.codes) == len(a.code_bits) == len(a.arithmetic) == D
    assert all(int(b, 2) == c % (1 << len(b)) for b, c in zip(a.code_bits, a.codes)), "bits and codes disagree"
    torch.testing.assert_close(torch.tensor(a.error), want - x[0, 0, 7], rtol=0, atol=1e-6)
    for s in a.scales:  # every stored number's bits hold its value
        assert math.isclose(_stored_value(s.bits, s.dtype), s.value, rel_tol=1e-6, abs_tol=0) or (
            math.isnan(s.value)), f"{spec} {s.name}: bits {s.bits} as {s.dtype} != {s.value}"


@pytest.mark.parametrize("spec", ["int4", "int8", "int4/channel/g32/asym", "int2/g16", "q4_0", "q4_1", "q8_0",
                                  "fp8_e4m3", "mxfp4", "nvfp4", "int4/rot"])
def test_scaled_formats_show_the_arithmetic_that_reads_back(spec):
    a = format_anatomy(CAP, spec, "K", layer=0, head=0, token=3)
    assert a.element_scale is not None
    zero = a.element_zero or [0.0] * D
    for level, s, z, out, line in zip(a.levels, a.element_scale, zero, a.quantized_output, a.arithmetic):
        assert math.isclose(level * s + z, out, rel_tol=1e-3, abs_tol=1e-6)
        assert "×" in line and f"= {out:.4g}" in line
    if spec.startswith(("int", "q")) and not spec.endswith("/rot"):  # integer formats: whole levels
        assert all(abs(v - round(v)) < 1e-3 for v in a.levels)
    assert 5 in a.outliers, "the planted outlier channel is marked"


def test_a_rotated_format_names_its_rotation_and_quantizes_the_rotated_values():
    a = format_anatomy(CAP, "int4/rot", "K", layer=0, head=0, token=3)
    assert a.rotation and a.domain == "Hadamard-rotated input"
    x = CAP.keys_post[0, 0, 3]
    torch.testing.assert_close(torch.tensor(a.quantized_input), x @ torch.tensor(_hadamard(D)), rtol=1e-5, atol=1e-5)


def _hadamard(n: int) -> list[list[float]]:
    h = [[1.0]]
    while len(h) < n:
        h = [r + r for r in h] + [r + [-v for v in r] for r in h]
    return [[v / math.sqrt(n) for v in r] for r in h]


@pytest.mark.parametrize("spec, bits", [("vllm:turboquant_k3v4_nc", 3), ("tq_mse2", 2), ("tq_prod3", 2)])
def test_turboquant_shows_codebook_norm_and_rotated_coordinates(spec, bits):
    a = format_anatomy(CAP, spec, "K", layer=1, head=0, token=4)
    assert len(a.codebook) == 2**bits and a.codebook == sorted(a.codebook)
    assert math.isclose(a.norm, float(CAP.keys_post[1, 0, 4].norm()), rel_tol=1e-3)
    assert len(a.rotated_all) == T * D
    assert a.levels == [a.codebook[c] for c in a.codes]
    unit = torch.tensor(a.quantized_input)  # the rotation keeps the unit length
    assert math.isclose(float(unit.norm()), 1.0, rel_tol=1e-4)


@pytest.mark.parametrize("kwargs, words", [
    (dict(token=T), "token must be"), (dict(head=H), "head must be"), (dict(layer=-1), "layer must be"),
    (dict(side="Q"), "side must be"),
])
def test_out_of_range_input_is_a_value_error(kwargs, words):
    with pytest.raises(ValueError, match=words):
        format_anatomy(CAP, "int4", **{"side": "K", "layer": 0, "head": 0, "token": 0, **kwargs})


def test_a_format_that_cannot_hold_the_head_dim_says_so():
    with pytest.raises(ValueError, match="head_dim"):
        format_anatomy(_capture(16), "mxfp4", "K", 0, 0, 0)  # 32-value blocks, head_dim 16
