"""What Compare returns (kvviz.quality.compare / compare_stream), as frozen values with named fields: per format a
FormatResult (free-running text, first divergence, per-step KL and top-1, cache bytes and their ratios, tokens/s),
the whole QualityReport, and its table rows (CompareRow: the baseline first, then each format, perplexity beside
them when measured). Byte ratios are numbers; a caller formats them.

    report = compare(model, tok, prompt, ["fp8_e4m3", "int4"])
    for row in report.rows(perplexity=quality.perplexity(model, tok, ["fp8_e4m3", "int4"])["ppl"]):
        print(row.name, row.kl_mean, row.top1, row.bytes_vs_16bit, row.perplexity)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from kvviz.attention import active_backend
from kvviz.export import export_commands
from kvviz.formats import ENGINE_NAMES
from kvviz.formats import Plan
from kvviz.metrics import percentile

METRICS_BACKEND = "torch reference, batched (dequantized K/V + SDPA)"
LLAMACPP_METRICS = ("; `llama.cpp:` rows as llama.cpp runs them (its attention arithmetic and 8-bit matmul inputs, "
                    "unbatched), their KL against llama.cpp's own f16-cache run")
BASELINE = "baseline"  # the exact row's name in CompareRow and in kvviz.quality.perplexity's result
EXACT = "exact"  # FormatResult.kl_against of a row measured against the exact model (the baseline row)


@dataclass(frozen=True)
class FormatResult:
    """One format's outcome. kl, top1: [steps] over decode steps 1..N-1 (nats; bool)."""

    name: str  # as the caller wrote it
    spec: str  # canonical KVSpec string
    text: str  # free-running continuation ("" when run with free_running=False)
    token_ids: list[int]
    first_divergence: int | None  # first index where the free-running tokens differ from the baseline's
    kl: np.ndarray
    top1: np.ndarray
    cache_bytes: int  # the teacher-forced row's cache (prompt + continuation), kvviz.QuantizedKVCache.nbytes()
    bits_per_value: float
    bytes_vs_exact: float  # cache_bytes over the exact cache's, in the model's dtype (QualityReport.baseline_bytes)
    bytes_vs_16bit: float  # cache_bytes over the exact cache's at 16 bits, what engines store (k8v4: 0.39)
    tokens_per_s: float | None = None  # its own cache and attention backend, when measured (speed_tokens > 0)
    plan: Plan | None = None  # what was run, as parsed at the boundary
    # what kl and top1 are against: EXACT (the baseline row) or "llama.cpp:f16" (llama.cpp's own f16-cache run on
    # the baseline's tokens, for a plan holding a `llama.cpp:` name)
    kl_against: str = EXACT

    @property
    def mean_kl(self) -> float:
        return float(self.kl.mean()) if self.kl.size else 0.0

    def kl_percentile(self, fraction: float) -> float:
        """The KL at `fraction` of the sorted per-step values, interpolated as llama.cpp's KLD percentiles are
        (0.5: the median; 0.99: p99)."""
        return percentile(torch.sort(torch.as_tensor(self.kl)).values, fraction) if self.kl.size else 0.0

    @property
    def top1_rate(self) -> float:
        return float(self.top1.mean()) if self.top1.size else 1.0


@dataclass(frozen=True)
class CompareRow:
    """One row of Compare's table: the exact baseline (baseline=True) or one format.

    spec: the canonical spec or plan (the baseline: its dtype, e.g. "float32"); kl_mean, kl_median, kl_p99: nats
    over the decode steps (0 for the baseline); top1: the fraction of steps whose top token agrees; first_divergence:
    the first free-running token that differs (None: none, or the baseline); cache_bytes and its ratios to the exact
    cache at 16 bits and in the model's dtype; tokens_per_s: None when not timed; perplexity: on WikiText-2, None
    when not measured; text: the free-running continuation; kl_against: what kl and top1 are measured against
    (FormatResult.kl_against)."""

    name: str
    baseline: bool
    spec: str
    bits_per_value: float
    kl_mean: float
    kl_median: float
    kl_p99: float
    top1: float
    first_divergence: int | None
    cache_bytes: int
    bytes_vs_16bit: float
    bytes_vs_exact: float
    tokens_per_s: float | None
    perplexity: float | None
    text: str
    plan: Plan | None = None  # what the row ran (None for the baseline)
    kl_against: str = EXACT


