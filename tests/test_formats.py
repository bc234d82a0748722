"""kvviz.formats: exactness against torch, the OCP MX spec and the seed article; robustness; byte accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvviz
from kvviz.formats import e2m1_decode, e2m1_encode, get_format, pack, parse_kv, unpack

ALL_SPECS = [
    "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp8/token", "fp8_e5m2/token/g32", "fp8/channel", "fp8/head",
    "int8", "int8/asym", "int8/tensor", "int8/head", "int8/g32", "int4", "int4/asym", "int4/g32",
    "int4/channel/g32/asym", "int4/channel", "int2", "int2/asym", "int2/channel/g32/asym", "int2/token/g32/asym",
    "mxfp4", "fp4_mx_block16", "nvfp4", "int4/rot", "mxfp4/rot", "fp8/rot", "int2/channel/g32/asym/rot",
]


# -- spec parsing ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, canonical",
    [("fp8", "fp8_e4m3"), ("INT4/Channel/g32/asym", "int4/channel/asym"), ("int8/token", "int8"), ("mxfp4/g32", "mxfp4")],
)
def test_canonical_spec(spec, canonical):
    assert get_format(spec).spec == canonical


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("int3", "Unknown KV format"),
        ("", "Empty"),
        ("int4/bogus", "Unknown option"),
        ("fp16/token", "plain cast"),
        ("fp8/asym", "int formats only"),
        ("mxfp4/g16", "fixed block of 32"),
        ("nvfp4/channel", "per-token block scale"),
        ("int8/token/channel", "two granularities"),
        ("int8/tensor/g32", "needs token or channel"),
    ],
)
def test_bad_specs_raise_value_error_naming_valid_names(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        get_format(spec)


def test_unknown_base_lists_valid_names():
    with pytest.raises(ValueError) as err:
        get_format("int5")
    for name in kvviz.FORMAT_NAMES:
        assert name in str(err.value)


@pytest.mark.parametrize(
    "spec, k, v, residual",
    [
        ("k8v4", "int8", "int4", 0),
        ("kivi2", "int2/channel/asym", "int2/g32/asym", 32),
        ("fp8", "fp8_e4m3", "fp8_e4m3", 0),
        ("k=int8, v=nvfp4", "int8", "nvfp4", 0),
    ],
)
def test_pair_specs_and_presets(spec, k, v, residual):
    kv = parse_kv(spec)
    assert (kv.k.spec, kv.v.spec, kv.residual) == (k, v, residual)


@pytest.mark.parametrize("spec", ["k=int8", "k=int8,v=int4,k=int2", "x=int8,v=int4", "k=,v=int4"])
def test_malformed_pairs(spec):
    with pytest.raises(ValueError, match="k=SPEC,v=SPEC|both k= and v="):
        parse_kv(spec)


# -- packing -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_roundtrip_and_nibble_order(bits):
    codes = torch.randint(0, 2**bits, (3, 5, 16), dtype=torch.uint8)
    packed = pack(codes, bits)
    assert packed.shape == (3, 5, 16 * bits // 8)
    assert torch.equal(unpack(packed, bits), codes)
    if bits == 4:  # element 2i in the low nibble
        assert torch.equal(packed[..., 0], codes[..., 0] | (codes[..., 1] << 4))


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_zero_tokens_quantize_to_empty_storage(spec):
    fmt = get_format(spec)
    x = torch.randn(2, 3, 0, 64)
    q = fmt.quantize(x)
    assert fmt.dequantize(q).shape == x.shape
    assert q.nbytes == fmt.nbytes_for(x.shape)


# -- fp8: torch's own casts, bit for bit -------------------------------------------------------------------------
@pytest.mark.parametrize("spec, dtype", [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_fp8_equals_torch_cast_with_saturation(spec, dtype):
    fmax = torch.finfo(dtype).max
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, 64, generator=g) * torch.logspace(-6, 5, 64)  # spans subnormals to past the max
    x[0, 0, :4] = torch.tensor([fmax * 1.5, -fmax * 3, fmax, -fmax])
    q = get_format(spec).quantize(x, scale=1.0)
    expected = x.clamp(-fmax, fmax).to(dtype)
    assert q.data.dtype == dtype
    assert torch.equal(q.data.view(torch.uint8), expected.view(torch.uint8))
    assert torch.equal(get_format(spec).dequantize(q), expected.float())


def test_fp8_per_token_scale_is_amax_over_max():
    x = torch.randn(2, 8, 32)
    q = get_format("fp8/token").quantize(x)
    assert q.scale.dtype == torch.float32 and q.scale.shape == (2, 8, 1)
    torch.testing.assert_close(q.scale, x.abs().amax(-1, keepdim=True) / 448)
    expected = (x / q.scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(q.data.view(torch.uint8), expected.view(torch.uint8))


def test_e4m3_is_more_precise_and_e5m2_has_more_range():
    x = torch.randn(8, 128, 64)
    err = {s: (get_format(s).roundtrip(x, 1.0) - x).norm() for s in ("fp8_e4m3", "fp8_e5m2")}
    assert err["fp8_e4m3"] < err["fp8_e5m2"] / 1.5
    big = torch.tensor([[1000.0, 20000.0]])
    assert get_format("fp8_e4m3").roundtrip(big, 1.0).max() == 448
    assert get_format("fp8_e5m2").roundtrip(big, 1.0).max() == 20480


# -- int8: the seed article's code -------------------------------------------------------------------------------
def seed_quant_int8(x):  # ../shared/seeds/000: x: [tokens, heads, head_dim]
    scale = x.abs().amax(dim=-1, keepdim=True) / 127.0
    scale = scale.clamp(min=1e-8)
    q = (x / scale).round().clamp(-127, 127).to(torch.int8)
    return q, scale


def seed_dequant_int8(q, scale):
    return q.to(torch.float16) * scale


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_int8_per_token_gives_the_seed_article_results(seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(64, 4, 128, generator=g) * 3).to(torch.float16)
    x[:, 1, 7] *= 40  # an outlier channel
    q_seed, s_seed = seed_quant_int8(x)
    fmt = get_format("int8")
    q = fmt.quantize(x)
    assert q.data.dtype == torch.int8 and q.scale.dtype == torch.float16
    assert torch.equal(q.data, q_seed)
    assert torch.equal(q.scale, s_seed)
    assert torch.equal(fmt.dequantize(q), seed_dequant_int8(q_seed, s_seed))


def test_int8_zero_row_keeps_a_positive_scale_where_the_seed_code_divides_by_zero():
    x = torch.zeros(2, 1, 64, dtype=torch.float16)
    _, s_seed = seed_quant_int8(x)
    assert (s_seed == 0).all()  # clamp(min=1e-8) is 0 in fp16: the seed computes 0 / 0
    q = get_format("int8").quantize(x)
    assert (q.scale > 0).all()
    assert torch.equal(get_format("int8").dequantize(q), x)


# -- OCP MX v1.0 and NVFP4: vectors worked out by hand -----------------------------------------------------------
def test_e2m1_ties_go_to_even_and_saturate():
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, -0.25, -2.6, 0.26, 5.01])
    expected = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -0.0, -3.0, 0.5, 6.0])
    assert torch.equal(e2m1_decode(e2m1_encode(v)), expected)
    assert e2m1_encode(torch.tensor([-0.25])).item() == 8  # negative zero keeps its sign bit
    assert torch.equal(e2m1_encode(torch.tensor([0.5, 1.0, 6.0, -6.0])), torch.tensor([1, 2, 7, 15], dtype=torch.uint8))


def test_e2m1_encode_rounds_the_neighbours_of_every_midpoint_to_the_nearest_code():
    """The encoder compares |v| against per-code bounds (odd codes: the midpoint's fp32 predecessor): one ulp either
    side of each midpoint must land on the nearer code, and NaN / Inf on +0 / +-6, as the definition says."""
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    mids = (values[:-1] + values[1:]) / 2
    for toward, code in ((float("inf"), torch.arange(1, 8)), (float("-inf"), torch.arange(0, 7))):
        v = torch.nextafter(mids, torch.tensor(toward))
        assert torch.equal(e2m1_encode(v), code.to(torch.uint8)), toward
        assert torch.equal(e2m1_encode(-v), (code + 8).to(torch.uint8))
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), 1e38])
    assert e2m1_encode(special).tolist() == [0, 7, 15, 7]


def _block(values, size):
    out = torch.zeros(size)
    out[: len(values)] = torch.tensor(values)
    return out


@pytest.mark.parametrize("spec, block", [("mxfp4", 32), ("fp4_mx_block16", 16)])
def test_mx_hand_vectors(spec, block):
    blocks = [
        # amax 6: floor(log2 6) - 2 = 0, X = 1; each midpoint ties to the even code
        (_block([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25], block), 127, [6, 0, 1, 1, 2, 2, 4, 4, 0]),
        # amax 7 also gives X = 1 (floor), so 7 and 6.5 saturate to 6
        (_block([7.0, 6.5, -7.0], block), 127, [6, 6, -6]),
        # amax 1: X = 2**-2; 0.9 / X = 3.6 -> 4, 0.3 / X = 1.2 -> 1
        (_block([1.0, 0.9, 0.3], block), 125, [1.0, 1.0, 0.25]),
        # one outlier: X = 2**(6 - 2) = 16 flushes the small values to zero (7.9 / 16 = 0.49 -> 0.5)
        (_block([100.0, 1.0, 1.0, -3.0, 7.9], block), 131, [96, 0, 0, 0, 8]),
        # all zeros: the smallest scale 2**-127 (byte 0), elements 0
        (_block([], block), 0, [0]),
    ]
    x = torch.stack([b for b, _, _ in blocks]).unsqueeze(0)  # [1, 5 tokens, block]
    fmt = get_format(spec)
    q = fmt.quantize(x)
    assert q.scale.dtype == torch.uint8 and q.scale.shape == (1, 5, 1)
    assert q.scale.flatten().tolist() == [b for _, b, _ in blocks]
    x_hat = fmt.dequantize(q)
    for i, (_, _, expected) in enumerate(blocks):
        assert x_hat[0, i, : len(expected)].tolist() == [float(e) for e in expected]
        assert (x_hat[0, i, len(expected) :] == 0).all()


def test_nvfp4_hand_vectors():
    # amax 2688 = 448 * 6 makes the fp32 tensor scale exactly 1.
    b1 = _block([2688.0, 112.0, 336.0, -2688.0], 16)  # block scale 448: 112/448 = 0.25 -> 0, 336/448 = 0.75 -> 1
    b2 = torch.full((16,), 3.0)  # block scale 0.5 (exact in E4M3): 3 / 0.5 = 6
    b3 = _block([6.6, 1.0], 16)  # block scale 1.1 rounds (RNE) to 1.125: 6.6 / 1.125 = 5.87 -> 6 -> 6.75
    x = torch.cat([b1, b2, b3]).reshape(1, 1, 48)
    fmt = get_format("nvfp4")
    q = fmt.quantize(x)
    assert q.tensor_scale.item() == 1.0
    assert q.scale.dtype == torch.float8_e4m3fn
    assert q.scale.float().flatten().tolist() == [448.0, 0.5, 1.125]
    x_hat = fmt.dequantize(q).flatten()
    assert x_hat[:4].tolist() == [2688.0, 0.0, 448.0, -2688.0]
    assert (x_hat[16:32] == 3.0).all()
    assert x_hat[32:34].tolist() == [6.75, 1.125]


# -- robustness: every format, hostile inputs --------------------------------------------------------------------
def _hostile_inputs():
    base = torch.randn(2, 2, 64, 64, generator=torch.Generator().manual_seed(3))
    outlier = base.clone()
    outlier[..., 3, 5] = 1e4
    return {
        "zeros": torch.zeros(2, 2, 64, 64),
        "constant": torch.full((2, 2, 64, 64), -2.5),
        "outlier": outlier,
        "huge": base * 1e30,
        "subnormal": base * 1e-40,
        "mixed": torch.cat([base * 1e30, base * 1e-40], dim=-2),
    }


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("case", list(_hostile_inputs()))
def test_finite_input_gives_finite_output(spec, case):
    x = _hostile_inputs()[case]
    x_hat = get_format(spec).roundtrip(x)
    assert x_hat.shape == x.shape and x_hat.dtype == x.dtype
    assert torch.isfinite(x_hat).all()


@pytest.mark.parametrize("spec", [s for s in ALL_SPECS if "rot" not in s])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_propagates_as_nan_in_its_group(spec, bad):
    fmt = get_format(spec)
    x = torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(1))
    x[1, 40, 17] = bad
    x_hat = fmt.roundtrip(x)
    assert torch.isnan(x_hat[1, 40, 17])
    # the NaN stays inside its group: the other head is untouched unless the format shares one scale across heads
    if fmt.granularity != "tensor" or fmt.kind != "int":
        assert torch.isfinite(x_hat[0]).all()
    if fmt.granularity == "token" or fmt.kind == "float":
        assert torch.isfinite(x_hat[1, 39]).all()


def _error_bound(fmt, x, q):
    """Per-element bound on |x - x_hat|, from the format's definition and the scales it stored."""
    shape = tuple(x.shape)
    from kvviz.formats import groups

    def per_group(t):
        return groups.expand(t.float(), fmt.granularity, fmt.group, shape)

    if fmt.kind == "float":
        mant = {"fp16": 10, "bf16": 7, "fp8_e4m3": 3, "fp8_e5m2": 2}[fmt.base]
        dtype = q.data.dtype
        s = 1.0 if fmt.granularity is None else per_group(q.tensor_scale if q.scale is None else q.scale)
        half_sub = torch.finfo(dtype).smallest_normal * 2.0**-mant / 2
        return x.abs() * 2.0 ** -(mant + 1) + s * half_sub
    if fmt.kind == "fp4":
        if fmt.base == "nvfp4":
            X = groups.expand(q.scale.float() * q.tensor_scale, "token", fmt.group, shape)
        else:
            X = groups.expand(torch.ldexp(torch.ones(()), q.scale.float() - 127), "token", fmt.group, shape)
        return 0.25 * x.abs() + 0.25 * X + (x.abs() - 6 * X).clamp(min=0)
    s = per_group(q.tensor_scale if q.scale is None else q.scale)
    amax = per_group(groups.reduce(x, fmt.granularity, fmt.group, "absmax"))
    if fmt.asym:
        return 0.5 * s + amax * 2.0**-9
    qmax = 2 ** (fmt.bits - 1) - 1
    return torch.maximum(0.5 * s, amax - qmax * s) * (1 + 1e-6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.sampled_from([s for s in ALL_SPECS if "rot" not in s]),
    seed=st.integers(0, 2**31 - 1),
    log_scale=st.floats(-3, 4),
    outlier=st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False),
    tokens=st.sampled_from([1, 7, 32, 40]),
)
def test_error_within_the_format_bound(spec, seed, log_scale, outlier, tokens):
    fmt = get_format(spec)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 2, tokens, 64, generator=g) * 10**log_scale
    x[0, 1, tokens // 2, 9] = outlier
    q = fmt.quantize(x)
    err = (fmt.dequantize(q) - x).abs()
    bound = _error_bound(fmt, x, q)
    worst = (err - bound).max().item()
    assert worst <= 1e-6 * x.abs().max().item(), f"{spec}: error exceeds bound by {worst}"


@settings(max_examples=20, deadline=None)
@given(data=st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=64, max_size=64), spec=st.sampled_from(ALL_SPECS))
def test_arbitrary_finite_rows_stay_finite(data, spec):
    x = torch.tensor(np.array(data, dtype=np.float32)).reshape(1, 1, 64).expand(2, 1, 64).contiguous()
    assert torch.isfinite(get_format(spec).roundtrip(x)).all()


