"""Needle in a haystack: a number hidden at depths 0..100% of WikiText filler; retrieved when the greedy answer
read back through each format's cache contains it (the seed: int4 loses mid-context recall).

The haystack (filler with the needle sentence at the given depth) is the prompt: one prefill, stored in every
format's cache. The question then goes through the cache as a chunk and the answer is decoded greedily, so both
read the needle from the quantized cache. All formats run as rows of one batch (kvviz.cache.row_stack).

A plan holding a `llama.cpp:` name answers as llama.cpp would (kvviz.analysis.llamacpp.greedy): the haystack and
the question as one prompt batch reading K/V as stored, with llama.cpp's matmul input rounding, then greedy steps;
one haystack at a time, outside the batch.

A plan with an eviction (`int4 @ snapkv:0.25`, kvviz.formats.eviction) answers outside the row batch, through a
QuantizedKVCache of its own whose rows are the batch's haystacks, read as that cache reads alone: the haystacks
prefill once, exact, and each haystack (the context) loads into the cache, compressed on that first update
(kvviz.quality.decode.load_prefill, SnapKV scoring it by the queries the prefill kept); the question then goes
through the compressed cache uncompressed, as kvpress runs it. This is where eviction fails: a needle the policy
dropped cannot be read back. With `alone=True` every plan and the baseline answer that way (Equal bytes).

    res = needle(model, tok, ["fp8_e4m3", "int4", "kivi2"], context_tokens=1024, needles_per_depth=4)
    res["rate"]          # {"baseline": 1.0, "fp8_e4m3": 1.0, "int4": 0.95, ...}
    res["depth_rates"]   # {name: [rate per depth]}
    res["retrieved"]     # {name: [bool per needle]}, depth by depth
"""

from __future__ import annotations

import random

import torch

from kvviz.analysis import llamacpp
from kvviz.cache import QuantizedKVCache, model_layer_types
from kvviz.cache.row_stack import RowStackCache
from kvviz.formats import as_plans
from kvviz.quality.corpus import wikitext
from kvviz.quality.decode import KeptCache, load_prefill, prefill, prefill_shared
from kvviz.quality.evicted import no_engine_eviction
from kvviz.rowstable import row_stable

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


_BATCH_TOKENS = 8192  # haystack tokens prefilled as one batch (bounds the prefill's activations and scores)
_BATCHABLE = {"full_attention", "sliding_attention"}  # layer types whose prefilled K/V tile across batch rows


