"""Bad input for the long-context measurements, caught before any model compute; each a ValueError whose message
says what to do: a context beyond the model's positions or beyond the memory the run needs, needle depths out of
[0, 1], no new tokens, an unknown format (the spec parser's own message).

The memory estimate (MemoryEstimate) adds what a position pass holds at its peak: the model's weights, the exact
DynamicCache and every format's quantized cache at the full context (kvviz.memory.kv_cache_bytes_for, as the
caches account for themselves), and the working memory of one chunk: the dequantized K/V of one layer a format's
attention reads, the attention scores of one layer, the MLP's activations, and one block of positions' logits with
the float64 probabilities the KL is taken against (kvviz.quality.long_context.position). The needle at length holds
instead (`rows`) the prefill with every token kept, then in turn a batch of exact rows (a full-precision mirror of
the context each) and each format's cache with a row per question, and row_stable's packed copy of the linear
weights.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from torch import nn

from kvviz.formats import Plan, as_plans
from kvviz.memory import kv_cache_bytes_for, layer_shapes

# Values of one [positions, vocab] block of logits: 64 MiB in fp32, its P 128 MiB in float64. 64 positions of Gemma 3's
# 262K vocabulary a block: the LM head's product ran at 92 GFLOP/s there against 65 at 32 (2 cores, 2026-12-07)
LOGIT_BLOCK = 1 << 24


def parse_formats(formats, model) -> list[Plan]:
    """Specs or plans (strings, KVSpecs, Plans) -> Plans checked against the model's layer count; ValueError for an
    unknown format (the parser's message) or an empty list."""
    if isinstance(formats, str):
        formats = [formats]
    if not formats:
        raise ValueError("Choose at least one KV format to measure (e.g. int4, k8v4, mxfp4).")
    return as_plans(list(formats), model.config.get_text_config(decoder=True).num_hidden_layers)


def max_positions(model) -> int | None:
    """The model's max_position_embeddings (None when its config does not say)."""
    return getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)


def model_name(model) -> str:
    return str(getattr(model.config, "_name_or_path", "") or "the model").rstrip("/").rsplit("/", 1)[-1]


