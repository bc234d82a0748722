"""`python -m kvviz sensitivity` and `python -m kvviz plan`: which layers carry a format's damage, and the cheapest
per-layer plan within a KL budget (kvviz.analysis.sensitivity, kvviz.analysis.search), on WikiText-2's first tokens.

    python -m kvviz sensitivity --spec int4 --tokens 256                 # the per-layer map, K and V, in nats
    python -m kvviz plan --candidates int4,int8,fp16 --kl-budget 0.02    # the path, the plan, its bytes and KL

Both print their wall time and the CPU time of all their threads (model loading apart): on a shared machine the
wall time depends on the load, the CPU time much less.
"""

from __future__ import annotations

import argparse
import math
import time

SENSITIVITY_HELP = "per-layer sensitivity: the KL when only one layer's K (or V) is stored in a format"
PLAN_HELP = "the cheapest per-layer plan within a KL budget (greedy, sensitivity-ordered search)"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a bundled model name or a local model directory (default: the bundled SmolLM2)")
    p.add_argument("--tokens", type=int, default=256, help="tokens of text scored (default %(default)s)")
    p.add_argument("--text-file", metavar="PATH", help="text to score (default: the WikiText-2 slice in assets/)")


def add_sensitivity_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", default="int4", help="the KV format measured one layer at a time (default %(default)s)")
    _common(p)


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--candidates", default="int4,int8,fp16",
                   help="comma-separated specs a layer may take (default %(default)s); pairs as k=int8,v=int4 "
                        "cannot go in this list, name a preset (k8v4) instead")
    p.add_argument("--kl-budget", type=float, required=True, help="mean KL allowed, in nats, e.g. 0.02")
    p.add_argument("--context", type=int, default=4096, help="tokens the bytes are counted at (default %(default)s)")
    _common(p)


def _load(args: argparse.Namespace):
    from pathlib import Path

    from kvviz.models import load_model
    from kvviz.quality.perplexity import wikitext

    if args.tokens < 3:
        raise ValueError(f"--tokens must be at least 3, got {args.tokens}.")
    text = Path(args.text_file).read_text(encoding="utf-8") if args.text_file else wikitext()
    model, tok = load_model(args.model)
    return model, tok, text


class _Clock:
    """Wall and CPU seconds since construction, as text: "41.2 s wall, 80.1 s CPU"."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def __str__(self) -> str:
        return f"{time.perf_counter() - self.wall:.1f} s wall, {time.process_time() - self.cpu:.1f} s CPU"


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip())


def _kl(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2e}"


def run_sensitivity(args: argparse.Namespace) -> int:
    from kvviz.analysis.sensitivity import layer_sensitivity, ranking
    from kvviz.formats import as_plan

    spec = as_plan(args.spec)  # parsed here, once: a bad spec fails before the model loads
    model, tok, text = _load(args)
    clock = _Clock()
    sens = layer_sensitivity(model, tok, text, spec, max_tokens=args.tokens)
    print(f"mean KL (nats) with only one layer's K or V in {sens['spec']} (the other side {sens['other']}), "
          f"{sens['tokens']} tokens\n")
    _table([["layer", "K", "V"]] + [[str(i), _kl(k), _kl(v)] for i, (k, v) in enumerate(zip(sens["k"], sens["v"]))])
    top = ", ".join(f"{side.upper()}{i} {kl:.2e}" for side, i, kl in ranking(sens)[:5])
    print(f"\nmost damaging: {top}")
    print(f"sensitivity took {clock}")
    return 0


def run_plan(args: argparse.Namespace) -> int:
    from kvviz.analysis.search import search
    from kvviz.formats import as_plan

    candidates = [c.strip() for c in args.candidates.split(",") if c.strip()]
    if any("=" in c for c in candidates):
        raise ValueError("--candidates is comma-separated, so a K/V pair cannot go in it; name a preset "
                         "(k8v4, k4v8) or a single format per candidate.")
    candidates = [as_plan(c) for c in candidates]  # parsed here, once: a bad spec fails before the model loads
    model, tok, text = _load(args)
    clock = _Clock()
    res = search(model, tok, text, candidates, kl_budget=args.kl_budget, max_tokens=args.tokens,
                 context=args.context)
    took = str(clock)
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    print(f"ladder (cheapest first): {', '.join(res.ladder)}; bytes at {res.context} tokens, "
          f"KL in nats over {args.tokens} tokens\n")
    _table([["step", "move", "MiB", "KL"]] + [[str(s.step), s.move, f"{s.bytes / 2**20:.2f}", _kl(s.kl)]
                                              for s in res.steps])
    uniform = {s.plan.text: s for s in res.steps if s.plan.is_uniform}
    best = res.chosen
    print(f"\nplan: {best.plan.text}")
    verdict = "within" if res.within_budget else "NOT within (no plan on the path is; this is the all-top one)"
    print(f"  {best.bytes / 2**20:.2f} MiB ({best.bytes / res.bytes_fp16:.1%} of fp16), KL {best.kl:.2e}, "
          f"{verdict} the budget {args.kl_budget:g}")
    for name, s in uniform.items():
        print(f"  uniform {name}: {s.bytes / 2**20:.2f} MiB, KL {s.kl:.2e}")
    print(f"search over {len(res.ladder)} candidates x {n_layers} layers took {took}")
    return 0
