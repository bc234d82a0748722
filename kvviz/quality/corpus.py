"""The text every quality measurement reads by default: the WikiText-2 test slice bundled in assets/ (the first
~100 KB of the test split; CC BY-SA 3.0, Merity et al. 2016, see assets/WIKITEXT-2-LICENSE.md).

    text = wikitext()                  # the slice as a string
    ids = wikitext_ids(tok, 1024)      # its first 1024 token ids [1, 1024], the slice repeated when shorter
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

WIKITEXT = Path(__file__).resolve().parents[2] / "assets" / "wikitext-2-test.txt"


@functools.lru_cache(maxsize=2)
def wikitext(path: str | None = None) -> str:
    """The WikiText-2 test slice bundled in assets/ (or another text file)."""
    p = Path(path) if path else WIKITEXT
    if not p.is_file():
        raise ValueError(f"The WikiText-2 slice is missing at {p}; it ships in the repository's assets/ directory.")
    return p.read_text(encoding="utf-8")


def wikitext_ids(tokenizer, n_tokens: int) -> torch.Tensor:
    """The first n_tokens ids of the bundled WikiText-2 slice ([1, n_tokens]), the slice repeated when shorter."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be at least 1, got {n_tokens}.")
    ids = tokenizer(wikitext(), return_tensors="pt")["input_ids"]  # [1, T]
    return ids.repeat(1, -(-n_tokens // ids.shape[1]))[:, :n_tokens]