@dataclass(frozen=True)
class QualityReport:
    """The whole comparison. baseline_bytes: a DynamicCache's K/V for the same tokens, in the model dtype (`dtype`,
    `baseline_bits` bits a value); baseline_bytes_16bit: the same K/V at 16 bits, what engines store."""

    prompt: str
    prompt_tokens: int
    baseline_text: str
    baseline_ids: list[int]
    baseline_bytes: int
    baseline_bytes_16bit: int
    dtype: str
    baseline_bits: int
    formats: list[FormatResult]
    seconds: float  # wall time of the run: prefill, batched decode, and the `llama.cpp:` rows (run apart)
    baseline_tokens_per_s: float | None = None
    metrics_backend: str = METRICS_BACKEND
    speed_backend: str = field(default_factory=active_backend)

    def rows(self, perplexity: dict[str, float] | None = None) -> list[CompareRow]:
        """The table: the baseline, then one row per format. perplexity: kvviz.quality.perplexity's "ppl",
        {"baseline" | format name: perplexity}, when measured."""
        ppl = (lambda name: None) if perplexity is None else perplexity.__getitem__  # noqa: E731
        base = CompareRow(name=BASELINE, baseline=True, spec=self.dtype, bits_per_value=self.baseline_bits,
                          kl_mean=0.0, kl_median=0.0, kl_p99=0.0, top1=1.0, first_divergence=None,
                          cache_bytes=self.baseline_bytes,
                          bytes_vs_16bit=self.baseline_bytes / self.baseline_bytes_16bit, bytes_vs_exact=1.0,
                          tokens_per_s=self.baseline_tokens_per_s, perplexity=ppl(BASELINE), text=self.baseline_text)
        return [base] + [CompareRow(
            name=f.name, baseline=False, spec=f.spec, bits_per_value=f.bits_per_value, kl_mean=f.mean_kl,
            kl_median=f.kl_percentile(0.5), kl_p99=f.kl_percentile(0.99), top1=f.top1_rate,
            first_divergence=f.first_divergence, cache_bytes=f.cache_bytes, bytes_vs_16bit=f.bytes_vs_16bit,
            bytes_vs_exact=f.bytes_vs_exact, tokens_per_s=f.tokens_per_s, perplexity=ppl(f.name), text=f.text,
            plan=f.plan, kl_against=f.kl_against)
            for f in self.formats]

    def table(self) -> list[dict]:
        """One plain dict per format (pandas, a table widget)."""
        return [{"format": f.name, "spec": f.spec, "mean_kl": f.mean_kl, "top1": f.top1_rate,
                 "first_divergence": f.first_divergence, "cache_bytes": f.cache_bytes,
                 "bytes_vs_baseline": f.bytes_vs_exact, "bits_per_value": f.bits_per_value,
                 "tokens_per_s": f.tokens_per_s, "kl_against": f.kl_against} for f in self.formats]


@dataclass(frozen=True)
class StreamUpdate:
    """One step of compare_stream: partial texts, and the final report on the last update (else None)."""

    step: int
    baseline: str
    texts: dict[str, str]
    report: QualityReport | None = None


@dataclass(frozen=True)
class MapPoint:
    """One format or plan of a Compare run on the quality-against-bytes map."""

    name: str  # as the caller wrote it
    spec: str
    bits_per_value: float  # stored bits per K/V value, scales included
    kl_mean: float  # nats per token against the exact cache
    frontier: bool  # on the Pareto frontier: no other run is as good on both and better on one
    engine_flag: str | None  # "vllm --kv-cache-dtype fp8_e4m3" where an engine stores exactly this; else None


def engine_flag(plan: Plan | None) -> str | None:
    """The first engine (vLLM, SGLang, llama.cpp) that stores `plan` exactly, with its KV flags; None for none (and
    for a per-layer plan, which no engine takes as one flag, and for an eviction, which none of them runs)."""
    if plan is None or not plan.is_uniform or plan.evict is not None:
        return None
    rows = export_commands(plan.default)
    hit = next((e for e in ENGINE_NAMES if rows[e]["supported"] and rows[e]["flags"]), None)
    return None if hit is None else f"{hit} {rows[hit]['flags']}"


def quality_map(rows: list[CompareRow]) -> list[MapPoint]:
    """Compare's formats and plans (the baseline left out) as points of mean KL against bits per value, each marked
    when it is on the Pareto frontier (fewer bits and lower KL both count as better), with its engine flag."""
    runs = [r for r in rows if not r.baseline]

    def dominated(r: CompareRow) -> bool:
        return any(o.bits_per_value <= r.bits_per_value and o.kl_mean <= r.kl_mean
                   and (o.bits_per_value < r.bits_per_value or o.kl_mean < r.kl_mean) for o in runs)

    return [MapPoint(r.name, r.spec, r.bits_per_value, r.kl_mean, not dominated(r), engine_flag(r.plan))
            for r in runs]
