"""vLLM's TurboQuant KV cache (`--kv-cache-dtype turboquant_*`), stored bit for bit as its store kernel computes it.

Rows `vllm.tq_k4_nc`, `vllm.tq_k3_nc` (keys) and `vllm.tq_v4`, `vllm.tq_v3` (values) of spec.BASES, reached as
vllm:turboquant_4bit_nc / k3v4_nc / 3bit_nc / k8v4 (engines.py; k8v4's key is a plain E4M3 cast, `fp8_e4m3/unit`).
Sources, vLLM 0.32.0 (tests/test_vllm_stores.py runs its store and read kernels against these, bit for bit):

- keys, vllm/v1/attention/ops/triton_turboquant_store.py `triton_turboquant_store` + `_tq_fused_store_mse`:
  `norm = ||k||` (fp32), `y = (k / (norm + 1e-8)) @ H` with H the Sylvester Hadamard matrix / sqrt(d)
  (turboquant_attn.py `_build_hadamard`, no random signs), index = the number of codebook midpoints <= y (a
  binary search), packed 4 bits (two a byte, even element low) or 3 bits (8 indices in 3 bytes, little-endian),
  then the norm as fp16. The codebook: Lloyd-Max centroids for N(0, 1/d) from turboquant/centroids.py
  `solve_lloyd_max` (trapezoid rule, 200 panels, up to 200 iterations), computed here by the same algorithm
  (`vllm_centroids`), since its centroids are not the exact Lloyd-Max ones; midpoints `(c[i] + c[i+1]) / 2` in fp32.
- values, `_store_quantized_value`: asymmetric over [min, max] per token and head, `scale = (max - min) / levels`
  (at least 1e-8), codes `trunc((v - min) / scale + 0.5)` clamped to 0..levels, then scale and min as fp16.
- read, triton_turboquant_decode.py `_tq_full_dequant_kv`: key = fp16(norm * c) where c is the centroid vector,
  renormalized to unit length first with "nc" (`c / sqrt(sum c^2 + 1e-16)`), in the rotated domain; the
  continuation-prefill path rotates it back with H (H is its own inverse). The decode kernel never forms K: it scores
  `norm * (q @ H) . c`, the same number. Values: `code * scale + zero` (one FMA on the GPU).

GPU approximations are taken at their IEEE result: Triton's fp32 division and `1.0 / tl.sqrt(...)`; the sum of
c^2 is the correctly rounded one (float64, then fp32), where Triton's tree order may differ in the last bit; the
value read `code * scale + zero` is one rounding, as the GPU's FMA. The key's norm and `@ H`, which Triton sums in
an order of its own, are computed on the CPU in one fixed order (`key_rotation`), that of torch's AVX2 CPU kernels,
which the CPU packer repeats (vLLM's own norm and matmul sum in the device's order: on an AVX-512 CPU its y can
differ from this one by an ulp, which moves a code only where y sits on a codebook midpoint). Bytes per token and
head (turboquant/config.py): key ceil(d * b / 8) + 2, value ceil(d * b / 8) + 4.
"""

from __future__ import annotations

import functools
import math
import sys

import torch

from .family import BaseInfo, Family, Layout, choice
from .family import layout as layout_of

_TRAPZ_PANELS = 200  # centroids.py _trapz(n=200)
_LLOYD_ITERS = 200
_LLOYD_TOL = 1e-10


def token_head_bytes(fmt, head_dim: int) -> int:
    data = math.ceil(head_dim * fmt.bits / 8)
    return data + (4 if _is_value(fmt) else 2)  # value: fp16 scale + zero; key: fp16 norm


def check_head_dim(fmt, head_dim: int) -> None:
    if head_dim < 8 or head_dim & (head_dim - 1):
        raise ValueError(f"vLLM's TurboQuant needs a head_dim that is a power of two (at least 8): it rotates each "
                         f"head with a Sylvester Hadamard matrix of that size; got {head_dim}.")


def _is_value(fmt) -> bool:
    return fmt.base.startswith("vllm.tq_v")


