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


@pytest.fixture
def run_cli():
    """Run `python -m kvviz ARGS...` from the repository root; returns the CompletedProcess (text mode)."""

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kvviz", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=timeout, check=False)

    return run
