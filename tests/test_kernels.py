"""Triton kernels (kernels/) against their float64 torch references, in the CPU interpreter (TRITON_INTERPRET=1).

Decode attention: relative error (max |out - ref| / max |ref|) <= 1e-3 with fp32 compute, for every format x GQA
ratio {1, 3, 8} x length {1, 17, 300} x split count {1, 2, 4}. The interpreter is slow, so the full cross product
(GQA x length x splits {1, 4}) runs for a fast subset (int4 per token, nvfp4, KIVI-style int2 per channel with a
full-precision tail) and a covering design runs for every other format: each format sees every GQA ratio, every
length and every split count exactly once (3 runs per format, a Latin square). Batch rows have different lengths
(L and ceil(L / 2)). llama.cpp's six KV types (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) run a covering design of
their own (GQA 1 and 3, every length and split count, head_dim 32 and 64, the last tokens in a full-precision
tail). Attention sinks, logit softcapping and K/V of different head dims run as a second covering design (each
K/V/width case meets each feature once, llama.cpp pairs among them); sliding-window and chunk masks check that blocks with no live
token are never read (their scales are NaN). quant_pack: bit-exact against kvviz.formats (codes, scales, zero
points, NaN payloads), llama.cpp's types on blocks built to hit ggml's corner cases.

    python -m pytest tests/test_kernels.py -q
"""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():  # tests/conftest.py sets it first; this covers running the file on its own
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import kernels  # noqa: E402
import kvviz.formats as F  # noqa: E402
from kernels import (  # noqa: E402
    PackedSide,
    decode_attention,
    decode_attention_reference,
    dequantize_side,
    quant_pack,
    quant_pack_supported,
    side_from_format,
)

pytestmark = pytest.mark.skipif(not kernels.triton_usable(), reason="Triton cannot run here: no CUDA, and "
                                "TRITON_INTERPRET=1 was not set before triton was imported")

GQAS = (1, 3, 8)
LENGTHS = (1, 17, 300)
SPLITS = (1, 2, 4)
FAST = ("int4", "nvfp4", "int2/channel/g32/asym")
COVERED = (
    "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3/token", "fp8_e5m2/head", "fp8_e4m3/channel",
    "int8", "int8/asym", "int8/g16", "int8/tensor", "int4/asym", "int4/g8", "int4/g16/asym", "int4/head/asym",
    "int4/channel/g32/asym", "int2", "int2/asym", "int2/g16/asym", "mxfp4", "fp4_mx_block16",
    "int4/rot", "fp8_e4m3/rot", "int8/asym/rot",
)
PACKABLE = (
    "int8", "int4", "int2", "int8/asym", "int4/asym", "int2/asym", "int8/g16", "int4/g8", "int4/g16/asym",
    "int2/g16/asym", "fp8_e4m3/token", "fp8_e5m2/token", "fp8_e4m3/token/g16", "fp8_e4m3", "fp8_e5m2/head",
    "int8/tensor", "int4/head", "mxfp4", "fp4_mx_block16", "nvfp4", "int4/rot", "nvfp4/rot",
)
GGML = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # llama.cpp's KV cache types (ggml's block layout)
TOL = 1e-3
BATCH, KV_HEADS, HEAD_DIM = 2, 2, 32  # the sweeps use one KV head: the interpreter pays per program


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: the relative error every decode test bounds."""
    return ((out.double().cpu() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def make_side(fmt, x: torch.Tensor, n_packed: int | None = None, spare: int = 5) -> PackedSide:
    """Quantize x [B, Hkv, T, D] as a cache would: the first n_packed tokens (default all) packed into buffers with
    `spare` rows of extra capacity (so strides include it), the rest kept as a full-precision tail."""
    t = x.shape[2]
    n = t if n_packed is None else n_packed
    q = fmt.quantize(x[:, :, : max(n, 1)])  # kvviz.formats cannot pack 0 tokens: slice an empty view below

    def in_buffer(a: torch.Tensor | None, rows: int) -> torch.Tensor | None:
        if a is None or a.dim() < 4:
            return a
        buf = torch.zeros(*a.shape[:2], a.shape[2] + spare, *a.shape[3:], dtype=a.dtype)
        buf[:, :, : a.shape[2]] = a
        return buf[:, :, :rows]

    rows = n
    srows = None if q.scale is None else (-(-n // fmt.group) if fmt.granularity == "channel" else n)
    tail = x[:, :, n:] if n < t else None
    return side_from_format(
        fmt, in_buffer(q.data, rows), in_buffer(q.scale, srows),
        q.zero if q.scale is None else in_buffer(q.zero, srows), q.tensor_scale,
        n_packed=n if tail is not None else None, tail=tail,
    )


def kv_data(length: int, head_dim: int = HEAD_DIM, kv_heads: int = KV_HEADS, seed: int = 0):
    """Random K (with two outlier channels, like post-RoPE keys) and V: [B, Hkv, length, D] fp32 each."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(BATCH, kv_heads, length, head_dim, generator=g)
    k[..., 3] *= 8.0
    k[..., head_dim - 2] += 4.0
    v = torch.randn(BATCH, kv_heads, length, head_dim, generator=g)
    return k, v


