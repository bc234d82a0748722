"""A toy format family for tests: what adding a family takes, in one file.

`toy3`: a 3-bit symmetric int (codes -3..3, stored + 4) with one fp16 scale per token and head, `s = amax / 3`
(clamped to fp16's range, rounded to fp16), codes round half to even. Its 3-bit codes are stored as kvviz stores
3-bit streams (element e at bit 3e of the token's little-endian bit stream: 8 codes in 3 bytes), so its layout
names only things the kernels already know: `elem="int"`, `bits=3`, offset 4, token scales, and the `int_sym`
packer loop (which computes exactly this, at any width). No kernel code knows the name "toy3".

    with toy_format() as fmt:        # TOY registered in a temporary registry, fmt = get_format("toy3")
        q = fmt.quantize(x)          # x: [..., tokens, head_dim] float, head_dim a multiple of 8
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

from kvviz.formats import family
from kvviz.formats.family import REGISTRY, BaseInfo, Family

BITS, QMAX, OFFSET = 3, 3, 4
_F16_TINY, _F16_MAX = 2.0**-24, 65504.0


def pack3(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., D] (< 8) -> uint8 [..., D * 3 / 8]: 8 codes per little-endian 24-bit word."""
    c = codes.to(torch.int32).reshape(*codes.shape[:-1], codes.shape[-1] // 8, 8)  # [..., D/8, 8]
    word = (c << (BITS * torch.arange(8, dtype=torch.int32))).sum(-1, keepdim=True)  # [..., D/8, 1]
    out = (word >> (8 * torch.arange(3, dtype=torch.int32))) & 0xFF  # [..., D/8, 3]
    return out.to(torch.uint8).reshape(*codes.shape[:-1], codes.shape[-1] * 3 // 8)


def unpack3(data: torch.Tensor) -> torch.Tensor:
    """Inverse of pack3: uint8 [..., D * 3 / 8] -> int32 codes [..., D]."""
    b = data.to(torch.int32).reshape(*data.shape[:-1], data.shape[-1] // 3, 3)  # [..., D/8, 3]
    word = (b << (8 * torch.arange(3, dtype=torch.int32))).sum(-1, keepdim=True)  # [..., D/8, 1]
    codes = (word >> (BITS * torch.arange(8, dtype=torch.int32))) & 7  # [..., D/8, 8]
    return codes.reshape(*data.shape[:-1], data.shape[-1] * 8 // 3)


def encode(fmt, x: torch.Tensor, scale) -> dict:
    """x: [..., T, D] float -> QTensor fields: data uint8 [..., T, D * 3 / 8], scale fp16 [..., T, 1]."""
    if scale is not None:
        raise ValueError(f"{fmt.spec} computes its scale per token and head; pass no static scale.")
    finite = torch.isfinite(x)
    amax = torch.where(finite, x.float().abs(), 0.0).amax(-1, keepdim=True)
    s = (amax / QMAX).clamp(_F16_TINY, _F16_MAX).to(torch.float16)
    cdt = torch.float16 if x.dtype == torch.float16 else torch.float32  # as kvviz's ints: fp16 divides in fp16
    codes = (x.to(cdt) / s.to(cdt)).round().clamp(-QMAX, QMAX).float() + OFFSET
    codes = torch.nan_to_num(codes, nan=0.0)
    s = torch.where(finite.all(-1, keepdim=True), s, torch.tensor(float("nan"), dtype=s.dtype))
    return {"data": pack3(codes.to(torch.uint8)), "scale": s}


def decode(fmt, q) -> torch.Tensor:
    """QTensor -> fp32 [..., T, D]: (code - 4) * scale."""
    return (unpack3(q.data).float() - OFFSET) * q.scale.float()


def check_head_dim(fmt, head_dim: int) -> None:
    if head_dim % 8:
        raise ValueError(f"{fmt.spec} packs 8 codes in 3 bytes: head_dim {head_dim} must be a multiple of 8.")


def layout(fmt, head_dim: int):
    return family.layout("int", BITS, offset=OFFSET, scale_kind="token", scale_dtype="fp16", group=head_dim,
                         packer="int_sym")


TOY = Family(
    name="toy",
    bases={"toy3": BaseInfo("toy", BITS, "token", ("token",), elements="3-bit sym int, 8 codes in 3 bytes",
                            scales="fp16 per token")},
    codec=SimpleNamespace(encode=encode, decode=decode, check_head_dim=check_head_dim),
    layout=layout,
    scale_bytes=2,
    choices=(family.choice("toy3", compare=True, memory=True),),
    doc="a toy 3-bit int family (tests only)",
)


@contextlib.contextmanager
def toy_format():
    """TOY registered in a temporary registry; yields its Format (`toy3`), unregistered on exit."""
    from kvviz.formats import get_format

    with REGISTRY.temporary():
        family.register(TOY)
        yield get_format("toy3")

