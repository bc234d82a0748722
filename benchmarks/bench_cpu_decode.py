"""Decode speed on the CPU at a long context: the fused numba path (KVVIZ_BACKEND=cpu) against the unfused
reference (KVVIZ_BACKEND=torch) and DynamicCache, whole model and one attention layer, in one process.

    python benchmarks/bench_cpu_decode.py                  # SmolLM2-135M, 4K context, int4 / k8v4 / mxfp4
    python benchmarks/bench_cpu_decode.py --context 1024 --formats int4 --cold

Whole model: tokens/s of greedy decode after a `--context`-token WikiText-2 prompt (batch 1), every cache loaded
with the same prefill K/V (kvviz.quality.timed_decode); caches and backends are timed in interleaved rounds and
the best round is kept, so a busy machine penalizes all alike. Ratios are against DynamicCache and against the
unfused reference measured in this process. One layer: the attention call alone (kvviz_attention_forward) over
the model's own layer-0 K/V, in ms, against SDPA over DynamicCache's fp32 K/V, plus one token's append (ms).
First use: kernels.cpu.decode.cpu_usable() in this process (a compile, or a load from numba's on-disk cache); with
--cold also a compile into an empty cache directory, in a subprocess.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from anywhere in the repository

from kvviz import quality  # noqa: E402
from kvviz.attention import kvviz_attention_forward  # noqa: E402
from kvviz.models import load_model  # noqa: E402

FORMATS = ("int4", "k8v4", "mxfp4")
BACKENDS = ("cpu", "torch")  # fused numba, unfused reference


def best_ms(fn, reps: int = 20) -> float:
    """Minimum wall time of fn() in ms over `reps` calls after one warmup (others' load only ever adds time)."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def cold_compile_s() -> float:
    """Seconds `python -m kernels.cpu.decode` takes with an empty numba cache directory (a full compile)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "NUMBA_CACHE_DIR": tmp}
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kernels.cpu.decode"], cwd=ROOT, env=env, check=True, capture_output=True)
        return time.perf_counter() - t


def layer_times(model, dyn, formats) -> dict:
    """ms of one decode attention call on layer 0 (the prefilled K/V plus one token): SDPA over the fp32 K/V,
    and per format each backend; plus the append of one token to the quantized layer."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from kvviz.cache import QuantizedKVCache

    attn = model.model.layers[0].self_attn
    keys, values = dyn.layers[0].keys, dyn.layers[0].values  # [1, Hkv, T, D] fp32
    hq = model.config.num_attention_heads
    q = torch.randn(1, hq, 1, keys.shape[-1])  # [B, Hq, 1, D]
    k1, v1 = keys[:, :, -1:].clone(), values[:, :, -1:].clone()
    out = {"sdpa": best_ms(lambda: sdpa_attention_forward(attn, q, torch.cat([keys, k1], 2),
                                                           torch.cat([values, v1], 2), None, scaling=attn.scaling,
                                                           is_causal=False))}
    for spec in formats:
        cache = QuantizedKVCache(model.config, spec)
        layer = cache.layers[0]
        layer.update(keys, values)
        pk, pv = layer.update(k1, v1)
        for backend in BACKENDS:
            os.environ["KVVIZ_BACKEND"] = backend
            out[(spec, backend)] = best_ms(lambda: kvviz_attention_forward(attn, q, pk, pv, None,
                                                                            scaling=attn.scaling))
        fresh = QuantizedKVCache(model.config, spec).layers[0]
        fresh.update(keys, values)
        out[(spec, "append")] = best_ms(lambda: fresh.update(k1, v1), reps=50)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model name or path (default: the bundled SmolLM2-135M)")
    p.add_argument("--context", type=int, default=4096, help="prompt tokens before the timed decode (default 4096)")
    p.add_argument("--decode-tokens", type=int, default=8, help="timed decode steps per round (default 8)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, best kept (default 3)")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated kvviz specs")
    p.add_argument("--cold", action="store_true", help="also time a compile into an empty numba cache")
    args = p.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]

    from kernels.cpu import decode as cpu

    t = time.perf_counter()
    usable = cpu.cpu_usable()
    first_use = time.perf_counter() - t
    cold = cold_compile_s() if args.cold else None
    torch.manual_seed(0)
    model, tok = load_model(args.model)
    text = tok(quality.wikitext(), return_tensors="pt")["input_ids"]
    ids = text[:, : args.context]
    if ids.shape[1] < args.context:  # the bundled slice is shorter: repeat it
        ids = text.repeat(1, args.context // text.shape[1] + 1)[:, : args.context]
    with torch.no_grad():
        dyn, logits0 = quality.prefill(model, ids)
        first = int(logits0.argmax())
        runs = [("DynamicCache", None, None)] + [(f, f, b) for f in formats for b in BACKENDS]
        tps = {}
        for _ in range(args.rounds):
            for name, spec, backend in runs:
                if backend:
                    os.environ["KVVIZ_BACKEND"] = backend
                rate, cache, _ = quality.timed_decode(model, dyn, spec, first, args.decode_tokens)
                tps[(name, backend)] = max(rate, tps.get((name, backend), 0.0))
                del cache
        layer = layer_times(model, dyn, formats)
    os.environ.pop("KVVIZ_BACKEND", None)

    base = tps[("DynamicCache", None)]
    load = os.getloadavg()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; context {ids.shape[1]}, best of {args.rounds} "
          f"rounds of {args.decode_tokens} tokens; fused CPU usable: {usable}, first use {first_use:.1f} s"
          + (f", cold compile {cold:.1f} s" if cold is not None else ""))
    print()
    print("| cache | backend | tokens/s | vs DynamicCache | fused vs unfused | layer 0 attention (ms) | append (ms) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    print(f"| DynamicCache | SDPA | {base:.2f} | 1.00x | | {layer['sdpa']:.2f} | |")
    for f in formats:
        for b in BACKENDS:
            r = tps[(f, b)]
            vs = f"{r / tps[(f, 'torch')]:.2f}x" if b == "cpu" else ""
            label = "cpu (fused)" if b == "cpu" else "torch (unfused)"
            print(f"| {f} | {label} | {r:.2f} | {r / base:.2f}x | {vs} | {layer[(f, b)]:.2f} | "
                  f"{layer[(f, 'append')]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
