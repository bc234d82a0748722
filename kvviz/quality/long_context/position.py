"""Damage by position: KL(exact || format) and top-1 agreement at every position of a long text, each format's
cache read as stored, chunk by chunk, as an engine's chunked prefill reads it.

The pass: the text's first token goes in alone (a cache's first update hands attention the raw K/V; keeping it to
one token makes every later position read quantized K/V, kvviz.analysis.teacher_forced's first_chunk=1 rule), then
chunks of `chunk` tokens. Static scales (fp8's per-tensor or per-head scale, nvfp4's global scale) are fitted on the
first chunk (`first_chunk_scales`), as a prefill of it would fit them, not on the lone first token. Each chunk runs through the exact model with a DynamicCache and through the model with
each format's kvviz.QuantizedKVCache (batch 1 each: `model(input_ids=chunk, cache=cache)`, the path the CPU
backend fuses), in lockstep: only one chunk's hidden states per run and one block of positions' log-probs are ever
held (Gemma 3's vocabulary is 262K: [32K, vocab] would not fit). The LM head runs on a block of positions at a time
(checks.LOGIT_BLOCK values); what the exact run's distribution gives every format (P, its lse, sum P z0) is formed
once per block and each format's KL taken against it in float64, read from the fp32 logits by kernels/cpu/logits.py
with P the one float64 buffer of the pass (`_Metrics`: kvviz.metrics.kl of the two log-softmaxes to float64
rounding; a format whose logits equal the exact ones gets KL 0).

Position p's values are those of the logits at token p (predicting token p + 1); position 0 reads no cache, so its
KL is 0. Smoothing is a trailing moving average (`smooth`); a format crosses a threshold at the first position whose
smoothed KL (a full window of positions) exceeds it (`crossings`).

    for upd in position_drift(model, tok, ["int4", "k8v4"], context=4096, chunk=512):
        draw(upd.smoothed(256))             # cumulative: every position measured so far
    upd.crossings((0.01, 0.05, 0.1))        # {name: {threshold: position or None}}
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
from transformers import DynamicCache

from kernels.cpu import logits as cpu_logits
from kvviz.cache import QuantizedKVCache, model_layer_types
from kvviz.analysis.teacher_forced import decoder, lm_logits
from kvviz.quality.long_context.checks import LOGIT_BLOCK, check_context, parse_formats
from kvviz.quality.long_context.text import long_text_ids

THRESHOLDS = (0.01, 0.05, 0.1)  # nats
WINDOW = 256  # positions of the default moving average


def smooth(x, window: int = WINDOW) -> np.ndarray:
    """Trailing moving average of x [n]: out[p] = mean(x[max(0, p - window + 1) .. p]) (fewer values at the
    start), float64."""
    if window < 1:
        raise ValueError(f"The smoothing window is a number of positions, at least 1; got {window}.")
    x = np.asarray(x, dtype=np.float64)
    c = np.concatenate([[0.0], np.cumsum(x)])
    p = np.arange(1, x.size + 1)
    lo = np.maximum(p - window, 0)
    return (c[p] - c[lo]) / (p - lo)


def crossings(kl_values, thresholds=THRESHOLDS, window: int = WINDOW) -> dict:
    """{threshold: the first position whose smoothed KL (smooth(kl_values, window)) exceeds it, or None}, counting
    only positions whose average holds a full window (p >= window - 1; every position when there are fewer): the
    first few positions' averages hold one or two values and would cross at once."""
    s = smooth(kl_values, window)
    start = min(window, s.size) - 1 if s.size else 0
    out = {}
    for t in thresholds:
        over = np.flatnonzero(s[start:] > t)
        out[float(t)] = int(over[0]) + start if over.size else None
    return out


def sliding_note(model) -> str:
    """What a curve shows on a model with sliding-window layers ("" when it has none)."""
    text = model.config.get_text_config(decoder=True)
    types = model_layer_types(model.config)
    sliding = sum(t in ("sliding_attention", "chunked_attention", "hybrid_sliding") for t in types)
    window = getattr(text, "sliding_window", None) or getattr(text, "attention_chunk_size", None)
    if not sliding or not window:
        return ""
    full = sum(t in ("full_attention", "hybrid") for t in types)
    return (f"{sliding} of the model's {len(types)} layers hold only the last {window:,} tokens (sliding window): past "
            f"position {window:,} their error no longer grows with the context, so the curve's growth beyond it is "
            f"what the {full} full-attention layer(s) do.")


