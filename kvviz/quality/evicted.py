"""An eviction plan's rows in Compare (kvviz.quality.compare): its own cache, outside the row batch.

A plan with an eviction (`int4 @ snapkv:0.5`, kvviz.formats.eviction) holds fewer context tokens than the other
rows, so it cannot share the batch's rectangular mirror (kvviz.cache.row_stack). It runs beside it instead: the
model prefills the prompt through a QuantizedKVCache of the plan (the prompt is the context: compressed, SnapKV
scored by its own queries), one row teacher-forced on the baseline's tokens and, for the free-running text, one fed
its own; each decode step then runs those rows in one batch, and their logits are read against the batch's
baseline row of the same step.
"""

from __future__ import annotations

import torch

from kvviz.cache import QuantizedKVCache
from kvviz.formats import Plan


class EvictedRows:
    """Rows of one eviction plan: [teacher-forced] or [teacher-forced, free-running], after a compressed prefill.

    ids: the prompt [1, T]; scales: static scales as QuantizedKVCache takes them."""

    def __init__(self, model, ids: torch.Tensor, plan: Plan, scales: dict | None, free_running: bool):
        self.rows = 2 if free_running else 1
        self.cache = QuantizedKVCache(model.config, plan, scales=scales)
        model(input_ids=ids.repeat(self.rows, 1).to(model.device), cache=self.cache, use_cache=True,
              logits_to_keep=1)

    @torch.no_grad()
    def step(self, model, teacher: int, free: int) -> torch.Tensor:
        """One decode step: the teacher-forced row fed `teacher`, the free-running row `free`. Returns float logits
        [rows, vocab]."""
        fed = [teacher, free][: self.rows]
        inp = torch.tensor(fed, device=model.device)[:, None]  # [rows, 1]
        return model(input_ids=inp, cache=self.cache, use_cache=True).logits[:, -1].float()

    def nbytes(self) -> int:
        """Bytes one row's cache holds (kept tokens in the plan's formats, a rest format's tokens, scales)."""
        return self.cache.nbytes(one_row=True)


def no_engine_eviction(plan: Plan) -> None:
    """ValueError for a llama.cpp plan with an eviction: llama.cpp's own cache runs it, and keeps every token."""
    if plan.evict is not None:
        raise ValueError(f"{plan.name!r}: a llama.cpp name runs llama.cpp's own cache, which keeps every token; drop "
                         f"'@ {plan.evict.text}', or use kvviz's formats (e.g. 'int4 @ {plan.evict.text}').")
