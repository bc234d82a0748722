"""Capture Q, K (before and after RoPE) and V of every layer and head for one prompt.

One forward pass of the decoder (no lm_head, no cache) with a forward pre-hook on each layer's attention module.
The hook receives the attention input (`hidden_states`) and the rotary `position_embeddings` (cos, sin), and
recomputes what the module itself computes: the q/k/v projections, the per-head q/k norms when the architecture
has them (Qwen3, ...), and RoPE through the modeling module's own `apply_rotary_pos_emb`. So `keys_pre` is what
RoPE rotates and `keys_post` is what a KV cache stores.

    cap = capture_kv(model, tokenizer, "The capital of France is")
    cap.keys_post.shape   # [layers, kv_heads, tokens, head_dim] float32
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch


@dataclass
class KVCapture:
    """Per-layer attention inputs for one prompt (batch 1), all float32 on the CPU.

    keys_pre:  [layers, kv_heads, tokens, head_dim]  K before RoPE (after k_norm where the model has one)
    keys_post: [layers, kv_heads, tokens, head_dim]  K after RoPE: what the KV cache stores
    values:    [layers, kv_heads, tokens, head_dim]  V
    queries:   [layers, q_heads, tokens, head_dim]   Q after RoPE (for the attention-output error)
    tokens:    the prompt's tokens as strings (len = tokens)
    token_ids: the prompt's token ids
    scaling:   the attention's softmax scale (usually head_dim ** -0.5)
    """

    keys_pre: torch.Tensor
    keys_post: torch.Tensor
    values: torch.Tensor
    queries: torch.Tensor
    tokens: list[str]
    token_ids: list[int]
    scaling: float

    @property
    def layers(self) -> int:
        return self.keys_post.shape[0]

    @property
    def kv_heads(self) -> int:
        return self.keys_post.shape[1]

    @property
    def head_dim(self) -> int:
        return self.keys_post.shape[-1]

    def tensor(self, which: str) -> torch.Tensor:
        """One of "keys_pre", "keys_post", "values" (ValueError otherwise)."""
        if which not in ("keys_pre", "keys_post", "values"):
            raise ValueError(f"which must be 'keys_pre', 'keys_post' or 'values', got {which!r}.")
        return getattr(self, which)


def _attention_modules(model) -> list:
    decoder = model.base_model if hasattr(model, "base_model") else model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder `layers`: kvviz.analysis supports Llama-style "
                         "decoder-only models (Llama, Qwen2, Mistral, ...).")
    mods = [getattr(layer, "self_attn", None) for layer in layers]
    if any(m is None or not all(hasattr(m, p) for p in ("q_proj", "k_proj", "v_proj")) for m in mods):
        raise ValueError(f"{type(model).__name__}'s attention has no q_proj/k_proj/v_proj: not supported by "
                         "kvviz.analysis.")
    return mods


def _project(attn, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """hidden [1, T, hidden] -> (q_post, k_pre, k_post, v), each [1, heads, T, head_dim]."""
    d = attn.head_dim
    shape = (*hidden.shape[:-1], -1, d)  # [1, T, heads, D]
    q = attn.q_proj(hidden).view(shape)
    k = attn.k_proj(hidden).view(shape)
    v = attn.v_proj(hidden).view(shape).transpose(1, 2)  # [1, Hkv, T, D]
    if getattr(attn, "q_norm", None) is not None:
        q = attn.q_norm(q)
    if getattr(attn, "k_norm", None) is not None:
        k = attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    rope = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    assert rope is not None, f"{type(attn).__module__} has no apply_rotary_pos_emb"
    q_post, k_post = rope(q, k, cos, sin)
    return q_post, k, k_post, v


@torch.no_grad()
def capture_kv(model, tokenizer, prompt: str, max_tokens: int = 512) -> KVCapture:
    """Run `prompt` (truncated to its first `max_tokens` tokens) and capture Q/K/V of every layer. See KVCapture."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("capture_kv needs a non-empty prompt string.")
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"][:, :max_tokens]  # [1, T]
    return capture_ids(model, ids, tokenizer)


@torch.no_grad()
def capture_ids(model, ids: torch.Tensor, tokenizer=None) -> KVCapture:
    """As capture_kv, for token ids [1, T] (tokenizer only names the tokens)."""
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"capture takes one sequence, ids of shape [1, tokens]; got {tuple(ids.shape)}.")
    mods = _attention_modules(model)
    out: dict[int, tuple] = {}

    def hook_for(i, attn):
        def hook(module, args, kwargs):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            cos, sin = kwargs["position_embeddings"]
            out[i] = tuple(t[0].float().cpu() for t in _project(attn, hidden, cos, sin))
        return hook

    handles = [m.register_forward_pre_hook(hook_for(i, m), with_kwargs=True) for i, m in enumerate(mods)]
    try:
        decoder = model.base_model if hasattr(model, "base_model") else model
        decoder(input_ids=ids.to(model.device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    assert len(out) == len(mods), f"captured {len(out)} of {len(mods)} layers"
    q, k_pre, k_post, v = (torch.stack([out[i][j] for i in range(len(mods))]) for j in range(4))
    id_list = ids[0].tolist()
    # decode one id at a time: readable pieces (" the"), not BPE symbols ("Ġthe")
    tokens = [tokenizer.decode([i]) for i in id_list] if tokenizer is not None else [str(i) for i in id_list]
    scaling = float(getattr(mods[0], "scaling", k_post.shape[-1] ** -0.5))
    return KVCapture(keys_pre=k_pre, keys_post=k_post, values=v, queries=q, tokens=tokens, token_ids=id_list,
                     scaling=scaling)
