"""Per-layer FP8 K/V scales calibrated on a few prompts, saved and loaded in SGLang's `--quantization-param-path`
JSON layout.

    scales = calibrate_scales(model, tok, ["my prompt", ...])          # amax / 448 per layer, for K and for V
    save_scales(scales, "scales.json")                                 # SGLang: --quantization-param-path scales.json
    scales = load_scales("scales.json", num_layers=30)
    cache = kvviz.QuantizedKVCache(model.config, "fp8_e4m3", scales=scales.for_cache())

The file (SGLang `python/sglang/srt/model_loader/weight_utils.py`, `QuantParamSchema`, adapted from vLLM's old
`quantization/schema.py`):

    {"model_type": "llama",                      # optional
     "kv_cache": {"dtype": "float8_e4m3fn",      # the only dtype the schema accepts
                  "scaling_factor": {"<tp_rank>": {"<layer>": scale, ...}, ...}}}

A scale is the dequantization multiplier, x = fp8_value * scale, so amax / 448 maps the largest magnitude seen to
E4M3's largest finite value. SGLang's loader (`load_kv_cache_scales` in its Llama-style models) assigns each
layer's ONE number to both `attn.k_scale` and `attn.v_scale`: the file cannot hold different K and V scales. So
`save_scales` writes max(k_scale, v_scale) per layer, the choice that clips neither K nor V; the K and V scales
kvviz calibrates separately are kept in memory (`KVScales.k`, `.v`) for kvviz's own cache. Every tensor-parallel
rank gets the same per-layer number (kvviz calibrates on the whole layer, all KV heads).
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from kvviz.analysis.capture import capture_ids
from kvviz.cache.sides import MIN_FIT_TOKENS, ScaleWarning
from kvviz.formats import max_value

SGLANG_DTYPE = "float8_e4m3fn"
SGLANG_BASE = "fp8_e4m3"  # the kvviz base whose elements SGLANG_DTYPE stores: the only one its scale file takes
_FMT_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


@dataclass(frozen=True)
class KVScales:
    """Per-layer per-tensor scales. k, v: one float per layer (x = fp8 * scale). base: "fp8_e4m3" | "fp8_e5m2"."""

    k: tuple[float, ...]
    v: tuple[float, ...]
    base: str = "fp8_e4m3"
    method: str = "amax"

    def __post_init__(self):
        assert len(self.k) == len(self.v), f"{len(self.k)} K scales but {len(self.v)} V scales"

    @property
    def num_layers(self) -> int:
        return len(self.k)

    def shared(self) -> tuple[float, ...]:
        """One scale per layer for K and V together, as SGLang's file holds it: max(k, v)."""
        return tuple(max(a, b) for a, b in zip(self.k, self.v))

    def for_cache(self) -> dict[int, tuple[float, float]]:
        """{layer: (k_scale, v_scale)}: the form kvviz.QuantizedKVCache(scales=...) takes."""
        return {i: (k, v) for i, (k, v) in enumerate(zip(self.k, self.v))}


@torch.no_grad()
def calibrate_scales(model, tokenizer, prompts: list[str], base: str = "fp8_e4m3", percentile: float | None = None,
                     max_tokens: int = 512) -> KVScales:
    """Per-layer K and V scales from a few prompts: statistic(|x|) / fmt_max, the statistic being the largest
    magnitude (percentile=None) or the given percentile of |x| (e.g. 99.9, which clips rarer outliers), taken over
    each prompt's layer tensor [kv_heads, tokens, head_dim] and then the maximum over prompts. K is post-RoPE (what
    the cache stores). Each prompt is truncated to max_tokens tokens."""
    if base not in _FMT_MAX:
        raise ValueError(f"Calibration is for per-tensor FP8; base must be one of {', '.join(_FMT_MAX)}, got {base!r}.")
    if isinstance(prompts, str) or not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("calibrate_scales needs a list of one or more non-empty prompt strings.")
    if percentile is not None and not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}.")
    fmt_max = _FMT_MAX[base]
    assert fmt_max == max_value(base), f"{base} max disagrees with kvviz.formats"
    k_stat = v_stat = None
    seen = 0
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"][:, :max_tokens]
        seen += ids.shape[1]
        cap = capture_ids(model, ids)
        k, v = _statistic(cap.keys_post, percentile), _statistic(cap.values, percentile)  # [layers]
        k_stat = k if k_stat is None else torch.maximum(k_stat, k)
        v_stat = v if v_stat is None else torch.maximum(v_stat, v)
    if seen < MIN_FIT_TOKENS:
        warnings.warn(ScaleWarning(f"FP8 scales calibrated on {seen} tokens (fewer than {MIN_FIT_TOKENS}): later "
                                   "tokens with larger K or V saturate. Calibrate on more text.", "few_tokens",
                                   f"{base}/calibrated", tokens=seen), stacklevel=2)
    tiny = torch.finfo(torch.float32).tiny  # an all-zero layer must not get a zero scale
    k_scale = (k_stat / fmt_max).clamp(min=tiny)
    v_scale = (v_stat / fmt_max).clamp(min=tiny)
    method = "amax" if percentile is None else f"p{percentile:g}"
    return KVScales(tuple(k_scale.tolist()), tuple(v_scale.tolist()), base, method)


