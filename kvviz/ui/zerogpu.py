"""kvviz.ui.zerogpu: Hugging Face ZeroGPU, where a Space borrows a GPU while a decorated function runs.

On a ZeroGPU Space (PyPI `spaces` installed, env SPACES_ZERO_GPU=true) `spaces.GPU` runs the function in a worker
that holds a GPU; everywhere else `spaces.GPU` returns the function unchanged, and without `spaces` installed
`gpu` is the identity. The app decorates its model computations (the "model" queue's endpoints and the lessons
that call them) with `gpu`, so the same code serves a CPU Space, a GPU Space and ZeroGPU.

Only what is picklable crosses back from the worker: the callbacks return figures, tables and text, never tensors.
The model is loaded in the main process and moved to the GPU inside each call (`to_device`), since what a ZeroGPU
worker changes does not outlive the call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from kvviz import runtime

DURATION_S = 120  # the longest GPU lease one call asks for (ZeroGPU's default is 60 s; the plan search takes more)


def active() -> bool:
    """True on a ZeroGPU Space: env SPACES_ZERO_GPU is true (the runtime's zero_gpu) and the `spaces` package is
    importable."""
    if not runtime.current().zero_gpu:
        return False
    return _spaces() is not None


@functools.cache
def _spaces():
    try:
        import spaces
    except ImportError:
        return None
    return spaces


def gpu(fn: Callable) -> Callable:
    """`fn` as ZeroGPU runs it: `spaces.GPU(duration=DURATION_S)(fn)` when `spaces` is installed (a no-op off
    ZeroGPU, by `spaces`' own rule), `fn` itself otherwise. Plain and generator functions alike."""
    spaces = _spaces()
    if spaces is None:
        return fn
    return spaces.GPU(duration=DURATION_S)(fn)


def to_device(model):
    """`model` on the GPU inside a ZeroGPU call (it was loaded on the CPU in the main process); else unchanged."""
    if active() and torch.cuda.is_available() and model.device.type != "cuda":
        model.to("cuda")
    return model


def device_note() -> str | None:
    """The header's device words on ZeroGPU ("ZeroGPU, a GPU lent per call"), None elsewhere."""
    return "ZeroGPU (a GPU lent per call)" if active() else None
