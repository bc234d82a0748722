"""kvviz: a KV-cache quantization playground.

The public API is re-exported here; everything else is private to its module.
"""

from .formats import FORMAT_NAMES, PRESETS, Format, KVSpec, QTensor, get_format, parse_kv
from .memory import GPU_PRESETS, MODEL_PRESETS, get_model_preset, kv_cache_bytes, max_batch, max_context
