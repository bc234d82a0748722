"""vLLM's KV dtypes as kvviz formats: stored bytes and read-back values equal vLLM's store and dequantize arithmetic.

Each reference below transcribes one vLLM kernel, one program (token, head) at a time, as the kernel computes it
(file and function named at each), and shares no code with kvviz.formats. Where the GPU instruction is approximate
(Triton's fp32 division, rcp.approx, tl.sqrt) the reference takes the IEEE result, and where Triton or nvcc fuse a
multiply-add the reference rounds once, as the FMA does. Run: pytest tests/test_formats_vllm.py
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import kvviz
from kvviz.cache import QuantizedKVCache
from kvviz.formats import engine_skip_layers
from kvviz.tiny import ByteTokenizer, tiny_config, tiny_model

HEAD_DIMS = (64, 128)


def _kv(head_dim: int, seed: int = 0) -> torch.Tensor:
    """Random bf16 states [batch 2, heads 3, tokens 5, head_dim], outliers and exact ties included."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 5, head_dim, generator=g) * torch.exp(torch.randn(2, 3, 5, 1, generator=g))
    x[0, 0, 0] = torch.arange(head_dim) % 16  # 0..15 repeated: asymmetric 4-bit codes land on exact halves
    x[0, 0, 1] = (torch.arange(head_dim) % 8) * 0.5 - 1.75
    x[0, 0, 2, :16] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75,
                                    -2.5, -3.5, -5.0, 0.0])  # E2M1's midpoints with a block scale of 1.0
    x[1, 2, 4] = 0.0
    return x.to(torch.bfloat16)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.float().reshape(-1, x.shape[-1])  # [tokens * heads, D]: one kernel program per row


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 a * b + c rounded once (a fused multiply-add): exact in float64 for these operands."""
    return (a.double() * b.double() + c.double()).float()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


# ------------------------------------------------------------------------------------------ int8 / fp8 per token-head

def _ref_per_token_head(x: torch.Tensor, fp8: bool):
    """triton_reshape_and_cache_flash.py `_reshape_cache_per_token_head`, one (token, head) per program."""
    qmax, qmin = (448.0, -448.0) if fp8 else (127.0, -128.0)
    codes, scales = [], []
    for row in _rows(x):
        k_scale = torch.maximum(row.abs().max() / qmax, torch.tensor(1e-6))  # tl.maximum(absmax / QUANT_MAX, 1e-6)
        inv = torch.tensor(1.0) / k_scale  # 1.0 / k_scale: IEEE division
        k_q = row * inv
        if not fp8:  # IS_INT_QUANT: where(k_q >= 0, k_q + 0.5, k_q - 0.5), each k_h * inv +- 0.5 one FMA
            k_q = torch.where(k_q >= 0, _fma(row, inv, torch.tensor(0.5)), _fma(row, inv, torch.tensor(-0.5)))
        k_q = torch.clamp(k_q, qmin, qmax)
        codes.append(k_q.to(torch.float8_e4m3fn) if fp8 else k_q.trunc().to(torch.int8))  # tl.store's cast
        scales.append(k_scale.reshape(1))
    data = torch.stack(codes)
    scale = torch.stack(scales)
    values = data.float() * scale  # the read kernels scale scores / probabilities by it
    return data, scale, values


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("name", ["int8_per_token_head", "fp8_per_token_head"])
def test_per_token_head_matches_vllm(name, head_dim):
    x = _kv(head_dim)
    fmt = kvviz.get_format(f"vllm:{name}")
    q = fmt.quantize(x)
    data, scale, values = _ref_per_token_head(x, fp8=name.startswith("fp8"))
    assert torch.equal(_bits(q.data.reshape(data.shape)), _bits(data))
    assert torch.equal(q.scale.reshape(scale.shape), scale)
    assert torch.equal(fmt.dequantize(q).reshape(values.shape), values.to(torch.bfloat16))


# ------------------------------------------------------------------------------------------ int4 per token-head

def _ref_rht_signs(d: int) -> torch.Tensor:
    """int4_per_token_head.py `_get_rht_signs(d, 0)`."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(0x9E3779B9 + 0 * 0x517CC1B7)
    return 2.0 * torch.bernoulli(torch.full((d,), 0.5, device="cpu"), generator=gen) - 1.0


