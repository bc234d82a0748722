"""Cache bytes against context length, for a chart: the sampled contexts (the window edges included, so that the
bend where a sliding or chunked layer fills shows) and each format's bytes there, all layers and windowed ones.

    curves = memory_curves(model, plans, lo=1024, hi=131072, batch=1)
    curves.contexts                 # [1024, ..., 131072] tokens, geometric, plus the window edges in between
    curves.gb["int4"]               # GB at each context, every layer
    curves.windowed_gb["int4"]      # GB of the sliding and chunked layers alone (present when the model has them)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bytes import CacheModel
from .presets import GB, ModelPreset

WINDOWED = ("sliding_attention", "chunked_attention")  # layer kinds that hold at most a window of tokens
POINTS = 48  # samples along the context axis


@dataclass(frozen=True)
class MemoryCurves:
    contexts: list[int]  # tokens, ascending
    caches: dict[str, CacheModel]  # per plan name, the memory model the numbers come from
    gb: dict[str, list[float]]  # per plan name: GB at each context
    windowed_gb: dict[str, list[float]]  # per plan name with windowed layers: their GB at each context


def window_edges(caches, lo: int, hi: int) -> set[int]:
    """The context lengths strictly between lo and hi where a sliding or chunked layer fills."""
    windows = {s.window for c in caches for s in c.shapes if s.window}
    return {w for w in windows if lo < w < hi}


def context_samples(caches, lo: int, hi: int, points: int = POINTS) -> list[int]:
    """`points` contexts spaced geometrically from lo to hi, plus the caches' window edges, sorted."""
    return sorted({int(round(x)) for x in np.geomspace(lo, hi, points)} | window_edges(caches, lo, hi))


def windowed_bytes(cache: CacheModel, tokens: int, batch: int) -> int:
    """Bytes of the cache's sliding and chunked layers alone at `tokens` x `batch`."""
    return sum(r["bytes"] for r in cache.breakdown(tokens, batch) if r["kind"] in WINDOWED)


def memory_curves(model: ModelPreset, plans: dict, lo: int, hi: int, batch: int = 1, layout: str = "engine",
                  points: int = POINTS) -> MemoryCurves:
    """Each plan's (name -> kvviz Plan, resolved for the model) cache GB against context from lo to hi."""
    caches = {name: CacheModel(model, plan, None, layout) for name, plan in plans.items()}
    contexts = context_samples(caches.values(), lo, hi, points)
    gb = {name: [c.bytes(x, batch) / GB for x in contexts] for name, c in caches.items()}
    windowed = {name: [windowed_bytes(c, x, batch) / GB for x in contexts]
                for name, c in caches.items() if any(s.kind in WINDOWED for s in c.shapes)}
    return MemoryCurves(contexts, caches, gb, windowed)
