"""Cold and warm start of the app: seconds until the page is served, and until the first Compare click answers.

Starts `python app.py` as a fresh process (tests/app_server.py) twice on the same caches: first with
KVVIZ_CACHE_DIR and NUMBA_CACHE_DIR pointed at empty temporary directories (a new Space container: the bundled
model is converted and the kernels compiled), then again on the caches that run left (a restart). For each it
times, from the process start: the page served (HTTP 200 on /), and Compare's default click answered (the
page's defaults: its example prompt, fp8_e4m3, k8v4, k4v8 and int4, 24 new tokens) through gradio_client. With the
launch warm-up (kvviz.ui.common.start_warm_up) the page is served at once and the click waits only for what the
warm-up has not finished. Prints a markdown table and the machine's load.

    python benchmarks/cold_start.py                         # the bundled SmolLM2 (minutes on a 2-core CPU)
    python benchmarks/cold_start.py --model tiny-llama      # the harness itself, seconds
    python benchmarks/cold_start.py --no-warm-up            # KVVIZ_WARMUP=0: what a visitor waited before
    python benchmarks/cold_start.py --image                 # the Dockerfile's way: warm at build time, then start

--image does what the Dockerfile's last steps do, outside a container: `python app.py --warm-up` on empty caches
(the image's build step: the bundled models converted, the default formats' kernels compiled into
NUMBA_CACHE_DIR), timed, then the image's first start on those caches, timed as above.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import app_server  # noqa: E402
from app_server import serve_app  # noqa: E402

from kvviz.ui import common, compare  # noqa: E402


def one_start(model: str, env: dict[str, str]) -> tuple[float, float]:
    """(seconds to the page, seconds to the first Compare answer), both from the process start."""
    from gradio_client import Client

    start = time.perf_counter()
    with serve_app(model=model, **env) as srv:
        page = time.perf_counter() - start
        Client(srv.url, verbose=False).predict(common.EXAMPLES[3], compare.DEFAULT_SPECS, "", 24, False,
                                               api_name="/compare")
        return page, time.perf_counter() - start


def build_step(model: str, env: dict[str, str]) -> float:
    """Seconds `python app.py --warm-up` takes on `env`'s caches (the Dockerfile's build step), for KVVIZ_MODEL
    `model`; its output is echoed. A failure raises."""
    import subprocess

    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "app.py", "--warm-up"], cwd=REPO, env={**os.environ, **env,
                          "KVVIZ_MODEL": model}, capture_output=True, text=True, check=False)
    print(proc.stdout.strip())
    if proc.returncode:
        raise SystemExit(f"python app.py --warm-up failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    app_server.STARTUP_TIMEOUT_S = 1800  # a cold import on a busy 2-core machine takes minutes
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--no-warm-up", action="store_true", help="KVVIZ_WARMUP=0: no launch warm-up")
    ap.add_argument("--image", action="store_true", help="build-time warm-up (python app.py --warm-up), then start")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvviz-cold-") as tmp:
        env = {"KVVIZ_CACHE_DIR": str(Path(tmp) / "kvviz"), "NUMBA_CACHE_DIR": str(Path(tmp) / "numba"),
               "KVVIZ_WARMUP": "0" if args.no_warm_up else "1"}
        if args.image:
            build = build_step(args.model, env)
            print(f"build step (python app.py --warm-up on empty caches): {build:.1f} s")
            rows = [("image's first start (caches from the build step)", *one_start(args.model, env))]
        else:
            rows = [(name, *one_start(args.model, env)) for name in ("cold (empty caches)", "warm (restart)")]
    print(f"model {args.model}, launch warm-up {'off' if args.no_warm_up else 'on'}; {platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print("| start | page served (s) | first Compare answered (s) |\n|---|---|---|")
    for name, page, click in rows:
        print(f"| {name} | {page:.1f} | {click:.1f} |")


if __name__ == "__main__":
    main()
