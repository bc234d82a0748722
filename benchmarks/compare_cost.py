"""What the Compare tab's side-by-side run costs, against one plain greedy generation of the same length, on the
bundled SmolLM2-135M (docs/benchmarks.md's "The Compare tab's cost" figures come from this script).

    python benchmarks/compare_cost.py                      # the tab's defaults, and 6 formats x 128 tokens
    python benchmarks/compare_cost.py --rounds 3 --profile 32  # best of 3; then cProfile of one 6 x 32 run

Each case times `kvviz.quality.compare(model, tok, prompt, formats, max_new_tokens=N)` (free-running text plus
teacher-forced metrics, the tab's run without its tokens/s column) and `model.generate(max_new_tokens=N)`
(greedy, batch 1, DynamicCache) interleaved in one process, keeps the best of each over the rounds and prints
their ratio: on a shared machine the ratio moves far less than either time. `uptime` is printed beside it.

    python benchmarks/compare_cost.py --app                # what a visitor waits: the app's /compare endpoint
    python benchmarks/compare_cost.py --two-step           # also quality.compare without the rows' one-call path

--app starts `python app.py` on the bundled model (tests/app_server.py) and times each case as the Compare button
runs it, through gradio_client: the whole endpoint (the streamed text, the metrics, each format's tokens/s run,
the tables and charts), after one untimed warm-up click. The plain generation is timed in this process, in the
same interleaved rounds. Both take OMP_WAIT_POLICY from the environment (the app leaves it as given), so that
both sides run under one OpenMP wait policy. benchmarks/compare_endpoint.py times the endpoint as a user meets it:
its six formats, the generation in a process of its own, the idle app paused meanwhile.

--two-step adds, in the same interleaved rounds, quality.compare with the rows' one-call append and mirror turned
off (kernels/cpu/mirror.py; QuantizedKVLayer.append_mirrored answering "not here"), so the two paths compare on
one machine state.

    python benchmarks/compare_cost.py --mkl                # also quality.compare with the batch not row-stable

--mkl adds, in the same interleaved rounds, quality.compare with kvviz.rowstable turned off (every linear layer
through F.linear, MKL's sgemm, and attention through SDPA over the whole batch, as before row-stable batches), and
prints how far its texts, KL and top-1 land from the default run's.
"""

import argparse
import contextlib
import cProfile
import pstats
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvviz  # noqa: E402
from kvviz import quality, rowstable  # noqa: E402
from kvviz.cache.sides import ScaleWarning  # noqa: E402
from kvviz.ui.common import EXAMPLES  # noqa: E402
from kvviz.ui.compare import DEFAULT_SPECS  # noqa: E402

TAB_PROMPT = EXAMPLES[3]  # the prompt the Compare tab opens with (compare.build: prompt_input(tr, 3))
TAB_TOKENS = 24  # the tab's "Max new tokens" slider default
SIX = DEFAULT_SPECS + ["kivi2", "nvfp4"]  # the 6 formats: the tab's 4 plus a channel and an FP4 format


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _generate_s(model, ids: torch.Tensor, n: int) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False)
    return time.perf_counter() - t0


def _compare_s(model, tok, ids: torch.Tensor, specs: list[str], n: int) -> float:
    t0 = time.perf_counter()
    quality.compare(model, tok, ids, specs, max_new_tokens=n)
    return time.perf_counter() - t0


def _drift(stable, mkl) -> str:
    """Per format: whether the free-running texts match, and the mean KL and top-1 of both runs."""
    lines = [f"    baseline text {'same' if stable.baseline_ids == mkl.baseline_ids else 'DIFFERS'}"]
    for a, b in zip(stable.formats, mkl.formats):
        text = "same" if a.token_ids == b.token_ids else "DIFFERS"
        lines.append(f"    {a.name}: text {text}, mean KL {a.kl.mean():.5f} -> {b.kl.mean():.5f} (largest step change "
                     f"{np.abs(a.kl - b.kl).max():.1e}), top-1 {100 * a.top1.mean():.1f}% -> "
                     f"{100 * b.top1.mean():.1f}%")
    return "\n".join(lines)


@contextlib.contextmanager
def _two_step():
    """The rows' decode tokens through update and the torch decode (kernels/cpu/mirror.py's path off)."""
    from kvviz.cache.layers import QuantizedKVLayer

    real = QuantizedKVLayer.append_mirrored
    QuantizedKVLayer.append_mirrored = lambda self, *args: False
    try:
        yield
    finally:
        QuantizedKVLayer.append_mirrored = real


