"""Shared pytest fixtures (keep this file small: a fixture used by one test file lives in that file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def run_cli():
    """Run `python -m kvviz ARGS...` from the repository root; returns the CompletedProcess (text mode)."""

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kvviz", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=timeout, check=False)

    return run
