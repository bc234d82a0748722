"""`python -m kvviz plan`: the cheapest per-layer plan within a KL budget (kvviz.analysis.search: a greedy,
sensitivity-ordered climb), on WikiText-2's first tokens.

    python -m kvviz plan --candidates int4,int8,fp16 --kl-budget 0.02    # the path, the plan, its bytes and KL

It prints its wall time and the CPU time of all its threads (model loading apart).
"""

from __future__ import annotations

import argparse

from kvviz.cli.common import Clock, add_text_arguments, kl_text, load_text_model, print_table
from kvviz.analysis.search import search
from kvviz.formats import as_plan
from kvviz.memory import split_formats

HELP = "the cheapest per-layer plan within a KL budget (greedy, sensitivity-ordered search)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--candidates", default="int4,int8,fp16",
                   help="comma-separated specs a layer may take (default %(default)s); pairs as k=int8,v=int4 "
                        "cannot go in this list, name a preset (k8v4) instead")
    p.add_argument("--kl-budget", type=float, required=True, help="mean KL allowed, in nats, e.g. 0.02")
    p.add_argument("--context", type=int, default=4096, help="tokens the bytes are counted at (default %(default)s)")
    add_text_arguments(p)


def run(args: argparse.Namespace) -> int:
    candidates = split_formats(args.candidates)
    if any("=" in c for c in candidates):
        raise ValueError("--candidates is comma-separated, so a K/V pair cannot go in it; name a preset "
                         "(k8v4, k4v8) or a single format per candidate.")
    candidates = [as_plan(c) for c in candidates]  # parsed here, once: a bad spec fails before the model loads
    model, tok, text = load_text_model(args)
    clock = Clock()
    res = search(model, tok, text, candidates, kl_budget=args.kl_budget, max_tokens=args.tokens,
                 context=args.context)
    took = str(clock)
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    print(f"ladder (cheapest first): {', '.join(res.ladder)}; bytes at {res.context} tokens, "
          f"KL in nats over {args.tokens} tokens\n")
    print_table([["step", "move", "MiB", "KL"]] + [[str(s.step), s.move, f"{s.bytes / 2**20:.2f}", kl_text(s.kl)]
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
