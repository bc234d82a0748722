"""`python -m kvviz bench`: decode speed, cache bytes and teacher-forced quality of every KV format, against
DynamicCache and transformers' own QuantizedCache, on the default model on the CPU, in one run.

    python -m kvviz bench                       # the README's table (~40 minutes on 2 busy CPU cores)
    python -m kvviz bench --quick               # a small smoke run (short context, few tokens)

What is measured (one model load, one 1K-token prefill shared by every cache):
- tokens/s: greedy decode after a ~`--context`-token prompt, batch 1, each cache loaded with the same prefill K/V.
  Caches are timed in interleaved rounds and the best round is kept, so a busy machine penalizes all alike.
- bytes: what the cache holds after the run (kvviz: cache.nbytes(); DynamicCache: its tensors) against the memory
  model, kvviz.kv_cache_bytes(), for the same token count.
- KL / top-1: teacher-forced over `--prompts` WikiText-2 passages of `--prompt-tokens` tokens, `--tf-tokens`
  decode steps each, against the exact (DynamicCache) run. kvviz's formats run as rows of one batch
  (kvviz.quality.compare); transformers' caches run one by one through the same loop.
- DynamicCache's own row is measured like the others, not filled in: its KL / top-1 come from a second run through a
  fresh DynamicCache against the first (0 / 100% when the reference is deterministic), its bits/value from the
  element size of the tensors it holds (32 for the bundled model, which loads in fp32; 16 for a bf16 model).
- side by side: kvviz.quality.compare of 8 formats (free-running text + metrics) against one baseline generation
  of the same length.

transformers 5.24's QuantizedCache backends are "quanto" (optimum-quanto, int2/int4, group 64, residual window),
"hqq" (not installed here) and "fp8" (per-tensor E4M3 scale fixed at the first update, no residual).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import time
from pathlib import Path

import torch
from transformers import DynamicCache
from transformers.cache_utils import QuantizedCache

from kvviz import quality
from kvviz.attention import active_backend
from kvviz.cache.notes import ScaleNotes
from kvviz.cli import bench_contexts
from kvviz.formats import FORMAT_NAMES, PRESETS, parse_kv
from kvviz.memory import kv_cache_bytes
from kvviz.models import DEFAULT_MODEL, load_model
from kvviz.quality.speed import dynamic_bytes

HELP = "decode speed, cache bytes and KL of every KV format vs DynamicCache and transformers' QuantizedCache"
# the 4K targets' formats, and the 4-bit and 8-bit engine stores
CONTEXT_FORMATS = ("int4", "k8v4", "mxfp4", "nvfp4", "q4_0", "q8_0", "vllm:int4_per_token_head",
                   "vllm:turboquant_4bit_nc")
ROUNDS = 4  # the side-by-side run's timing rounds, best kept
# --contexts: rounds of every cache's 2 untimed + 6 timed steps, median step kept. On a shared 2-core VM a step runs
# in one of two speeds (at 1K about 70 or 95 ms) that last seconds at a time, so a ratio moves with how each cache's
# blocks fell between them; more rounds narrow that. 12 rounds from 4K up, where the gains are 15-60% (with 8, a
# bootstrap over the rounds of one run put a 4K ratio's 90% interval at +-7%, and one run read int4 at 1.09x where the
# next read 1.30x); 24 up to 2K, where a step is cheap and the gain a few percent (the byte ceiling at 1K is 1.08x):
# over one 32-round run at 1K, windows of 8 rounds read a format 0.95-1.13x, windows of 24 1.01-1.06x
# (docs/benchmarks.md)
CONTEXT_ROUNDS = 12
SHORT_CONTEXT, SHORT_CONTEXT_ROUNDS = 2048, 24
SIDE_BY_SIDE = ["fp8_e4m3", "fp8_e5m2", "int8", "int4", "k8v4", "k4v8", "kivi2", "nvfp4"]


def context_rounds(context: int) -> int:
    """--contexts' default rounds at `context` tokens (see CONTEXT_ROUNDS)."""
    return SHORT_CONTEXT_ROUNDS if context <= SHORT_CONTEXT else CONTEXT_ROUNDS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model name or path (default: the bundled SmolLM2-135M)")
    p.add_argument("--context", type=int, default=1024, help="prompt tokens before the timed decode (default 1024)")
    p.add_argument("--decode-tokens", type=int, default=6, help="timed decode steps per round (default 6)")
    p.add_argument("--rounds", type=int, default=None, help="timing rounds: the side-by-side run keeps each "
                   f"cache's best round (default {ROUNDS}); --contexts each cache's median step (default "
                   f"{SHORT_CONTEXT_ROUNDS} up to {SHORT_CONTEXT} tokens, {CONTEXT_ROUNDS} beyond)")
    p.add_argument("--prompts", type=int, default=3, help="teacher-forced prompts (default 3)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="tokens per teacher-forced prompt (default 128)")
    p.add_argument("--tf-tokens", type=int, default=32, help="teacher-forced decode steps per prompt (default 32)")
    p.add_argument("--formats", default=None, help="comma-separated kvviz specs (default: every base format + presets)")
    p.add_argument("--quick", action="store_true", help="smoke run: context 256, 4 decode tokens, 1 prompt x 16 steps")
    p.add_argument("--contexts", default=None, help="comma-separated contexts, e.g. 1024,4096,8192: decode speed only, "
                   "per context, against DynamicCache and StaticCache, with the byte ceiling and the time per layer in "
                   "update and attention (default formats: " + ", ".join(CONTEXT_FORMATS) + ")")
    p.add_argument("--json", default=None, metavar="PATH", help="with --contexts: also write the figures, the "
                   "command, date and machine as JSON (kvviz/quality/recorded/<model>.json is what lesson 7 draws)")
    p.add_argument("--llama-cpp", action="store_true", help="with --contexts: llama.cpp as the peer, its tokens/s "
                   "with q4_0 and q8_0 K/V against f16 K/V on the bundled GGUF, same context and threads "
                   "(llama-cpp-python)")


def run(args: argparse.Namespace) -> int:
    """CLI entry: run the benchmark, print the markdown table."""
    if args.rounds is None and not args.contexts:
        args.rounds = ROUNDS  # --contexts: per context (context_rounds)
    if args.quick:
        args.context, args.decode_tokens, args.rounds = 256, 4, 1
        args.prompts, args.prompt_tokens, args.tf_tokens = 1, 96, 16
    for name in ("context", "decode_tokens", "rounds", "prompts", "prompt_tokens", "tf_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer.")
    formats = None if args.formats is None else [f.strip() for f in args.formats.split(",") if f.strip()]
    if args.contexts:
        return _run_contexts(args, formats)
    notes = ScaleNotes()  # the caches' static-scale warnings (one per layer side), merged: a line per format
    with notes.catching():
        result = run_bench(args.model, formats, args.context, args.decode_tokens, args.rounds, args.prompts,
                           args.prompt_tokens, args.tf_tokens, progress=True)
    print(markdown(result))
    for line in notes.lines():
        print(f"Warning: {line.replace('`', '')}")
    return 0


def _run_contexts(args: argparse.Namespace, formats: list[str] | None) -> int:
    """--contexts: speed per context (kvviz/cli/bench_contexts.py), printed as one table per context."""
    try:
        contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"--contexts takes comma-separated token counts such as 1024,4096; "
                         f"got {args.contexts!r}.") from None
    if not contexts or min(contexts) < 16:
        raise ValueError(f"--contexts takes token counts of at least 16, e.g. 1024,4096; got {args.contexts!r}.")
    if args.json and not Path(args.json).resolve().parent.is_dir():  # checked before minutes of decoding
        raise ValueError(f"--json {args.json}: the folder {Path(args.json).resolve().parent} does not exist; "
                         "create it or pick another path.")
    formats = formats or list(CONTEXT_FORMATS)
    for f in formats:
        parse_kv(f)  # ValueError early on a bad spec
    model, tok = load_model(args.model)
    text_ids = tok(quality.wikitext(), return_tensors="pt")["input_ids"]
    while text_ids.shape[1] < max(contexts):  # a long context repeats the slice
        text_ids = torch.cat([text_ids, text_ids], dim=1)
    rounds = {c: args.rounds or context_rounds(c) for c in contexts}
    notes = ScaleNotes()
    with notes.catching():
        result = bench_contexts.speed_by_context(model, text_ids, formats, contexts, args.decode_tokens, rounds,
                                                 log=lambda msg: _log(True, msg))
    print(f"Backend `{active_backend()}`, {args.model or 'SmolLM2-135M-Instruct'}, greedy decode, median step of "
          f"interleaved rounds x {args.decode_tokens} tokens, {torch.get_num_threads()} torch threads.")
    print(bench_contexts.markdown(result, _machine()))
    if args.json:
        bench_contexts.write_json(args.json, result, model=args.model or DEFAULT_MODEL, machine=_machine(),
                                  decode_tokens=args.decode_tokens, command=_contexts_command(args))
    if args.llama_cpp:
        print(bench_contexts.llama_cpp_markdown(bench_contexts.llama_cpp_speed(
            contexts, args.decode_tokens, rounds, torch.get_num_threads(), args.model)))
    for line in notes.lines():
        print(f"Warning: {line.replace('`', '')}")
    return 0


