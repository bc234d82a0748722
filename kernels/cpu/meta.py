"""The fused CPU decode's side arguments: how a PackedSide (kernels/packed.py) becomes what the numba code reads, a
side's int64 `meta` vector (kernels/cpu/jit/contract.py's M_* fields) and uint8 numpy views of its buffers, read in
place (no copy, capacity strides kept). Built once per buffer set and kept in the side's memo (`side_args`);
kernels/cpu/decode.py and kernels/cpu/step.py hand them to the jit code.

Every field comes from the side's layout (element, bits, offset, scale kind, group, storage order, table, renorm,
zero point bits, sketch): the branches here are on element storage (`element_code`: arithmetic codes, a table of
floats, or a float cast read from its bytes) and on scale storage (`scale_code`), never on a format's name.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from kernels.cpu.jit import contract
from kernels.packed import IQ4NL_VALUES, PackedSide, per_head

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # OCP MX v1.0 FP4 magnitudes by code & 7
_FLOAT_CODES = {torch.float16: contract.E_F16, torch.bfloat16: contract.E_BF16, torch.float32: contract.E_F32}


@functools.lru_cache(maxsize=None)
def table(elem: str, bits: int, offset: int, dtype: torch.dtype) -> torch.Tensor:
    """float32 decode table of one element kind: index = the stored code (a byte, a nibble or 2 bits)."""
    if elem == "int" or (elem == "float" and bits == 8):
        codes = torch.arange(2 ** bits, dtype=torch.int32)
        if dtype == torch.int8:
            codes = codes.to(torch.uint8).view(torch.int8).to(torch.int32)  # int8 sym: two's complement
        return (codes - offset).float()
    if elem == "e2m1":
        mag = torch.tensor(E2M1_VALUES * 2)
        return torch.where(torch.arange(16) >= 8, -mag, mag).float()
    if elem in ("fp8_e4m3", "fp8_e5m2"):
        fp8 = torch.float8_e4m3fn if elem == "fp8_e4m3" else torch.float8_e5m2
        return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8).float()
    if dtype == torch.uint8:  # an E8M0 scale: 2**(byte - 127), 255 = NaN
        out = torch.pow(2.0, torch.arange(256, dtype=torch.float64) - 127).float()
        out[255] = float("nan")
        return out
    raise AssertionError(f"no decode table for elem={elem!r}, bits={bits}, dtype={dtype}")


def element_code(side: PackedSide) -> tuple[int, torch.Tensor | None]:
    """(storage code, kernels/cpu/jit/contract.py's E_*, and decode table or None) of a side's stored codes. A new
    element kind is one branch here: arithmetic codes (E_UINT, E_INT8, E_E2M1), a table of 256 floats (E_LUT), or a float storage type."""
    dtype = side.data.dtype
    if side.elem == "table":  # a codebook (TurboQuant's centroids): value = values[code]
        return contract.E_LUT, side.values.detach().to("cpu", torch.float32).contiguous()
    if side.elem == "int" and side.bits in (3, 1):  # codes of a 3- or 1-bit stream: through a table of 8 / 2
        return contract.E_LUT, table("int", side.bits, side.offset, dtype)
    if side.elem == "float" and side.bits >= 16:
        assert dtype in _FLOAT_CODES, f"a float cast stored as {dtype} is not readable here"
        return _FLOAT_CODES[dtype], None
    if side.elem == "int" or (side.elem == "float" and dtype == torch.uint8):  # int2/int4, asym int8: u - offset
        return contract.E_UINT, None
    if side.elem == "float" and dtype == torch.int8:
        return contract.E_INT8, None
    if side.elem == "e2m1":
        return contract.E_E2M1, None
    if side.elem == "iq4_nl":  # llama.cpp's non-linear 4-bit codes: ggml's kvalues_iq4nl
        return contract.E_LUT, _iq4nl_table()
    assert side.elem in ("fp8_e4m3", "fp8_e5m2"), f"no CPU decode for elem={side.elem!r} stored as {dtype}"
    return contract.E_LUT, table(side.elem, side.bits, side.offset, dtype)


@functools.cache
def _iq4nl_table() -> torch.Tensor:
    return torch.tensor(IQ4NL_VALUES, dtype=torch.float32)


def codes_per_unit(side: PackedSide) -> int:
    """Codes per byte in the jit code's planar order: 1 for bytes and for q5_0 / q5_1's blocks (jit's _ggml_block)."""
    if side.layout == "ggml":
        return 2 if side.bits == 4 else 1
    if side.bits == 3:
        return 8  # a unit of 3 bytes
    return 8 // side.bits if side.bits < 8 else 1


def unit_bytes(side: PackedSide) -> int:
    """Bytes of one packing unit (the `codes_per_unit(side)` codes of a planar position): 3 for 3-bit codes, else 1."""
    return 3 if side.layout == "kvviz" and side.bits == 3 else 1


def ggml_nibbles(side: PackedSide) -> bool:
    """q4_0, q4_1, iq4_nl: 16 bytes of nibbles per block of 32, low nibbles codes 0..15, high 16..31."""
    return side.layout == "ggml" and side.bits == 4


@functools.lru_cache(maxsize=None)
def _planar(head_dim: int, per_byte: int, ggml: bool = False) -> torch.Tensor:
    """Index [D]: planar position -> channel. The jit code holds field p of a row's byte i at planar position
    p * (D / pb) + i: element pb * i + p in kvviz's order; in a ggml nibble block (ggml=True) byte i of block i // 16
    holds elements 32 * (i // 16) + i % 16 (low nibble) and + 16 (high nibble)."""
    if ggml:
        i = torch.arange(head_dim // 2)
        low = 32 * (i // 16) + i % 16
        return torch.cat([low, low + 16])
    return torch.arange(head_dim).reshape(head_dim // per_byte, per_byte).t().reshape(-1)


@functools.lru_cache(maxsize=None)
def planar_np(head_dim: int, per_byte: int, ggml: bool = False) -> np.ndarray:
    return _planar(head_dim, per_byte, ggml).numpy()


@functools.lru_cache(maxsize=None)
def unplanar_np(head_dim: int, per_byte: int, ggml: bool = False) -> np.ndarray:
    """Index [D]: channel -> its planar position (the inverse of _planar)."""
    return torch.argsort(_planar(head_dim, per_byte, ggml)).numpy()


def scale_code(t: torch.Tensor) -> tuple[int, torch.Tensor | None]:
    """(storage code, table) of a scale / zero-point tensor: fp16, bf16, fp32, E8M0 (uint8) or E4M3."""
    if t.dtype in _FLOAT_CODES:
        return _FLOAT_CODES[t.dtype], None
    if t.dtype == torch.float8_e4m3fn:
        return 0, table("fp8_e4m3", 8, 0, t.dtype)
    assert t.dtype == torch.uint8, f"scales stored as {t.dtype} are not readable here"
    return 0, table("scale", 8, 0, torch.uint8)


_NONE = torch.zeros(4, dtype=torch.uint8)
NONE_NP = _NONE.numpy()


def _bytes(t: torch.Tensor | None):
    """(uint8 numpy view of t's whole storage, byte offset, byte strides of dims 0..2); no copy."""
    if t is None:
        return _NONE.numpy(), 0, (0, 0, 0)
    assert t.device.type == "cpu", "the CPU decode reads CPU tensors"
    assert t.dim() == 4 and (t.stride(-1) == 1 or t.shape[-1] == 1), "buffers must be contiguous along the last dim"
    size = t.element_size()
    flat = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    return flat.numpy(), t.storage_offset() * size, tuple(s * size for s in t.stride()[:3])


def side_args(side: PackedSide, lengths: np.ndarray, batch: int, heads: int, head_dim: int) -> tuple:
    """(meta, data, lut, scale, zero, scale_lut, tensor_scale, tensor_zero, tail, n_packed) for the jit code.

    What depends only on the buffers (their storages and strides, the decode tables, the static scales) is built
    once per buffer set and kept in `side.memo` when the producer gives one (a cache side: its buffers move only
    when they grow); the offsets, the tail and n_packed are read on every call."""
    key = (batch, heads, head_dim, id(side.tensor_scale), *(
        None if t is None else (t.untyped_storage().data_ptr(), t.dtype, t.stride()) for t in (side.data, side.scale, side.zero)))
    memo = side.memo if side.memo is not None else {}
    cached = memo.get("cpu")
    if cached is None or cached[0] != key:
        cached = memo["cpu"] = (key, buffer_args(side, batch, heads, head_dim))
    meta_template, data, lut, scale_np, zero_np, slut, ts, tz = cached[1]
    meta = meta_template.copy()
    meta[contract.M_D_OFF] = _byte_offset(side.data)
    if side.scale_kind is not None:
        meta[contract.M_S_OFF] = _byte_offset(side.scale)
        if side.zero is not None:
            meta[contract.M_Z_OFF] = _byte_offset(side.zero)
    if side.n_packed is None:
        n_packed = lengths
    elif isinstance(side.n_packed, int):
        n_packed = np.full(batch, side.n_packed, dtype=np.int64)
    else:
        n_packed = torch.as_tensor(side.n_packed).to(torch.int64).expand(batch).contiguous().numpy()
    tail = side.tail
    if tail is not None and tail.shape[2] == 0:  # an empty tail (no residual window, whole groups): nothing to read
        assert bool((n_packed >= lengths).all()), "tokens past n_packed need a tail"
        meta[contract.M_TAIL] = 0
        return meta, data, lut, scale_np, zero_np, slut, ts, tz, NONE_NP, n_packed
    if tail is not None:
        assert tail.dim() == 4 and tail.shape[:2] == (batch, heads) and tail.shape[3] == head_dim, (
            f"tail must be [B, Hkv, R, D], got {tuple(tail.shape)}"
        )
        if tail.dtype not in _FLOAT_CODES:
            tail = tail.float()  # a float64 test tail: R rows, never the packed history
        meta[contract.M_TDT], meta[contract.M_TAIL] = _FLOAT_CODES[tail.dtype], 1
    else:
        assert bool((n_packed >= lengths).all()), "tokens past n_packed need a tail"
    tail_np, meta[contract.M_T_OFF], (meta[contract.M_T_SB], meta[contract.M_T_SH], meta[contract.M_T_ST]) = _bytes(tail)
    return meta, data, lut, scale_np, zero_np, slut, ts, tz, tail_np, n_packed


def _byte_offset(t: torch.Tensor) -> int:
    return t.storage_offset() * t.element_size()


def buffer_args(side: PackedSide, batch: int, heads: int, head_dim: int) -> tuple:
    """The part of `side_args` fixed by the buffers: (meta without offsets and tail, data, lut, scale, zero,
    scale_lut, tensor_scale, tensor_zero), numpy views of the storages (no copy)."""
    assert side.data.shape[:2] == (batch, heads), (
        f"packed data is [B, Hkv, cap, packed_dim] = {tuple(side.data.shape)}; want B={batch}, Hkv={heads}"
    )
    assert side.head_dim == head_dim, f"side head_dim {side.head_dim} != expected {head_dim}"
    meta = [0] * contract.META_LEN
    meta[contract.M_DIM] = head_dim
    meta[contract.M_ELEM], lut = element_code(side)
    meta[contract.M_PER_BYTE] = codes_per_unit(side)
    # q5_0 / q5_1 (5): ggml's blocks; q4_0 / q4_1 / iq4_nl (4): int4/g32's layout with codes in their own planar
    # order (_planar); q8_0 (0) is kvviz's int8/g32 layout byte for byte
    meta[contract.M_GGML] = side.bits if side.layout == "ggml" and side.bits < 8 else 0
    meta[contract.M_OFFSET] = side.offset
    meta[contract.M_UNIT] = unit_bytes(side)
    meta[contract.M_RENORM] = int(side.renorm)
    meta[contract.M_ZP] = side.zp_bits
    meta[contract.M_QJL] = head_dim * side.bits // 8 if side.qjl is not None else 0  # the signs follow the codes
    assert not side.renorm or (side.scale_kind == "token" and side.group_size == head_dim), (
        "the norm correction needs one token scale per row")
    data, _, (meta[contract.M_D_SB], meta[contract.M_D_SH], meta[contract.M_D_ST]) = _bytes(side.data)
    scale = zero = None
    slut = None
    if side.scale_kind is not None:
        meta[contract.M_SKIND] = contract.S_TOKEN if side.scale_kind == "token" else contract.S_CHANNEL
        meta[contract.M_SDT], slut = scale_code(side.scale)
        meta[contract.M_GROUP] = side.group_size
        assert side.scale_kind == "channel" or head_dim % side.group_size == 0, "token groups must tile head_dim"
        scale = side.scale
        if side.zero is not None:
            assert side.zero.dtype == side.scale.dtype, "zero points must be stored as the scales are"
            zero, meta[contract.M_ZERO] = side.zero, 1
    scale_np, _, (meta[contract.M_S_SB], meta[contract.M_S_SH], meta[contract.M_S_ST]) = _bytes(scale)
    zero_np, _, (meta[contract.M_Z_SB], meta[contract.M_Z_SH], meta[contract.M_Z_ST]) = _bytes(zero)
    ts = per_head(side.tensor_scale, batch, heads, "cpu")
    tz = per_head(side.zero, batch, heads, "cpu") if side.scale_kind is None else None
    ts = torch.ones(batch * heads) if ts is None else ts
    tz = torch.zeros(batch * heads) if tz is None else tz
    empty = torch.zeros(1)
    return (
        torch.tensor(meta, dtype=torch.int64).numpy(), data, (lut if lut is not None else empty).numpy(),
        scale_np, zero_np, (slut if slut is not None else empty).numpy(), ts.numpy(), tz.numpy(),
    )