def rotated_filler(text: str, k: int, n: int) -> str:
    """Needle k of n at one depth gets its own stretch of filler: the text started k/n of the way in (at a word
    boundary), wrapping around."""
    if k == 0:
        return text
    at = text.find(" ", k * len(text) // n) + 1
    return text[at:] + " " + text[:at]


@torch.no_grad()
def _answers(model, tokenizer, haystacks: list, batched: list, alone: list, scales,
             answer_tokens: int) -> list[list[str]]:
    """Greedy answers to each haystack's question: [haystack][plan], the plans of `batched` (None: the exact cache)
    read as rows of one row-stable batch (`_batched_answers`), then those of `alone` each through a cache of its own
    (`_alone_answers`). haystacks: (prompt ids [1, T], question ids [1, q]) pairs, all of one T and q."""
    questions = torch.cat([q for _, q in haystacks])  # [H, q]
    ids = _batched_answers(model, haystacks, batched, scales, answer_tokens) if batched else []
    if alone:
        ids += _alone_answers(model, torch.cat([p for p, _ in haystacks]), questions, alone, scales, answer_tokens)
    return [[tokenizer.decode(plan[i], skip_special_tokens=True) for plan in ids] for i in range(len(haystacks))]


def _batched_answers(model, haystacks: list, plans: list, scales, answer_tokens: int) -> list[list[list[int]]]:
    """The greedy answers (token ids, [plan][haystack][answer_tokens]) of every plan (None: the exact cache, no
    eviction) to every haystack, as rows of one batch, each row as it would be beside any other rows (row_stable).

    The prompts prefill as one batch [H, T], each run of filler they share from their start computed once
    (kvviz.quality.decode.prefill_shared: the depths of one filler share it up to the shallowest needle); its K/V
    load into one RowStackCache whose rows are tiled plan-major ([len(plans) * H, ...]: every plan's rows hold every
    haystack), read from the prefill's rows in place. A plan's rows share one cache, batched, unless the plan fits a
    scale on a cache's first update (per-tensor / per-head, NVFP4's global scale): over a shared cache that scale
    would be the batch's, and each haystack's must be its own, as it would be alone, so those rows get a cache each.
    """
    h = len(haystacks)
    questions = torch.cat([q for _, q in haystacks])  # [H, q]
    with row_stable(model):
        dyn = prefill_shared(model, [p for p, _ in haystacks])  # K/V [H, kv_heads, T, head_dim] per layer
        specs = [p for p in plans for _ in range(h)]
        own = {r for r, p in enumerate(specs) if p is not None and p.takes_scale}
        stack = RowStackCache(model.config, specs, scales=scales, own=own)
        stack.load_prefill(dyn, reserve=questions.shape[1] + answer_tokens)
        del dyn
        tokens = greedy(model, stack, questions.repeat(len(plans), 1), answer_tokens)  # [rows][answer_tokens]
    return [tokens[f * h:(f + 1) * h] for f in range(len(plans))]


def _alone_answers(model, prompts: torch.Tensor, questions: torch.Tensor, plans: list, scales,
                   answer_tokens: int) -> list[list[list[int]]]:
    """The greedy answers (token ids, [plan][haystack][answer_tokens]) to H haystacks (prompts [H, T], questions
    [H, q]) through a cache of each plan (None: the exact cache) read as it reads alone: its own kernels, outside
    row_stable. A plan's eviction compresses the prompt (its first update) and not the question, as kvpress runs it.

    The prompts prefill once, as one batch (kvviz.quality.decode.prefill, keeping SnapKV's window of queries):
    each row's K/V and queries are the bits its own prefill gives on the bundled models (the matrix products run
    over 4 rows or more either way). Each plan's cache loads them (load_prefill: what prefilling the prompt itself
    stores, compressed on that first update) and answers the H questions as the rows of one batch; a plan that
    fits a scale on its first update gets a cache per haystack. The rows' logits differ from a batch-1 cache's by
    float32 rounding (~3e-5 on SmolLM2: the decode steps' products run over H rows, not 1); at lesson 11's settings
    they answered as batch-1 caches prefilling their own haystack do, on both bundled models.
    """
    window = max((p.evict.window for p in plans if p is not None and p.evict is not None
                  and p.evict.policy == "snapkv"), default=0)
    prefilled, _ = prefill(model, prompts, queries=window)
    out = []
    for plan in plans:
        if plan is None:
            out.append(greedy(model, load_prefill(KeptCache(model.config), prefilled), questions, answer_tokens))
        elif not plan.takes_scale:  # static scales reach only formats that take them, as in the row batch
            cache = load_prefill(QuantizedKVCache(model.config, plan), prefilled)
            out.append(greedy(model, cache, questions, answer_tokens))
        else:
            out.append([greedy(model, load_prefill(QuantizedKVCache(model.config, plan, scales=scales), prefilled, r),
                                questions[r : r + 1], answer_tokens)[0] for r in range(questions.shape[0])])
    return out


def greedy(model, cache, inp: torch.Tensor, answer_tokens: int) -> list[list[int]]:
    """`answer_tokens` greedy tokens of each row after inp [rows, q] (read through `cache` as one chunk):
    [rows][answer_tokens]."""
    inp, tokens = inp.to(model.device), []
    for _ in range(answer_tokens):
        logits = model(input_ids=inp, cache=cache, use_cache=True, logits_to_keep=1).logits  # [rows, 1, vocab]
        nxt = logits[:, -1].argmax(-1)  # [rows]
        tokens.append(nxt.tolist())
        inp = nxt[:, None]
    return [list(row) for row in zip(*tokens)]


def _llamacpp_answer(model, tokenizer, haystack: tuple, plan, vec_dot: dict, answer_tokens: int) -> str:
    """llama.cpp's greedy answer to one haystack (prompt ids [1, T], question ids [1, q]) with a cache of `plan`."""
    prompt, question = haystack
    tokens = llamacpp.greedy(model, torch.cat([prompt, question], dim=1), plan, vec_dot)
    return tokenizer.decode([next(tokens) for _ in range(answer_tokens)], skip_special_tokens=True)


@torch.no_grad()
def needle(model, tokenizer, specs: list[str], context_tokens: int = 1024, depths=DEPTHS, seed: int = 0,
           answer_tokens: int = 6, scales: dict | None = None, text: str | None = None,
           needles_per_depth: int = 1, alone: bool = False) -> dict:
    """Retrieval against depth for the baseline and every spec, `needles_per_depth` needles at each depth (each a
    different number in its own stretch of the filler), so each depth's point is a rate.

    Returns {"depths": [...], "context_tokens": int, "needles_per_depth": int, "needles": [value per trial],
    "trial_depths": [depth per trial], "answers": {name: [text per trial]}, "retrieved": {name: [bool per trial]},
    "depth_rates": {name: [rate per depth]}, "rate": {name: float}} with name "baseline" first, then the specs as
    given; the trials run depth by depth, `needles_per_depth` at each.

    On attention-only models the haystacks run as batches (up to 8,192 prompt tokens each): one prefill, then
    every format's rows of every haystack answer together. Models with state layers (linear attention, Mamba) run
    one haystack at a time.
    alone: the baseline and every plan answer as eviction plans always do, each through a cache of its own read as
    it reads alone (its kernels, outside row_stable; `_alone_answers`), not as rows of the row-stable batch: Equal
    bytes reads its candidates so, eviction or not, as it measures their KL.
    """
    if isinstance(needles_per_depth, bool) or not isinstance(needles_per_depth, int) or needles_per_depth < 1:
        raise ValueError(f"needles_per_depth is how many needles to hide at each depth, a whole number from 1, got "
                         f"{needles_per_depth!r}.")
    kvs = as_plans(specs, model.config.get_text_config(decoder=True).num_hidden_layers)  # specs or plans
    names = ["baseline"] + [p.name for p in kvs]
    rng = random.Random(seed)
    filler = text if text is not None else wikitext()
    trials = [(depth, str(rng.randint(10000, 99999)), k) for depth in depths for k in range(needles_per_depth)]
    built = [haystack(tokenizer, context_tokens, depth, value, rotated_filler(filler, k, needles_per_depth))
             for depth, value, k in trials]
    per_batch = max(1, _BATCH_TOKENS // context_tokens)
    if not set(model_layer_types(model.config)) <= _BATCHABLE:
        per_batch = 1
    by_shape: dict = {}  # haystacks batch only with their equals in prompt and question length
    for i, (prompt, question) in enumerate(built):
        by_shape.setdefault((prompt.shape[1], question.shape[1]), []).append(i)
    engine = [j for j, p in enumerate(kvs) if llamacpp.runs_llamacpp(p)]  # answer as llama.cpp answers
    for j in engine:
        no_engine_eviction(kvs[j])
    # -1: the exact cache; the rest read as rows of the row-stable batch, or (eviction, `alone`) a cache each
    own = [j for j in range(-1, len(kvs)) if j not in engine and (alone or j >= 0 and kvs[j].evict is not None)]
    batched = [j for j in range(-1, len(kvs)) if j not in engine and j not in own]
    vec_dot = llamacpp.weight_vec_dot(model) if engine else {}
    answers: list = [None] * len(trials)
    plans = lambda js: [None if j < 0 else kvs[j] for j in js]  # noqa: E731
    for group in by_shape.values():
        for at in range(0, len(group), per_batch):
            batch = group[at:at + per_batch]
            for i, texts in zip(batch, _answers(model, tokenizer, [built[i] for i in batch], plans(batched),
                                                plans(own), scales, answer_tokens)):
                by_format = dict(zip([*batched, *own], texts))
                for j in engine:
                    by_format[j] = _llamacpp_answer(model, tokenizer, built[i], kvs[j], vec_dot, answer_tokens)
                answers[i] = [by_format[j] for j in range(-1, len(kvs))]
    out = {"depths": list(depths), "context_tokens": context_tokens, "needles_per_depth": needles_per_depth,
           "needles": [value for _, value, _ in trials], "trial_depths": [depth for depth, _, _ in trials],
           "answers": {n: [a[r] for a in answers] for r, n in enumerate(names)}}
    out["retrieved"] = {n: [value in answer.replace(" ", "") for value, answer in zip(out["needles"], texts)]
                        for n, texts in out["answers"].items()}
    per = needles_per_depth
    out["depth_rates"] = {n: [sum(hits[d * per:(d + 1) * per]) / per for d in range(len(depths))]
                          for n, hits in out["retrieved"].items()}
    out["rate"] = {n: sum(v) / len(v) for n, v in out["retrieved"].items()}
    return out
