"""ZeroGPU: the app's model computations go through `spaces.GPU`, and with `spaces` installed (requirements-dev
pins it) the app still starts and answers on a CPU machine, where `spaces.GPU` is a no-op."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from kvviz import runtime
from kvviz.ui import zerogpu

REPO = Path(__file__).resolve().parent.parent
MODEL_ENDPOINTS = {"compare", "needle", "outliers", "error_map", "export"}


def test_spaces_is_installed_and_its_decorator_is_a_no_op_off_zerogpu(monkeypatch):
    monkeypatch.setattr(runtime.default(), "zero_gpu", False)
    import spaces  # noqa: F401  (requirements-dev.txt pins it, so this test runs the real package)

    def fn(x):
        return x + 1

    assert zerogpu.gpu(fn) is fn
    assert not zerogpu.active()
    assert zerogpu.device_note() is None


def test_active_needs_both_the_env_and_the_package(monkeypatch):
    monkeypatch.setattr(runtime.default(), "zero_gpu", True)
    assert zerogpu.active()
    monkeypatch.setattr(zerogpu, "_spaces", lambda: None)
    assert not zerogpu.active()
    assert zerogpu.gpu(len) is len


@pytest.fixture
def recording_spaces(monkeypatch):
    """A stand-in for `spaces` whose GPU decorator marks what it wraps (and records the duration asked)."""
    seen = []

    def GPU(duration=None):  # noqa: N802 (spaces' name)
        def wrap(fn):
            seen.append((getattr(fn, "__name__", repr(fn)), duration))
            fn.zerogpu_wrapped = True
            return fn
        return wrap

    monkeypatch.setattr(zerogpu, "_spaces", lambda: types.SimpleNamespace(GPU=GPU))
    return seen


def test_every_model_endpoint_and_lesson_runs_under_spaces_gpu(recording_spaces, monkeypatch):
    monkeypatch.setenv("KVVIZ_MODEL", "tiny-llama")
    monkeypatch.syspath_prepend(str(REPO))
    import app

    demo = app.build_demo()
    public = {f.api_name: f.fn for f in demo.fns.values() if f.api_visibility == "public"}
    for name in MODEL_ENDPOINTS:
        assert getattr(public[name], "zerogpu_wrapped", False), f"/{name} does not run under spaces.GPU"
    for name in ("memory", "check_scales"):  # no model: no GPU lease
        assert not getattr(public[name], "zerogpu_wrapped", False), f"/{name} asks for a GPU it does not use"
    lesson_runs = [f.fn for f in demo.fns.values() if f.api_visibility == "private" and f.concurrency_id == "model"]
    assert len(lesson_runs) >= 5, "the lessons' model runs were not found"
    assert all(getattr(fn, "zerogpu_wrapped", False) for fn in lesson_runs)
    assert all(d == zerogpu.DURATION_S for _, d in recording_spaces)


def test_app_imports_spaces_before_torch():
    """ZeroGPU refuses to start when CUDA was initialised before `spaces` was imported: app.py imports it first."""
    code = "import sys, app; names = list(sys.modules); print(names.index('spaces') < names.index('torch'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"
