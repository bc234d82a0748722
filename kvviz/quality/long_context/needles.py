"""Needle at length: several needles in one long haystack, each asked for from the same prefilled cache, at 2K-8K
tokens (kvviz.quality.needle asks one needle per haystack, which costs one long prefill per needle).

A haystack of `context` tokens (WikiText-2 filler, repeated with its marker where it must be) holds one needle per
depth, each a sentence naming its own key and number (" The secret number of the amber room is 48213."). It is
prefilled once through the exact model (a DynamicCache keeping every token, PREFILL_CHUNK tokens per forward).
Each question ("What is the secret number of the amber room?") is then read through the exact cache and through
each format's cache (its K/V quantized as stored) as a chunk, followed by a short greedy answer, every question
from the same prefix.

The questions run as the rows of a batch, under kvviz.rowstable.row_stable (each row's answer what it would be
alone), one batch per cache and question length: the keys tokenize to different lengths, and a batch takes only
questions of one length, so every row holds its own question's tokens, no padding. Through the exact cache the
rows are a RowStackCache of exact rows (kvviz.cache.row_stack), each reading the prefill as its own (a
full-precision mirror of the context per row, so a batch holds at most BATCH_BYTES of them: at 8K tokens all ten
of SmolLM2-135M's). Through a format's cache they are the rows of one copy of its QuantizedKVCache loaded from the
prefill (the prefill quantized once, its per-tensor or NVFP4 global scale fitted on it, then its packed codes
copied per question by reorder_cache): attention reads the packed bytes in place through the fused CPU kernels, as
for one cache alone, with no full-precision copy per row (a format's row of a RowStackCache mirrors the context in
full precision and is read a row at a time; on SmolLM2-135M at 2K the answers took about 5x as long that way).
Plans that are not batched answer one question at a time, batch 1, each through a copy of the cache loaded from
the prefill: an eviction (`int4 @ streaming:0.5`) and llama.cpp names (K/V in llama.cpp's layout).

`needles_per_depth` haystacks per context, each with its own stretch of filler and its own numbers: each depth's
point is found / needles_per_depth.

What this measures: whether the answer, reading the haystack's K/V as each format stores them, retrieves the number
of the key asked for, among as many same-shaped needles as depths (a key-value recall with distractors, harder
than a lone needle: a format may blur which number goes with which key). The haystack's own forward pass reads its
K/V exactly (one prefill shared by all formats), as a one-shot prefill over an unquantized prompt does; only the
question and the answer read the quantized cache (kvviz.quality.needle does the same).

    for upd in needle_at_length(model, tok, ["int4", "k8v4"], contexts=(2048, 4096, 8192)):
        upd.found[8192]["int4"]     # needles found per depth so far; upd.total[8192]: asked per depth
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from kvviz.analysis.llamacpp import runs_llamacpp
from kvviz.cache import QuantizedKVCache
from kvviz.cache.row_stack import RowStackCache
from kvviz.quality.corpus import wikitext
from kvviz.quality.decode import load_prefill, prefill
from kvviz.quality.long_context.checks import (check_context, check_depths, estimate_memory, mirror_bytes,
                                               parse_formats)
from kvviz.quality.long_context.text import encode, long_text_ids
from kvviz.quality.needle import greedy, rotated_filler
from kvviz.rowstable import row_stable

DEPTHS10 = tuple(round(i / 9, 4) for i in range(10))  # 0, 0.1111, ..., 1
CONTEXTS = (2048, 4096, 8192)
KEYS = ("amber", "birch", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kestrel",
        "lagoon", "meadow", "nutmeg", "opal", "prairie", "quartz", "river", "saffron", "tundra")
NEEDLE = " The secret number of the {key} room is {value}."
QUESTION = "\n\nQuestion: What is the secret number of the {key} room? Answer: The secret number of the {key} room is"
ANSWER_TOKENS = 7
PREFILL_CHUNK = 1024  # haystack tokens per forward of the exact prefill (bounds its attention scores)
BATCH_BYTES = 4 << 30  # exact rows' full-precision mirrors one batch holds (each row's context)


def _key(i: int) -> str:
    return KEYS[i] if i < len(KEYS) else f"{KEYS[i % len(KEYS)]}-{i // len(KEYS)}"


def haystack(tokenizer, context: int, depths, values, text: str | None = None,
             answer_tokens: int = ANSWER_TOKENS) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(prompt ids [1, T], question ids [1, q_i] per needle): filler with needle i (key _key(i), number values[i])
    at depths[i] of it, T + the longest question + answer_tokens <= context."""
    needles = [encode(tokenizer, NEEDLE.format(key=_key(i), value=v)) for i, v in enumerate(values)]
    questions = [encode(tokenizer, QUESTION.format(key=_key(i)))[None] for i in range(len(values))]
    n_fill = context - sum(n.numel() for n in needles) - max(q.shape[1] for q in questions) - answer_tokens
    if n_fill < 8 * len(needles):
        raise ValueError(f"A context of {context:,} tokens is too short for {len(needles)} needles; use at least "
                         f"{context - n_fill + 8 * len(needles):,} tokens, or fewer depths.")
    filler = long_text_ids(tokenizer, n_fill, text)[0][0]
    order = sorted(range(len(needles)), key=lambda i: depths[i])
    pieces, at = [], 0
    for i in order:  # depth d: after round(d * (n_fill - 1)) + 1 filler tokens (the first token stays first)
        cut = int(round(depths[i] * (n_fill - 1))) + 1
        pieces += [filler[at:cut], needles[i]]
        at = cut
    pieces.append(filler[at:])
    return torch.cat(pieces)[None], questions


