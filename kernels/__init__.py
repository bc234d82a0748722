"""Triton kernels for kvviz and their torch references; imports neither kvviz, transformers nor gradio.

Deliberately carries no `__version__` or other package metadata: a PyPI package is also called `kernels`, and
transformers probes for it; looking like it would switch transformers' hub-kernel path on.

    decode_attention(q, k, v, lengths)   split-K decode attention over packed K/V (Triton; CPU: reference)
    quant_pack(fmt, x, data, scale, ...) quantize new tokens and write them into packed cache buffers (Triton)
    PackedSide                           the plain-tensor description of one packed side (K or V)
    side_of(q)                           a kvviz QTensor (a cache side, or a quantized tensor) as a PackedSide
    decode_attention_reference(...)      float64 dequantize + attention, the reference every test compares to
"""

from kernels.decode import decode_attention
from kernels.pack import quant_pack, quant_pack_supported
from kernels.packed import PackedSide, hadamard, side_from_format, side_of
from kernels.reference import decode_attention_reference, dequantize_side
from kernels._triton import triton_usable

__all__ = [
    "PackedSide",
    "decode_attention",
    "decode_attention_reference",
    "dequantize_side",
    "hadamard",
    "quant_pack",
    "quant_pack_supported",
    "side_from_format",
    "side_of",
    "triton_usable",
]
