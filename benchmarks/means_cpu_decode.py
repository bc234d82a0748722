"""One SmolLM2-shaped int4 decode-attention layer on the CPU, three ways: the numba fused kernel (kernels/cpu/decode.py),
the unfused reference (dequantize, then SDPA), and PyTorch Inductor's torch.compile of that same reference (the
alternative means considered for the fused CPU path). Prints ms per call and each first call's compile time.

    python benchmarks/means_cpu_decode.py            # 4K tokens, 9 query / 3 KV heads, head_dim 64, fp32

Inductor generates C++ and needs a C++ compiler (g++) at run time, which a slim Docker image or a Space lacks;
numba ships LLVM in its wheel.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.cpu import decode as cpu  # noqa: E402
from kernels.packed import side_from_format  # noqa: E402
from kvviz.cache.layers import QuantizedKVLayer  # noqa: E402
from kvviz.formats import parse_kv  # noqa: E402

from bench_cpu_decode import best_ms  # noqa: E402 (benchmarks/, this script's folder)

T, HQ, HKV, D = 4096, 9, 3, 64


def reference(q, codes, scale, codes_v, scale_v):
    """int4 (offset 8, one fp16 scale per token) dequantize + GQA SDPA. q: [1, Hq, 1, D]; codes: [1, Hkv, T, D/2]
    uint8, element 2i in the low nibble; scale: [1, Hkv, T, 1] fp16. Returns [1, Hq, 1, D]."""
    def deq(c, s):
        x = torch.stack([c & 15, c >> 4], dim=-1).flatten(-2).float() - 8.0  # [1, Hkv, T, D]
        return x * s.float()
    k, v = deq(codes, scale), deq(codes_v, scale_v)
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def main() -> int:
    t = time.perf_counter()
    ok = cpu.cpu_usable()  # first: the cache's append would otherwise trigger it (kvviz.attention.active_backend)
    numba_first = time.perf_counter() - t
    torch.manual_seed(0)
    kv = parse_kv("int4")
    layer = QuantizedKVLayer(kv.k, kv.v)
    layer.update(torch.randn(1, HKV, T, D), torch.randn(1, HKV, T, D))
    pk, pv = layer.update(torch.randn(1, HKV, 1, D), torch.randn(1, HKV, 1, D))
    q = torch.randn(1, HQ, 1, D)
    ks, vs = (side_from_format(p.fmt, p.data, p.scale, p.zero, p.tensor_scale, head_dim=D, n_packed=p.n_quantized,
                               tail=p.tail) for p in (pk, pv))
    args = (q, pk.data.contiguous(), pk.scale.contiguous(), pv.data.contiguous(), pv.scale.contiguous())
    rows = {"numba fused (kernels/cpu/decode.py)": (best_ms(lambda: cpu.decode_attention_cpu(q[:, :, 0], ks, vs, T + 1)),
                                            numba_first)}
    rows["torch reference (eager)"] = (best_ms(lambda: reference(*args)), 0.0)
    compiled = torch.compile(reference, dynamic=True)
    t = time.perf_counter()
    try:
        compiled(*args)
        rows["torch.compile(reference), Inductor"] = (best_ms(lambda: compiled(*args)), time.perf_counter() - t)
    except Exception as err:  # noqa: BLE001 - no C++ compiler, or an Inductor failure: report it
        print(f"torch.compile failed: {type(err).__name__}: {str(err)[:200]}")
    out = cpu.decode_attention_cpu(q[:, :, 0], ks, vs, T + 1)
    ref = reference(*args)[:, :, 0]
    print(f"fused CPU usable: {ok}; max |fused - reference| = {(out - ref).abs().max():.2e}")
    print("| means | ms per layer call | first call (compile or cache load) |")
    print("|---|---:|---:|")
    for name, (ms, first) in rows.items():
        print(f"| {name} | {ms:.2f} | {first:.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
