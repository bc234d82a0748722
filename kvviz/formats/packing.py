"""Bit packing along head_dim, and the normalized Hadamard rotation.

Packed layouts (the contract the Triton kernels read):
- 4-bit codes: two per byte, element 2i in the low nibble, 2i+1 in the high nibble;
- 2-bit codes: four per byte, element 4i+j in bits 2j..2j+1.
"""

from __future__ import annotations

import functools

import torch


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned codes [..., D] (values < 2**bits) into uint8 [..., D * bits // 8]."""
    if bits == 8:
        return codes.to(torch.uint8)
    per_byte = 8 // bits
    assert codes.shape[-1] % per_byte == 0, f"head_dim {codes.shape[-1]} must be a multiple of {per_byte}"
    c = codes.to(torch.uint8).reshape(*codes.shape[:-1], codes.shape[-1] // per_byte, per_byte)  # [..., D/per_byte, per_byte]
    out = torch.zeros(c.shape[:-1], dtype=torch.uint8, device=codes.device)
    for j in range(per_byte):
        out |= c[..., j] << (bits * j)
    return out


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of `pack`: uint8 [..., D * bits // 8] -> uint8 codes [..., D]."""
    if bits == 8:
        return packed
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    parts = [(packed >> (bits * j)) & mask for j in range(per_byte)]
    return torch.stack(parts, dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)  # [..., D]


@functools.lru_cache(maxsize=64)
def _byte_table(bits: int, values: tuple[float, ...], device: str) -> torch.Tensor:
    per_byte = 8 // bits
    codes = unpack(torch.arange(256, dtype=torch.uint8).unsqueeze(-1), bits)  # [256, per_byte]
    return torch.tensor(values, dtype=torch.float32)[codes.long()].to(device)  # [256, per_byte]


def decode_bytes(packed: torch.Tensor, bits: int, values: tuple[float, ...]) -> torch.Tensor:
    """uint8 [..., D * bits // 8] -> fp32 [..., D] with code c read as values[c], one table lookup per byte.

    The same as `torch.tensor(values)[unpack(packed, bits)]`, without materializing the codes: the reference
    attention path decodes the whole history at every step, so this is its hot loop.
    """
    table = _byte_table(bits, tuple(values), str(packed.device))  # [256, per_byte]
    rows = table.index_select(0, packed.reshape(-1).long())  # index_select: ~3x faster than table[idx] on the CPU
    return rows.reshape(*packed.shape[:-1], packed.shape[-1] * (8 // bits))


@functools.lru_cache(maxsize=16)
def _hadamard_cpu(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:  # Sylvester: H_2n = [[H, H], [H, -H]]
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n**0.5).to(torch.float32)


def hadamard(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The normalized Hadamard matrix [n, n] (fp32), symmetric and orthogonal: H = H^T = H^-1. kvviz's one Hadamard
    builder: /rot, vLLM's TurboQuant and UltraQuant rotations, and every layout's rotation (the kernels read it
    there). The same tensor for the same n on the CPU (cached)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"/rot needs head_dim to be a power of two, got {n}; drop /rot for this model.")
    return _hadamard_cpu(n).to(device)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] -> x @ H in fp32 (QuaRot's rotation over head_dim; spreads outlier channels)."""
    return x.float() @ hadamard(x.shape[-1], x.device)
