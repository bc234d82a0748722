"""Per-layer sensitivity: which layers carry the damage of a KV format, and the K/V magnitudes that explain it.

`layer_sensitivity(model, tok, prompt, spec)` measures, for every layer i and side s in {K, V}, the mean
teacher-forced KL(exact || variant) over the prompt's positions, where the variant stores only layer i's s in
`spec` and keeps everything else exact: the other side of layer i in fp16 (the model's own dtype when that is
fp16 / bf16; on a float32 model fp16's rounding of one tensor moves the KL by orders of magnitude less than any
quantized format), every other layer as computed (kvviz.QuantizedKVCache plans, None entries). All 2L variants and
the exact row run as rows of ONE batch, with the first token alone and the rest in one chunk so that every later
position reads the quantized cache (kvviz.analysis.teacher_forced). The rows run as a prefix tree: variant i is the
exact run up to layer i, so it forks from the exact row there, and layer j computes 2j + 3 rows instead of 2L + 1 (about
half the decoder work); the exact row's log-probs are formed once and every variant's KL is taken against them.
`plans_kl` is the same measurement for any plans (kvviz.analysis.search's path).

A `llama.cpp:` name is measured as llama.cpp runs it (kvviz.analysis.llamacpp): every other layer, and the other
side of layer i, in llama.cpp's f16 cache, its attention arithmetic and 8-bit matmul inputs throughout, the KL
against llama.cpp's f16-cache run; such plans run one at a time, not as rows of the batch (plans_kl).

Qwen2.5-7B's k_proj bias gives layers 0 and 27 K norms of 600-900 against a median of 22: those layers top the K
ranking at 3-4 bits, and `layer_norms` shows why (max |K| and the largest channel's amax over the median's).

    sens = layer_sensitivity(model, tok, prompt, "int4")   # {"k": [L], "v": [L], ...} mean KL in nats
    norms = layer_norms(model, tok, prompt)                 # {"k_max": [L], "k_channel_ratio": [L], ...}
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch

from kvviz.analysis import llamacpp
from kvviz.analysis.capture import capture_ids
from kvviz.formats import KVSpec, Plan, as_plan, get_format
from kvviz.memory.configs import layer_shapes
from kvviz.analysis.teacher_forced import row_values


def _prompt_ids(model, tokenizer, prompt: str, max_tokens: int) -> torch.Tensor:
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("The prompt is empty; give a text of a few hundred tokens (e.g. kvviz.quality.wikitext()).")
    if max_tokens < 3:
        raise ValueError(f"max_tokens must be at least 3, got {max_tokens}.")
    # a token spans fewer than 32 characters in practice: cutting first keeps a whole corpus from being tokenized
    ids = tokenizer(prompt[: 32 * max_tokens], return_tensors="pt")["input_ids"][:, :max_tokens]  # [1, T]
    if ids.shape[1] < 3:
        raise ValueError(f"The prompt has {ids.shape[1]} tokens; sensitivity needs at least 3. Give a longer text.")
    return ids.to(model.device)


def kv_layers(model) -> list[int]:
    """The decoder layers that hold K/V (hybrids' linear-attention and Mamba layers do not)."""
    return [s.index for s in layer_shapes(model.config, "transformers") if s.has_kv]


def _other_side(model, kv: KVSpec) -> str:
    """The 16-bit format for the unmeasured side of the measured layer: the model's dtype when it is 16-bit; for a
    llama.cpp name, llama.cpp's f16 cache (its baseline)."""
    if kv.k.engine == llamacpp.ENGINE:
        return llamacpp.BASELINE
    return "bf16" if model.dtype == torch.bfloat16 else "fp16"


def variant_plans(model, kv: KVSpec) -> tuple[list[Plan], list[tuple[str, int]]]:
    """The 2 x (layers holding K/V) plans of layer_sensitivity (every other layer exact) and their labels
    [("k" | "v", layer)]. A llama.cpp name's other side is llama.cpp's f16 cache, with the name's rotation setting
    (llamacpp.one_side); its exact layers are held in f16 too when it runs (llamacpp.held)."""
    other = None if kv.k.engine == llamacpp.ENGINE else get_format(_other_side(model, kv))
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    plans, labels = [], []
    for side in ("k", "v"):
        for i in kv_layers(model):
            plan: list = [None] * n_layers
            if other is None:
                plan[i] = llamacpp.one_side(kv, side, f"{side}{i}")
            else:
                k_fmt, v_fmt = (kv.k, other) if side == "k" else (other, kv.v)
                plan[i] = KVSpec(k_fmt, v_fmt, f"{side}{i}", kv.residual)
            plans.append(as_plan(plan))
            labels.append((side, i))
    return plans, labels


@torch.no_grad()
def plans_kl(model, ids_list: list[torch.Tensor], plans: list[Plan], rows_per_pass: int | None = None,
             scales: dict | None = None, bases: list | None = None) -> list[float]:
    """Mean teacher-forced KL (nats) of each plan against the exact model over every scored position of every
    prompt (ids [1, T] each; positions 1..T-2), the plans batched as rows, `rows_per_pass` at a time.

    A plan holding a `llama.cpp:` name runs as llama.cpp runs it, one plan at a time, and its KL is against
    llama.cpp's f16-cache run (kvviz.analysis.llamacpp.values; the weights' rounding from a bundled model's GGUF).
    bases: a list that carries the exact model's kvviz.metrics.Baseline per prompt between calls: empty, it is
    filled (the exact row runs beside the first pass); filled, the exact model does not run again and what each
    Baseline formed (P W, its buffers) is reused (same ids_list)."""
    step = rows_per_pass or len(plans)
    if step < 1:
        raise ValueError(f"rows_per_pass must be a positive number of rows, got {rows_per_pass}.")
    bases = [] if bases is None else bases
    assert not bases or len(bases) == len(ids_list), f"{len(bases)} saved baselines for {len(ids_list)} prompts"
    engine = [j for j, p in enumerate(plans) if llamacpp.runs_llamacpp(p)]  # run as llama.cpp runs them
    own = [j for j in range(len(plans)) if j not in engine]
    vec_dot = llamacpp.weight_vec_dot(model) if engine else {}
    sums, count = [0.0] * len(plans), 0
    for n, ids in enumerate(ids_list):
        base = bases[n] if bases and len(bases) == len(ids_list) else None
        for start in range(0, len(own), step):
            batch = own[start : start + step]
            values, base = row_values(model, ids, [plans[j] for j in batch], base=base, scales=scales,
                                      kl_only=True)
            for j, kl in zip(batch, values):
                sums[j] += float(kl.sum())
        if engine:
            for j, (kld, *_) in zip(engine, llamacpp.values(model, ids, [plans[j] for j in engine], 1, vec_dot)):
                sums[j] += float(kld.sum())
        if len(bases) < len(ids_list):
            bases.append(base)
        count += ids.shape[1] - 2
    return [s / count for s in sums]


@torch.no_grad()
def layer_sensitivity(model, tokenizer, prompt: str, spec, max_tokens: int = 256, rows_per_pass: int | None = None,
                      scales: dict | None = None) -> dict:
    """Mean teacher-forced KL (nats) when only one layer's K (or V) is stored in `spec` (see the module docstring).

    prompt: text, cut to its first max_tokens tokens; positions 1..T-2 are scored. rows_per_pass: variants per
    batch (None: all 2L at once; fewer bounds memory on long prompts, at somewhat more compute: each batch runs its
    own exact trunk up to its variants' layers).
    Returns {"k": [L], "v": [L]} (NaN for layers that hold no K/V), plus "spec" (canonical), "tokens" (T),
    "other" (the 16-bit format of the unmeasured side), "seconds".
    """
    t0 = time.perf_counter()
    plan = as_plan(spec)
    if not plan.is_uniform:
        raise ValueError(f"layer_sensitivity measures one spec in one layer at a time; {plan.name!r} is a per-layer "
                         f"plan. Give a single spec such as int4.")
    kv = plan.default
    ids = _prompt_ids(model, tokenizer, prompt, max_tokens)
    plans, labels = variant_plans(model, kv)
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    out = {"k": [math.nan] * n_layers, "v": [math.nan] * n_layers}
    for (side, i), kl in zip(labels, plans_kl(model, [ids], plans, rows_per_pass, scales)):
        out[side][i] = kl
    out.update(spec=kv.spec, tokens=int(ids.shape[1]), other=_other_side(model, kv),
               seconds=time.perf_counter() - t0)
    return out


def ranking(sens: dict) -> list[tuple[str, int, float]]:
    """[(side, layer, kl)] from layer_sensitivity's result, most damaging first (NaN layers left out)."""
    rows = [(side, i, kl) for side in ("k", "v") for i, kl in enumerate(sens[side]) if not math.isnan(kl)]
    return sorted(rows, key=lambda r: -r[2])


@dataclass(frozen=True)
class Peak:
    """One of the most damaging (side, layer) pairs, beside the magnitudes that explain it (or do not).

    kl: its mean KL (nats) when only it is quantized; times_median: kl over the median pair's KL; channel_ratio:
    the layer's largest channel over its median channel (layer_norms' *_channel_ratio); median_channel_ratio: that
    ratio's median over the layers; peak: the layer's max |x|."""

    side: str
    layer: int
    kl: float
    times_median: float
    channel_ratio: float
    median_channel_ratio: float
    peak: float


def peaks(sens: dict, norms: dict, top: int = 3) -> list[Peak]:
    """The `top` worst (side, layer) pairs of layer_sensitivity's result, with layer_norms' magnitudes."""
    ranked = ranking(sens)
    median_kl = statistics.median(kl for _, _, kl in ranked)
    out = []
    for side, layer, kl in ranked[:top]:
        ratios = [x for x in norms[f"{side}_channel_ratio"] if math.isfinite(x)]
        out.append(Peak(side, layer, kl, kl / max(median_kl, 1e-30), norms[f"{side}_channel_ratio"][layer],
                        statistics.median(ratios), norms[f"{side}_max"][layer]))
    return out


@torch.no_grad()
def layer_norms(model, tokenizer, prompt: str, max_tokens: int = 256) -> dict:
    """Per-layer K/V magnitude statistics that explain sensitivity peaks, from one capture (kvviz.analysis).

    For K (post-RoPE, what the cache stores) and V, per decoder layer (NaN where the layer holds no K/V):
      *_max:             max |x| over heads, tokens and channels
      *_median_amax:     the median over heads and channels of each channel's max |x| over tokens
      *_channel_ratio:   *_max / *_median_amax (how far the worst channel stands above a typical one)
      *_token_norm_max:  the largest L2 norm of one token's head vector
    Returns {"k_max": [L], ..., "v_token_norm_max": [L], "layers": [layer ids captured]}.
    """
    ids = _prompt_ids(model, tokenizer, prompt, max_tokens)
    cap = capture_ids(model, ids, tokenizer)
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    out: dict = {f"{s}_{name}": [math.nan] * n_layers for s in ("k", "v")
                 for name in ("max", "median_amax", "channel_ratio", "token_norm_max")}
    for pos, layer in enumerate(cap.layer_ids):
        for s, x in (("k", cap.keys_post[pos]), ("v", cap.values[pos])):  # [kv_heads, T, D]
            amax = x.abs().amax(dim=1)  # [kv_heads, D]: each channel's max over tokens
            peak, median = float(amax.max()), float(amax.median())
            out[f"{s}_max"][layer] = peak
            out[f"{s}_median_amax"][layer] = median
            out[f"{s}_channel_ratio"][layer] = peak / max(median, 1e-12)
            out[f"{s}_token_norm_max"][layer] = float(x.norm(dim=-1).max())
    out["layers"] = list(cap.layer_ids)
    return out
