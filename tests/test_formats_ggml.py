"""llama.cpp's KV cache types in kvviz.formats (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl): bit-exact with ggml.

The `gguf` package's numpy quantizers (gguf/quants.py, written to match ggml-quants.c) are the reference for the
five linear types: the stored blocks (fp16 d [+ m], qh, qs) must equal gguf's bytes and the dequantized values
gguf's dequantization. gguf has no iq4_nl quantizer, so `_iq4nl_numpy` below ports ggml's
quantize_row_iq4_nl_impl line by line in scalar float32 (sharing no code with kvviz/formats/ggml.py).
Also: byte accounting, spec parsing, the cache on a tiny model, hostile inputs and error bounds. The fused kernels'
reading and packing of these types is tested in tests/test_kernels.py against kvviz.formats.

    python -m pytest tests/test_formats_ggml.py -q
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT
from gguf import dequantize as gguf_dequantize
from gguf import quantize as gguf_quantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvviz
from kvviz.formats import get_format, parse_kv
from kvviz.formats.ggml import KVALUES_IQ4NL, gguf_blocks, quantize_iq4_nl

LINEAR = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]
TYPES = LINEAR + ["iq4_nl"]
BITS = {"q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5, "q5_1": 6.0, "iq4_nl": 4.5}


def _blocks_with_edge_cases(seed: int = 0, tokens: int = 40, head_dim: int = 128) -> torch.Tensor:
    """fp32 [2, tokens, head_dim]: K-like rows (a few outlier channels) plus blocks of every edge case."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, tokens, head_dim, generator=g) * torch.rand(2, tokens, 1, generator=g) * 4
    x[..., 7] *= 40  # an outlier channel, as K has
    x[0, 0, :32] = 0.0  # an all-zero block
    x[0, 1, :32] = 1.5  # constant blocks, positive and negative
    x[0, 2, 32:64] = -2.25
    x[0, 3, :32] = torch.linspace(-3, 1, 32)  # the largest |x| is negative: q4_0 / q5_0 / iq4_nl take its sign
    x[0, 4, 32:64] = torch.linspace(-1, 5, 32)  # and positive
    x[0, 5, :32] = torch.randn(32, generator=g) * 1e-3
    x[0, 5, 3] = 900.0  # one huge outlier in a block of small values
    x[0, 6, :32] = torch.tensor([1.0, -1.0] * 16)  # +-a tie for the largest |x|: the first one wins
    x[0, 7, :32] = torch.randn(32, generator=g) * 1e-20  # tiny (iq4_nl: below GROUP_MAX_EPS for some)
    x[0, 8, -32:] = 60000.0  # large but finite fp16 scales
    # iq4_nl ties: with max = -127, d0 = 1 and every other value sits exactly between two table entries
    x[0, 9, :32] = torch.tensor([-127.0] + [(a + b) / 2 for a, b in zip(KVALUES_IQ4NL, KVALUES_IQ4NL[1:])] * 2 + [0.0])
    return x


# -- bit-exactness against gguf ---------------------------------------------------------------------------------
@pytest.mark.parametrize("base", LINEAR)
@pytest.mark.parametrize("seed", [0, 1])
def test_stored_blocks_equal_gguf_bytes(base, seed):
    x = _blocks_with_edge_cases(seed)
    q = get_format(base).quantize(x)
    want = gguf_quantize(x.numpy(), GT[base.upper()])  # uint8 [2, T, D / 32 * block bytes]
    got = gguf_blocks(q).numpy()
    assert got.shape == want.shape
    assert np.array_equal(got, want), f"{base}: {np.argwhere(got != want)[:5]}"


