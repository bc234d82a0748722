"""Capture Q, K (before and after RoPE) and V of every attention layer for one prompt, on any architecture.

One forward pass of the decoder (no lm_head, no cache), during which two recorders watch, in this thread only:

- the model's attention function (transformers looks it up by name on every call) is wrapped. It is handed Q, K
  and V exactly as attention reads them, whatever the architecture computed before: K after QK-norm and RoPE (what
  a KV cache stores), V, and the mask, softmax scale, logit softcap and attention sinks of that layer;
- the modeling module's RoPE functions (`apply_rotary_pos_emb`, `apply_rotary_emb`, ...) are wrapped. What a
  layer hands RoPE for K is its pre-RoPE K: after `k_norm` where the model normalises K before rotating it (Qwen3,
  Gemma 3), i.e. exactly what the rotation turns into the cached K. The recorded RoPE output is matched to the K
  attention read, value for value, so the pairing is checked, not assumed:
    - the output equals K: pre-RoPE K is RoPE's input (Llama, Qwen, Mistral, Gemma, gpt-oss, ...);
    - the output equals K's last channels, shared by all heads (DeepSeek-V3's MLA: 128 "nope" channels, then 64
      rotated ones): pre-RoPE K is K with those channels replaced by RoPE's input (with `rope_interleave`, in the
      interleaved order RoPE receives them);
    - no RoPE ran in the layer (Cohere 2's global layers, Llama 4's NoPE layers): pre-RoPE K is K;
    - RoPE ran but the model changed K after it (Llama 4's L2 norm): pre-RoPE K is RoPE's input for K.

Only layers that hold K/V are captured: linear-attention and Mamba layers of hybrids (Qwen3-Next, Falcon-H1) never
call attention, and layers that reuse an earlier layer's K/V (Gemma 4's KV-shared layers) are skipped.
`KVCapture.layer_ids` gives each captured layer's number in the model. Sliding-window and chunked layers are
captured over the whole prompt (what the layer computes before the cache drops old tokens); their mask is kept, so
attention errors use the window the model uses. For DeepSeek-V3, K and V are the per-head tensors attention reads
(K 192 channels, V 128), not the compressed latent transformers caches.

    cap = capture_kv(model, tokenizer, "The capital of France is")
    cap.keys_post.shape   # [layers, kv_heads, tokens, k_head_dim] float32
    cap.layer_ids         # the model's layer numbers of those layers
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface

_LOCK = threading.Lock()  # one capture at a time: the recorders patch process-wide lookups


@dataclass(frozen=True)
class LayerAttention:
    """How one captured layer's softmax reads its K: what attention_errors needs to recompute it.

    scaling: the softmax scale (usually head_dim ** -0.5).
    mask:    bool [tokens, tokens], True = query row attends to key column (sliding windows and chunks cut it);
             None for plain causal attention.
    softcap: logit softcapping (Gemma 2: scores = softcap * tanh(scores / softcap)), or None.
    sinks:   [q_heads] float32 logits of one extra softmax column per head (gpt-oss), or None.
    """

    scaling: float
    mask: torch.Tensor | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None


@dataclass
class KVCapture:
    """Per-layer attention inputs for one prompt (batch 1), all float32 on the CPU.

    keys_pre:  [layers, kv_heads, tokens, k_head_dim]  K as RoPE receives it (after k_norm where the model has one)
    keys_post: [layers, kv_heads, tokens, k_head_dim]  K as attention reads it: what the KV cache stores
    values:    [layers, kv_heads, tokens, v_head_dim]  V (v_head_dim differs from k_head_dim on DeepSeek-V3)
    queries:   [layers, q_heads, tokens, k_head_dim]   Q after RoPE (for the attention-output error)
    tokens:    the prompt's tokens as strings (len = tokens)
    token_ids: the prompt's token ids
    scaling:   the first layer's softmax scale (every layer's is in `attention`)
    layer_ids: the model's layer number of each captured layer (default 0..layers-1). The tensors and every
               `layer=` argument in kvviz.analysis index captured layers by position; hybrids skip their
               linear-attention layers, so position and layer number can differ.
    attention: one LayerAttention per captured layer (default: causal, `scaling`).
    """

    keys_pre: torch.Tensor
    keys_post: torch.Tensor
    values: torch.Tensor
    queries: torch.Tensor
    tokens: list[str]
    token_ids: list[int]
    scaling: float
    layer_ids: list[int] = field(default_factory=list)
    attention: list[LayerAttention] = field(default_factory=list)

    def __post_init__(self):
        n = self.keys_post.shape[0]
        if not self.layer_ids:
            self.layer_ids = list(range(n))
        if not self.attention:
            self.attention = [LayerAttention(self.scaling)] * n
        assert len(self.layer_ids) == len(self.attention) == n, "one layer id and one LayerAttention per layer"

    @property
    def layers(self) -> int:
        return self.keys_post.shape[0]

    @property
    def kv_heads(self) -> int:
        return self.keys_post.shape[1]

    @property
    def head_dim(self) -> int:
        """K's head_dim (V's is `values.shape[-1]`, the same except on MLA models)."""
        return self.keys_post.shape[-1]

    def tensor(self, which: str) -> torch.Tensor:
        """One of "keys_pre", "keys_post", "values" (ValueError otherwise)."""
        if which not in ("keys_pre", "keys_post", "values"):
            raise ValueError(f"which must be 'keys_pre', 'keys_post' or 'values', got {which!r}.")
        return getattr(self, which)


# ------------------------------------------------------------------------------------------------ recording

@dataclass
class _Layer:
    """What the recorders saw in one attention layer (batch 0, float32, CPU)."""

    layer_id: int
    q: torch.Tensor        # [Hq, T, Dk]
    k_pre: torch.Tensor    # [Hkv, T, Dk]
    k_post: torch.Tensor   # [Hkv, T, Dk]
    v: torch.Tensor        # [Hkv, T, Dv]
    attention: LayerAttention


class _Recorder:
    """Wraps the attention function and the RoPE functions while active; records calls from its own thread."""

    def __init__(self):
        self.thread = threading.get_ident()
        self.ropes: list[tuple[tuple, tuple]] = []  # (inputs, outputs) of RoPE calls since the last attention call
        self.layers: list[_Layer] = []

    def _mine(self) -> bool:
        return threading.get_ident() == self.thread

    def rope(self, fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            if self._mine():
                outs = out if isinstance(out, tuple) else (out,)
                self.ropes.append((args[:len(outs)], outs))
            return out
        return wrapped

    def attention(self, fn):
        def wrapped(module, query, key, value, attention_mask, *args, **kwargs):
            if self._mine():
                self._record(module, query, key, value, attention_mask, kwargs)
            return fn(module, query, key, value, attention_mask, *args, **kwargs)
        return wrapped

    def _record(self, module, query, key, value, mask, kwargs) -> None:
        ropes, self.ropes = self.ropes, []
        if getattr(module, "is_kv_shared_layer", False):
            return  # reads an earlier layer's K/V and holds none of its own
        layer_id = getattr(module, "layer_idx", None)
        layer_id = len(self.layers) if layer_id is None else int(layer_id)
        k_post = key[0]  # [Hkv, T, Dk]
        scaling = kwargs.get("scaling")
        sinks = kwargs.get("s_aux", kwargs.get("sinks"))  # gpt-oss passes its sinks as s_aux
        self.layers.append(_Layer(
            layer_id=layer_id,
            q=query[0].detach().float().cpu(),
            k_pre=_pre_rope(ropes, k_post).detach().float().cpu(),
            k_post=k_post.detach().float().cpu(),
            v=value[0].detach().float().cpu(),
            attention=LayerAttention(
                scaling=float(scaling if scaling is not None else query.shape[-1] ** -0.5),
                mask=_bool_mask(mask, query.shape[2], key.shape[2], getattr(module, "is_causal", True)),
                softcap=kwargs.get("softcap") or None,
                sinks=None if sinks is None else sinks.detach().float().cpu().reshape(-1),
            ),
        ))


def _pre_rope(ropes: list[tuple[tuple, tuple]], k_post: torch.Tensor) -> torch.Tensor:
    """K before RoPE from the layer's recorded RoPE calls (see the module docstring). k_post: [Hkv, T, Dk]."""
    pairs = [(i[0], o[0]) for inputs, outputs in ropes for i, o in zip(inputs, outputs)
             if isinstance(i, torch.Tensor) and isinstance(o, torch.Tensor) and o.dim() == 4]
    for inp, out in pairs:
        for a, b in ((inp, out), (inp.transpose(0, 1), out.transpose(0, 1))):  # [H, T, D] or [T, H, D]
            if b.shape == k_post.shape and torch.equal(b, k_post):
                return a
    for inp, out in pairs:
        w = out.shape[-1]
        tail = k_post[..., -w:]
        if w < k_post.shape[-1] and out.shape[1:] == tail.shape[1:] and out.shape[0] in (1, tail.shape[0]) \
                and torch.equal(out.expand_as(tail), tail):
            pre = k_post.clone()
            pre[..., -w:] = inp.expand_as(tail)
            return pre
    same = [inp for inp, _ in pairs if inp.shape == k_post.shape]
    same += [inp.transpose(0, 1) for inp, _ in pairs if inp.transpose(0, 1).shape == k_post.shape]
    return same[-1] if same else k_post  # K follows Q in every RoPE signature; no RoPE: nothing rotates