def min_context(tokenizer, n_needles: int, answer_tokens: int = ANSWER_TOKENS) -> int:
    """The shortest context haystack() takes for n_needles (their sentences, the longest question, the answer and
    8 filler tokens per needle), sized with 5-digit numbers."""
    needles = sum(encode(tokenizer, NEEDLE.format(key=_key(i), value="88888")).numel() for i in range(n_needles))
    question = max(encode(tokenizer, QUESTION.format(key=_key(i))).numel() for i in range(n_needles))
    return needles + question + answer_tokens + 8 * n_needles + 2  # + 2: numbers that tokenize longer


@dataclass
class NeedleAtLength:
    """The cumulative needle-at-length result (see the module docstring), one update per haystack."""

    names: list  # "baseline" first, then the formats
    contexts: list
    depths: list
    needles_per_depth: int
    done: bool = False
    haystacks_done: int = 0
    found: dict = field(default_factory=dict)  # context -> name -> [found per depth]
    total: dict = field(default_factory=dict)  # context -> [needles asked per depth]
    answers: dict = field(default_factory=dict)  # context -> name -> [answer text per question, in order]
    values: dict = field(default_factory=dict)  # context -> [number per question, in order]
    seconds: float = 0.0

    @property
    def fraction(self) -> float:
        return self.haystacks_done / (len(self.contexts) * self.needles_per_depth)

    def rows(self) -> list[dict]:
        """One dict per (context, format, depth): found, total and rate."""
        return [{"context": c, "format": n, "depth": d, "found": self.found[c][n][i], "total": self.total[c][i],
                 "rate": self.found[c][n][i] / self.total[c][i] if self.total[c][i] else None}
                for c in self.found for n in self.names for i, d in enumerate(self.depths)]


def needle_at_length(model, tokenizer, formats, contexts=CONTEXTS, depths=DEPTHS10, needles_per_depth: int = 5,
                     text: str | None = None, seed: int = 0, answer_tokens: int = ANSWER_TOKENS,
                     available: int | None = None) -> Iterator[NeedleAtLength]:
    """Needle at length, streamed: the cumulative NeedleAtLength after each haystack (needles_per_depth per
    context), the last with done=True. Raises ValueError at the call for bad input: depths out of [0, 1], a
    context beyond the model's positions or the free memory, needles_per_depth < 1, an unknown format."""
    plans = parse_formats(formats, model)
    depths = check_depths(depths)
    if isinstance(needles_per_depth, bool) or not isinstance(needles_per_depth, int) or needles_per_depth < 1:
        raise ValueError(f"needles_per_depth is how many needles to ask at each depth, a whole number from 1; got "
                         f"{needles_per_depth!r}.")
    contexts = [int(c) for c in contexts]
    if not contexts:
        raise ValueError("Give at least one needle context, e.g. 2048,4096,8192.")
    shortest = min_context(tokenizer, len(depths), answer_tokens)
    rows = {}
    for c in contexts:
        if c < shortest:
            raise ValueError(f"A needle context of {c:,} tokens is too short for {len(depths)} needles; use at least "
                             f"{shortest:,} tokens, or fewer depths.")
        rows[c] = _exact_rows(model, c, plans, len(depths), available)
    return _steps(model, tokenizer, plans, contexts, depths, needles_per_depth, text, seed, answer_tokens, rows)


def _own_cache(plan) -> bool:
    """Whether a plan answers one question at a time (see the module docstring)."""
    return plan.evict is not None or runs_llamacpp(plan)


