"""The one place that probes Triton; every other module asks here.

Triton is optional: without it (or without CUDA and without TRITON_INTERPRET=1) the callers take the torch
reference path. It is imported on the first question, not when `kernels` is imported, so that `import kvviz` does
not pay for it; the jit modules (kernels/jit/, imported by their launchers only once Triton is usable) import it
themselves. `TRITON_INTERPRET=1` must be in the environment before triton is first imported (the interpreter runs
the kernels on the CPU through numpy, which is how CI tests them).
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def _triton():
    """(triton, triton.language), imported once; (None, None) when triton is not installed."""
    try:
        import triton
        import triton.language as tl
    except ImportError:  # the CPU path works without triton installed
        return None, None
    return triton, tl


def triton_installed() -> bool:
    """True when triton imports here (whether or not it can run: see triton_usable)."""
    return _triton()[0] is not None


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_usable(device: torch.device | str | None = None) -> bool:
    """True when a Triton kernel can run on tensors of `device`: CUDA with triton, or the CPU interpreter."""
    if not triton_installed():
        return False
    if device is None:
        return torch.cuda.is_available() or _interpreter_ready()
    device = torch.device(device)
    return device.type == "cuda" or (device.type == "cpu" and _interpreter_ready())


def _interpreter_ready() -> bool:
    # triton decorates its own library (tl.sum, ...) when first imported: TRITON_INTERPRET=1 must have been set by
    # then, or interpreted kernels fail calling them.
    return interpreting() and type(_triton()[1].sum).__name__ == "InterpretedFunction"
