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


# --- the README's Python examples: each one runs here, or names the test that runs it ---------------------------

_PYTHON = re.compile(r"```python\n(.*?)```", re.S)
# First line of an example -> where it is checked, for examples this file does not run itself.
CHECKED_ELSEWHERE = {
    "import kvviz": "the drop-in five lines: test_attention.py runs them verbatim on a tiny model saved locally",
    "from kvviz import load_model, describe_model": "test_real_model.py loads and describes both bundled models",
    "from kernels import decode_attention, side_from_format": "a call signature; test_kernels.py makes that call",
}


def _python_examples() -> dict[str, str]:
    """The README's ```python blocks, by their first line."""
    return {code.splitlines()[0]: code for code in _PYTHON.findall(README.read_text(encoding="utf-8"))}


def test_every_python_example_is_checked():
    unchecked = set(_python_examples()) - set(CHECKED_ELSEWHERE) - {"import torch, kvviz",
                                                                       "from kvviz import load_model, quality"}
    assert not unchecked, f"README.md examples no test runs: {unchecked}; run them here or add to CHECKED_ELSEWHERE"


def test_formats_example_runs_and_its_comments_are_true():
    code = _python_examples()["import torch, kvviz"]
    scope: dict = {}
    exec(compile(code, "README.md (Formats)", "exec"), scope)  # noqa: S102 (the README's own example)
    fmt, x, q, x_hat = scope["fmt"], scope["x"], scope["q"], scope["x_hat"]
    assert x_hat.shape == x.shape and x_hat.dtype == x.dtype
    claimed = float(re.search(r"([\d.]+) bits per value", code).group(1))
    assert fmt.bits_per_value(128) == claimed == 8 * q.nbytes / x.numel()
    shown = re.search(r"# (KVSpec\(.*?), \.\.\.\)", code).group(1)
    assert repr(kvviz.parse_kv("k8v4")).startswith(shown)


def test_quality_example_runs(monkeypatch):
    """The Quality example as written, on a tiny random Llama instead of the bundled model (same calls, seconds).
    Its head_dim is 32, not the usual tiny 16, so that KIVI-2's 32-wide groups fit."""
    from kvviz import quality, tiny

    base_config = tiny.tiny_config

    def wider(arch):
        config = base_config(arch)
        config.hidden_size, config.head_dim, config.max_position_embeddings = 128, 32, 2048
        return config

    monkeypatch.setattr(tiny, "tiny_config", wider)
    small = tiny.tiny_model("llama")
    monkeypatch.setattr(kvviz, "load_model", lambda *a, **k: small)
    calls = {}
    for name in ("compare", "perplexity", "needle"):
        fn = getattr(quality, name)
        monkeypatch.setattr(quality, name, lambda *a, _fn=fn, _name=name, **k: calls.setdefault(_name, _fn(*a, **k)))
    scope: dict = {}
    exec(compile(_python_examples()["from kvviz import load_model, quality"], "README.md (Quality)", "exec"), scope)
    assert set(calls) == {"compare", "perplexity", "needle"}
    assert [f.name for f in calls["compare"].formats] == ["fp8_e4m3", "k8v4", "k4v8", "kivi2"]
    assert set(calls["perplexity"]["ppl"]) == {"baseline", "fp8_e4m3", "int4"}
    assert list(calls["needle"]["rate"]) == ["baseline", "fp8_e4m3", "int4", "kivi2"]
