"""`python -m kvviz drift`: how each KV format's damage grows with position in a long text (and, when asked, with
generation length and in a needle test at several context lengths), kvviz.quality.long_context.

    python -m kvviz drift --formats int4,k8v4,mxfp4 --context 8192                 # SmolLM2, WikiText-2
    python -m kvviz drift --model gemma-3-270m --context 32768 --chunk 1024 --out runs/gemma
    python -m kvviz drift --formats "int4; 0,27=fp16",q8_0 --new-tokens 2048 --needle-contexts 2048,4096,8192

Prints a table per part and the seconds each run took (the exact pass beside each format's). With --out DIR it
writes position.csv (every position: format, position, kl, top1, kl_smoothed), position_summary.csv (one row per
format: mean KL, top-1, KL over the first / last 1,024 positions, where the smoothed KL first exceeds each
threshold), generation.csv, needle.csv, drift.json (all of it, with the texts) and drift.html (the charts).
--formats is a comma list; a plan's layer list and a k=,v= pair keep their commas ("int4; 0,27=fp16").
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from kvviz import models
from kvviz.cli.common import print_table
from kvviz.formats import as_plan
from kvviz.plots import long_context as figures
from kvviz.quality import long_context as lc

HELP = "KL and top-1 against the exact model at every position of a long text, per KV format (and long generation, "\
       "needles at length)"


def split_formats(text: str) -> list[str]:
    """A comma list of specs -> specs; a piece starting with a digit (a plan's layer list, "0,27=fp16") or "v="
    (a pair's V side) belongs to the piece before it."""
    out: list[str] = []
    for piece in text.split(","):
        p = piece.strip()
        if out and (p[:1].isdigit() or p.startswith("v=")):
            out[-1] += "," + p
        elif p:
            out.append(p)
    if not out:
        raise ValueError("--formats is empty; name at least one format, e.g. --formats int4,k8v4,mxfp4.")
    return out


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} is a comma list of whole numbers, e.g. 2048,4096,8192; got {text!r}.") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a bundled model name or a local model directory (default: the bundled SmolLM2)")
    p.add_argument("--formats", default="int4,k8v4,mxfp4", help="comma list of specs / plans (default %(default)s)")
    p.add_argument("--context", type=int, default=4096, help="tokens of text measured (default %(default)s)")
    p.add_argument("--chunk", type=int, default=512, help="tokens per forward pass (default %(default)s)")
    p.add_argument("--text-file", metavar="PATH", help="UTF-8 text to measure (default: the WikiText-2 slice, "
                                                       "repeated with a marker line where it must be)")
    p.add_argument("--window", type=int, default=lc.WINDOW, help="positions of the moving average (default "
                                                                  "%(default)s)")
    p.add_argument("--new-tokens", type=int, help="also generate this many tokens greedily per format after a "
                                                  "WikiText-2 prompt: first divergence, top-1, repetition")
    p.add_argument("--prompt-tokens", type=int, default=256, help="prompt of the generation (default %(default)s)")
    p.add_argument("--needle-contexts", metavar="N,N", help="also run the needle test at these contexts, e.g. "
                                                            "2048,4096,8192")
    p.add_argument("--needles-per-depth", type=int, default=5, help="haystacks per context (default %(default)s)")
    p.add_argument("--depths", help="needle depths in [0, 1], comma list (default: 10 from 0 to 1)")
    p.add_argument("--out", metavar="DIR", help="write CSV, JSON and the charts (HTML) here")


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.0f}"
    return str(x)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    specs = split_formats(args.formats)
    for s in specs:  # the parser's message for an unknown format, before the model loads
        as_plan(s)
    text = lc.read_text_file(args.text_file) if args.text_file else None
    depths = lc.check_depths(args.depths.split(",")) if args.depths else list(lc.DEPTHS10)
    needle_contexts = _ints(args.needle_contexts, "--needle-contexts") if args.needle_contexts else []
    if args.new_tokens is not None:
        lc.check_new_tokens(args.new_tokens)
    if args.window < 1:
        raise ValueError(f"--window is a number of positions, at least 1; got {args.window}.")
    model, tok = models.load_model(args.model)  # through the module: tests replace it there
    # every part's input checked before the first one runs (each raises ValueError at the call)
    position = lc.position_drift(model, tok, specs, args.context, args.chunk, text)
    generation = (lc.generation_drift(model, tok, specs, args.new_tokens, prompt_tokens=args.prompt_tokens)
                  if args.new_tokens is not None else None)
    needle = (lc.needle_at_length(model, tok, specs, needle_contexts, depths, args.needles_per_depth)
              if needle_contexts else None)
    out = Path(args.out) if args.out else None
    report: dict = {"model": lc.model_name(model), "formats": specs, "context": args.context,
                    "chunk": args.chunk, "window": args.window, "thresholds": list(lc.THRESHOLDS),
                    "text": args.text_file or "WikiText-2 slice (assets/)"}
    t0 = time.perf_counter()
    last = None
    for last in position:
        _progress(f"  position: {last.done_tokens:,}/{last.context:,} tokens, {time.perf_counter() - t0:.0f} s")
    rows = last.rows(lc.THRESHOLDS, args.window)
    print(f"Damage by position: {report['model']}, {args.context:,} tokens in chunks of {args.chunk} (the first "
          f"token alone), KL in nats against the exact model, crossings of the {args.window}-position moving "
          "average")
    head = ["format", "mean KL", "top-1", "KL first 1K", "KL last 1K",
            *[f"> {t:g} at" for t in lc.THRESHOLDS], "seconds", "x exact"]
    exact_s = last.seconds["exact"]
    print_table([head] + [[r["format"], _fmt(r["mean_kl"]), _fmt(r["top1"]), _fmt(r["kl_first_1k"]),
                           _fmt(r["kl_last_1k"]), *[_fmt(r[f"cross_{t:g}"]) for t in lc.THRESHOLDS],
                           f"{r['seconds']:.1f}", f"{r['seconds'] / exact_s:.2f}" if exact_s else "-"] for r in rows])
    print(f"exact pass {exact_s:.1f} s; head and KL {last.seconds['metrics']:.1f} s; "
          f"{time.perf_counter() - t0:.1f} s in all")
    if last.note:
        print(f"note: {last.note}")
    report.update(position=rows, note=last.note, seconds=last.seconds,
                  crossings={n: {str(t): p for t, p in c.items()} for n, c in
                             last.crossings(lc.THRESHOLDS, args.window).items()})
    gen = _generation(generation, report) if generation is not None else None
    found = _needle(needle, report) if needle is not None else None
    if out is not None:
        _write(out, last, gen, found, report, args.window)
        print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}")
    return 0