def _ref_fwht(v: torch.Tensor) -> torch.Tensor:
    """int4_per_token_head.py `fast_hadamard_transform`, tier 3 (the PyTorch butterfly, as on the CPU), one row."""
    v = v.clone()
    d, h = v.shape[-1], 1
    while h < d:
        out = v.clone()
        for start in range(0, d, 2 * h):
            a, b = v[start : start + h], v[start + h : start + 2 * h]
            out[start : start + h], out[start + h : start + 2 * h] = a + b, a - b
        v, h = out, 2 * h
    return v


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v >= 0, (v + 0.5).trunc(), (v - 0.5).trunc())


def _ref_rht(row: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """int4_per_token_head.py `single_rht`, one row: blocks of b = largest_power_of_2_divisor(d) (d / b of them, each
    with _get_rht_signs(b, 0)), H (x * signs) each, or (H x) * signs with inverse."""
    d = row.shape[-1]
    b = d & -d
    signs = _ref_rht_signs(b)
    blocks = [row[i : i + b] for i in range(0, d, b)]
    return torch.cat([_ref_fwht(v) * signs if inverse else _ref_fwht(v * signs) for v in blocks])


def _ref_int4(x: torch.Tensor):
    """int4_per_token_head.py `reshape_and_cache_int4` (single_rht, then `_reshape_cache_int4_kernel`) and the read
    path of `_attn_packed` + `unified_attention_int4` (un-rotation of the output, by linearity of each row)."""
    d = x.shape[-1]
    rht_norm = d & -d  # largest_power_of_2_divisor(head_size)
    packed, scales, values = [], [], []
    for row in _rows(x):
        k = _ref_rht(row).to(torch.bfloat16).float()  # single_rht(key.float()).to(key.dtype), then .to(fp32)
        k_min, k_max = k.min(), k.max()
        k_scale = torch.maximum((k_max - k_min) / 15.0, torch.tensor(1e-6))
        k_zp_f = torch.clamp(_round_half_away(-k_min / k_scale), 0.0, 15.0)
        inv_k = torch.tensor(1.0) / k_scale
        k_q = torch.clamp(_round_half_away(_fma(k, inv_k, k_zp_f)), 0.0, 15.0)
        k_scale_packed = ((k_scale.reshape(1).view(torch.int32) & -16) | k_zp_f.to(torch.int32)).view(torch.float32)
        byte = k_q[0::2].to(torch.uint8) & 0xF | ((k_q[1::2].to(torch.uint8) & 0xF) << 4)  # pack_int4_nibbles
        bits = k_scale_packed.view(torch.int32)
        zp, scale = (bits & 0xF).float(), (bits & -16).view(torch.float32)
        rotated = (k_q - zp) * scale
        values.append(_ref_rht(rotated, inverse=True) / rht_norm)  # single_rht(out, inverse=True) / rht_norm
        packed.append(byte)
        scales.append(k_scale_packed)
    return torch.stack(packed), torch.stack(scales), torch.stack(values)


@pytest.mark.parametrize("head_dim", [*HEAD_DIMS, 96, 80])  # 96, 80: blocks of 32, 16
def test_int4_per_token_head_matches_vllm(head_dim):
    x = _kv(head_dim)
    fmt = kvviz.get_format("vllm:int4_per_token_head")
    q = fmt.quantize(x)
    data, scale, values = _ref_int4(x)
    assert torch.equal(q.data.reshape(data.shape), data)
    assert torch.equal(_bits(q.scale.reshape(scale.shape)), _bits(scale))
    assert torch.equal(fmt.dequantize(q).reshape(values.shape), values.to(torch.bfloat16))


# ------------------------------------------------------------------------------------------ nvfp4, nvfp4_4over6

def _ref_e2m1(v: float) -> tuple[int, float]:
    """nvfp4_kv_cache_kernels.cu `round_to_nearest_e2m1` (cvt.rn.satfinite.e2m1x2.f32): (code, value)."""
    ax = abs(v)
    for bound, closed, q in ((0.25, True, 0.0), (0.75, False, 0.5), (1.25, True, 1.0), (1.75, False, 1.5),
                             (2.5, True, 2.0), (3.5, False, 3.0), (5.0, True, 4.0)):
        if ax < bound or (closed and ax == bound):
            break
    else:
        q = 6.0
    code = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0).index(q) | (8 if math.copysign(1.0, v) < 0 else 0)
    return code, math.copysign(q, v)


