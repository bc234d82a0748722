"""`Eviction`: which context tokens a cache keeps (a policy and a keep ratio), and `parse_eviction`, its text.

Quantization drops bits; eviction drops tokens. A plan may carry one eviction, written after `@` (kvviz.formats.plan
parses the whole text once):

    int4 @ snapkv:0.5                  SnapKV keeps half of the context's tokens per KV head, stored in int4
    fp16 @ streaming:0.25,sinks=4      StreamingLLM: 4 sink tokens + the most recent window, a quarter in all
    int4 @ knorm:0.5,rest=int2         mixed precision: the kept half in int4, the other half in int2
    int8 @ random:0.5,seed=1           the control: a seeded random half

Policies (kvviz.cache.eviction scores them; the cache keeps the top `kept(n)` tokens of each KV head):
- `streaming` (StreamingLLM, Xiao et al. 2023): the first `sinks` tokens and the most recent ones.
- `snapkv` (Li et al. 2024, as kvpress's SnapKVPress): the softmax attention of the context's last `window`
  queries to every earlier key, averaged over those queries and the query heads of a KV head's group, max-pooled
  over `kernel` neighbouring tokens; the window itself is always kept.
- `knorm` (Devoto et al. 2024, kvpress's KnormPress): the keys with the smallest L2 norm.
- `random`: a seeded random subset, the control.

`rest=FMT` keeps the tokens a policy would drop in a low-bit format instead (MiKV, ZipCache): eviction is the
zero-bit end of that scale. The keep ratio is the share of the context kept in the plan's format.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .core import Format
from .kv import get_format

# policy -> the options it takes (besides `rest`, which every policy takes), with their defaults
POLICIES: dict[str, dict[str, int]] = {
    "streaming": {"sinks": 4},
    "snapkv": {"window": 32, "kernel": 5},
    "knorm": {},
    "random": {"seed": 0},
}
_OPTION_ORDER = ("sinks", "window", "kernel", "seed")
_EXAMPLE = "'int4 @ snapkv:0.5'"


@dataclass(frozen=True)
class Eviction:
    """A policy that keeps `keep` of a context's tokens per KV head (the same count on every head).

    policy: one of POLICIES; keep: the share kept, in (0, 1]; sinks (streaming), window and kernel (snapkv), seed
    (random): the policy's options; rest: the format the other tokens are stored in (mixed precision), None to
    drop them."""

    policy: str
    keep: float
    sinks: int = 4
    window: int = 32
    kernel: int = 5
    seed: int = 0
    rest: Format | None = None

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"Unknown eviction policy {self.policy!r}; the policies are "
                             f"{', '.join(POLICIES)} (e.g. {_EXAMPLE}).")
        keep = self.keep
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 < keep <= 1:
            raise ValueError(f"The keep ratio in {self.policy}:{keep} must be in (0, 1] (the share of the context's "
                             f"tokens kept), e.g. {self.policy}:0.5.")
        object.__setattr__(self, "keep", float(keep))
        for name, low in (("sinks", 0), ("window", 1), ("kernel", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{self.policy}'s {name} must be a whole number >= {low}, got {value!r}.")
        if self.kernel % 2 == 0:
            raise ValueError(f"snapkv's kernel (the pooling width) must be odd, so that it centres on a token; got "
                             f"{self.kernel}. Try kernel={self.kernel + 1}.")

    @property
    def text(self) -> str:
        """The canonical text after `@`: "snapkv:0.5", options that differ from their defaults, then rest."""
        opts = [f"{k}={getattr(self, k)}" for k in _OPTION_ORDER
                if k in POLICIES[self.policy] and getattr(self, k) != POLICIES[self.policy][k]]
        if self.rest is not None:
            opts.append(f"rest={self.rest.spec}")
        return ",".join([f"{self.policy}:{self.keep:g}"] + opts)

    def __str__(self) -> str:
        return self.text

    def kept(self, n: int) -> int:
        """Tokens kept of an n-token context on every KV head: ceil(keep x n), at least 1 (none of none)."""
        return min(n, max(1, math.ceil(self.keep * n - 1e-9))) if n > 0 else 0

    def with_keep(self, keep: float) -> Eviction:
        """The same policy and options at another keep ratio."""
        return replace(self, keep=keep)

    def check_context(self, n: int) -> None:
        """ValueError when the policy cannot run on an n-token context (snapkv's window must be shorter)."""
        if self.policy == "snapkv" and self.window >= n and self.kept(n) < n:
            raise ValueError(f"snapkv's window of {self.window} queries is not shorter than the {n}-token context: "
                             f"give window=N below {n} (e.g. 'snapkv:{self.keep:g},window={max(1, n // 4)}'), or a "
                             f"longer prompt.")


def parse_eviction(text: str) -> Eviction:
    """"snapkv:0.5,window=16,rest=int2" (the text after a plan's `@`) -> Eviction; ValueError naming what to write
    for a missing ratio, an unknown policy or option, or a bad value."""
    text = text.strip()
    name, sep, rest = text.partition(":")
    name = name.strip().lower()
    if name not in POLICIES:
        raise ValueError(f"Unknown eviction policy {name!r} in '@ {text}'; the policies are {', '.join(POLICIES)} "
                         f"(e.g. {_EXAMPLE}).")
    parts = [p.strip() for p in rest.split(",")] if sep else []
    if not parts or not parts[0]:
        raise ValueError(f"'@ {text}' gives no keep ratio: write the share of context tokens to keep after the "
                         f"policy, e.g. '@ {name}:0.5'.")
    try:
        keep = float(parts[0])
    except ValueError:
        raise ValueError(f"{parts[0]!r} in '@ {text}' is not a keep ratio: write a number in (0, 1], e.g. "
                         f"'@ {name}:0.5'.") from None
    allowed = (*POLICIES[name], "rest")
    options: dict = {}
    for part in parts[1:]:
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq or key not in allowed:
            raise ValueError(f"{part!r} in '@ {text}' is not an option of {name}; it takes "
                             f"{', '.join(k + '=' for k in allowed)} (e.g. '@ {name}:0.5,"
                             f"{allowed[0]}={POLICIES[name].get(allowed[0], 'int2')}').")
        if key in options:
            raise ValueError(f"'@ {text}' gives {key} twice; give it once.")
        if key == "rest":
            options[key] = get_format(value)
        elif value.isdigit():
            options[key] = int(value)
        else:
            raise ValueError(f"{name}'s {key} must be a whole number, got {value!r} in '@ {text}'.")
    return Eviction(name, keep, **options)
