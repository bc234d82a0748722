"""kvviz's own simulation of the same K/V formats on the same tokens, for side-by-side tables with an engine's.

The model is kvviz.models.load_model's (the bundled GGUF dequantized to fp32 weights, run by transformers), fed the
token ids the engine scored. The runs are kvviz.analysis.rows.row_values': one batch with a row per format
and an exact row, the first token alone and then the rest at once, so every later position reads K/V as the cache
stores them (quantized on append, before attention reads), as in llama.cpp's batch. Positions 1..T-2 are scored
(position 0 reads no cache in kvviz; llama.cpp's bridge also scores it). Statistics are kvviz.metrics'.

    from kvviz.engines import simulate
    simulate.kld(["q8_0", "k=q8_0,v=q4_0"], ids)        # ids: the tokens the bridge scored (with BOS)
"""

from __future__ import annotations

import torch

from kvviz import models
from kvviz.analysis.rows import row_values
from kvviz.formats import as_plans
from kvviz.metrics import summarize


def kld(specs: list[str], ids: list[int], model=None) -> dict[str, dict]:
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