def _f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


def _ref_candidate(vec_max: float, denominator: float) -> tuple[int, float]:
    """nvfp4_candidate_scale with SFScaleVal = 1 / k_scale = 1.0 (vLLM's default scale): (E4M3 byte, outputScale)."""
    sf_value = _f32(_f32(1.0) * _f32(vec_max * _f32(1.0 / denominator)))
    tmp = torch.tensor(min(sf_value, 448.0)).to(torch.float8_e4m3fn)  # __nv_fp8_e4m3: nearest even, satfinite
    sf = float(tmp.float())
    out = _f32(1.0 / _f32(sf * _f32(1.0 / 1.0))) if sf != 0.0 else 0.0
    return int(tmp.view(torch.uint8)), out


def _ref_block_error(vals: list[float], out: float) -> float:
    """nvfp4_reconstruction_error: pairs in order, each (dx * dx + dy * dy) added to an fp32 sum."""
    err = _f32(0.0)
    deq = _f32(1.0 / out) if out != 0.0 else 0.0
    for i in range(0, len(vals), 2):
        d2 = []
        for v in vals[i : i + 2]:
            dv = v if out == 0.0 else _f32(_f32(_ref_e2m1(_f32(v * out))[1] * deq) - v)
            d2.append(_f32(dv * dv))
        err = _f32(err + _f32(d2[0] + d2[1]))
    return err


def _ref_nvfp4(x: torch.Tensor, four_over_six: bool):
    """nvfp4_kv_cache_kernels.cu `reshape_and_cache_nvfp4_kernel` (DEFAULT / FOUR_OVER_SIX): codes, scale bytes and
    the values the read path takes (e2m1 * block scale * k_scale, k_scale = 1.0)."""
    codes, scale_bytes, values = [], [], []
    for row in _rows(x):
        row_codes, row_scales, row_values = [], [], []
        for g in range(0, row.numel(), 16):
            vals = [float(v) for v in row[g : g + 16]]
            vec_max = max(abs(v) for v in vals)
            sf, out = _ref_candidate(vec_max, 6.0)
            if four_over_six:
                sf4, out4 = _ref_candidate(vec_max, 4.0)
                if _ref_block_error(vals, out4) < _ref_block_error(vals, out):
                    sf, out = sf4, out4
            scale = float(torch.tensor(sf, dtype=torch.uint8).view(torch.float8_e4m3fn).float())
            for v in vals:
                code, q = _ref_e2m1(_f32(v * out))
                row_codes.append(code)
                row_values.append(q * scale)
            row_scales.append(sf)
        c = torch.tensor(row_codes, dtype=torch.uint8)
        codes.append(c[0::2] | (c[1::2] << 4))
        scale_bytes.append(torch.tensor(row_scales, dtype=torch.uint8))
        values.append(torch.tensor(row_values))
    return torch.stack(codes), torch.stack(scale_bytes), torch.stack(values)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_4over6"])
def test_nvfp4_matches_vllm(name, head_dim):
    x = _kv(head_dim)
    fmt = kvviz.get_format(f"vllm:{name}")
    q = fmt.quantize(x)
    data, scale, values = _ref_nvfp4(x, four_over_six=name == "nvfp4_4over6")
    assert torch.equal(q.data.reshape(data.shape), data)
    assert torch.equal(_bits(q.scale).reshape(scale.shape), scale)
    assert torch.equal(fmt.dequantize(q).reshape(values.shape), values.to(torch.bfloat16))


def test_nvfp4_4over6_picks_the_smaller_error_somewhere():
    """The two searches differ on random data (else the 4over6 test above would not test the choice)."""
    x = _kv(128, seed=3)
    plain = kvviz.get_format("vllm:nvfp4").quantize(x)
    four = kvviz.get_format("vllm:nvfp4_4over6").quantize(x)
    assert not torch.equal(_bits(plain.scale), _bits(four.scale))
    err = [float((kvviz.get_format(f"vllm:{n}").dequantize(q).float() - x.float()).pow(2).sum())
           for n, q in (("nvfp4", plain), ("nvfp4_4over6", four))]
    assert err[1] < err[0]


# ------------------------------------------------------------------------------------------ TurboQuant

