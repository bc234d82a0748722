"""vLLM's UltraQuant 4-bit KV cache (`--kv-cache-dtype ultraquant_4bit`), stored bit for bit as its store kernel does.

Rows `vllm.uq4_k` (keys, Hadamard-rotated) and `vllm.uq4_v` (values, not rotated) of spec.BASES, reached as
vllm:ultraquant_4bit (engines.py). Source: vllm/v1/attention/ops/ultraquant/triton_store.py
`_ultraquant_store_kernel` (format.py for the layout), per token, head and group of 32 channels, in fp32:

- keys only: rotated in registers by the normalized Walsh-Hadamard butterfly, stage s (s = 0 .. log2 d - 1) pairing
  channel i with i ^ 2**s: `x[i] = (sign * x[i] + x[i ^ 2**s]) * fp32(1 / sqrt 2)` with sign -1 where bit s of i is
  set; so keys are stored as H x (H the Sylvester matrix / sqrt(d), H = H^T), rounded to fp32 at every stage.
- scale: `s_raw = absmax * fp32(0.156)`, `e = floor(log2(s_raw) + 0.5)` (the exponent rounds half up in the log
  domain: s_raw >= 2**(k + 0.5) gives k + 1, so the amax maps to 2**e with 0.156 * absmax / 2**e in [0.71, 1.41));
  UE8M0 byte `e + 127` (0 when that leaves 0..255); a group whose absmax is 0 stores byte 0 and all codes +0.
- codes: `x / 2**e` (exact) snapped to the 15 sorted E2M1 levels by counting the midpoints strictly below it (`>`):
  a tie goes to the lower level (toward -inf: 0.25 -> 0, -0.25 -> -0.5), |x| past 5 saturates at +-6, and every
  value in (-0.25, 0.25] stores +0 (code 0, never -0); NaN counts no midpoint: code 15 (-6). Codes are
  E2M1 bit patterns (sign, 2 exponent bits, 1 mantissa bit), two a byte, even element in the low nibble.
- read: `code value * 2**(byte - 127)` (byte 0: 0), keys in the rotated basis; vLLM rotates the query (and casts it
  to FP8 E4M3 at decode, which kvviz's attention does not model). Prefill attends to the unquantized states.

No per-token norm, no value rotation. Bytes per token and head (format.py `slot_size`, K and V together
D + 2 D / 32): each side D / 2 + D / 32. Where the GPU differs from IEEE fp32: Triton's log2 is taken as the
correctly rounded one, which can move e only when s_raw lies within an ulp of 2**(k + 0.5); the rotation's
butterfly is rounded stage by stage as the kernel rounds it (a multiply by +-1 and an add, then a multiply; an
FMA changes nothing there). tests/test_vllm_extra_stores.py runs the pinned vLLM's kernel in Triton's interpreter:
codes and scale bytes agree exactly.
"""

from __future__ import annotations

import sys

import torch

from .family import BaseInfo, Family, Layout, choice
from .family import layout as layout_of

from .packing import decode_bytes, hadamard, pack

