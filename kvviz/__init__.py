"""kvviz: a KV-cache quantization playground.

The public API is re-exported here; everything else is private to its module.

`import kvviz` registers the "kvviz" attention function with transformers, so that
`AutoModelForCausalLM.from_pretrained(..., attn_implementation="kvviz")` works. transformers' AttentionInterface
lives in transformers.modeling_utils, whose import costs about as much as torch's; so kvviz registers at once when
that module is already loaded, and otherwise the moment it loads (a one-shot import hook), which is before any
model can be built. `import kvviz` itself stays at the cost of formats and the memory model.
"""

from .formats import (FORMAT_NAMES, PRESETS, Format, KVSpec, Plan, QTensor, as_plan, format_plan, get_format, parse_kv,
                      parse_plan)
from .memory import (GPU_PRESETS, MODEL_PRESETS, get_model_preset, kv_cache_bytes, kv_cache_bytes_for, max_batch,
                     max_context, state_bytes_for)

# Model loading and the quantized cache import transformers (seconds): loaded on first use, so that
# `import kvviz` (formats, memory model, CLI) stays fast.
_LAZY = {"load_model": "models", "tiny_model": "models", "describe_model": "models",
         "QuantizedKVCache": "cache",
         # analysis, quality, calibration and export (kvviz/analysis, kvviz/quality, calibrate.py, export.py)
         "capture_kv": "analysis", "compare": "quality", "compare_stream": "quality", "perplexity": "quality",
         "needle": "quality", "KVScales": "calibrate", "calibrate_scales": "calibrate", "save_scales": "calibrate",
         "load_scales": "calibrate", "export_commands": "export",
         # plan export and search, sensitivity, llama.cpp's KLD statistics (export.py, analysis, quality)
         "export_plan": "export", "layer_sensitivity": "analysis",
         "layer_norms": "analysis", "kld": "quality"}


def _register_attention() -> None:
    from . import attention  # noqa: F401  (registers "kvviz" with AttentionInterface and AttentionMaskInterface)


class _RegisterWhenTransformersLoads:
    """A sys.meta_path finder that lets transformers.modeling_utils load as usual, then registers kvviz's
    attention function, and removes itself."""

    _target = "transformers.modeling_utils"

    def find_spec(self, name, path=None, target=None):
        if name != self._target:
            return None
        import importlib.util
        import sys

        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot; also keeps the lookup below from coming back here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _register_attention()

        spec.loader.exec_module = exec_module  # this loader instance serves this one module
        return spec


def _install_registration() -> None:
    import sys

    if _RegisterWhenTransformersLoads._target in sys.modules:
        _register_attention()
    elif not any(isinstance(f, _RegisterWhenTransformersLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterWhenTransformersLoads())


_install_registration()


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
