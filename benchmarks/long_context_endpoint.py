"""What a visitor waits for the Long context tab's default run (the default: 3 formats, 4K tokens on SmolLM2, within 60 s
warm, the first results in the chart within 10 s), timed through gradio_client against the running app.

    python benchmarks/long_context_endpoint.py                       # starts app.py on SmolLM2, the tab's defaults
    python benchmarks/long_context_endpoint.py --url http://127.0.0.1:7860/ --rounds 3
    python benchmarks/long_context_endpoint.py --context 2048 --formats int4,k8v4 --new-tokens 32
    python benchmarks/long_context_endpoint.py --split                # no app: where the library call's time goes

Without --url it starts `python app.py` on --model (tests/app_server.py; KVVIZ_WARMUP=0, so the untimed warm-up
click below is what loads the model and compiles the kernels). Each round submits /long_context with the tab's
defaults (kvviz.ui.long_context: WikiText-2, chunks of 256, the generation panel, no needle) and records, from the
streamed updates as the client receives them: the first update that carries the KL chart (the first chunk's
results) and the last (the whole run). One untimed warm-up click (256 tokens, the same formats) runs first.

The baseline, timed in this process between rounds: the exact model's own chunked pass over the same text
(DynamicCache, the same chunks; the library's checks.LOGIT_BLOCK is not involved: hidden states only), so the
printed ratio says what the formats, the metrics and the app add on top of one exact read of the context.
`uptime` is printed beside each round: on a shared machine the absolute times move with the load.

--split runs no app: the library calls the tab makes, in this process after the exact pass, each part's seconds
against it: the position pass's exact run, each format's run and the LM head with the KL (PositionDrift.seconds),
then the generation (kvviz.quality.long_context.generation_drift); what is left of the tab's time is the app's
(figures, tables, the transport).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _args(context: int, formats: list[str], new_tokens: int, chunk: int, model: str) -> tuple:
    from kvviz.ui import long_context as tab

    return ("WikiText-2", "", None, formats, "", context, chunk, new_tokens, False, tab.DEFAULT_NEEDLE_CONTEXTS,
            tab.DEFAULT_NEEDLE_DEPTHS, model, "English")


def _has_chart(update) -> bool:
    fig = update[1]
    return isinstance(fig, dict) and fig.get("type") == "plotly" and bool(json.loads(fig["plot"]).get("data"))


def time_click(client, args) -> tuple[float, float, str]:
    """(seconds to the first streamed update holding the KL chart, seconds to the end, the final status)."""
    start = time.perf_counter()
    job = client.submit(*args, api_name="/long_context")
    first = None
    for update in job:
        if first is None and _has_chart(update):
            first = time.perf_counter() - start
    final = job.result()
    total = time.perf_counter() - start
    return first if first is not None else total, total, final[0]


def exact_pass(model_name: str, context: int, chunk: int) -> float:
    """Seconds of the exact model's chunked pass over the first `context` tokens of WikiText-2 (this process)."""
    import torch
    from transformers import DynamicCache

    from kvviz.analysis.teacher_forced import decoder
    from kvviz.quality.long_context import long_text_ids
    from kvviz.ui import registry

    model, tok = registry.load(model_name)  # the app's loader (the tiny-<arch> test models included)
    ids, _ = long_text_ids(tok, context)
    body = decoder(model)
    start = time.perf_counter()
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        for a in range(0, context, chunk):
            body(input_ids=ids[:, a:a + chunk], cache=cache, use_cache=True)
    return time.perf_counter() - start


def split(model_name: str, context: int, chunk: int, formats: list[str], new_tokens: int) -> None:
    """Print the seconds of each part of the tab's library calls against the exact chunked pass (this process)."""
    from kvviz.quality import long_context as lc
    from kvviz.ui import long_context as tab
    from kvviz.ui import registry

    model, tok = registry.load(model_name)
    for _ in lc.position_drift(model, tok, formats, context=256, chunk=128):  # compiles the kernels, untimed
        pass
    before = _uptime()
    exact = exact_pass(model_name, context, chunk)
    start = time.perf_counter()
    for drift in lc.position_drift(model, tok, formats, context=context, chunk=chunk):
        pass
    position = time.perf_counter() - start
    start = time.perf_counter()
    for _ in lc.generation_drift(model, tok, formats, new_tokens=new_tokens, prompt_tokens=tab.GEN_PROMPT_TOKENS):
        pass
    generation = time.perf_counter() - start
    parts = {**{f"position: {k}": v for k, v in drift.seconds.items()},
             "position: the rest": position - sum(drift.seconds.values()), "generation": generation}
    print(f"the exact model's chunked pass alone {exact:.1f} s | {before}")
    for name, seconds in parts.items():
        print(f"  {name:24s} {seconds:7.1f} s  {seconds / exact:5.2f}x")
    print(f"  {'in all':24s} {position + generation:7.1f} s  {(position + generation) / exact:5.2f}x | {_uptime()}")


def main() -> int:
    from kvviz.ui import long_context as tab

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a running app (default: start app.py on --model)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--context", type=int, default=tab.DEFAULT_CONTEXT)
    p.add_argument("--chunk", type=int, default=tab.DEFAULT_CHUNK)
    p.add_argument("--new-tokens", type=int, default=tab.DEFAULT_NEW_TOKENS)
    p.add_argument("--formats", default=",".join(tab.DEFAULT_SPECS))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--split", action="store_true", help="no app: time each part of the library calls the tab makes")
    args = p.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    if args.split:
        split(args.model, args.context, args.chunk, formats, args.new_tokens)
        return 0

    import contextlib

    from gradio_client import Client

    from app_server import serve_app

    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(serve_app(model=args.model, KVVIZ_WARMUP="0")).url
        client = Client(url, verbose=False, httpx_kwargs={"timeout": 900})
        first, total, _ = time_click(client, _args(256, formats, 4, min(args.chunk, 128), args.model))
        print(f"warm-up click (256 tokens): {total:.1f} s", flush=True)
        best = None
        for r in range(args.rounds):
            exact = exact_pass(args.model, args.context, args.chunk)
            first, total, status = time_click(client, _args(args.context, formats, args.new_tokens, args.chunk,
                                                            args.model))
            print(f"round {r + 1}: first chart {first:.1f} s, whole run {total:.1f} s; the exact model's chunked "
                  f"pass alone {exact:.1f} s (run / exact {total / exact:.1f}x) | {_uptime()}", flush=True)
            best = (first, total, exact) if best is None or total < best[1] else best
        print(f"\n{args.model}, {args.context:,} tokens in chunks of {args.chunk}, {', '.join(formats)}, "
              f"{args.new_tokens} new tokens: best of {args.rounds}: first chart {best[0]:.1f} s (target 10 s), "
              f"whole run {best[1]:.1f} s (target 60 s), {best[1] / best[2]:.1f}x the exact chunked pass")
        print(status.split("\n")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
