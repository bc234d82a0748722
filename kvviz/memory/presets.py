"""Model presets stored as their config.json fields, and GPU presets in their vendors' decimal GB.

A preset is the subset of a model's published config.json (its `text_config` for multimodal models) that the
memory model reads, plus the parameter count (for the weights' bytes) and where the fields come from. Its figure is
built by the same code as any config.json (kvviz.memory.layers), so a preset cannot drift from the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .layers import shapes_of

GB = 10**9  # decimal gigabyte: GPU vendors' unit, and the unit of every figure kvviz.memory reports


@dataclass(frozen=True)
class ModelPreset:
    """A model: its text config's fields (a dict like config.json), parameter count and the fields' source.

    `params` is None when unknown (a config.json alone does not say it); the GPU-fit questions then need it given.
    kv_heads / head_dim describe the first layer that caches K/V; per-layer figures come from layer_shapes().
    """

    name: str
    config: dict = field(repr=False)
    params: float | None = None
    source: str = ""

    @classmethod
    def from_dims(cls, name: str, layers: int, kv_heads: int, head_dim: int, params: float | None = None,
                  source: str = "custom dimensions") -> "ModelPreset":
        """A dense full-attention model from three numbers (Llama-style config fields)."""
        cfg = {"model_type": "llama", "num_hidden_layers": layers, "num_attention_heads": kv_heads,
               "num_key_value_heads": kv_heads, "head_dim": head_dim}
        return cls(name, cfg, params, source)

    @property
    def layers(self) -> int:
        return self.config["num_hidden_layers"]

    @property
    def q_heads(self) -> int:
        return self.config["num_attention_heads"]

    def _first_kv_layer(self):
        return next(s for s in shapes_of(self.config, "engine") if s.has_kv)

    @property
    def kv_heads(self) -> int:
        """K heads of the first layer with K/V, as engines store it (MLA: 1 latent "head")."""
        return self._first_kv_layer().k_heads

    @property
    def head_dim(self) -> int:
        """K width of the first layer with K/V, as engines store it (MLA: kv_lora_rank + qk_rope_head_dim)."""
        return self._first_kv_layer().k_dim

    @property
    def hidden(self) -> int | None:
        return self.config.get("hidden_size")

    @property
    def max_context(self) -> int | None:
        """max_position_embeddings: the longest context the model was built for (None: not stated)."""
        return self.config.get("max_position_embeddings")


@dataclass(frozen=True)
class GpuPreset:
    """A GPU's memory as its vendor states it, in decimal GB."""

    name: str
    memory_gb: float

    @property
    def bytes(self) -> int:
        return int(self.memory_gb * GB)


def _llama(layers, heads, kv, hidden, ctx, head_dim=None, model_type="llama", **extra) -> dict:
    cfg = {"model_type": model_type, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv, "hidden_size": hidden, "max_position_embeddings": ctx}
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    return cfg | extra


_GEMMA3_270M_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 3
_GPT_OSS = {"model_type": "gpt_oss", "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
            "hidden_size": 2880, "sliding_window": 128, "max_position_embeddings": 131072}
_MLA = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "kv_lora_rank": 512,
        "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}

