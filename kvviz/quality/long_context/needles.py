"""Needle at length: several needles in one long haystack, each asked for from the same prefilled cache, at 2K-8K
tokens (kvviz.quality.needle asks one needle per haystack, which costs one long prefill per needle).

A haystack of `context` tokens (WikiText-2 filler, repeated with its marker where it must be) holds one needle per
depth, each a sentence naming its own key and number (" The secret number of the amber room is 48213."). It is
prefilled once through the exact model (a DynamicCache, PREFILL_CHUNK tokens per forward); its K/V load into each
format's kvviz.QuantizedKVCache (quantized as stored, kvviz.quality.decode.load_prefill), and each question ("What
is the secret number of the amber room?") goes through each cache as a chunk, followed by a short greedy answer;
after each answer the cache is put back as it was after the prefill (the exact cache cropped where its layers
allow, else restored from a copy, a format's cache from a copy), so every question reads the same prefix.
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
from transformers.cache_utils import DynamicLayer

from kvviz.cache import QuantizedKVCache
from kvviz.quality.decode import load_prefill, prefill
from kvviz.quality.long_context.checks import check_context, check_depths, parse_formats
from kvviz.quality.long_context.text import encode, long_text_ids
from kvviz.quality.needle import rotated_filler
from kvviz.quality.corpus import wikitext

DEPTHS10 = tuple(round(i / 9, 4) for i in range(10))  # 0, 0.1111, ..., 1
CONTEXTS = (2048, 4096, 8192)
KEYS = ("amber", "birch", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kestrel",
        "lagoon", "meadow", "nutmeg", "opal", "prairie", "quartz", "river", "saffron", "tundra")
NEEDLE = " The secret number of the {key} room is {value}."
QUESTION = "\n\nQuestion: What is the secret number of the {key} room? Answer: The secret number of the {key} room is"
ANSWER_TOKENS = 7
PREFILL_CHUNK = 1024  # haystack tokens per forward of the exact prefill (bounds its attention scores)


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
    for c in contexts:  # the exact cache, a copy of it and each format's cache with its copy
        if c < shortest:
            raise ValueError(f"A needle context of {c:,} tokens is too short for {len(depths)} needles; use at least "
                             f"{shortest:,} tokens, or fewer depths.")
        check_context(model, c, plans, chunk=PREFILL_CHUNK, available=available, copies=2)
    return _steps(model, tokenizer, plans, contexts, depths, needles_per_depth, text, seed, answer_tokens)


def _croppable(cache) -> bool:
    return all(type(layer) is DynamicLayer for layer in cache.layers)


@torch.no_grad()
def _answer(model, cache, question: torch.Tensor, answer_tokens: int) -> list[int]:
    """The greedy answer (answer_tokens ids) to question ids [1, q] read through cache (which it grows)."""
    inp, out = question.to(model.device), []
    for _ in range(answer_tokens):
        logits = model(input_ids=inp, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        out.append(int(logits.argmax()))
        inp = torch.tensor([[out[-1]]], device=model.device)
    return out


@torch.no_grad()
def _steps(model, tokenizer, plans, contexts, depths, per, text, seed, answer_tokens) -> Iterator[NeedleAtLength]:
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
            exact, _ = prefill(model, prompt[:, :PREFILL_CHUNK])  # every token kept, sliding layers' too
            for a in range(PREFILL_CHUNK, prompt.shape[1], PREFILL_CHUNK):
                model(input_ids=prompt[:, a : a + PREFILL_CHUNK].to(model.device), cache=exact, use_cache=True,
                      logits_to_keep=1)
            n0 = exact.get_seq_length()
            caches = [exact] + [load_prefill(QuantizedKVCache(model.config, p), exact) for p in plans]
            for i, question in enumerate(questions):
                res.values[c].append(values[i])
                res.total[c][i] += 1
                for n, cache in zip(names, caches):
                    crop = _croppable(cache)
                    run = cache if crop else copy.deepcopy(cache)
                    answer = tokenizer.decode(_answer(model, run, question, answer_tokens), skip_special_tokens=True)
                    if crop:
                        cache.crop(n0 - cache.get_seq_length())  # a negative count: tokens to drop
                    res.answers[c][n].append(answer)
                    res.found[c][n][i] += str(values[i]) in answer.replace(" ", "")
            res.haystacks_done += 1
            res.seconds = time.perf_counter() - t0
            res.done = res.haystacks_done == len(contexts) * per
            yield copy.deepcopy(res)