def _ref_lloyd_max(d: int, bits: int) -> torch.Tensor:
    """turboquant/centroids.py `solve_lloyd_max(d, bits)`, transcribed."""
    n_levels, sigma2 = 2**bits, 1.0 / d
    sigma = math.sqrt(sigma2)

    def pdf(x):
        return (1.0 / math.sqrt(2 * math.pi * sigma2)) * math.exp(-x * x / (2 * sigma2))

    def trapz(f, a, b, n=200):
        h = (b - a) / n
        return (0.5 * (f(a) + f(b)) + sum(f(a + i * h) for i in range(1, n))) * h

    lo, hi = -3.5 * sigma, 3.5 * sigma
    c = [lo + (hi - lo) * (i + 0.5) / n_levels for i in range(n_levels)]
    for _ in range(200):
        edges = [lo * 3] + [(c[i] + c[i + 1]) / 2.0 for i in range(n_levels - 1)] + [hi * 3]
        new = []
        for i in range(n_levels):
            num, den = trapz(lambda t: t * pdf(t), edges[i], edges[i + 1]), trapz(pdf, edges[i], edges[i + 1])
            new.append(num / den if den > 1e-15 else c[i])
        if max(abs(new[i] - c[i]) for i in range(n_levels)) < 1e-10:
            break
        c = new
    return torch.tensor(c, dtype=torch.float32)


