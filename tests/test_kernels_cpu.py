"""The fused CPU decode (kernels/cpu/decode.py, numba) against the float64 reference, and the "cpu" attention backend.

Decode attention: relative error (max |out - ref| / max |ref|) <= 1e-3 with fp32 compute, as the Triton tests
bound it, for every format of the registry x GQA ratio {1, 3} x length {1, 17, 300}, two KV heads, batch rows of
different lengths (L and ceil(L / 2)), channel formats with their partial group in a full-precision tail; then
K/V pairs, masks (left padding, a window), sinks, softcapping, K and V of different widths, half queries, Hadamard
rotations. llama.cpp's six KV types (ggml's block layout, read in place) at head_dim 64 / 128 / 256, lengths on and
off the 32-value block and 64-token tile boundaries, tails, GQA, masks, mixed K/V types. End to end: a tiny Llama
generates the same tokens and near-equal logits through the cpu backend and the torch reference.

    python -m pytest tests/test_kernels_cpu.py -q
"""

from __future__ import annotations

import inspect

import pytest
import torch

import kvviz
import kvviz.formats as F
from kernels.cpu import decode as cpu
from kernels.cpu import step as cpu_step
from kernels.reference import decode_attention_reference
from test_kernels import COVERED, FAST, GGML, HEAD_DIM, TOL, kv_data, make_side, rel_err

pytestmark = pytest.mark.skipif(not cpu.cpu_usable(), reason="numba is not installed: the CPU path is the reference")

FORMATS = tuple(dict.fromkeys(FAST + COVERED + ("nvfp4", "int8/channel/g32", "fp8_e5m2/token", "nvfp4/rot")))
_REF_ARGS = inspect.signature(decode_attention_reference).parameters


