"""Triton jit code only (flashinfer's split): each module here pairs with the launcher of the same name one level
up, which picks block sizes and constexpr flags: decode.py (split-K decode over packed K/V, kernels/decode.py),
pack.py (quantize-and-pack on append, kernels/pack.py), ggml_pack.py (the same for llama.cpp's types,
kernels/ggml_pack.py). Importing these modules needs triton; nothing else in `kernels` does.
"""