@pytest.mark.parametrize("spec", ["fp8_e4m3", "fp8_e5m2/token", "fp8/head"])
def test_fp8_scale_of_a_subnormal_amax_stays_positive(spec):
    """amax = 2**-149 (the smallest fp32 subnormal): amax / 448 underflows to 0, which divided x by zero."""
    x = torch.zeros(1, 2, 64)
    x[0, 1, -1] = 2.0**-149
    assert torch.isfinite(get_format(spec).roundtrip(x)).all()


def test_rotation_spreads_an_outlier_channel():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 256, 64, generator=g)
    x[..., 11] *= 50
    plain = (get_format("int4").roundtrip(x) - x).norm()
    rotated = (get_format("int4/rot").roundtrip(x) - x).norm()
    assert rotated < plain / 2
    assert torch.allclose(kvviz.formats.rotate(kvviz.formats.rotate(x)), x, atol=1e-4)  # H is its own inverse


def test_per_tensor_scale_is_ruined_by_outliers_per_token_is_not():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 128, 64, generator=g)
    x[..., 3] *= 100
    rel = {s: ((get_format(s).roundtrip(x) - x).norm() / x.norm()).item() for s in ("int8/tensor", "int8", "int8/channel")}
    keep = x[..., :3]  # the ordinary channels, which the outlier shares a scale with
    rel_small = {
        s: ((get_format(s).roundtrip(x)[..., :3] - keep).norm() / keep.norm()).item() for s in ("int8/tensor", "int8/channel")
    }
    assert rel_small["int8/channel"] < rel_small["int8/tensor"] / 10
    assert rel["int8"] < 0.05