def _ref_hadamard(d: int) -> torch.Tensor:
    """turboquant_attn.py `_build_hadamard_cached`."""
    h = torch.tensor([[1.0]])
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def _ref_pack(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """`_tq_fused_store_mse` / `_store_quantized_value` packing: 4 bits two a byte (even low), 3 bits 8 in 3 bytes."""
    out = []
    for g in range(0, idx.numel(), 8 if bits == 3 else 2):
        if bits == 4:
            out.append(int(idx[g]) & 0xF | (int(idx[g + 1]) & 0xF) << 4)
        else:
            word = sum((int(idx[g + j]) & 0x7) << (3 * j) for j in range(8))
            out += [word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF]
    return torch.tensor(out, dtype=torch.uint8)


def _ref_tq_key(x: torch.Tensor, bits: int):
    """triton_turboquant_store.py `triton_turboquant_store` (MSE path) and `_tq_fused_store_mse`, then
    triton_turboquant_decode.py `_tq_full_dequant_kv` with NORM_CORRECTION=1 and the inverse rotation."""
    d = x.shape[-1]
    centroids = _ref_lloyd_max(d, bits)
    c_sorted, _ = centroids.sort()
    midpoints = (c_sorted[:-1] + c_sorted[1:]) / 2
    # ||k|| and (k / (||k|| + 1e-8)) @ H are fp32 sums whose order on the GPU is Triton's own; kvviz fixes one
    # (turboquant.key_rotation: what torch's CPU kernels do on AVX2), and this transcription takes the same, so
    # that it holds on any CPU. Everything after the sums (the search, the packing, the read) is transcribed.
    from kvviz.formats.turboquant import key_rotation

    norms, y = key_rotation(x)
    packed, recon = [], []
    n = 2**bits
    for y_vec, norm in zip(y, norms):
        lo, hi = torch.zeros(d, dtype=torch.int64), torch.full((d,), n - 1, dtype=torch.int64)
        for _ in range(bits):
            mid = (lo + hi) >> 1
            mid_val = midpoints[torch.clamp(mid, max=n - 2)]
            lo, hi = torch.where(y_vec >= mid_val, mid + 1, lo), torch.where(y_vec >= mid_val, hi, mid)
        idx = torch.clamp(lo, max=n - 1)
        vn = norm.to(torch.float16)
        packed.append(torch.cat([_ref_pack(idx, bits), vn.view(torch.uint8)]))
        k_mse = centroids[idx]
        c_norm_sq = torch.tensor(float((k_mse.double() ** 2).sum()), dtype=torch.float32)  # IEEE sum
        k_mse = k_mse * (torch.tensor(1.0) / torch.sqrt(c_norm_sq + 1e-16))
        recon.append((vn.float() * k_mse).to(torch.float16))
    rotated = torch.stack(recon)
    return torch.stack(packed), rotated, rotated.float() @ _ref_hadamard(d)


def _ref_tq_value(x: torch.Tensor, bits: int):
    """triton_turboquant_store.py `_store_quantized_value` (VQB = bits) and the V half of `_tq_full_dequant_kv`."""
    levels = 2**bits - 1
    packed, values = [], []
    for val_vec in _rows(x):
        val_min, val_max = val_vec.min(), val_vec.max()
        v_scale = (val_max - val_min) / float(levels)
        v_scale = torch.where(v_scale > 1e-8, v_scale, torch.tensor(1e-8))
        q = torch.clamp(((val_vec - val_min) / v_scale + 0.5).trunc(), 0, levels)
        sc, zr = v_scale.to(torch.float16).reshape(1), val_min.to(torch.float16).reshape(1)
        packed.append(torch.cat([_ref_pack(q.long(), bits), sc.view(torch.uint8), zr.view(torch.uint8)]))
        values.append(_fma(q, sc.float(), zr.float()))  # v_idx * v_scale + v_zero: one FMA
    return torch.stack(packed), torch.stack(values)


def _stored_bytes(q) -> torch.Tensor:
    parts = [q.data, q.scale] + ([q.zero] if q.zero is not None else [])
    return torch.cat([_bits(p).reshape(-1, _bits(p).shape[-1]) for p in parts], dim=-1)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("name,k_bits,v_bits", [("turboquant_4bit_nc", 4, 4), ("turboquant_k3v4_nc", 3, 4),
                                                ("turboquant_3bit_nc", 3, 3)])
def test_turboquant_matches_vllm(name, k_bits, v_bits, head_dim):
    from kvviz.formats.turboquant import key_rotated

    x = _kv(head_dim)
    kv = kvviz.parse_kv(f"vllm:{name}")
    qk, qv = kv.k.quantize(x), kv.v.quantize(x)
    k_bytes, k_rotated, k_values = _ref_tq_key(x, k_bits)
    assert torch.equal(_stored_bytes(qk), k_bytes)  # [indices | fp16 norm], vLLM's key slot
    assert torch.equal(key_rotated(kv.k, qk).reshape(k_rotated.shape), k_rotated)
    assert torch.equal(kv.k.dequantize(qk).reshape(k_values.shape), k_values.to(torch.bfloat16))
    v_bytes, v_values = _ref_tq_value(x, v_bits)
    assert torch.equal(_stored_bytes(qv), v_bytes)  # [codes | fp16 scale | fp16 zero], vLLM's value slot
    assert torch.equal(kv.v.dequantize(qv).reshape(v_values.shape), v_values.to(torch.bfloat16))


def test_turboquant_k8v4_key_is_a_plain_e4m3_cast():
    """`_tq_fused_store_fp8`: k_vals.to(float8e4nv), no scale (saturating on Hopper): fp8_e4m3 with the scale of
    1.0 a cache side gives a /unit format."""
    x = _kv(128)
    kv = kvviz.parse_kv("vllm:turboquant_k8v4")
    assert kv.k.scale_source == "unit"
    q = kv.k.quantize(x, scale=1.0)
    assert torch.equal(_bits(q.data), _bits(x.float().clamp(-448, 448).to(torch.float8_e4m3fn)))
    assert kv.v.base == kvviz.parse_kv("vllm:turboquant_k3v4_nc").v.base == "vllm.tq_v4"


def test_vllm_centroids_are_vllms_own_iteration():
    from kvviz.formats.turboquant import vllm_centroids

    for bits in (3, 4):
        assert torch.equal(vllm_centroids(128, bits), _ref_lloyd_max(128, bits))


# ------------------------------------------------------------------------------------------ bytes, names, rules

# v1/kv_cache_interface.py and turboquant/config.py: bytes per token and head (K, V) at head_dim 128 / 64
VLLM_BYTES = {
    "turboquant_k8v4": ((128, 68), (64, 36)),
    "turboquant_4bit_nc": ((66, 68), (34, 36)),
    "turboquant_k3v4_nc": ((50, 68), (26, 36)),
    "turboquant_3bit_nc": ((50, 52), (26, 28)),
    "int8_per_token_head": ((132, 132), (68, 68)),
    "fp8_per_token_head": ((132, 132), (68, 68)),
    "int4_per_token_head": ((68, 68), (36, 36)),
    "nvfp4": ((72, 72), (36, 36)),
    "nvfp4_4over6": ((72, 72), (36, 36)),
}


@pytest.mark.parametrize("name", VLLM_BYTES)
def test_bytes_per_token_head_are_vllms(name):
    kv = kvviz.parse_kv(f"vllm:{name}")
    for head_dim, want in zip(HEAD_DIMS[::-1], VLLM_BYTES[name]):
        got = tuple(round(f.bits_per_value(head_dim) * head_dim / 8) for f in (kv.k, kv.v))
        assert got == want
        x = _kv(head_dim)
        for f, per in zip((kv.k, kv.v), want):
            q = f.quantize(x)
            if f.kind in ("vllm", "turboquant"):  # k8v4's E4M3 key adds one per-tensor scale of 1.0
                assert q.nbytes == f.nbytes_for(x.shape) == per * math.prod(x.shape[:-1])


@pytest.mark.parametrize("spec", ["vllm:turboquant_k3v4_nc", "vllm:int4_per_token_head", "vllm:nvfp4",
                                  "vllm:fp8", "sglang:fp4_mx_block16", "llama.cpp:q4_0",
                                  "llama.cpp:k=q8_0,v=q4_0/norot", "k=vllm:turboquant_k3v4_nc,v=int4"])
def test_engine_names_round_trip(spec):
    kv = kvviz.parse_kv(spec)
    assert kvviz.parse_kv(kv.spec) == kv
    assert kv.spec == spec


def test_engine_names_map_to_the_stored_formats():
    fp8 = kvviz.parse_kv("vllm:fp8")
    assert dataclasses.replace(fp8.k.parts, engine=None) == kvviz.get_format("fp8_e4m3/unit").parts
    q4 = kvviz.parse_kv("llama.cpp:q4_0")
    assert (q4.k.base, q4.k.kind, q4.engine, q4.k.engine_rot) == ("q4_0", "ggml", "llama.cpp", True)
    pair = kvviz.parse_kv("llama.cpp:k=q8_0,v=q4_0/norot")
    assert (pair.k.base, pair.v.base, pair.k.engine_rot, pair.v.engine_rot) == ("q8_0", "q4_0", False, False)
    assert kvviz.parse_kv("llama.cpp:f16").k.engine_rot is False  # nothing quantized: llama.cpp does not rotate
    assert kvviz.parse_kv("llama.cpp:k=f16,v=q4_0").k.engine_rot is True
    assert kvviz.get_format("q4_0").engine is None  # bare names stay kvviz's own
    assert kvviz.parse_kv("sglang:fp8_e4m3").k.scale_source == "unit"
    assert kvviz.parse_kv("vllm:turboquant_k3v4_nc").engine == "vllm"
    assert kvviz.get_format("vllm:int4_per_token_head") == kvviz.parse_kv("vllm:int4_per_token_head").k


@pytest.mark.parametrize("spec,fragment", [
    ("vllm:int2", "vllm's values: auto, float16"),
    ("vllm:fp8_inc", "does not model vllm's fp8_inc"),
    ("sglang:int4", "sglang's values: auto"),
    ("llama.cpp:q2_k", "llama.cpp's values: f16"),
    ("tgi:fp8", "kvviz knows vllm, sglang, llama.cpp"),
    ("llama.cpp:k=q8_0", "llama.cpp:k=TYPE,v=TYPE"),
    ("vllm.int4_per_token_head", "written with its engine"),
])
def test_bad_engine_names_say_what_to_write(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        kvviz.parse_kv(spec)


def test_turboquant_pair_is_not_one_format():
    with pytest.raises(ValueError, match="parse_kv"):
        kvviz.get_format("vllm:turboquant_k3v4_nc")


@pytest.mark.parametrize("spec,head_dim,fragment", [("vllm:turboquant_4bit_nc", 96, "power of two"),
                                                    ("vllm:int4_per_token_head", 97, "even head_dim")])
def test_head_dims_vllm_refuses_say_what_vllm_requires(spec, head_dim, fragment):
    x = torch.randn(1, 1, 2, head_dim)
    with pytest.raises(ValueError, match=fragment):
        kvviz.parse_kv(spec).k.quantize(x)


def test_turboquant_keeps_the_boundary_layers_of_dense_models():
    """turboquant/config.py `get_boundary_skip_layers(n=2)`: first and last 2 of a dense model, none on hybrids."""
    tq = kvviz.parse_kv("vllm:turboquant_k3v4_nc")
    assert engine_skip_layers(tq, 24) == {0, 1, 22, 23}
    assert engine_skip_layers(tq, 3) == {0, 2}  # at most half the layers
    assert engine_skip_layers(tq, 4, ["full_attention", "sliding_attention"] * 2) == {0, 1, 2, 3}
    assert engine_skip_layers(tq, 4, ["linear_attention", "full_attention"] * 2) == frozenset()
    assert engine_skip_layers(kvviz.parse_kv("vllm:int4_per_token_head"), 24) == frozenset()
    assert engine_skip_layers(kvviz.parse_kv("int4"), 24) == frozenset()


# ------------------------------------------------------------------------------------------ in the cache

def _tiny_dense(layers: int = 6):
    """A tiny Llama with enough layers that vLLM's TurboQuant boundary rule leaves middle layers quantized."""
    config = tiny_config("llama", num_hidden_layers=layers)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="kvviz").eval()
    return model, ByteTokenizer()


@pytest.mark.parametrize("spec", ["vllm:turboquant_k3v4_nc", "vllm:int4_per_token_head", "vllm:nvfp4_4over6",
                                  "vllm:int8_per_token_head", "tq_prod3"])
def test_tiny_model_generates_through_the_reference_attention(spec):
    """The cache stores these formats through their own quantize (no kernel branch) and attention reads them with
    the torch reference; what it holds is the formats' byte count (TurboQuant's boundary layers in 16 bits)."""
    model, tok = _tiny_dense()
    enc = tok(["the cache stores what vLLM stores"])
    cache = QuantizedKVCache(model.config, spec)
    out = model.generate(**enc, max_new_tokens=4, do_sample=False, cache=cache)
    tokens = out.shape[1] - 1
    kv = kvviz.parse_kv(spec)
    heads, head_dim, layers = model.config.num_key_value_heads, model.config.head_dim, model.config.num_hidden_layers
    skipped = engine_skip_layers(kv, layers)
    assert skipped == (frozenset({0, 1, 4, 5}) if "turboquant" in spec else frozenset())
    per_layer = sum(f.nbytes_for((1, heads, tokens, head_dim)) for f in (kv.k, kv.v))
    assert cache.nbytes() == (layers - len(skipped)) * per_layer + len(skipped) * 2 * heads * tokens * head_dim * 2
    assert out.shape == (1, enc["input_ids"].shape[1] + 4)


@pytest.mark.parametrize("spec", ["vllm:turboquant_3bit_nc", "vllm:int4_per_token_head", "vllm:nvfp4",
                                  "vllm:fp8_per_token_head", "tq_mse2"])
def test_cache_stores_what_the_format_stores(spec):
    """No fused packer has a branch for these kinds: the cache falls back to the format's own quantize, token by
    token, and hands attention the same bytes as one quantize of every token."""
    model, _ = _tiny_dense()
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(1, 2, 7, 16, generator=g).to(torch.bfloat16) for _ in range(2))  # [batch, kv_heads, T, D]
    cache = QuantizedKVCache(model.config, spec)
    layer = 2  # not one of the boundary layers vLLM keeps in 16 bits under TurboQuant
    cache.update(k[:, :, :5], v[:, :, :5], layer)  # the prefill
    cache.update(k[:, :, 5:6], v[:, :, 5:6], layer)
    qk, qv = cache.update(k[:, :, 6:], v[:, :, 6:], layer)  # QTensors over all 7 tokens
    kv = kvviz.parse_kv(spec)
    for q, fmt, x in ((qk, kv.k, k), (qv, kv.v, v)):
        want = fmt.quantize(x)
        for name in ("data", "scale", "zero"):
            got, ref = getattr(q, name), getattr(want, name)
            assert (got is None) == (ref is None)
            assert got is None or torch.equal(_bits(got), _bits(ref))
        assert torch.equal(q.dequantize(), fmt.dequantize(want))


