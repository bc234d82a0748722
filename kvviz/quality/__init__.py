"""Output quality of KV formats: side-by-side generation, teacher-forced KL / top-1, perplexity, needle retrieval.

    from kvviz import quality
    report = quality.compare(model, tok, prompt, ["fp8_e4m3", "k8v4", "k4v8", "kivi2"], max_new_tokens=32)
    report.rows()                        # CompareRow per format, the baseline first: KL, top-1, bytes, tokens/s
    for update in quality.compare_stream(model, tok, prompt, specs):   # partial texts per step (the UI streams)
        ...
    quality.perplexity(model, tok, ["fp8_e4m3", "int4"])               # WikiText-2 slice, strided windows
    quality.needle(model, tok, ["fp8_e4m3", "int4"])                   # retrieval rate against needle depth
    quality.kld(model, tok, ["fp8_e4m3", "int4; 0,29=fp16"])           # llama.cpp's KLD statistics (divergence.py)
    quality.fused_vs_unfused(model, quality.wikitext_ids(tok, 1024), ["int4"])   # tokens/s, bytes read per step

Metrics come from one batched decode loop whose rows each hold their own format (kvviz.cache.row_stack) and are computed
by kvviz.metrics; tokens/s come from each format's own cache and attention backend (kvviz.quality.decode).

Modules, bottom to top (each imports only those before it): corpus (the WikiText-2 slice), decode (prefill, a
cache loaded from it, timed decode), report (Compare's result types); then compare, needle, perplexity, speed (fused
against unfused), divergence (kld). compare and kld run a `llama.cpp:` name as llama.cpp runs it
(kvviz.analysis.llamacpp), against llama.cpp's f16 cache run.
"""

from kvviz.cache.row_stack import RowStackCache
from kvviz.metrics import kl_top1
from kvviz.quality.compare import compare, compare_stream
from kvviz.quality.corpus import wikitext, wikitext_ids
from kvviz.quality.decode import (Decoding, decode_speed, load_prefill, make_cache, prefill, step_times,
                                  timed_decode)
from kvviz.quality.divergence import base_logprobs, kld, load_base, save_base
from kvviz.quality.needle import DEPTHS, haystack, needle
from kvviz.quality.perplexity import perplexity
from kvviz.quality.report import CompareRow, FormatResult, MapPoint, QualityReport, StreamUpdate, quality_map
from kvviz.quality.speed import DecodeRun, FusedReport, fused_vs_unfused, recorded_by_context

__all__ = [
    "DEPTHS",
    "CompareRow",
    "DecodeRun",
    "FormatResult",
    "FusedReport",
    "MapPoint",
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
    "recorded_by_context",
    "haystack",
    "kl_top1",
    "load_prefill",
    "make_cache",
    "needle",
    "perplexity",
    "quality_map",
    "prefill",
    "timed_decode",
    "Decoding",
    "step_times",
    "wikitext",
    "wikitext_ids",
]
