"""Launcher for `kernels/jit/pack.py`: quantize new tokens of one side and write them into packed buffers.

Covers the formats whose groups lie inside one token (token / gN int sym and asym, fp8 per token or per group,
MX and NV FP4), the static per-tensor / per-head scales (fp8, int sym), and llama.cpp's KV types (q8_0, q4_0, q4_1,
q5_0, q5_1, iq4_nl, in ggml's block layout: `kernels/ggml_pack.py`). Channel-granularity formats reduce over
tokens, so the cache quantizes those with kvviz.formats when a group fills. Which loop writes a format, and how, is
its packed layout's (`layout.packer`, kernels.packed.layout_of): nothing here names a format. `fmt` is duck-typed
(kvviz Format attributes: layout, bits, granularity, static_scale, takes_scale, rot, spec); nothing here imports
kvviz.

    quant_pack(fmt, x, data, scale, zero, pos=cache_len, tensor_scale=ts)   # x: [B, Hkv, T_new, D]
"""

from __future__ import annotations

import torch

from kernels._triton import triton_usable
from kernels.ggml_pack import ggml_pack
from kernels.packed import GGML_TYPES, PACKERS, _on_device, layout_of, per_head
from kernels.splits import next_pow2


def token_packer(fmt, head_dim: int):
    """The layout of a format whose groups lie inside one token and that one of kvviz's token-group loops (PACKERS:
    int sym / asym, fp8, MX, NV) or llama.cpp's block loop writes, at a power-of-two head_dim; else None. What
    both packers cover; each adds the bit widths it packs."""
    if head_dim < 2 or head_dim & (head_dim - 1) or fmt.granularity is None:
        return None
    if getattr(fmt, "rounds_toward_zero", False):  # vLLM's CPU fp8 (toward zero): kvviz.formats stores it
        return None
    layout = layout_of(fmt, head_dim)
    if layout is None or (layout.packer not in PACKERS and layout.packer != "ggml"):
        return None
    if layout.packer == "ggml":
        return layout if head_dim >= 32 and layout.ggml_type in GGML_TYPES else None
    if layout.scale_kind == "channel":  # channel groups reduce over tokens: quantized when a group fills
        return None
    if fmt.static_scale and layout.packer in ("int_asym", "mx", "nv"):
        return None  # asym per-tensor zero points are computed from the whole tensor: not an append
    return layout


def quant_pack_supported(fmt, head_dim: int) -> bool:
    """True when `quant_pack` can write this format (and head_dim, a power of two) on this machine's backend."""
    layout = token_packer(fmt, head_dim)
    return layout is not None and (layout.packer == "ggml" or layout.bits in (8, 4, 2))  # 8 // bits codes a byte


_KINDS = {packer: code for code, packer in enumerate(PACKERS)}  # the jit code's KIND: its index in PACKERS


def quant_pack(
    fmt,
    x: torch.Tensor,
    data: torch.Tensor,
    scale: torch.Tensor | None = None,
    zero: torch.Tensor | None = None,
    pos: int = 0,
    tensor_scale: torch.Tensor | float | None = None,
) -> None:
    """Quantize x and write it at token rows pos .. pos + T - 1 of the cache buffers, in place.

    x:            [B, Hkv, T, D] float (fp16 / bf16 / fp32), D a power of two
    data:         [B, Hkv, cap, D * bits / 8]: int8 (int8 sym), uint8 (int8 asym, int4, int2, FP4), fp8 dtype
    scale:        [B, Hkv, cap, D / group]: fp16 (int), fp32 (fp8), uint8 E8M0 (MX), float8_e4m3fn (NV);
                  None for static per-tensor / per-head formats
    zero:         asym only, shaped and typed like an int scale (fp16)
    tensor_scale: the static fp32 scale (fp8 / int sym tensor or head granularity) or NV FP4's global scale:
                  a number, [] or anything holding Hkv or B * Hkv values
    The result is bit-identical to fmt.quantize(x) with that tensor scale (rotation included for /rot).
    """
    if not triton_usable(x.device):
        raise ValueError("quant_pack needs Triton on CUDA (or TRITON_INTERPRET=1); quantize with kvviz.formats.")
    batch, heads, n_tokens, head_dim = x.shape
    if not quant_pack_supported(fmt, head_dim):
        raise ValueError(f"quant_pack does not write {fmt.spec} at head_dim {head_dim}; use fmt.quantize instead.")
    assert data.shape[:2] == (batch, heads) and data.shape[2] >= pos + n_tokens, (
        f"data {tuple(data.shape)} cannot hold tokens {pos}..{pos + n_tokens - 1} of x {tuple(x.shape)}"
    )
    layout = layout_of(fmt, head_dim)
    if layout.packer == "ggml":
        ggml_pack(fmt, layout, x, data, scale, zero, pos)
        return
    from kernels.jit.pack import _quant_pack_kernel

    static = fmt.static_scale
    if fmt.rot:  # kvviz.formats rotates in fp32 the same way
        x = x.float() @ _on_device(layout.rotation, x.device)
    assert x.stride(-1) == 1 and data.stride(-1) == 1, "x and data must be contiguous along their last dim"
    group = head_dim if static else (layout.group or head_dim)
    if data.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        data = data.view(torch.uint8)
    needs_ts = fmt.takes_scale
    if needs_ts and tensor_scale is None:
        raise ValueError(f"{fmt.spec} appends with a fixed tensor scale: pass tensor_scale.")
    ts = per_head(tensor_scale, batch, heads, x.device) if needs_ts else data
    if static:
        s = data  # placeholder, never written
    else:
        assert scale is not None and scale.shape[:2] == (batch, heads) and scale.shape[-1] == head_dim // group, (
            f"scale must be [B, Hkv, cap, D / group], got {None if scale is None else tuple(scale.shape)}"
        )
        s = scale.view(torch.uint8) if scale.dtype == torch.float8_e4m3fn else scale
    z = zero if zero is not None else s
    if layout.zero:
        assert zero is not None and zero.shape == scale.shape, "asym formats need a zero buffer shaped like scale"
    block_t = max(2, min(16, next_pow2(n_tokens)))
    grid = (batch * heads, -(-n_tokens // block_t))
    _quant_pack_kernel[grid](
        x, x.stride(0), x.stride(1), x.stride(2),
        data, data.stride(0), data.stride(1), data.stride(2),
        s, s.stride(0), s.stride(1), s.stride(2),
        z, z.stride(0), z.stride(1), z.stride(2),
        ts, pos, n_tokens, heads,
        KIND=_KINDS[layout.packer], BITS=layout.bits, FP8_EXP=layout.fp8_exp or 4, GROUP=group, STATIC=static,
        HALF_DIV=x.dtype == torch.float16 and not static, HEAD_DIM=head_dim, BLOCK_T=block_t, num_warps=4,
    )
