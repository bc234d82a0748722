"""The README's memory examples (dense, sliding window, MLA): each command runs, prints what the README shows, and
agrees with the library."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import kvviz
from kvviz import memory

README = Path(__file__).resolve().parent.parent / "README.md"

_EXAMPLE = re.compile(r"```bash\n(python -m kvviz memory [^\n]*)\n```\s*```text\n(.*?)```", re.S)


def _examples() -> list[tuple[list[str], str]]:
    found = _EXAMPLE.findall(README.read_text(encoding="utf-8"))
    assert len(found) >= 3, "README.md should show a dense, a sliding-window and an MLA `python -m kvviz memory` example"
    return [(shlex.split(command)[3:], output) for command, output in found]


def _flag(args: list[str], name: str, default: str | None = None) -> str:
    return args[args.index(name) + 1] if name in args else default


def test_readme_shows_dense_sliding_and_mla_examples():
    models = {_flag(args, "--model") for args, _ in _examples()}
    assert {"llama-3.1-70b", "gemma-3-27b", "deepseek-v3"} <= models


def test_readme_memory_examples_are_what_the_cli_prints(run_cli):
    for args, shown in _examples():
        out = run_cli(*args)
        assert out.returncode == 0, out.stderr
        assert out.stdout == shown, f"README.md's output of {args} is stale: paste what the command prints now"


def test_readme_memory_figures_agree_with_the_library():
    for args, shown in _examples():
        model, context = _flag(args, "--model"), int(_flag(args, "--context"))
        layout = _flag(args, "--layout", "engine")
        gpu, fit = _flag(args, "--gpu"), dict(gpus=int(_flag(args, "--gpus", "1")), layout=layout)
        for spec in memory.split_formats(_flag(args, "--formats")):
            row = next(line.split() for line in shown.splitlines() if line.split()[:1] == [spec])
            nbytes = kvviz.kv_cache_bytes_for(model, context, k=spec, layout=layout)
            assert row[2] == f"{nbytes / 1e9:.2f}"
            if gpu is not None:
                assert row[4].rstrip("*") == f"{kvviz.max_context(model, gpu, spec, **fit):,}"
                assert row[5] == f"{kvviz.max_batch(model, gpu, context, spec, **fit):,}"
