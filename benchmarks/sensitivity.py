"""Per-layer sensitivity and the plan search on the bundled SmolLM2-135M, timed, with the machine's load beside
each figure (docs/benchmarks.md's "Per-layer sensitivity and the plan search" comes from this script).

    python benchmarks/sensitivity.py                       # int4 map at 256 tokens; int4/int8/fp16 plan, KL <= 0.01
    python benchmarks/sensitivity.py --kl-budget 0.02 --tokens 512

It runs `python -m kvviz sensitivity` and `python -m kvviz plan` in one process and prints `uptime` before and
after each: on a shared machine the wall time follows the load, the CPU time much less.
"""

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvviz import cli  # noqa: E402


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", default="int4")
    p.add_argument("--candidates", default="int4,int8,fp16")
    p.add_argument("--kl-budget", default="0.01")
    p.add_argument("--tokens", default="256")
    args = p.parse_args()
    for argv in (["sensitivity", "--spec", args.spec, "--tokens", args.tokens],
                 ["plan", "--candidates", args.candidates, "--kl-budget", args.kl_budget, "--tokens", args.tokens]):
        print(f"$ python -m kvviz {' '.join(argv)}\n[{_uptime()}]", flush=True)
        status = cli.main(argv)
        print(f"[{_uptime()}]\n", flush=True)
        if status:
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
