"""Launcher for `kernels/jit/ggml_pack.py`: quantize new tokens into llama.cpp's KV cache types (q8_0, q4_0, q4_1,
q5_0, q5_1, iq4_nl) and write them, in ggml's block layout, into packed cache buffers. `kernels.quant_pack` calls
it for formats whose layout names the "ggml" packer, its `ggml_type` the block type; `fmt` is duck-typed (kvviz
Format attributes: rot, spec).
"""

from __future__ import annotations

import torch

from kernels.packed import GGML_TYPES, _on_device
from kernels.splits import next_pow2


def ggml_pack(fmt, layout, x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
              pos: int) -> None:
    """quant_pack for llama.cpp's types (Triton: CUDA or the interpreter): x [B, Hkv, T, D] -> data (int8 q8_0 /
    uint8 ggml blocks), scale d and zero m (q4_1, q5_1) fp16 [B, Hkv, cap, D / 32], rows pos .. pos + T - 1."""
    from kernels.jit.ggml_pack import _ggml_pack_kernel

    batch, heads, n_tokens, head_dim = x.shape
    if fmt.rot:  # kvviz.formats rotates in fp32 the same way
        x = x.float() @ _on_device(layout.rotation, x.device)
    assert x.stride(-1) == 1 and data.stride(-1) == 1, "x and data must be contiguous along their last dim"
    assert data.shape[-1] == head_dim * layout.bits // 8, f"data's last dim must be D * {layout.bits} / 8"
    assert scale is not None and scale.shape[:2] == (batch, heads) and scale.shape[-1] == head_dim // 32, (
        f"scale must be [B, Hkv, cap, D / 32], got {None if scale is None else tuple(scale.shape)}"
    )
    has_min = layout.zero  # q4_1, q5_1: a minimum m beside each block's d
    if has_min:
        assert zero is not None and zero.shape == scale.shape, f"{fmt.spec} needs a zero (m) buffer shaped like scale"
    z = zero if has_min else scale
    block_t = max(2, min(16, next_pow2(n_tokens)))
    grid = (batch * heads, -(-n_tokens // block_t))
    _ggml_pack_kernel[grid](
        x, x.stride(0), x.stride(1), x.stride(2),
        data, data.stride(0), data.stride(1), data.stride(2),
        scale, scale.stride(0), scale.stride(1), scale.stride(2),
        z, z.stride(0), z.stride(1), z.stride(2),
        pos, n_tokens, heads,
        TYPE=GGML_TYPES.index(layout.ggml_type), HEAD_DIM=head_dim, BLOCK_T=block_t, num_warps=4,
        enable_fp_fusion=False,  # ggml's x * id + 0.5 is a rounded multiply, then an add: no fma
    )
