"""`python -m kvviz engines`: KV formats measured inside llama.cpp (in a worker process) or vLLM / SGLang servers.

    python -m kvviz engines --specs q8_0,k=q8_0,v=q4_0,q4_0 --tokens 512           # llama.cpp, bundled SmolLM2
    python -m kvviz engines --specs q4_0 --model path/to/model.gguf --no-rotate
    python -m kvviz engines --vllm fp8_e4m3,fp8_e5m2 --tokens 128                  # local vLLM servers (make vllm)
    python -m kvviz engines --vllm fp8_e4m3 --serve --max-model-len 513   # keep them up for the app (KVVIZ_VLLM_URLS)
    python -m kvviz engines --baseline http://gpu0:8000 --server fp8_e4m3=http://gpu1:8000 --top-k 20

Prints one row per format: llama.cpp's KLD statistics (kvviz.metrics) against the engine's own baseline, then
how the KL was estimated. Every engine run and server answer is checked before the first number is printed.
--vllm starts vLLM's CPU build itself (kvviz/engines/vllm_local.py: an `auto` baseline and one server per dtype on
127.0.0.1, stopped afterwards, also on Ctrl-C), scores positions 1 on, and adds kvviz's simulation of each dtype
measured the same way with a verdict (kvviz/engines/verdict.py). Servers are capped to their max_model_len.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from kvviz import engines
from kvviz.engines import llamacpp, simulate, verdict, vllm_local
from kvviz.memory import split_formats

HELP = ("KLD of KV formats inside a real engine: llama.cpp (in a worker process), vLLM servers kvviz starts, or "
        "vLLM / SGLang servers")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--specs", help="llama.cpp: comma-separated kvviz specs of its cache types, pairs kept whole "
                                   "(e.g. q8_0,k=q8_0,v=q4_0); servers: the --server names to measure (default all)")
    p.add_argument("--model", help="llama.cpp: a bundled model name or a .gguf path (default: the bundled SmolLM2); "
                                   "--vllm: a bundled model name or a transformers directory (default: SmolLM2); "
                                   "servers: the served model name (default: the first the server lists)")
    p.add_argument("--tokens", type=int, default=512, help="tokens of the text scored (default %(default)s)")
    p.add_argument("--text-file", metavar="PATH", help="text to score (default: the WikiText-2 slice in assets/)")
    lc = p.add_argument_group("llama.cpp")
    lc.add_argument("--no-rotate", action="store_true",
                    help="store K/V unrotated (LLAMA_ATTN_ROT_DISABLE=1), as kvviz's formats do")
    lc.add_argument("--no-flash-attn", action="store_true", help="flash attention off (llama.cpp then refuses a "
                                                                 "quantized V)")
    lc.add_argument("--threads", type=int, help="CPU threads (default: llama.cpp's choice)")
    lc.add_argument("--with-kvviz", action="store_true",
                    help="also run kvviz's simulation of the same formats on the same tokens (a bundled model only)")
    loc = p.add_argument_group("vLLM started here (its CPU build, `make vllm`; KVVIZ_VLLM_PYTHON names another)")
    loc.add_argument("--vllm", metavar="DTYPES", help="comma-separated --kv-cache-dtype values, e.g. "
                                                     "fp8_e4m3,fp8_e5m2: one server each plus an auto baseline")
    loc.add_argument("--max-model-len", type=int, help="the servers' context (default: --tokens + 1; a longer "
                                                       "--tokens is capped to it)")
    loc.add_argument("--port", type=int, help="first of consecutive ports on 127.0.0.1 (default: free ones)")
    loc.add_argument("--serve", action="store_true", help="start the servers, print KVVIZ_VLLM_URLS for the app's "
                                                          "engine view, and keep them running until Ctrl-C")
    loc.add_argument("--in-sequence", action="store_true", help="start the servers one after another (default: "
                                                                "together, faster on 2 cores)")
    srv = p.add_argument_group("vLLM / SGLang servers (one per --kv-cache-dtype, all serving the same model)")
    srv.add_argument("--baseline", metavar="URL", help="the full-precision server, e.g. http://gpu0:8000")
    srv.add_argument("--server", metavar="NAME=URL", action="append", default=[],
                     help="a server to measure and its label, e.g. fp8_e4m3=http://gpu1:8000 (repeatable)")
    srv.add_argument("--api", choices=("auto", "vllm", "sglang"), default="auto", help="default: %(default)s")
    srv.add_argument("--top-k", type=int, default=20, help="log-probs per position (default %(default)s, vLLM's "
                                                           "default --max-logprobs)")
    srv.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default %(default)s)")


def _engine(args: argparse.Namespace):
    if args.vllm is not None:
        if args.baseline or args.server or args.specs:
            raise ValueError("--vllm starts its own servers: leave out --baseline, --server and --specs (or measure "
                             "remote servers with --baseline and --server alone).")
        return "vllm-local", dict(top_k=args.top_k, max_model_len=args.max_model_len, port=args.port,
                                  together=not args.in_sequence)
    if args.baseline is None:
        if args.server:
            raise ValueError("--server needs --baseline URL, the full-precision server to compare against.")
        if not args.specs:
            raise ValueError("give --specs (llama.cpp cache types, e.g. q8_0,k=q8_0,v=q4_0) or --baseline and "
                             "--server NAME=URL for vLLM / SGLang servers.")
        return "llama.cpp", dict(flash_attn=not args.no_flash_attn, rotate=not args.no_rotate, threads=args.threads)
    servers = {"baseline": args.baseline}
    for item in args.server:
        name, sep, url = item.partition("=")
        if not sep or not name.strip() or not url.strip() or name.strip() == "baseline":
            raise ValueError(f"--server takes NAME=URL (e.g. fp8_e4m3=http://gpu1:8000), got {item!r}.")
        servers[name.strip()] = url.strip()
    if len(servers) < 2:
        raise ValueError("give at least one --server NAME=URL to measure against --baseline.")
    return servers, dict(api=args.api, top_k=args.top_k, timeout=args.timeout)


def run(args: argparse.Namespace) -> int:
    engine, options = _engine(args)
    specs = split_formats(args.specs) if args.specs else None
    text = None
    if args.text_file:
        try:
            with open(args.text_file, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise ValueError(f"Could not read --text-file {args.text_file} ({err.strerror}).") from err
    simulated = None
    if engine == "vllm-local":
        return _run_vllm(args, text, options)
    if engine == "llama.cpp" and args.with_kvviz:
        ids, results = llamacpp.run(specs, model=args.model, text=text, tokens=args.tokens, **options)
        simulated = simulate.kvviz_kld(specs, ids, args.model)
        engine_sim = simulate.llamacpp_kld(specs, ids, args.model, rotate=options["rotate"])
    elif args.with_kvviz:
        raise ValueError("--with-kvviz runs with llama.cpp (--specs), not with servers.")
    else:
        results = engines.measure(engine, specs, model=args.model, text=text, tokens=args.tokens, **options)
    first = next(iter(results.values()))
    _print_capped(first)
    where = first.get("model") or first.get("url")
    print(f"{first['engine']}: {where}; {first['n']} positions scored against the engine's own baseline")
    _print_table(results)
    if simulated is not None:
        print("\nkvviz's simulation, same tokens (transformers, the GGUF's weights dequantized to fp32, against the "
              "exact model; positions 1 on):")
        _print_table(simulated)
        print("\nkvviz's simulation of llama.cpp's arithmetic, same tokens (matmul inputs rounded to 8 bits, its "
              f"flash attention{', K/V rotated' if options['rotate'] else ''}; f16-cache baseline; positions 0 on):")
        _print_table(engine_sim)
    print(f"\nKLD in nats, KL(baseline || format) per position; estimate: {first['estimate']}.")
    if "rotation" in first:
        print(f"K/V rotation: {first['rotation']}.")
    return 0


def _print_capped(stats: dict) -> None:
    if stats.get("capped"):
        print(f"Note: {stats['capped']}.")


def _progress_line():
    """A progress(str) for vllm_local: one status line rewritten in place on a terminal; in a log, a line when the
    status changes or every 15 s (not one a second)."""
    last = {"what": None, "at": 0.0}

    def progress(message: str) -> None:
        if sys.stderr.isatty():
            print(f"\r{message:<100}", end="", file=sys.stderr, flush=True)
            return
        what, now = message.rsplit(", ", 1)[0], time.monotonic()  # the status without its running seconds
        if what != last["what"] or now - last["at"] >= 15:
            last.update(what=what, at=now)
            print(message, file=sys.stderr, flush=True)

    return progress


def _run_vllm(args: argparse.Namespace, text: str | None, options: dict) -> int:
    if args.serve:
        with vllm_local.serve(args.vllm, args.model, max_model_len=options["max_model_len"] or args.tokens + 1,
                              top_k=options["top_k"], port=options["port"], together=options["together"],
                              progress=_progress_line()) as urls:
            print(f"\nKVVIZ_VLLM_URLS={','.join(f'{n}={u}' for n, u in urls.items())}\nServing until Ctrl-C.",
                  flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        return 0
    results = vllm_local.measure_dtypes(args.vllm, args.model, tokens=args.tokens, text=text, score_from=1,
                             progress=_progress_line(), **options)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    first = next(iter(results.values()))
    _print_capped(first)
    print(f"vllm (CPU build, started here): {first['n']} positions (1 to {first['n']}) scored against vLLM's own "
          "auto baseline")
    _print_table(results)
    judged = verdict.rows(results, args.model)
    print(f"\nkvviz's simulation of the same dtypes, like with like (the same {len(first['ids'])} token ids and "
          f"positions, the same top-{first['top_k']} estimate, against kvviz's exact fp32 model):")
    _print_table({row.spec: row.sim for row in judged})
    print(f"\nverdict (vLLM's mean KLD / the simulation's; within {verdict.TOLERANCE:g}x either way is the format's "
          "expected range):")
    width = max(len(row.dtype) for row in judged)
    for row in judged:
        print(f"  {row.dtype:<{width}}  {row.engine_mean:.5f} / {row.sim_mean:.5f} = {row.ratio:.2f}x  {row.verdict}")
    print(f"\nKLD in nats, KL(baseline || format) per position; estimate: {first['estimate']}.")
    return 0


def _print_table(results: dict[str, dict]) -> None:
    """One aligned row per format: llama.cpp's KLD statistics."""
    table = [["format", "mean KLD", "± se", "median", "p99", "max", "same top", "RMS Δp", "ln(PPL/PPL base)"]]
    for name, s in results.items():
        table.append([name, f"{s['mean']:.5f}", f"{s['mean_se']:.5f}", f"{s['median']:.5f}", f"{s['p99']:.4f}",
                      f"{s['max']:.4f}", f"{s['same_top_p']:.2%}", f"{s['delta_p_rms']:.3%}",
                      f"{s['ln_ppl_ratio']:+.5f}"])
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
