"""`python -m kvviz sensitivity`: which layers carry a format's damage: the mean KL when only one layer's K (or V) is
stored in a format (kvviz.analysis.sensitivity), on WikiText-2's first tokens.

    python -m kvviz sensitivity --spec int4 --tokens 256                 # the per-layer map, K and V, in nats

It prints its wall time and the CPU time of all its threads (model loading apart).
"""

from __future__ import annotations

import argparse

from kvviz.analysis.sensitivity import layer_sensitivity, ranking
from kvviz.cli.common import Clock, add_text_arguments, kl_text, load_text_model, print_table
from kvviz.formats import as_plan

HELP = "per-layer sensitivity: the KL when only one layer's K (or V) is stored in a format"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", default="int4", help="the KV format measured one layer at a time (default %(default)s)")
    add_text_arguments(p)


def run(args: argparse.Namespace) -> int:
    spec = as_plan(args.spec)  # parsed here, once: a bad spec fails before the model loads
    model, tok, text = load_text_model(args)
    clock = Clock()
    sens = layer_sensitivity(model, tok, text, spec, max_tokens=args.tokens)
    print(f"mean KL (nats) with only one layer's K or V in {sens['spec']} (the other side {sens['other']}), "
          f"{sens['tokens']} tokens\n")
    print_table([["layer", "K", "V"]] + [[str(i), kl_text(k), kl_text(v)] for i, (k, v) in enumerate(zip(sens["k"], sens["v"]))])
    top = ", ".join(f"{side.upper()}{i} {kl:.2e}" for side, i, kl in ranking(sens)[:5])
    print(f"\nmost damaging: {top}")
    print(f"sensitivity took {clock}")
    return 0
