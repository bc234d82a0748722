"""Equal bytes: every way to spend one KV-cache byte budget (drop bits, drop tokens, both, or keep the dropped
tokens in fewer bits), each fitted to the same bytes and measured on the same context.

"More Tokens, Lower Precision" (EMNLP 2025 Findings) finds that about 4x more tokens at 4 bits beat 1x at 16 bits,
most on retrieval; MiKV, ZipCache and RDKV keep evicted tokens at low precision instead of dropping them. This
module runs that comparison on a model and a context: for a budget given as a fraction of the 16-bit cache of a
`context_tokens`-token context (`candidates`):

    bits     every token, fewer bits             int4, int2 (all tokens: their bytes are what they are)
    tokens   16 bits, fewer tokens               fp16 @ POLICY:KEEP for each policy, KEEP fitted to the budget
    both     fewer bits and fewer tokens         int8 @ P:KEEP, int4 @ P:KEEP (P: the `combine` policy)
    mixed    the dropped tokens kept in int2     int8 @ P:KEEP,rest=int2, int4 @ P:KEEP,rest=int2

KEEP is the largest keep ratio whose bytes fit the budget (kvviz.memory.fit_keep, the memory model). Each
candidate is then measured (`measure`): its cache holds the context (the policy compresses it), the bytes are read
from that cache (`QuantizedKVCache.nbytes`), the continuation is read through it teacher-forced as one chunk, and
its log-probs are compared with the exact run's (mean KL over the continuation, nats/token). The context is
prefilled once (kvviz.quality.decode.prefill, keeping SnapKV's window of queries) and each candidate's cache loaded
from it: the prompt attends to its own unquantized K/V whatever the cache stores, so each cache holds what it would
have prefilling the context itself, bit for bit. The needle (kvviz.quality.needle: the haystack is the context,
compressed; the question is not) says what eviction loses: retrieval. `token_bits` draws where each candidate's
bits go, token by token.

    for step in run(model, tok, budget=0.25, context_tokens=512):   # one Row as each candidate finishes
        ...
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from kvviz.cache import QuantizedKVCache, model_layer_types
from kvviz.formats import Plan, as_plan
from kvviz.formats.eviction import POLICIES
from kvviz.memory import fit_keep, kv_cache_bytes_for
from kvviz.metrics import kl, log_probs
from kvviz.quality.corpus import wikitext_ids
from kvviz.quality.decode import load_prefill, prefill
from kvviz.quality.needle import DEPTHS, needle

REST = "int2"  # where mixed precision keeps the tokens its policy would drop
ALL_TOKENS = ("int4", "int2")  # the "bits" candidates: every token kept
BOTH = ("int8", "int4")  # formats under the `combine` policy, dropped or kept in REST
KINDS = ("bits", "tokens", "both", "mixed")


@dataclass(frozen=True)
class Candidate:
    """One way to spend the budget: `plan` (its eviction, if any, carries the fitted keep ratio) and how it spends
    the bytes (`kind`: one of KINDS)."""

    plan: Plan
    kind: str

    @property
    def keep(self) -> float:
        """The share of the context's tokens it keeps at the plan's format (1.0: all)."""
        return 1.0 if self.plan.evict is None else self.plan.evict.keep


@dataclass(frozen=True)
class Row:
    """A candidate as measured: bytes from its cache after the context (and the 16-bit cache's, same context), the
    mean KL over the continuation (nats/token), the needles it found (None until the needle ran), and each context
    token's stored bits per value averaged over layers and KV heads (None where the cache does not say which
    tokens it kept)."""

    candidate: Candidate
    nbytes: int
    nbytes_16bit: int
    kl: float
    found: int | None = None
    needles: int = 0
    token_bits: tuple[float, ...] | None = None

    @property
    def spec(self) -> str:
        return self.candidate.plan.text

    @property
    def pct_16bit(self) -> float:
        return 100 * self.nbytes / self.nbytes_16bit


def kind_of(plan: Plan) -> str:
    """How `plan` spends its bytes: "bits" (no eviction), "mixed" (the dropped tokens kept in another format),
    "tokens" (eviction at 16 bits), else "both"."""
    ev = plan.evict
    if ev is None:
        return "bits"
    if ev.rest is not None:
        return "mixed"
    bits = {f.bits_per_value(128) for kv in plan.specs for f in (kv.k, kv.v)}
    return "tokens" if bits and min(bits) >= 16 else "both"


def _policy_text(policy: str, window: int | None) -> str:
    """POLICY:1 with snapkv's window when given (the keep ratio is fitted afterwards)."""
    return f"{policy}:1" + (f",window={window}" if policy == "snapkv" and window is not None else "")


