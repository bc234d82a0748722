"""Lesson 7's measurement from the command line: kvviz.quality.fused_vs_unfused on a model, as a markdown table.

    python benchmarks/fused_vs_unfused.py                          # SmolLM2-135M, 1,024 tokens, int4 and k8v4
    python benchmarks/fused_vs_unfused.py --context 4096 --formats int4,k8v4,mxfp4 --rounds 3

Greedy decode after a WikiText-2 prompt through DynamicCache and through each format fused (the numba kernel on
the CPU, Triton on CUDA) and unfused (the torch reference), one prefill shared by every run, interleaved rounds
with the best kept. Bytes read per step: K/V at the last step (see fused_vs_unfused's docstring for what is
counted). Prints the machine's load average before and after, since the figures move with it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the repository

import torch  # noqa: E402

from kvviz import quality  # noqa: E402
from kvviz.models import load_model  # noqa: E402
from kvviz.quality.speed import EXACT, FUSED  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model name or path (default: the bundled SmolLM2-135M)")
    p.add_argument("--context", type=int, default=1024, help="prompt tokens (default 1024)")
    p.add_argument("--decode-tokens", type=int, default=8, help="timed decode steps per round (default 8)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds, best kept (default 2)")
    p.add_argument("--formats", default="int4,k8v4", help="comma-separated kvviz specs (default int4,k8v4)")
    args = p.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    model, tok = load_model(args.model)
    load0 = os.getloadavg()
    start = time.perf_counter()
    report = quality.fused_vs_unfused(model, quality.wikitext_ids(tok, args.context), formats, args.decode_tokens,
                                      args.rounds)
    seconds = time.perf_counter() - start
    load1 = os.getloadavg()
    base = report.run("DynamicCache", EXACT).tokens_per_s
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads, "
          f"load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; {args.model or 'smollm2-135m'} "
          f"({model.dtype}), {report.context}-token prompt, best of {report.rounds} rounds of {report.new_tokens} "
          f"tokens; fused backend {report.fused_backend} (runs here: {report.fused_available}); {seconds:.0f} s")
    print()
    print("| cache | path | backend | tokens/s | vs DynamicCache | fused vs unfused | K/V read per step (MiB) |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in report.runs:
        vs = f"{r.tokens_per_s / report.run(r.name, 'unfused').tokens_per_s:.2f}x" if r.path == FUSED else ""
        print(f"| {r.name} | {r.path} | {r.backend} | {r.tokens_per_s:.2f} | {r.tokens_per_s / base:.2f}x | {vs} | "
              f"{r.bytes_read / 2**20:.2f} |")
    print()
    for f in report.formats:
        print(f"{f}: fused and unfused tokens {'identical' if report.same_tokens(f) else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