def _bool_mask(mask, q_len: int, kv_len: int, is_causal: bool) -> torch.Tensor | None:
    """The attention mask as bool [q_len, kv_len], True = attend; None when it is plain causal."""
    if mask is None:
        return None if is_causal else torch.ones(q_len, kv_len, dtype=torch.bool)
    m = mask[0, 0] if mask.dim() == 4 else mask  # [q_len, kv_len]
    m = m if m.dtype == torch.bool else m == 0  # additive float masks: 0 = attend, -inf = not
    m = m.expand(q_len, kv_len).cpu()
    causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril()
    return None if torch.equal(m, causal) else m.clone()


def _modeling_modules(model) -> list:
    names = {type(m).__module__ for m in model.modules()}
    return [sys.modules[n] for n in sorted(names) if n.startswith("transformers.models.") and n in sys.modules]


@contextmanager
def _recording(model):
    """Install the recorders for the duration of one forward pass (serialised by _LOCK) and remove them."""
    rec = _Recorder()
    name = model.config._attn_implementation
    mapping = AttentionInterface._global_mapping
    patched: list[tuple[object, str, object]] = []  # (namespace, attribute, original)
    with _LOCK:
        try:
            for mod in _modeling_modules(model):
                for attr, fn in list(vars(mod).items()):
                    if attr.startswith("apply_rotary") and callable(fn):
                        patched.append((mod, attr, fn))
                        setattr(mod, attr, rec.rope(fn))
                eager = getattr(mod, "eager_attention_forward", None)
                if name not in mapping and eager is not None:  # "eager" is the modeling module's own function
                    patched.append((mod, "eager_attention_forward", eager))
                    setattr(mod, "eager_attention_forward", rec.attention(eager))
            if name in mapping:
                patched.append((mapping, name, mapping[name]))
                mapping[name] = rec.attention(mapping[name])
            yield rec
        finally:
            for space, attr, fn in reversed(patched):
                if isinstance(space, dict):
                    space[attr] = fn
                else:
                    setattr(space, attr, fn)


