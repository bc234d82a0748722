"""KL divergence of KV formats and plans against the exact model, with every position reading the quantized cache,
as in an engine; and `kld()`, llama.cpp's KLD statistics over WikiText-2 windows.

How a window of T tokens runs (`row_values`): one batch, one row per candidate (each row its own format or per-layer
plan, kvviz.quality.rows.RowStackCache) plus an exact row for the baseline. The first `first_chunk` tokens (default
1) go in alone: a cache's first update hands attention the raw K/V, so keeping that chunk to one token means every
later position reads quantized K/V, as llama.cpp does (it quantizes the prompt's K/V before attention reads them;
vLLM's prefill instead attends to its own unquantized K/V). The rest goes through in chunks of `chunk` tokens
(default: all at once): each chunk's queries read the quantized history and their own tokens as the cache stores
them (it quantizes on append, before attention reads), so for per-token formats the chunk size does not change
the result; for per-channel (KIVI) formats a group's scales may see later tokens of the same chunk.
Positions `score_from`..T-2 are scored (logits at t predict token t+1). The decoder body runs once per chunk for
all rows; logits are formed one row at a time from the body's hidden states, so memory stays at one [T, vocab].

    report = kld(model, tok, ["fp8_e4m3", "int4", "int4; 0,29=fp16"])   # {spec: stats}, kvviz.quality.kld keys
    base = base_logprobs(model, tok)          # saved once (save_base / load_base) and reused: kld(..., base=base)
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvviz.plan import parse_plan
from kvviz.quality.kld import summarize
from kvviz.quality.perplexity import wikitext
from kvviz.quality.rows import RowStackCache

BASE_FORMAT = "kvviz-kld-base/1"


def _raw_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The causal LM head on decoder hidden states [T, hidden] -> logits [T, vocab] (the model's dtype), with
    Gemma's final logit softcapping where the config has it."""
    logits = model.get_output_embeddings()(hidden)
    cap = getattr(model.config.get_text_config(decoder=True), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """[T, hidden] -> float64 log-softmax [T, vocab]."""
    return torch.log_softmax(_raw_logits(model, hidden).double(), dim=-1)


class _Base:
    """What every candidate row is compared with, computed once per window: the exact model's log-probs lp
    [N, vocab] (float64), P = exp(lp), sum_i P_i lp_i, sum_i P_i, argmax and -lp(target)."""

    def __init__(self, lp: torch.Tensor, targets: torch.Tensor):
        self.lp, self.targets = lp, targets
        self.p = lp.exp()
        self.p_lp = torch.where(self.p > 0, self.p * lp, torch.zeros_like(lp)).sum(-1)  # [N]
        self.p_sum = self.p.sum(-1)
        self.top = lp.argmax(-1)
        self.nll = -lp.gather(-1, targets[:, None])[:, 0]

    def values(self, logits: torch.Tensor):
        """Per-position (kld, nll, nll_base, same_top) [N] of a candidate's logits [N, vocab], the same numbers as
        kvviz.quality.kld.per_position without forming the candidate's log-softmax: with lq = z - lse(z),
        KL = sum P lp - sum P z + lse(z) sum P (two passes over the vocabulary instead of six)."""
        z = logits.double()
        lse = torch.logsumexp(z, dim=-1)  # [N]
        kld = self.p_lp - torch.linalg.vecdot(self.p, z) + lse * self.p_sum
        nll = lse - z.gather(-1, self.targets[:, None])[:, 0]
        return kld, nll, self.nll, z.argmax(-1) == self.top


@torch.no_grad()
def row_hidden(model, ids: torch.Tensor, rows: list, first_chunk: int = 1, chunk: int | None = None,
               scales: dict | None = None) -> torch.Tensor:
    """Final hidden states [rows, T, hidden] of the same tokens ids [1, T] through one RowStackCache whose row r
    holds rows[r] (a spec, a plan, or None: exact), fed in chunks (see the module docstring)."""
    n, t = len(rows), ids.shape[1]
    if not 1 <= first_chunk < t:
        raise ValueError(f"first_chunk must be in 1..{t - 1} for a window of {t} tokens; got {first_chunk}.")
    stack = RowStackCache(model.config, rows, scales=scales)
    body = model.get_decoder()
    batch = ids.expand(n, -1)  # [rows, T]
    bounds = [0, first_chunk] + list(range(first_chunk + (chunk or t), t, chunk or t)) + [t]
    hidden = [body(input_ids=batch[:, a:b], cache=stack, use_cache=True).last_hidden_state
              for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    return torch.cat(hidden, dim=1)  # [rows, T, hidden]


def _check_score_from(score_from: int, t: int) -> None:
    if not 1 <= score_from <= t - 2:
        raise ValueError(f"score_from must be in 1..{t - 2} for a window of {t} tokens (position 0 reads no "
                         f"cache); got {score_from}.")


@torch.no_grad()
def row_values(model, ids: torch.Tensor, rows: list, first_chunk: int = 1, chunk: int | None = None,
               score_from: int = 1, base: torch.Tensor | None = None, scales: dict | None = None):
    """Per-position KL values of every row against the exact model on one window ids [1, T].

    rows: one spec / plan per candidate (a plan: a list of one spec per layer, None = that layer exact).
    base: the exact model's log-probs [N, vocab] at the scored positions, when already known (saved); else an
    exact row runs in the same batch. Returns (values, base): values[r] = (kld, nll, nll_base, same_top), each [N]
    with N = T - 1 - score_from (as kvviz.quality.kld.per_position gives them), and the base log-probs [N, vocab].
    """
    t = ids.shape[1]
    _check_score_from(score_from, t)
    run = rows if base is not None else [None] + list(rows)
    hidden = row_hidden(model, ids, run, first_chunk, chunk, scales)[:, score_from : t - 1]  # [R, N, hidden]
    targets = ids[0, score_from + 1 :]  # [N]
    if base is None:
        base = _logits(model, hidden[0])
        hidden = hidden[1:]
    elif base.shape[0] != targets.shape[0]:
        raise ValueError(f"The saved baseline has {base.shape[0]} positions per window; this run scores "
                         f"{targets.shape[0]}. Use the window settings it was saved with.")
    ref = _Base(base, targets)
    return [ref.values(_raw_logits(model, h)) for h in hidden], base


def _windows(tokenizer, text: str | None, windows: int, window_tokens: int) -> torch.Tensor:
    """[windows, window_tokens] consecutive, non-overlapping token windows of the text (WikiText-2 by default)."""
    if windows < 1 or window_tokens < 3:
        raise ValueError(f"need windows >= 1 and window_tokens >= 3; got {windows} and {window_tokens}.")
    ids = tokenizer(text if text is not None else wikitext(), return_tensors="pt")["input_ids"][0]
    need = windows * window_tokens
    if ids.shape[0] < need:
        raise ValueError(f"The text has {ids.shape[0]} tokens; {windows} windows of {window_tokens} need {need}. "
                         f"Ask for fewer or shorter windows.")
    return ids[:need].view(windows, window_tokens)


def base_logprobs(model, tokenizer, text: str | None = None, windows: int = 2, window_tokens: int = 512,
                  score_from: int | None = None) -> dict:
    """The exact model's log-probs at the scored positions of every window, to save once and reuse (as
    llama-perplexity's --kl-divergence-base): {"format", "model", "windows", "window_tokens", "score_from",
    "tokens": [windows, window_tokens] int64, "logprobs": [windows, N, vocab] float32}. float32 keeps the KL exact
    to ~1e-7 nats; the file holds windows x N x vocab x 4 bytes (2 x 255 x 49152 x 4 = 100 MB for SmolLM2)."""
    score_from = window_tokens // 2 if score_from is None else score_from
    wins = _windows(tokenizer, text, windows, window_tokens)
    _check_score_from(score_from, window_tokens)
    body = model.get_decoder()
    lps = []
    with torch.no_grad():
        for w in wins:
            h = body(input_ids=w[None].to(model.device)).last_hidden_state[0, score_from : window_tokens - 1]
            lps.append(_logits(model, h).float())
    return {"format": BASE_FORMAT, "model": getattr(model.config, "_name_or_path", ""), "windows": windows,
            "window_tokens": window_tokens, "score_from": score_from, "tokens": wins, "logprobs": torch.stack(lps)}


def save_base(base: dict, path: str | Path) -> None:
    torch.save(base, Path(path))


def load_base(path: str | Path) -> dict:
    """A baseline written by save_base; ValueError when the file is missing or is not one."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"No baseline file at {p}; write one with `python -m kvviz kld --save-base {p}`.")
    base = torch.load(p, map_location="cpu", weights_only=True)
    if not isinstance(base, dict) or base.get("format") != BASE_FORMAT:
        raise ValueError(f"{p} is not a kvviz KLD baseline (written by `python -m kvviz kld --save-base`).")
    return base


def kld(model, tokenizer, specs: list, text: str | None = None, windows: int = 2, window_tokens: int = 512,
        score_from: int | None = None, first_chunk: int = 1, chunk: int | None = None, base: dict | None = None,
        scales: dict | None = None) -> dict:
    """llama.cpp's KLD statistics of each spec or plan against the exact model, over `windows` consecutive
    windows of `window_tokens` tokens of WikiText-2's test text (or `text`).

    specs: specs ("int4", "k8v4"), plan strings ("int4; 0,29=fp16") or per-layer lists. Positions
    score_from..window_tokens-2 of each window are scored (default: the second half, as llama.cpp scores each
    context); first_chunk / chunk: see the module docstring. base: a saved baseline (base_logprobs / load_base),
    whose windows, text tokens and settings are then used; else the exact model runs beside the candidates.
    Returns {name: stats} in the order given, stats keyed as kvviz.quality.kld.STAT_KEYS (nats, fractions).
    """
    if isinstance(specs, str) or not specs:
        raise ValueError("specs must be a non-empty list of KV specs or plans, e.g. ['fp8_e4m3', 'int4; 0=fp16'].")
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    names = [s if isinstance(s, str) else str(list(s)) for s in specs]
    plans = [parse_plan(s, n_layers) for s in specs]  # checked before any compute
    if base is not None:
        wins, score_from = base["tokens"], base["score_from"]
        if base["logprobs"].shape[-1] != model.get_output_embeddings().weight.shape[0]:
            raise ValueError("The saved baseline's vocabulary differs from this model's: it was saved from another "
                             "model. Save a new one with --save-base.")
    else:
        wins = _windows(tokenizer, text, windows, window_tokens)
        score_from = wins.shape[1] // 2 if score_from is None else score_from
    parts: list[list[tuple]] = [[] for _ in plans]
    for w, ids in enumerate(wins):
        saved = None if base is None else base["logprobs"][w].double()
        values, _ = row_values(model, ids[None].to(model.device), plans, first_chunk, chunk, score_from, saved,
                               scales)
        for acc, v in zip(parts, values):
            acc.append(v)
    return {name: summarize(*(torch.cat(col) for col in zip(*acc))) for name, acc in zip(names, parts)}

