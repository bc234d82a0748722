"""`QuantizedKVCache`: a transformers Cache that stores K and V packed, quantizing each token once, on append.

transformers' own `QuantizedCache` re-quantizes the whole history whenever its residual window fills, dequantizes
all of it at every step, and serves full-attention layers only. Here each token is quantized exactly once, when it
enters the quantized store, and appended to preallocated buffers that grow by doubling along the token axis. The
buffers are laid out [batch, kv_heads, tokens(capacity), ...] exactly as kvviz's QTensor lays out data / scale /
zero, so the fused decode kernels read them in place (a side is handed out as a `QTensor` with a tail,
kvviz/formats/qtensor.py).

Every decoder architecture transformers caches: the cache builds one layer object per decoder layer exactly as
transformers' DynamicCache does (cache_utils.get_layer_types_and_kwargs), quantized where the layer holds K/V:

    layer type                          transformers' layer              kvviz's layer (kvviz/cache/layers.py)
    full_attention                      DynamicLayer                     QuantizedKVLayer: every token
    sliding_attention, chunked_attention DynamicSlidingWindowLayer       QuantizedSlidingLayer: last window - 1
    hybrid, hybrid_sliding (Falcon-H1)  LinearAttentionAnd...Layer       QuantizedHybrid(Sliding)Layer: state as is
    linear_attention, conv (Qwen3-Next) LinearAttentionLayer             the same object: full-precision state
    dummy (Gemma 4's shared-KV layers)  DummyLayer                       DummyLayer: reads its producer's handles

K and V may have different head dims (DeepSeek-V3: 192 and 128). Sinks, softcapping and windows are the
attention function's business (kvviz/attention.py); the cache only decides which tokens are kept.

Semantics (as vLLM): the first `update` (the prompt) returns the raw K/V, so the prompt attends to its own
unquantized states; what is stored is quantized; every later `update` (decode, or a teacher-forced chunk with
q_len > 1) stores its tokens and returns two `QTensor` handles (one per side) over what attention may see, which the "kvviz"
attention function reads (torch backend: dequantize + attention, the reference; triton: the fused kernel).

Storage per layer and side (K, V), tokens in order (kvviz/cache/sides.py):
- quantized part: whole tokens (token / tensor / head granularity, casts) or whole groups of N tokens (channel);
- tail: full-precision tokens not quantized yet, [batch, kv_heads, r, head_dim]: the `residual` most recent tokens
  (KIVI's window; 0 = none) plus, for channel formats, the partial group waiting to fill. The tail is 16-bit: the
  model dtype when that is fp16/bf16, else fp16, as kvviz.kv_cache_bytes counts it.
- static scales (per-tensor, per-head, NVFP4's global scale): from `scales` when given, else computed once from the
  first update (the prefill: amax / max, as transformers' fp8 cache does), then fixed and shared by the batch.
- sliding layers drop what leaves the window; channel formats keep the oldest group whole (up to N - 1 positions
  before the window, never shown to attention: `QTensor.skip`).

Appends quantize with kvviz.formats (the reference), or, with the Triton backend on a device Triton runs on, with
the fused kernels.quant_pack that writes straight into the buffers (bit-identical; channel formats excepted).

    cache = QuantizedKVCache(model.config, "k8v4")
    out = model.generate(**enc, cache=cache, max_new_tokens=32)   # model: attn_implementation="kvviz"
    cache.nbytes()   # bytes really held == kvviz.memory's figure for the same config and length

Speed, bytes and quality against DynamicCache and transformers' QuantizedCache: `python -m kvviz bench`.
"""

from .layers import QuantizedHybridLayer, QuantizedHybridSlidingLayer, QuantizedKVLayer, QuantizedSlidingLayer
from .quantized import SUPPORTED_TYPES, QuantizedKVCache, evicting_layers, layer_head_dims, model_layer_types
from .sides import ScaleWarning, held_tokens

__all__ = ["ScaleWarning", "QuantizedKVCache", "QuantizedKVLayer", "QuantizedSlidingLayer", "QuantizedHybridLayer",
           "QuantizedHybridSlidingLayer", "SUPPORTED_TYPES", "evicting_layers", "held_tokens", "layer_head_dims",
           "model_layer_types"]
