"""Soak test of the app: many API calls in a row, mixing every model tab and bad input; the server's memory must
not keep growing.

Starts `python app.py` on a free port (tests/app_server.py), warms it up (model load, first figures), reads the
app process's resident memory (VmRSS in /proc/<pid>/status), makes `--calls` calls cycling through compare,
outliers, error_map, needle, export and a call with bad input, with a different prompt each time (so the
per-prompt capture cache keeps turning over), and reads the memory again. Reports MiB before and after, the
growth in percent, and seconds per call; exits 1 when the growth reaches `--max-growth` percent.

    python benchmarks/soak.py                               # 150 calls on the tiny random model (~2 min)
    python benchmarks/soak.py --model smollm2-135m          # the bundled model (slower: seconds per call)

tests/test_app_api.py runs `soak()` for 50 calls against its own server in CI. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WARMUP_CALLS = 12  # one full cycle and more: every tab has loaded what it keeps for the process's life
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo")


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` in bytes (Linux: VmRSS from /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line: is the process alive?")


def prompt(i: int) -> str:
    """A distinct prompt per call, 30 to 80 characters."""
    words = [_WORDS[(i * 7 + j) % len(_WORDS)] for j in range(3 + i % 8)]
    return f"Call {i}: " + " ".join(words) + "."


def call(client, i: int) -> str:
    """Call number i of the cycle; returns which endpoint it was. Bad input must come back as an error."""
    kind = ("compare", "outliers", "error_map", "needle", "export", "bad")[i % 6]
    if kind == "compare":
        client.predict(prompt(i), ["int4", "k8v4"], "", 4, False, api_name="/compare")
    elif kind == "outliers":
        client.predict(prompt(i), 0, 0, api_name="/outliers")
    elif kind == "error_map":
        client.predict(prompt(i), "int4", ["int8", "int4"], "", "V", 0, 0, api_name="/error_map")
    elif kind == "needle":
        client.predict(["int4"], "", 256, api_name="/needle")
    elif kind == "export":
        client.predict("fp8_e4m3", "my-org/model", prompt(i), api_name="/export")
    else:
        try:
            client.predict(prompt(i), "int5", [], "", "V", 0, 0, api_name="/error_map")
        except Exception as e:  # gradio_client raises AppError carrying the app's message
            assert "Unknown KV format" in str(e), f"bad input gave an unexpected answer: {e}"
        else:
            raise AssertionError("error_map accepted the unknown format 'int5'")
    return kind


def soak(client, pid: int, calls: int, warmup: int = WARMUP_CALLS, log=None) -> dict:
    """Warm up, then make `calls` calls; returns {"calls", "rss_before", "rss_after", "growth", "seconds",
    "per_kind"} (bytes, fraction, seconds; per_kind: endpoint -> [calls, seconds])."""
    for i in range(warmup):
        call(client, i)
    before = rss_bytes(pid)
    per_kind: dict[str, list] = {}  # kind -> [calls, seconds]
    t0 = time.perf_counter()
    for i in range(warmup, warmup + calls):
        t_call = time.perf_counter()
        kind = call(client, i)
        count = per_kind.setdefault(kind, [0, 0.0])
        count[0] += 1
        count[1] += time.perf_counter() - t_call
        if log and (i - warmup + 1) % 25 == 0:
            log(f"{i - warmup + 1}/{calls} calls, RSS {rss_bytes(pid) / 2**20:.1f} MiB")
    seconds = time.perf_counter() - t0
    after = rss_bytes(pid)
    return {"calls": calls, "rss_before": before, "rss_after": after, "growth": (after - before) / before,
            "seconds": seconds, "per_kind": per_kind}


def report(result: dict, model: str) -> str:
    r = result
    kinds = ", ".join(f"{k} {n} x {sec / n:.2f} s" for k, (n, sec) in r["per_kind"].items())
    return (f"soak: {r['calls']} calls on {model} ({kinds}) in {r['seconds']:.1f} s "
            f"({r['seconds'] / r['calls']:.2f} s/call); app RSS {r['rss_before'] / 2**20:.1f} MiB after warm-up, "
            f"{r['rss_after'] / 2**20:.1f} MiB after the calls: {r['growth']:+.1%}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=150, help="calls after warm-up (default 150)")
    p.add_argument("--model", default="tiny-llama", help="KVVIZ_MODEL for the app (default tiny-llama)")
    p.add_argument("--max-growth", type=float, default=15.0, help="fail at this RSS growth in percent (default 15)")
    args = p.parse_args(argv)
    if args.calls < 1:
        p.error("--calls must be a positive integer")

    sys.path.insert(0, str(REPO / "tests"))
    from app_server import serve_app
    from gradio_client import Client

    with serve_app(model=args.model) as srv:
        client = Client(srv.url, verbose=False)
        result = soak(client, srv.pid, args.calls, log=lambda m: print(f"[soak] {m}", flush=True))
    print(report(result, args.model))
    if result["growth"] * 100 >= args.max_growth:
        print(f"FAIL: memory grew {result['growth']:.1%}, the limit is {args.max_growth:g}%")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