GROUP = 32  # format.py GROUP_SIZE: one UE8M0 scale per 32 channels
CONSTANT_C = 0.156  # format.py DEFAULT_CONSTANT_C: s_raw = c * absmax
UE8M0_BIAS = 127
_INV_SQRT2 = 0.7071067811865476  # the kernel's INV_SQRT2, an fp32 constant there
# format.py FP4_LEVELS_SORTED's midpoints, compared with `>`; sorted index i -> E2M1 bits (15 - i below 7, i - 7 above)
MIDPOINTS = (-5.0, -3.5, -2.5, -1.75, -1.25, -0.75, -0.25, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_BITS_TO_VALUE = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _is_key(fmt) -> bool:
    return fmt.base == "vllm.uq4_k"


def token_head_bytes(fmt, head_dim: int) -> int:
    return head_dim // 2 + head_dim // GROUP  # E2M1 nibbles + one UE8M0 byte per 32


def check_head_dim(fmt, head_dim: int) -> None:
    if head_dim % GROUP or head_dim & (head_dim - 1):
        raise ValueError(f"vllm:ultraquant_4bit needs a head_dim that is a power of two and a multiple of 32 (one "
                         f"UE8M0 scale per 32 channels; keys rotated by a Hadamard transform of that size), got "
                         f"{head_dim}. Use vllm:fp8 or vllm:int8_per_token_head here.")


def kernel_fields(fmt, head_dim: int) -> dict:
    """How the fused kernels read this store (kernels.packed.PackedSide's fields beyond data / scale): E2M1 codes
    times a uint8 E8M0 scale per 32 channels; keys in the rotated domain (x = stored @ H). The kernels decode the
    byte 0 as 2**-127 where vLLM reads 0: it only ever scales +0 codes or values below 2**-120."""
    fields = dict(elem="e2m1", bits=4, scale_kind="token", group=GROUP)
    if _is_key(fmt):
        fields["rotation"] = hadamard(head_dim)  # the Sylvester matrix / sqrt(d), symmetric: H x = x @ H
    return fields


def pack_table(fmt, head_dim: int) -> None:
    """No CPU packer writes this store (kernels/cpu/pack.py): the cache quantizes it through `encode`."""
    return None


def butterfly(x: torch.Tensor) -> torch.Tensor:
    """The store kernel's normalized Walsh-Hadamard transform over the last dim, fp32, rounded stage by stage:
    x [..., D] -> H x [..., D] (D a power of two)."""
    d = x.shape[-1]
    y = x.float()
    idx = torch.arange(d, device=x.device)
    inv = torch.tensor(_INV_SQRT2, dtype=torch.float32)
    h = 1
    while h < d:
        partner = y[..., idx ^ h]
        sign = torch.where(idx & h == 0, 1.0, -1.0).to(x.device)
        y = (sign * y + partner) * inv
        h <<= 1
    return y


# ------------------------------------------------------------------------------------------ encode / decode

def encode(fmt, x: torch.Tensor, scale) -> dict:
    """x: [..., T, D] float -> data (uint8 [..., T, D / 2]) and scale (uint8 UE8M0 [..., T, D / 32])."""
    if scale is not None:
        raise ValueError(f"{fmt.spec} computes its scales per group of 32; pass no static scale.")
    d = x.shape[-1]
    v = butterfly(x) if _is_key(fmt) else x.float()
    g = v.reshape(*v.shape[:-1], d // GROUP, GROUP)  # [..., T, D/32, 32]
    absmax = g.abs().amax(dim=-1)  # [..., T, D/32]
    zero = absmax == 0
    s_raw = absmax * torch.tensor(CONSTANT_C, dtype=torch.float32)
    log2 = torch.log2(torch.where(zero, 1.0, s_raw).double()).float()  # correctly rounded fp32 log2
    exp = torch.floor(log2 + 0.5)  # round half up, in fp32 as the kernel adds
    divisor = torch.where(zero, 1.0, torch.exp2(exp))  # [..., T, D/32]
    y = g / divisor.unsqueeze(-1)
    mids = torch.tensor(MIDPOINTS, dtype=torch.float32, device=x.device)
    idx = (y.unsqueeze(-1) > mids).sum(dim=-1)  # sorted level index 0..14 (NaN: 0)
    idx = torch.where(zero.unsqueeze(-1), 7, idx)
    bits = torch.where(idx < 7, 15 - idx, idx - 7).to(torch.uint8).reshape(x.shape)
    byte = exp.to(torch.int64) + UE8M0_BIAS
    byte = torch.where(zero | (byte < 0) | (byte > 255), 0, byte).to(torch.uint8)
    return {"data": pack(bits, 4), "scale": byte}


def scales(q) -> torch.Tensor:
    """The UE8M0 bytes as fp32 scales [..., T, D / 32]: 2**(byte - 127), byte 0 read as 0 (format.py ue8m0_decode)."""
    b = q.scale.to(torch.int32)
    return torch.where(b == 0, 0.0, torch.exp2((b - UE8M0_BIAS).float()))


def stored(q) -> torch.Tensor:
    """The values as stored, fp32 [..., T, D] (keys in the rotated basis): code value * scale."""
    values = decode_bytes(q.data, 4, E2M1_BITS_TO_VALUE)  # [..., T, D]
    g = values.reshape(*values.shape[:-1], values.shape[-1] // GROUP, GROUP)
    return (g * scales(q).unsqueeze(-1)).reshape(values.shape)


def decode(fmt, q) -> torch.Tensor:
    """QTensor -> fp32 x_hat [..., T, D] in the model's space (keys rotated back: H is its own inverse)."""
    x = stored(q)
    if not _is_key(fmt):
        return x
    d = x.shape[-1]
    return (x.reshape(-1, d) @ hadamard(d, x.device)).reshape(x.shape)


# ------------------------------------------------------------------------------------------ the family

def layout(fmt, head_dim: int) -> Layout:
    """E2M1 codes times a UE8M0 scale per 32; keys in the rotated domain. No CPU packer writes it."""
    return layout_of(scale_dtype="e8m0", **kernel_fields(fmt, head_dim))


FAMILY = Family(
    name="ultraquant",
    doc="vLLM's UltraQuant store (vllm:ultraquant_4bit): E2M1 with a UE8M0 scale per 32, keys rotated",
    bases={name: BaseInfo("ultraquant", 4, "token", ("token",), block=GROUP, engine="vllm")
           for name in ("vllm.uq4_k", "vllm.uq4_v")},
    codec=sys.modules[__name__],
    layout=layout,
    choices=(choice("vllm:ultraquant_4bit", compare=13, export=15, memory=13, sensitivity=14),),
)