def _exact_rows(model, context: int, plans, questions: int, available: int | None) -> int:
    """How many exact rows (questions through the exact cache) one batch holds at `context` tokens: as many as
    BATCH_BYTES of their mirrors hold and the free memory allows, at most every question, at least one
    (ValueError, from check_context, when even one does not fit)."""
    rows = max(1, min(questions, BATCH_BYTES // mirror_bytes(model, context)))
    while rows > 1 and not estimate_memory(model, context, plans, PREFILL_CHUNK, available, rows=rows,
                                           questions=questions).fits:
        rows -= 1
    check_context(model, context, plans, chunk=PREFILL_CHUNK, available=available, rows=rows, questions=questions)
    return rows


def _by_length(questions: list[torch.Tensor]) -> list[list[int]]:
    """The questions' indices grouped by token length, in order of first appearance."""
    groups: dict[int, list[int]] = {}
    for i, q in enumerate(questions):
        groups.setdefault(q.shape[1], []).append(i)
    return list(groups.values())


def _exact_answers(model, exact, questions: list[torch.Tensor], answer_tokens: int, rows: int) -> list[list[int]]:
    """Each question's answer (ids) through the exact cache: the questions of one token length as rows of a
    RowStackCache of exact rows, up to `rows` a batch, each reading the prefill `exact` as its own."""
    out: list = [None] * len(questions)
    for group in _by_length(questions):
        reserve = questions[group[0]].shape[1] + answer_tokens
        for at in range(0, len(group), rows):
            batch = group[at : at + rows]
            stack = RowStackCache(model.config, [None] * len(batch))
            stack.load_prefill(exact, reserve=reserve)
            answers = greedy(model, stack, torch.cat([questions[i] for i in batch]), answer_tokens)
            del stack
            for i, answer in zip(batch, answers):
                out[i] = answer
    return out


def _format_answers(model, cache, questions: list[torch.Tensor], answer_tokens: int) -> list[list[int]]:
    """Each question's answer (ids) through a format's cache loaded from the prefill (left as it is): the questions
    of one token length as the rows of one copy of it (reorder_cache: packed codes copied, nothing re-quantized)."""
    out: list = [None] * len(questions)
    for group in _by_length(questions):
        run = copy.deepcopy(cache)
        run.reorder_cache(torch.zeros(len(group), dtype=torch.long))  # [1, ...] -> [len(group), ...] per layer
        for i, answer in zip(group, greedy(model, run, torch.cat([questions[i] for i in group]), answer_tokens)):
            out[i] = answer
        del run
    return out


@torch.no_grad()
def _prefill(model, prompt: torch.Tensor):
    """The haystack through the exact model, PREFILL_CHUNK tokens per forward: a DynamicCache keeping every token
    (sliding layers' too), as kvviz.quality.decode.prefill holds it."""
    exact, _ = prefill(model, prompt[:, :PREFILL_CHUNK])
    for a in range(PREFILL_CHUNK, prompt.shape[1], PREFILL_CHUNK):
        model(input_ids=prompt[:, a : a + PREFILL_CHUNK].to(model.device), cache=exact, use_cache=True,
              logits_to_keep=1)
    return exact


@torch.no_grad()
def _answers(model, exact, plans, questions: list[torch.Tensor], answer_tokens: int, rows: int) -> list[list]:
    """Every question's answer (ids) through the exact cache and each plan's, all loaded from the prefill `exact`:
    [cache][question], cache 0 the exact one (see the module docstring)."""
    out: dict[int, list] = {}
    with row_stable(model):  # each row's answer as it would be alone
        out[-1] = _exact_answers(model, exact, questions, answer_tokens, rows)
        for j, plan in enumerate(plans):
            if not _own_cache(plan):
                out[j] = _format_answers(model, load_prefill(QuantizedKVCache(model.config, plan), exact), questions,
                                         answer_tokens)
    for j, plan in enumerate(plans):
        if _own_cache(plan):  # one question at a time, batch 1, each through a copy of the loaded cache
            cache = load_prefill(QuantizedKVCache(model.config, plan), exact)
            out[j] = [greedy(model, copy.deepcopy(cache), q, answer_tokens)[0] for q in questions]
            del cache
    return [out[j] for j in range(-1, len(plans))]


@torch.no_grad()
def _steps(model, tokenizer, plans, contexts, depths, per, text, seed, answer_tokens,
           rows: dict) -> Iterator[NeedleAtLength]:
    names = ["baseline"] + [p.name for p in plans]
    res = NeedleAtLength(names, list(contexts), list(depths), per)
    rng = random.Random(seed)
    filler = text if text is not None else wikitext()
    t0 = time.perf_counter()
    for c in contexts:
        res.found[c] = {n: [0] * len(depths) for n in names}
        res.total[c] = [0] * len(depths)
        res.answers[c] = {n: [] for n in names}
        res.values[c] = []
        for k in range(per):
            values = rng.sample(range(10000, 100000), len(depths))
            prompt, questions = haystack(tokenizer, c, depths, [str(v) for v in values], rotated_filler(filler, k, per),
                                         answer_tokens)
            ids = _answers(model, _prefill(model, prompt), plans, questions, answer_tokens, rows[c])
            for i in range(len(questions)):
                res.values[c].append(values[i])
                res.total[c][i] += 1
                for n, by_question in zip(names, ids):
                    answer = tokenizer.decode(by_question[i], skip_special_tokens=True)
                    res.answers[c][n].append(answer)
                    res.found[c][n][i] += str(values[i]) in answer.replace(" ", "")
            res.haystacks_done += 1
            res.seconds = time.perf_counter() - t0
            res.done = res.haystacks_done == len(contexts) * per
            yield copy.deepcopy(res)
