"""What a visitor waits for the Compare tab's side by side, against one plain generation, timed as a user meets it:
the app's `/compare` endpoint through gradio_client with 6 formats x 128 new tokens on the tab's default prompt,
against one greedy 128-token `model.generate` of the same model in a process of its own (README's "through the
app" figure and docs/benchmarks.md's "The Compare tab's cost" come from this script).

    python benchmarks/compare_endpoint.py                        # start the app on SmolLM2, 3 interleaved rounds
    python benchmarks/compare_endpoint.py --url http://127.0.0.1:7860/ --rounds 5   # an app already running
    python benchmarks/compare_endpoint.py --formats fp8_e4m3,int4 --tokens 24
    python benchmarks/compare_endpoint.py --url http://127.0.0.1:7861/ --start    # another tree's app beside this one

Before and after a change: start the older tree's app by hand (`GRADIO_SERVER_PORT=7861 KVVIZ_MODEL=smollm2-135m
python app.py` in an export of that commit) and pass its --url and --pid with --start: each round then times one
generation and one click of each app, under the same load, and each app gets its own ratios.

The apps whose process is known (the one started here, each --pid) are paused (SIGSTOP) while anything else is
timed: an idle gradio server still polls its queue every millisecond, which on two cores slows whatever runs
beside it, the generation included; so the generation is timed as it runs without any app.

Three processes: the app (`python app.py`, tests/app_server.py; or the one at --url, which must serve SmolLM2),
a generation worker that loads the same model (its dtype, DynamicCache, the default torch threads, as the app's)
and times `model.generate` when asked, and this one, which only drives both. After a warm-up (one click of the same
formats x 16 tokens, one 16-token generation), each round times one generation, then one click; every round's
two times and their ratio are printed, then the best of each and their ratio. On a shared machine the ratio of one
round moves far less than either time; compare figures only within one run. `uptime` is printed beside them.
benchmarks/compare_cost.py times the library's `quality.compare` in-process against the same generation.
"""

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvviz.ui.common import EXAMPLES  # noqa: E402

TAB_PROMPT = EXAMPLES[3]  # the prompt the Compare tab opens with (kvviz.ui.compare.build: prompt_input(tr, 3))
ISSUE_FORMATS = ["fp8_e4m3", "k8v4", "k4v8", "int4", "kivi2", "mxfp4"]  # six formats of every kind: fp8, int pairs, KIVI, MX
WARM_TOKENS = 16

# the generation worker: loads the model, then for each number n read from stdin prints the seconds of one greedy
# n-token generation (batch 1, DynamicCache, the model's dtype, torch's default threads) as a JSON line
_WORKER = """
import json, sys, time, warnings
import torch
import kvviz
from kvviz.ui.common import EXAMPLES
model, tok = kvviz.load_model()
ids = tok(EXAMPLES[3], return_tensors="pt")["input_ids"]
print(json.dumps({"threads": torch.get_num_threads(), "dtype": str(model.dtype), "prompt": ids.shape[1]}), flush=True)
for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    print(json.dumps({"s": time.perf_counter() - t0}), flush=True)
"""


class Generator:
    """The generation worker process: `seconds(n)` times one n-token greedy generation there."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self.proc.stdout.readline())

    def seconds(self, n: int) -> float:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["s"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--formats", default=",".join(ISSUE_FORMATS), help="comma-separated formats (default: the six above)")
    p.add_argument("--tokens", type=int, default=128, help="new tokens (default 128)")
    p.add_argument("--url", action="append", default=[],
                   help="an app already running SmolLM2 (repeatable; default: start this checkout's app on it)")
    p.add_argument("--start", action="store_true", help="with --url: also start this checkout's app, timed last")
    p.add_argument("--pid", type=int, action="append", default=[],
                   help="the process of each --url app, in order (repeatable): paused while the others are timed")
    p.add_argument("--beside", action="store_true",
                   help="also time, each round, a generation while the apps run idle (not paused)")
    args = p.parse_args()
    formats = args.formats.split(",")
    from gradio_client import Client

    with contextlib.ExitStack() as stack:
        urls, pids = list(args.url), list(args.pid)
        if pids and len(pids) != len(urls):
            p.error("give one --pid per --url, or none")
        if args.start or not urls:
            sys.path.insert(0, str(REPO / "tests"))
            import app_server

            app_server.STARTUP_TIMEOUT_S = 900
            server = stack.enter_context(app_server.serve_app(model="smollm2-135m"))
            urls.append(server.url)
            pids = pids + [server.pid] if pids or not args.url else []
        clients = [Client(url, verbose=False) for url in urls]
        gen = Generator()
        stack.callback(gen.close)

        @contextlib.contextmanager
        def alone(running: int | None):
            """Every app but `running` (an index; None: all of them) stopped meanwhile: an idle gradio server
            still wakes its event loop every millisecond, which takes the cores from what is timed."""
            held = [pid for i, pid in enumerate(pids) if i != running]
            for pid in held:
                os.kill(pid, signal.SIGSTOP)
            try:
                yield
            finally:
                for pid in held:
                    os.kill(pid, signal.SIGCONT)

        def click(c: int, n: int) -> float:
            with alone(c):
                t0 = time.perf_counter()
                clients[c].predict(TAB_PROMPT, formats, "", n, False, api_name="/compare")
                return time.perf_counter() - t0

        def generate(n: int) -> float:
            with alone(None):
                return gen.seconds(n)

        for c in range(len(clients)):  # warm-up: the formats' first calls, the app's first streamed click
            click(c, WARM_TOKENS)
        generate(WARM_TOKENS)
        paused = "the apps paused while anything else is timed" if pids else "the apps never paused"
        print(f"SmolLM2-135M ({gen.info['dtype']}), prompt {gen.info['prompt']} tokens, generation worker on "
              f"{gen.info['threads']} torch threads; {paused}; /compare with {len(formats)} formats "
              f"({', '.join(formats)}) x {args.tokens} tokens\n[{_uptime()}]", flush=True)
        gens, cmps, beside = [], [[] for _ in clients], []
        for r in range(args.rounds):
            gens.append(generate(args.tokens))
            if args.beside:
                beside.append(gen.seconds(args.tokens))
            for c in range(len(clients)):
                cmps[c].append(click(c, args.tokens))
            print(f"round {r + 1}: generate {gens[-1]:.2f} s"
                  + (f" (beside the idle apps {beside[-1]:.2f} s)" if beside else "") + "; " + "; ".join(
                f"{urls[c]} /compare {cmp[-1]:.2f} s, {cmp[-1] / gens[-1]:.2f}x" for c, cmp in enumerate(cmps)),
                flush=True)
        for url, cmp in zip(urls, cmps):
            ratios = sorted(c / g for c, g in zip(cmp, gens))
            print(f"{url}: best /compare {min(cmp):.2f} s against best generate {min(gens):.2f} s, "
                  f"{min(cmp) / min(gens):.2f}x; per-round ratios {ratios[0]:.2f}-{ratios[-1]:.2f}x "
                  f"(median {ratios[len(ratios) // 2]:.2f}x)", flush=True)
        print(f"[{_uptime()}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
