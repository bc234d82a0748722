"""kvviz: a KV-cache quantization playground.

The public API is re-exported here; everything else is private to its module.
"""

from .formats import FORMAT_NAMES, PRESETS, Format, KVSpec, QTensor, get_format, parse_kv
from .memory import (GPU_PRESETS, MODEL_PRESETS, get_model_preset, kv_cache_bytes, kv_cache_bytes_for, max_batch,
                     max_context, state_bytes_for)

# Model loading and the quantized cache import transformers (seconds): loaded on first use, so that
# `import kvviz` (formats, memory model, CLI) stays fast.
_LAZY = {"load_model": "models", "tiny_model": "models", "describe_model": "models",
         "QuantizedKVCache": "cache",
         # analysis, quality, calibration and export (kvviz/analysis, kvviz/quality, calibrate.py, export.py)
         "capture_kv": "analysis", "compare": "quality", "compare_stream": "quality", "perplexity": "quality",
         "needle": "quality", "KVScales": "calibrate", "calibrate_scales": "calibrate", "save_scales": "calibrate",
         "load_scales": "calibrate", "export_commands": "export"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