# ------------------------------------------------------------------------------------------ fp8 on vLLM's CPU build

# Bytes vLLM 0.32.0's CPU store (torch.ops._C.cpu_attn_reshape_and_cache, kv_cache_dtype fp8_e4m3 / fp8_e5m2, scale
# 1.0, AVX-512 build) wrote for these fp32 inputs, read back from its cache: rounded toward zero (RNE would give
# 211, 221, 67, 11 for the first four E4M3 ones), saturated at +-max, NaN to +max, -0 to +0, a tiny negative to -0.
VLLM_CPU_BYTES = {
    "fp8_e4m3": ((-10.76572704, 210), (-27.80035591, 221), (2.661592245, 66), (0.02073395625, 10),
                 (0.007643328048, 3), (0.001411414822, 0), (500.0, 126), (-1e9, 254), (float("inf"), 126),
                 (float("nan"), 126), (-0.0, 0), (-1e-9, 128)),
    "fp8_e5m2": ((-154.8510437, 216), (-444.1522217, 222), (0.01919593476, 36), (3.872923116e-05, 2),
                 (1.201726354e-05, 0), (70000.0, 123), (float("-inf"), 251), (float("nan"), 123), (-0.0, 0)),
}


def _toward_zero_reference(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The largest-magnitude fp8 value not beyond |x| (saturating), with x's sign; NaN -> +max, 0 -> +0: searched
    in the table of every finite code, sharing nothing with kvviz.formats."""
    table = torch.arange(128, dtype=torch.uint8).view(dtype).float()  # the non-negative codes, ascending
    table = table[torch.isfinite(table)]
    mags = torch.where(x.isnan(), torch.inf, x.abs())
    code = (torch.searchsorted(table, mags.contiguous(), right=True) - 1).to(torch.uint8)
    negative = (x < 0) & (code >= 0)
    return torch.where(negative, code | 0x80, code)


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_cpu_fp8_store_rounds_toward_zero_as_vllms_cpu_build(name):
    fmt = kvviz.parse_kv(f"vllm:{name}/cpu").k
    assert fmt.rounds_toward_zero and not kvviz.parse_kv(f"vllm:{name}").k.rounds_toward_zero
    values, want = zip(*VLLM_CPU_BYTES[name])
    x = torch.tensor(values, dtype=torch.float32).repeat(32, 1).T[None, None]  # [1, 1, n, 32]: one value a token
    got = _bits(fmt.quantize(x, 1.0).data)[0, 0, :, 0]  # the cache passes vLLM's default scale (unit)
    assert got.tolist() == list(want)
    g = torch.Generator().manual_seed(0)  # random magnitudes over the whole range, subnormals and saturation included
    exponent = torch.empty(64, 64).uniform_(-26, 18, generator=g)
    x = (torch.randn(64, 64, generator=g).sign() * 2.0 ** exponent)[None]  # [1, 64 tokens, 64]
    dtype = torch.float8_e4m3fn if name == "fp8_e4m3" else torch.float8_e5m2
    q = fmt.quantize(x, 1.0)
    assert torch.equal(_bits(q.data), _toward_zero_reference(x, dtype))
    nearest = kvviz.parse_kv(f"vllm:{name}").k.quantize(x, 1.0)  # the GPU's store rounds to nearest even
    fmax = torch.finfo(dtype).max
    assert torch.equal(_bits(nearest.data), _bits(x.clamp(-fmax, fmax).to(dtype)))
    assert not torch.equal(_bits(nearest.data), _bits(q.data))


def test_cpu_fp8_names_and_their_limits():
    assert kvviz.parse_kv("vllm:fp8/cpu").spec == "vllm:fp8/cpu"
    assert kvviz.parse_kv("vllm:fp8_e5m2/cpu").k.base == "fp8_e5m2"
    with pytest.raises(ValueError, match="CPU build serves only auto and the fp8"):
        kvviz.parse_kv("vllm:int8_per_token_head/cpu")
    with pytest.raises(ValueError, match="multiple of 32"):
        kvviz.parse_kv("vllm:fp8_e4m3/cpu").k.quantize(torch.randn(1, 1, 2, 16))


def test_cpu_fp8_cache_stores_what_the_format_stores():
    """No fused packer rounds toward zero: the cache quantizes through the format, prefill and appended tokens."""
    config = tiny_config("llama", num_hidden_layers=2, head_dim=32)
    g = torch.Generator().manual_seed(1)
    k, v = (torch.randn(1, 2, 7, 32, generator=g) * 3 for _ in range(2))
    cache = QuantizedKVCache(config, "vllm:fp8_e4m3/cpu")
    cache.update(k[:, :, :5], v[:, :, :5], 0)
    qk, qv = cache.update(k[:, :, 5:], v[:, :, 5:], 0)
    for q, x in ((qk, k), (qv, v)):
        assert torch.equal(_bits(q.data), _toward_zero_reference(x, torch.float8_e4m3fn))
        assert torch.equal(q.dequantize().float(), q.data.float())  # scale 1.0
