"""kvviz: a KV-cache quantization playground.

The public API is re-exported here; everything else is private to its module.

`import kvviz` registers the "kvviz" attention function with transformers through its public registration API
(`AttentionInterface.register`, `AttentionMaskInterface.register`, in kvviz/attention.py), so that
`AutoModelForCausalLM.from_pretrained(..., attn_implementation="kvviz")` works. AttentionInterface lives in
transformers.modeling_utils, so `import kvviz` loads torch and that module (the README gives the cost).
"""

import importlib

from .formats import (FORMAT_NAMES, PRESETS, Format, KVSpec, Plan, QTensor, as_plan, format_plan, get_format, parse_kv,
                      parse_plan)
from .memory import (GPU_PRESETS, MODEL_PRESETS, get_model_preset, kv_cache_bytes, kv_cache_bytes_for, max_batch,
                     max_context, state_bytes_for)
from . import attention  # noqa: F401  (registers "kvviz" with AttentionInterface and AttentionMaskInterface)

# Model loading, the quantized cache and the analyses above them: loaded on first use.
_LAZY = {"load_model": "models", "tiny_model": "models", "describe_model": "models",
         "QuantizedKVCache": "cache",
         # analysis, quality, calibration and export (kvviz/analysis, kvviz/quality, calibrate.py, export.py)
         "capture_kv": "analysis", "compare": "quality", "compare_stream": "quality", "perplexity": "quality",
         "needle": "quality", "KVScales": "calibrate", "calibrate_scales": "calibrate", "save_scales": "calibrate",
         "load_scales": "calibrate", "export_commands": "export",
         # plan export and search, sensitivity, llama.cpp's KLD statistics (export.py, analysis, quality)
         "export_plan": "export", "layer_sensitivity": "analysis",
         "layer_norms": "analysis", "kld": "quality"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
