"""Long context: how a KV format's damage grows with position and with generation length, and whether a needle
survives at 2K-8K. Every function checks its input first and raises ValueError with what to do.

    from kvviz.quality import long_context as lc
    for upd in lc.position_drift(model, tok, ["int4", "k8v4"], context=4096):      # streamed, chunk by chunk
        upd.smoothed(256), upd.crossings((0.01, 0.05, 0.1))
    for upd in lc.generation_drift(model, tok, ["int4"], new_tokens=512): ...      # streamed, every few steps
    for upd in lc.needle_at_length(model, tok, ["int4"], contexts=(2048, 4096, 8192)): ...

Modules: text (the long text), checks (bad input, the memory estimate), position (damage by position), generation
(damage by generation length), needles (needle at length). Figures: kvviz.plots.long_context. CLI: kvviz drift.
"""

from kvviz.quality.long_context.checks import (MemoryEstimate, check_context, check_depths, check_new_tokens,
                                               estimate_memory, model_name, parse_formats)
from kvviz.quality.long_context.generation import GenerationDrift, generation_drift, repeated_ngrams, repetition
from kvviz.quality.long_context.needles import CONTEXTS, DEPTHS10, NeedleAtLength, needle_at_length
from kvviz.quality.long_context.position import (THRESHOLDS, WINDOW, PositionDrift, crossings, position_drift,
                                                 smooth)
from kvviz.quality.long_context.text import REPEAT_MARKER, long_text_ids, read_text_file

__all__ = ["CONTEXTS", "DEPTHS10", "GenerationDrift", "MemoryEstimate", "NeedleAtLength", "PositionDrift",
           "REPEAT_MARKER", "THRESHOLDS", "WINDOW", "check_context", "check_depths", "check_new_tokens", "crossings",
           "estimate_memory", "generation_drift", "long_text_ids", "model_name", "needle_at_length", "parse_formats",
           "position_drift", "read_text_file", "repeated_ngrams", "repetition", "smooth"]
