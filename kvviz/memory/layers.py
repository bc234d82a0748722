"""config.json fields -> one LayerShape per decoder layer: what kind of layer it is and what K/V it caches.

The kinds follow transformers' `layer_types` (and its `get_layer_types_and_kwargs` in cache_utils.py):

    full_attention     K and V of every token
    sliding_attention  K and V of the last `window` tokens (Mistral v0.1, Gemma 2/3/4, gpt-oss, Cohere 2)
    chunked_attention  K and V of the current `window`-token chunk (Llama 4's local layers)
    linear_attention   no K/V: a fixed-size recurrent state (Mamba-2 in Granite 4-H / Nemotron-H, Gated DeltaNet
                       in Qwen3-Next); see states_of
    hybrid             full-attention K/V and a Mamba state in the same layer (Falcon-H1)
    shared             reuses an earlier layer's K/V (Gemma 3n / Gemma 4 `num_kv_shared_layers`; transformers' "dummy")
    mlp                no attention at all (Nemotron-H's "-" and "E" layers)

Where the config does not list `layer_types`, the family's rule is applied as transformers' config classes do:
Gemma 2 alternates from a sliding layer, Gemma 3/4 and Cohere 2 put a full layer every `sliding_window_pattern`
(default 6), Llama 4 is chunked except every 4th (`no_rope_layers`), Qwen3-Next has full attention every
`full_attention_interval` (default 4), Nemotron-H reads `hybrid_override_pattern`, Qwen2/3 ignore `sliding_window`
unless `use_sliding_window`.

MLA (DeepSeek-V3, Kimi K2: `kv_lora_rank` in the config) depends on the layout:
    engine         one latent of kv_lora_rank + qk_rope_head_dim values per token (vLLM's MLAAttentionSpec,
                   SGLang's MLATokenToKVPool, llama.cpp): K side 1 x 576, no V side
    transformers   transformers 5.x caches the latent too, as two tensors: K = [batch, 1, seq, kv_lora_rank],
                   V = [batch, 1, seq, qk_rope_head_dim]
    decompressed   heads x (qk_nope + qk_rope) for K and heads x v_head_dim for V (transformers 4.x, engines
                   without an MLA kernel): for comparison
"""

from __future__ import annotations

from dataclasses import dataclass

LAYOUTS = ("engine", "transformers", "decompressed")
KINDS = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention", "hybrid", "shared", "mlp")
_ATTENTION = ("full_attention", "sliding_attention", "chunked_attention", "hybrid")
# transformers' names, legacy names (configuration_utils._LEGACY_LAYER_TYPE_REMAP) and config.json spellings
_ALIASES = {"attention": "full_attention", "global": "full_attention", "full": "full_attention",
            "indexed_attention": "full_attention", "sliding": "sliding_attention", "local": "sliding_attention",
            "mamba": "linear_attention", "mamba2": "linear_attention", "linear": "linear_attention",
            "dummy": "shared", "moe": "mlp", "mlp": "mlp"}
_NEMOTRON = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "mlp"}


@dataclass(frozen=True)
class LayerShape:
    """One decoder layer's cache: K is [batch, k_heads, tokens, k_dim], V is [batch, v_heads, tokens, v_dim].

    `window` is the sliding window or chunk size (None for full attention). Layers without K/V have zero heads.
    """

    index: int
    kind: str
    window: int | None
    k_heads: int
    k_dim: int
    v_heads: int
    v_dim: int

    @property
    def has_kv(self) -> bool:
        return self.k_heads > 0

    def tokens(self, seq_len: int, layout: str = "engine") -> int:
        """Tokens of K/V this layer holds after `seq_len` tokens went through it.

        Sliding and chunked layers: engines keep the window the next query attends to (W tokens, the current one
        included); transformers' DynamicSlidingWindowLayer keeps W - 1 (the current token's K/V is joined during
        the step, not stored). Chunked layers are counted at their peak (a whole chunk), as engines allocate them.
        """
        if not self.has_kv:
            return 0
        if self.window is None:
            return seq_len
        return min(seq_len, self.window - 1 if layout == "transformers" else self.window)

    def held(self, seq_len: int, fmt, layout: str = "engine") -> int:
        """Tokens one side (K or V) stored in `fmt` holds after `seq_len` tokens: `tokens`, except that in the
        transformers layout a `channel` format (KIVI's K) in a sliding or chunked layer keeps its oldest group
        whole. Groups of `fmt.group` tokens are counted from position 0, so the side starts at the group holding
        the first visible position f = seq_len - tokens: it holds seq_len - (f - f % group) tokens, up to
        group - 1 more than the window shows (kvviz.cache.held_tokens, the cache's own rule)."""
        visible = self.tokens(seq_len, layout)
        if layout != "transformers" or self.window is None or getattr(fmt, "granularity", None) != "channel":
            return visible
        first = seq_len - visible
        return seq_len - (first - first % fmt.group)


