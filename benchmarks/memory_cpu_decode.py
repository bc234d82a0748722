"""The process's memory while decoding on the CPU through a quantized cache, against DynamicCache's cache bytes.

Issue 23's memory rule: the packed cache stays the only copy while decoding (no full-precision history, no growing
temporaries), so the resident memory above the loaded model stays within 0.3x of what DynamicCache's K/V would
hold at that context. The script loads the bundled model, measures the resident set (VmRSS, after glibc's
malloc_trim so that freed heap is given back), fills a cache with a `--context`-token prompt, decodes `--tokens`
steps and reports the resident set above the model after the prompt and at its highest during the decode. The
baseline is taken after a short warm-up generation (every weight page touched, numba's kernels loaded).

    python benchmarks/memory_cpu_decode.py                      # int4, 8K context, real prefill (minutes)
    python benchmarks/memory_cpu_decode.py --synthetic          # the prompt's K/V drawn at random, per layer
    python benchmarks/memory_cpu_decode.py --spec k8v4 --context 4096
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kvviz  # noqa: E402
from kvviz import quality  # noqa: E402


def rss_bytes() -> int:
    """The resident set after giving freed heap back to the OS (Linux: /proc/self/status, glibc malloc_trim)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: the figure then includes freed heap
        pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status (this script reads Linux's)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", default="int4")
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--tokens", type=int, default=16, help="decode steps (default 16)")
    p.add_argument("--synthetic", action="store_true", help="fill the cache with random K/V, layer by layer, instead "
                   "of running the model over a prompt (seconds instead of minutes; the same bytes held)")
    args = p.parse_args()
    model, tok = kvviz.load_model()
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    with torch.no_grad():  # touch every weight page and load the compiled kernels before the baseline
        warm = kvviz.QuantizedKVCache(cfg, args.spec)
        nxt = model(input_ids=torch.arange(1, 33)[None], cache=warm, use_cache=True).logits[:, -1:].argmax(-1)
        for _ in range(3):
            nxt = model(input_ids=nxt, cache=warm, use_cache=True).logits[:, -1:].argmax(-1)
        del warm, nxt
    base = rss_bytes()
    cache = kvviz.QuantizedKVCache(cfg, args.spec)
    t0 = time.perf_counter()
    with torch.no_grad():
        if args.synthetic:
            g = torch.Generator().manual_seed(0)
            for i in range(cfg.num_hidden_layers):  # [1, Hkv, T, D] per side, one layer at a time
                k, v = torch.randn(2, 1, cfg.num_key_value_heads, args.context, head_dim, generator=g)
                cache.update(k, v, i)
                del k, v
            nxt = torch.tensor([[1]])
        else:
            ids = tok(quality.wikitext(), return_tensors="pt")["input_ids"]
            while ids.shape[1] < args.context:
                ids = torch.cat([ids, ids], dim=1)
            out = model(input_ids=ids[:, : args.context], cache=cache, use_cache=True, logits_to_keep=1)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            del out
    filled_s = time.perf_counter() - t0
    after_prompt = rss_bytes()
    peak = after_prompt
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(args.tokens):
            nxt = model(input_ids=nxt, cache=cache, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
            with open("/proc/self/status") as f:  # no trim here: growing temporaries would show
                peak = max(peak, next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")))
    tps = args.tokens / (time.perf_counter() - t0)
    tokens = args.context + args.tokens
    dynamic = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * tokens * model.dtype.itemsize
    mib = 2**20
    print(f"{args.spec}, context {args.context} ({'synthetic K/V' if args.synthetic else 'real prefill'}, "
          f"{filled_s:.0f} s), {args.tokens} decode steps at {tps:.2f} tokens/s, backend "
          f"{kvviz.attention.active_backend()}; load average {os.getloadavg()[0]:.2f}")
    print(f"model resident:                {base / mib:8.1f} MiB")
    print(f"cache.nbytes():                {cache.nbytes() / mib:8.1f} MiB")
    print(f"DynamicCache's K/V would hold: {dynamic / mib:8.1f} MiB ({model.dtype})")
    print(f"above the model, after prompt: {(after_prompt - base) / mib:8.1f} MiB "
          f"({(after_prompt - base) / dynamic:.2f}x DynamicCache's bytes)")
    print(f"above the model, decode peak:  {(peak - base) / mib:8.1f} MiB "
          f"({(peak - base) / dynamic:.2f}x DynamicCache's bytes; target <= 0.30x)")


if __name__ == "__main__":
    main()
