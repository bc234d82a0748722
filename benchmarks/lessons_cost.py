"""What each lesson's one click costs a visitor: every lesson's actions timed through the running app's endpoints
(gradio_client), warm, on the bundled models (docs/benchmarks.md's lesson timings come from this script).

    python benchmarks/lessons_cost.py                              # SmolLM2-135M, every lesson, 2 rounds
    python benchmarks/lessons_cost.py --models smollm2-135m,gemma-3-270m --lessons 5,8

For each model the script starts `python app.py` on it (tests/app_server.py), builds the page in its own process
only to read each lesson's arguments (kvviz.ui.lessons.calls: the values its button fills in, the component's own
value otherwise), and then calls the public endpoint behind each of the lesson's actions, in order, with those
values: the work the button's chain does (a lesson button runs the same functions through private events). The clicks start once the app's launch warm-up has finished (its log says
"warmed up"): the first round is a visitor's first click of that lesson on a warm app, the rounds after it the
same click again (some views memoise what they measured). Targets (issue 23), checked on the first click: 15 s on
SmolLM2, 30 s on Gemma 3 270M. Where the click's last endpoint streams (the plan search's passes, Compare's
tokens), the seconds until its first update are printed beside the total (Compare's first update is its empty
columns, at once).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

TARGET_S = {"smollm2-135m": 15.0, "gemma-3-270m": 30.0}


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _page_parts(model: str):
    """(demo, {tab: its parts}) of the page built in this process on `model` (nothing is loaded: models load
    lazily)."""
    import app

    os.environ["KVVIZ_MODEL"] = model
    demo = app.build_demo()
    return demo, demo.parts


def _endpoint(demo, fn) -> str:
    """The public api_name whose event runs `fn` (the lesson's action)."""
    for dep in demo.fns.values():
        runs = getattr(dep, "fn", None)
        while runs is not None and runs is not fn:  # through decorators (ZeroGPU's, where installed)
            runs = getattr(runs, "__wrapped__", None)
        if runs is fn and dep.api_name and getattr(dep, "api_visibility", "public") != "private":
            return "/" + dep.api_name
    raise LookupError(f"no public endpoint runs {fn.__name__}")


def _calls(demo, parts: dict, i: int, model: str) -> list[tuple[str, list]]:
    """Lesson i's actions as (api_name, arguments), the arguments as the lesson's button fills them."""
    from kvviz.ui import lessons

    return [(_endpoint(demo, fn), args) for _, fn, args in lessons.calls(parts, i, model)]


def _seconds(click: list[float]) -> str:
    """A click's total, with each endpoint's share when it ran several ("34.1 (14.2 + 19.9)")."""
    total = f"{sum(click):.1f}"
    return total if len(click) == 1 else f"{total} ({' + '.join(f'{s:.1f}' for s in click)})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2-135m", help="comma-separated bundled models (default smollm2-135m)")
    p.add_argument("--lessons", default="", help="comma-separated lesson numbers (default: all)")
    p.add_argument("--rounds", type=int, default=2, help="clicks per lesson (default 2)")
    args = p.parse_args()
    from gradio_client import Client

    import app_server
    from kvviz.models import BUNDLED, bundled_installed
    from kvviz.ui import lessons

    app_server.STARTUP_TIMEOUT_S = 900
    every = list(range(1, len(lessons.LESSONS) + 1))
    try:
        chosen = [int(x) for x in args.lessons.split(",") if x] or every
    except ValueError:
        chosen = [0]
    if not set(chosen) <= set(every):
        p.error(f"--lessons takes lesson numbers from 1 to {len(every)}, comma-separated; got {args.lessons!r}.")
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in BUNDLED]
    if unknown or not models:
        p.error(f"--models takes bundled models ({', '.join(BUNDLED)}), comma-separated; got {args.models!r}.")
    if args.rounds < 1:
        p.error(f"--rounds is how many clicks per lesson, 1 or more; got {args.rounds}.")
    for model in models:
        if not bundled_installed(model):
            print(f"{model}: not installed, skipped")
            continue
        demo, parts = _page_parts(model)
        target = TARGET_S.get(model)
        with app_server.serve_app(model=model) as srv:
            deadline = time.monotonic() + 900
            while "warmed up" not in srv.log_tail(400) and time.monotonic() < deadline:
                time.sleep(1)
            print(f"\n{model}: each lesson's actions through the app's endpoints, {args.rounds} clicks "
                  f"(target {target:g} s)\n[{_uptime()}]")
            print("| lesson | endpoints | first click (s) | again (s) | first within target |\n|---|---|---:|---|---|")
            client = Client(srv.url, verbose=False)
            for i in chosen:
                calls = _calls(demo, parts, i, model)
                rounds = []  # per click: each endpoint's seconds
                shown = []  # per click: seconds until the last endpoint's first streamed update
                for _ in range(args.rounds):
                    rounds.append([])
                    for api_name, values in calls:
                        t0 = time.perf_counter()
                        job = client.submit(*values, api_name=api_name)
                        updates = [time.perf_counter() - t0 for _ in job]  # a streaming endpoint's updates
                        job.result()
                        rounds[-1].append(time.perf_counter() - t0)
                    shown.append(sum(rounds[-1][:-1]) + (updates[0] if len(updates) > 1 else rounds[-1][-1]))
                first = sum(rounds[0])
                ok = "" if target is None else ("yes" if first <= target else "no")
                streamed = f"; its last endpoint's first update at {shown[0]:.1f}" if shown[0] < 0.9 * first else ""
                print(f"| {i} | {', '.join(a for a, _ in calls)} | {_seconds(rounds[0])}{streamed} | "
                      f"{', '.join(_seconds(r) for r in rounds[1:])} | {ok} |", flush=True)
        print(f"[{_uptime()}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