def _statistic(x: torch.Tensor, percentile: float | None) -> torch.Tensor:
    """x [layers, heads, tokens, dim] -> [layers]: amax or percentile of |x| per layer."""
    flat = x.abs().flatten(1).float()  # [layers, heads * tokens * dim]
    if percentile is None:
        return flat.amax(dim=1)
    return torch.quantile(flat, percentile / 100.0, dim=1)


# ---- SGLang JSON ----------------------------------------------------------------------------------------------


def scales_to_json(scales: KVScales, tp_size: int = 1, model_type: str | None = None) -> dict:
    """The SGLang --quantization-param-path document for these scales (one max(k, v) scale per layer per rank)."""
    if scales.base != SGLANG_BASE:
        raise ValueError(f"SGLang's scale file is for float8_e4m3fn only; these scales are for {scales.base}. "
                         "Calibrate with base='fp8_e4m3'.")
    if not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tp_size must be a positive integer, got {tp_size!r}.")
    per_layer = {str(i): float(s) for i, s in enumerate(scales.shared())}
    doc: dict = {}
    if model_type:
        doc["model_type"] = model_type
    doc["kv_cache"] = {"dtype": SGLANG_DTYPE, "scaling_factor": {str(r): dict(per_layer) for r in range(tp_size)}}
    return doc


def save_scales(scales: KVScales, path: "str | Path", tp_size: int = 1, model_type: str | None = None) -> Path:
    """Write scales_to_json(...) to `path` (pretty-printed); returns the path."""
    path = Path(path)
    path.write_text(json.dumps(scales_to_json(scales, tp_size, model_type), indent=2) + "\n")
    return path


def load_scales(path: "str | Path", num_layers: int | None = None) -> KVScales:
    """Read an SGLang scale file. K and V both get the file's per-layer scale (as SGLang applies it); when ranks
    differ, the largest scale of each layer is kept (kvviz runs unsharded). num_layers: check the layer count.

    Raises ValueError with what is wrong: unreadable or not JSON, no kv_cache / dtype / scaling_factor, a dtype
    other than float8_e4m3fn, non-integer ranks or layers, missing layers, a non-positive or non-finite scale, or
    a layer count that does not match num_layers."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"Cannot read the scale file {path}: {err.strerror or err}.") from err
    except json.JSONDecodeError as err:
        raise ValueError(f"The scale file {path} is not valid JSON ({err.msg} at line {err.lineno}).") from err
    return scales_from_json(doc, num_layers, source=str(path))


def scales_from_json(doc, num_layers: int | None = None, source: str = "the scale document") -> KVScales:
    """Validate and read an SGLang scale document (already parsed); see load_scales."""
    where = source
    if not isinstance(doc, dict) or not isinstance(doc.get("kv_cache"), dict):
        raise ValueError(f"{where} must be a JSON object with a \"kv_cache\" object "
                         "({\"kv_cache\": {\"dtype\": \"float8_e4m3fn\", \"scaling_factor\": {...}}}).")
    kv = doc["kv_cache"]
    if kv.get("dtype") != SGLANG_DTYPE:
        raise ValueError(f"{where}: kv_cache.dtype must be \"{SGLANG_DTYPE}\" (the only dtype SGLang's scale "
                         f"files take), got {kv.get('dtype')!r}.")
    ranks = kv.get("scaling_factor")
    if not isinstance(ranks, dict) or not ranks:
        raise ValueError(f"{where}: kv_cache.scaling_factor must be a non-empty object "
                         "{\"<tp_rank>\": {\"<layer>\": scale}}.")
    per_layer: dict[int, float] = {}
    layer_sets = []
    for rank, layers in ranks.items():
        _as_index(rank, f"{where}: tensor-parallel rank")
        if not isinstance(layers, dict) or not layers:
            raise ValueError(f"{where}: scaling_factor[{rank!r}] must be a non-empty object {{\"<layer>\": scale}}.")
        seen = set()
        for layer, scale in layers.items():
            i = _as_index(layer, f"{where}: rank {rank} layer")
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
                raise ValueError(f"{where}: rank {rank} layer {layer} has scale {scale!r}; scales must be positive, "
                                 "finite numbers.")
            per_layer[i] = max(per_layer.get(i, 0.0), float(scale))
            seen.add(i)
        layer_sets.append(seen)
    if any(s != layer_sets[0] for s in layer_sets):
        raise ValueError(f"{where}: the tensor-parallel ranks list different layers; every rank needs every layer.")
    count = len(per_layer)
    if sorted(per_layer) != list(range(count)):
        missing = sorted(set(range(max(per_layer) + 1)) - set(per_layer))
        raise ValueError(f"{where}: layers must be numbered 0..{count - 1} without gaps; missing {missing[:5]}.")
    if num_layers is not None and count != num_layers:
        raise ValueError(f"{where} holds scales for {count} layers but the model has {num_layers}; it was made "
                         "for another model.")
    scales = tuple(per_layer[i] for i in range(count))
    return KVScales(k=scales, v=scales, base="fp8_e4m3", method="loaded")


def _as_index(key, what: str) -> int:
    try:
        i = int(key)
    except (TypeError, ValueError):
        raise ValueError(f"{what} {key!r} is not an integer.") from None
    if i < 0 or str(i) != str(key).strip():
        raise ValueError(f"{what} {key!r} must be a non-negative integer such as \"0\".")
    return i
