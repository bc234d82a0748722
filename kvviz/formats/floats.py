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
import sys

import torch

from . import groups
from .family import BaseInfo, Family, Layout, choice, engine_default, rotation_of
from .family import layout as layout_of

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


# ------------------------------------------------------------------------------------------ the family

_GRANULARITIES = ("token", "channel", "tensor", "head")
_FP8_EXP = {"fp8_e4m3": 4, "fp8_e5m2": 5}


def layout(fmt, head_dim: int) -> Layout:
    """Casts: native 16-bit loads. FP8: fp8 codes under fp32 scales (per token / channel group, or static)."""
    rotation = rotation_of(fmt, head_dim)
    if fmt.granularity is None:
        return layout_of("float", 16, rotation=rotation)
    static = fmt.static_scale
    return layout_of(fmt.base, 8, scale_kind=fmt.granularity, scale_dtype="fp32",
                     group=fmt.group or (head_dim if fmt.granularity == "token" else None), global_scale=static,
                     rotation=rotation,
                     packer=None if fmt.granularity == "channel" or fmt.rounds_toward_zero else "fp8",
                     fp8_exp=_FP8_EXP[fmt.base], fmax=max_value(fmt.base))


def engine_value(fmt, engine: str) -> tuple[str | None, str]:
    """The engines' dtype for a cast or an FP8 format (kvviz.export's notes)."""
    if engine == "vllm":
        return _vllm(fmt)
    if engine == "sglang":
        return _sglang(fmt)
    if fmt.rot:
        return None, "llama.cpp does not rotate an unquantized cache; drop /rot."
    if fmt.granularity is None:
        return {"fp16": "f16", "bf16": "bf16"}[fmt.base], ""
    return engine_default(fmt, engine)


def _vllm(fmt) -> tuple[str | None, str]:
    if fmt.rot:
        return engine_default(fmt, "vllm")
    if fmt.base == "fp16":
        return "float16", "Unquantized half precision (\"auto\" does the same for an fp16 model)."
    if fmt.base == "bf16":
        return "bfloat16", "Unquantized bfloat16 (\"auto\" does the same for a bf16 model)."
    if fmt.granularity == "tensor":
        if fmt.base == "fp8_e5m2":
            return "fp8_e5m2", "E5M2 per-tensor; vLLM uses no scale for E5M2 (its range covers K/V)."
        return "fp8_e4m3", ("E4M3 with one scale per layer for K and one for V. --calculate-kv-scales computes "
                            "them on the first batch; a checkpoint with k_scale/v_scale (e.g. from "
                            "llm-compressor) provides calibrated ones; without either they are 1.0, which "
                            "vLLM warns may hurt accuracy. \"fp8\" is the same as fp8_e4m3 on CUDA.")
    if fmt.granularity == "token" and fmt.base == "fp8_e4m3" and fmt.group is None:
        return "fp8_per_token_head", ("Dynamic fp32 scale per token and head (vLLM 0.24+, Triton attention "
                                      "backend only: --attention-backend TRITON_ATTN; needs SM89+).")
    return None, (f"vLLM has no {fmt.granularity}-granularity {fmt.base} KV cache; per-tensor fp8_e4m3/"
                  "fp8_e5m2 (and per-token-head fp8_per_token_head for E4M3) are the options.")


def _sglang(fmt) -> tuple[str | None, str]:
    if fmt.rot:
        return engine_default(fmt, "sglang")
    if fmt.base == "fp16":
        return "auto", "\"auto\" keeps the model dtype: fp16 only when the model runs in fp16 (--dtype float16)."
    if fmt.base == "bf16":
        return "bf16", "Unquantized bfloat16."
    if fmt.granularity != "tensor":
        return None, (f"SGLang's FP8 KV cache uses one scale per layer; {fmt.spec} ({fmt.granularity} scales) "
                      f"is not available. Use {fmt.base} (per-tensor).")
    if fmt.base == "fp8_e5m2":
        return "fp8_e5m2", "E5M2 per-tensor. The scale file is for E4M3 only (its dtype must be float8_e4m3fn)."
    return "fp8_e4m3", "E4M3 with one per-tensor scale per layer, shared by K and V."


FAMILY = Family(
    name="float",
    doc="casts (fp16, bf16) and OCP FP8 with fp32 scales",
    bases={
        "fp16": BaseInfo("float", 16, None, (), elements="casts (fp16 saturates at +-65504)", scales="none"),
        "bf16": BaseInfo("float", 16, None, (), elements="bfloat16 cast", scales="none"),
        "fp8_e4m3": BaseInfo("float", 8, "tensor", _GRANULARITIES, scale_source=True,
                             elements="OCP E4M3FN, max 448, saturating",
                             scales="one fp32 per tensor (dynamic, or static: `quantize(x, scale=)`)"),
        "fp8_e5m2": BaseInfo("float", 8, "tensor", _GRANULARITIES, scale_source=True,
                             elements="OCP E5M2, max 57344", scales="as `fp8_e4m3`"),
    },
    codec=sys.modules[__name__],
    layout=layout,
    scale_bytes=4,
    engine_value=engine_value,
    choices=(
        choice("fp8_e4m3", compare=0, errors=3, export=0, export_support=2, fused=3, memory=1, sensitivity=4,
               candidates=4),
        choice("fp8_e5m2", compare=1, errors=4, export=1, export_support=3, sensitivity=5),
        choice("fp16", export=2, export_support=0, memory=0, candidates=5),
        choice("bf16", export=3, export_support=1),
        choice("fp8_e4m3/token", export=5, export_support=4),
        choice("vllm:fp8", candidates=8),
    ),
)