def candidates(config, budget: float, context_tokens: int, policies: Sequence[str] = POLICIES,
               combine: str = "snapkv", window: int | None = None, custom: Sequence[Plan] = (),
               layout: str = "transformers") -> tuple[list[Candidate], list[str]]:
    """The candidates for `budget` (a fraction of the 16-bit cache, in (0, 1]) at `context_tokens`, fitted, and one
    "`spec`: why" line per candidate no keep ratio fits. custom: plans given as they are (not fitted).

    ValueError when none fits the budget: the message gives the smallest budget some candidate reaches."""
    if not 0 < budget <= 1:
        raise ValueError(f"The budget is a share of the 16-bit cache in (0, 1] (0.25: a quarter); got {budget}.")
    unknown = [p for p in [*policies, combine] if p not in POLICIES]
    if unknown:
        raise ValueError(f"Unknown eviction policy {unknown[0]!r}; the policies are {', '.join(POLICIES)}.")
    full = kv_cache_bytes_for(config, context_tokens, k="fp16", layout=layout)
    target = int(budget * full)
    wanted = [(as_plan(f), "bits") for f in ALL_TOKENS]
    wanted += [(as_plan(f"fp16 @ {_policy_text(p, window)}"), "tokens") for p in policies]
    wanted += [(as_plan(f"{f} @ {_policy_text(combine, window)}"), "both") for f in BOTH]
    wanted += [(as_plan(f"{f} @ {_policy_text(combine, window)},rest={REST}"), "mixed") for f in BOTH]
    evicting = [p for p, _ in wanted if p.evict is not None] + [p for p in custom if p.evict is not None]
    if evicting and "full_attention" not in model_layer_types(config):
        name = config.get_text_config(decoder=True).model_type
        raise ValueError(f"Every K/V layer of {name} is a sliding-window (or chunked) layer: it already drops what "
                         f"leaves its window, so an eviction policy would change nothing. Measure formats alone "
                         f"(untick the policies), or pick a model with full-attention layers.")
    out, left = [], []
    for plan, kind in wanted:
        if plan.evict is None:
            out.append(Candidate(plan, kind))
            continue
        try:
            keep = fit_keep(config, plan, target, context_tokens, layout=layout)
        except ValueError as e:
            left.append(f"`{plan.text.replace(':1', '')}`: {e}")
            continue
        out.append(Candidate(plan.with_eviction(plan.evict.with_keep(keep)), kind))
    out += [Candidate(p, kind_of(p)) for p in custom]
    for c in out:  # snapkv's window against the context, before anything runs
        if c.plan.evict is not None:
            c.plan.evict.check_context(context_tokens)
    sizes = {c.plan.text: kv_cache_bytes_for(config, context_tokens, k=c.plan, layout=layout) for c in out}
    if not any(b <= target for b in sizes.values()):
        smallest = min(sizes, key=sizes.get) if sizes else None
        reach = "" if smallest is None else (f" The smallest any candidate reaches is {100 * sizes[smallest] / full:.1f}%"
                                             f" (`{smallest}`): raise the budget to at least that.")
        raise ValueError(f"No candidate fits {100 * budget:.3g}% of the 16-bit cache ({target:,} bytes at "
                         f"{context_tokens:,} tokens).{reach}")
    return out, left


def context_prefill(model, ctx: torch.Tensor, plans: Sequence[Plan] = ()):
    """The exact prefill of the context ids ctx [1, C] that every candidate's cache loads (kvviz.quality.decode:
    every token kept, and the last queries of the widest snapkv window among `plans`)."""
    window = max((p.evict.window for p in plans if p.evict is not None and p.evict.policy == "snapkv"), default=0)
    return prefill(model, ctx, queries=window)[0]


@torch.no_grad()
def exact_logprobs(model, prefilled, cont: torch.Tensor) -> torch.Tensor:
    """The exact run's log-probs [N, vocab] at the continuation's positions (each predicting the next token), read
    through a copy of the context's prefill (which the candidates still load)."""
    cache = copy.deepcopy(prefilled)
    return log_probs(model(input_ids=cont.to(model.device), cache=cache, use_cache=True).logits[0])


@torch.no_grad()
def measure(model, candidate: Candidate, prefilled, cont: torch.Tensor, base: torch.Tensor,
            nbytes_16bit: int) -> Row:
    """One candidate on the context (`prefilled`: its exact prefill, context_prefill) and the continuation ids cont
    [1, N]: its cache holds the context (loaded, compressed by its policy as on a first update), its bytes are the
    cache's own, and its log-probs at the continuation's positions (read teacher-forced, as one chunk, through that
    cache) against the exact run's `base` [N, vocab]."""
    cache = load_prefill(QuantizedKVCache(model.config, candidate.plan), prefilled)
    nbytes = cache.nbytes()
    bits = token_bits(model.config, candidate.plan, cache, prefilled.get_seq_length())
    lp = log_probs(model(input_ids=cont.to(model.device), cache=cache, use_cache=True).logits[0])
    return Row(candidate, nbytes, nbytes_16bit, float(kl(base, lp).mean()), token_bits=bits)


