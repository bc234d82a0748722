"""Needle in a haystack: a number hidden at depths 0..100% of WikiText filler; retrieved when the greedy answer
read back through each format's cache contains it (the seed: int4 loses mid-context recall).

The haystack (filler with the needle sentence at the given depth) is the prompt: one prefill, stored in every
format's cache. The question then goes through the cache as a chunk and the answer is decoded greedily, so both
read the needle from the quantized cache. All formats run as rows of one batch (kvviz.cache.rows).

    res = needle(model, tok, ["fp8_e4m3", "int4", "kivi2"], context_tokens=1024)
    res["rate"]        # {"baseline": 1.0, "fp8_e4m3": 1.0, "int4": 0.6, ...}
    res["retrieved"]   # {name: [bool per depth]}
"""

from __future__ import annotations

import random

import torch

from kvviz.cache.rows import RowStackCache
from kvviz.formats import as_plans
from kvviz.quality.corpus import wikitext
from kvviz.quality.decode import prefill

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
NEEDLE = " The secret number is {value}. Remember it: {value}."
QUESTION = "\n\nQuestion: What is the secret number? Answer: The secret number is"


def haystack(tokenizer, context_tokens: int, depth: float, value: str, text: str | None = None):
    """(prompt ids [1, ~context_tokens], question ids [1, q]): filler with the needle sentence at `depth`."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth is a fraction of the context in [0, 1], got {depth}.")
    enc = lambda s: tokenizer(s, return_tensors="pt")["input_ids"][0]  # noqa: E731
    needle_ids = enc(NEEDLE.format(value=value))
    question = enc(QUESTION)
    filler = enc((text if text is not None else wikitext())[: 8 * context_tokens])
    n_fill = context_tokens - len(needle_ids) - len(question)
    if n_fill < 16 or len(filler) < n_fill:
        raise ValueError(f"context_tokens={context_tokens} is too short (or the filler text too small) for a "
                         "needle test; use at least 64 tokens.")
    at = int(round(depth * n_fill))
    prompt = torch.cat([filler[:at], needle_ids, filler[at:n_fill]])
    return prompt[None], question[None]


@torch.no_grad()
def needle(model, tokenizer, specs: list[str], context_tokens: int = 1024, depths=DEPTHS, seed: int = 0,
           answer_tokens: int = 6, scales: dict | None = None, text: str | None = None) -> dict:
    """Retrieval against depth for the baseline and every spec.

    Returns {"depths": [...], "context_tokens": int, "needles": [value per depth], "answers": {name: [text]},
    "retrieved": {name: [bool]}, "rate": {name: float}} with name "baseline" first, then the specs as given.
    """
    kvs = as_plans(specs, model.config.get_text_config(decoder=True).num_hidden_layers)  # specs or plans
    names = ["baseline"] + [p.name for p in kvs]
    rng = random.Random(seed)
    out = {"depths": list(depths), "context_tokens": context_tokens, "needles": [],
           "answers": {n: [] for n in names}, "retrieved": {n: [] for n in names}}
    for depth in depths:
        value = str(rng.randint(10000, 99999))
        prompt, question = haystack(tokenizer, context_tokens, depth, value, text)
        dyn, _ = prefill(model, prompt)
        rows = len(names)
        stack = RowStackCache(model.config, [None] + kvs, scales=scales)
        stack.load_prefill(dyn)
        del dyn
        inp = question.expand(rows, -1).to(model.device)  # [rows, q]
        answers = [[] for _ in range(rows)]
        for _ in range(answer_tokens):
            nxt = model(input_ids=inp, cache=stack, use_cache=True).logits[:, -1].argmax(-1)  # [rows]
            for r in range(rows):
                answers[r].append(int(nxt[r]))
            inp = nxt[:, None]
        del stack
        out["needles"].append(value)
        for r, name in enumerate(names):
            answer = tokenizer.decode(answers[r], skip_special_tokens=True)
            out["answers"][name].append(answer)
            out["retrieved"][name].append(value in answer.replace(" ", ""))
    out["rate"] = {n: sum(v) / len(v) for n, v in out["retrieved"].items()}
    return out
