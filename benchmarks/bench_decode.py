"""Decode attention over a quantized KV cache: fused Triton kernel against dequantize-then-SDPA, per format.

Prints one table: time per decode step (us), effective bandwidth (GB/s = bytes of K/V the cache holds, which a
fused kernel reads once, / time) and ratios: speed against our own bf16 kernel, and fused against unfused
(`unfused` = kvviz.formats dequantize to bf16, then torch SDPA: what a backend without a fused kernel does). The
first line is the read-bandwidth ceiling (a large sum).

    python benchmarks/bench_decode.py          # CUDA: batch x context in {1x4K, 1x128K, 8x8K, 32x8K},
                                               # 32 query heads, 8 KV heads, head_dim 128 (< 5 minutes, H200)
    python benchmarks/bench_decode.py --cpu    # the default without CUDA: small sizes, the reference path
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the repository

import kvviz  # noqa: E402
from kernels import decode_attention, side_from_format, side_of, triton_usable  # noqa: E402

FORMATS = (
    "fp8_e4m3", "fp8_e5m2", "fp8_e4m3/token", "int8", "int8/asym", "int4", "int4/asym", "int4/g32/asym",
    "int2/g32/asym", "int2/channel/g32/asym", "mxfp4", "fp4_mx_block16", "nvfp4", "int4/rot",
)
GPU_SHAPES = ((1, 4096), (1, 131072), (8, 8192), (32, 8192))  # (batch, context)
CPU_SHAPES = ((1, 256), (1, 2048), (4, 512), (8, 512))
GPU_HEADS, CPU_HEADS = (32, 8, 128), (8, 2, 64)  # (query heads, KV heads, head_dim)


def _timer(device: torch.device):
    """fn -> seconds per call: triton's do_bench on CUDA (warmup, L2 flush), the best of 5 wall-clock runs on the
    CPU (the minimum, as timeit reports: other processes only ever add time)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100) * 1e-3

    def cpu(fn, reps: int = 5) -> float:
        fn()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    return cpu


def read_ceiling(device: torch.device, timer) -> float:
    """GB/s of a large reduction: the most a memory-bound kernel can read per second here."""
    n = (4 << 30) // 2 if device.type == "cuda" else (256 << 20) // 2
    x = torch.ones(n, dtype=torch.bfloat16, device=device)  # 4 GiB (GPU) / 256 MiB (CPU)
    seconds = timer(lambda: x.sum(dtype=torch.float32))
    del x
    return 2 * n / seconds / 1e9


def bench_shape(batch: int, context: int, heads: tuple[int, int, int], formats, device, timer) -> list[tuple]:
    """Rows (path, seconds, cache bytes) for one batch x context."""
    hq, hkv, d = heads
    gen = torch.Generator(device=device).manual_seed(0)
    k = torch.randn(batch, hkv, context, d, device=device, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(batch, hkv, context, d, device=device, generator=gen, dtype=torch.bfloat16)
    k[..., 5] *= 10  # a K outlier channel, as after RoPE
    q = torch.randn(batch, hq, d, device=device, generator=gen, dtype=torch.bfloat16)
    bf16_bytes = 2 * k.numel() * k.element_size()
    rows = []

    sdpa = lambda kk, vv: F.scaled_dot_product_attention(q[:, :, None], kk, vv, enable_gqa=True)  # noqa: E731
    rows.append(("torch sdpa bf16", timer(lambda: sdpa(k, v)), bf16_bytes))
    bf16 = kvviz.get_format("bf16")
    ks, vs = side_from_format(bf16, k), side_from_format(bf16, v)
    rows.append(("ours bf16", timer(lambda: decode_attention(q, ks, vs, context)), bf16_bytes))
    del ks, vs

    for spec in formats:
        fmt = kvviz.get_format(spec)
        kq, vq = fmt.quantize(k), fmt.quantize(v)
        ks, vs = side_of(kq), side_of(vq)
        held = kq.nbytes + vq.nbytes
        rows.append((f"{spec} fused", timer(lambda: decode_attention(q, ks, vs, context)), held))
        unfused = lambda: sdpa(fmt.dequantize(kq), fmt.dequantize(vq))  # noqa: E731
        rows.append((f"{spec} unfused", timer(unfused), held))
        del kq, vq, ks, vs
    return rows


def print_table(title: str, rows: list[tuple]) -> None:
    base = dict((name, t) for name, t, _ in rows)["ours bf16"]
    print(f"\n{title}")
    print(f"{'path':<30} {'time (us)':>11} {'GB/s':>9} {'vs ours bf16':>13} {'fused/unfused':>14}")
    times = {name: t for name, t, _ in rows}
    for name, t, nbytes in rows:
        ratio = ""
        if name.endswith(" fused"):
            ratio = f"{times[name[: -len(' fused')] + ' unfused'] / t:.2f}x"
        print(f"{name:<30} {t * 1e6:>11.1f} {nbytes / t / 1e9:>9.3g} {base / t:>12.2f}x {ratio:>14}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="small sizes on the CPU (default without CUDA)")
    parser.add_argument("--shapes", help="batch x context list, e.g. 1x4096,8x8192 (default: per device)")
    parser.add_argument("--heads", help="query heads, KV heads, head_dim, e.g. 32,8,128 (default: per device)")
    parser.add_argument("--formats", help=f"comma-separated specs (default: {','.join(FORMATS)})")
    args = parser.parse_args(argv)
    cpu = args.cpu or not torch.cuda.is_available()
    device = torch.device("cpu" if cpu else "cuda")
    shapes, heads = (CPU_SHAPES, CPU_HEADS) if cpu else (GPU_SHAPES, GPU_HEADS)
    try:
        if args.shapes:
            shapes = tuple(tuple(int(n) for n in s.lower().split("x")) for s in args.shapes.split(","))
        if args.heads:
            heads = tuple(int(n) for n in args.heads.split(","))
        assert all(len(s) == 2 for s in shapes) and len(heads) == 3
    except (ValueError, AssertionError):
        parser.error("--shapes is BxT[,BxT...] and --heads is Hq,Hkv,D, integers: --shapes 1x4096 --heads 32,8,128")
    formats = tuple(args.formats.split(",")) if args.formats else FORMATS
    timer = _timer(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = "CPU, " + ("Triton interpreter" if triton_usable("cpu") else "float64 reference path (not Triton)")
    print(f"device: {name}; heads: {heads[0]} query, {heads[1]} KV, head_dim {heads[2]}; K/V bf16 before quantizing")
    print(f"read ceiling (sum of a large bf16 tensor): {read_ceiling(device, timer):.1f} GB/s")
    print("GB/s = K/V bytes held by the cache (packed data + scales) / time; unfused reads them and writes bf16 too")
    for batch, context in shapes:
        label = f"{context // 1024}K" if context % 1024 == 0 and context >= 1024 else str(context)
        with torch.no_grad():
            rows = bench_shape(batch, context, heads, formats, device, timer)
        print_table(f"batch {batch} x context {label}", rows)
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