_MODELS = [
    ModelPreset("smollm2-135m", _llama(30, 9, 3, 576, 8192, head_dim=64), 134.5e6,
                "HuggingFaceTB/SmolLM2-135M-Instruct config.json (kvviz's bundled default model)"),
    ModelPreset("gemma-3-270m", _llama(18, 4, 1, 640, 32768, head_dim=256, model_type="gemma3_text",
                                       sliding_window=512, layer_types=_GEMMA3_270M_TYPES), 268e6,
                "google/gemma-3-270m config.json (kvviz's second bundled model): 5 of 6 layers slide over 512 tokens"),
    ModelPreset("llama-3.2-1b", _llama(16, 32, 8, 2048, 131072, head_dim=64), 1.24e9,
                "meta-llama/Llama-3.2-1B config.json"),
    ModelPreset("llama-3.2-3b", _llama(28, 24, 8, 3072, 131072, head_dim=128), 3.21e9,
                "meta-llama/Llama-3.2-3B config.json"),
    ModelPreset("llama-3.1-8b", _llama(32, 32, 8, 4096, 131072, head_dim=128), 8.03e9,
                "meta-llama/Llama-3.1-8B config.json"),
    ModelPreset("llama-3.1-70b", _llama(80, 64, 8, 8192, 131072, head_dim=128), 70.6e9,
                "meta-llama/Llama-3.1-70B config.json"),
    ModelPreset("llama-3.3-70b", _llama(80, 64, 8, 8192, 131072, head_dim=128), 70.6e9,
                "meta-llama/Llama-3.3-70B-Instruct config.json (the 3.1 70B architecture)"),
    ModelPreset("llama-3.1-405b", _llama(126, 128, 8, 16384, 131072, head_dim=128), 405.9e9,
                "meta-llama/Llama-3.1-405B config.json"),
    ModelPreset("llama-4-scout", _llama(48, 40, 8, 5120, 10485760, head_dim=128, model_type="llama4_text",
                                        attention_chunk_size=8192, no_rope_layers=[]), 109e9,
                "meta-llama/Llama-4-Scout-17B-16E config.json text_config (no_rope_layers [] -> every 4th layer "
                "global, transformers' Llama4TextConfig default); 109B total parameters (model card)"),
    ModelPreset("qwen2.5-7b", _llama(28, 28, 4, 3584, 32768, use_sliding_window=False, sliding_window=131072,
                                     model_type="qwen2"), 7.62e9,
                "Qwen/Qwen2.5-7B-Instruct config.json (131072 with YaRN rope scaling; sliding window unused)"),
    ModelPreset("qwen2.5-72b", _llama(80, 64, 8, 8192, 32768, use_sliding_window=False, sliding_window=131072,
                                      model_type="qwen2"), 72.7e9,
                "Qwen/Qwen2.5-72B-Instruct config.json (131072 with YaRN rope scaling; sliding window unused)"),
    ModelPreset("qwen3-8b", _llama(36, 32, 8, 4096, 40960, head_dim=128, model_type="qwen3",
                                   use_sliding_window=False), 8.19e9, "Qwen/Qwen3-8B config.json"),
    ModelPreset("qwen3-32b", _llama(64, 64, 8, 5120, 40960, head_dim=128, model_type="qwen3",
                                    use_sliding_window=False), 32.8e9, "Qwen/Qwen3-32B config.json"),
    ModelPreset("qwen3-30b-a3b", _llama(48, 32, 4, 2048, 40960, head_dim=128, model_type="qwen3_moe",
                                        use_sliding_window=False), 30.5e9, "Qwen/Qwen3-30B-A3B config.json (MoE)"),
    ModelPreset("qwen3-235b-a22b", _llama(94, 64, 4, 4096, 40960, head_dim=128, model_type="qwen3_moe",
                                          use_sliding_window=False), 235e9,
                "Qwen/Qwen3-235B-A22B config.json (MoE)"),
    ModelPreset("qwen3-next-80b-a3b", _llama(48, 16, 2, 2048, 262144, head_dim=256, model_type="qwen3_next",
                                             full_attention_interval=4, linear_num_key_heads=16,
                                             linear_key_head_dim=128, linear_num_value_heads=32,
                                             linear_value_head_dim=128, linear_conv_kernel_dim=4), 80e9,
                "Qwen/Qwen3-Next-80B-A3B-Instruct config.json: Gated DeltaNet on 3 of 4 layers, full attention on "
                "every 4th; 80B parameters (model card)"),
    ModelPreset("mistral-7b-v0.3", _llama(32, 32, 8, 4096, 32768, head_dim=128, model_type="mistral",
                                          sliding_window=None), 7.25e9, "mistralai/Mistral-7B-v0.3 config.json"),
    ModelPreset("mistral-small-3-24b", _llama(40, 32, 8, 5120, 32768, head_dim=128, model_type="mistral",
                                              sliding_window=None), 23.6e9,
                "mistralai/Mistral-Small-24B-Instruct-2501 config.json"),
    ModelPreset("phi-4", _llama(40, 40, 10, 5120, 16384, model_type="phi3", sliding_window=None), 14.7e9,
                "microsoft/phi-4 config.json (head_dim = hidden_size / heads = 128)"),
    ModelPreset("gemma-2-9b", _llama(42, 16, 8, 3584, 8192, head_dim=256, model_type="gemma2",
                                     sliding_window=4096), 9.24e9,
                "google/gemma-2-9b config.json (alternating 4096-token sliding and full layers, as Gemma2Config)"),
    ModelPreset("gemma-3-27b", _llama(62, 32, 16, 5376, 131072, head_dim=128, model_type="gemma3_text",
                                      sliding_window=1024, sliding_window_pattern=6), 27.4e9,
                "google/gemma-3-27b-it config.json text_config: 5 of 6 layers slide over 1024 tokens"),
    ModelPreset("gemma-4-31b", _llama(60, 32, 16, 5376, 262144, head_dim=256, model_type="gemma4_text",
                                      sliding_window=1024, global_head_dim=512, num_global_key_value_heads=4,
                                      attention_k_eq_v=True, num_kv_shared_layers=0,
                                      layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 10), 31e9,
                "google/gemma-4-31B-it config.json as four independent third-party copies quote it (not read "
                "from the hub by kvviz; they agree on every field used here: 60 layers, 5 sliding (1024) per full "
                "layer, 16 KV heads x 256, global layers 4 KV heads x 512, 32 query heads, 262144 context); 31e9 "
                "parameters from the model name. One copy expects 11,576,279,040 bf16 bytes at 131072 tokens: "
                "this preset gives the same."),
    ModelPreset("gpt-oss-20b", _GPT_OSS | {"num_hidden_layers": 24,
                                           "layer_types": ["sliding_attention", "full_attention"] * 12}, 20.9e9,
                "openai/gpt-oss-20b config.json: 128-token sliding windows alternate with full layers"),
    ModelPreset("gpt-oss-120b", _GPT_OSS | {"num_hidden_layers": 36,
                                            "layer_types": ["sliding_attention", "full_attention"] * 18}, 116.8e9,
                "openai/gpt-oss-120b config.json: 128-token sliding windows alternate with full layers"),
    ModelPreset("deepseek-v3", _MLA | {"num_attention_heads": 128, "num_key_value_heads": 128,
                                       "max_position_embeddings": 163840}, 671e9,
                "deepseek-ai/DeepSeek-V3 config.json (DeepSeek-R1 has the same architecture): MLA, "
                "kv_lora_rank 512 + qk_rope_head_dim 64; 671B parameters without the MTP module"),
    ModelPreset("kimi-k2", _MLA | {"num_attention_heads": 64, "num_key_value_heads": 64,
                                   "max_position_embeddings": 131072}, 1.0e12,
                "moonshotai/Kimi-K2-Instruct config.json (DeepSeek-V3 architecture, 64 heads); 1T parameters "
                "(model card)"),
    ModelPreset("nemotron-3-nano-30b-a3b",
                {"model_type": "nemotron_h", "num_hidden_layers": 52,
                 "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
                 "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "hidden_size": 2688,
                 "mamba_num_heads": 64, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
                 "conv_kernel": 4, "mamba_ssm_cache_dtype": "float32", "max_position_embeddings": 262144}, 31.6e9,
                "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B config.json as quoted by a third-party test (not read from "
                "the hub by kvviz): Mamba-2 hybrid, attention on 6 of 52 layers; 31.6B parameters (model card)"),
]
MODEL_PRESETS: dict[str, ModelPreset] = {m.name: m for m in _MODELS}

