"""Float formats: fp16 and bf16 casts, and OCP FP8 (E4M3FN, max 448; E5M2, max 57344) with fp32 scales.

fp16/bf16 are plain casts that saturate at the type's largest finite value. FP8 stores `x / scale` clamped to
+-max (saturating, as serving engines do) and cast with torch's round-to-nearest-even; with `scale=1.0` the codes
are exactly torch's own `float8_e4m3fn` / `float8_e5m2` casts of the clamped input. The default scale is one fp32
per tensor: `amax / max` computed from the data (the dynamic choice transformers' fp8 cache makes at prefill),
or a static one passed in (1.0, calibrated, or loaded from a scale file). `/token`, `/channel`, `/head` give one
fp32 scale per group instead.

Non-finite inputs: each such element is stored as NaN (these types have NaN); scales come from the finite values.

vLLM's CPU build (`vllm:fp8_e4m3/cpu`, Format.rounds_toward_zero) rounds toward zero instead, saturating at +-max,
NaN to +max and -0 to +0: what its `cpu_attn_reshape_and_cache` stores (csrc/cpu/cpu_attn_fp8.hpp keeps the top bits
of `x * (1 / scale)`; its scale is 1.0 here, so `x / scale` gives the same bytes), checked byte for byte against
vLLM 0.32.0's compiled op (tests/test_formats_vllm.py pins the rule).
"""

from __future__ import annotations

import functools

import torch

from . import groups

DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def max_value(base: str) -> float:
    """Largest finite value of the element type (448 for E4M3FN, 57344 for E5M2, 65504 for fp16)."""
    return float(torch.finfo(DTYPES[base]).max)


def _nan_where_nonfinite(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.full((), float("nan"), dtype=x.dtype, device=x.device))


def fit_scale(fmt, x: torch.Tensor) -> torch.Tensor:
    """The scales encode computes for x [..., T, D] when given none (one per group; per tensor or per head for the
    static-scale granularities): the amax of the group's finite values over the element type's largest value."""
    amax = groups.reduce(x, fmt.granularity, fmt.group, "absmax")
    # amax / fmax underflows to 0 for subnormal amax (1e-45 / 448): keep the scale a positive normal number
    return torch.where(amax > 0, (amax / max_value(fmt.base)).clamp(min=torch.finfo(torch.float32).tiny),
                       torch.ones((), device=x.device))


def encode(fmt, x: torch.Tensor, scale: torch.Tensor | None) -> dict:
    """x: [..., T, D] float -> QTensor fields."""
    dtype, fmax = DTYPES[fmt.base], max_value(fmt.base)
    if fmt.granularity is None:  # a plain cast
        data = _nan_where_nonfinite(x.float()).clamp(-fmax, fmax).to(dtype)
        return {"data": data}
    gran, group = fmt.granularity, fmt.group
    if scale is None:
        scale = fit_scale(fmt, x)
    s = groups.expand(scale, gran, group, x.shape)
    if fmt.rounds_toward_zero:
        data = toward_zero(x.float() / s, dtype)
    else:
        data = _nan_where_nonfinite(x.float() / s).clamp(-fmax, fmax).to(dtype)
    if fmt.static_scale:
        return {"data": data, "tensor_scale": scale}
    return {"data": data, "scale": scale}


def toward_zero(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 y -> fp8 `dtype` rounded toward zero, saturating at +-max, NaN to +max, -0 to +0: vLLM's CPU store."""
    fmax = torch.finfo(dtype).max
    y = torch.nan_to_num(y, nan=fmax).clamp(-fmax, fmax)
    near = y.to(dtype)
    codes = near.view(torch.uint8)
    # the nearest code lies beyond y: take the next one toward zero (codes grow with magnitude within a sign)
    codes = torch.where(near.float().abs() > y.abs(), codes - 1, codes)
    return torch.where(y == 0, torch.zeros_like(codes), codes).view(dtype)


@functools.lru_cache(maxsize=4)
def _fp8_table(dtype: torch.dtype) -> torch.Tensor:
    """fp8 byte -> fp32 value, all 256 codes."""
    return torch.arange(256, dtype=torch.uint8).view(dtype).float()


def _to_float(data: torch.Tensor) -> torch.Tensor:
    if data.element_size() == 1 and data.device.type == "cpu":  # fp8: a table lookup beats torch's CPU cast
        return torch.take(_fp8_table(data.dtype), data.view(torch.uint8).long())
    return data.float()


def decode(fmt, q) -> torch.Tensor:
    """QTensor -> fp32 x_hat [..., T, D]."""
    x = _to_float(q.data)
    if fmt.granularity is None:
        return x
    s = q.tensor_scale if q.scale is None else q.scale
    return groups.scale_(x, s.float(), fmt.granularity, fmt.group)