def kernel_fields(fmt, head_dim: int) -> dict:
    """How the fused kernels read this store (kernels.packed.PackedSide's fields beyond data / scale / zero). Keys:
    codebook entries times the fp16 norm, each token's centroid vector renormalized first ("nc"), in the rotated
    domain (x = stored @ H); the kernels rotate the query once instead. Values: code * scale + zero."""
    if _is_value(fmt):
        return dict(elem="int", bits=fmt.bits, scale_kind="token", group=head_dim)
    return dict(elem="table", bits=fmt.bits, values=vllm_centroids(head_dim, fmt.bits), renorm=fmt.base.endswith("_nc"),
                scale_kind="token", group=head_dim, rotation=vllm_hadamard(head_dim))


def pack_table(fmt, head_dim: int) -> torch.Tensor | None:
    """The table the CPU packer reads (kernels/cpu/jit/pack_engines.py): a key's Hadamard matrix, row by row, then
    its sorted codebook midpoints (fp32 [D * D + 2**bits - 1])."""
    if _is_value(fmt):
        return None
    return torch.cat([vllm_hadamard(head_dim).reshape(-1), _midpoints(head_dim, fmt.bits)])


# ------------------------------------------------------------------------------------------ shared pieces

def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes [..., D] (D a multiple of 8) -> uint8 [..., D * bits / 8]: each 8 codes make a little-endian
    `bits`-byte word, code j at bits j*bits.. (4 bits: two a byte, even element low; 3 bits: vLLM's layout)."""
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], codes.shape[-1] // 8, 8)  # [..., D/8, 8]
    word = (c << (torch.arange(8, device=codes.device) * bits)).sum(dim=-1)  # [..., D/8]
    out = torch.stack([(word >> (8 * i)) & 0xFF for i in range(bits)], dim=-1)  # [..., D/8, bits]
    return out.reshape(*codes.shape[:-1], codes.shape[-1] * bits // 8).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `pack_bits`: uint8 [..., D * bits / 8] -> int64 codes [..., D]."""
    b = packed.to(torch.int64).reshape(*packed.shape[:-1], packed.shape[-1] // bits, bits)  # [..., D/8, bits]
    word = (b << (torch.arange(bits, device=packed.device) * 8)).sum(dim=-1, keepdim=True)  # [..., D/8, 1]
    codes = (word >> (torch.arange(8, device=packed.device) * bits)) & ((1 << bits) - 1)  # [..., D/8, 8]
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * 8 // bits)


@functools.lru_cache(maxsize=32)
def vllm_centroids(d: int, bits: int) -> torch.Tensor:
    """fp32 [2**bits]: centroids.py `solve_lloyd_max(d, bits)`'s Lloyd-Max iteration for N(0, 1/d), step for step
    (Python floats: trapezoid rule on 200 panels, start on a uniform grid over +-3.5 sigma, outer edges +-10.5
    sigma, stop when no centroid moves by 1e-10)."""
    n_levels = 2**bits
    sigma2 = 1.0 / d
    sigma = math.sqrt(sigma2)

    def pdf(x: float) -> float:
        return (1.0 / math.sqrt(2 * math.pi * sigma2)) * math.exp(-x * x / (2 * sigma2))

    def trapz(f, a: float, b: float) -> float:
        h = (b - a) / _TRAPZ_PANELS
        total = 0.5 * (f(a) + f(b))
        for i in range(1, _TRAPZ_PANELS):
            total += f(a + i * h)
        return total * h

    lo, hi = -3.5 * sigma, 3.5 * sigma
    centroids = [lo + (hi - lo) * (i + 0.5) / n_levels for i in range(n_levels)]
    for _ in range(_LLOYD_ITERS):
        bounds = [(centroids[i] + centroids[i + 1]) / 2.0 for i in range(n_levels - 1)]
        edges = [lo * 3] + bounds + [hi * 3]
        new = []
        for i in range(n_levels):
            a, b = edges[i], edges[i + 1]
            num = trapz(lambda x: x * pdf(x), a, b)
            den = trapz(pdf, a, b)
            new.append(num / den if den > 1e-15 else centroids[i])
        if max(abs(new[i] - centroids[i]) for i in range(n_levels)) < _LLOYD_TOL:
            break
        centroids = new
    return torch.tensor(centroids, dtype=torch.float32)


@functools.lru_cache(maxsize=16)
def vllm_hadamard(d: int) -> torch.Tensor:
    """turboquant_attn.py `_build_hadamard_cached`: the ±1 Sylvester matrix built in fp32, divided by sqrt(d)."""
    h = torch.tensor([[1.0]])
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def _midpoints(d: int, bits: int) -> torch.Tensor:
    c, _ = vllm_centroids(d, bits).sort()
    return (c[:-1] + c[1:]) / 2  # fp32, as turboquant_attn.py _ensure_on_device


def _bucketize(y: torch.Tensor, mids: torch.Tensor, bits: int) -> torch.Tensor:
    """_tq_fused_store_mse's binary search: the index of y's bucket (y equal to a midpoint goes up; NaN to 0)."""
    n = 2**bits
    lo = torch.zeros(y.shape, dtype=torch.int64, device=y.device)
    hi = torch.full(y.shape, n - 1, dtype=torch.int64, device=y.device)
    for _ in range(bits):
        mid = (lo + hi) >> 1
        above = y >= mids[torch.clamp(mid, max=n - 2)]
        lo = torch.where(above, mid + 1, lo)
        hi = torch.where(above, hi, mid)
    return torch.clamp(lo, max=n - 1)


# ------------------------------------------------------------------------------------------ encode / decode

def encode(fmt, x: torch.Tensor, scale) -> dict:
    """x: [..., T, D] float -> QTensor fields. Keys: data (packed indices), scale (fp16 norm [..., T, 1]);
    values: data (packed codes), scale and zero (fp16 [..., T, 1])."""
    if scale is not None:
        raise ValueError(f"{fmt.spec} computes its scales per token and head; pass no static scale.")
    return _encode_value(x, fmt.bits) if _is_value(fmt) else _encode_key(x, fmt.bits)


_LANES = 8  # the norm's partial sums, as torch's AVX2 reduction keeps them


def key_rotation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A key's norm and rotated unit row: x [..., T, D] -> (norms fp32 [N, 1], y = (k / (norm + 1e-8)) @ H fp32
    [N, D]), N the rows of x, in a fixed order that the CPU packer (kernels/cpu/jit/pack_engines.py) repeats bit
    for bit: the squares summed in fp32 in 8 lanes (element i into lane i % 8, in order), the lanes then in order,
    the square root (correctly rounded); y_j accumulated over i = 0..D-1 in fp32, each step one fused multiply-add (the exact product
    and sum in float64, rounded once to fp32; a float64 sum that is not exact can round twice, which a GPU's FMA
    would not). This is the order torch's CPU reduction and BLAS matmul take on AVX2 (the transcription of vLLM's
    store in tests/test_formats_vllm.py uses them). On a GPU: torch's norm and matmul, in the GPU's own order
    (D sequential steps would cost D kernel launches per append)."""
    d = x.shape[-1]
    k = x.float().reshape(-1, d)  # [N, D]: the launcher's k_flat
    if k.device.type != "cpu":
        norms = k.norm(dim=1, keepdim=True)
        return norms, (k / (norms + 1e-8)) @ vllm_hadamard(d).to(k.device)
    sq = k * k
    lanes = sq[:, :_LANES]
    for m in range(_LANES, d, _LANES):
        lanes = lanes + sq[:, m : m + _LANES]
    total = lanes[:, :1]
    for j in range(1, _LANES):
        total = total + lanes[:, j : j + 1]
    norms = torch.sqrt(total.double()).float()  # [N, 1]; correctly rounded (torch's fp32 sqrt can be 1 ulp off)
    u = (k / (norms + 1e-8)).double()
    h = vllm_hadamard(d).to(x.device).double()  # its fp32 entries, exactly
    y = torch.zeros_like(k)
    for i in range(d):
        y = (y.double() + u[:, i : i + 1] * h[i]).float()
    return norms, y


def _encode_key(x: torch.Tensor, bits: int) -> dict:
    d = x.shape[-1]
    norms, y = key_rotation(x)
    idx = _bucketize(y, _midpoints(d, bits).to(x.device), bits)
    data = pack_bits(idx, bits).reshape(*x.shape[:-1], d * bits // 8)
    return {"data": data, "scale": norms.to(torch.float16).reshape(*x.shape[:-1], 1)}


def _encode_value(x: torch.Tensor, bits: int) -> dict:
    levels = 2**bits - 1
    v = x.float()
    lo = v.amin(dim=-1, keepdim=True)
    hi = v.amax(dim=-1, keepdim=True)
    scale = (hi - lo) / float(levels)
    scale = torch.where(scale > 1e-8, scale, torch.tensor(1e-8))
    # .to(int32) (saturating, NaN to 0), then the kernel's clamps to 0..levels
    codes = torch.nan_to_num((v - lo) / scale + 0.5, nan=0.0).clamp(-(2.0**30), 2.0**30).trunc().clamp(0, levels)
    return {"data": pack_bits(codes, bits), "scale": scale.to(torch.float16), "zero": lo.to(torch.float16)}


def key_rotated(fmt, q) -> torch.Tensor:
    """The key as `_tq_full_dequant_kv` writes it: fp16 [..., T, D] = norm * centroid vector (unit length for "nc"),
    in the rotated domain."""
    d = q.head_dim
    c = vllm_centroids(d, fmt.bits).to(q.data.device)[unpack_bits(q.data, fmt.bits)]  # [..., T, D] fp32
    if fmt.base.endswith("_nc"):
        norm_sq = (c.double() * c.double()).sum(dim=-1, keepdim=True).float()
        c = c * (1.0 / torch.sqrt(norm_sq + 1e-16))
    return (q.scale.float() * c).to(torch.float16)


def decode(fmt, q) -> torch.Tensor:
    """QTensor -> fp32 x_hat [..., T, D] in the model's space (keys rotated back with H)."""
    if _is_value(fmt):
        codes = unpack_bits(q.data, fmt.bits).double()
        return (codes * q.scale.double() + q.zero.double()).float()  # code * scale + zero, rounded once (FMA)
    rotated = key_rotated(fmt, q).float()
    d = rotated.shape[-1]
    return (rotated.reshape(-1, d) @ vllm_hadamard(d).to(rotated.device)).reshape(rotated.shape)


