"""kvviz.runtime: one explicit runtime (backend choice, row-stable mode, models, captures, compute threads) instead
of thread-locals and environment reads on hot paths; the environment is read where a runtime is built, nowhere else.

    python -m pytest tests/test_runtime.py -q
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest
import torch

from kvviz import attention, rowstable, runtime
from kvviz.runtime import Runtime

REPO = Path(__file__).resolve().parent.parent

# Modules that may touch os.environ, and why; every other module of kvviz/, kernels/ and app.py takes settings from a
# runtime (kvviz.runtime.Runtime.from_env is the one reader of KVVIZ_* variables).
ENV_ALLOWED = {
    "kvviz/runtime.py": "builds a runtime from the environment (Runtime.from_env)",
    "app.py": "GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, gradio's own address variables, where the app starts",
    "kvviz/engines/llamacpp.py": "hands its worker process the environment (PYTHONPATH)",
    "kvviz/engines/llamacpp_worker.py": "sets llama.cpp's LLAMA_ATTN_ROT_DISABLE inside its own worker process",
    "kvviz/engines/vllm_local.py": "hands the vLLM server processes the environment and vLLM's CPU settings",
    "kvviz/memory/configs.py": "HF_HUB_OFFLINE / HF_ENDPOINT, the hub client's own variables, before a config fetch",
    "kernels/_triton.py": "TRITON_INTERPRET, triton's own variable",
}


def _env_reads(path: Path) -> list[tuple[int, str | None]]:
    """(line, variable name when literal) of each os.environ / os.getenv use in a module's code (not its strings)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb") and (
                isinstance(node.value, ast.Name) and node.value.id == "os"):
            found.append((node.lineno, None))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("KVVIZ_"):
            found.append((node.lineno, node.value))
    return found


def _sources() -> list[Path]:
    return [REPO / "app.py", *sorted((REPO / "kvviz").rglob("*.py")), *sorted((REPO / "kernels").rglob("*.py"))]


def test_no_module_reads_the_environment_outside_the_runtime():
    bad = []
    for path in _sources():
        rel = path.relative_to(REPO).as_posix()
        reads = [line for line, name in _env_reads(path) if name is None]
        if reads and rel not in ENV_ALLOWED:
            bad.append(f"{rel}:{reads[0]} reads os.environ; take the setting from kvviz.runtime.current()")
    assert not bad, "\n".join(bad)


def test_kvviz_variables_are_read_only_by_runtime_from_env():
    """A KVVIZ_* name as a string literal next to an environment read exists only in kvviz/runtime.py (messages and
    docstrings may name the variables; code that reads them may not)."""
    bad = []
    for path in _sources():
        rel = path.relative_to(REPO).as_posix()
        if rel == "kvviz/runtime.py":
            continue
        found = _env_reads(path)
        reads = {line for line, name in found if name is None}
        named = [(line, name) for line, name in found if name is not None]
        bad += [f"{rel}:{line} reads {name}" for line, name in named if line in reads]
    assert not bad, "\n".join(bad)
    text = (REPO / "kvviz" / "runtime.py").read_text(encoding="utf-8")
    assert text.count("def from_env") == 1


