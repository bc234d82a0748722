"""Output quality of KV formats: side-by-side generation, teacher-forced KL / top-1, perplexity, needle retrieval.

    from kvviz import quality
    report = quality.compare(model, tok, prompt, ["fp8_e4m3", "k8v4", "k4v8", "kivi2"], max_new_tokens=32)
    report.table()                       # one row per format: mean KL, top-1, divergence, bytes, tokens/s
    for update in quality.compare_stream(model, tok, prompt, specs):   # partial texts per step (the UI streams)
        ...
    quality.perplexity(model, tok, ["fp8_e4m3", "int4"])               # WikiText-2 slice, strided windows
    quality.needle(model, tok, ["fp8_e4m3", "int4"])                   # retrieval rate against needle depth
    quality.kld(model, tok, ["fp8_e4m3", "int4; 0,29=fp16"])           # llama.cpp's KLD statistics (divergence.py)
    quality.fused_vs_unfused(model, quality.wikitext_ids(tok, 1024), ["int4"])   # tokens/s, bytes read per step

Metrics come from one batched decode loop whose rows each hold their own format (kvviz.cache.rows); tokens/s
come from each format's own cache and attention backend (kvviz.quality.speed).
"""

# kvviz.quality.kld is the function below (the API); the pure statistics are imported from the module by
# name: `from kvviz.quality.kld import kld_stats` (sys.modules keeps the module, the attribute is the function)
from kvviz.quality.divergence import base_logprobs, kld, load_base, save_base
from kvviz.quality.compare import (FormatResult, QualityReport, StreamUpdate, compare, compare_stream, kl_top1,
                                   prefill)
from kvviz.quality.needle import DEPTHS, haystack, needle
from kvviz.quality.perplexity import perplexity, wikitext
from kvviz.cache.rows import RowStackCache
from kvviz.quality.speed import (DecodeRun, FusedReport, decode_speed, fused_vs_unfused, load_prefill, make_cache,
                                 timed_decode, wikitext_ids)

__all__ = [
    "DEPTHS",
    "DecodeRun",
    "FormatResult",
    "FusedReport",
    "base_logprobs",
    "kld",
    "load_base",
    "save_base",
    "QualityReport",
    "RowStackCache",
    "StreamUpdate",
    "compare",
    "compare_stream",
    "decode_speed",
    "fused_vs_unfused",
    "haystack",
    "kl_top1",
    "load_prefill",
    "make_cache",
    "needle",
    "perplexity",
    "prefill",
    "timed_decode",
    "wikitext",
    "wikitext_ids",
]