@dataclass
class PositionDrift:
    """The cumulative result of a position pass (see the module docstring); each yield of position_drift."""

    names: list
    context: int
    chunk: int
    done_tokens: int
    done: bool
    kl: dict  # name -> np.ndarray float64 [done_tokens], nats
    top1: dict  # name -> np.ndarray bool [done_tokens]
    seconds: dict  # "exact", each name, "metrics" -> cumulative seconds
    note: str = ""
    tokens: list = field(default_factory=list)  # the text's token ids [context]

    @property
    def fraction(self) -> float:
        return self.done_tokens / self.context

    def smoothed(self, window: int = WINDOW) -> dict:
        return {n: smooth(self.kl[n], window) for n in self.names}

    def crossings(self, thresholds=THRESHOLDS, window: int = WINDOW) -> dict:
        return {n: crossings(self.kl[n], thresholds, window) for n in self.names}

    def rows(self, thresholds=THRESHOLDS, window: int = WINDOW) -> list[dict]:
        """One dict per format: mean KL, top-1 agreement, mean KL over the first and last 1,024 positions measured,
        the crossing position of each threshold (None: not crossed) and the format's seconds."""
        cross = self.crossings(thresholds, window)
        out = []
        for n in self.names:
            k, t = self.kl[n], self.top1[n]
            row = {"format": n, "positions": int(k.size), "mean_kl": float(k.mean()) if k.size else float("nan"),
                   "top1": float(t.mean()) if t.size else float("nan"),
                   "kl_first_1k": float(k[:1024].mean()) if k.size else float("nan"),
                   "kl_last_1k": float(k[-1024:].mean()) if k.size else float("nan")}
            row.update({f"cross_{th:g}": p for th, p in cross[n].items()})
            row["seconds"] = round(self.seconds.get(n, 0.0), 3)
            out.append(row)
        return out


def position_drift(model, tokenizer, formats, context: int = 4096, chunk: int = 512, text: str | None = None,
                   scales: dict | None = None, available: int | None = None) -> Iterator[PositionDrift]:
    """Damage by position, streamed: a generator of the cumulative PositionDrift after each chunk (the first token
    rides with the first chunk, so ceil((context - 1) / chunk) updates; the last has done=True).

    formats: specs or plans ("int4", "k8v4", "int4; 0,27=fp16", "vllm:int4_per_token_head", ...). text: the user's
    text (None: the WikiText-2 slice), cut or repeated to `context` tokens (text.long_text_ids). scales: static
    scales for per-tensor formats. available: free bytes for the memory check (None: this machine's).
    Raises ValueError at the call (before any compute) for bad input (kvviz.quality.long_context.checks)."""
    plans = parse_formats(formats, model)
    check_context(model, context, plans, chunk, available)
    ids, note = long_text_ids(tokenizer, context, text)
    ids = ids.to(model.device)
    first = ids[:, : min(1 + chunk, ids.shape[1])]
    caches = [QuantizedKVCache(model.config, p, scales=(scales or first_chunk_scales(model, p, first))
                               if p.takes_scale else None) for p in plans]
    notes = " ".join(n for n in (note, sliding_note(model)) if n)
    return _steps(model, ids, [p.name for p in plans], caches, chunk, notes)


@torch.no_grad()
def first_chunk_scales(model, plan, ids: torch.Tensor) -> dict:
    """{layer: (k_scale, v_scale)}: the static scales (per-tensor, per-head, nvfp4's global scale) a cache of `plan`
    fits on the text's first chunk ids [1, n]. The pass itself feeds the first token alone, and a scale fitted on one
    token (often an attention sink) would make every later token saturate or underflow; engines load calibrated
    scales instead. This is the same scale a prefill of that chunk fits, handed to the pass's cache."""
    probe = QuantizedKVCache(model.config, plan)
    decoder(model)(input_ids=ids, cache=probe, use_cache=True)
    return {i: (layer.k.static, layer.v.static) for i, layer in enumerate(probe.layers)
            if getattr(layer, "k", None) is not None and (layer.k.static is not None or layer.v.static is not None)}


