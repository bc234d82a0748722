"""Triton jit code only (flashinfer's split): `decode_attention` (split-K decode over packed K/V) and `quant_pack`
(quantize-and-pack on append). The launchers that pick block sizes and constexpr flags are kernels/decode.py and
kernels/pack.py. Importing these modules needs triton; nothing else in `kernels` does.
"""
