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
import sys

import torch

from . import groups
from .family import BaseInfo, Family, Layout, choice, engine_default, rotation_of
from .family import layout as layout_of
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


# ------------------------------------------------------------------------------------------ the family

_GRANULARITIES = ("token", "channel", "tensor", "head")
_LLAMA_CPP_CLOSEST = {
    "int8": " The closest is q8_0 (int8 codes, one fp16 scale per 32 values, rounding halves away from zero).",
    "int4": " The closest are q4_0 / iq4_nl (one fp16 scale per 32 values) and q4_1 (with a minimum).",
}


def layout(fmt, head_dim: int) -> Layout:
    """Codes (int8 sym: int8, loaded natively; else unsigned, sym offset by 2**(bits-1)) under fp16 group scales
    (fp32 static per-tensor / per-head ones), an fp16 zero point beside each scale for /asym."""
    bits, static = fmt.bits, fmt.static_scale
    packer = None if fmt.granularity == "channel" else ("int_asym" if fmt.asym else "int_sym")
    return layout_of("int" if bits < 8 else "float", bits, offset=2 ** (bits - 1) if bits < 8 and not fmt.asym else 0,
                     scale_kind=fmt.granularity, scale_dtype="fp32" if static else "fp16",
                     group=fmt.group or (head_dim if fmt.granularity == "token" else None), zero=fmt.asym,
                     global_scale=static, rotation=rotation_of(fmt, head_dim), packer=packer)


def engine_value(fmt, engine: str) -> tuple[str | None, str]:
    """vLLM stores int8 per token and head; no engine stores the other int formats."""
    if engine == "vllm" and fmt.base == "int8" and not fmt.rot:
        if fmt.granularity == "token" and fmt.group is None and not fmt.asym:
            return "int8_per_token_head", ("Symmetric int8 with one scale per token and head (vLLM 0.24+, Triton "
                                           "attention backend only). vLLM stores fp32 scales, kvviz fp16: 2 bytes "
                                           "more per token-head there.")
        return None, ("vLLM's only int8 KV mode is int8_per_token_head (symmetric, one scale per token-head over "
                      f"head_dim); {fmt.spec} differs in granularity, grouping or zero point.")
    if engine == "vllm" and fmt.base == "int4":
        return None, ("vLLM has no plain int4 KV dtype. Its closest, int4_per_token_head (0.28+), is asymmetric "
                      f"with a rotation, not the same quantizer as kvviz's {fmt.spec}.")
    dtype, note = engine_default(fmt, engine)
    return dtype, note + (_LLAMA_CPP_CLOSEST.get(fmt.base, "") if engine == "llama.cpp" else "")


def _pair_note(k, v, engine: str) -> str:
    """An addition to the exporter's mixed-pair note (k8v4 on vLLM: its closest built-in mode)."""
    if engine == "vllm" and k.base == "int8" and v.base == "int4":
        return (" The closest built-in mode is turboquant_k8v4 (vLLM 0.28+), a different quantizer (rotation + "
                "codebooks), not kvviz's per-token int8/int4.")
    return ""


FAMILY = Family(
    name="int",
    doc="symmetric and asymmetric integers (KIVI) at any scale granularity",
    bases={
        "int8": BaseInfo("int", 8, "token", _GRANULARITIES, asym=True, elements="symmetric +-127",
                         scales="fp16 per token and head: `amax(head_dim) / 127` (the seed article's `quant_int8`)"),
        "int4": BaseInfo("int", 4, "token", _GRANULARITIES, asym=True, elements="symmetric +-7, two per byte",
                         scales="as `int8`"),
        "int2": BaseInfo("int", 2, "token", _GRANULARITIES, asym=True, elements="symmetric +-1, four per byte",
                         scales="as `int8`"),
    },
    codec=sys.modules[__name__],
    layout=layout,
    scale_bytes=2,
    engine_value=engine_value,
    choices=(
        choice("int8", compare=2, errors=0, export=4, export_support=5, fused=0, sensitivity=3, candidates=3),
        choice("k8v4", compare=3, errors=9, export=6, export_support=7, fused=1, memory=2, sensitivity=6,
               candidates=2),
        choice("k4v8", compare=4, errors=10),
        choice("int4", compare=5, errors=1, export_support=6, fused=2, memory=3, sensitivity=0, candidates=1,
               rotation=0),
        choice("kivi4", compare=6, export=7, fused=6),
        choice("kivi2", compare=7, errors=11, export_support=8, memory=4, sensitivity=7),
        choice("int2", errors=2, memory=8, sensitivity=1, candidates=0),
        choice("int4/channel/g32/asym", errors=7),
        choice("int4/rot", errors=8, sensitivity=11, rotation=1),
        choice("int4/g16", memory=7),
        choice("int4/tensor", sensitivity=2),
    ),
    extra={"pair_note": _pair_note},
)