def _contexts_command(args: argparse.Namespace) -> str:
    """The command line that reproduces a --contexts run."""
    parts = ["python -m kvviz bench", f"--contexts {args.contexts}"]
    parts += [f"--rounds {args.rounds}"] if args.rounds is not None else []  # else context_rounds per context
    parts += [f"--decode-tokens {args.decode_tokens}"]
    parts += [f"--formats {args.formats}"] if args.formats else []
    parts += [f"--model {args.model}"] if args.model else []
    return " ".join(parts + [f"--json {args.json}"])


def default_formats() -> list[str]:
    return list(FORMAT_NAMES) + list(PRESETS)


def _transformers_caches(model) -> dict:
    """name -> factory of an empty transformers QuantizedCache (None when its backend is not installed)."""
    out = {"tf fp8 (per-tensor)": lambda: QuantizedCache("fp8", model.config)}
    if importlib.util.find_spec("optimum") and importlib.util.find_spec("optimum.quanto") and not _quanto_locked():
        out["tf quanto int4 (residual 1)"] = lambda: QuantizedCache("quanto", model.config, nbits=4, residual_length=1)
        out["tf quanto int4 (residual 128)"] = lambda: QuantizedCache("quanto", model.config, nbits=4)
    return out


def _quanto_locked() -> bool:
    """True (and a printed notice) when optimum-quanto's C++ extension has a build lock left behind: torch's
    cpp_extension then waits for it forever, so the quanto rows are skipped instead of hanging the benchmark."""
    spec = importlib.util.find_spec("optimum.quanto")
    roots = spec.submodule_search_locations or [] if spec else []
    locks = [lock for root in roots for lock in Path(root).glob("library/extensions/*/build/lock")]
    if locks:
        print(f"[bench] skipping the transformers quanto rows: {locks[0]} exists (an interrupted build of "
              "optimum-quanto's C++ extension leaves it behind, and torch waits for it forever). Delete it if no "
              "other process is building that extension, then rerun.", flush=True)
    return bool(locks)


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_bench(model_name=None, formats=None, context=1024, decode_tokens=6, rounds=4, prompts=3, prompt_tokens=128,
              tf_tokens=32, progress=False, side_by_side: list[str] | None = None) -> dict:
    """Run everything; returns plain data: {"rows": [...], "side_by_side": {...}, "meta": {...}} (see markdown)."""
    formats = formats or default_formats()
    specs = {f: parse_kv(f) for f in formats}  # ValueError early on a bad spec
    model, tok = load_model(model_name)
    cfg = model.config.get_text_config(decoder=True)
    layers, heads = cfg.num_hidden_layers, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    text_ids = tok(quality.wikitext(), return_tensors="pt")["input_ids"]
    tf_caches = _transformers_caches(model)
    rows = {"DynamicCache": {"kind": "exact"}}
    rows.update({name: {"kind": "transformers"} for name in tf_caches})
    rows.update({f: {"kind": "kvviz", "bits": specs[f].bits_per_value(head_dim)} for f in formats})

    # ---- speed and bytes at ~context tokens ----------------------------------------------------------------
    ids = text_ids[:, :context]
    _log(progress, f"prefill {ids.shape[1]} tokens")
    t0 = time.perf_counter()
    dyn, logits0 = quality.prefill(model, ids)
    prefill_s = time.perf_counter() - t0
    first = int(logits0.argmax())
    factories = {"DynamicCache": lambda: None, **tf_caches, **{f: (lambda f=f: f) for f in formats}}
    for r in range(rounds):
        for name, make in factories.items():
            tps, cache, _ = quality.timed_decode(model, dyn, make(), first, decode_tokens)
            rows[name]["tokens_per_s"] = max(tps, rows[name].get("tokens_per_s", 0.0))
            held_tokens = ids.shape[1] + decode_tokens + 1
            if name == "DynamicCache":
                rows[name]["bytes"] = dynamic_bytes(cache)
                rows[name]["bits"] = 8 * cache.layers[0].keys.element_size()  # the model's dtype, as stored
            elif name in specs:
                rows[name]["bytes"] = cache.nbytes()
                rows[name]["model_bytes"] = kv_cache_bytes(layers, heads, head_dim, held_tokens, 1, specs[name])
            del cache
        _log(progress, f"speed round {r + 1}/{rounds} done")

    # ---- teacher-forced KL / top-1 ------------------------------------------------------------------------
    kl = {name: [] for name in rows}
    top1 = {name: [] for name in rows}
    step = max(prompt_tokens, text_ids.shape[1] // (prompts + 1))
    all_pids, conts = [], []
    for p in range(prompts):
        start = (p + 1) * step  # spread the passages over the slice, away from the speed prompt's start
        pids = text_ids[:, start : start + prompt_tokens]
        report = quality.compare(model, tok, pids, formats, max_new_tokens=tf_tokens + 1, free_running=False)
        for f in report.formats:
            kl[f.name].extend(f.kl.tolist())
            top1[f.name].extend(f.top1.tolist())
        all_pids.append(pids)
        conts.append(torch.tensor([report.baseline_ids]))
        _log(progress, f"teacher-forced prompt {p + 1}/{prompts} done (kvviz formats)")
    # transformers' caches take the prompts as one batch (equal lengths, no padding): its fp8 scale and quanto
    # groups then span the batch, as they would serving it
    pids, cont = torch.cat(all_pids), torch.cat(conts)  # [prompts, prompt_tokens], [prompts, tf_tokens + 1]
    base_logits = _teacher_forced_logits(model, pids, cont, DynamicCache(config=model.config))
    # DynamicCache's own row is measured too: a second run through a fresh one, against the first (0 when the
    # reference run is deterministic, which the row then shows rather than assumes)
    tf_caches = {"DynamicCache": lambda: DynamicCache(config=model.config), **tf_caches}
    for name, make in tf_caches.items():
        k, t = quality.kl_top1(base_logits, _teacher_forced_logits(model, pids, cont, make()))
        kl[name].extend(k.tolist())
        top1[name].extend(t.tolist())
        _log(progress, f"teacher-forced {name} done")
    for name in rows:
        rows[name]["mean_kl"] = sum(kl[name]) / len(kl[name])
        rows[name]["top1"] = sum(top1[name]) / len(top1[name])

    # ---- side by side: 8 formats in one batched run vs one baseline generation ----------------------------
    sbs_specs = list(side_by_side or SIDE_BY_SIDE)
    pids = text_ids[:, :prompt_tokens]
    n_new = 32
    t0 = time.perf_counter()
    bdyn, blog = quality.prefill(model, pids)
    quality.timed_decode(model, bdyn, None, int(blog.argmax()), n_new - 1, warmup=0)
    baseline_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    quality.compare(model, tok, pids, sbs_specs, max_new_tokens=n_new)
    sbs_s = time.perf_counter() - t0
    _log(progress, "side by side done")

    base_tps = rows["DynamicCache"]["tokens_per_s"]
    for row in rows.values():
        row["speed_vs_dynamic"] = row["tokens_per_s"] / base_tps
    return {
        "rows": rows,
        "side_by_side": {"formats": sbs_specs, "tokens": n_new, "seconds": sbs_s, "baseline_seconds": baseline_s,
                         "ratio": sbs_s / baseline_s},
        "meta": {"date": datetime.date.today().isoformat(), "machine": _machine(), "backend": active_backend(),
                 "context": ids.shape[1], "decode_tokens": decode_tokens, "rounds": rounds, "prompts": prompts,
                 "prompt_tokens": prompt_tokens, "tf_tokens": tf_tokens, "prefill_s": prefill_s,
                 "torch_threads": torch.get_num_threads(), "model": model_name or "SmolLM2-135M-Instruct"},
    }


def _teacher_forced_logits(model, prompt_ids, cont, cache):
    """Logits [batch * (N - 1), vocab] (batch-major) of decode steps fed cont[:, 0..N-2] after the prompts
    prompt_ids [batch, T], through `cache` (the prompts are its first update: raw attention, stored as the cache
    stores them). cont: [batch, N]."""
    with torch.no_grad():
        model(input_ids=prompt_ids, cache=cache, use_cache=True, logits_to_keep=1)
        out = [model(input_ids=cont[:, i : i + 1], cache=cache, use_cache=True).logits[:, -1].float()
               for i in range(cont.shape[1] - 1)]
    return torch.stack(out, dim=1).flatten(0, 1)  # [batch, N - 1, vocab] -> [batch * (N - 1), vocab]


def _machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cores} CPU cores, {platform.machine()}, {platform.python_implementation()} {platform.python_version()}"


