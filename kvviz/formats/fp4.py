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
import sys

import torch

from . import groups
from .family import BaseInfo, Family, Layout, choice, engine_default, rotation_of
from .family import layout as layout_of
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


def _nv_encode(fmt, x: torch.Tensor, global_scale: torch.Tensor | None) -> dict:
    if global_scale is not None and not bool(global_scale > 0):  # fitted on all-zero states: every value is 0
        x = torch.where(torch.isfinite(x), x.clamp(0.0, 0.0), x)
    xb, amax_b, bad = _blocks(x, fmt.group)  # [..., T, D/block, block], [..., T, D/block] x 2
    if global_scale is None:
        amax_t = amax_b.amax() if amax_b.numel() else amax_b.new_zeros(())  # the tensor's absmax
        tensor_scale = _global(amax_t)
    else:  # given: values beyond its range saturate (the block scale at 448, the element at 6)
        tensor_scale = torch.where(global_scale > 0, global_scale.float().reshape(()), 1.0)
    block_scale = (amax_b / E2M1_MAX / tensor_scale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    block_scale = torch.where(bad, float("nan"), block_scale.float()).to(torch.float8_e4m3fn)
    eff = (block_scale.float() * tensor_scale).unsqueeze(-1)  # [..., T, D/block, 1]
    v = torch.where(eff > 0, xb / eff, 0.0).reshape(x.shape)
    return {"data": pack(e2m1_encode(v), 4), "scale": block_scale, "tensor_scale": tensor_scale}


def _global(amax: torch.Tensor) -> torch.Tensor:
    return torch.where(amax > 0, amax / (E4M3_MAX * E2M1_MAX), 1.0)


def fit_scale(fmt, x: torch.Tensor) -> torch.Tensor:
    """NVFP4's global scale for states x, as a cache fixes it on its first update: amax / (448 * 6), or 0 for
    all-zero states (which pins every later value to 0)."""
    amax = x.detach().float().abs().amax()
    return torch.where(amax > 0, _global(amax), 0.0)


def given_scale(fmt, scale) -> torch.Tensor:
    """A given NVFP4 global scale as the cache keeps it (through its amax, as fit_scale's result is)."""
    amax = torch.as_tensor(scale, dtype=torch.float32) * 448.0 * 6.0
    return torch.where(amax > 0, _global(amax), 0.0)


def encode(fmt, x: torch.Tensor, scale: torch.Tensor | None) -> dict:
    """x: [..., T, D] float -> QTensor fields. NVFP4 takes its global scale (fit_scale's) as `scale`, or fits it
    on x when given none; MX formats compute every scale from the data."""
    if fmt.base == "nvfp4":
        return _nv_encode(fmt, x, scale)
    if scale is not None:
        raise ValueError(f"{fmt.spec} computes its block scales from the data; pass no static scale.")
    return _mx_encode(fmt, x)


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


# ------------------------------------------------------------------------------------------ the family

def layout(fmt, head_dim: int) -> Layout:
    """E2M1 codes, two a byte, under an E8M0 (MX) or E4M3 (NVFP4, times its global scale) scale per block."""
    nv = fmt.base == "nvfp4"
    return layout_of("e2m1", 4, scale_kind="token", scale_dtype="e4m3" if nv else "e8m0", group=fmt.group,
                     global_scale=nv, rotation=rotation_of(fmt, head_dim), packer="nv" if nv else "mx")


def engine_value(fmt, engine: str) -> tuple[str | None, str]:
    """vLLM and SGLang store NVFP4; SGLang MX FP4 in blocks of 16; llama.cpp none."""
    if fmt.rot or engine == "llama.cpp":
        dtype, note = engine_default(fmt, engine)
        return dtype, note + (" llama.cpp stores MXFP4 weights, not a MXFP4 KV cache." if fmt.base == "mxfp4"
                              and engine == "llama.cpp" else "")
    if fmt.base == "nvfp4":
        return "nvfp4", ("NVFP4: E2M1 with E4M3 scales per 16 values and a per-tensor fp32 scale (vLLM 0.25+, "
                         "Blackwell GPUs)." if engine == "vllm" else "E2M1 with E4M3 scales per 16 values and a "
                         "per-tensor scale (experimental; CUDA 12.8+, PyTorch 2.8+).")
    if engine == "vllm":
        return None, f"vLLM has no MX-style FP4 ({fmt.base}) KV cache; its FP4 KV cache is nvfp4."
    if fmt.base == "fp4_mx_block16":
        return "fp4_mx_block16", ("E2M1 with an E8M0 scale per 16 values, computed on the fly (experimental; CUDA "
                                  "12.8+, PyTorch 2.8+).")
    return None, ("SGLang's MX FP4 KV cache uses blocks of 16 (fp4_mx_block16), not OCP's 32: pick "
                  "fp4_mx_block16 to see what SGLang stores.")


FAMILY = Family(
    name="fp4",
    doc="E2M1 block formats: OCP MX (E8M0 scales) and NVIDIA's NVFP4 (E4M3 scales under a global fp32 one)",
    bases={
        "mxfp4": BaseInfo("fp4", 4, "token", ("token",), block=32, block_hint="or use fp4_mx_block16",
                          elements="E2M1, OCP MX v1.0",
                          scales="E8M0 shared exponent per 32 values: `floor(log2(amax)) - 2`"),
        "fp4_mx_block16": BaseInfo("fp4", 4, "token", ("token",), block=16, block_hint="or use mxfp4",
                                   elements="E2M1 (SGLang's MX variant)", scales="E8M0 per 16 values"),
        "nvfp4": BaseInfo("fp4", 4, "token", ("token",), block=16, global_scale=True, block_hint="or use mxfp4",
                          elements="E2M1",
                          scales="E4M3 per 16 values (`amax / 6`) under one fp32 `amax / (448 x 6)`"),
    },
    codec=sys.modules[__name__],
    layout=layout,
    scale_bytes=1,
    engine_value=engine_value,
    choices=(
        choice("mxfp4", compare=8, errors=5, export=8, export_support=9, fused=4, memory=5, sensitivity=8),
        choice("nvfp4", compare=9, errors=6, export=10, export_support=11, fused=5, memory=6, sensitivity=9),
        choice("fp4_mx_block16", export=9, export_support=10),
    ),
)