def _int(cfg: dict, key: str, where: str = "the config") -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where} needs a positive integer {key!r} (got {value!r}): is this a decoder's config.json?")
    return value


def _n_layers(cfg: dict) -> int:
    if "layers_block_type" in cfg and isinstance(cfg["layers_block_type"], list):
        return len(cfg["layers_block_type"])
    if isinstance(cfg.get("hybrid_override_pattern"), str):
        return len(cfg["hybrid_override_pattern"])
    return _int(cfg, "num_hidden_layers")


def layer_kinds(cfg: dict) -> tuple[list[str], list[int | None]]:
    """(kind per layer, window per layer) from the config's fields; see the module docstring for the rules."""
    n = _n_layers(cfg)
    model_type = str(cfg.get("model_type", ""))
    listed = cfg.get("layer_types") or cfg.get("layers_block_type")
    if isinstance(cfg.get("hybrid_override_pattern"), str) and not listed:
        listed = [_NEMOTRON.get(c, c) for c in cfg["hybrid_override_pattern"]]
    window = cfg.get("sliding_window")
    if "use_sliding_window" in cfg and not cfg["use_sliding_window"]:
        window = None  # Qwen2/2.5/3 carry a sliding_window they do not use
    chunk = cfg.get("attention_chunk_size")
    if listed:
        if not isinstance(listed, list) or len(listed) != n:
            raise ValueError(f"layer_types lists {len(listed) if isinstance(listed, list) else listed!r} entries for "
                             f"{n} layers: fix num_hidden_layers or layer_types.")
        kinds = [_ALIASES.get(str(t), str(t)) for t in listed]
    elif model_type == "falcon_h1":
        kinds = ["hybrid"] * n
    elif model_type in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        every = cfg.get("full_attention_interval") or 4
        kinds = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    elif model_type.startswith("llama4"):
        no_rope = cfg.get("no_rope_layers") or [int((i + 1) % (cfg.get("no_rope_layer_interval") or 4) != 0)
                                                for i in range(n)]
        kinds = ["chunked_attention" if r and chunk else "full_attention" for r in no_rope]
    elif window and model_type.startswith("gemma2"):
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    elif window and (model_type.startswith(("gemma3", "gemma4", "cohere2")) or "sliding_window_pattern" in cfg):
        every = cfg.get("sliding_window_pattern") or (4 if model_type.startswith("cohere2") else 6)
        kinds = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    elif window and model_type.startswith("gpt_oss"):
        kinds = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    elif window and cfg.get("use_sliding_window") and "max_window_layers" in cfg:
        kinds = ["sliding_attention" if i >= cfg["max_window_layers"] else "full_attention" for i in range(n)]
    elif window:
        kinds = ["sliding_attention"] * n
    elif chunk:
        kinds = ["chunked_attention"] * n
    else:
        kinds = ["full_attention"] * n
    if model_type.startswith("gemma4") and kinds and kinds[-1] != "full_attention":
        kinds[-1] = "full_attention"  # Gemma4TextConfig forces the last layer to full attention
    unknown = sorted({k for k in kinds if k not in KINDS})
    if unknown:
        raise ValueError(f"Unknown layer type(s) {unknown} in the config; kvviz knows {', '.join(KINDS)}.")
    shared = cfg.get("num_kv_shared_layers") or 0
    if shared:
        kinds = [("shared" if i >= n - shared else k) for i, k in enumerate(kinds)]
    windows: list[int | None] = []
    for k in kinds:
        size = window if k == "sliding_attention" else chunk if k == "chunked_attention" else None
        if k in ("sliding_attention", "chunked_attention") and not (isinstance(size, int) and size >= 1):
            field = "sliding_window" if k == "sliding_attention" else "attention_chunk_size"
            raise ValueError(f"The config has {k} layers but no positive {field} (got {size!r}).")
        windows.append(size)
    return kinds, windows