@contextlib.contextmanager
def _mkl():
    """The batch as before kvviz.rowstable: F.linear (MKL) and SDPA over all rows."""
    real = rowstable.active
    rowstable.active = lambda: False
    try:
        yield
    finally:
        rowstable.active = real


def _endpoint_s(client, specs: list[str], n: int) -> float:
    """Seconds until the app's Compare endpoint returns for `specs` x n tokens on the tab's prompt."""
    t0 = time.perf_counter()
    client.predict(TAB_PROMPT, specs, "", n, False, api_name="/compare")
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds, best kept (default 2)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="then profile one run of the 6 formats x N tokens (default 0: none)")
    p.add_argument("--cases", default="tab,six", help="which cases to time: tab, six (default both)")
    p.add_argument("--app", action="store_true", help="time the running app's /compare endpoint (gradio_client)")
    p.add_argument("--two-step", action="store_true",
                   help="also time quality.compare with the rows' one-call append-and-mirror path off")
    p.add_argument("--mkl", action="store_true",
                   help="also time quality.compare with the batch not row-stable, and print the drift")
    args = p.parse_args()
    if args.app and args.mkl:
        p.error("--mkl times quality.compare in this process; run it without --app.")
    if args.app and args.two_step:
        p.error("--two-step compares quality.compare in this process with and without the one-call path; run it "
                "without --app (the app's endpoint cannot turn the path off).")
    warnings.simplefilter("ignore", ScaleWarning)  # fp8's first-update scale on a short prompt, once per layer
    model, tok = kvviz.load_model()
    ids = tok(TAB_PROMPT, return_tensors="pt")["input_ids"]
    cases = {"tab": ("the tab's defaults", DEFAULT_SPECS, TAB_TOKENS), "six": ("the issue's case", SIX, 128)}
    cases = [cases[c] for c in args.cases.split(",") if c]
    with contextlib.ExitStack() as stack:
        if args.app:
            from gradio_client import Client

            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            import app_server

            app_server.STARTUP_TIMEOUT_S = 900
            srv = stack.enter_context(app_server.serve_app(model="smollm2-135m"))
            client = Client(srv.url, verbose=False)
            _endpoint_s(client, DEFAULT_SPECS, TAB_TOKENS)  # warm-up: the launch warm-up's compile, first calls
            run = lambda specs, n: _endpoint_s(client, specs, n)  # noqa: E731
        else:
            _compare_s(model, tok, ids, SIX[:2], 4)  # warm-up: first calls allocate
            run = lambda specs, n: _compare_s(model, tok, ids, specs, n)  # noqa: E731
        _generate_s(model, ids, 4)
        what = "the app's /compare endpoint" if args.app else "quality.compare"
        print(f"SmolLM2-135M, prompt {ids.shape[1]} tokens, {torch.get_num_threads()} torch threads, timing {what}"
              f"\n[{_uptime()}]")
        for label, specs, n in cases:
            gen, cmp, two, mkl = [], [], [], []
            for _ in range(args.rounds):
                gen.append(_generate_s(model, ids, n))
                cmp.append(run(specs, n))
                if args.two_step:
                    with _two_step():
                        two.append(_compare_s(model, tok, ids, specs, n))
                if args.mkl:
                    with _mkl():
                        mkl.append(_compare_s(model, tok, ids, specs, n))
            print(f"{label}: {len(specs)} formats ({', '.join(specs)}) x {n} tokens: compare {min(cmp):.2f} s, "
                  f"generate {min(gen):.2f} s, ratio {min(cmp) / min(gen):.2f}x  (rounds: compare "
                  f"{', '.join(f'{s:.2f}' for s in cmp)}; generate {', '.join(f'{s:.2f}' for s in gen)})",
                  flush=True)
            if two:
                print(f"  without the one-call append and mirror: compare {min(two):.2f} s, ratio "
                      f"{min(two) / min(gen):.2f}x  (rounds: {', '.join(f'{s:.2f}' for s in two)})", flush=True)
            if mkl:
                with _mkl():
                    moved = quality.compare(model, tok, ids, specs, max_new_tokens=n)
                print(f"  not row-stable (MKL, batched SDPA): compare {min(mkl):.2f} s, "
                      f"ratio {min(mkl) / min(gen):.2f}x"
                      f"  (rounds: {', '.join(f'{s:.2f}' for s in mkl)}); row-stable -> not:\n"
                      + _drift(quality.compare(model, tok, ids, specs, max_new_tokens=n), moved), flush=True)
    print(f"[{_uptime()}]")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(quality.compare, model, tok, ids, SIX, max_new_tokens=args.profile)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