# ------------------------------------------------------------------------------------------------ public

@torch.no_grad()
def capture_kv(model, tokenizer, prompt: str, max_tokens: int = 512, layers: list[int] | None = None) -> KVCapture:
    """Run `prompt` (truncated to its first `max_tokens` tokens) and capture Q/K/V of every attention layer that
    holds K/V, or of the model's layers numbered in `layers`. See KVCapture and the module docstring.

    The captured layers must share (kv_heads, k_head_dim, v_head_dim): on a model whose layers differ (Gemma 4's
    full-attention layers are twice as wide) a ValueError lists the groups; capture each with `layers=`.
    """
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("capture_kv needs a non-empty prompt string.")
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"][:, :max_tokens]  # [1, T]
    return capture_ids(model, ids, tokenizer, layers)


@torch.no_grad()
def capture_ids(model, ids: torch.Tensor, tokenizer=None, layers: list[int] | None = None) -> KVCapture:
    """As capture_kv, for token ids [1, T] (tokenizer only names the tokens)."""
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"capture takes one sequence, ids of shape [1, tokens]; got {tuple(ids.shape)}.")
    decoder = model.base_model if hasattr(model, "base_model") else model
    with _recording(model) as rec:
        decoder(input_ids=ids.to(model.device), use_cache=False)
    found = rec.layers
    if not found:
        raise ValueError(f"{type(model).__name__} ran no attention layer through transformers' attention "
                         "interface, so kvviz.analysis has no K/V to capture; it supports transformers' decoder "
                         "models (Llama, Qwen, Mistral, Gemma, DeepSeek-V3, hybrids with attention layers, ...).")
    groups: dict[tuple, list[int]] = {}
    for l in found:
        groups.setdefault((l.k_post.shape[0], l.k_post.shape[-1], l.v.shape[-1]), []).append(l.layer_id)
    if layers is not None:
        unknown = sorted(set(layers) - {l.layer_id for l in found})
        if unknown:
            raise ValueError(f"layers {unknown} hold no K/V of their own in {type(model).__name__}; choose among "
                             f"its attention layers {[l.layer_id for l in found]}.")
        found = [l for l in found if l.layer_id in set(layers)]
        if not found:
            raise ValueError("layers=[] captures nothing: pass None for every attention layer, or layer numbers.")
    shapes = {(l.k_post.shape[0], l.k_post.shape[-1], l.v.shape[-1]) for l in found}
    if len(shapes) > 1:
        listing = "; ".join(f"layers={ids_} have kv_heads {h}, K head_dim {dk}, V head_dim {dv}"
                            for (h, dk, dv), ids_ in groups.items())
        raise ValueError(f"{type(model).__name__}'s attention layers differ in shape ({listing}); kvviz.analysis "
                         "stacks layers of one shape: pass one of those lists as `layers=`.")
    layers = found
    id_list = ids[0].tolist()
    # decode one id at a time: readable pieces (" the"), not BPE symbols ("Ġthe")
    tokens = [tokenizer.decode([i]) for i in id_list] if tokenizer is not None else [str(i) for i in id_list]
    return KVCapture(
        keys_pre=torch.stack([l.k_pre for l in layers]),
        keys_post=torch.stack([l.k_post for l in layers]),
        values=torch.stack([l.v for l in layers]),
        queries=torch.stack([l.q for l in layers]),
        tokens=tokens, token_ids=id_list, scaling=layers[0].attention.scaling,
        layer_ids=[l.layer_id for l in layers], attention=[l.attention for l in layers],
    )
