"""Row statistics of logits for a KL over a large vocabulary on the CPU (numba, kernels/cpu/jit/logits.py): read from
fp32 logits as the LM head gives them, accumulated in float64, one parallel work item per row.

    lse = lse_rows(z)              # z: [n, V] logits -> [n] float64, log sum exp of each row
    sums = probs_rows(z, lse, p)   # p: [n, V] float64 <- exp(z - lse); returns [n] sum p
    pz = dot_rows(p, z)            # [n] float64, sum p z of each row
    warm_up()                      # compile them now (the app's launch warm-up does)

KL(P || Q) of a row is then  sum P z0 - sum P z + (lse(z) - lse(z0)) sum P  (kvviz.quality.long_context.position).
Where numba is unavailable the same values come from torch's float64 ops on a widened copy of the rows (slower: a
float64 [n, V] array made and walked per operation).
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import torch

from kernels.cpu import decode as cpu_decode

log = logging.getLogger(__name__)


@functools.cache
def _jit():
    """The jit module, its three kernels compiled (or loaded from numba's disk cache) and threads sized as the
    decode kernels'; None when numba is unavailable or a kernel fails to compile (the callers then take torch)."""
    if cpu_decode._jit() is None:
        return None
    from kernels.cpu.jit import logits as jit

    z, p, lse, out = np.zeros((1, 16), np.float32), np.empty((1, 16)), np.empty(1), np.empty(1)
    try:
        with cpu_decode._LOCK:
            jit.lse_rows(z, lse)
            jit.probs_rows(z, lse, p, out)
            jit.dot_rows(p, z, out)
    except Exception as err:  # noqa: BLE001 - any compile or LLVM failure means: use torch's float64 ops
        log.warning("kvviz: the KL kernels failed to compile (%s: %s); the KL runs through torch.",
                    type(err).__name__, err)
        return None
    return jit


def warm_up() -> bool:
    """Compile (or load from numba's disk cache) the three kernels now, so that a first KL does not wait for it
    (about 2 s cold on 2 cores). Returns whether they run here."""
    return _jit() is not None


def _numba_rows(z: torch.Tensor) -> tuple:
    """(the jit module, z as a C-ordered numpy array) for fp32 CPU logits [n, V]; (None, None) where numba is
    unavailable or z is another dtype (float64 logits keep their precision through torch)."""
    if z.dim() != 2:
        raise ValueError(f"logits go in as [rows, vocab]; got shape {tuple(z.shape)}.")
    jit = _jit()
    if jit is None or z.dtype != torch.float32 or z.device.type != "cpu":
        return None, None
    return jit, z.detach().contiguous().numpy()


def lse_rows(z: torch.Tensor) -> torch.Tensor:
    jit, rows = _numba_rows(z)
    if jit is None:
        return torch.logsumexp(z.double(), -1)
    out = np.empty(z.shape[0], np.float64)
    with cpu_decode._LOCK:  # one parallel numba call at a time (see kernels/cpu/decode.py)
        jit.lse_rows(rows, out)
    return torch.from_numpy(out)


def probs_rows(z: torch.Tensor, lse: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    if p.dtype != torch.float64 or p.shape != z.shape or not p.is_contiguous():
        raise ValueError(f"p is a contiguous float64 buffer shaped as z {tuple(z.shape)}; got {p.dtype} "
                         f"{tuple(p.shape)}.")
    jit, rows = _numba_rows(z)
    if jit is None:
        torch.sub(z.double(), lse.double()[:, None], out=p).exp_()
        return p.sum(-1)
    sums = np.empty(z.shape[0], np.float64)
    with cpu_decode._LOCK:
        jit.probs_rows(rows, lse.double().contiguous().numpy(), p.numpy(), sums)
    return torch.from_numpy(sums)


def dot_rows(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    jit, rows = _numba_rows(z)
    if jit is None:
        return (p * z.double()).sum(-1)
    out = np.empty(z.shape[0], np.float64)
    with cpu_decode._LOCK:
        jit.dot_rows(p.detach().contiguous().numpy(), rows, out)
    return torch.from_numpy(out)