_GPUS = [
    GpuPreset("l4", 24), GpuPreset("a10g", 24), GpuPreset("rtx-4090", 24),
    GpuPreset("a100-40gb", 40), GpuPreset("a100-80gb", 80), GpuPreset("h100-80gb", 80),
    GpuPreset("h200", 141),
    GpuPreset("b200", 192),  # the B200 datasheet's figure; DGX B200 systems list 1,440 GB for 8 GPUs (180 each)
]
GPU_PRESETS: dict[str, GpuPreset] = {g.name: g for g in _GPUS}


def _lookup(table: dict, name, what: str):
    if not isinstance(name, str) or name.strip().lower() not in table:
        raise ValueError(f"Unknown {what} {name!r}. Choose one of: {', '.join(table)}.")
    return table[name.strip().lower()]


def get_model_preset(name: str | ModelPreset) -> ModelPreset:
    """The preset named `name` (case-insensitive); a ModelPreset passes through. ValueError lists the names."""
    return name if isinstance(name, ModelPreset) else _lookup(MODEL_PRESETS, name, "model preset")


def get_gpu_preset(name: str | GpuPreset) -> GpuPreset:
    """The GPU named `name` (case-insensitive, e.g. "h100-80gb"); a GpuPreset passes through."""
    return name if isinstance(name, GpuPreset) else _lookup(GPU_PRESETS, name, "GPU")
