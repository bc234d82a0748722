"""`QuantizedKVCache`: the container. One layer object per decoder layer, chosen as transformers' DynamicCache
chooses them (cache_utils.get_layer_types_and_kwargs + DYNAMIC_LAYER_TYPE_MAPPING), quantized where it holds K/V.
"""

from __future__ import annotations

from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, Cache, DummyLayer, get_layer_types_and_kwargs

from kvviz import ggml_attention
from kvviz.formats import KVSpec, Plan, as_plan
from kvviz.formats.engines import check_model

from .layers import QuantizedHybridLayer, QuantizedHybridSlidingLayer, QuantizedKVLayer, QuantizedSlidingLayer
from .sides import check_fits

# layer type (transformers' names) -> how kvviz caches it
ATTENTION_TYPES = {"full_attention": QuantizedKVLayer, "sliding_attention": QuantizedSlidingLayer,
                   "chunked_attention": QuantizedSlidingLayer, "hybrid": QuantizedHybridLayer,
                   "hybrid_sliding": QuantizedHybridSlidingLayer}
STATE_TYPES = ("linear_attention", "conv")  # transformers' LinearAttentionLayer, kept as it is (full precision)
SUPPORTED_TYPES = (*ATTENTION_TYPES, *STATE_TYPES, "dummy")


