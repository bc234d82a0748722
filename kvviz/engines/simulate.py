"""kvviz's own simulation of the same K/V formats on the same tokens, for side-by-side tables with an engine's.

The model is kvviz.models.load_model's (the bundled GGUF dequantized to fp32 weights, run by transformers), fed the
token ids the engine scored. The runs are kvviz.analysis.teacher_forced.row_values': one batch with a row per format
and an exact row, the first token alone and then the rest at once, so every later position reads K/V as the cache
stores them (quantized on append, before attention reads), as in llama.cpp's batch. Positions 1..T-2 are scored
(position 0 reads no cache in kvviz; llama.cpp's bridge also scores it). Statistics are kvviz.metrics'.

`llamacpp_kld` simulates what llama.cpp itself runs (the `llama.cpp:<type>` names): the same fp32 weights with
every matmul input rounded to the GGUF weight type's 8-bit partner, llama.cpp's flash attention and rotation
(kvviz.ggml_attention), all tokens in one batch, against the same simulation with an f16 cache, positions 0..T-2.

    from kvviz.engines import simulate
    simulate.kvviz_kld(["q8_0", "k=q8_0,v=q4_0"], ids)        # ids: the tokens the bridge scored (with BOS)
    simulate.llamacpp_kld(["q4_0"], ids, rotate=False)   # what llama.cpp with LLAMA_ATTN_ROT_DISABLE=1 measures
    simulate.topk_kld(["vllm:fp8_e4m3"], ids, top_k=20)  # estimated as the server bridge estimates vLLM's KLD
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from kvviz import ggml_attention, models
from kvviz.analysis.teacher_forced import lm_logprobs, row_hidden, row_values
from kvviz.engines.llamacpp import resolve_gguf, type_pair
from kvviz.formats import as_plans
from kvviz.metrics import kld_stats, kld_stats_topk, summarize
from kvviz.rowstable import row_stable
from kvviz.analysis.llamacpp import interleaved_rope, rounded_inputs, weight_vec_dot


def kvviz_kld(specs: list[str], ids: list[int], model=None) -> dict[str, dict]:
    """{spec: kvviz.metrics.summarize stats} of kvviz's formats against the exact model on the token ids `ids` [T]
    (positions 1..T-2 scored). model: a loaded causal LM, or a name for kvviz.models.load_model (default SmolLM2)."""
    if len(ids) < 3:
        raise ValueError("Give at least three token ids: position 0 reads no cache, position 1 is the first scored.")
    if model is None or isinstance(model, str):
        model, _ = models.load_model(model)
    plans = as_plans(specs, model.config.get_text_config(decoder=True).num_hidden_layers)  # checked before compute
    values, _ = row_values(model, torch.tensor([ids], device=model.device), plans)
    out = {}
    for spec, v in zip(specs, values):
        stats = summarize(*v)
        stats.update(engine="kvviz (simulated: dequantized K/V, fp32 weights, SDPA)", estimate="full vocabulary")
        out[spec] = stats
    return out


# ---- llama.cpp's arithmetic (the `llama.cpp:<type>` names) ---------------------------------------------------

def llamacpp_logprobs(model, ids: list[int], vec_dot: dict[str, str], k_type: str, v_type: str,
                      rotate: bool = True, interleaved: bool = False) -> torch.Tensor:
    """log-softmax [T, vocab] (float32) of the token ids [T] run through `model` (fp32 weights: the GGUF's, as
    kvviz.models loads them) with llama.cpp's arithmetic: every Linear's input rounded to its weight's vec_dot_type
    (`vec_dot`: kvviz.analysis.llamacpp.weight_vec_dot), and attention through kvviz.ggml_attention.attention with
    K cache `k_type`, V cache `v_type` ("f16" or a ggml type) and llama.cpp's rotation when `rotate`; interleaved:
    the GGUF's Q/K channels are RoPE-interleaved (interleaved_rope()). All T tokens in one batch."""
    def attn(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
        return ggml_attention.attention(query, key, value, attention_mask, scaling, k_type, v_type, rotate,
                                        kwargs.get("softcap"), interleaved), None

    AttentionInterface.register(_GGML_ATTN, attn)
    AttentionMaskInterface.register(_GGML_ATTN, sdpa_mask)
    before = model.config._attn_implementation
    model.set_attn_implementation(_GGML_ATTN)
    try:
        with torch.no_grad(), rounded_inputs(model, vec_dot), row_stable(model):
            logits = model(input_ids=torch.tensor([ids], device=model.device), use_cache=False).logits[0]
    finally:
        model.set_attn_implementation(before)
    return torch.log_softmax(logits.double(), dim=-1).float()  # [T, vocab]


_GGML_ATTN = "llama.cpp"


def within_bound(ours: float, theirs: float) -> bool:
    """Whether a simulated mean KLD is faithful to the engine's (issue 21): within 20% of it, or within 0.0005
    absolute where both are below 0.0025."""
    if ours < 0.0025 and theirs < 0.0025:
        return abs(ours - theirs) <= 0.0005
    return abs(ours - theirs) <= 0.2 * theirs


def llamacpp_kld(specs: list[str], ids: list[int], model=None, gguf=None, rotate: bool = True,
                 score_from: int = 0) -> dict[str, dict]:
    """{spec: kvviz.quality.kld stats}: kvviz's simulation of llama.cpp running each spec's cache types on the token
    ids [T] (the bridge's), against the same simulation with an f16 cache, positions score_from..T-2 scored (0: as
    the bridge scores them). model: a loaded causal LM or a bundled name (default SmolLM2); gguf: the GGUF its
    weights came from (default: the bundled model's), whose tensor types set the matmul input rounding. rotate:
    llama.cpp's default Hadamard rotation (False: LLAMA_ATTN_ROT_DISABLE=1). kvviz.quality.kld of the
    `llama.cpp:<type>` name runs the same arithmetic through kvviz's cache and equals this on the same tokens."""
    pairs = {spec: type_pair(spec) for spec in specs}  # bad specs fail before any compute
    if gguf is None:
        if not (model is None or isinstance(model, str)):
            raise ValueError("Pass gguf=, the GGUF file the loaded model's weights came from.")
        gguf = resolve_gguf(model)
    if model is None or isinstance(model, str):
        model, _ = models.load_model(model)
    vec_dot, interleaved = weight_vec_dot(model, gguf), interleaved_rope(gguf)
    scored = slice(score_from, len(ids) - 1)
    base = llamacpp_logprobs(model, ids, vec_dot, "f16", "f16", interleaved=interleaved)[scored]
    targets = torch.tensor(ids[score_from + 1 :])
    out = {}
    for spec, (k_type, v_type) in pairs.items():
        cand = llamacpp_logprobs(model, ids, vec_dot, k_type, v_type, rotate, interleaved)[scored]
        stats = kld_stats(base, cand, targets)
        stats.update(engine="kvviz (simulated llama.cpp: rounded matmul inputs, its flash attention"
                            f"{', rotated K/V' if rotate else ''})", estimate="full vocabulary")
        out[spec] = stats
    return out


# ---- like with like for servers (top-k log-probs, the rest lumped) ---------------------------------------------

def topk_kld(specs: list[str], ids: list[int], model=None, top_k: int = 20) -> dict[str, dict]:
    """{spec: stats} of kvviz's formats against the exact model on the token ids [T], estimated as the server bridge
    estimates an engine's (kvviz.engines.servers): each side's top-k log-probs per position with the rest of the mass
    lumped in one bucket (kvviz.metrics.kld_stats_topk), positions 1..T-2 (servers.measure_servers with score_from=1
    scores the same ones). The formats run as kvviz.quality.kld runs them (kvviz.analysis.teacher_forced,
    kvviz.formats), so a change to a format's simulation changes these numbers too. model: a loaded causal LM or a name
    for load_model."""
    if len(ids) < 3:
        raise ValueError("Give at least three token ids: position 0 reads no cache, position 1 is the first scored.")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a whole number >= 1; got {top_k!r}.")
    if model is None or isinstance(model, str):
        model, _ = models.load_model(model)
    plans = as_plans(specs, model.config.get_text_config(decoder=True).num_hidden_layers)
    t = len(ids)
    with torch.no_grad():
        hidden = row_hidden(model, torch.tensor([ids], device=model.device), [None, *plans])[:, 1 : t - 1]  # [R, N, h]
        with row_stable(model):
            lps = [lm_logprobs(model, h) for h in hidden]  # R x [N, vocab] float64
    targets = torch.tensor(ids[2:], device=lps[0].device)[:, None]  # [N, 1]
    base_lp, base_ids = lps[0].topk(top_k, dim=-1)  # [N, k]
    base_target = lps[0].gather(-1, targets)[:, 0]  # [N]
    out = {}
    for spec, lp in zip(specs, lps[1:]):
        cand_lp, cand_ids = lp.topk(top_k, dim=-1)
        stats = kld_stats_topk(base_ids.cpu(), base_lp.cpu(), base_target.cpu(), cand_ids.cpu(), cand_lp.cpu(),
                               lp.gather(-1, targets)[:, 0].cpu())
        stats.update(engine="kvviz (simulated: dequantized K/V, fp32 weights, SDPA)",
                     estimate=f"top-{top_k} log-probs per position, the rest of the mass lumped in one bucket")
        out[spec] = stats
    return out
