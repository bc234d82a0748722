"""The README's examples, and those it moved to docs/: each `python -m kvviz memory` command (dense in the README,
sliding window and MLA in docs/memory.md) runs, prints what the page shows and agrees with the library; each of the
README's Python examples runs here or names the test that runs it; every relative link resolves. And the README's
claims about the project: at most 300 lines with the two set-up commands, the number of element formats the registry
holds, and the Space its front matter builds (the Dockerfile, on the port it serves)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import kvviz
from kvviz import cli, memory

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MEMORY_PAGE = REPO / "docs" / "memory.md"

_EXAMPLE = re.compile(r"```bash\n(python -m kvviz memory [^\n]*)\n```\s*```text\n(.*?)```", re.S)


def _examples() -> list[tuple[list[str], str]]:
    """The memory examples of the README and of docs/memory.md: (arguments after `python -m kvviz`, output)."""
    readme = _EXAMPLE.findall(README.read_text(encoding="utf-8"))
    assert readme, "README.md should show a `python -m kvviz memory` example"
    found = readme + _EXAMPLE.findall(MEMORY_PAGE.read_text(encoding="utf-8"))
    assert len(found) >= 3, "README.md and docs/memory.md should show a dense, a sliding-window and an MLA example"
    return [(shlex.split(command)[3:], output) for command, output in found]


def _flag(args: list[str], name: str, default: str | None = None) -> str:
    return args[args.index(name) + 1] if name in args else default


def test_readme_shows_dense_sliding_and_mla_examples():
    models = {_flag(args, "--model") for args, _ in _examples()}
    assert {"llama-3.1-70b", "gemma-3-27b", "deepseek-v3"} <= models


def test_readme_memory_examples_are_what_the_cli_prints(run_cli):
    """The first example through `python -m kvviz` itself (the entry point), the others through the same
    kvviz.cli.main in this process (a subprocess each would import torch and transformers again: ~5 s apiece)."""
    (first, first_shown), *rest = _examples()
    out = run_cli(*first)
    assert out.returncode == 0, out.stderr
    assert out.stdout == first_shown, f"README.md's output of {first} is stale: paste what the command prints now"
    for args, shown in rest:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert cli.main(list(args)) == 0, args
        assert printed.getvalue() == shown, f"the output of {args} is stale: paste what the command prints now"


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
    assert list(calls["needle"]["rate"]) == ["baseline", "int4", "int4/tensor"]
    assert calls["needle"]["needles_per_depth"] == 3


# --- links: the README and the docs pages point at files and headings that exist ----------------------------------

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.*)$", re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_readme_and_docs_links_resolve():
    pages = [README, *sorted((REPO / "docs").glob("*.md")), REPO / "DEVELOPERS.md"]
    broken = []
    for page in pages:
        for target in _LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, f"links to missing files or headings: {broken}"


def test_readme_links_every_docs_page():
    linked = set(_LINK.findall(README.read_text(encoding="utf-8")))
    missing = [p.name for p in (REPO / "docs").glob("*.md") if f"docs/{p.name}" not in linked]
    assert not missing, f"README.md should link {missing}"


# --- what the README claims about the project as a whole ----------------------------------------------------------

README_MAX_LINES = 300  # a newcomer's guide; the detail lives in docs/


def test_readme_is_a_short_guide_with_the_two_set_up_commands():
    text = README.read_text(encoding="utf-8")
    n = len(text.splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines, over {README_MAX_LINES}: move detail into docs/*.md"
    setup = re.search(r"```bash\n(.*?)```", text, re.S).group(1)  # the first shell block is the set-up
    commands = [line.split("#")[0].strip() for line in setup.splitlines()]
    assert commands == ["make run", "make test"], f"the Quick start should be `make run` and `make test`: {commands}"
    for target in ("run", "test"):
        assert re.search(rf"^{target}:", (REPO / "Makefile").read_text(encoding="utf-8"), re.M), target


def test_readme_counts_the_element_formats_the_registry_holds():
    from kvviz.formats import FORMAT_NAMES

    counts = re.findall(r"(\d+) element formats", README.read_text(encoding="utf-8"))
    assert counts, "README.md should say how many element formats kvviz stores ('N element formats')"
    assert {int(c) for c in counts} == {len(FORMAT_NAMES)}, \
        f"README.md says {counts} element formats; kvviz.formats registers {len(FORMAT_NAMES)}: {FORMAT_NAMES}"


def _front_matter() -> dict[str, str]:
    text = README.read_text(encoding="utf-8")
    block = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert block, "README.md should open with the Space's front matter between --- lines"
    pairs = (line.split(":", 1) for line in block.group(1).splitlines() if line.strip())
    return {k.strip(): v.strip().strip('"') for k, v in pairs}


def _dockerfile() -> tuple[set[int], int | None, list[str]]:
    """(ports EXPOSEd, GRADIO_SERVER_PORT's value, the CMD as a list) of the Dockerfile."""
    text = (REPO / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    exposed = {int(p.split("/")[0]) for line in re.findall(r"^EXPOSE (.*)$", text, re.M) for p in line.split()}
    port = re.search(r"\bGRADIO_SERVER_PORT=(\d+)", text)
    cmd = re.findall(r"^CMD (\[.*\])$", text, re.M)
    assert len(cmd) == 1, "the Dockerfile should end in one exec-form CMD"
    return exposed, int(port.group(1)) if port else None, json.loads(cmd[0])


def test_the_space_is_the_dockerfile_and_serves_its_port():
    """A Gradio-SDK Space would install requirements.txt and run app.py, never the Dockerfile: no bundled models,
    PyPI's CUDA torch, no build-time warm-up. The front matter makes the Space build the Dockerfile, whose app
    serves the port the Space opens."""
    meta = _front_matter()
    assert meta.get("sdk") == "docker", f"the Space should build the Dockerfile (sdk: docker), not {meta.get('sdk')}"
    gradio_only = {"sdk_version", "app_file", "python_version"} & set(meta)
    assert not gradio_only, f"front matter keys that only a Gradio-SDK Space reads: {sorted(gradio_only)}"
    exposed, port, cmd = _dockerfile()
    assert "app_port" in meta, "the front matter should say which port the Space opens (app_port)"
    app_port = int(meta["app_port"])
    assert exposed == {app_port} and port == app_port, \
        f"app_port {app_port}; the Dockerfile EXPOSEs {sorted(exposed)} and sets GRADIO_SERVER_PORT={port}"
    assert cmd[-1] == "app.py", f"the image should run the app: CMD {cmd}"
    docker = (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert "download.pytorch.org/whl/cpu" in docker, "the image should install torch's CPU build, not PyPI's CUDA one"
    assert "app.py --warm-up" in docker, "the image should convert the models and compile the kernels at build time"
