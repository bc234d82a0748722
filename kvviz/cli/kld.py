"""`python -m kvviz kld`: llama.cpp's KLD statistics of KV specs and per-layer plans against the exact model, over
WikiText-2 windows, every position reading the quantized cache (kvviz.quality.divergence).

    python -m kvviz kld fp8_e4m3 int4 "int4; 0,29=fp16"              # bundled SmolLM2, 2 windows x 512 tokens
    python -m kvviz kld --save-base base.pt                          # the exact model's log-probs, saved once
    python -m kvviz kld --base base.pt q8_0 k=q8_0,v=q4_0            # reused: only the candidates run

Each argument is one spec or plan (quote plans: they contain `;`). Prints one row per spec: mean KLD +- its
standard error, median, p90 / p95 / p99 / p99.9 and max (nats), RMS delta-p and same top p (%), ln(PPL(Q)/PPL(base)).
A static scale a cache fits on its first update (a bare `fp8_e4m3`) is fitted on each window's exact K/V, as a
prefill of the window fits it (kvviz.quality.divergence.window_scales), not on the window's first token alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvviz import models
from kvviz.formats import as_plan
from kvviz.quality.divergence import base_logprobs, kld, load_base, save_base

HELP = "llama.cpp-style KLD statistics of KV specs / plans against the exact model (WikiText-2 windows)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="*", metavar="SPEC", help="specs or plans, e.g. fp8_e4m3 'int4; 0,29=fp16'")
    p.add_argument("--model", help="a bundled model name or a local model directory (default: the bundled SmolLM2)")
    p.add_argument("--windows", type=int, default=2, help="windows of text (default %(default)s)")
    p.add_argument("--window-tokens", type=int, default=512, help="tokens per window (default %(default)s)")
    p.add_argument("--score-from", type=int, help="first scored position in a window (default: half the window, "
                                                  "as llama.cpp)")
    p.add_argument("--chunk", type=int, help="tokens per forward after the first token (default: the rest at once)")
    p.add_argument("--text-file", metavar="PATH", help="text to score (default: the WikiText-2 slice in assets/)")
    p.add_argument("--save-base", metavar="FILE", help="save the exact model's log-probs to FILE (llama-perplexity's "
                                                       "--kl-divergence-base)")
    p.add_argument("--base", metavar="FILE", help="read the exact model's log-probs from FILE (its windows are used)")


def _row(name: str, s: dict) -> list[str]:
    return [name, f"{s['mean']:.6f} ± {s['mean_se']:.6f}", f"{s['median']:.6f}", f"{s['p90']:.5f}",
            f"{s['p95']:.5f}", f"{s['p99']:.5f}", f"{s['p999']:.5f}", f"{s['max']:.5f}",
            f"{100 * s['delta_p_rms']:.3f}", f"{100 * s['same_top_p']:.2f}",
            f"{s['ln_ppl_ratio']:+.5f} ± {s['ln_ppl_ratio_se']:.5f}"]


def run(args: argparse.Namespace) -> int:
    if args.base and args.save_base:
        raise ValueError("Give --save-base to write a baseline or --base to read one, not both.")
    if not args.specs and not args.save_base:
        raise ValueError("Name at least one spec or plan to measure (e.g. fp8_e4m3 'int4; 0,29=fp16'), or "
                         "--save-base FILE.")
    plans = [as_plan(s) for s in args.specs or []]  # parsed here, once: a bad spec fails before the model loads
    text = Path(args.text_file).read_text(encoding="utf-8") if args.text_file else None
    base = load_base(args.base) if args.base else None  # a bad file fails before the model loads
    model, tok = models.load_model(args.model)  # through the module: tests replace it there
    if args.save_base:
        base = base_logprobs(model, tok, text, args.windows, args.window_tokens, args.score_from)
        save_base(base, args.save_base)
        n = base["logprobs"].shape[0] * base["logprobs"].shape[1]
        print(f"saved the exact model's log-probs at {n} positions ({base['windows']} windows of "
              f"{base['window_tokens']} tokens, scored from {base['score_from']}) to {args.save_base}")
    if not args.specs:
        return 0
    stats = kld(model, tok, plans, text=text, windows=args.windows, window_tokens=args.window_tokens,
                score_from=args.score_from, chunk=args.chunk, base=base)
    head = ["spec", "mean KLD", "median", "p90", "p95", "p99", "p99.9", "max", "RMS Δp %", "same top %",
            "ln(PPL(Q)/PPL(base))"]
    table = [head] + [_row(name, s) for name, s in stats.items()]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    first = next(iter(stats.values()))
    print(f"\n{first['n']} positions scored; KLD in nats; every position after each window's first token reads "
          "the quantized cache (the first token alone, then the rest); scales fitted on a cache's first update "
          "(bare fp8_e4m3) are fitted on each window's exact K/V.")
    return 0