# ------------------------------------------------------------------------------------------ the family

def layout(fmt, head_dim: int) -> Layout:
    """Keys: codebook codes times the fp16 norm in the rotated domain; values: codes times an fp16 scale plus an
    fp16 zero (kernel_fields). The CPU packer writes both (kernels/cpu/jit/pack_engines.py)."""
    value = _is_value(fmt)
    return layout_of(scale_dtype="fp16", zero=value, packer="engine:EN_TQ_VALUE" if value else "engine:EN_TQ_KEY",
                     pack_table=pack_table(fmt, head_dim), **kernel_fields(fmt, head_dim))


def rotation_note(fmt, head_dim: int) -> str:
    return f"Sylvester Hadamard H / sqrt({head_dim}) (vLLM's TurboQuant): y = (k / ||k||) @ H"


def _row(bits: int, value: bool) -> BaseInfo:
    return BaseInfo("turboquant", bits, "token", ("token",), zero=value, engine="vllm")


FAMILY = Family(
    name="turboquant",
    doc="vLLM's TurboQuant store (typed vllm:turboquant_*): Lloyd-Max keys, asymmetric values",
    bases={"vllm.tq_k4_nc": _row(4, False), "vllm.tq_k3_nc": _row(3, False), "vllm.tq_v4": _row(4, True),
           "vllm.tq_v3": _row(3, True)},
    codec=sys.modules[__name__],
    layout=layout,
    rotation_note=rotation_note,
    choices=(choice("vllm:turboquant_4bit_nc", compare=12, export=13, memory=11, sensitivity=13, rotation=3),
             choice("vllm:turboquant_3bit_nc", candidates=7)),
)
