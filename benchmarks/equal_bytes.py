"""The equal-bytes table (docs/benchmarks.md): every way to spend one KV-cache budget on the bundled models, as the
Equal bytes tab measures it (kvviz.quality.equal_bytes), printed as markdown with the command, date and machine.

    python benchmarks/equal_bytes.py                          # both bundled models, 25% of the 16-bit cache
    python benchmarks/equal_bytes.py --models smollm2-135m --budget 15 --context 1024 --needles 3
    python benchmarks/equal_bytes.py --context 256 --continuation 16 --needles 1 --policies streaming,snapkv  # lesson 11

Per model: the candidates (int4 and int2 on every token, 16 bits under each eviction policy, int8 and int4 under
snapkv, int4/int8 kept with the rest in int2), each fitted to the budget at the context length; its bytes read from
its cache after the context, its mean KL against the exact run over the next tokens of WikiText-2 (teacher-forced),
and the needles it finds at five depths of a haystack of the same length (the exact cache's count in each model's
header line). The context prefills once and every candidate's cache loads it; the haystacks prefill as batches,
each eviction candidate answering them as the rows of its own cache (kvviz.quality.needle).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = ("smollm2-135m", "gemma-3-270m")


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"


def main() -> int:
    from kvviz import models
    from kvviz.formats.eviction import POLICIES
    from kvviz.quality import equal_bytes as eb

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--budget", type=float, default=25.0, help="percent of the 16-bit cache (default 25)")
    p.add_argument("--context", type=int, default=512, help="context tokens (default 512)")
    p.add_argument("--continuation", type=int, default=32, help="continuation tokens for the KL (default 32)")
    p.add_argument("--needles", type=int, default=2, help="needles per depth, 5 depths (default 2)")
    p.add_argument("--policies", default=",".join(POLICIES), help="16-bit candidates' policies (default: all)")
    p.add_argument("--combine", default="snapkv", help="the policy of the int8/int4 and mixed candidates")
    args = p.parse_args()
    print(f"`python benchmarks/equal_bytes.py {' '.join(sys.argv[1:])}`".replace(" `", "`"))
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {_machine()}\n")
    for name in args.models.split(","):
        model, tok = models.load_model(name)
        start = time.perf_counter()
        last = None
        for last in eb.run(model, tok, args.budget / 100, args.context, args.continuation, args.policies.split(","),
                           args.combine, needles_per_depth=args.needles):
            pass
        full = last.rows[0].nbytes_16bit
        needle = (f"needles {args.needles} per depth at 5 depths (the exact cache found "
                  f"{last.exact_found}/{last.rows[0].needles})" if args.needles else "no needle")
        print(f"**{name}**, budget {args.budget:g}% of the 16-bit cache ({full / 1024:,.1f} KiB at {args.context} "
              f"tokens), KL over {args.continuation} tokens, {needle}; {time.perf_counter() - start:.0f} s\n")
        print("| spec | how | tokens kept | KiB (measured) | % of 16-bit | KL (nats/token) | needles found |")
        print("|---|---|---|---|---|---|---|")
        for r in last.rows:
            found = "-" if r.found is None else f"{r.found}/{r.needles}"
            print(f"| `{r.spec}` | {r.candidate.kind} | {100 * r.candidate.keep:.1f}% | {r.nbytes / 1024:,.1f} | "
                  f"{r.pct_16bit:.1f}% | {r.kl:.4f} | {found} |")
        for line in last.left:
            print(f"\nNo keep ratio fits: {line}")
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