def run_case(k_spec: str, v_spec: str, gqa: int, length: int, kv_heads: int = 2, head_dim: int = HEAD_DIM,
             **kwargs) -> float:
    """Both sides quantized as a cache holds them (channel formats: whole groups packed, the rest in the tail);
    returns the relative error of the CPU decode against the float64 reference."""
    kfmt, vfmt = F.get_format(k_spec), F.get_format(v_spec)
    kx, vx = kv_data(length, head_dim, kv_heads)
    lengths = torch.tensor([length, (length + 1) // 2])

    def packed(fmt):
        return (length // fmt.group) * fmt.group if fmt.granularity == "channel" else None

    k, v = make_side(kfmt, kx, packed(kfmt)), make_side(vfmt, vx, packed(vfmt))
    q = torch.randn(2, kv_heads * gqa, head_dim, generator=torch.Generator().manual_seed(1))
    out = cpu.decode_attention_cpu(q, k, v, lengths, **kwargs)
    assert out.shape == q.shape and out.dtype == q.dtype
    return rel_err(out, decode_attention_reference(q, k, v, lengths, kv_mask=kwargs.get("kv_mask")))


@pytest.mark.parametrize("length", (1, 17, 300))
@pytest.mark.parametrize("gqa", (1, 3))
@pytest.mark.parametrize("spec", FORMATS)
def test_every_format(spec, gqa, length):
    assert run_case(spec, spec, gqa, length) <= TOL


@pytest.mark.parametrize("spec, head_dim", (
    ("mxfp4", 96), ("nvfp4", 48), ("nvfp4", 64), ("int4/g16/asym", 48), ("int4/g32", 128), ("int8/g16", 48),
    ("int8/g32/asym", 64), ("int4/g8", 64),
))
def test_group_scales_applied_as_the_codes_unpack(spec, head_dim):
    """Group-scaled blocks unpack each group with its scale in one pass, 16 codes per vector: groups of 16 and 32
    bytes per field, pairs of 8-byte groups (an odd count of them in a block: the two-pass path), 4-byte groups
    (two-pass); E2M1, nibbles, bytes, signed bytes; 3 and 4 groups per row."""
    assert run_case(spec, spec, 3, 300) <= TOL
    assert run_case(spec, spec, 1, 17) <= TOL


@pytest.mark.parametrize("way", ("permute", "shuffle", "arithmetic"))
def test_e2m1_vectors_decode_every_code_exactly(way, monkeypatch):
    """simd.py's 16-lane E2M1 decode, every way (AVX-512's lane permute of a value table, x86's byte shuffle of a
    table, and the arithmetic one other CPUs take): every byte's low and high nibble is the OCP FP4 value bit for
    bit, -0 of code 8 included, scaled as code * a + c."""
    numba = pytest.importorskip("numba")
    np = pytest.importorskip("numpy")
    from kernels.cpu.jit import simd

    if way == "permute" and not simd._LANE_PERMUTE:
        pytest.skip("no lane permute on this CPU (x86 with AVX-512 only)")
    if way == "shuffle" and not simd._BYTE_SHUFFLE:
        pytest.skip("no byte shuffle on this CPU (x86 with SSSE3 only)")
    monkeypatch.setattr(simd, "_LANE_PERMUTE", way == "permute")  # read when the caller below compiles
    monkeypatch.setattr(simd, "_BYTE_SHUFFLE", way == "shuffle")

    @numba.njit
    def unpack(data, raw, a, c):
        for o in range(0, data.size, 16):
            simd._scaled16_e2m1_lo(data, o, raw, o, a, a, c, c)
            simd._scaled16_e2m1_hi(data, o, raw, data.size + o, a, a, c, c)

    data = np.arange(256, dtype=np.uint8)
    table = np.array([v for v in simd.E2M1] + [-v for v in simd.E2M1], np.float32)
    raw = np.empty(512, np.float32)
    unpack(data, raw, np.float32(1.0), np.float32(-0.0))  # x * 1 + -0 keeps x's bits, -0 too
    want = np.concatenate([table[data & 15], table[data >> 4]])
    assert raw.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    unpack(data, raw, np.float32(0.375), np.float32(-2.5))
    np.testing.assert_array_equal(raw, want * np.float32(0.375) + np.float32(-2.5))


@pytest.mark.parametrize("pb, nb, n", ((2, 32, 64), (1, 64, 61), (4, 16, 3), (2, 48, 17), (1, 128, 64)))
def test_sixteen_row_scores_and_weighted_rows(pb, nb, n):
    """simd.py's _scores16 (16 rows' dot products summed by one transpose-and-add tree, then scaled) and _weighted16
    (the weighted rows of a block added to acc) against float64, on raw blocks of pb fields of nb channels per
    row: a wrong lane in the tree, a dropped row or a field read at the wrong stride fails."""
    numba = pytest.importorskip("numba")
    np = pytest.importorskip("numpy")
    from kernels.cpu.jit.simd import _scores16, _weighted16

    @numba.njit
    def scores(q, raw, sc, zc, s, nb, pb, n, sm):
        for g in range(q.shape[0]):
            for j in range(0, n - n % 16, 16):
                _scores16(q, g * q.shape[1], raw, j * nb, raw.shape[1], nb, pb, sc, zc, j, np.float32(q[g].sum()),
                          sm, s, g * s.shape[1] + j)

    @numba.njit
    def weighted(wt, raw, acc, nb, pb, n):
        for g in range(wt.shape[0]):
            _weighted16(wt, g * wt.shape[1], raw, 0, raw.shape[1], nb, pb, n, acc, g * acc.shape[1])

    rng = np.random.default_rng(pb * 1000 + nb + n)
    q = rng.standard_normal((3, pb * nb)).astype(np.float32)
    raw = rng.standard_normal((pb, 64 * nb)).astype(np.float32)
    sc, zc = rng.standard_normal((2, 64)).astype(np.float32)
    rows = raw.astype(np.float64).reshape(pb, 64, nb).transpose(1, 0, 2).reshape(64, pb * nb)  # row j's channels
    s = np.zeros((3, 64), np.float32)
    scores(q, raw, sc, zc, s, nb, pb, n, np.float32(0.125))
    q64 = q.astype(np.float64)
    want = ((q64 @ rows.T) * sc + zc * q64.sum(1, keepdims=True)) * 0.125
    full = n - n % 16
    np.testing.assert_allclose(s[:, :full], want[:, :full], rtol=1e-5, atol=1e-5)
    assert not s[:, full:].any(), "rows past the last 16 are left to the caller"
    acc = rng.standard_normal((3, pb * nb)).astype(np.float32)
    wt = rng.standard_normal((3, 64)).astype(np.float32)
    want = acc.astype(np.float64) + wt[:, :n].astype(np.float64) @ rows[:n]
    weighted(wt, raw, acc, nb, pb, n)
    np.testing.assert_allclose(acc, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("pair", ("k8v4", "k4v8", "kivi2", "kivi4", "k=fp8_e4m3/token,v=nvfp4", "k=int4/rot,v=mxfp4"))
def test_kv_pairs(pair):
    kv = F.parse_kv(pair)
    assert run_case(kv.k.spec, kv.v.spec, 3, 300) <= TOL


# ------------------------------------------------------------------------------------------ llama.cpp's types

def run_ggml(k_spec: str, v_spec: str, gqa: int, length: int, head_dim: int, tail: int = 3, **kwargs) -> float:
    """K and V of llama.cpp types as a cache holds them: the first length - tail tokens packed in ggml blocks (with
    spare capacity rows), the rest a full-precision tail; a K channel with 30x outliers sets its blocks' d."""
    kx, vx = kv_data(length, head_dim, 2)
    kx[..., 5] *= 30.0
    n = max(length - tail, 0)
    k, v = make_side(F.get_format(k_spec), kx, n), make_side(F.get_format(v_spec), vx, n)
    assert k.layout == v.layout == "ggml" and cpu.reads(k) and cpu.reads(v)
    q = torch.randn(2, 2 * gqa, head_dim, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([length, (length + 1) // 2])
    out = cpu.decode_attention_cpu(q, k, v, lengths, **kwargs)
    return rel_err(out, decode_attention_reference(q, k, v, lengths, kv_mask=kwargs.get("kv_mask")))


@pytest.mark.parametrize("length", (1, 33, 100, 300))  # 33: one past a ggml block; 100, 300: partial 64-token tiles
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("spec", GGML)
def test_llama_cpp_types(spec, head_dim, length):
    """Every type as K and as V, read from ggml's blocks in place; GQA 1 and 3 alternate over the lengths."""
    assert run_ggml(spec, spec, 1 + 2 * (length % 2), length, head_dim) <= TOL


@pytest.mark.parametrize("pair", (("q8_0", "q4_0"), ("q5_1", "iq4_nl"), ("q4_1", "q5_0"), ("iq4_nl", "q8_0")))
@pytest.mark.parametrize("parallel", (False, True))
def test_llama_cpp_pairs_masked(pair, parallel):
    """Mixed K / V types, no tail, over a left-padding + window mask that skips whole tiles, split across threads."""
    mask = torch.zeros(2, 260, dtype=torch.bool)
    mask[0, 150:] = True  # row 0: a window of its last 110 tokens
    mask[1, 7:] = True  # row 1 (130 tokens): 7 tokens of left padding
    assert run_ggml(*pair, 3, 260, 128, tail=0, kv_mask=mask, num_splits=3, parallel=parallel) <= TOL


def test_llama_cpp_rotated_and_k_v_widths():
    """q4_0/rot (Hadamard outside the kernel) with a q5_1 V of another head_dim."""
    g = torch.Generator().manual_seed(4)
    kx, vx = torch.randn(2, 2, 90, 128, generator=g), torch.randn(2, 2, 90, 64, generator=g)
    k, v = make_side(F.get_format("q4_0/rot"), kx, 88), make_side(F.get_format("q5_1"), vx, 88)
    q = torch.randn(2, 4, 128, generator=g)
    out = cpu.decode_attention_cpu(q, k, v, 90)
    assert out.shape == (2, 4, 64) and k.rotation is not None
    assert rel_err(out, decode_attention_reference(q, k, v, 90)) <= TOL


def test_llama_cpp_nan_block_reads_nan():
    """A block stored with d = NaN (a non-finite input) reads back NaN, as the reference's dequantization does."""
    kx, vx = kv_data(40, 64, 2)
    vx[0, 0, 3, 40] = float("inf")
    fmt = F.get_format("q5_0")
    k, v = make_side(fmt, kx), make_side(fmt, vx)
    out = cpu.decode_attention_cpu(torch.randn(2, 4, 64), k, v, 40)
    assert torch.isnan(out[0, :2, 32:]).all() and torch.isfinite(out[0, :2, :32]).all()
    assert torch.isfinite(out[1]).all() and torch.isfinite(out[0, 2:]).all()


@pytest.mark.parametrize("parallel", (False, True))
@pytest.mark.parametrize("splits", (1, 3, 7))
def test_split_counts(splits, parallel):
    """Splits are merged exactly (a split may hold only masked or no tokens), on the calling thread (the default
    below kernels.cpu.decode._PARALLEL_ROWS) and on numba's pool alike."""
    assert run_case("int4", "int4", 3, 300, num_splits=splits, parallel=parallel) <= TOL


@pytest.mark.parametrize("parallel", (False, True))
def test_mask_window_and_empty_rows(parallel):
    """Left padding plus a window (kv_mask), a block with no live token, and a length-0 row (zeros, no NaN)."""
    kx, vx = kv_data(200)
    fmt = F.get_format("mxfp4")
    k, v = make_side(fmt, kx), make_side(fmt, vx)
    q = torch.randn(2, 6, HEAD_DIM)
    mask = torch.zeros(2, 200, dtype=torch.bool)
    mask[0, 140:] = True  # row 0 sees a window of its last 60 tokens: whole 64-token blocks masked
    lengths = torch.tensor([200, 0])
    out = cpu.decode_attention_cpu(q, k, v, lengths, kv_mask=mask, num_splits=3, parallel=parallel)
    ref = decode_attention_reference(q, k, v, lengths, kv_mask=mask)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) <= TOL
    assert out[1].abs().max() == 0


def test_fully_masked_row_is_zero():
    kx, vx = kv_data(30)
    fmt = F.get_format("int8")
    k, v = make_side(fmt, kx), make_side(fmt, vx)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1] = False
    out = cpu.decode_attention_cpu(torch.randn(2, 2, HEAD_DIM), k, v, 30, kv_mask=mask)
    assert torch.isfinite(out).all() and out[1].abs().max() == 0


@pytest.mark.skipif("sinks" not in _REF_ARGS, reason="the reference has no sinks / softcap yet")
def test_sinks_and_softcap():
    kx, vx = kv_data(120)
    fmt = F.get_format("int4/g16/asym")
    k, v = make_side(fmt, kx, 100), make_side(fmt, vx, 100)
    q = torch.randn(2, 6, HEAD_DIM) * 3
    sinks = torch.randn(6)
    out = cpu.decode_attention_cpu(q, k, v, torch.tensor([120, 61]), sinks=sinks, softcap=2.0)
    ref = decode_attention_reference(q, k, v, torch.tensor([120, 61]), sinks=sinks, softcap=2.0)
    assert rel_err(out, ref) <= TOL


def test_k_and_v_widths_differ():
    """K head_dim 24, V head_dim 16 (DeepSeek-V3 as transformers caches it)."""
    g = torch.Generator().manual_seed(3)
    kx, vx = torch.randn(2, 1, 40, 24, generator=g), torch.randn(2, 1, 40, 16, generator=g)
    k, v = make_side(F.get_format("int8"), kx), make_side(F.get_format("int4/g8"), vx)
    q = torch.randn(2, 4, 24, generator=g)
    out = cpu.decode_attention_cpu(q, k, v, 40)
    assert out.shape == (2, 4, 16)
    if v.head_dim == k.head_dim or "sinks" in _REF_ARGS:  # the reference reads D_v once it knows sinks
        assert rel_err(out, decode_attention_reference(q, k, v, 40)) <= TOL


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_float_casts_are_read_in_whole_blocks_and_row_by_row(dtype):
    """A 16- or 32-bit float cast (vLLM's "auto" under an fp32 model) read from its bytes: whole packed blocks on
    the flat path, a masked block row by row, in buffers with spare capacity rows."""
    from kernels.packed import PackedSide

    kx, vx = kv_data(300)
    buf = torch.zeros(2, kx.shape[1], 310, HEAD_DIM, dtype=dtype)
    sides = []
    for x in (kx, vx):
        data = buf.clone()
        data[:, :, :300] = x.to(dtype)
        sides.append(PackedSide(data=data[:, :, :300], head_dim=HEAD_DIM, bits=32 if dtype == torch.float32 else 16))
    q = torch.randn(2, 6, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([300, 150])
    mask = torch.ones(2, 300, dtype=torch.bool)
    mask[1, :70] = False
    for kv_mask in (None, mask):
        out = cpu.decode_attention_cpu(q, *sides, lengths, kv_mask=kv_mask)
        assert rel_err(out, decode_attention_reference(q, *sides, lengths, kv_mask=kv_mask)) <= TOL


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_half_query_and_tail(dtype):
    """Model-dtype queries and tails (read from their 16-bit storage): fp32 inside, output in the query's dtype."""
    kx, vx = kv_data(50)
    k = make_side(F.get_format("int4/channel/g32/asym"), kx.to(dtype), 32)
    v = make_side(F.get_format("int4/asym"), vx.to(dtype), 40)
    q = torch.randn(2, 6, HEAD_DIM).to(dtype)
    out = cpu.decode_attention_cpu(q, k, v, 50)
    assert out.dtype == dtype
    assert rel_err(out, decode_attention_reference(q, k, v, 50)) <= 1e-2  # one rounding to the half output


def test_wrong_input_is_refused():
    kx, vx = kv_data(10)
    side = make_side(F.get_format("int8"), kx)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        cpu.decode_attention_cpu(torch.randn(2, 3, HEAD_DIM), side, side, 10)
    with pytest.raises(ValueError, match="one query token"):
        cpu.decode_attention_cpu(torch.randn(2, 2, 1, HEAD_DIM), side, side, 10)


def test_supports_only_known_families():
    assert cpu.supports(F.get_format("nvfp4")) and cpu.supports(F.get_format("fp16"))

    assert cpu.supports(F.get_format("q4_0")) and cpu.supports(F.get_format("iq4_nl"))

    class Block:  # a format family the CPU path has no decode branch for
        kind = "gguf"

    assert not cpu.supports(Block())


# ------------------------------------------------------------------------------------------ the "cpu" backend

def _count_fused(monkeypatch) -> list:
    """A list that grows by one per fused CPU call: the decode (two-call path) or the one-call step."""
    calls = []
    fused, run = cpu.decode_attention_cpu, cpu_step.DecodeStep.run
    monkeypatch.setattr(cpu, "decode_attention_cpu", lambda *a, **kw: calls.append(1) or fused(*a, **kw))
    monkeypatch.setattr(cpu_step.DecodeStep, "run", lambda *a, **kw: calls.append(1) or run(*a, **kw))
    return calls


@pytest.mark.parametrize("spec", ("int4", "k8v4", "mxfp4", "kivi2", "fp8_e4m3", "nvfp4", "k=q8_0,v=q4_0",
                                  "k=q5_1,v=iq4_nl"))
def test_cpu_and_torch_backends_agree(spec, monkeypatch):
    """A tiny Llama decodes left-padded prompts through the fused CPU path (counted) and through the reference:
    logits agree to 1e-4 (relative), as the Triton backend's do."""
    from test_kernels_e2e import TOL as E2E_TOL, _decode_logits, _model

    kv = F.parse_kv(spec)
    wide = any(f.granularity == "token" and (f.group or 0) > 16 for f in (kv.k, kv.v))
    model, tok = _model(32 if wide else 16)
    calls = _count_fused(monkeypatch)
    with torch.no_grad():
        ref = _decode_logits(model, tok, spec, "torch", monkeypatch)
        assert not calls
        got = _decode_logits(model, tok, spec, "cpu", monkeypatch)
    assert calls, "the cpu backend never reached the fused CPU decode"
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert err <= E2E_TOL, f"{spec}: cpu and torch logits differ by {err:.2e} (relative)"


@pytest.mark.parametrize("spec", ("k=q8_0,v=q4_0", "k=q4_1,v=q5_0"))
def test_llama_cpp_types_generate_the_same_tokens(spec, monkeypatch):
    """Greedy generation on a tiny Llama (head_dim 32: one ggml block per head) through the fused CPU path and
    the reference: the same tokens."""
    from test_kernels_e2e import _model

    model, tok = _model(32)
    enc = tok(["The quick brown fox jumps over the lazy dog", "Hello"], return_tensors="pt")
    calls = _count_fused(monkeypatch)
    tokens = {}
    for backend in ("torch", "cpu"):
        monkeypatch.setattr(kvviz.runtime.default(), "backend", backend)
        with torch.no_grad():
            tokens[backend] = model.generate(**enc, max_new_tokens=12, do_sample=False,
                                             cache=kvviz.QuantizedKVCache(model.config, spec))
        assert bool(calls) == (backend == "cpu"), f"{backend}: {len(calls)} fused CPU calls"
    assert torch.equal(tokens["cpu"], tokens["torch"])