def _generation(stream, report: dict):
    t0 = time.perf_counter()
    last = None
    for last in stream:
        _progress(f"  generation: {last.steps_done:,}/{last.new_tokens:,} tokens, {time.perf_counter() - t0:.0f} s")
    rows = last.rows()
    print(f"\nDamage by generation length: {last.new_tokens:,} greedy tokens per format ({last.seconds:.1f} s); "
          "top-1 differs: share of steps, teacher-forced on the exact continuation; repeat: share of 4-grams seen "
          "before")
    print_table([["format", "first divergence", "top-1 differs", "mean KL", "repeat (whole)", "repeat (last half)"]]
                + [[r["format"], _fmt(r["first_divergence"]), _fmt(r["top1_differ"]), _fmt(r["mean_kl"]),
                    _fmt(r["repeat4_whole"]), _fmt(r["repeat4_last_half"])] for r in rows])
    report["generation"] = {"rows": rows, "new_tokens": last.new_tokens, "seconds": last.seconds,
                            "prompt": last.prompt_text, "baseline_text": last.baseline_text, "texts": last.texts,
                            "first_divergence": last.first_divergence,
                            "kl_by_step": {n: [round(float(x), 8) for x in k] for n, k in last.kl.items()}}
    return last


def _needle(stream, report: dict):
    t0 = time.perf_counter()
    last = None
    for last in stream:
        _progress(f"  needle: {last.haystacks_done} haystacks, {time.perf_counter() - t0:.0f} s")
    print(f"\nNeedle at length: {len(last.depths)} depths x {last.needles_per_depth} needles per context "
          f"({last.seconds:.1f} s); found / asked over all depths, and at the middle depths (25-75%)")
    mid = [i for i, d in enumerate(last.depths) if 0.25 <= d <= 0.75]
    table = [["context", *last.names]]
    for c in last.contexts:
        asked, asked_mid = sum(last.total[c]), sum(last.total[c][i] for i in mid)
        table.append([f"{c:,}", *[f"{sum(last.found[c][n])}/{asked} (mid {sum(last.found[c][n][i] for i in mid)}/"
                                  f"{asked_mid})" for n in last.names]])
    print_table(table)
    report["needle"] = {"depths": last.depths, "needles_per_depth": last.needles_per_depth, "seconds": last.seconds,
                        "found": {str(c): v for c, v in last.found.items()},
                        "total": {str(c): v for c, v in last.total.items()},
                        "answers": {str(c): v for c, v in last.answers.items()},
                        "values": {str(c): v for c, v in last.values.items()}}
    return last


def _csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _write(out: Path, pos, gen, needle, report: dict, window: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    smoothed = pos.smoothed(window)
    with (out / "position.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["format", "position", "kl", "top1", "kl_smoothed"])
        for n in pos.names:
            for p, (k, t, s) in enumerate(zip(pos.kl[n], pos.top1[n], smoothed[n])):
                w.writerow([n, p, f"{k:.6g}", int(t), f"{s:.6g}"])
    _csv(out / "position_summary.csv", report["position"])
    figs = [figures.position_figure(smoothed, pos.crossings(lc.THRESHOLDS, window), lc.THRESHOLDS),
            figures.top1_figure({n: lc.smooth(pos.top1[n], window) for n in pos.names})]
    if gen is not None:
        _csv(out / "generation.csv", gen.rows())
        figs.append(figures.generation_figure({n: lc.smooth(gen.kl[n], 16) for n in gen.names},
                                              gen.first_divergence))
    if needle is not None:
        _csv(out / "needle.csv", needle.rows())
        figs.append(figures.needle_figure(needle.depths, needle.found, needle.total))
    (out / "drift.json").write_text(json.dumps(report, indent=1, default=float))
    html = [f.to_html(full_html=False, include_plotlyjs=i == 0) for i, f in enumerate(figs)]
    (out / "drift.html").write_text("<html><head><meta charset='utf-8'></head><body>" + "".join(html) +
                                    "</body></html>")