def _per_layer(cfg: dict, i: int, kind: str) -> dict:
    """The fields that hold for layer `i`: global-layer overrides (Gemma 4), then transformers' per_layer_config."""
    out = dict(cfg)
    if kind == "full_attention" and str(cfg.get("model_type", "")).startswith("gemma4"):
        out["head_dim"] = cfg.get("global_head_dim") or 512  # Gemma4TextConfig's default
        if cfg.get("num_global_key_value_heads") and cfg.get("attention_k_eq_v", True):
            out["num_key_value_heads"] = cfg["num_global_key_value_heads"]
    overrides = cfg.get("per_layer_config") or {}
    if isinstance(overrides, dict):
        for key, values in overrides.items():
            if str(key).isdigit() and int(key) == i and isinstance(values, dict):
                out.update(values)
    return out


def shapes_of(cfg: dict, layout: str = "transformers") -> list[LayerShape]:
    """One LayerShape per decoder layer of a text model's config fields (kvviz.memory.configs.layer_shapes takes
    any config)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}.")
    kinds, windows = layer_kinds(cfg)
    shapes = []
    for i, (kind, window) in enumerate(zip(kinds, windows)):
        if kind not in _ATTENTION:
            shapes.append(LayerShape(i, kind, None, 0, 0, 0, 0))
            continue
        c = _per_layer(cfg, i, kind)
        heads = _int(c, "num_attention_heads")
        if c.get("kv_lora_rank"):  # MLA
            rank, rope = _int(c, "kv_lora_rank"), _int(c, "qk_rope_head_dim")
            if layout == "engine":
                dims = (1, rank + rope, 0, 0)
            elif layout == "transformers":
                dims = (1, rank, 1, rope)
            else:
                dims = (heads, _int(c, "qk_nope_head_dim") + rope, heads, _int(c, "v_head_dim"))
        else:
            kv_heads = c.get("num_key_value_heads") or heads
            head_dim = c.get("head_dim") or _int(c, "hidden_size") // heads
            for key, value in (("num_key_value_heads", kv_heads), ("head_dim", head_dim)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"The config's {key} must be a positive integer, got {value!r}.")
            dims = (kv_heads, head_dim, kv_heads, head_dim)
        shapes.append(LayerShape(i, kind, window, *dims))
    return shapes


def states_of(cfg: dict, layout: str = "engine") -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """(layer index, conv state shape, recurrent state shape) per layer with a fixed-size state, for batch 1, from a
    text model's config fields (kvviz.memory.configs.state_shapes takes any config).

    Mamba-2 (Falcon-H1, Granite 4-H, Nemotron-H): conv [conv_dim, d_conv], SSM [heads, head_dim, d_state], with
    conv_dim = heads x head_dim + 2 x groups x d_state. Gated DeltaNet (Qwen3-Next): conv [2 x k_heads x k_dim +
    v_heads x v_dim, kernel], recurrent [v_heads, k_dim, v_dim]. transformers keeps `d_conv` columns of conv
    state; vLLM keeps `d_conv - 1` (the `engine` layout).
    """
    kinds, _ = layer_kinds(cfg)
    trim = 0 if layout == "transformers" else 1
    out = []
    for i, kind in enumerate(kinds):
        if kind not in ("linear_attention", "hybrid"):
            continue
        if cfg.get("linear_num_value_heads"):  # Gated DeltaNet
            kh, kd = _int(cfg, "linear_num_key_heads"), _int(cfg, "linear_key_head_dim")
            vh, vd = _int(cfg, "linear_num_value_heads"), _int(cfg, "linear_value_head_dim")
            kernel = _int(cfg, "linear_conv_kernel_dim")
            out.append((i, (2 * kh * kd + vh * vd, kernel - trim), (vh, kd, vd)))
            continue
        pick = lambda *keys: next((cfg[k] for k in keys if isinstance(cfg.get(k), int)), None)  # noqa: E731
        heads = pick("mamba_n_heads", "mamba_num_heads", "num_heads")
        inner = pick("mamba_d_ssm") or (pick("mamba_expand", "expand") or 2) * _int(cfg, "hidden_size")
        head = pick("mamba_d_head", "mamba_head_dim") or (inner // heads if heads else None)
        groups = pick("mamba_n_groups", "n_groups") or 1
        state = pick("mamba_d_state", "ssm_state_size", "state_size")
        conv = pick("mamba_d_conv", "conv_kernel")
        if not (heads and head and state and conv):
            raise ValueError(f"Layer {i} is a {kind} layer but the config lacks the Mamba fields (mamba_n_heads, "
                             "mamba_d_head, mamba_d_state, mamba_d_conv or their Nemotron-H names).")
        out.append((i, (heads * head + 2 * groups * state, conv - trim), (heads, head, state)))
    return out
