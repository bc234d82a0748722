"""How the decode launchers (kernels/decode.py on Triton, kernels/cpu/decode.py on numba) cut a sequence's tokens
into split-K work items, and the power-of-two rounding their block sizes use. One copy, so that both backends split
alike.
"""

from __future__ import annotations

import math

MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost (q load, partial store) dominates


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def split_tokens(max_length: int, rows: int, workers: int, block: int, num_splits: int | None = None,
                 max_splits: int | None = None) -> tuple[int, int]:
    """(number of splits, tokens per split) for `rows` (batch x KV heads) sequences of at most max_length tokens.

    num_splits None: enough splits for two work items per worker (SMs, threads), none shorter than
    MIN_TOKENS_PER_SPLIT tokens. Splits are whole blocks of `block` tokens, so the count may shrink to fit.
    """
    if num_splits is None:
        num_splits = min(math.ceil(2 * workers / max(1, rows)), math.ceil(max_length / MIN_TOKENS_PER_SPLIT))
    num_splits = max(1, int(num_splits) if max_splits is None else min(int(num_splits), max_splits))
    per_split = math.ceil(max(1, max_length) / num_splits / block) * block
    return max(1, math.ceil(max_length / per_split)), per_split
