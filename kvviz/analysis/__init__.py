"""K/V analysis for one prompt: capture (pre/post RoPE), per-channel statistics and outliers, error maps.

    from kvviz import analysis
    cap = analysis.capture_kv(model, tok, prompt)                  # KVCapture: [layers, kv_heads, T, head_dim]
    stats = analysis.capture_stats(cap, "keys_post")               # amax / mean_abs / kurtosis / outliers
    maps = analysis.error_maps(cap, ["int4", "fp8"], layer=3, head=0)   # {spec: [T, head_dim]}
    errs = analysis.layer_errors(cap, ["k8v4", "k4v8"])            # {spec: {"k": [L], "v": [L]}}
    attn = analysis.attention_errors(cap, ["k8v4", "k4v8"])        # {spec: [L]}
    cmp = analysis.scale_comparison(cap, "int8", layer=3, head=0)  # token / channel / head / tensor (+ /rot)
    rot = analysis.rotation_view(cap, layer=3, head=0)             # stats before and after the Hadamard rotation
    hist = analysis.coordinate_histogram(cap, layer=3, head=0)     # unit-vector coordinates against N(0, 1/d)
    sens = analysis.layer_sensitivity(model, tok, prompt, "int4")  # {"k": [L], "v": [L]}: KL, one layer at a time
    res = analysis.search(model, tok, prompt, ["int4", "fp16"], kl_budget=0.01)   # SearchResult: the cheapest plan

Everything returns plain data (numpy arrays, dicts, a dataclass of tensors); nothing here plots.
"""

from kvviz.analysis.capture import KVCapture, LayerAttention, capture_ids, capture_kv
from kvviz.analysis.errors import (ErrorSummary, attention_errors, error_map, error_maps, error_summary,
                                   layer_errors, relative_error, scale_comparison)
from kvviz.analysis.search import SearchResult, SearchStep, search, search_stream
from kvviz.analysis.sensitivity import layer_norms, layer_sensitivity, ranking
from kvviz.analysis.stats import (OUTLIER_FACTOR, capture_stats, channel_stats, coordinate_histogram,
                                  kv_outlier_summary, outlier_mask, rotation_view)

__all__ = [
    "ErrorSummary",
    "KVCapture",
    "LayerAttention",
    "OUTLIER_FACTOR",
    "SearchResult",
    "SearchStep",
    "attention_errors",
    "capture_ids",
    "capture_kv",
    "capture_stats",
    "channel_stats",
    "coordinate_histogram",
    "error_map",
    "error_maps",
    "error_summary",
    "kv_outlier_summary",
    "layer_norms",
    "layer_sensitivity",
    "layer_errors",
    "outlier_mask",
    "ranking",
    "relative_error",
    "search",
    "search_stream",
    "rotation_view",
    "scale_comparison",
]
