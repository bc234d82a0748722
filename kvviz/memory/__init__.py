"""The KV-cache memory model: exact cache bytes for any model, layer by layer, and what fits on real GPUs.

    bytes = sum over layers of  batch x tokens_held x (k_heads x k_dim + v_heads x v_dim) x bits_per_value / 8
            + static scales

`tokens_held` depends on the layer (kvviz.memory.layers): the context for full attention, at most the window for
sliding layers (W in the engine layout, W - 1 as transformers keeps it), at most the chunk for chunked attention,
nothing for recurrent (Mamba, Gated DeltaNet), KV-sharing and MLP-only layers, whose fixed state is reported apart
(state_bytes_for). MLA (DeepSeek-V3, Kimi K2) stores a kv_lora_rank + qk_rope_head_dim latent per token in engines.
Per-group scales and zero points are part of `bits_per_value` (kvviz.formats).

Modules, bottom up: layers (config fields -> LayerShape per layer), presets (models as config fields, GPUs),
configs (any config -> its text model's fields and layer shapes), bytes (exact bytes), curves (bytes against
context for a chart), fit (longest context, largest batch, the CLI/UI table), params (a config's parameter count, counted on the meta device).

Seed check: a 70B-class model (80 layers, 8 KV heads, head_dim 128) at 32K tokens in fp16 holds
2 x 80 x 32768 x 8 x 128 x 2 = 10.74e9 bytes (10.7 GB) per sequence.

    >>> kv_cache_bytes(80, 8, 128, 32768, k="fp16")
    10737418240
    >>> kv_cache_bytes_for("llama-3.1-70b", 32768)
    10737418240

Engines differ from the `engine` layout's rule (the tokens attention reads, no paging slack) in these ways:
- vLLM allocates pages of 16 tokens (`block_size`): full layers round up to a page; SlidingWindowSpec keeps
  `sliding_window - 1` tokens plus the scheduled ones, plus one page because the window need not start on a page
  boundary; ChunkedLocalAttentionSpec keeps up to `attention_chunk_size` plus the scheduled tokens. With the hybrid
  allocator off, vLLM sizes sliding layers as full ones (FullAttentionSpec's note). MLAAttentionSpec stores one
  "head" of kv_lora_rank + qk_rope_head_dim (576) values per token. Mamba state: conv [d_conv - 1] columns.
- SGLang holds sliding layers in a separate SWA pool (sized by --swa-full-tokens-ratio) and frees tokens that left
  the window; its MLA pool stores the same 576-wide latent.
- llama.cpp sizes an SWA layer's cache as min(n_ctx, pad(n_swa x n_seq + n_ubatch, 256)) unless --swa-full.
- transformers keeps W - 1 tokens in sliding and chunked layers and, since 5.x, MLA's latent as two tensors.
"""

from .bytes import (CacheModel, _check_count, _kv_formats, _preset_residual, _tensor_bytes, kv_cache_bytes,
                    kv_cache_bytes_for, layer_breakdown, state_bytes_for)
from .curves import WINDOWED, MemoryCurves, context_samples, memory_curves, windowed_bytes
from .configs import MAX_CONFIG_BYTES, config_dict, layer_shapes, read_config_file, state_shapes
from .fit import (CONTEXT_CAP, fit_keep, kv_budget_bytes, max_batch, max_context, memory_table, model_kv_bytes,
                  resolve_model, split_formats)
from .layers import KINDS, LAYOUTS, LayerShape
from .params import count_params
from .presets import GB, GPU_PRESETS, MODEL_PRESETS, GpuPreset, ModelPreset, get_gpu_preset, get_model_preset

__all__ = ["CONTEXT_CAP", "GB", "GPU_PRESETS", "KINDS", "LAYOUTS", "MAX_CONFIG_BYTES", "MODEL_PRESETS",
           "CacheModel", "GpuPreset", "LayerShape", "MemoryCurves", "ModelPreset", "WINDOWED", "context_samples", "config_dict", "count_params", "fit_keep", "get_gpu_preset",
           "get_model_preset", "kv_budget_bytes", "kv_cache_bytes", "kv_cache_bytes_for", "layer_breakdown",
           "layer_shapes", "max_batch", "max_context", "memory_curves", "memory_table", "model_kv_bytes", "read_config_file",
           "resolve_model", "split_formats", "state_bytes_for", "state_shapes", "windowed_bytes"]