class QuantizedKVCache(Cache):
    """A transformers Cache holding packed, quantized K/V (see kvviz.cache's docstring).

    config: the model config (any decoder-only architecture whose layers transformers caches as full, sliding,
    chunked, linear-attention / Mamba, hybrid or shared-KV layers). spec: "k=int8,v=int4", one spec for both
    ("fp8_e4m3"), a preset ("k8v4", "kivi2") or a KVSpec; or a plan, one spec per layer: a kvviz.Plan, a plan
    string such as "int4; 0,27=fp16" or a list of num_hidden_layers specs (None keeps that layer exact, as
    DynamicCache would); anything but a Plan goes through kvviz.as_plan once. residual: full-precision recent tokens (None: the
    preset's, e.g. 32 for kivi2; else 0). scales: {layer: (k_scale, v_scale)} static scales for per-tensor /
    per-head formats (and NVFP4's global scale), e.g. calibrated or loaded from an SGLang scale file: one entry
    per layer that holds K/V. stage: on the CPU's fused backend, a decode step's update only stages the token and
    the attention function appends and attends in one call (False: every update stores at once, for callers that
    read what update returns, as RowStackCache does).
    Raises ValueError for a layer type kvviz does not cache, a spec some layer's head_dim cannot hold (naming the
    layer), or a plan whose length is not num_hidden_layers.
    """

    def __init__(self, config, spec, residual: int | None = None, scales: dict | None = None, stage: bool = True):
        text = _decoder_config(config)
        layer_types, layer_kwargs = get_layer_types_and_kwargs(text)
        # self.plan: one KVSpec per layer (None: kept exact, as DynamicCache holds it), the engine's layer rules
        # applied (vLLM's TurboQuant keeps boundary layers in 16 bits); self.spec: the spec when uniform
        self.kv_plan: Plan = as_plan(spec)
        self.plan = self.kv_plan.resolve(text.num_hidden_layers, layer_types)
        self.spec = self.kv_plan.default if self.kv_plan.is_uniform else None
        if residual is not None and int(residual) < 0:
            raise ValueError(f"residual is a number of recent tokens kept in full precision (>= 0), got {residual}.")
        self.residual = (int(residual) if residual is not None
                         else self.spec.residual if self.spec is not None else None)
        scales = scales or {}
        if scales and not any(f.takes_scale for kv in self.plan if kv is not None for f in (kv.k, kv.v)):
            raise ValueError(f"Static scales apply to per-tensor / per-head formats; {self._name()} computes "
                             f"its own scales. Drop `scales`, or pick e.g. fp8_e4m3.")
        materialize = _caches_latent(text)
        for kv in self.kv_plan.specs:  # what vLLM refuses on this model (MLA-only dtypes, MLA's own dtype list)
            check_model((kv.k, kv.v), mla=materialize)
        layers, self._exact = [], []
        for i, (kind, kwargs, kv) in enumerate(zip(layer_types, layer_kwargs, self.plan)):
            if kind in ATTENTION_TYPES and kv is None:
                if kind not in DYNAMIC_LAYER_TYPE_MAPPING:
                    raise ValueError(f"Layer {i} is a {kind!r} layer, which a plan cannot keep exact; give it a "
                                     f"spec such as fp16.")
                layers.append(DYNAMIC_LAYER_TYPE_MAPPING[kind](**kwargs))
                self._exact.append(i)
            elif kind in ATTENTION_TYPES:
                k_dim, v_dim = layer_head_dims(text, i)
                for fmt, dim, side in ((kv.k, k_dim, "K"), (kv.v, v_dim, "V")):
                    if dim is not None:
                        check_fits(fmt, dim, f"Layer {i} ({kind}) {side}")
                res = kv.residual if residual is None else int(residual)
                layers.append(ATTENTION_TYPES[kind](kv.k, kv.v, residual=res, scales=_layer_scales(scales, i, kv),
                                                    name=f"layer {i}", materialize=materialize, **kwargs))
            elif kind in STATE_TYPES:
                layers.append(DYNAMIC_LAYER_TYPE_MAPPING[kind](**kwargs))
            elif kind == "dummy":
                layers.append(DummyLayer())
            else:
                raise ValueError(f"{text.model_type}: layer {i} is a {kind!r} layer, which kvviz does not cache. "
                                 f"QuantizedKVCache supports the layer types {', '.join(SUPPORTED_TYPES)}; use "
                                 f"transformers' DynamicCache for this model.")
        super().__init__(layers=layers)
        if self.kv_plan.evict is not None:
            _set_eviction(self.kv_plan.evict, text, layers, layer_types)
        interleaved = ggml_attention.interleaved_model(text)  # llama.cpp's K channel order, for its names
        for layer in layers:
            if isinstance(layer, QuantizedKVLayer):
                layer.interleaved = interleaved
        if stage and not materialize and not any(isinstance(layer, DummyLayer) for layer in layers):
            for layer in layers:  # nothing reads update's return but the attention function: decode steps may stage
                if isinstance(layer, QuantizedKVLayer):
                    layer.stages = True

    def _name(self) -> str:
        """The spec, or the plan string, for messages."""
        if self.spec is not None:
            return self.spec.spec
        return self.kv_plan.text

    def nbytes(self, one_row: bool = False) -> int:
        """Bytes of K/V really held (in use, not capacity): packed data, scales, zeros, tails and static scales.
        Linear-attention / Mamba states are not K/V and are not counted. one_row: what one batch row holds, as a
        batch-1 cache would (static scales, shared by the batch, counted once)."""
        exact = sum(t.numel() * t.element_size() // (t.shape[0] if one_row else 1)
                    for i in self._exact if self.layers[i].is_initialized
                    for t in (self.layers[i].keys, self.layers[i].values))  # plan layers kept exact
        return exact + sum(layer.nbytes(one_row) for layer in self.layers if hasattr(layer, "nbytes"))

    def __repr__(self) -> str:
        return f"QuantizedKVCache({self._name()!r}, residual={self.residual}, layers={len(self.layers)})"


