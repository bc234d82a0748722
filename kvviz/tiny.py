"""Tiny random-weight models of every attention architecture kvviz caches, for tests: no download, milliseconds.

`tiny_model(arch)` builds a `(model, ByteTokenizer)` pair; `TINY_ARCHS` lists the architectures. Each model has
the fewest layers that show its layer kinds (two, four for Gemma 4's shared-KV layers), hidden size 64, vocab 256
(bytes), and windows / chunks of `TINY_WINDOW` = 8 tokens, so that a 20-token prompt really crosses them:

    llama        full attention (GQA 4 query heads : 2 KV heads, head_dim 16)
    qwen3        full attention with QK-norm
    mistral      sliding window on every layer
    qwen2        mixed: use_sliding_window + max_window_layers (layer 0 full, layer 1 sliding)
    gemma2       sliding + full, attention logit softcapping
    gemma3       sliding + full, QK-norm
    cohere2      sliding + full (the full layer without RoPE)
    gpt_oss      sliding + full, attention sinks, MoE
    llama4       chunked attention (chunk 8) + full, MoE
    qwen3_next   linear attention (gated DeltaNet, recurrent state) + full attention
    falcon_h1    hybrid: Mamba2 and attention side by side in every layer
    gemma4       sliding + full (full layers: head_dim 32), then two layers that reuse those layers' K/V
    deepseek_v3  MLA: transformers caches the latent (32 wide) and the shared RoPE key (16 wide), one head; MoE

Same arch and seed, same weights. The models use the "kvviz" attention function (kvviz/attention.py).

    python -m kvviz.tiny        # build each, generate 12 tokens with DynamicCache, print the layer types
"""

from __future__ import annotations

import torch
import transformers
from transformers import AutoModelForCausalLM, BatchEncoding

from kvviz import attention as _attention  # registers the "kvviz" attention function

TINY_WINDOW = 8  # tokens: sliding windows and Llama 4's attention chunks

_BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA: 2 query heads per KV head
    head_dim=16,
    max_position_embeddings=1024,
    initializer_range=0.1,  # larger than the usual 0.02, so attention is not uniform and quantization shows
    tie_word_embeddings=False,
)
_SLIDE_FULL = ["sliding_attention", "full_attention"]


def _configs() -> dict:
    """arch -> (config class name in transformers, keyword arguments)."""
    w = TINY_WINDOW
    moe = dict(num_experts_per_tok=2)
    return {
        "llama": ("LlamaConfig", {}),
        "qwen3": ("Qwen3Config", {}),
        "mistral": ("MistralConfig", dict(sliding_window=w)),
        "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=w, max_window_layers=1)),
        "gemma2": ("Gemma2Config", dict(sliding_window=w, layer_types=_SLIDE_FULL, attn_logit_softcapping=5.0,
                                        final_logit_softcapping=None, query_pre_attn_scalar=16)),
        "gemma3": ("Gemma3TextConfig", dict(sliding_window=w, layer_types=_SLIDE_FULL, query_pre_attn_scalar=16)),
        "cohere2": ("Cohere2Config", dict(sliding_window=w, layer_types=_SLIDE_FULL)),
        "gpt_oss": ("GptOssConfig", dict(sliding_window=w, layer_types=_SLIDE_FULL, num_local_experts=4, **moe)),
        "llama4": ("Llama4TextConfig", dict(attention_chunk_size=w, layer_types=["chunked_attention", "full_attention"],
                                            no_rope_layers=[1, 0], num_local_experts=2, num_experts_per_tok=1,
                                            intermediate_size_mlp=128, interleave_moe_layer_step=1)),
        "qwen3_next": ("Qwen3NextConfig", dict(layer_types=["linear_attention", "full_attention"], num_experts=4,
                                               moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                               linear_num_value_heads=4, linear_num_key_heads=2,
                                               linear_key_head_dim=16, linear_value_head_dim=16, **moe)),
        "falcon_h1": ("FalconH1Config", dict(mamba_d_state=16, mamba_n_heads=4, mamba_d_head=16, mamba_d_ssm=64,
                                             mamba_n_groups=1, mamba_chunk_size=16)),
        "gemma4": ("Gemma4TextConfig", dict(num_hidden_layers=4, sliding_window=w, global_head_dim=32,
                                            layer_types=_SLIDE_FULL * 2, num_kv_shared_layers=2,
                                            hidden_size_per_layer_input=16, vocab_size_per_layer_input=256,
                                            final_logit_softcapping=None)),
        "deepseek_v3": ("DeepseekV3Config", dict(num_key_value_heads=4, head_dim=16, kv_lora_rank=32, q_lora_rank=None,
                                                 qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                                                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                                 n_routed_experts=4, moe_intermediate_size=32, first_k_dense_replace=1,
                                                 n_group=1, topk_group=1, **moe)),
    }