@pytest.mark.parametrize("base", TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dequantized_values_equal_gguf_dequantize(base, dtype):
    x = _blocks_with_edge_cases(2).to(dtype)
    fmt = get_format(base)
    q = fmt.quantize(x)
    want = gguf_dequantize(gguf_blocks(q).numpy(), GT[base.upper()])  # llama.cpp's own reading of our blocks
    got = fmt.dequantize(q).float().numpy() if dtype == torch.float32 else ggml_decode_fp32(fmt, q)
    np.testing.assert_array_equal(got, want)
    if base != "iq4_nl":  # and the blocks themselves equal gguf's quantization of the fp32 input
        assert np.array_equal(gguf_blocks(q).numpy(), gguf_quantize(x.float().numpy(), GT[base.upper()]))


def ggml_decode_fp32(fmt, q) -> np.ndarray:
    """The fp32 dequantization before the cast back to a 16-bit input dtype."""
    from kvviz.formats import ggml

    return ggml.decode(fmt, q).numpy()


def test_q8_0_rounds_halves_away_from_zero_as_roundf():
    """d = 127/127 = 1, so x * (1/d) lands exactly on halves: roundf gives 3, -3, 1, -1 (torch.round: 2, -2, 0, 0)."""
    x = torch.zeros(1, 32)
    x[0, :5] = torch.tensor([127.0, 2.5, -2.5, 0.5, -0.5])
    q = get_format("q8_0").quantize(x)
    assert q.data[0, :5].tolist() == [127, 3, -3, 1, -1]
    assert q.scale.item() == 1.0


def test_q4_0_scale_takes_the_sign_of_the_largest_magnitude():
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 3.0, -8.0  # max |x| is negative: d = -8 / -8 = 1, and -8 maps to code 0
    q = get_format("q4_0").quantize(x)
    assert q.scale.item() == 1.0
    assert get_format("q4_0").dequantize(q)[0, :2].tolist() == [3.0, -8.0]
    x[0, 1] = 8.0  # positive: d = -1, so +8 is code 0 and reads back exactly, -8 would not fit
    assert get_format("q4_0").quantize(x).scale.item() == -1.0


def test_iq4_nl_ties_go_to_the_larger_value():
    x = _blocks_with_edge_cases(0)[0, 9, :32]
    codes, _ = quantize_iq4_nl(x.reshape(1, 32))
    assert codes[0, :16].tolist() == [0] + list(range(1, 16))  # midpoint j-1 | j -> j


@pytest.mark.parametrize("base", ["q4_0", "q5_0"])
def test_a_negative_zero_block_stores_d_as_ggml_does(base):
    """ggml keeps max = +0 when no |x| exceeds 0, so d = +0 / -8 = -0 (gguf's numpy port takes the block's -0 and
    stores +0 here: the one input where the two differ)."""
    q = get_format(base).quantize(torch.full((1, 32), -0.0))
    assert q.scale.view(torch.int16).item() == np.float16(-0.0).view(np.int16)


def test_non_finite_values_poison_only_their_block():
    x = _blocks_with_edge_cases(3)[:, :4]
    x[1, 2, 40] = float("nan")
    x[1, 3, 100] = float("inf")
    for base in TYPES:
        fmt = get_format(base)
        clean = fmt.roundtrip(torch.where(torch.isfinite(x), x, torch.zeros(())))
        got = fmt.roundtrip(x)
        assert torch.isnan(got[1, 2, 32:64]).all() and torch.isnan(got[1, 3, 96:]).all(), base
        keep = torch.ones_like(x, dtype=torch.bool)
        keep[1, 2, 32:64] = keep[1, 3, 96:] = False
        assert torch.equal(got[keep], clean[keep]), base


# -- iq4_nl against a numpy port of ggml's quantizer --------------------------------------------------------------
def _best_index_int8(values: np.ndarray, x: np.float32) -> int:
    """ggml's best_index_int8: a branchless binary search on the doubled midpoints (n = 16)."""
    x2 = np.float32(x + x)
    idx = 0
    step = 8
    while step > 0:
        j = idx + step
        if x2 >= np.float32(int(values[j - 1]) + int(values[j])):
            idx = j
        step >>= 1
    return idx


def _iq4nl_numpy(xb: np.ndarray, ntry: int) -> tuple[np.float32, list[int]]:
    """quantize_row_iq4_nl_impl(32, 32, 16, ...) on one block, scalar float32 as ggml's C: (fp32 d, 32 codes)."""
    f32 = np.float32
    values = np.array(KVALUES_IQ4NL, dtype=np.int8)
    xb = xb.astype(f32)
    weight = [f32(v * v) for v in xb]
    amax, mx = f32(0), f32(0)
    for v in xb:
        if abs(v) > amax:
            amax, mx = f32(abs(v)), v
    L = [0] * 32
    if amax < f32(1e-15):
        d = f32(0)
    else:
        d = f32(-mx / f32(values[0])) if ntry > 0 else f32(mx / f32(values[0]))
        inv = f32(f32(1) / d)
        sumqx = sumq2 = f32(0)
        for j in range(32):
            L[j] = _best_index_int8(values, f32(inv * xb[j]))
            q, w = f32(values[L[j]]), weight[j]
            sumqx = f32(sumqx + f32(f32(w * q) * xb[j]))
            sumq2 = f32(sumq2 + f32(f32(w * q) * q))
        d = f32(sumqx / sumq2) if sumq2 > 0 else f32(0)
        best = f32(d * sumqx)
        for itry in range(-ntry, ntry + 1):
            inv = f32(f32(itry + int(values[0])) / mx)
            sumqx = sumq2 = f32(0)
            for j in range(32):
                q, w = f32(values[_best_index_int8(values, f32(inv * xb[j]))]), weight[j]
                sumqx = f32(sumqx + f32(f32(w * q) * xb[j]))
                sumq2 = f32(sumq2 + f32(f32(w * q) * q))
            if sumq2 > 0 and f32(sumqx * sumqx) > f32(best * sumq2):
                d = f32(sumqx / sumq2)
                best = f32(d * sumqx)
    if ntry > 0:
        inv = f32(f32(1) / d) if d else f32(0)
        L = [_best_index_int8(values, f32(inv * v)) for v in xb]
    return d, L


def _iq4nl_block_bytes(d: np.float32, codes: list[int]) -> bytes:
    """llama.cpp's block_iq4_nl: fp16 d, then byte j = code j | code j + 16 << 4."""
    return np.float16(d).tobytes() + bytes(codes[j] | (codes[16 + j] << 4) for j in range(16))


@pytest.mark.parametrize("ntry", [-1, 7])
def test_iq4_nl_equals_a_numpy_port_of_ggml(ntry):
    x = _blocks_with_edge_cases(4, tokens=12, head_dim=64).reshape(-1, 32)  # 48 blocks, edge cases included
    codes, d = quantize_iq4_nl(x, ntry=ntry)
    for i, block in enumerate(x.numpy()):
        want_d, want_codes = _iq4nl_numpy(block, ntry)
        # the fp32 d before its fp16 rounding: any change in ggml's fp32 summation order shows here
        assert d[i, 0].numpy().tobytes() == want_d.tobytes(), f"block {i}: d {d[i, 0].item()} != {want_d}"
        assert codes[i].tolist() == want_codes, f"block {i}"


def test_iq4_nl_format_is_the_kv_cache_quantizer_without_search():
    """The format stores what quantize_row_iq4_nl_ref (ntry = -1) gives: our blocks equal the numpy port's."""
    x = _blocks_with_edge_cases(5, tokens=10)
    blocks = gguf_blocks(get_format("iq4_nl").quantize(x)).numpy().reshape(-1, 18)
    for got, xb in zip(blocks, x.reshape(-1, 32).numpy()):
        assert got.tobytes() == _iq4nl_block_bytes(*_iq4nl_numpy(xb, -1))


# -- accounting and parsing ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", TYPES)
@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_bits_and_bytes(base, head_dim):
    fmt = get_format(base)
    assert fmt.bits_per_value(head_dim) == BITS[base]
    x = torch.randn(2, 3, 7, head_dim)
    q = fmt.quantize(x)
    assert q.nbytes == fmt.nbytes_for(x.shape) == x.numel() * BITS[base] / 8
    assert q.data.shape == (2, 3, 7, head_dim * fmt.bits // 8)
    assert q.scale.shape == (2, 3, 7, head_dim // 32) and q.scale.dtype == torch.float16
    assert (q.zero is not None) == (base in ("q4_1", "q5_1"))


@pytest.mark.parametrize(
    "spec, fragment",
    [("q4_0/g16", "fixed block of 32"), ("q8_0/channel", "per-token block scale"), ("q4_1/asym", "int formats only"),
     ("q5_0/tensor", "per-token block scale")],
)
def test_bad_ggml_specs(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        get_format(spec)


@pytest.mark.parametrize("base", TYPES)
def test_head_dim_not_a_multiple_of_32_is_refused(base):
    with pytest.raises(ValueError, match="multiple of 32"):
        get_format(base).quantize(torch.randn(1, 4, 48))


def test_pairs_and_registry():
    kv = parse_kv("k=q8_0,v=q4_0")
    assert (kv.k.spec, kv.v.spec, kv.spec) == ("q8_0", "q4_0", "k=q8_0,v=q4_0")
    assert kv.bits_per_value(128) == (8.5 + 4.5) / 2
    assert set(TYPES) <= set(kvviz.FORMAT_NAMES)
    assert get_format("q4_1").asym and not get_format("q4_0").asym


def test_memory_model_counts_the_block_scales():
    # 80 layers, 8 KV heads, head_dim 128, 32K tokens: fp16 holds 10.7 GB; q8_0 holds 8.5 / 16 of it
    fp16 = kvviz.kv_cache_bytes(80, 8, 128, 32768, k="fp16")
    assert kvviz.kv_cache_bytes(80, 8, 128, 32768, k="q8_0") * 16 == fp16 * 8.5
    assert kvviz.kv_cache_bytes(80, 8, 128, 32768, k="k=q8_0,v=q4_0") * 16 == fp16 * (8.5 + 4.5) / 2


# -- the cache ---------------------------------------------------------------------------------------------------------
def _tiny_llama_head_dim_32():
    from transformers import AutoModelForCausalLM

    from kvviz.tiny import ByteTokenizer, tiny_config

    config = tiny_config("llama")
    config.head_dim = 32  # llama.cpp's blocks are 32 values: the usual tiny head_dim of 16 cannot hold one
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="kvviz").eval()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, None
    return model, ByteTokenizer()


def test_cache_generates_with_a_llama_cpp_pair(monkeypatch):
    monkeypatch.setattr(kvviz.runtime.default(), "backend", "torch")
    from kvviz.cache import QuantizedKVCache

    model, tok = _tiny_llama_head_dim_32()
    enc = tok(["the KV cache of llama.cpp", "hi"], return_tensors="pt")
    cache = QuantizedKVCache(model.config, "k=q8_0,v=q4_0")
    out = model.generate(**enc, cache=cache, max_new_tokens=6, do_sample=False)
    assert out.shape == (2, enc["input_ids"].shape[1] + 6)
    tokens = enc["input_ids"].shape[1] + 5  # the last generated token is never written to the cache
    assert cache.nbytes() == kvviz.kv_cache_bytes(2, 2, 32, tokens, 2, k="k=q8_0,v=q4_0")


# -- robustness and error bounds -----------------------------------------------------------------------------------
@pytest.mark.parametrize("base", TYPES)
def test_zero_tokens_quantize_to_empty_storage(base):
    fmt = get_format(base)
    x = torch.randn(2, 3, 0, 64)
    q = fmt.quantize(x)
    assert fmt.dequantize(q).shape == x.shape and q.nbytes == fmt.nbytes_for(x.shape) == 0


@pytest.mark.parametrize("base", TYPES)
@pytest.mark.parametrize("case", ["zeros", "constant", "outlier", "subnormal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_finite_input_gives_finite_output(base, case, dtype):
    g = torch.Generator().manual_seed(3)
    x = {"zeros": torch.zeros(2, 16, 64), "constant": torch.full((2, 16, 64), -2.5),
         "outlier": torch.randn(2, 16, 64, generator=g).index_put_((torch.tensor(1), torch.tensor(3),
                                                                     torch.tensor(5)), torch.tensor(1e4)),
         "subnormal": torch.randn(2, 16, 64, generator=g) * 1e-40}[case].to(dtype)
    x_hat = get_format(base).roundtrip(x)
    assert x_hat.dtype == dtype and torch.isfinite(x_hat).all()


@pytest.mark.parametrize("base", LINEAR)
def test_beyond_fp16_range_the_scale_overflows_as_in_llama_cpp(base):
    """|x| ~ 1e30: ggml's fp16 d becomes Inf (no saturation, unlike kvviz's int formats); the blocks still match."""
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0)) * 1e30
    q = get_format(base).quantize(x)
    assert torch.isinf(q.scale).all()
    with np.errstate(over="ignore"):  # gguf's own fp16 cast overflows the same way
        want = gguf_quantize(x.numpy(), GT[base.upper()])
    assert np.array_equal(gguf_blocks(q).numpy(), want)


def _bound(base: str, x: torch.Tensor, q) -> torch.Tensor:
    """Per-element bound on |x - x_hat|: half a step (a whole step where q4_0 / q5_0 clip the far end at code
    top), plus the fp16 rounding of d and m; iq4_nl: half the widest gap of its table (24 / 2 steps) and a margin."""
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    d = q.scale.float().abs().unsqueeze(-1)
    if base == "iq4_nl":
        per = torch.maximum(12 * d, 0.2 * amax)
    else:
        per = d * (1.0 if base in ("q4_0", "q5_0") else 0.5) + amax * 2.0**-9
    return per.expand_as(blocks).reshape(x.shape) * (1 + 1e-5)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(TYPES), seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-3, 3),
       outlier=st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False), tokens=st.sampled_from([1, 5, 33]))
def test_error_within_the_format_bound(base, seed, log_scale, outlier, tokens):
    fmt = get_format(base)
    x = torch.randn(2, tokens, 64, generator=torch.Generator().manual_seed(seed)) * 10**log_scale
    x[1, tokens // 2, 9] = outlier
    q = fmt.quantize(x)
    worst = ((fmt.dequantize(q) - x).abs() - _bound(base, x, q)).max().item()
    assert worst <= 0, f"{base}: error exceeds its bound by {worst}"


def test_rotation_composes_with_llama_cpp_types():
    """q4_0/rot quantizes x @ H and rotates back: an outlier channel no longer dominates its block."""
    x = torch.randn(1, 64, 64, generator=torch.Generator().manual_seed(0))
    x[..., 11] *= 50
    plain, rot = (((get_format(s).roundtrip(x) - x).norm() / x.norm()).item() for s in ("q4_0", "q4_0/rot"))
    assert rot < plain

