"""Pins the parts of transformers that kvviz.cache, kvviz.attention and kvviz.models rely on.

The Cache / CacheLayerMixin API and the attention dispatch move between minor releases (v5 renamed
`past_key_values` to `cache`, moved storage into per-layer objects, added mask interfaces). When a transformers
upgrade breaks one of these, this file says which assumption went, before a generation test fails obscurely.

    python -m pytest tests/test_transformers_contract.py -q
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import transformers
from transformers import AttentionInterface, cache_utils
from transformers.generation import utils as generation_utils
from transformers.integrations import sdpa_attention
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask
from transformers.models.llama import modeling_llama
from transformers.models.mistral import modeling_mistral
from transformers.models.qwen2 import modeling_qwen2

import kvviz.attention  # noqa: F401  (registers "kvviz")

REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"


def test_installed_transformers_is_the_pinned_one():
    pin = re.search(r"^transformers==(\S+)", REQUIREMENTS.read_text(), re.M)
    assert pin, "requirements.txt must pin transformers exactly"
    assert transformers.__version__ == pin.group(1), (
        f"transformers {transformers.__version__} installed, {pin.group(1)} pinned: rerun this file's checks "
        "against the new version before moving the pin"
    )


def test_cache_layer_mixin_abstract_api():
    abstract = cache_utils.CacheLayerMixin.__abstractmethods__
    assert abstract == {"lazy_initialization", "update", "get_mask_sizes", "get_seq_length", "get_max_length"}
    for name in ("reset", "reorder_cache", "offload", "prefetch"):
        assert callable(getattr(cache_utils.CacheLayerMixin, name))
    assert cache_utils.CacheLayerMixin._layer_type is None  # a subclass leaving it None does not self-register


def test_cache_container_api():
    params = inspect.signature(cache_utils.Cache.__init__).parameters
    assert "layers" in params and "layer_class_to_replicate" in params
    assert list(inspect.signature(cache_utils.Cache.update).parameters)[:4] == [
        "self", "key_states", "value_states", "layer_idx"]
    source = inspect.getsource(cache_utils.Cache.update)
    assert "self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)" in source
    assert "return keys, values" in source  # the layer's return value reaches the model untouched
    for name in ("get_seq_length", "get_mask_sizes", "reset", "reorder_cache", "crop", "batch_repeat_interleave",
                 "batch_select_indices", "is_croppable", "is_compileable"):
        assert hasattr(cache_utils.Cache, name), name
    assert list(inspect.signature(cache_utils.Cache.get_mask_sizes).parameters) == [
        "self", "query_length", "layer_idx"]
    types, kwargs = cache_utils.get_layer_types_and_kwargs(transformers.LlamaConfig(num_hidden_layers=3))
    assert types == ["full_attention"] * 3 and kwargs == [{}, {}, {}]


def test_attention_modules_hand_the_cache_return_to_the_attention_function():
    """kvviz's QTensor cache sides travel from Cache.update to the attention function with nothing in between."""
    for module in (modeling_llama.LlamaAttention, modeling_qwen2.Qwen2Attention, modeling_mistral.MistralAttention):
        src = inspect.getsource(module.forward)
        update = src.index("cache.update(key_states, value_states, self.layer_idx")
        call = src.index("attention_interface(", update)
        between = src[update:call]
        assert "key_states" not in between.split("\n", 1)[1], f"{module.__name__} touches K/V after update"
        assert "ALL_ATTENTION_FUNCTIONS.get_interface(" in src


def test_attention_and_mask_registries():
    assert AttentionInterface._global_mapping["kvviz"] is kvviz.attention.kvviz_attention_forward
    assert AttentionMaskInterface._global_mapping["kvviz"] is sdpa_mask
    assert ALL_MASK_ATTENTION_FUNCTIONS["kvviz"] is sdpa_mask
    # without a registered mask function, transformers builds no mask at all for a custom attention name
    assert "_global_mapping" in inspect.getsource(transformers.masking_utils._preprocess_mask_arguments)
    params = inspect.signature(sdpa_attention.sdpa_attention_forward).parameters
    assert list(params)[:5] == ["module", "query", "key", "value", "attention_mask"]
    assert {"dropout", "scaling", "is_causal"} <= set(params)


