"""Perplexity on the WikiText-2 test slice in assets/ (CC BY-SA 3.0, Merity et al. 2016; see
assets/WIKITEXT-2-LICENSE.md), with K/V read back from each format's cache.

Each window of `window` tokens starts with a prefill of its first `prefill_tokens` tokens (a prompt: it attends to
its own unquantized K/V, and per-tensor fp8 scales come from it, as from any prompt), then the rest goes through
the cache in chunks of `chunk` tokens: every chunk's queries attend to the quantized history and to their own
tokens as stored (the cache quantizes on append, before attention reads), as in decoding. Only the tokens after
the prefill are scored. Windows start every `stride` tokens (default: `window`, no overlap). The defaults (2 windows x 512 tokens) are sized for a 2-core
CPU; the numbers compare formats, they are not the model's published perplexity (the `<unk>`-tokenized text and
short windows raise it).

A plan holding a `llama.cpp:` name is scored as llama.cpp's perplexity tool scores it (kvviz.analysis.llamacpp):
the whole window in one batch, every position reading K/V as stored, llama.cpp's matmul input rounding, the same
tokens P..W-1 scored. Its reference is then llama.cpp's own f16-cache run on those windows, returned as
"llama.cpp:f16" beside the exact baseline: the two differ by llama.cpp's arithmetic alone.

    ppl = perplexity(model, tok, ["fp8_e4m3", "int4"])   # {"ppl": {"baseline": ..., "fp8_e4m3": ..., ...}, ...}
"""

from __future__ import annotations

import torch

from kvviz import metrics
from kvviz.analysis import llamacpp
from kvviz.formats import as_plans
from kvviz.quality.corpus import wikitext
from kvviz.quality.decode import make_cache
from kvviz.rowstable import row_stable


@torch.no_grad()
def _window_nll(model, ids: torch.Tensor, spec, prefill_tokens: int, chunk: int, scales: dict | None) -> torch.Tensor:
    """Negative log-likelihoods [W - P] of tokens P..W-1 of one window ids [1, W] through a fresh cache (P =
    prefill_tokens)."""
    cache = make_cache(model, spec, scales)
    p = prefill_tokens
    with row_stable(model):  # the arithmetic of every kvviz measurement
        logits = [model(input_ids=ids[:, :p], cache=cache, use_cache=True, logits_to_keep=1).logits]  # token P
        for start in range(p, ids.shape[1] - 1, chunk):
            stop = min(start + chunk, ids.shape[1] - 1)
            logits.append(model(input_ids=ids[:, start:stop], cache=cache, use_cache=True).logits)
    return metrics.nll(metrics.log_probs(torch.cat(logits, dim=1)[0]), ids[0, p:])  # [W - P]


def perplexity(model, tokenizer, specs: list[str], windows: int = 2, window: int = 512, stride: int | None = None,
               prefill_tokens: int = 128, chunk: int = 128, text: str | None = None,
               scales: dict | None = None) -> dict:
    """Perplexity of the baseline (DynamicCache) and of each spec or per-layer plan on the same windows.

    Returns {"ppl": {"baseline" | spec: float}, "nll": {name: [mean NLL per window]}, "windows": int,
    "window": int, "tokens_scored": int} (names: "baseline", then the specs as given, then "llama.cpp:f16" when a
    plan holds a llama.cpp name: see the module docstring). Raises ValueError when the text is too short for the
    windows asked.
    """
    # specs, plan text or Plans, checked against the model before any compute
    plans = as_plans(specs, model.config.get_text_config(decoder=True).num_hidden_layers)
    if windows < 1 or chunk < 1 or not 1 <= prefill_tokens < window:
        raise ValueError(f"need windows >= 1, chunk >= 1 and 1 <= prefill_tokens < window; got windows={windows}, "
                         f"chunk={chunk}, prefill_tokens={prefill_tokens}, window={window}.")
    stride = stride or window
    ids = tokenizer(text if text is not None else wikitext(), return_tensors="pt")["input_ids"]  # [1, N]
    need = (windows - 1) * stride + window
    if ids.shape[1] < need:
        raise ValueError(f"The text has {ids.shape[1]} tokens; {windows} windows of {window} every {stride} need "
                         f"{need}. Ask for fewer or shorter windows.")
    ids = ids.to(model.device)
    names = ["baseline"] + [p.name for p in plans]
    engine = [p for p in plans if llamacpp.runs_llamacpp(p)]  # scored as llama.cpp scores them
    vec_dot = llamacpp.weight_vec_dot(model) if engine else {}
    nll: dict[str, list[float]] = {n: [] for n in names + ([llamacpp.BASELINE] if engine else [])}
    for w in range(windows):
        win = ids[:, w * stride : w * stride + window]
        for name, spec in zip(names, [None] + plans):
            if not any(spec is p for p in engine):
                nll[name].append(float(_window_nll(model, win, spec, prefill_tokens, chunk, scales).mean()))
        if engine:  # positions P-1..W-2 predict tokens P..W-1, as _window_nll scores them
            runs = llamacpp.values(model, win, engine, prefill_tokens - 1, vec_dot)
            for plan, (_, plan_nll, base_nll, _) in zip(engine, runs):
                nll[plan.name].append(float(plan_nll.mean()))
            nll[llamacpp.BASELINE].append(float(base_nll.mean()))
    ppl = {n: metrics.perplexity(v) for n, v in nll.items()}
    return {"ppl": ppl, "nll": nll, "windows": windows, "window": window,
            "tokens_scored": windows * (window - prefill_tokens)}
