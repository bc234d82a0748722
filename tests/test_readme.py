"""The README's memory example: its command runs, prints what the README shows, and agrees with the library."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import kvviz
from kvviz import memory

README = Path(__file__).resolve().parent.parent / "README.md"

_EXAMPLE = re.compile(r"```bash\n(python -m kvviz memory [^\n]*)\n```\s*```text\n(.*?)```", re.S)


def _example() -> tuple[list[str], str]:
    found = _EXAMPLE.findall(README.read_text(encoding="utf-8"))
    assert len(found) == 1, "README.md should hold one `python -m kvviz memory` example followed by its output"
    command, output = found[0]
    return shlex.split(command)[3:], output


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_readme_memory_example_is_what_the_cli_prints(run_cli):
    args, shown = _example()
    out = run_cli(*args)
    assert out.returncode == 0, out.stderr
    assert out.stdout == shown, "README.md's memory output is stale: paste what the command prints now"


def test_readme_memory_figures_agree_with_kv_cache_bytes():
    args, shown = _example()
    m = kvviz.get_model_preset(_flag(args, "--model"))
    context = int(_flag(args, "--context"))
    fit = dict(gpus=int(_flag(args, "--gpus")))
    for spec in memory.split_formats(_flag(args, "--formats")):
        row = next(line.split() for line in shown.splitlines() if line.split()[:1] == [spec])
        nbytes = kvviz.kv_cache_bytes(m.layers, m.kv_heads, m.head_dim, context, k=spec)
        assert row[2] == f"{nbytes / 1e9:.2f}"
        assert row[4].rstrip("*") == f"{kvviz.max_context(m, _flag(args, '--gpu'), spec, **fit):,}"
        assert row[5] == f"{kvviz.max_batch(m, _flag(args, '--gpu'), context, spec, **fit):,}"
