"""Shared pytest fixtures (keep this file small: a fixture used by one test file lives in that file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent

# Without a GPU the Triton kernels run in triton's CPU interpreter. Triton reads TRITON_INTERPRET when it is first
# imported (its own tl.sum & co. are decorated then), so it is set here, before any test module imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# `make test` runs the suite on pytest-xdist workers, one per core (`-n 2 --dist loadfile --no-loadscope-reorder`).
# A worker has one core's share: torch's intra-op threads would only wait for the other worker's core (spinning
# OpenMP threads cost many times the CPU time of tiny tensors), so each worker computes on one torch thread. numba's
# pool keeps its size first: kernels/cpu/decode.py sizes it once, to torch's threads, and the kernel tests check
# the split decode and the fused step on several threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    from kernels.cpu import decode as _cpu_decode

    _cpu_decode._jit()  # imports numba and sizes its pool (compiles nothing); None without numba
    torch.set_num_threads(1)

# xdist hands each worker whole files in collection order: the files that take longest come first (their summed
# test durations on 2 workers, longest first; the rest follow in name order), so that no long file starts last.
LONGEST_FIRST = (
    "test_kernels_cpu.py", "test_app_api.py", "test_engines_vllm_live.py", "test_browser.py",
    "test_lessons_models.py", "test_ui_engines.py", "test_engines_worker.py", "test_engines_llamacpp.py",
    "test_engines_vllm_local.py", "test_kernels_e2e.py", "test_vllm_extra_stores.py", "test_cache.py",
    "test_vllm_stores.py", "test_kernels.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


@pytest.fixture
def run_cli():
    """Run `python -m kvviz ARGS...` from the repository root; returns the CompletedProcess (text mode)."""

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kvviz", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=timeout, check=False)

    return run


# kvviz's process default runtime (kvviz/runtime.py), built once from this environment (its models stay loaded
# from test to test). After each test the default is what it was before it, whatever the test (or app.build_demo,
# which installs the app's own) made the default; a module-scoped fixture that builds the app restores it itself.
from kvviz import runtime as _runtime  # noqa: E402  (after TRITON_INTERPRET above)

_runtime.default()


@pytest.fixture(autouse=True)
def _keep_default_runtime():
    before = _runtime.default()
    yield
    _runtime.set_default(before)


@pytest.fixture
def use_runtime(monkeypatch):
    """Make a fresh kvviz Runtime the process default for one test: `use_runtime(KVVIZ_MODEL="tiny-llama", ...)`
    builds it with Runtime.from_env from exactly those variables (the others unset) and returns it."""

    def install(**env: str) -> _runtime.Runtime:
        rt = _runtime.Runtime.from_env(env)
        _runtime.set_default(rt)
        return rt

    return install


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module of tiny-model tests (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`):
    on tensors this small, intra-op threads only spin, which costs about ten times the CPU time on a busy 2-core
    machine. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
