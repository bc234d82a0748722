"""FP8 E4M3 with a unit scale (vLLM's and SGLang's default without scale files) against a calibrated one: how far
each model's post-RoPE K sits from E4M3's largest value, 448, and what a K beyond it costs.

For each bundled model: the largest |K| (post-RoPE, all layers, the first 512 tokens of the WikiText-2 slice), the
headroom 448 / max|K|, how many values saturate under a scale of 1.0, and K's relative error per layer
(||K - K^|| / ||K||, mean over layers) with a unit scale and with a calibrated one (amax / 448 of that layer,
fitted on the same text: the best a per-tensor scale can do). Then the same on kvviz's tiny random Qwen2 with a
large k_proj bias on one channel per KV head (`biased_qwen2`), the way Qwen2 models carry K beyond 448.
Lesson 4's note (kvviz/ui/i18n.py) quotes these figures.

    python benchmarks/fp8_unit_scale.py                       # both bundled models and the tiny one (minutes)
    python benchmarks/fp8_unit_scale.py --tiny-only           # seconds
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvviz.analysis.capture import capture_kv  # noqa: E402
from kvviz.analysis.errors import relative_error  # noqa: E402
from kvviz.formats import get_format, max_value  # noqa: E402

TOKENS = 512
BIAS = (600.0, -700.0)  # k_proj bias on channel 3 of KV head 0 and channel 5 of KV head 1 (head_dim 16)


def biased_qwen2():
    """kvviz's tiny random Qwen2 (2 KV heads, head_dim 16) with BIAS on one k_proj channel per KV head, every layer."""
    from kvviz.tiny import tiny_model

    model, tok = tiny_model("qwen2")
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        for layer in model.model.layers:
            bias = layer.self_attn.k_proj.bias  # [kv_heads * head_dim]
            bias[3], bias[head_dim + 5] = BIAS
    return model, tok


def measure(model, tok, text: str, spec: str = "fp8_e4m3") -> dict:
    """max|K|, headroom, values saturated under a unit scale, and K's mean relative error (unit, calibrated)."""
    fmt, fmax = get_format(spec), max_value(spec)
    k = capture_kv(model, tok, text, max_tokens=TOKENS).keys_post.float()  # [layers, kv_heads, tokens, head_dim]
    unit, calibrated = [], []
    for x in k:  # one layer: [kv_heads, tokens, head_dim]
        unit.append(relative_error(x, fmt.dequantize(fmt.quantize(x, scale=torch.tensor(1.0)))))
        calibrated.append(relative_error(x, fmt.dequantize(fmt.quantize(x, scale=x.abs().max() / fmax))))
    amax = float(k.abs().max())
    return {"tokens": k.shape[2], "max_k": amax, "headroom": fmax / amax, "saturated": int((k.abs() > fmax).sum()),
            "values": k.numel(), "rel_unit": sum(unit) / len(unit), "rel_calibrated": sum(calibrated) / len(unit)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny-only", action="store_true", help="only the tiny biased Qwen2 (no bundled model)")
    args = p.parse_args()
    from kvviz.models import load_model
    from kvviz.quality.perplexity import wikitext

    text = wikitext()
    runs = [] if args.tiny_only else [(name, lambda n=name: load_model(n)) for name in ("smollm2-135m", "gemma-3-270m")]
    runs.append((f"tiny Qwen2, k_proj bias {BIAS[0]:g} / {BIAS[1]:g}", biased_qwen2))
    print("model | tokens | max |K| | headroom (448 / max) | saturated under unit | K rel. error unit | calibrated")
    for name, load in runs:
        r = measure(*load(), text)
        print(f"{name} | {r['tokens']} | {r['max_k']:.1f} | {r['headroom']:.1f}x | {r['saturated']:,} of "
              f"{r['values']:,} ({r['saturated'] / r['values']:.1%}) | {r['rel_unit']:.4f} | {r['rel_calibrated']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
