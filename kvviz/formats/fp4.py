"""FP4 (E2M1) block formats: OCP MX v1.0 `mxfp4` (block 32), SGLang's `fp4_mx_block16`, and NVIDIA's `nvfp4`.

E2M1 holds +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; a code is bit 3 sign, bits 2-1 exponent, bit 0 mantissa. Elements round
to nearest, ties to even (the code with mantissa bit 0), and saturate to +-6 (E2M1 has no Inf or NaN).

MX (OCP Microscaling Formats v1.0, section 6.3): one E8M0 shared scale per block along head_dim,
`X = 2**(floor(log2(amax)) - 2)` where 2 is E2M1's largest exponent; the exponent is clamped to E8M0's
-127..127, an all-zero block takes 2**-127, and a block holding Inf or NaN gets the NaN scale 0xFF.
NVFP4: block 16 with an E4M3 scale `amax_block / 6` (RNE) relative to one fp32 tensor scale `amax / (448 * 6)`;
a block holding Inf or NaN gets the E4M3 NaN scale. Both: a non-finite element makes its block NaN.
"""

from __future__ import annotations

import functools

import torch

from . import groups
from .packing import decode_bytes, pack

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # between code c and c + 1
E2M1_MAX = 6.0
E2M1_EMAX = 2  # 6 = 1.5 * 2**2
E4M3_MAX = 448.0
E8M0_NAN = 0xFF


@functools.lru_cache(maxsize=8)
def _bounds(device: str) -> torch.Tensor:
    """fp32 [7]: the magnitude code c rounds up past bound c when |v| > bound c. A tie goes to the even code: up
    when c + 1 is even, so for odd c the bound is the midpoint's fp32 predecessor (|v| > pred <=> |v| >= mid)."""
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32)
    below = torch.nextafter(mids, torch.tensor(float("-inf")))
    return torch.where(torch.arange(len(_MIDPOINTS)) % 2 == 1, below, mids).to(device)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """fp32 values -> uint8 E2M1 codes (0..15), round-to-nearest-even, saturating at +-6; NaN -> +0."""
    mag = torch.nan_to_num(v.abs(), nan=0.0)  # |v| in fp32; NaN -> 0, Inf -> fp32 max (code 7, as before)
    # the count of bounds < |v|, as torch.bucketize gives it; bucketize opens a parallel region even for a
    # one-token cache append, which costs milliseconds on a busy CPU, where 7 comparisons cost microseconds
    code = (mag.unsqueeze(-1) > _bounds(str(v.device))).sum(dim=-1, dtype=torch.uint8)  # [..., D]
    return code | ((v < 0).to(torch.uint8) << 3)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    """uint8 E2M1 codes -> fp32 values."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=code.device)
    mag = lut[(code & 7).long()]
    return torch.where((code & 8) > 0, -mag, mag)


def _blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., T, D] -> (fp32 blocks [..., T, D/block, block], their absmax [..., T, D/block] with non-finite
    elements counted as 0, and whether a block holds a non-finite element): groups.reduce's absmax and nonfinite
    in one pass, which a one-token cache append pays for at every step."""
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block)
    finite = torch.isfinite(xb)
    amax = torch.where(finite, xb.abs(), 0.0).amax(dim=-1)
    return xb, amax, ~finite.all(dim=-1)


def _mx_encode(fmt, x: torch.Tensor) -> dict:
    xb, amax, bad = _blocks(x, fmt.group)  # [..., T, D/block, block], [..., T, D/block] x 2
    _, exp = torch.frexp(amax)  # amax = m * 2**exp, m in [0.5, 1): floor(log2(amax)) = exp - 1
    e = torch.where(amax > 0, exp - 1 - E2M1_EMAX, -127).clamp(-127, 127)
    v = torch.ldexp(xb, -e.unsqueeze(-1).float()).reshape(x.shape)  # exact: a power of two
    scale = torch.where(bad, E8M0_NAN, e + 127).to(torch.uint8)
    return {"data": pack(e2m1_encode(v), 4), "scale": scale}


def _nv_encode(fmt, x: torch.Tensor) -> dict:
    xb, amax_b, bad = _blocks(x, fmt.group)  # [..., T, D/block, block], [..., T, D/block] x 2
    amax_t = amax_b.amax() if amax_b.numel() else amax_b.new_zeros(())  # the tensor's absmax
    tensor_scale = torch.where(amax_t > 0, amax_t / (E4M3_MAX * E2M1_MAX), 1.0)
    block_scale = (amax_b / E2M1_MAX / tensor_scale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    block_scale = torch.where(bad, float("nan"), block_scale.float()).to(torch.float8_e4m3fn)
    eff = (block_scale.float() * tensor_scale).unsqueeze(-1)  # [..., T, D/block, 1]
    v = torch.where(eff > 0, xb / eff, 0.0).reshape(x.shape)
    return {"data": pack(e2m1_encode(v), 4), "scale": block_scale, "tensor_scale": tensor_scale}


def encode(fmt, x: torch.Tensor, scale: torch.Tensor | None) -> dict:
    """x: [..., T, D] float -> QTensor fields."""
    if scale is not None:
        raise ValueError(f"{fmt.spec} computes its block scales from the data; pass no static scale.")
    return _nv_encode(fmt, x) if fmt.base == "nvfp4" else _mx_encode(fmt, x)


_E2M1_CODES = tuple(v for sign in (1.0, -1.0) for v in (sign * m for m in E2M1_VALUES))  # code c -> value


def decode(fmt, q) -> torch.Tensor:
    """QTensor -> fp32 x_hat [..., T, D]."""
    values = decode_bytes(q.data, 4, _E2M1_CODES)
    if fmt.base == "nvfp4":
        s = q.scale.float() * q.tensor_scale
    else:
        s = _e8m0_table(str(q.scale.device))[q.scale.long()]
    return groups.scale_(values, s, "token", fmt.group)


@functools.lru_cache(maxsize=8)
def _e8m0_table(device: str) -> torch.Tensor:
    """E8M0 byte -> fp32 scale 2**(byte - 127); 0xFF is NaN."""
    table = torch.ldexp(torch.ones(256), torch.arange(256, dtype=torch.float32) - 127)
    table[E8M0_NAN] = float("nan")
    return table.to(device)