# -- byte accounting ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_nbytes_equals_bits_per_value(spec, head_dim):
    fmt = get_format(spec)
    shape = (2, 3, 64, head_dim)  # 64 tokens fill every channel group of 32
    q = fmt.quantize(torch.randn(shape))
    numel = math.prod(shape)
    assert q.nbytes == fmt.nbytes_for(shape)
    assert q.nbytes == fmt.bits_per_value(head_dim) * numel / 8 + fmt.static_bytes(shape)


@pytest.mark.parametrize(
    "spec, bits",
    [("fp16", 16), ("fp8_e4m3", 8), ("fp8/token", 8.25), ("int8", 8.125), ("int4", 4.125), ("int2", 2.125),
     ("mxfp4", 4.25), ("fp4_mx_block16", 4.5), ("nvfp4", 4.5), ("int2/channel/g32/asym", 3.0)],
)
def test_bits_per_value_matches_the_design_table(spec, bits):
    assert get_format(spec).bits_per_value(128) == bits


def test_storage_is_really_packed():
    x = torch.randn(1, 4, 64)
    assert get_format("int4").quantize(x).data.shape == (1, 4, 32)
    assert get_format("int2").quantize(x).data.shape == (1, 4, 16)
    assert get_format("mxfp4").quantize(x).data.shape == (1, 4, 32)
    assert get_format("nvfp4").quantize(x).scale.dtype == torch.float8_e4m3fn