def run_case(k_spec: str, v_spec: str, gqa: int, length: int, splits: int, head_dim: int = HEAD_DIM,
             kv_heads: int = 1, channel_tail: bool = True, **kwargs) -> float:
    """Decode with both sides quantized; returns the relative error against the float64 reference."""
    kfmt, vfmt = F.get_format(k_spec), F.get_format(v_spec)
    kx, vx = kv_data(length, head_dim, kv_heads)
    lengths = torch.tensor([length, (length + 1) // 2])

    def packed(fmt):  # channel formats keep their partial group unquantized, as the cache does
        return (length // fmt.group) * fmt.group if channel_tail and fmt.granularity == "channel" else None

    k = make_side(kfmt, kx, packed(kfmt))
    v = make_side(vfmt, vx, packed(vfmt))
    q = torch.randn(BATCH, kv_heads * gqa, head_dim, generator=torch.Generator().manual_seed(1))
    out = decode_attention(q, k, v, lengths, num_splits=splits, **kwargs)
    assert out.shape == q.shape and out.dtype == q.dtype
    return rel_err(out, decode_attention_reference(q, k, v, lengths))


# ------------------------------------------------------------------------------------------ decode attention

@pytest.mark.parametrize("splits", (1, 4))
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("gqa", GQAS)
@pytest.mark.parametrize("spec", FAST)
def test_decode_full_product(spec, gqa, length, splits):
    assert run_case(spec, spec, gqa, length, splits) <= TOL


def _covering_cases():
    for i, spec in enumerate(COVERED):
        for j in range(3):  # a Latin square: every format meets each GQA ratio, length and split count once
            yield pytest.param(spec, GQAS[j], LENGTHS[(j + i) % 3], SPLITS[(j + 2 * i) % 3], id=f"{spec}-{j}")


@pytest.mark.parametrize("spec,gqa,length,splits", list(_covering_cases()))
def test_decode_covering(spec, gqa, length, splits):
    assert run_case(spec, spec, gqa, length, splits) <= TOL


def _ggml_cases():
    for i, spec in enumerate(GGML):
        for j in range(3):  # each type meets GQA 1 and 3, each length and each split count; one run at D = 32
            yield pytest.param(spec, (1, 3)[(i + j) % 2], LENGTHS[(i + j) % 3], SPLITS[(j + 2 * i) % 3],
                               32 if j == 2 and i % 2 else 64, id=f"{spec}-{j}")


@pytest.mark.parametrize("spec,gqa,length,splits,head_dim", list(_ggml_cases()))
def test_decode_llama_cpp_types(spec, gqa, length, splits, head_dim):
    """ggml's block layout read fused: the first length - 3 tokens packed, the rest a full-precision tail."""
    fmt = F.get_format(spec)
    kx, vx = kv_data(length, head_dim, 1)
    kx[..., 5] *= 30.0  # a block whose scale one outlier sets
    n = max(length - 3, 0)
    k, v = make_side(fmt, kx, n), make_side(fmt, vx, n)
    assert k.layout == "ggml" and (n == length or k.tail is not None)
    q = torch.randn(BATCH, gqa, head_dim, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([length, (length + 1) // 2])
    out = decode_attention(q, k, v, lengths, num_splits=splits, block_n=32)
    assert rel_err(out, decode_attention_reference(q, k, v, lengths)) <= TOL


@pytest.mark.parametrize("pair", ("k8v4", "k4v8", "kivi2", "kivi4", "k=fp8_e4m3/token,v=nvfp4", "k=int4/rot,v=mxfp4"))
def test_decode_kv_pairs(pair):
    kv = F.parse_kv(pair)
    assert run_case(kv.k.spec, kv.v.spec, 3, 300, 2, kv_heads=2) <= TOL


def test_decode_partial_channel_group_packed():
    """A channel format whose last group is partial and packed anyway (no tail) reads its scale row t // N."""
    assert run_case("int4/channel/g32/asym", "int2/channel/g32/asym", 3, 77, 2, kv_heads=2, channel_tail=False) <= TOL


@pytest.mark.parametrize("spec,head_dim", [("nvfp4", 16), ("int4/g16/asym", 16), ("int8", 64), ("mxfp4", 64),
                                           ("q5_0", 96)])
def test_decode_head_dims(spec, head_dim):
    """head_dim 16 folds nvfp4's single block scale into the scores; 64 takes two MX blocks; 96 reads three ggml
    blocks out of a 128-lane tile."""
    assert run_case(spec, spec, 3, 40, 2, head_dim=head_dim) <= TOL


def test_decode_tail_longer_for_k_than_v():
    """K and V may hold different numbers of packed tokens (KIVI K per channel, V per token): each side switches
    to its own tail at its own n_packed, and a row shorter than n_packed never reads its tail."""
    kx, vx = kv_data(90)
    kfmt, vfmt = F.get_format("int2/channel/g32/asym"), F.get_format("int4/g16/asym")
    k = make_side(kfmt, kx, 64)
    v = make_side(vfmt, vx, 85)
    q = torch.randn(BATCH, KV_HEADS * 8, HEAD_DIM)
    lengths = torch.tensor([90, 50])
    out = decode_attention(q, k, v, lengths, num_splits=3, block_n=16)
    assert rel_err(out, decode_attention_reference(q, k, v, lengths)) <= TOL


def test_decode_mask_and_empty_rows():
    """kv_mask (left padding) drops tokens, a fully masked block leaves no NaN, a length-0 row returns zeros."""
    kx, vx = kv_data(70)
    fmt = F.get_format("int8")
    k, v = make_side(fmt, kx), make_side(fmt, vx)
    q = torch.randn(BATCH, KV_HEADS * 3, HEAD_DIM)
    mask = torch.ones(BATCH, 70, dtype=torch.bool)
    mask[0, :40] = False  # left padding longer than one 16-token block
    lengths = torch.tensor([70, 0])
    out = decode_attention(q, k, v, lengths, num_splits=4, kv_mask=mask, block_n=16)
    ref = decode_attention_reference(q, k, v, lengths, kv_mask=mask)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) <= TOL
    assert out[1].abs().max() == 0


# Sinks (gpt-oss), softcapping (Gemma 2) and K/V of different head dims (DeepSeek-V3: K 192, V 128), as a covering
# design: each (K, V, D_k, D_v) case meets each feature set once, split counts rotating.
SINK_CASES = (("int4", "int4", 32, 32), ("nvfp4", "mxfp4", 48, 32), ("mxfp4", "nvfp4", 32, 64),
              ("int4/rot", "int8/asym/rot", 64, 32), ("q5_1", "iq4_nl", 64, 32), ("q4_0/rot", "q8_0", 32, 64))
FEATURES = ("sinks", "softcap", "sinks+softcap")


def _sink_cases():
    for i, (ks, vs, dk, dv) in enumerate(SINK_CASES):
        for j, feature in enumerate(FEATURES):
            yield pytest.param(ks, vs, dk, dv, feature, SPLITS[(i + j) % 3], id=f"{ks}-{vs}-{dk}-{dv}-{feature}")


@pytest.mark.parametrize("k_spec,v_spec,dk,dv,feature,splits", list(_sink_cases()))
def test_decode_sinks_softcap_head_dims(k_spec, v_spec, dk, dv, feature, splits):
    kx, _ = kv_data(40, dk, 1)
    _, vx = kv_data(40, dv, 1, seed=2)
    k, v = make_side(F.get_format(k_spec), kx), make_side(F.get_format(v_spec), vx)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(BATCH, 3, dk, generator=g)
    lengths = torch.tensor([40, 23])
    kwargs = {}
    if "sinks" in feature:
        kwargs["sinks"] = torch.randn(3, generator=g) * 2 + 1  # logits comparable to the scores
    if "softcap" in feature:
        kwargs["softcap"] = 1.5  # below the largest scores (~5): capping changes them
    out = decode_attention(q, k, v, lengths, num_splits=splits, block_n=16, **kwargs)
    assert out.shape == (BATCH, 3, dv)
    ref = decode_attention_reference(q, k, v, lengths, **kwargs)
    assert rel_err(out, ref) <= TOL
    assert rel_err(ref.float(), decode_attention_reference(q, k, v, lengths)) > 1e-2, "the feature changed nothing"


def test_decode_deepseek_head_dims():
    """K 192 wide (not a power of two: padded to a 256-lane block), V 128, as transformers caches DeepSeek-V3."""
    kx, _ = kv_data(20, 192, 1)
    _, vx = kv_data(20, 128, 1, seed=2)
    k, v = make_side(F.get_format("int4"), kx), make_side(F.get_format("nvfp4"), vx)
    q = torch.randn(BATCH, 2, 192, generator=torch.Generator().manual_seed(5))
    out = decode_attention(q, k, v, torch.tensor([20, 9]), num_splits=2, block_n=16)
    assert rel_err(out, decode_attention_reference(q, k, v, torch.tensor([20, 9]))) <= TOL


@pytest.mark.parametrize("pattern", ("window", "chunk"))
def test_decode_window_and_chunk_masks(pattern):
    """Sliding-window and chunked attention through kv_mask, over a cache that still holds older tokens: a window
    keeps each row's last W tokens, a chunk keeps the tokens since the row's current chunk began (row 1 is also
    left-padded). Blocks with no live token must not be read: their scales are NaN here, the reference's are not."""
    lengths, block = torch.tensor([70, 45]), 16
    kx, vx = kv_data(70)
    fmt = F.get_format("int4")
    clean_k, clean_v = make_side(fmt, kx), make_side(fmt, vx)
    pos = torch.arange(70)
    mask = torch.zeros(BATCH, 70, dtype=torch.bool)
    for b, n in enumerate(lengths.tolist()):
        first = n - 20 if pattern == "window" else (n - 1) // 32 * 32  # window 20; chunk 32
        mask[b] = (pos >= first) & (pos < n)
    mask[1, :5] = False  # left padding as well
    k = dataclasses.replace(clean_k, scale=clean_k.scale.clone())
    v = dataclasses.replace(clean_v, scale=clean_v.scale.clone())
    dead = 0
    for b in range(BATCH):
        for n0 in range(0, 70, block):
            if not mask[b, n0 : n0 + block].any():
                k.scale[b, :, n0 : n0 + block] = float("nan")
                v.scale[b, :, n0 : n0 + block] = float("nan")
                dead += 1
    assert dead >= 3, "the pattern should leave whole blocks dead"
    q = torch.randn(BATCH, KV_HEADS * 3, HEAD_DIM)
    sinks = torch.randn(KV_HEADS * 3)
    out = decode_attention(q, k, v, lengths, num_splits=3, kv_mask=mask, block_n=block, sinks=sinks)
    assert torch.isfinite(out).all()
    assert rel_err(out, decode_attention_reference(q, clean_k, clean_v, lengths, kv_mask=mask, sinks=sinks)) <= TOL


@pytest.mark.parametrize("splits", (1, 2))
def test_decode_sinks_on_empty_rows(splits):
    """A row with nothing to attend to (fully masked, or length 0) returns zeros with sinks too: the sink carries
    no value."""
    kx, vx = kv_data(30)
    fmt = F.get_format("int8")
    k, v = make_side(fmt, kx), make_side(fmt, vx)
    q = torch.randn(BATCH, KV_HEADS * 2, HEAD_DIM)
    sinks = torch.randn(KV_HEADS * 2)
    mask = torch.zeros(BATCH, 30, dtype=torch.bool)
    out = decode_attention(q, k, v, torch.tensor([30, 0]), num_splits=splits, kv_mask=mask, sinks=sinks,
                           softcap=5.0)
    assert out.abs().max() == 0


def test_decode_rejects_bad_sinks_and_softcap():
    kx, vx = kv_data(4)
    fmt = F.get_format("int8")
    k, v = make_side(fmt, kx), make_side(fmt, vx)
    q = torch.randn(BATCH, KV_HEADS * 2, HEAD_DIM)
    with pytest.raises(ValueError, match="one logit per query head"):
        decode_attention(q, k, v, 4, sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="softcap"):
        decode_attention(q, k, v, 4, softcap=-1.0)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_decode_half_query(dtype):
    """Model-dtype queries and tails: fp32 inside, output in the query's dtype."""
    kx, vx = kv_data(50)
    fmt = F.get_format("int4/channel/g32/asym")
    k = make_side(fmt, kx.to(dtype), 32)
    v = make_side(F.get_format("int4/asym"), vx.to(dtype))
    q = torch.randn(BATCH, KV_HEADS * 3, HEAD_DIM).to(dtype)
    out = decode_attention(q, k, v, 50)
    assert out.dtype == dtype
    assert rel_err(out, decode_attention_reference(q, k, v, 50)) <= 1e-2  # one rounding to the half output


def test_decode_default_splits_and_sm_scale():
    kx, vx = kv_data(300)
    fmt = F.get_format("fp8_e4m3/token")
    k, v = make_side(fmt, kx), make_side(fmt, vx)
    q = torch.randn(BATCH, KV_HEADS, HEAD_DIM)
    out = decode_attention(q, k, v, 300, sm_scale=0.3)
    assert rel_err(out, decode_attention_reference(q, k, v, 300, sm_scale=0.3)) <= TOL


def test_decode_without_triton_uses_reference(monkeypatch):
    """The CPU path never needs triton: without it decode_attention is the float64 reference in q's dtype."""
    import kernels.decode

    monkeypatch.setattr(kernels.decode, "triton_usable", lambda device=None: False)
    kx, vx = kv_data(20)
    fmt = F.get_format("int4")
    k, v = make_side(fmt, kx), make_side(fmt, vx)
    q = torch.randn(BATCH, KV_HEADS * 3, HEAD_DIM)
    out = decode_attention(q, k, v, 20)
    assert torch.equal(out, decode_attention_reference(q, k, v, 20).float())


def test_decode_rejects_bad_shapes():
    kx, vx = kv_data(4)
    fmt = F.get_format("int8")
    k, v = make_side(fmt, kx), make_side(fmt, vx)
    with pytest.raises(ValueError, match="one query token"):
        decode_attention(torch.randn(BATCH, KV_HEADS, 1, HEAD_DIM), k, v, 4)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        decode_attention(torch.randn(BATCH, 3, HEAD_DIM), k, v, 4)


# ------------------------------------------------------------------------------------------ reference layout

@pytest.mark.parametrize("spec", FAST + COVERED + GGML + ("fp8_e4m3/token/g16", "int8/head", "q5_0/rot"))
def test_reference_dequantize_matches_formats(spec):
    """The reference reads the packed layout exactly as kvviz.formats writes it."""
    fmt = F.get_format(spec)
    x, _ = kv_data(40)
    q = fmt.quantize(x)
    side = side_from_format(fmt, q.data, q.scale, q.zero, q.tensor_scale)
    torch.testing.assert_close(dequantize_side(side, 40).float(), fmt.dequantize(q), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ element codecs

if kernels.triton_usable():
    import triton
    import triton.language as tl
    from kernels.jit.elements import _e2m1_to_f32, _e8m0_to_f32, _fp8_to_f32
    from kernels.jit.pack import _e2m1_encode, _f32_to_fp8

    @triton.jit
    def _codec(codes, values, out_dec, out_enc, N: tl.constexpr, OP: tl.constexpr):
        """Run the kernels' element codecs on N codes / values (OP: 0 E4M3, 1 E5M2, 2 E8M0, 3 E2M1)."""
        i = tl.arange(0, N)
        c = tl.load(codes + i).to(tl.int32)
        v = tl.load(values + i)
        if OP == 0:
            tl.store(out_dec + i, _fp8_to_f32(c, 4))
            tl.store(out_enc + i, _f32_to_fp8(v, 4))
        elif OP == 1:
            tl.store(out_dec + i, _fp8_to_f32(c, 5))
            tl.store(out_enc + i, _f32_to_fp8(v, 5))
        elif OP == 2:
            tl.store(out_dec + i, _e8m0_to_f32(c))
        else:
            tl.store(out_dec + i, _e2m1_to_f32(c & 15))
            tl.store(out_enc + i, _e2m1_encode(v))


@pytest.mark.parametrize("op,dtype", [(0, torch.float8_e4m3fn), (1, torch.float8_e5m2)])
def test_fp8_codec_exhaustive(op, dtype):
    """All 256 fp8 codes decode as torch's view does; every code and every midpoint between neighbours encodes
    (RNE) as torch's cast does."""
    codes = torch.arange(256, dtype=torch.uint8)
    exact = codes.view(dtype).float()
    finite = exact[torch.isfinite(exact)].unique()  # sorted
    mids = (finite[1:].double() + finite[:-1].double()) / 2
    values = torch.cat([finite, mids.float(), torch.tensor([float("nan")])])
    n = 1024
    values = torch.cat([values, torch.zeros(n - values.numel())])
    dec, enc = torch.empty(n), torch.empty(n, dtype=torch.int32)
    _codec[(1,)](torch.cat([codes, codes, codes, codes]), values, dec, enc, N=n, OP=op)
    torch.testing.assert_close(dec[:256], exact, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(enc.to(torch.uint8), values.to(dtype).view(torch.uint8))


def test_e8m0_and_e2m1_codecs():
    codes = torch.arange(256, dtype=torch.uint8)
    dec, enc = torch.empty(256), torch.empty(256, dtype=torch.int32)
    values = torch.linspace(-7, 7, 256)
    values[:9] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5])  # ties go to the even code
    _codec[(1,)](codes, values, dec, enc, N=256, OP=2)
    expected = torch.where(codes == 255, float("nan"), torch.pow(2.0, codes.double() - 127)).float()
    torch.testing.assert_close(dec, expected, equal_nan=True, rtol=0, atol=0)
    _codec[(1,)](codes, values, dec, enc, N=256, OP=3)
    torch.testing.assert_close(dec, F.e2m1_decode(codes & 15), rtol=0, atol=0)
    assert torch.equal(enc.to(torch.uint8), F.e2m1_encode(values))


# ------------------------------------------------------------------------------------------ quantize and pack

def _pack_and_compare(spec: str, x: torch.Tensor, pos: int = 3, spare: int = 4) -> None:
    fmt = F.get_format(spec)
    b, h, t, d = x.shape
    assert quant_pack_supported(fmt, d)
    q = fmt.quantize(x)
    cap = pos + t + spare
    data = torch.full((b, h, cap, q.data.shape[-1]), 7, dtype=torch.uint8).view(q.data.dtype)
    scale = zero = None
    if q.scale is not None:
        scale = torch.zeros(b, h, cap, q.scale.shape[-1], dtype=q.scale.dtype)
        zero = None if q.zero is None else torch.zeros(b, h, cap, q.zero.shape[-1], dtype=q.zero.dtype)
    quant_pack(fmt, x, data, scale, zero, pos=pos, tensor_scale=q.tensor_scale)
    bytes_of = lambda a: a.contiguous().view(torch.uint8)  # noqa: E731  (NaN payloads compare too)
    assert torch.equal(bytes_of(data[:, :, pos : pos + t]), bytes_of(q.data)), f"{spec}: codes differ"
    assert torch.equal(bytes_of(data[:, :, :pos]), torch.full_like(bytes_of(data[:, :, :pos]), 7)), "wrote before pos"
    if scale is not None:
        assert torch.equal(bytes_of(scale[:, :, pos : pos + t]), bytes_of(q.scale)), f"{spec}: scales differ"
    if zero is not None:
        assert torch.equal(bytes_of(zero[:, :, pos : pos + t]), bytes_of(q.zero)), f"{spec}: zeros differ"


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
@pytest.mark.parametrize("spec", PACKABLE)
def test_quant_pack_bit_exact(spec, dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(BATCH, KV_HEADS, 5, HEAD_DIM, generator=g) * torch.rand(BATCH, KV_HEADS, 5, 1, generator=g) * 3
    x[0, 0, 1, 3] = 20.0  # an outlier channel
    x[1, 1, 2] = 0.0  # an all-zero token: smallest scales
    _pack_and_compare(spec, x.to(dtype))


@pytest.mark.parametrize("spec", ("int8", "int4/g16/asym", "fp8_e4m3/token", "fp8_e5m2/token", "mxfp4", "nvfp4"))
def test_quant_pack_non_finite(spec):
    """Inf / NaN inputs: the group's scale becomes NaN exactly as kvviz.formats stores it."""
    x = torch.randn(1, 2, 4, HEAD_DIM)
    x[0, 0, 1, 5] = float("inf")
    x[0, 1, 2, 20] = float("nan")
    x[0, 1, 3, 0] = float("-inf")
    if spec == "nvfp4":
        x[0, 0] = torch.nan_to_num(x[0, 0], posinf=0.0)  # NV's tensor scale must stay finite
    _pack_and_compare(spec, x)


def _ggml_hostile(dtype) -> torch.Tensor:
    """[2, 2, 6, 64] with blocks that hit ggml's corner cases: ties for the largest |x| (+a before -a, -a before +a),
    values landing on roundf's halves (q8_0: d = 1), a constant block, all-zero and all -0.0 blocks (q4_1's m keeps
    the first zero's sign), a tiny block (iq4_nl's d = 0 below 1e-15), an outlier, Inf and NaN."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 2, 6, 64, generator=g) * torch.rand(2, 2, 6, 1, generator=g) * 3
    x[0, 0, 0, :32] = torch.linspace(-126.5, 126.5, 32)
    x[0, 0, 0, 7], x[0, 0, 0, 20] = 127.0, -127.0  # q8_0: d = 1, so every x.5 is a roundf half
    x[0, 0, 1, 32:40], x[0, 0, 1, 50] = -5.0, 5.0  # -a first
    x[0, 1, 1, :32] = 0.7  # constant
    x[0, 1, 2, :32] = 0.0
    x[0, 1, 2, 32:] = -0.0
    x[1, 0, :2, :32] = x[1, 0, :2, :32].abs()  # non-negative blocks whose minimum is a zero of either sign:
    x[1, 0, 0, 1], x[1, 0, 0, 3] = 0.0, -0.0  # m = +0 (the first zero)
    x[1, 0, 1, 1], x[1, 0, 1, 3] = -0.0, 0.0  # m = -0
    x[1, 0, 2, 32:] = 1e-17  # below iq4_nl's 1e-15
    x[1, 1, 0, 9] = 60.0
    x[1, 1, 3, 40] = float("inf")
    x[1, 1, 4, 2] = float("nan")
    x[1, 1, 5, 33] = float("-inf")
    return x.to(dtype)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
@pytest.mark.parametrize("spec", GGML + ("q5_1/rot",))
def test_quant_pack_llama_cpp_types_bit_exact(spec, dtype):
    """Codes in ggml's block order, fp16 d (and m) byte for byte as kvviz.formats (so llama.cpp) stores them."""
    _pack_and_compare(spec, _ggml_hostile(dtype))


def test_quant_pack_many_tokens_and_rejections():
    """A prefill-sized append spans several token blocks; channel formats are left to kvviz.formats."""
    x = torch.randn(1, 2, 37, 64)
    _pack_and_compare("int4/asym", x, pos=0)
    assert not quant_pack_supported(F.get_format("int2/channel/g32/asym"), 64)
    assert not quant_pack_supported(F.get_format("int4"), 96)
    with pytest.raises(ValueError, match="fmt.quantize"):
        quant_pack(F.get_format("int4/channel/g32/asym"), x, torch.zeros(1, 2, 40, 32, dtype=torch.uint8))


# ------------------------------------------------------------------------------------------ GPU compilation

_COMPILE_SCRIPT = r'''
import inspect, sys
sys.path.insert(0, sys.argv[1])
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.jit.decode import _decode_stage1, _decode_stage2
from kernels.jit.pack import _quant_pack_kernel
from kernels.jit.ggml_pack import _ggml_pack_kernel

def build(fn, ptrs, consts, **options):
    names = list(inspect.signature(fn.fn).parameters)
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "fp32" if n in ("qk_scale", "softcap") else "i32")
           for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)  # H100 / H200: TTIR -> PTX -> cubin

def side(p, **kw):
    flags = dict(ELEM=0, BITS=16, OFFSET=0, SCALE=0, SFMT=0, GROUP=128, FOLD=True, ZERO=False, TENSOR=False,
                 TZERO=False, TAIL=False, GGML=False, RENORM=False, ZP=0, QJL=0)
    return {f"{p}_{k}": v for k, v in {**flags, **kw}.items()}

ptrs = {n: "*fp32" for n in ("K_TS", "K_TZ", "V_TS", "V_TZ", "K_VALS", "V_VALS", "MID_O", "MID_ML", "SINKS")}
ptrs.update(Q="*bf16", OUT="*bf16", K="*u8", V="*u8", KS="*fp16", KZ="*fp16", VS="*u8", VZ="*fp16", KT="*bf16",
            VT="*bf16", K_NP="*i32", V_NP="*i32", LENGTHS="*i32", MASK="*u8")
# KIVI-2 K (channel scales, zeros, tail) with an NVFP4 V (E4M3 block scales, tensor scale), masked, split.
build(_decode_stage1, ptrs, dict(
    H_KV=8, GQA=4, HEAD_DIM_K=128, HEAD_DIM_V=128, BLOCK_G=16, BLOCK_N=32, BLOCK_DK=128, BLOCK_DV=128,
    PRECISION="ieee", HAS_MASK=True, HAS_SINKS=False, SOFTCAP=False, SINGLE_SPLIT=False,
    **side("K", ELEM=1, BITS=2, SCALE=2, GROUP=32, FOLD=False, ZERO=True, TAIL=True),
    **side("V", ELEM=4, BITS=4, SCALE=1, SFMT=2, GROUP=16, FOLD=False, TENSOR=True, TAIL=True)))
# int8/asym K (folded per-token scale and zero) with a folded MX V (E8M0) at head_dim 32, one split, sinks and
# softcapping (gpt-oss, Gemma 2).
ptrs.update(K="*u8", KS="*fp16", VS="*u8")
build(_decode_stage1, ptrs, dict(
    H_KV=2, GQA=3, HEAD_DIM_K=32, HEAD_DIM_V=32, BLOCK_G=16, BLOCK_N=64, BLOCK_DK=32, BLOCK_DV=32,
    PRECISION="ieee", HAS_MASK=False, HAS_SINKS=True, SOFTCAP=True, SINGLE_SPLIT=True,
    **side("K", ELEM=0, BITS=8, SCALE=1, GROUP=32, ZERO=True), **side("V", ELEM=4, BITS=4, SCALE=1, SFMT=1, GROUP=32)))
# DeepSeek-V3 widths: an MXFP4 K of 192 (a 256-lane block) and an NVFP4 V of 128, masked, sinks, split.
ptrs.update(K="*u8", KS="*u8", VS="*u8")
build(_decode_stage1, ptrs, dict(
    H_KV=1, GQA=16, HEAD_DIM_K=192, HEAD_DIM_V=128, BLOCK_G=16, BLOCK_N=32, BLOCK_DK=256, BLOCK_DV=128,
    PRECISION="ieee", HAS_MASK=True, HAS_SINKS=True, SOFTCAP=False, SINGLE_SPLIT=False,
    **side("K", ELEM=4, BITS=4, SCALE=1, SFMT=1, GROUP=32, FOLD=False),
    **side("V", ELEM=4, BITS=4, SCALE=1, SFMT=2, GROUP=16, FOLD=False, TENSOR=True)))
# llama.cpp's types: a q5_1 K (ggml blocks with qh, fp16 d and m per 32) with an iq4_nl V (table), tails, masked.
ptrs.update(K="*u8", KS="*fp16", KZ="*fp16", VS="*fp16")
build(_decode_stage1, ptrs, dict(
    H_KV=8, GQA=4, HEAD_DIM_K=128, HEAD_DIM_V=128, BLOCK_G=16, BLOCK_N=32, BLOCK_DK=128, BLOCK_DV=128,
    PRECISION="ieee", HAS_MASK=True, HAS_SINKS=False, SOFTCAP=False, SINGLE_SPLIT=False,
    **side("K", ELEM=1, BITS=5, SCALE=1, GROUP=32, FOLD=False, ZERO=True, TAIL=True, GGML=True),
    **side("V", ELEM=5, BITS=4, SCALE=1, GROUP=32, FOLD=False, TAIL=True, GGML=True)))
# The engines' stores: vLLM's int4_per_token_head K (a zero point in the fp32 scale's low bits) with a TurboQuant
# k3 "nc" V read as a value store would be (3-bit codebook, norm correction, fp16 norm), split and masked.
ptrs.update(K="*u8", KS="*i32", V="*u8", VS="*fp16")
build(_decode_stage1, ptrs, dict(
    H_KV=8, GQA=4, HEAD_DIM_K=128, HEAD_DIM_V=128, BLOCK_G=16, BLOCK_N=32, BLOCK_DK=128, BLOCK_DV=128,
    PRECISION="ieee", HAS_MASK=True, HAS_SINKS=False, SOFTCAP=False, SINGLE_SPLIT=False,
    **side("K", ELEM=1, BITS=4, SCALE=1, ZP=4), **side("V", ELEM=6, BITS=3, SCALE=1, RENORM=True)))
# TQ-prod4 on both sides (3-bit codebook, sign bits after the codes, the residual norm beside the norm), split.
ptrs.update(Q="*fp32", K="*u8", KS="*fp16", V="*u8", VS="*fp16", OUT="*fp32")
build(_decode_stage1, ptrs, dict(
    H_KV=8, GQA=4, HEAD_DIM_K=128, HEAD_DIM_V=128, BLOCK_G=16, BLOCK_N=32, BLOCK_DK=128, BLOCK_DV=128,
    PRECISION="ieee", HAS_MASK=True, HAS_SINKS=False, SOFTCAP=False, SINGLE_SPLIT=False,
    **side("K", ELEM=6, BITS=3, SCALE=1, QJL=48), **side("V", ELEM=6, BITS=3, SCALE=1, QJL=48)))
for sinks, parts in ((False, 1), (True, 1), (False, 2)):
    build(_decode_stage2, {"MID_O": "*fp32", "MID_ML": "*fp32", "SINKS": "*fp32", "OUT": "*bf16"},
          dict(H_KV=8, GQA=4, HEAD_DIM_V=128, BLOCK_G=16, BLOCK_S=16, BLOCK_DV=128, HAS_SINKS=sinks, PARTS=parts))
for kind, bits, group, scale in ((0, 4, 32, "*fp16"), (4, 4, 16, "*u8")):  # int4/g32 from fp16; NVFP4
    build(_quant_pack_kernel, {"X": "*fp16", "DATA": "*u8", "SCALE": scale, "ZERO": "*fp16", "TS": "*fp32"},
          dict(KIND=kind, BITS=bits, FP8_EXP=4, GROUP=group, STATIC=False, HALF_DIV=True, HEAD_DIM=128, BLOCK_T=16))
for ggml_type, data in ((4, "*u8"), (5, "*u8"), (0, "*i8")):  # q5_1, iq4_nl (its least-squares d), q8_0
    build(_ggml_pack_kernel, {"X": "*bf16", "DATA": data, "SCALE": "*fp16", "ZERO": "*fp16"},
          dict(TYPE=ggml_type, HEAD_DIM=128, BLOCK_T=16), enable_fp_fusion=False)
print("compiled")
'''


def test_kernels_compile_for_hopper():
    """The interpreter skips compilation, and some errors only the compiler sees (a plain-float global, say): so
    compile the kernels, in a subprocess without TRITON_INTERPRET, to sm_90 cubins (no GPU needed)."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    repo = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, repo], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