class _Metrics:
    """KL(exact || format) and top-1 of each format's final hidden states against the exact run's, the LM head run
    on at most LOGIT_BLOCK values ([n, vocab]) at a time.

    Per block, from the exact logits z0: lse0 = lse(z0), P = exp(z0 - lse0), sum P and sum P z0; per format's
    logits z: lse(z), sum P z and argmax. KL = sum P (lp0 - lq) = (sum P z0 - sum P z) + (lse(z) - lse0) sum P, in
    float64 over the logits as the head gives them (kernels/cpu/logits.py: read from the fp32 logits, widened one
    value at a time; P the one float64 [n, vocab] buffer, made once per pass): equal to kvviz.metrics.kl of the two
    float64 log-softmaxes to float64 rounding (a test holds 1e-12 nats), and no [n, vocab] array made per format.
    Where z equals z0 (position 0; a format that stores K/V exactly) both terms are the same sums of the same
    numbers: KL 0 exactly."""

    def __init__(self, model):
        self.model = model
        self.vocab = model.get_output_embeddings().weight.shape[0]
        self.rows = max(1, LOGIT_BLOCK // self.vocab)
        self._p = None  # P: [rows, vocab] float64

    def _logits(self, hidden: torch.Tensor):
        """(logits [n, vocab] on the CPU, fp32 unless the model runs in float64; their argmax [n])."""
        logits = lm_logits(self.model, hidden)  # [n, vocab], the model's dtype and device
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()  # exact
        logits = logits.cpu()  # the KL is taken on the CPU, beside P (a GPU model's block: one copy)
        return logits, logits.argmax(-1)

    @torch.no_grad()
    def values(self, exact: torch.Tensor, hidden: list[torch.Tensor]):
        """(KL [n] float64 per format, top-1 [n] bool per format) of hidden [n, hidden] each against exact [n,
        hidden]."""
        n, size = exact.shape[0], self.rows
        if self._p is None:
            self._p = torch.empty(size, self.vocab, dtype=torch.float64)
        kls, tops = [[] for _ in hidden], [[] for _ in hidden]
        for a in range(0, n, size):
            p = self._p[: min(size, n - a)]
            z0, top0 = self._logits(exact[a : a + size])
            lse0 = cpu_logits.lse_rows(z0)
            p_sum = cpu_logits.probs_rows(z0, lse0, p)
            p_z0 = cpu_logits.dot_rows(p, z0)
            del z0
            for i, h in enumerate(hidden):
                z, top = self._logits(h[a : a + size])
                lse, p_z = cpu_logits.lse_rows(z), cpu_logits.dot_rows(p, z)
                kls[i].append((p_z0 - p_z + (lse - lse0) * p_sum).clamp(min=0.0))
                tops[i].append(top == top0)
        return [torch.cat(k).numpy() for k in kls], [torch.cat(t).numpy() for t in tops]


@torch.no_grad()
def _steps(model, ids: torch.Tensor, names: list, caches: list, chunk: int, note: str) -> Iterator[PositionDrift]:
    t = ids.shape[1]
    body = decoder(model)
    exact_cache = DynamicCache(config=model.config)
    bounds = [0, 1] + list(range(1 + chunk, t, chunk)) + [t]
    seconds = {"exact": 0.0, **{n: 0.0 for n in names}, "metrics": 0.0}
    kls, tops = [[] for _ in names], [[] for _ in names]
    metrics = _Metrics(model)
    pending = None  # the first token's hidden states, measured with the first chunk
    for a, b in zip(bounds[:-1], bounds[1:]):
        x = ids[:, a:b]
        t0 = time.perf_counter()
        exact = body(input_ids=x, cache=exact_cache, use_cache=True).last_hidden_state[0]  # [c, hidden]
        seconds["exact"] += time.perf_counter() - t0
        hidden = []
        for n, cache in zip(names, caches):
            t0 = time.perf_counter()
            hidden.append(body(input_ids=x, cache=cache, use_cache=True).last_hidden_state[0])
            seconds[n] += time.perf_counter() - t0
        if pending is not None:
            exact = torch.cat([pending[0], exact])
            hidden = [torch.cat([p, h]) for p, h in zip(pending[1], hidden)]
            pending = None
        elif a == 0 and b < t:
            pending = (exact, hidden)
            continue
        t0 = time.perf_counter()
        block_kl, block_top = metrics.values(exact, hidden)
        seconds["metrics"] += time.perf_counter() - t0
        for i in range(len(names)):
            kls[i].append(block_kl[i])
            tops[i].append(block_top[i])
        done = sum(k.size for k in kls[0])
        yield PositionDrift(list(names), t, chunk, done, b == t, {n: np.concatenate(k) for n, k in zip(names, kls)},
                            {n: np.concatenate(v) for n, v in zip(names, tops)}, dict(seconds), note,
                            ids[0].tolist() if b == t else [])
