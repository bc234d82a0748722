"""One decode step's cache append on the CPU: kvviz.formats' quantize against the fused numba packer
(kernels/cpu/pack.py), per layer (K + V), in one process, interleaved.

    python benchmarks/bench_cpu_append.py                       # SmolLM2-135M shapes, 4K context
    python benchmarks/bench_cpu_append.py --context 1024 --rounds 500

Shapes are SmolLM2-135M's (batch 1, 3 KV heads, head_dim 64, fp32 states). For each format two layers are
prefilled with the same `--context` random tokens, one appending through kvviz.formats (KVVIZ_BACKEND=torch), one
through quant_pack_cpu (KVVIZ_BACKEND=cpu); then each round times one QuantizedKVLayer.update of a new token on
every layer, formats in turn, so a busy machine penalizes both alike. Prints the median and the best ms per
append (K + V), the ratio of medians, and the ms per token over the model's 30 layers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the repository

from kvviz.cache import QuantizedKVLayer  # noqa: E402
from kvviz.formats import parse_kv  # noqa: E402

FORMATS = ("int4", "k8v4", "mxfp4", "nvfp4", "fp8_e4m3", "int8")
KV_HEADS, HEAD_DIM, LAYERS = 3, 64, 30  # SmolLM2-135M


def _layer(spec: str, backend: str, prefill: torch.Tensor) -> QuantizedKVLayer:
    """A layer of `spec` whose sides chose their packer under KVVIZ_BACKEND=backend, prefilled."""
    os.environ["KVVIZ_BACKEND"] = backend  # read when a side first sees a device, i.e. at this prefill
    kv = parse_kv(spec)
    layer = QuantizedKVLayer(kv.k, kv.v)
    layer.update(prefill, prefill)
    return layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=4096, help="prefill tokens (default 4096)")
    parser.add_argument("--rounds", type=int, default=300, help="timed appends per format and path (default 300)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated specs or presets")
    args = parser.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]

    g = torch.Generator().manual_seed(0)
    prefill = torch.randn(1, KV_HEADS, args.context, HEAD_DIM, generator=g)
    steps = torch.randn(args.rounds + 10, 1, KV_HEADS, 1, HEAD_DIM, generator=g)  # one new token per step
    layers = {(spec, path): _layer(spec, backend, prefill)
              for spec in formats for path, backend in (("formats", "torch"), ("packer", "cpu"))}
    for (spec, path), layer in layers.items():
        packer = layer.k._packer
        want = None if path == "formats" else "quant_pack_cpu"
        assert (packer and packer.__name__) == want, f"{spec} {path}: packer {packer} (numba missing?)"
    times = {key: [] for key in layers}
    for r in range(args.rounds + 10):
        for key, layer in layers.items():
            x = steps[r]
            t0 = time.perf_counter()
            layer.update(x, x)
            if r >= 10:  # the first appends warm caches up
                times[key].append((time.perf_counter() - t0) * 1e3)

    print(f"append of one token per layer (K + V), batch 1, {KV_HEADS} KV heads, head_dim {HEAD_DIM}, "
          f"fp32 states, after a {args.context}-token prefill; {args.rounds} rounds, torch threads "
          f"{torch.get_num_threads()}")
    print(f"{'format':<10} {'formats ms':>11} {'packer ms':>10} {'best f/p ms':>14} {'ratio':>6} "
          f"{'ms/token x30 f -> p':>21}")
    for spec in formats:
        f, p = times[(spec, "formats")], times[(spec, "packer")]
        fm, pm = statistics.median(f), statistics.median(p)
        print(f"{spec:<10} {fm:>11.3f} {pm:>10.3f} {min(f):>7.3f}/{min(p):.3f} {fm / pm:>5.1f}x "
              f"{fm * LAYERS:>10.1f} -> {pm * LAYERS:.1f}")


if __name__ == "__main__":
    main()
