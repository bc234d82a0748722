"""Triton kernels for kvviz and their torch references; imports neither kvviz, transformers nor gradio.

Deliberately carries no `__version__` or other package metadata: a PyPI package is also called `kernels`, and
transformers probes for it; looking like it would switch transformers' hub-kernel path on.

    decode_attention(q, k, v, lengths)   split-K decode attention over packed K/V (Triton; CPU: reference)
    quant_pack(fmt, x, data, scale, ...) quantize new tokens and write them into packed cache buffers (Triton)
    PackedSide                           the plain-tensor description of one packed side (K or V)
    side_of(q)                           a kvviz QTensor (a cache side, or a quantized tensor) as a PackedSide
    decode_attention_reference(...)      float64 dequantize + attention, the reference every test compares to

Each launcher sits beside its jit code under the same name (flashinfer's split): decode.py, pack.py and
ggml_pack.py launch kernels/jit/'s Triton code of the same name; kernels/cpu/decode.py and kernels/cpu/pack.py
launch kernels/cpu/jit/'s numba code. packed.py is the layout contract every kernel reads, splits.py the split-K
sizing both decode launchers share, _triton.py the one place that probes Triton, reference.py the float64 reference.
"""

from kernels.decode import decode_attention
from kernels.pack import quant_pack, quant_pack_supported
from kernels.packed import PackedSide, describes_format, layout_of, side_from_format, side_of
from kernels.reference import decode_attention_reference, dequantize_side
from kernels._triton import triton_installed, triton_usable

__all__ = [
    "PackedSide",
    "decode_attention",
    "decode_attention_reference",
    "dequantize_side",
    "describes_format",
    "layout_of",
    "quant_pack",
    "quant_pack_supported",
    "side_from_format",
    "side_of",
    "triton_installed",
    "triton_usable",
]