def markdown(result: dict) -> str:
    """The benchmark as a markdown table plus the side-by-side line and the run's conditions."""
    meta, rows = result["meta"], result["rows"]
    lines = [
        f"Measured {meta['date']} on {meta['machine']} ({meta['torch_threads']} torch threads), {meta['model']}, "
        f"attention backend `{meta['backend']}`. Speed: greedy decode after a {meta['context']}-token prompt, "
        f"best of {meta['rounds']} interleaved rounds of {meta['decode_tokens']} tokens. KL / top-1: teacher-forced, "
        f"{meta['prompts']} WikiText-2 prompts x {meta['prompt_tokens']} tokens, {meta['tf_tokens']} steps each.",
        "",
        "| cache | bits/value | tokens/s | vs DynamicCache | bytes held | memory model | diff | mean KL | top-1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        bits = f"{r['bits']:.3g}" if "bits" in r else ""
        held = f"{r['bytes'] / 2**20:.2f} MiB" if "bytes" in r else ""
        model_b = f"{r['model_bytes'] / 2**20:.2f} MiB" if "model_bytes" in r else ""
        diff = f"{(r['bytes'] - r['model_bytes']) / r['model_bytes']:+.2%}" if "model_bytes" in r else ""
        label = f"kvviz `{name}`" if r["kind"] == "kvviz" else name
        lines.append(f"| {label} | {bits} | {r['tokens_per_s']:.2f} | {r['speed_vs_dynamic']:.2f}x | {held} | "
                     f"{model_b} | {diff} | {r['mean_kl']:.4f} | {r['top1']:.1%} |")
    s = result["side_by_side"]
    lines += ["", f"Side by side: {len(s['formats'])} formats ({', '.join(s['formats'])}), {s['tokens']} tokens, "
              f"free-running + teacher-forced in one batched run: {s['seconds']:.1f} s against {s['baseline_seconds']:.1f} s "
              f"for one baseline generation ({s['ratio']:.2f}x)."]
    return "\n".join(lines)
