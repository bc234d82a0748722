"""Fused against unfused decode (lesson 7): the same prompt decoded through both exact caches (DynamicCache and
StaticCache) and through each format's cache twice, with tokens/s and the K/V bytes each path reads per step. Each run's steps are timed one by one
(kvviz.quality.decode.step_times), every run starting from one shared prefill.

    report = fused_vs_unfused(model, wikitext_ids(tok, 1024), ["int4", "k8v4"])   # kvviz.quality.corpus.wikitext_ids
    report.runs[1].tokens_per_s, report.runs[1].vs_exact                           # one DecodeRun per cache and path

`fused_vs_unfused` times one prompt's decode through DynamicCache, StaticCache and each format twice: the fused
backend (on the CPU the numba kernel of kernels/cpu/decode.py, on CUDA Triton's), which reads the packed bytes in place,
and the unfused reference (backend "torch"), which dequantizes the whole history at every step and hands it to SDPA.

`recorded_by_context(model)` reads a recorded `python -m kvviz bench --contexts ... --json` run of a bundled model
(kvviz/quality/recorded/<model>.json): tokens/s per context and cache with each format's byte ceiling, which the
lesson draws as curves beside its own live point (contexts up to 8K take minutes to measure on a 2-core CPU).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers.cache_utils import Cache

from kvviz import attention
from kvviz.cache import QuantizedKVCache
from kvviz.formats import KVSpec, as_plan
from kvviz.quality.decode import DYNAMIC, STATIC, WARMUP, Decoding, prefill, rotated, step_times


# ------------------------------------------------------------------------------------------ fused against unfused

EXACT, FUSED, UNFUSED = "exact", "fused", "unfused"  # DecodeRun.path (EXACT: DynamicCache and StaticCache)


@dataclass(frozen=True)
class DecodeRun:
    """One cache and decode path of fused_vs_unfused.

    name: "DynamicCache", "StaticCache" or the format's spec as given; path: EXACT (the two exact caches), FUSED or
    UNFUSED; backend: what decoded: "sdpa" (the exact caches), "cpu" / "triton" (the fused kernel) or "torch" (the
    reference; also a FUSED run's when the fused path does not run here or has no branch for the format);
    tokens_per_s: one over its median step; vs_exact: tokens_per_s over DynamicCache's (1.0 for DynamicCache
    itself); vs_static: over StaticCache's, the best exact cache (it writes each token in place, where DynamicCache
    copies its whole history at every step); bytes_read: bytes of K/V the attention moves at the last timed step
    (see fused_vs_unfused); tokens: the ids generated, the warm-up steps' first (WARMUP of them).
    """

    name: str
    path: str
    backend: str
    tokens_per_s: float
    vs_exact: float
    bytes_read: int
    tokens: list[int]
    why: str = ""  # a FUSED run the reference decoded: "unavailable" (no fused path here), "lossless" (a cast of
    #                the model's own dtype: the reference is DynamicCache's exact read) or "no_branch"
    vs_static: float = 1.0

    @property
    def fused(self) -> bool:
        """Whether the fused kernel really decoded this run (not the reference standing in for it)."""
        return self.path == FUSED and self.backend != "torch"


@dataclass(frozen=True)
class FusedReport:
    """What fused_vs_unfused measured. runs: DynamicCache and StaticCache first, then per format its FUSED and
    UNFUSED run;
    fused_backend: the backend asked for as fused ("cpu" for a model on the CPU, "triton" on CUDA);
    fused_available: whether it runs here (numba imports and compiles; triton and a GPU)."""

    runs: list[DecodeRun]
    context: int
    new_tokens: int
    rounds: int
    fused_backend: str
    fused_available: bool

    @property
    def formats(self) -> list[str]:
        return [r.name for r in self.runs if r.path == FUSED]

    def run(self, name: str, path: str) -> DecodeRun:
        return next(r for r in self.runs if r.name == name and r.path == path)

    def same_tokens(self, name: str) -> bool:
        """Whether format `name`'s fused and unfused runs generated the same ids (a float32 near-tie can flip one:
        the kernel sums in another order than SDPA)."""
        return self.run(name, FUSED).tokens == self.run(name, UNFUSED).tokens


def _fused_backend(model) -> tuple[str, bool]:
    """(the fused backend for the model's device, whether it runs here)."""
    backend = "triton" if model.device.type == "cuda" else "cpu"
    try:
        with attention.use_backend(backend):
            return backend, attention.active_backend() == backend  # "cpu" without numba answers "torch"
    except ValueError:  # triton asked for where it cannot run
        return backend, False


def _fuses(kv: KVSpec, backend: str, dtype: torch.dtype) -> bool:
    """Whether the attention function sends single-token decode of `kv` to the fused kernel of `backend`, by the
    same rules it applies to the cache's sides of a model in `dtype` (kvviz.attention's _fused_reads, and
    _cpu_reads on the CPU)."""
    sides = [SimpleNamespace(fmt=kv.k, dtype=dtype), SimpleNamespace(fmt=kv.v, dtype=dtype)]
    return attention._cpu_reads(*sides) if backend == "cpu" else attention._fused_reads(*sides)


def dynamic_bytes(cache: Cache) -> int:
    """Bytes of the K/V a DynamicCache holds (the model's dtype; linear-attention / Mamba states are not K/V)."""
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers
               if getattr(layer, "keys", None) is not None)


def _dense_bytes(cache: QuantizedKVCache) -> int:
    """Bytes of every stored token of a QuantizedKVCache's K and V in full precision (the states' dtype): what the
    reference's dequantize writes at one step."""
    total = 0
    for layer in cache.layers:
        for side in (getattr(layer, "k", None), getattr(layer, "v", None)):
            if side is not None and side.tail is not None:
                batch, heads, _, head_dim = side.tail.shape  # [B, H, tail, D]
                total += batch * heads * side.seq_len * head_dim * side.dtype.itemsize
    return total


