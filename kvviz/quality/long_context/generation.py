"""Damage by generation length: a long greedy generation per format beside the exact run, after the same prompt.

It is kvviz.quality.compare_stream (one batch: the exact greedy row, and per format a teacher-forced row fed the
exact run's tokens and a free-running row fed its own), read for the long-generation symptoms:

- first divergence: the first step whose free-running token differs from the exact run's;
- top-1 differs: the share of decode steps whose teacher-forced top-1 differs from the exact run's (along the
  exact continuation, so it does not stop counting at the first divergence);
- repetition: the share of 4-grams (repeated_ngrams) that already occurred earlier in the generation, over the
  whole generation and over the n-grams that start in its last half: a "repetition wall" (a format that starts
  looping as the generation grows) shows as a last-half share well above the exact run's.

    for upd in generation_drift(model, tok, ["int4", "k8v4"], new_tokens=512):
        show(upd.texts)                     # partial texts every `every` steps; metrics on the last (done=True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from kvviz.quality.compare import compare_stream
from kvviz.quality.long_context.checks import check_context, check_new_tokens, max_positions, model_name, \
    parse_formats
from kvviz.quality.long_context.text import long_text_ids

NGRAM = 4


def repeated_ngrams(tokens, n: int = NGRAM, start: int = 0) -> float:
    """The share of the n-grams of `tokens` starting at index >= start that already occurred (starting at an
    earlier index) in the list; 0.0 when there is none. [1, 2, 3, 1, 2, 3] with n=2: 2 of its 5 bigrams repeat."""
    tokens = list(tokens)
    seen, hits, total = set(), 0, 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        if i >= start:
            total += 1
            hits += gram in seen
        seen.add(gram)
    return hits / total if total else 0.0


def repetition(tokens, n: int = NGRAM) -> dict:
    """{"whole": repeated_ngrams over the list, "last_half": over the n-grams starting in its last half}."""
    return {"whole": repeated_ngrams(tokens, n), "last_half": repeated_ngrams(tokens, n, len(tokens) // 2)}


@dataclass
class GenerationDrift:
    """A generation-drift update (see the module docstring); the metrics are filled on the last one (done)."""

    names: list
    new_tokens: int
    steps_done: int
    done: bool
    prompt_text: str
    baseline_text: str
    texts: dict  # name -> free-running text so far
    baseline_ids: list = field(default_factory=list)
    token_ids: dict = field(default_factory=dict)  # name -> free-running ids
    first_divergence: dict = field(default_factory=dict)  # name -> step or None
    top1_differ: dict = field(default_factory=dict)  # name -> share of steps 1..N-1
    kl: dict = field(default_factory=dict)  # name -> np.ndarray [N - 1] nats, teacher-forced
    repetition: dict = field(default_factory=dict)  # "baseline" and each name -> {"whole", "last_half"}
    seconds: float = 0.0

    @property
    def fraction(self) -> float:
        return self.steps_done / self.new_tokens

    def rows(self) -> list[dict]:
        """One dict per format, the exact run first (its divergence None, its top-1 share 0)."""
        rows = [{"format": "baseline", "first_divergence": None, "top1_differ": 0.0, "mean_kl": 0.0,
                 "repeat4_whole": self.repetition.get("baseline", {}).get("whole"),
                 "repeat4_last_half": self.repetition.get("baseline", {}).get("last_half")}]
        for n in self.names:
            rep = self.repetition.get(n, {})
            k = self.kl.get(n)
            rows.append({"format": n, "first_divergence": self.first_divergence.get(n),
                         "top1_differ": self.top1_differ.get(n),
                         "mean_kl": float(k.mean()) if k is not None and k.size else None,
                         "repeat4_whole": rep.get("whole"), "repeat4_last_half": rep.get("last_half")})
        return rows


def generation_drift(model, tokenizer, formats, new_tokens: int = 256, prompt: str | None = None,
                     prompt_tokens: int = 256, every: int = 16, available: int | None = None) \
        -> Iterator[GenerationDrift]:
    """Damage by generation length, streamed: a GenerationDrift every `every` steps and a last one (done=True)
    with the metrics. prompt: the text to continue (None: the first `prompt_tokens` tokens of the WikiText-2
    slice). Raises ValueError at the call for bad input: new_tokens < 2, an unknown format, prompt + new tokens
    beyond the model's positions or the free memory."""
    check_new_tokens(new_tokens)
    plans = parse_formats(formats, model)
    if prompt is None:
        ids, _ = long_text_ids(tokenizer, prompt_tokens)
    elif not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("The prompt is empty; write a prompt, or leave it out to continue the WikiText-2 slice.")
    else:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    total = ids.shape[1] + new_tokens
    limit = max_positions(model)
    if limit is not None and total > limit:
        raise ValueError(f"The prompt ({ids.shape[1]:,} tokens) and {new_tokens:,} new tokens make {total:,}, beyond "
                         f"{model_name(model)}'s {limit:,} positions; ask for at most {limit - ids.shape[1]:,} new "
                         "tokens.")
    # the batch holds 1 + 2 rows per format, each a cache of `total` tokens and its dequantized mirror
    check_context(model, total, plans, chunk=ids.shape[1], available=available, copies=3)
    return _steps(model, tokenizer, ids, [p.name for p in plans], plans, new_tokens, max(1, every))


def _steps(model, tokenizer, ids, names, plans, new_tokens, every) -> Iterator[GenerationDrift]:
    prompt_text = tokenizer.decode(ids[0].tolist(), skip_special_tokens=True)
    for upd in compare_stream(model, tokenizer, ids, plans, max_new_tokens=new_tokens):
        steps = upd.step + 1
        if upd.report is None:
            if steps % every == 0 and steps < new_tokens:  # the last step comes with the report
                yield GenerationDrift(list(names), new_tokens, steps, False, prompt_text, upd.baseline,
                                      dict(upd.texts))
            continue
        rep = upd.report
        out = GenerationDrift(list(names), new_tokens, new_tokens, True, prompt_text, rep.baseline_text,
                              {r.name: r.text for r in rep.formats}, list(rep.baseline_ids), seconds=rep.seconds)
        out.repetition["baseline"] = repetition(rep.baseline_ids)
        for r in rep.formats:
            out.token_ids[r.name] = list(r.token_ids)
            out.first_divergence[r.name] = r.first_divergence
            out.top1_differ[r.name] = float(1.0 - np.asarray(r.top1, dtype=np.float64).mean()) if r.top1.size else 0.0
            out.kl[r.name] = np.asarray(r.kl, dtype=np.float64)
            out.repetition[r.name] = repetition(r.token_ids)
        yield out
