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
    """kvviz's PackedKV handles travel from Cache.update to the attention function with nothing in between."""
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