def test_generate_takes_cache_and_reorders_it_for_beams():
    assert "cache" in generation_utils.ALL_CACHE_NAMES
    assert ".reorder_cache(beam_idx)" in inspect.getsource(generation_utils.GenerationMixin)


def test_gguf_quantizer_can_be_dropped_after_dequantizing():
    from transformers.quantizers.base import HfQuantizer

    assert callable(HfQuantizer.remove_quantization_config)
    assert "hf_quantizer" in inspect.getsource(HfQuantizer.remove_quantization_config)


# ------------------------------------------------------------------------------------------ layer kinds (kvviz.cache)
# kvviz.cache builds one layer per decoder layer as DynamicCache does, and kvviz.memory's layout="transformers"
# counts what those layers hold. Each assumption below is one of theirs.


def test_dynamic_sliding_window_layer_keeps_window_minus_one_tokens():
    """kvviz.cache.QuantizedSlidingLayer mirrors this: W - 1 held, W - 1 + q returned, and these mask sizes."""
    import torch

    layer = cache_utils.DynamicSlidingWindowLayer(sliding_window=4)
    assert layer.get_mask_sizes(1) == (1, 0)  # nothing held yet
    x = torch.randn(1, 2, 10, 8)
    keys, _ = layer.update(x, x)
    assert keys.shape[2] == 10 and layer.keys.shape[2] == 3  # the prefill sees itself; 3 = W - 1 stay
    assert torch.equal(layer.keys, x[:, :, -3:])
    assert layer.get_seq_length() == 10 and layer.get_mask_sizes(1) == (4, 7)  # (W - 1 + q, seen - W + 1)
    keys, _ = layer.update(x[:, :, :1], x[:, :, :1])
    assert keys.shape[2] == 4 and layer.keys.shape[2] == 3 and layer.get_seq_length() == 11
    assert layer.get_mask_sizes(2) == (5, 8)
    short = cache_utils.DynamicSlidingWindowLayer(sliding_window=8)
    short.update(x[:, :, :2], x[:, :, :2])
    assert short.get_mask_sizes(1) == (3, 0) and short.keys.shape[2] == 2  # below the window: all of it


def test_layer_type_names_and_their_dynamic_layers():
    """The layer type names DynamicCache knows, and the class each gets. A new name must be taught to
    kvviz.cache (SUPPORTED_TYPES) and kvviz.memory (layer_kinds) before the pin moves."""
    from kvviz.cache import SUPPORTED_TYPES

    mapping = cache_utils.DYNAMIC_LAYER_TYPE_MAPPING
    assert {name: cls.__name__ for name, cls in mapping.items()} == {
        "full_attention": "DynamicLayer", "sliding_attention": "DynamicSlidingWindowLayer",
        "chunked_attention": "DynamicSlidingWindowLayer", "indexed_attention": "DynamicIndexedLayer",
        "conv": "LinearAttentionLayer", "linear_attention": "LinearAttentionLayer",
        "hybrid": "LinearAttentionAndFullAttentionLayer",
        "hybrid_sliding": "LinearAttentionAndSlidingWindowAttentionLayer", "dummy": "DummyLayer"}
    assert set(mapping) - set(SUPPORTED_TYPES) == {"indexed_attention"}  # DeepSeek-V3.2's indexer: not cached yet


def test_get_layer_types_and_kwargs_on_every_tiny_architecture():
    """The layer types and constructor kwargs DynamicCache (and so QuantizedKVCache) gets for each tiny model:
    chunked layers take the chunk as `sliding_window`, Gemma 4's reused layers become "dummy", linear and hybrid
    layers a `number_of_states`."""
    from kvviz.tiny import TINY_WINDOW, tiny_config

    w = {"sliding_window": TINY_WINDOW}
    states = {"number_of_states": 1}
    want = {
        "llama": (["full_attention"] * 2, [{}, {}]),
        "qwen3": (["full_attention"] * 2, [{}, {}]),
        "mistral": (["sliding_attention"] * 2, [w, w]),
        "qwen2": (["full_attention", "sliding_attention"], [{}, w]),
        "gemma2": (["sliding_attention", "full_attention"], [w, {}]),
        "gemma3": (["sliding_attention", "full_attention"], [w, {}]),
        "cohere2": (["sliding_attention", "full_attention"], [w, {}]),
        "gpt_oss": (["sliding_attention", "full_attention"], [w, {}]),
        "llama4": (["chunked_attention", "full_attention"], [w, {}]),
        "qwen3_next": (["linear_attention", "full_attention"], [states, {}]),
        "falcon_h1": (["hybrid", "hybrid"], [states, states]),
        "gemma4": (["sliding_attention", "full_attention", "dummy", "dummy"], [w, {}, {}, {}]),
        "deepseek_v3": (["full_attention"] * 2, [{}, {}]),
    }
    from kvviz.tiny import TINY_ARCHS

    assert set(want) == set(TINY_ARCHS)
    for arch, (types, kwargs) in want.items():
        assert cache_utils.get_layer_types_and_kwargs(tiny_config(arch)) == (types, kwargs), arch


