"""Integer formats: int8, int4, int2, symmetric or asymmetric, at any scale granularity.

Symmetric (the seed article's `quant_int8`): `scale = amax / qmax`, clamped away from zero, `q = round(x / scale)`
clamped to +-qmax, `x_hat = q * scale`. The quotient is computed in the input's dtype when that is fp16, so an fp16
tensor gives exactly the seed's fp16 results; other inputs compute in fp32.
Asymmetric (KIVI): `scale = (max - min) / (2**bits - 1)`, `zero = min`, `u = round((x - zero) / scale)` in
0..2**bits-1, `x_hat = u * scale + zero`.

Per-group scales and zeros are fp16 (per-tensor and per-head ones fp32). An fp16 scale spans 2**-24..65504, so a
group whose amax exceeds 65504 * qmax saturates (still finite). The seed clamps the scale at 1e-8, which is 0 in
fp16 and turns an all-zero fp16 row into NaN; the clamp here is fp16's smallest subnormal, 2**-24.
Storage: int8 sym as int8 codes; every other code unsigned (sym offset by 2**(bits-1)), packed along head_dim.
"""

from __future__ import annotations

import functools

import torch

from . import groups
from .packing import decode_bytes, pack

_F16_TINY, _F16_MAX = 2.0**-24, 65504.0


def _store_scale(s: torch.Tensor, static: bool) -> torch.Tensor:
    """Round per-group scales to their stored dtype (fp16; fp32 for static per-tensor/per-head scales)."""
    if static:
        return s.float().clamp(min=torch.finfo(torch.float32).tiny)
    return s.float().clamp(_F16_TINY, _F16_MAX).to(torch.float16)


def encode(fmt, x: torch.Tensor, scale: torch.Tensor | None) -> dict:
    """x: [..., T, D] float -> fields of a QTensor (data, scale or tensor_scale, zero)."""
    gran, group, bits = fmt.granularity, fmt.group, fmt.bits
    static = fmt.static_scale
    zero = None
    if fmt.asym:
        if scale is not None:
            raise ValueError(f"{fmt.spec} computes its scale and zero point per group; pass no static scale.")
        levels = 2**bits - 1
        bad = groups.reduce(x, gran, group, "nonfinite")
        lo = groups.reduce(x, gran, group, "min")
        hi = groups.reduce(x, gran, group, "max")
        s = _store_scale((hi - lo) / levels, static)
        zero = lo if static else lo.clamp(-_F16_MAX, _F16_MAX).to(torch.float16)
        xe = x.float() - groups.expand(zero.float(), gran, group, x.shape)
        codes = (xe / groups.expand(s.float(), gran, group, x.shape)).round().clamp(0, levels)
    else:
        qmax = 2 ** (bits - 1) - 1
        if scale is None:
            s, bad = _sym_scale(fmt, x)
        else:
            s, bad = scale, groups.reduce(x, gran, group, "nonfinite")
        cdt = torch.float16 if x.dtype == torch.float16 and not static else torch.float32
        q = (x.to(cdt) / groups.expand(s.to(cdt), gran, group, x.shape)).round().clamp(-qmax, qmax)
        codes = q if bits == 8 else q + 2 ** (bits - 1)
    nan = torch.tensor(float("nan"), dtype=s.dtype, device=s.device)
    s = torch.where(bad, nan, s)
    if zero is not None:
        zero = torch.where(bad, torch.tensor(float("nan"), dtype=zero.dtype, device=zero.device), zero)
    codes = torch.nan_to_num(codes.float(), nan=0.0)
    if bits == 8 and not fmt.asym:
        data = codes.to(torch.int8)
    else:
        data = pack(codes.to(torch.uint8), bits)
    if static:
        return {"data": data, "tensor_scale": s, "zero": zero}
    return {"data": data, "scale": s, "zero": zero}


def _sym_scale(fmt, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A symmetric format's scales for x [..., T, D] (the amax of each group's finite values over qmax, stored)
    and its groups that hold a non-finite value."""
    qmax = 2 ** (fmt.bits - 1) - 1
    amax, bad = groups.absmax_nonfinite(x, fmt.granularity, fmt.group)
    return _store_scale(amax / qmax, fmt.static_scale), bad


def fit_scale(fmt, x: torch.Tensor) -> torch.Tensor:
    """The per-tensor / per-head scale encode fits to x when given none (NaN where x holds a non-finite value),
    without encoding x."""
    if fmt.asym:
        raise ValueError(f"{fmt.spec} computes its scale and zero point per group; it has no static scale to fit.")
    s, bad = _sym_scale(fmt, x)
    return torch.where(bad, torch.tensor(float("nan"), dtype=s.dtype, device=s.device), s)


@functools.cache
def _code_values(bits: int, offset: int) -> tuple[float, ...]:
    return tuple(float(c - offset) for c in range(2**bits))


def decode(fmt, q) -> torch.Tensor:
    """QTensor -> fp32 x_hat [..., T, D]."""
    gran, group, bits = fmt.granularity, fmt.group, fmt.bits
    s = (q.tensor_scale if q.scale is None else q.scale).float()
    if bits == 8:
        codes = q.data.float()
    else:  # one table lookup per byte; symmetric codes are stored offset by 2**(bits-1)
        offset = 0 if fmt.asym else 2 ** (bits - 1)
        codes = decode_bytes(q.data, bits, _code_values(bits, offset))
    x = groups.scale_(codes, s, gran, group)
    if fmt.asym:
        x = x.add_(groups.expand(q.zero.float(), gran, group, q.values_shape))
    return x
