"""A long teacher-forced pass, chunk by chunk: the exact model (DynamicCache) against each format's
QuantizedKVCache through the fused CPU chunk path (kernels/cpu/chunk.py) and through the reference (dequantize the
whole history, then SDPA), as printed ratios to the exact pass measured in the same process.

    python benchmarks/chunked_pass.py                                  # SmolLM2-135M, 8,192 tokens, chunks of 512
    python benchmarks/chunked_pass.py --tokens 4096 --formats int4,q4_0 --reference int4
    python benchmarks/chunked_pass.py --model gemma-3-270m --tokens 32768 --reference none

One WikiText-2 text (kvviz.quality.corpus) of N tokens runs as `model(input_ids=chunk, past_key_values=cache)`
over chunks of C tokens; each chunk's logits give its tokens' negative log-likelihood (the same computation on every
path), so the figures include everything a chunked quality pass does. Paths run interleaved, round by round, best
of the rounds kept: on a shared machine the load moves between runs, and only ratios measured side by side in one
process mean anything. Prints the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the repository

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from kvviz import QuantizedKVCache  # noqa: E402
from kvviz.attention import active_backend, use_backend  # noqa: E402
from kvviz.models import load_model  # noqa: E402
from kvviz.quality.corpus import wikitext_ids  # noqa: E402

FORMATS = "int4,k8v4,mxfp4,nvfp4,fp8_e4m3,q4_0"


def chunked_pass(model, ids: torch.Tensor, chunk: int, spec: str | None, backend: str) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of this process, mean NLL in nats) of one pass over ids [1, N] in chunks:
    DynamicCache when spec is None."""
    cache = DynamicCache(config=model.config) if spec is None else QuantizedKVCache(model.config, spec)
    nll, count = 0.0, 0
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode(), use_backend(backend):
        for i in range(0, ids.shape[1], chunk):
            piece = ids[:, i:i + chunk]
            logits = model(input_ids=piece, past_key_values=cache).logits[0, :-1].float()
            target = piece[0, 1:]
            nll += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
            count += target.numel()
    return time.perf_counter() - start, time.process_time() - cpu, nll / max(count, 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model name or path (default: the bundled SmolLM2-135M)")
    p.add_argument("--tokens", type=int, default=8192, help="tokens in the text (default 8192)")
    p.add_argument("--chunk", type=int, default=512, help="tokens per chunk (default 512)")
    p.add_argument("--formats", default=FORMATS, help=f"comma-separated kvviz specs (default {FORMATS})")
    p.add_argument("--reference", default="all",
                   help="formats also timed through the reference path: all (default), none, or a comma list")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds, best kept (default 1)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch and numba threads (default: torch's); 1 makes CPU seconds a fair measure on a busy machine")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    reference = (formats if args.reference == "all" else [] if args.reference == "none"
                 else [f.strip() for f in args.reference.split(",") if f.strip()])
    model, tok = load_model(args.model)
    ids = wikitext_ids(tok, args.tokens)
    with use_backend("cpu"):
        fused_backend = active_backend()  # compiles (or loads) the numba kernels before any timing
    runs = [("DynamicCache", None, "torch")] + [(f, f, "cpu") for f in formats] + [(f, f, "torch") for f in reference]
    for name, spec, backend in runs:  # warm-up: one short pass each (first-call costs, numba's dispatch)
        chunked_pass(model, ids[:, : 2 * min(args.chunk, 64)], min(args.chunk, 64), spec, backend)
    if args.threads:  # again: loading the model and the kernels can reset torch's thread count
        torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    start = time.perf_counter()
    best: dict[tuple[str, str], tuple[float, float, float]] = {}
    for _ in range(args.rounds):
        for name, spec, backend in runs:
            seconds, cpu, nll = chunked_pass(model, ids, args.chunk, spec, backend)
            key = (name, backend)
            if key not in best or seconds < best[key][0]:
                best[key] = (seconds, cpu, nll)
            print(f"  {name} ({'fused' if backend == 'cpu' and spec else 'reference' if spec else 'exact'}): "
                  f"{seconds:.1f} s, {cpu:.1f} CPU s", file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    exact, exact_cpu = best[("DynamicCache", "torch")][:2]
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads, "
          f"load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; {args.model or 'smollm2-135m'} "
          f"({model.dtype}), {ids.shape[1]} tokens in chunks of {args.chunk}, best of {args.rounds} round(s); fused "
          f"backend {fused_backend}; {time.perf_counter() - start:.0f} s")
    print()
    print("| cache | path | seconds | vs exact | CPU seconds | vs exact (CPU) | reference / fused | NLL (nats) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, backend), (seconds, cpu, nll) in best.items():
        path = "exact" if name == "DynamicCache" else "fused" if backend == "cpu" else "reference"
        vs = ""
        if path == "fused" and (name, "torch") in best:
            vs = f"{best[(name, 'torch')][0] / seconds:.2f}x"
        print(f"| {name} | {path} | {seconds:.1f} | {seconds / exact:.2f}x | {cpu:.1f} | {cpu / exact_cpu:.2f}x | {vs} | "
              f"{nll:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
