"""Static-scale warnings merged for people: `ScaleNotes` turns the ScaleWarning each layer side raises into one
sentence per problem and format (the app's status lines and pop-ups, the bench's output)."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterable, Iterator

from .sides import MIN_FIT_TOKENS, ScaleWarning


class ScaleNotes:
    """kvviz's static-scale warnings (ScaleWarning) raised during one call, merged into one line per problem and
    format (a cache warns once per layer side: 60 warnings for one format on SmolLM2).

        notes = ScaleNotes()
        with notes.catching():
            ...                                # library calls
        print("\n".join(notes.lines()))       # one sentence per (problem, format)

    Other warnings pass through to Python's own handling. warnings.catch_warnings swaps process-wide state, so the
    windows are kept short (`watch` catches one step of a generator at a time); model calls share one queue.
    """

    def __init__(self) -> None:
        self._merged: dict[tuple[str, str], dict] = {}

    @contextlib.contextmanager
    def catching(self):
        """Collect the ScaleWarnings this thread raises while the block runs. warnings' handler is one per process,
        so a warning another thread raises meanwhile (the app's warm-up decoding its own short prompt) goes on to
        the handler that was in place, not into this call's lines."""
        owner, outer = threading.get_ident(), warnings.showwarning
        caught: list[warnings.WarningMessage] = []

        def show(message, category, filename, lineno, file=None, line=None):
            if threading.get_ident() == owner:
                caught.append(warnings.WarningMessage(message, category, filename, lineno, file, line))
            else:
                outer(message, category, filename, lineno, file, line)

        with warnings.catch_warnings():
            warnings.simplefilter("always", ScaleWarning)  # every side's, every call: not once per code location
            warnings.showwarning = show
            yield self
        for w in caught:
            if isinstance(w.message, ScaleWarning):
                self._add(w.message)
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)

    def watch(self, steps: Iterable) -> Iterator:
        """Iterate `steps` (a generator) catching the warnings of each step."""
        it = iter(steps)
        while True:
            with self.catching():
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item

    def _add(self, w) -> None:
        # One run may build several caches of a format (Compare: teacher-forced, free-running, timed): a side is
        # counted once by its name, with the largest count any of its caches saw.
        m = self._merged.setdefault((w.kind, w.spec), {"sides": {}, "tokens": w.tokens})
        m["sides"][w.side] = max(m["sides"].get(w.side, 0), w.count)
        m["tokens"] = min(m["tokens"], w.tokens)

    def lines(self) -> list[str]:
        """One sentence per (problem, format), in the order first seen."""
        return list(self._lines().values())

    def _lines(self) -> dict[tuple[str, str], str]:
        out = {}
        for (kind, spec), m in self._merged.items():
            sides = len(m["sides"])
            where = f" ({sides} layer sides)" if sides > 1 else ""
            if kind == "few_tokens":
                out[kind, spec] = (f"`{spec}`: the static scale was fitted on {m['tokens']} token(s), fewer "
                                   f"than {MIN_FIT_TOKENS}{where}; later tokens beyond its range saturate. Use a "
                                   "longer prompt or calibrated scales.")
            else:
                out[kind, spec] = (f"`{spec}`: at least {sum(m['sides'].values()):,} values saturated beyond the "
                                   f"FP8 range under the static scale{where}, counted where each side first "
                                   "saturated; use calibrated scales or a per-token format.")
        return out