def test_linear_attention_layers_dispatch_lazy_initialization_by_arguments():
    """kvviz.cache's hybrid layers combine transformers' LinearAttentionLayer (conv / recurrent state, untouched)
    with a quantized attention layer, dispatching as transformers' own hybrid layer does: two positional
    arguments (K, V) for attention, keywords for the states."""
    hybrid = cache_utils.LinearAttentionAndFullAttentionLayer
    assert hybrid.__mro__[1:3] == (cache_utils.LinearAttentionLayer, cache_utils.LinearAttentionCacheLayerMixin)
    assert cache_utils.DynamicLayer in hybrid.__mro__
    src = inspect.getsource(hybrid.lazy_initialization)
    assert "len(args) == 2 and len(kwargs) == 0" in src and "len(args) == 0" in src
    linear = cache_utils.LinearAttentionLayer
    assert "self.lazy_initialization(conv_states=" in inspect.getsource(linear.update_conv_state)
    assert "self.lazy_initialization(recurrent_states=" in inspect.getsource(linear.update_recurrent_state)
    layer = linear(number_of_states=2)
    assert layer.conv_states == {0: None, 1: None} and layer.recurrent_states == {0: None, 1: None}
    for name in ("reset", "reorder_cache", "crop", "offload", "prefetch"):
        assert callable(getattr(linear, name)), name


def test_dummy_layer_holds_nothing_and_gemma4_reads_the_producers_return_value():
    """Gemma 4's KV-shared layers never touch the cache: they take what the producing layer's cache.update returned
    (kvviz's QTensor cache sides) from `shared_kv_states`. kvviz caches those layers as transformers' DummyLayer."""
    import pytest
    import torch

    from transformers.models.gemma4 import modeling_gemma4

    layer = cache_utils.DummyLayer()
    assert layer.is_initialized and layer.keys is None and layer.values is None
    assert layer.update(None, None) == (None, None)
    with pytest.raises(NotImplementedError):
        layer.update(torch.zeros(1), torch.zeros(1))
    src = inspect.getsource(modeling_gemma4.Gemma4TextAttention.forward)
    read = src.index("key_states, value_states = shared_kv_states[self.layer_type]")
    update = src.index("key_states, value_states = cache.update(key_states, value_states, self.layer_idx")
    store = src.index("shared_kv_states[self.layer_type] = key_states, value_states")
    assert read < update < store  # the stored pair is the update's return value


def test_deepseek_v3_caches_the_latent_and_expands_it_after_the_cache():
    """transformers caches MLA's compressed latent ([B, 1, T, kv_lora_rank] as "keys", the RoPE key
    [B, 1, T, qk_rope_head_dim] as "values") and expands it to per-head K/V after the cache: kvviz.cache's
    layer_head_dims and kvviz.memory's transformers layout size MLA layers that way, and hand tensors back."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3

    src = inspect.getsource(modeling_deepseek_v3.DeepseekV3Attention.forward)
    assert "kv_nope = kv_nope.view(batch_size, 1, seq_length, self.kv_lora_rank)" in src
    assert "k_rot = k_rot.view(batch_size, 1, seq_length, self.qk_rope_head_dim)" in src
    update = src.index("kv_nope, k_rot = cache.update(kv_nope, k_rot, self.layer_idx")
    expand = src.index("key_states, value_states = self.expand_kv(kv_nope, k_rot)")
    assert update < expand < src.index("attention_interface(")
    assert "self.kv_b_proj(kv_nope)" in inspect.getsource(modeling_deepseek_v3.DeepseekV3Attention.expand_kv)
