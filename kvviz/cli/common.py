"""What `python -m kvviz sensitivity` and `python -m kvviz plan` share: the model and text arguments, loading them,
a wall and CPU clock, and their tables.

Both print their wall time and the CPU time of all their threads (model loading apart): on a shared machine the
wall time depends on the load, the CPU time much less.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from kvviz import models
from kvviz.quality.perplexity import wikitext


def add_text_arguments(p: argparse.ArgumentParser) -> None:
    """--model, --tokens and --text-file."""
    p.add_argument("--model", help="a bundled model name or a local model directory (default: the bundled SmolLM2)")
    p.add_argument("--tokens", type=int, default=256, help="tokens of text scored (default %(default)s)")
    p.add_argument("--text-file", metavar="PATH", help="text to score (default: the WikiText-2 slice in assets/)")


def load_text_model(args: argparse.Namespace):
    """(model, tokenizer, text) for the arguments of add_text_arguments; ValueError for too few tokens."""
    if args.tokens < 3:
        raise ValueError(f"--tokens must be at least 3, got {args.tokens}.")
    text = Path(args.text_file).read_text(encoding="utf-8") if args.text_file else wikitext()
    model, tok = models.load_model(args.model)  # through the module: tests replace it there
    return model, tok, text


class Clock:
    """Wall and CPU seconds since construction, as text: "41.2 s wall, 80.1 s CPU"."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def __str__(self) -> str:
        return f"{time.perf_counter() - self.wall:.1f} s wall, {time.process_time() - self.cpu:.1f} s CPU"


def print_table(rows: list[list[str]]) -> None:
    """Rows of cells, right-aligned in columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip())


def kl_text(x: float) -> str:
    """A KL in nats as text ("-" for NaN: not measured)."""
    return "-" if math.isnan(x) else f"{x:.2e}"