def _set_eviction(evict, text, layers: list, layer_types: list) -> None:
    """Give the plan's eviction to every full-attention layer (kvviz.cache.eviction); sliding-window and chunked
    layers keep their own window. ValueError where no layer would evict, or where eviction cannot apply."""
    where = f"@ {evict.text}"
    if any(isinstance(layer, DummyLayer) for layer in layers) or _caches_latent(text):
        raise ValueError(f"{text.model_type} shares K/V between layers or caches a latent (MLA): eviction ({where}) "
                         f"runs on per-head K/V of its own. Drop '{where}' for this model.")
    full = [layer for layer in layers if isinstance(layer, QuantizedKVLayer) and not layer.is_sliding]
    if not full:
        kinds = sorted({k for k in layer_types if k in ATTENTION_TYPES})
        raise ValueError(f"Every K/V layer of {text.model_type} is a {' / '.join(kinds)} layer, which already keeps "
                         f"only its last window of tokens: eviction ({where}) applies to full-attention layers "
                         f"and would change nothing here. Drop '{where}', or use a model with full-attention layers.")
    for layer in full:
        layer.evict = evict
        layer.layer_idx = i = layers.index(layer)
        if evict.rest is not None:
            for dim, side in zip(layer_head_dims(text, i), "KV"):
                if dim is not None:
                    check_fits(evict.rest, dim, f"Layer {i} {side} (rest={evict.rest.spec})")


def evicting_layers(config) -> list[int]:
    """The decoder layers a plan's eviction compresses on this model (full attention, and the attention half of
    hybrid layers); sliding-window and chunked layers keep their window. For a view's note: "@ snapkv applies to
    layers 5, 11, 17; the others keep their 512-token window"."""
    return [i for i, kind in enumerate(model_layer_types(config))
            if ATTENTION_TYPES.get(kind) in (QuantizedKVLayer, QuantizedHybridLayer)]


def model_layer_types(config) -> list[str]:
    """One transformers layer type per decoder layer of a model config ("full_attention", "sliding_attention",
    "linear_attention", ...): what Plan.resolve takes to apply an engine's layer rules to this model."""
    return list(get_layer_types_and_kwargs(_decoder_config(config))[0])


def _decoder_config(config):
    """The decoder's text config; ValueError for what QuantizedKVCache cannot serve."""
    get_text = getattr(config, "get_text_config", None)
    if get_text is None:
        raise ValueError(f"QuantizedKVCache takes a transformers model config (model.config), got "
                         f"{type(config).__name__}.")
    text = get_text(decoder=True)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{config.model_type} is an encoder-decoder model: QuantizedKVCache caches decoder-only "
                         f"causal LMs. Use transformers' EncoderDecoderCache for it.")
    if not getattr(text, "num_hidden_layers", None):
        raise ValueError(f"{getattr(text, 'model_type', type(text).__name__)} has no num_hidden_layers: kvviz "
                         f"does not know how to lay out its cache. QuantizedKVCache serves decoder-only causal LMs.")
    return text


def _caches_latent(text) -> bool:
    """MLA models (DeepSeek-V2/V3, Kimi, GLM-4-MoE-Lite, ...): transformers caches the compressed latent, the
    "K" side [B, 1, T, kv_lora_rank] and the "V" side the shared RoPE key [B, 1, T, qk_rope_head_dim], and the
    attention module expands them (kv_b_proj) after the cache, before the attention function."""
    return getattr(text, "kv_lora_rank", None) is not None


def layer_head_dims(text, i: int) -> tuple[int | None, int | None]:
    """(K head_dim, V head_dim) of decoder layer i as transformers caches it; None where the config does not say.

    MLA caches the latent: K side kv_lora_rank wide, V side qk_rope_head_dim wide, one head (see _caches_latent).
    Gemma 4's global layers have their own head_dim in per_layer_config.
    """
    layer = text.per_layer_config[i]
    if _caches_latent(text):
        return text.kv_lora_rank, text.qk_rope_head_dim
    dim = getattr(layer, "head_dim", None)
    if dim is None and getattr(layer, "hidden_size", None) and getattr(layer, "num_attention_heads", None):
        dim = layer.hidden_size // layer.num_attention_heads
    return dim, dim


def _layer_scales(scales: dict, i: int, spec: KVSpec):
    if not scales:
        return None
    pair = scales.get(i, scales.get(str(i)))
    if pair is None:
        raise ValueError(f"`scales` has no entry for layer {i}; give (k_scale, v_scale) for every layer that "
                         f"holds K/V.")
    k_scale, v_scale = pair
    return (k_scale if spec.k.takes_scale else None, v_scale if spec.v.takes_scale else None)