def test_from_env_reads_every_setting_and_names_a_bad_one():
    rt = Runtime.from_env({"KVVIZ_BACKEND": "Torch", "KVVIZ_MODEL": "tiny-llama", "KVVIZ_MODELS": "a/b, tiny-qwen3",
                           "KVVIZ_ALLOW_ANY_MODEL": "1", "KVVIZ_MAX_PARAMS": "3e9", "KVVIZ_MAX_MODELS": "3",
                           "KVVIZ_CONCURRENCY": "2", "KVVIZ_WARMUP": "0", "KVVIZ_CACHE_DIR": "/tmp/kv",
                           "KVVIZ_CPU_PARALLEL_ROWS": "0", "KVVIZ_VLLM_PYTHON": "/opt/py", "SPACES_ZERO_GPU": "true"})
    assert (rt.backend, rt.default_model, rt.extra_models) == ("torch", "tiny-llama", ("a/b", "tiny-qwen3"))
    assert rt.allow_any_model and rt.model_limit() == 3e9 and rt.max_models == 3 and rt.concurrency == 2
    assert not rt.warmup and rt.cache_dir == Path("/tmp/kv") and rt.cpu_parallel_rows == 0 and rt.zero_gpu
    assert rt.vllm_python == Path("/opt/py")
    empty = Runtime.from_env({})
    assert (empty.backend, empty.default_model, empty.max_models, empty.concurrency) == ("auto", "smollm2-135m", 2, 1)
    for name, value in [("KVVIZ_MAX_MODELS", "0"), ("KVVIZ_CONCURRENCY", "two"), ("KVVIZ_MAX_PARAMS", "big"),
                        ("KVVIZ_BACKEND", "cuda")]:
        with pytest.raises(ValueError, match=name):
            Runtime.from_env({name: value})


def test_two_runtimes_with_different_backends_do_not_interfere_in_two_threads():
    torch_rt, auto_rt = Runtime(backend="torch"), Runtime(backend="auto")
    auto = "triton" if attention._probe()["cuda"] and attention._probe()["triton"] else (
        "cpu" if attention._cpu_fused() else "torch")
    start = threading.Barrier(2)
    seen: dict[str, list[str]] = {"torch": [], "auto": []}

    def run(rt: Runtime, key: str):
        with rt.activate():
            start.wait()  # both inside their block at once
            for _ in range(200):
                seen[key].append(attention.active_backend())
                assert runtime.current() is rt

    threads = [threading.Thread(target=run, args=(torch_rt, "torch")),
               threading.Thread(target=run, args=(auto_rt, "auto"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(seen["torch"]) == {"torch"} and set(seen["auto"]) == {auto}
    assert runtime.current() is runtime.default()  # this thread was never inside either block


def test_activate_and_use_backend_nest_and_restore():
    outer, inner = Runtime(backend="torch"), Runtime(backend="cpu")
    before = runtime.current()
    with outer.activate():
        assert runtime.current() is outer and attention.active_backend() == "torch"
        with attention.use_backend("auto"):
            assert runtime.current().wanted_backend() == "auto"
            with inner.activate():  # a runtime's own backend, whatever use_backend said outside it
                assert runtime.current() is inner and inner.wanted_backend() == "cpu"
            assert runtime.current() is outer and outer.wanted_backend() == "auto"
        assert outer.wanted_backend() == "torch"
    assert runtime.current() is before


def test_each_runtime_has_its_own_models_captures_and_warm_up_state():
    a, b = Runtime(), Runtime()
    assert a.models is not b.models and a.captures is not b.captures and a.warmups is not b.warmups
    loads = []
    pair = a.models.get("m", loader=lambda name: loads.append(name) or ("model", "tok"))
    assert a.models.get("m") is pair and loads == ["m"] and b.models.peek("m") is None
    assert a.captures.get_or_make("k", lambda: 1) == 1 and b.captures.get_or_make("k", lambda: 2) == 2
    with a.activate():
        from kvviz import models

        assert models.cache_dir() == a.cache_dir


def test_row_stable_mode_is_the_contexts_and_the_layers_are_kvvizs_own_class():
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    plain = layer(x)
    seen = {}
    with rowstable.row_stable(layer):
        assert rowstable.active()
        other = threading.Thread(target=lambda: seen.setdefault("other", rowstable.active()))
        other.start()
        other.join()
        with rowstable.row_stable(layer, False):
            assert not rowstable.active()
        assert rowstable.active()
    assert not rowstable.active() and seen["other"] is False
    assert torch.nn.Linear.forward is not rowstable.RowStableLinear.forward  # torch's class is untouched
    if rowstable.available():
        assert type(layer) is rowstable.RowStableLinear and isinstance(layer, torch.nn.Linear)
        assert "forward" not in layer.__dict__
    assert torch.equal(layer(x), plain)  # outside a block: F.linear, the same bits as before
