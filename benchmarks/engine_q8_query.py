"""Is llama.cpp's q8_0 KLD floor its CPU attention quantizing Q to q8_0? A test of that explanation, on SmolLM2.

On the CPU, llama.cpp's flash attention converts Q to the K type's dot-product partner before Q·K (q8_0 for q8_0,
q4_0, q5_0 and iq4_nl; q8_1, which rounds alike, for q4_1 and q5_1); with an f16 K, Q is converted to f16. If
that explained the gap between llama.cpp's figures and kvviz's, then
  1. kvviz's simulation with Q rounded through q8_0 (in the rows whose K is quantized) would move to llama.cpp's
     figure, and
  2. llama.cpp with K in f16 and only V quantized (Q not quantized) would show no such floor.
This script measures both, plus llama.cpp with only K quantized, all unrotated (LLAMA_ATTN_ROT_DISABLE=1, as
kvviz stores them), on the first --tokens tokens of the WikiText-2 slice. The Compare tab's engine view
(kvviz/ui/engines.py) quotes the figures.

    python benchmarks/engine_q8_query.py --tokens 256        # several minutes on a busy 2-core CPU
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformers import AttentionInterface  # noqa: E402

from kvviz import attention  # noqa: E402
from kvviz.engines import llamacpp, simulate  # noqa: E402
from kvviz.formats import parse_kv  # noqa: E402

SPECS = ["q8_0", "k=q8_0,v=q4_0", "q4_0"]
LLAMA_ONLY = ["k=q8_0,v=fp16", "k=fp16,v=q8_0"]  # one side quantized: which side makes the floor?


def _q_through_q8_0(module, query, key, value, attention_mask, **kwargs):
    """kvviz's attention with Q [rows, q_heads, q_len, head_dim] rounded through q8_0 (blocks of 32 along head_dim)
    in rows 1.. (the formats; row 0 is simulate's exact row, whose K is not quantized)."""
    q8 = parse_kv("q8_0").k
    q = query.clone()
    q[1:] = q8.dequantize(q8.quantize(query[1:].float())).to(query.dtype)
    return attention.kvviz_attention_forward(module, q, key, value, attention_mask, **kwargs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    from kvviz.models import load_model

    ids, theirs = llamacpp.run(SPECS + LLAMA_ONLY, tokens=args.tokens, rotate=False, threads=args.threads)
    model, _ = load_model()
    plain = simulate.kvviz_kld(SPECS, ids, model)
    AttentionInterface.register(attention.ATTN_NAME, _q_through_q8_0)
    try:
        rounded = simulate.kvviz_kld(SPECS, ids, model)
    finally:
        AttentionInterface.register(attention.ATTN_NAME, attention.kvviz_attention_forward)
    print(f"{len(ids)} tokens of WikiText-2, SmolLM2-135M-Instruct; mean KLD (nats) / p99 / same top")

    def row(label, spec, s):
        print(f"{label:34s} {spec:16s} {s['mean']:.5f}  {s['p99']:.4f}  {s['same_top_p']:.1%}")

    for spec in SPECS:
        row("kvviz", spec, plain[spec])
        row("kvviz, Q rounded through q8_0", spec, rounded[spec])
        row("llama.cpp, unrotated", spec, theirs[spec])
    for spec in LLAMA_ONLY:
        row("llama.cpp, unrotated", spec, theirs[spec])
    return 0


if __name__ == "__main__":
    torch.set_num_threads(2)
    raise SystemExit(main())