def test_static_scales():
    x = torch.randn(2, 3, 16, 32)
    q = get_format("fp8").quantize(x, scale=0.5)
    assert q.tensor_scale.item() == 0.5
    q = get_format("int8/head").quantize(x, scale=torch.tensor([0.1, 0.2, 0.3]))
    assert q.tensor_scale.shape == (2, 3, 1, 1)
    with pytest.raises(ValueError, match="static scale"):
        get_format("int8").quantize(x, scale=1.0)
    with pytest.raises(ValueError, match="finite and positive"):
        get_format("fp8").quantize(x, scale=-1.0)
    with pytest.raises(ValueError, match="one scale per head"):
        get_format("fp8/head").quantize(x, scale=[1.0, 2.0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_output_dtype_follows_input(dtype):
    x = torch.randn(3, 8, 64).to(dtype)
    for spec in ("int4", "nvfp4", "fp8/token", "kivi2"):
        fmt = parse_kv(spec).k
        assert fmt.roundtrip(x).dtype == dtype


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError, match="float tensor"):
        get_format("int8").quantize(torch.ones(4, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="tokens, head_dim"):
        get_format("int8").quantize(torch.ones(8))
    with pytest.raises(ValueError, match="multiple of 32"):
        get_format("mxfp4").quantize(torch.ones(2, 48))
    with pytest.raises(ValueError, match="power of two"):
        get_format("int8/rot").quantize(torch.ones(2, 48))


@pytest.mark.parametrize("granularity,group", [("token", 16), ("token", 64), ("channel", 8), ("tensor", None),
                                               ("head", None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_group_absmax_and_nonfinite_match_the_reduction_over_finite_values(granularity, group, dtype):
    """groups.reduce's "absmax" (of the finite values) and "nonfinite", taken in one pass where every group is
    finite, equal the reductions of the finite values: on finite x, and with NaN, +inf and -inf in some groups."""
    from kvviz.formats import groups

    def reference(x, op):
        if op == "nonfinite":
            view, dims = groups._grouped(~torch.isfinite(x), granularity, group)
            return view.amax(dim=dims, keepdim=granularity == "head")
        xf = torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype)).float().abs()
        view, dims = groups._grouped(xf, granularity, group)
        return view.amax(dim=dims, keepdim=granularity == "head")

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 3, 19, 64, generator=g) * 3).to(dtype)
    spoiled = x.clone()
    spoiled[0, 1, 4, 7], spoiled[1, 2, 18, 63], spoiled[1, 0, 0, 0] = float("nan"), float("inf"), float("-inf")
    for t in (x, spoiled, x[:, :, :0]):
        for op in ("absmax", "nonfinite"):
            got, want = groups.reduce(t, granularity, group, op), reference(t, op) if t.numel() else None
            if want is not None:
                assert got.dtype == want.dtype and torch.equal(got, want), (op, t.shape)
    assert bool(groups.reduce(spoiled, granularity, group, "nonfinite").any())


@pytest.mark.parametrize("spec", ["int4/tensor", "int8/head", "int2/head", "fp8_e4m3/tensor", "fp8_e5m2/head",
                                  "int4/head/rot", "fp8_e4m3/tensor/rot"])
def test_fit_scale_is_the_static_scale_quantize_fits(spec):
    """Format.fit_scale gives the static scale quantize(x) fits when given none (NaN for an int format's tensor or
    head holding a non-finite value), without encoding x; formats with per-group scales have none to fit."""
    fmt = get_format(spec)
    x = torch.randn(2, 3, 40, 64, generator=torch.Generator().manual_seed(1))
    spoiled = x.clone()
    spoiled[0, 1, 3, 5] = float("inf")
    for t in (x, spoiled, x.half()):
        want, got = fmt.quantize(t).tensor_scale, fmt.fit_scale(t)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    for other in ("int4", "int4/tensor/asym"):
        with pytest.raises(ValueError, match="scale"):
            get_format(other).fit_scale(x)
