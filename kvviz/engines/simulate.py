"""kvviz's own simulation of the same K/V formats on the same tokens, for side-by-side tables with an engine's.

The model is kvviz.models.load_model's (the bundled GGUF dequantized to fp32 weights, run by transformers), fed the
token ids the engine scored. The baseline is a DynamicCache (no quantization). Each format runs through a fresh
kvviz.QuantizedKVCache the way llama.cpp's batch runs through its cache: a 1-token first forward, then chunks of
`chunk` tokens whose queries read every earlier token and their own K/V as stored (quantized on append, before
attention reads). Statistics are kvviz.quality.kld's, the same as the bridge's.

    from kvviz.engines import simulate
    simulate.kld(["q8_0", "k=q8_0,v=q4_0"], ids)        # ids: the tokens the bridge scored (with BOS)
"""

from __future__ import annotations

import torch

from kvviz.formats import parse_kv
from kvviz.quality.kld import kld_stats
from kvviz.quality.speed import make_cache


@torch.no_grad()
def logprobs(model, ids: list[int], spec, chunk: int = 128) -> torch.Tensor:
    """Teacher-forced log-probs [len(ids), vocab] float32 through `spec`'s cache (None: DynamicCache)."""
    x = torch.tensor([ids], device=model.device)  # [1, T]
    cache = make_cache(model, spec)
    logits = [model(input_ids=x[:, :1], cache=cache, use_cache=True).logits]
    for start in range(1, x.shape[1], chunk):
        logits.append(model(input_ids=x[:, start : start + chunk], cache=cache, use_cache=True).logits)
    return torch.log_softmax(torch.cat(logits, dim=1)[0].double(), dim=-1).float()  # [T, vocab]


def kld(specs: list[str], ids: list[int], model=None, chunk: int = 128) -> dict[str, dict]:
    """{spec: kvviz.quality.kld stats} of kvviz's formats against DynamicCache on the token ids `ids` [T]
    (T - 1 positions scored). model: a loaded causal LM, or a name for kvviz.models.load_model (default SmolLM2)."""
    for spec in specs:
        parse_kv(spec)
    if len(ids) < 2:
        raise ValueError("Give at least two token ids: the first position predicts the second.")
    if model is None or isinstance(model, str):
        from kvviz.models import load_model

        model, _ = load_model(model)
    targets = torch.tensor(ids[1:])
    base = logprobs(model, ids, None, chunk)[:-1]
    out = {}
    for spec in specs:
        stats = kld_stats(base, logprobs(model, ids, spec, chunk)[:-1], targets)
        stats.update(engine="kvviz (simulated: dequantized K/V, fp32 weights, SDPA)", estimate="full vocabulary")
        out[spec] = stats
    return out