def token_bits(config, plan: Plan, cache, n: int) -> tuple[float, ...] | None:
    """Each of the n context tokens' stored bits per value, averaged over the layers that hold K/V and their KV
    heads (0: dropped everywhere); None when an evicting layer does not say which tokens it kept.

    A layer without eviction (a sliding-window layer under a policy, too: the policies leave those) stores every
    token it holds in its format (a sliding layer: its window's); an evicting layer its kept tokens (`kept_index`,
    [batch, kv_heads, kept] positions) in the format, the others in the eviction's `rest` format or nowhere."""
    text = config.get_text_config(decoder=True)
    specs = plan.resolve(text.num_hidden_layers, model_layer_types(config))
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    rest = plan.evict.rest if plan.evict is not None else None
    total = torch.zeros(n, dtype=torch.float64)
    counted = 0
    for kv, layer in zip(specs, cache.layers):
        if kv is None or not hasattr(layer, "nbytes"):
            continue  # a state layer (Mamba, linear attention) or one kept exact: no quantized K/V
        bits = kv.bits_per_value(head_dim)
        if getattr(layer, "evict", None) is None:
            window = getattr(layer, "sliding_window", None)
            held = torch.zeros(n, dtype=torch.float64)
            held[0 if not window else max(0, n - (window - 1)):] = bits
        else:
            kept = getattr(layer, "kept_index", None)
            if kept is None:
                return None
            mask = torch.zeros(kept.shape[1], n, dtype=torch.bool)  # [kv_heads, n]
            mask.scatter_(1, kept[0].long().cpu(), True)
            low = 0.0 if rest is None else rest.bits_per_value(head_dim)
            held = (mask.double() * bits + (~mask).double() * low).mean(0)
        total += held
        counted += 1
    return tuple((total / max(counted, 1)).tolist())


def context_labels(tokenizer, context_tokens: int) -> list[str]:
    """The text of each of the context's tokens (the quantization map's hover labels)."""
    return [tokenizer.decode([i]) for i in wikitext_ids(tokenizer, context_tokens)[0].tolist()]


def _split(tokenizer, context_tokens: int, continuation_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = wikitext_ids(tokenizer, context_tokens + continuation_tokens)
    return ids[:, :context_tokens], ids[:, context_tokens:]


@dataclass(frozen=True)
class Step:
    """What `run` has so far: the measured rows, the candidates left out with why, the exact cache's needles found
    (None until the needle ran), and whether the run is done."""

    rows: list[Row]
    total: int
    left: list[str]
    exact_found: int | None = None
    done: bool = False


def run(model, tokenizer, budget: float = 0.25, context_tokens: int = 512, continuation_tokens: int = 32,
        policies: Sequence[str] = POLICIES, combine: str = "snapkv", window: int | None = None,
        custom: Sequence[Plan] = (), needles_per_depth: int = 1, depths: Sequence[float] = DEPTHS,
        layout: str = "transformers") -> Iterator[Step]:
    """Every candidate of `budget` measured on `context_tokens` of WikiText-2 and the next `continuation_tokens`,
    then the needle at `depths` of a `context_tokens` haystack (`needles_per_depth` each; 0: no needle).

    Yields a Step once per measured candidate, then the last one (done) with the needle's counts in every row."""
    config = model.config
    cands, left = candidates(config, budget, context_tokens, policies, combine, window, custom, layout)
    ctx, cont = _split(tokenizer, context_tokens, continuation_tokens)
    prefilled = context_prefill(model, ctx, [c.plan for c in cands])
    base = exact_logprobs(model, prefilled, cont)
    full = load_prefill(QuantizedKVCache(config, "fp16"), prefilled).nbytes()  # the 16-bit cache, as measured
    rows: list[Row] = []
    for cand in cands:
        rows.append(measure(model, cand, prefilled, cont, base, full))
        yield Step(list(rows), len(cands), left)
    del prefilled
    if not needles_per_depth:
        yield Step(rows, len(cands), left, done=True)
        return
    res = needle(model, tokenizer, [c.plan for c in cands], context_tokens, depths,
                 needles_per_depth=needles_per_depth, alone=True)  # each candidate read through its own cache
    hits = [res["retrieved"][c.plan.name] for c in cands]
    rows = [replace(r, found=sum(h), needles=len(h)) for r, h in zip(rows, hits)]
    yield Step(rows, len(cands), left, sum(res["retrieved"]["baseline"]), done=True)