@torch.no_grad()
def fused_vs_unfused(model, ids: torch.Tensor, formats: list, new_tokens: int = 8, rounds: int = 2) -> FusedReport:
    """Greedy decode of new_tokens after the prompt `ids` ([1, N]) through DynamicCache and StaticCache (sized to
    the prompt and the run's steps), and through each format twice: fused (the kernel reads the packed buffers in
    place) and unfused (backend "torch": dequantize the whole history, then SDPA). Every run starts from the same prefill (quality.prefill, copied in by load_prefill); in each
    of `rounds` rounds every run starts afresh and takes WARMUP untimed and new_tokens timed steps alone, one run
    after another (step_times); a run's speed is one over its median step, so a burst of other work is set aside.

    Bytes read per decode step, at the last timed step (N + WARMUP + new_tokens tokens held), K and V of every layer:
    - DynamicCache, StaticCache: their K/V in the model's dtype (what SDPA reads; the StaticCache holds exactly the
      tokens of the last step);
    - fused: cache.nbytes(), the packed codes, scales, zero points and full-precision tails, read once in place;
    - unfused: cache.nbytes() read by the dequantize, plus the full-precision copy of every stored token that it
      writes and SDPA then reads (2 x the DynamicCache figure for full-attention layers). The reference's other
      temporaries (a contiguous copy of the packed buffers, the concatenation with the tail) are not counted, so
      this is a lower bound of what it moves.
    Bytes moved by the weights, the appended token and its quantization are the same for every path and left out.

    formats: K/V specs (strings, KVSpecs or uniform kvviz.Plans; not per-layer plans). A FUSED run whose fused path does not run here
    (numba missing, no GPU for triton) or has no fused branch for the format is decoded by the reference and says
    so (DecodeRun.backend "torch", .fused False). ValueError for an empty list, an unknown spec, ids that are not
    [1, N], or new_tokens / rounds below 1.
    """
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
        raise ValueError(f"ids must be one prompt, [1, N] token ids; got shape {list(ids.shape)}.")
    if new_tokens < 1 or rounds < 1:
        raise ValueError(f"new_tokens and rounds must be at least 1, got {new_tokens} and {rounds}.")
    specs: dict[str, KVSpec] = {}
    for f in formats:
        plan = as_plan(f)  # ValueError naming the valid formats; a Plan passes as is
        if not plan.is_uniform:
            raise ValueError(f"{plan.name!r} is a per-layer plan; fused_vs_unfused times one format for every "
                             f"layer. Give single K/V specs such as k=int8,v=int4.")
        specs.setdefault(f.spec if isinstance(f, KVSpec) else plan.name, plan.default)
    if not specs:
        raise ValueError("Give at least one KV format to decode fused and unfused, e.g. ['int4', 'k8v4'].")
    fused_backend, available = _fused_backend(model)
    plan = [(DYNAMIC, EXACT, None, None), (STATIC, EXACT, STATIC, None)]
    whys = {}  # why the reference stands in for a FUSED run
    for name, kv in specs.items():
        fused_here = available and _fuses(kv, fused_backend, model.dtype)
        plan += [(name, FUSED, kv, fused_backend if fused_here else "torch"), (name, UNFUSED, kv, "torch")]
        if not fused_here:
            lossless = any(attention.lossless_cast(f, model.dtype) for f in (kv.k, kv.v))
            whys[name] = "unavailable" if not available else ("lossless" if lossless else "no_branch")
    dyn, logits = prefill(model, ids)
    first = int(logits.argmax())
    seconds: dict[tuple[str, str], list[float]] = {(name, path): [] for name, path, _, _ in plan}
    last: dict[tuple[str, str], tuple[int, list[int]]] = {}
    for r in range(rounds):
        for name, path, kv, backend in rotated(plan, r):  # each round one run later
            # DynamicCache hands SDPA plain tensors under either backend
            run = Decoding(model, dyn, kv, first, backend=backend or "torch", steps=WARMUP + new_tokens)
            seconds[name, path] += step_times(run, new_tokens)
            if path == EXACT:
                nbytes = dynamic_bytes(run.cache)
            else:
                nbytes = run.cache.nbytes() + (2 * _dense_bytes(run.cache) if path == UNFUSED else 0)
            last[name, path] = (nbytes, run.ids)
            del run
    speed = {key: 1.0 / statistics.median(taken) for key, taken in seconds.items()}
    exact, static = speed[DYNAMIC, EXACT], speed[STATIC, EXACT]
    runs = [DecodeRun(name, path, backend or "sdpa", speed[name, path], speed[name, path] / exact, *last[name, path],
                      why=whys.get(name, "") if path == FUSED else "", vs_static=speed[name, path] / static)
            for name, path, _, backend in plan]
    return FusedReport(runs, ids.shape[1], new_tokens, rounds, fused_backend, available)


# ------------------------------------------------------------------------------------------ recorded by context

RECORDED = Path(__file__).with_name("recorded")  # <model>.json: `python -m kvviz bench --contexts ... --json`


def recorded_by_context(model: str) -> dict | None:
    """The recorded speed-by-context run of `model` (a bundled model's name), or None when none was recorded.

    Returns the --json file as written: "command", "date", "machine", "contexts" {"1024": {cache: row}} with
    tokens_per_s, ratio (to DynamicCache), ceiling, share per row (DynamicCache first; records made since StaticCache
    joined also hold its row and each row's vs_static)."""
    path = RECORDED / f"{model}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())
