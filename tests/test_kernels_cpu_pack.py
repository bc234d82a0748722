"""The CPU quantize-and-pack (kernels/cpu/pack.py, numba) against kvviz.formats: byte for byte.

Codes, scales and zero points (NaN payloads included) equal fmt.quantize's fields for every format the packer
covers, at head_dim 64 / 128 / 256, one token and several, written at pos > 0 into buffers with spare capacity,
from fp32, fp16 and bf16 inputs, with static per-tensor and per-head scales. Inputs hold the corner cases: ties in
rounding, all-zero and signed-zero tokens, subnormal and huge values, Inf and NaN. The element encoders are
checked exhaustively (every fp8 code and every midpoint between neighbours against torch's casts). A cache built
with the CPU packer stores exactly the buffers, and generates exactly the tokens, of the kvviz.formats path.

    python -m pytest tests/test_kernels_cpu_pack.py -q
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

import kvviz
import kvviz.formats as F
from kernels.cpu import pack as cpu_pack
from kernels.cpu.pack import quant_pack_cpu, quant_pack_cpu_supported
from kvviz.cache import QuantizedKVCache, QuantizedKVLayer, sides
from kvviz.cache.sides import ScaleWarning

pytestmark = pytest.mark.skipif(cpu_pack._jit() is None, reason="numba is not installed")

DYNAMIC = (
    "int8", "int4", "int2", "int8/asym", "int4/asym", "int2/asym", "int8/g16", "int4/g32", "int4/g16/asym",
    "int2/g16/asym", "fp8_e4m3/token", "fp8_e5m2/token", "fp8_e4m3/token/g16", "fp8_e5m2/token/g32", "mxfp4",
    "fp4_mx_block16", "nvfp4", "int4/rot", "int8/asym/rot", "fp8_e4m3/token/rot", "mxfp4/rot", "nvfp4/rot",
    "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q4_0/rot", "iq4_nl/rot",  # llama.cpp's types
)
STATIC = ("fp8_e4m3", "fp8_e5m2", "fp8_e4m3/head", "fp8_e5m2/head", "int8/tensor", "int4/head", "int2/tensor",
          "fp8_e4m3/rot", "int4/head/rot")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def hostile(b: int, h: int, t: int, d: int, seed: int = 0) -> torch.Tensor:
    """[b, h, t, d] fp32: random tokens of varied scale, with an outlier, an all-zero token, a token of signed zeros
    midpoints (ties in int4's and E2M1's rounding), a subnormal token and a huge one (last tokens when t allows)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, t, d, generator=g) * torch.rand(b, h, t, 1, generator=g).add(0.05) * 3
    x[0, 0, 0, 3] = 20.0  # an outlier channel
    if t > 1:
        x[-1, -1, 1] = 0.0  # an all-zero token: smallest scales
    if t > 2:  # ties: int4's scale is 1 (amax 7 in every group of 16), MX's 2**0, so these values are midpoints
        ties = torch.tensor([7.0, 0.25, 0.5, 0.75, 1.25, 1.5, 1.75, 2.5, 3.5, -0.5, -2.5, -3.5, 5.0, 6.5, -0.0, 0.0])
        x[0, -1, 2] = ties.repeat(d // 16)
    if t > 3:
        x[-1, 0, 3] = torch.randn(d, generator=g) * 1e-39  # subnormal fp32 (0 in fp16 and below bf16's range)
    if t > 4:
        x[-1, 0, 4] = torch.randn(d, generator=g) * 3e4  # near fp16's max
    return x


def pack_and_compare(spec: str, x: torch.Tensor, pos: int = 3, spare: int = 4, scale=None) -> int:
    """Quantize x with fmt.quantize and with quant_pack_cpu into buffers pre-filled with 7s; assert the written rows
    equal fmt.quantize's fields byte for byte and nothing else was written. Returns the packer's saturated count."""
    fmt = F.get_format(spec)
    b, h, t, d = x.shape
    assert quant_pack_cpu_supported(fmt, d)
    q = fmt.quantize(x, scale=scale)
    ts = q.tensor_scale if scale is None else scale
    cap = pos + t + spare

    def buffer(a: torch.Tensor | None) -> torch.Tensor | None:
        if a is None or a.dim() < 4:
            return None
        return torch.full((b, h, cap, a.shape[-1] * a.element_size()), 7, dtype=torch.uint8).view(a.dtype)

    data, scale_buf, zero = buffer(q.data), buffer(q.scale), buffer(q.zero)
    over = quant_pack_cpu(fmt, x, data, scale_buf, zero, pos=pos, tensor_scale=ts)
    for name, buf, want in (("codes", data, q.data), ("scales", scale_buf, q.scale), ("zeros", zero, q.zero)):
        if buf is None:
            continue
        got = buf.view(torch.uint8)  # bytes: NaN payloads and signed zeros compare too
        rows, want = buf[:, :, pos : pos + t], want.contiguous()
        if name == "zeros":  # a zero min of +0.0 and -0.0: torch's vectorized amin returns either, by lane and ISA
            rows, want = (torch.where(a == 0, torch.zeros((), dtype=a.dtype), a) for a in (rows, want))
        assert torch.equal(rows.view(torch.uint8), want.view(torch.uint8)), f"{spec}: {name} differ"
        untouched = torch.cat([got[:, :, :pos], got[:, :, pos + t :]], dim=2)
        assert bool((untouched == 7).all()), f"{spec}: {name} written outside rows {pos}..{pos + t - 1}"
    return over


def test_the_packer_compiles_and_passes_its_smoke_test():
    assert cpu_pack.cpu_pack_usable()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", (64, 128, 256))
@pytest.mark.parametrize("spec", DYNAMIC)
def test_bit_exact(spec, d, dtype):
    """Several tokens (the prefill's path) at pos > 0, then one token at pos 0 (a decode step)."""
    x = hostile(2, 3, 6, d, seed=d).to(dtype)
    pack_and_compare(spec, x, pos=5, spare=3)
    pack_and_compare(spec, x[:, :, 2:3], pos=0, spare=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", STATIC)
def test_static_scales_bit_exact(spec, dtype):
    """Per-tensor and per-head scales given (one per head, or one for all heads), small enough that some values
    saturate: fp8 clamps them, int clamps the codes."""
    x = hostile(2, 3, 5, 64, seed=1).to(dtype)
    fmt = F.get_format(spec)
    heads = torch.tensor([0.01, 0.5, 3.0]) if fmt.granularity == "head" else torch.tensor(0.05)
    pack_and_compare(spec, x, scale=heads)
    pack_and_compare(spec, x[:, :, 1:2], pos=0, scale=heads.max())  # one value for every head


def test_nvfp4_takes_any_global_scale():
    """The cache pins NVFP4's global scale to the prefill's; every block scale is then relative to the one given,
    including blocks beyond it (clamped at E4M3's 448)."""
    x = hostile(1, 3, 4, 64)
    fmt = F.get_format("nvfp4")
    for ts in (1e-3, 0.05, 7.0):
        q = fmt.quantize(torch.cat([torch.full((1, 3, 1, 64), ts * 2688.0), x], dim=2))  # its amax sets ts
        data = torch.zeros(1, 3, 5, 32, dtype=torch.uint8)
        scale = torch.zeros(1, 3, 5, 4, dtype=torch.float8_e4m3fn)
        quant_pack_cpu(fmt, x, data, scale, pos=1, tensor_scale=q.tensor_scale)
        assert torch.equal(data[:, :, 1:], q.data[:, :, 1:])
        assert torch.equal(scale[:, :, 1:].view(torch.uint8), q.scale[:, :, 1:].view(torch.uint8))


@pytest.mark.parametrize("spec", ("int8", "int4", "int2/g16", "int4/g16/asym", "fp8_e4m3/token", "fp8_e5m2/token",
                                  "mxfp4", "fp4_mx_block16", "nvfp4", "fp8_e4m3", "int4/tensor", "q8_0", "q4_0",
                                  "q4_1", "q5_0", "q5_1", "iq4_nl"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite(spec, dtype):
    """Inf / NaN inputs: the group's scale becomes NaN, the element's code what torch's casts and nan_to_num give."""
    x = hostile(1, 2, 4, 64, seed=2)
    x[0, 0, 1, 5] = float("inf")
    x[0, 1, 2, 20] = float("nan")
    x[0, 1, 3, 0] = float("-inf")
    x[0, 1, 3, 40] = float("nan")
    scale = torch.tensor(0.02) if F.get_format(spec).static_scale else None
    pack_and_compare(spec, x.to(dtype), scale=scale)


def test_fp8_encoder_exhaustive():
    """Every fp8 code, and every midpoint between neighbouring codes (ties: to the even code), of both formats
    encodes as torch's cast does; so do the values one fp32 step either side of each midpoint."""
    for spec, dtype, fmax in (("fp8_e4m3/unit", torch.float8_e4m3fn, 448.0), ("fp8_e5m2/unit", torch.float8_e5m2,
                                                                              57344.0)):
        codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
        finite = codes[torch.isfinite(codes)].unique()  # sorted
        mids = ((finite[1:].double() + finite[:-1].double()) / 2).float()
        near = torch.cat([torch.nextafter(mids, torch.tensor(-1e9)), torch.nextafter(mids, torch.tensor(1e9))])
        values = torch.cat([finite, mids, near, torch.tensor([1e-30, -1e-30, fmax * 1.01, -fmax * 3])])
        values = torch.cat([values, values.new_zeros(-values.numel() % 64)]).reshape(1, 1, -1, 64)
        pack_and_compare(spec, values, pos=0, spare=0, scale=1.0)


def test_saturation_count_matches_the_cache_rule():
    """The count returned for static fp8 is the one kvviz.cache's formats path takes: |x| > fmax * s * (1 + 1e-6),
    values right at the boundary included."""
    g = torch.Generator().manual_seed(4)
    for spec in ("fp8_e4m3", "fp8_e5m2/head", "fp8_e4m3/rot"):
        fmt = F.get_format(spec)
        fmax = F.max_value(fmt.base)
        s = torch.rand(3, generator=g) + 0.01 if fmt.granularity == "head" else torch.rand((), generator=g) + 0.01
        limit = fmax * s.reshape(-1, 1, 1) * (1 + 1e-6)
        x = torch.randn(1, 3, 8, 64, generator=g) * limit * 0.7
        x[0, :, 0, :3] = limit.reshape(-1, 1)  # exactly at the limit: not counted
        x[0, :, 0, 3:6] = torch.nextafter(limit.reshape(-1, 1), torch.tensor(1e30))  # one step beyond: counted
        over = pack_and_compare(spec, x, scale=s)
        assert over == int((x.abs() > limit).sum()) > 0


def test_rejections():
    """Channel formats, float casts and non-power-of-two head dims (but for ggml's unrotated blocks of 32) are left to
    kvviz.formats."""
    assert quant_pack_cpu_supported(F.get_format("q4_0"), 96)
    for spec, d in (("int2/channel/g32/asym", 64), ("fp8_e4m3/channel", 64), ("q4_0/rot", 96), ("int4", 96),
                    ("bf16", 64), ("fp16", 64)):
        assert not quant_pack_cpu_supported(F.get_format(spec), d), spec
    with pytest.raises(ValueError, match="fmt.quantize"):
        quant_pack_cpu(F.get_format("int4/channel/g32/asym"), torch.randn(1, 2, 4, 64),
                       torch.zeros(1, 2, 40, 32, dtype=torch.uint8))
    with pytest.raises(ValueError, match="pass tensor_scale"):
        quant_pack_cpu(F.get_format("nvfp4"), torch.randn(1, 2, 1, 64), torch.zeros(1, 2, 4, 32, dtype=torch.uint8),
                       torch.zeros(1, 2, 4, 4, dtype=torch.float8_e4m3fn))


# ------------------------------------------------------------------------------------------ in the cache

CACHE_SPECS = ("int4", "k8v4", "int2/g16/asym", "fp8", "fp8_e5m2/head/calibrated", "fp8_e4m3/token", "mxfp4", "nvfp4",
               "fp4_mx_block16", "int4/rot", "k=int4/channel/g16/asym,v=int4/g16/asym", "k=q8_0,v=q4_0",
               "k=q5_1,v=iq4_nl", "k=q4_1,v=q5_0")


@functools.lru_cache(maxsize=None)
def _model(dtype: torch.dtype):
    """The tiny llama with head_dim 32 (MX's blocks of 32 fit): (model, tokenizer), built once."""
    from transformers import AutoModelForCausalLM

    from kvviz.tiny import ByteTokenizer, tiny_config

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config("llama", head_dim=32), dtype=dtype,
                                                 attn_implementation="kvviz")
    model.eval()
    gen = model.generation_config
    gen.pad_token_id, gen.eos_token_id, gen.bos_token_id = 0, None, None
    return model, ByteTokenizer()


def _run(monkeypatch, spec: str, dtype: torch.dtype, cpu_packer: bool):
    """Greedy tokens and every side's stored bytes, with KVVIZ_BACKEND=torch and the CPU packer forced on or off."""
    monkeypatch.setattr(kvviz.runtime.default(), "backend", "torch")
    packer = (lambda fmt, x: quant_pack_cpu if quant_pack_cpu_supported(fmt, x.shape[3]) else None) if cpu_packer \
        else (lambda fmt, x: None)
    monkeypatch.setattr(sides, "_fused_packer", packer)
    model, tok = _model(dtype)
    layers = model.config.num_hidden_layers
    scales = {i: (1e-6, 2e-6) for i in range(layers)} if spec.endswith("calibrated") else None  # K, V saturate
    cache = QuantizedKVCache(model.config, spec, scales=scales)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model.generate(**tok(["hello world, this is kvviz", "hi"]), max_new_tokens=6, do_sample=False,
                             cache=cache)
    side_list = [side for layer in cache.layers for side in (layer.k, layer.v)]
    stored = [{name: buf.view().contiguous().view(torch.uint8) for name, buf in side.fields.items()}
              for side in side_list]
    used = sum(side._packer is quant_pack_cpu for side in side_list)
    messages = sorted(str(w.message) for w in caught if isinstance(w.message, ScaleWarning))
    return out, stored, [side.saturated for side in side_list], messages, used


CACHE_16BIT = ("int4", "fp8", "nvfp4", "fp8_e5m2/head/calibrated")  # on fp16 and bf16 models


@pytest.mark.parametrize("spec, dtype", [(spec, torch.float32) for spec in CACHE_SPECS] + [
    (spec, dtype) for dtype in (torch.float16, torch.bfloat16) for spec in CACHE_16BIT])
def test_cache_with_the_cpu_packer_stores_what_kvviz_formats_stores(monkeypatch, spec, dtype):
    """QuantizedKVCache with the CPU packer: the same tokens, the same bytes in every buffer, the same FP8
    saturation counts and warnings as appending through kvviz.formats (KVVIZ_BACKEND=torch for both)."""
    tokens, stored, saturated, warned, used = _run(monkeypatch, spec, dtype, cpu_packer=True)
    want_tokens, want_stored, want_saturated, want_warned, unused = _run(monkeypatch, spec, dtype, cpu_packer=False)
    assert used == len(stored) // (2 if spec.startswith("k=int4/channel") else 1) and unused == 0
    assert torch.equal(tokens, want_tokens)
    for got, want in zip(stored, want_stored, strict=True):
        assert got.keys() == want.keys()
        for name in got:
            assert torch.equal(got[name], want[name]), f"{spec}: {name} differs"
    assert saturated == want_saturated and warned == want_warned
    if spec == "fp8":  # a scale fitted on a 26-token prefill is warned about
        assert any("fewer than 64" in m for m in warned), warned
    if spec.endswith("calibrated"):  # scales far too small: every side saturates, warned about once
        assert all(saturated) and sum("values exceed" in m for m in warned) == len(saturated), warned


def test_the_cache_picks_the_cpu_packer_on_the_cpu_backend(monkeypatch):
    """KVVIZ_BACKEND=cpu: supported formats (llama.cpp's types too) append through quant_pack_cpu, chosen once per
    side; channel formats and KVVIZ_BACKEND=torch through kvviz.formats."""
    from kvviz.attention import active_backend

    monkeypatch.setattr(kvviz.runtime.default(), "backend", "cpu")
    assert active_backend() == "cpu"
    warnings.simplefilter("ignore", ScaleWarning)  # fp8's scale from 3 tokens (pytest restores the filters)
    picks = {}
    for spec in ("int4", "nvfp4", "fp8", "int4/channel/g32/asym", "q8_0"):
        layer = QuantizedKVLayer(kvviz.get_format(spec), kvviz.get_format(spec))
        x = torch.randn(1, 2, 3, 32)
        layer.update(x, x)
        layer.update(x[:, :, :1], x[:, :, :1])
        picks[spec] = layer.k._packer
    assert picks == {"int4": quant_pack_cpu, "nvfp4": quant_pack_cpu, "fp8": quant_pack_cpu,
                     "int4/channel/g32/asym": None, "q8_0": quant_pack_cpu}
    monkeypatch.setattr(kvviz.runtime.default(), "backend", "torch")
    layer = QuantizedKVLayer(kvviz.get_format("int4"), kvviz.get_format("int4"))
    layer.update(torch.randn(1, 2, 3, 32), torch.randn(1, 2, 3, 32))
    assert layer.k._packer is None


@pytest.mark.parametrize("prefill_scale", (0.0, 1.0))
def test_nvfp4_sides_pinned_by_the_prefill_store_what_the_formats_store(monkeypatch, prefill_scale):
    """NVFP4's global scale is pinned to the prefill's amax and later values saturate to it; an all-zero prefill
    pins every later value to 0 (the formats path clamps), which a side then keeps off the packer."""
    stored = {}
    for backend in ("cpu", "torch"):
        monkeypatch.setattr(kvviz.runtime.default(), "backend", backend)
        side = sides.Side(kvviz.get_format("nvfp4"), 0, None, "layer 0 K")
        prefill = torch.randn(1, 3, 4, 64, generator=torch.Generator().manual_seed(0)) * prefill_scale
        side.init(prefill)
        side.append(prefill)
        for t in (1, 1, 5):
            side.append(torch.randn(1, 3, t, 64, generator=torch.Generator().manual_seed(t)) * 3)
        stored[backend] = {name: buf.view().view(torch.uint8).clone() for name, buf in side.fields.items()}
        assert (side._packer is quant_pack_cpu) == (backend == "cpu" and prefill_scale > 0)
    for name, want in stored["torch"].items():
        assert torch.equal(stored["cpu"][name], want), name