TINY_ARCHS = tuple(_configs())


def tiny_config(arch: str = "llama", **overrides):
    """The transformers config of `tiny_model(arch)` (no weights); `overrides` replace its fields before the
    config is built (e.g. head_dim=32, for formats whose blocks of 32 do not fit the tiny head_dim of 16)."""
    table = _configs()
    if arch not in table:
        raise ValueError(f"Unknown tiny architecture {arch!r}; choose one of {', '.join(TINY_ARCHS)}.")
    cls_name, kwargs = table[arch]
    config = getattr(transformers, cls_name)(**{**_BASE, **kwargs, **overrides}, pad_token_id=0, bos_token_id=None,
                                              eos_token_id=None)
    config._name_or_path = f"tiny-{arch}"
    return config


def tiny_model(arch: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32,
               attn_implementation: str = _attention.ATTN_NAME):
    """A random-weight model of `arch` (see TINY_ARCHS) for tests: `(model, ByteTokenizer)`, eval mode, no download.

    Hidden 64, 4 query heads, 2 KV heads (DeepSeek-V3: 4), head_dim 16, vocab 256 (bytes), windows of 8 tokens.
    Same arch and seed, same weights. attn_implementation: "kvviz" (default), or e.g. "eager" for a reference.
    """
    config = tiny_config(arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    model.eval()
    gen = model.generation_config
    gen.pad_token_id, gen.eos_token_id, gen.bos_token_id = 0, None, None
    return model, ByteTokenizer()


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255, id 0 (NUL) as padding, no BOS/EOS: enough to drive tiny models.

    `tok(["ab", "c"], return_tensors="pt")` -> input_ids / attention_mask [batch, max_len], left-padded.
    """

    vocab_size = 256
    pad_token_id = 0
    eos_token_id = None
    bos_token_id = None
    pad_token = "\x00"
    eos_token = None
    padding_side = "left"

    def encode(self, text: str, **_) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = False, **_) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if skip_special_tokens:
            ids = [i for i in ids if i != self.pad_token_id]
        return bytes(ids).decode("utf-8", errors="replace")

    def batch_decode(self, batch, **kwargs) -> list[str]:
        return [self.decode(ids, **kwargs) for ids in batch]

    def __call__(self, text, return_tensors: str | None = "pt", padding: bool = True, **_) -> BatchEncoding:
        texts = [text] if isinstance(text, str) else list(text)
        ids = [self.encode(t) for t in texts]
        width = max(len(i) for i in ids)
        pad = [[self.pad_token_id] * (width - len(i)) for i in ids]
        input_ids = [p + i if self.padding_side == "left" else i + p for p, i in zip(pad, ids)]
        mask = [[0] * len(p) + [1] * len(i) if self.padding_side == "left" else [1] * len(i) + [0] * len(p)
                for p, i in zip(pad, ids)]
        return BatchEncoding({"input_ids": input_ids, "attention_mask": mask}, tensor_type=return_tensors)


if __name__ == "__main__":
    import time

    from transformers import DynamicCache
    from transformers.cache_utils import get_layer_types_and_kwargs

    for name in TINY_ARCHS:
        t0 = time.perf_counter()
        m, tok = tiny_model(name, attn_implementation="eager")
        enc = tok(["The quick brown fox jumps"])
        out = m.generate(**enc, max_new_tokens=12, do_sample=False, cache=DynamicCache(config=m.config))
        kinds = sorted(set(get_layer_types_and_kwargs(m.config.get_text_config(decoder=True))[0]))
        print(f"{name:12s} {time.perf_counter() - t0:5.2f} s  {kinds}  {tok.decode(out[0, -12:])!r}")