def check_new_tokens(n) -> int:
    """n as the number of new tokens to generate (a whole number from 2); ValueError otherwise."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"The number of new tokens must be a whole number of at least 2; got {n!r}.")
    return n


def check_depths(depths) -> list[float]:
    """Needle depths as floats in [0, 1] (fractions of the context); ValueError for an empty list or a depth out of
    range."""
    try:
        out = [float(d) for d in depths]
    except (TypeError, ValueError):
        raise ValueError(f"Needle depths are fractions of the context in [0, 1], e.g. 0, 0.5, 1; got {depths!r}.") \
            from None
    bad = [d for d in out if not 0.0 <= d <= 1.0 or math.isnan(d)]
    if not out or bad:
        raise ValueError(f"Needle depths are fractions of the context in [0, 1] (0: the start, 1: the end); "
                         f"{'none given' if not out else 'got ' + ', '.join(f'{d:g}' for d in bad)}.")
    return out


def available_bytes() -> int:
    """Memory this machine can still give (MemAvailable of /proc/meminfo; the physical pages where it is absent)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a long-context run needs at its peak, and what the machine has free (see the module docstring)."""

    model_bytes: int
    exact_cache_bytes: int
    format_cache_bytes: dict
    transient_bytes: int
    available_bytes: int
    mirror_bytes: int = 0  # a batch of RowStackCache rows' full-precision mirrors (the needle at length)
    one_at_a_time: bool = False  # the mirror batch and each format's caches are held in turn, not together

    @property
    def total_bytes(self) -> int:
        held = [self.mirror_bytes, *self.format_cache_bytes.values()]
        batches = max(held) if self.one_at_a_time else sum(held)
        return self.model_bytes + self.exact_cache_bytes + batches + self.transient_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.available_bytes


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f}"


def mirror_bytes(model, context: int) -> int:
    """Bytes of one RowStackCache row's mirror at `context` tokens: K and V of every layer that holds them, every
    token kept (sliding layers' too), in the model's dtype; what a prefill keeping every token holds too."""
    itemsize = next(model.parameters()).element_size()
    per_token = sum(s.k_heads * s.k_dim + s.v_heads * s.v_dim for s in layer_shapes(model.config) if s.has_kv)
    return per_token * itemsize * context


def estimate_memory(model, context: int, plans: list[Plan], chunk: int, available: int | None = None,
                    copies: int = 1, rows: int = 0, questions: int = 1) -> MemoryEstimate:
    """The MemoryEstimate of a position pass of `context` tokens in chunks of `chunk` through every plan; copies:
    caches held per run (a generation holds a teacher-forced and a free-running row per format).

    rows: the needle at length instead (kvviz.quality.long_context.needles; `copies` is then not read): the
    prefill, every token kept; then, one at a time, a batch of `rows` exact RowStackCache rows, each a
    full-precision mirror of the context, and each format's cache with its `questions` rows and one more copy;
    row_stable's packed copy of the linear weights (an upper bound: it packs float32 CPU layers only)."""
    text = model.config.get_text_config(decoder=True)
    itemsize = next(model.parameters()).element_size()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    # DynamicCache in the model's dtype: the 16-bit bytes, scaled
    one_exact = kv_cache_bytes_for(model.config, context, k="fp16", layout="transformers") * itemsize // 2
    one = {}
    for plan in plans:
        try:
            one[plan.name] = kv_cache_bytes_for(model.config, context, k=plan, layout="transformers")
        except (ValueError, KeyError, TypeError):  # a dtype the byte model does not size: as the exact cache
            one[plan.name] = one_exact
    if rows:
        exact = mirror_bytes(model, context)
        mirrors = rows * exact
        formats = {name: (questions + 2) * b for name, b in one.items()}
        weights += sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, nn.Linear))
    else:
        exact, mirrors = one_exact * copies, 0
        formats = {name: copies * b for name, b in one.items()}
    heads = getattr(text, "num_attention_heads", 1)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    chunk = min(chunk, context)
    kv_read = 2 * kv_heads * context * head_dim * 4 * 2          # one layer's K and V dequantized, and a copy
    scores = heads * chunk * context * 4 * 2                     # one layer's attention scores and softmax
    mlp = chunk * (getattr(text, "intermediate_size", 4 * text.hidden_size) * 3 + 8 * text.hidden_size) * 4
    logits = 4 * LOGIT_BLOCK * 8  # a block's fp32 logits and float64 P; without numba, float64 copies of the logits
    transient = kv_read + scores + mlp + logits
    return MemoryEstimate(weights, exact, formats, transient, available_bytes() if available is None else available,
                          mirrors, one_at_a_time=bool(rows))


def check_context(model, context, plans: list[Plan], chunk: int = 512, available: int | None = None,
                  copies: int = 1, rows: int = 0, questions: int = 1) -> MemoryEstimate:
    """ValueError for a context beyond the model's positions, too short, or beyond the free memory (saying how much
    the run would need and how much there is); else the MemoryEstimate. available: free bytes (None: this
    machine's); copies, rows, questions: as estimate_memory."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 16:
        raise ValueError(f"The context is a number of tokens, at least 16; got {context!r}.")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"The chunk is a number of tokens per forward pass, at least 1; got {chunk!r}.")
    limit = max_positions(model)
    if limit is not None and context > limit:
        raise ValueError(f"A context of {context:,} tokens is beyond {model_name(model)}'s {limit:,} positions; "
                         f"choose {limit:,} or fewer.")
    est = estimate_memory(model, context, plans, chunk, available, copies, rows, questions)
    if not est.fits:
        caches = (f"format caches {_gb(sum(est.format_cache_bytes.values()))}" if not est.one_at_a_time else
                  f"then one at a time the exact rows' mirrors {_gb(est.mirror_bytes)} or a format's rows, up to "
                  f"{_gb(max(est.format_cache_bytes.values(), default=0))}")
        raise ValueError(
            f"A {context:,}-token run with {len(plans)} format(s) needs about {_gb(est.total_bytes)} GB (model "
            f"{_gb(est.model_bytes)}, exact cache {_gb(est.exact_cache_bytes)}, {caches}, working memory "
            f"{_gb(est.transient_bytes)}); this machine has {_gb(est.available_bytes)} GB free. Choose a shorter "
            f"context, fewer formats or a smaller chunk.")
    return est
