"""numba code of the KL over rows of logits (kernels/cpu/logits.py is the launcher): the log-sum-exp of fp32 logit
rows, the softmax probabilities of one row set, and P . z, each in float64 and one parallel work item per row.

The logits arrive as the LM head gives them (fp32) and are widened one value at a time, so no float64 copy of a
[rows, vocab] block is made. exp is `_exp64` below: numba has no vectorized float64 exp without Intel's SVML, and
libm's is scalar; written as plain arithmetic, LLVM vectorizes it with the sums around it.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from kernels.cpu.jit.fields import _OPTS

_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238  # ln 2 in two parts: k * _LN2_HI is exact for |k| < 2**20
_LN2_LO = 1.9082149292705877e-10


@intrinsic
def _as_f64(typingctx, bits):
    """Reinterpret an int64 as an IEEE float64 (a register bitcast)."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(bits), codegen


@nb.njit(inline="always", **_OPTS)
def _exp64(x):
    """exp(x) in float64 for x <= 0, to about 2 ulp: 2**k * e**f with k = round(x / ln 2) (an int32 conversion, which
    AVX2 vectorizes), f = x - k ln 2 (|f| <= ln(2) / 2) by its degree-13 Taylor polynomial (remainder below 2e-17).
    x < -708 gives about 3e-308 (softmax terms that small add nothing to a sum of at least 1); x > 0 is taken as 0."""
    x = min(max(x, -708.0), 0.0)
    k = np.int32(x * _LOG2E - 0.5)  # trunc of a value <= 0: rounds x / ln 2 to nearest
    kf = np.float64(k)
    f = (x - kf * _LN2_HI) - kf * _LN2_LO
    p = 1.0 + f * (1.0 + f * (1.0 / 2 + f * (1.0 / 6 + f * (1.0 / 24 + f * (1.0 / 120 + f * (1.0 / 720 + f * (
        1.0 / 5040 + f * (1.0 / 40320 + f * (1.0 / 362880 + f * (1.0 / 3628800 + f * (1.0 / 39916800 + f * (
            1.0 / 479001600 + f * (1.0 / 6227020800)))))))))))))
    return p * _as_f64((np.int64(k) + np.int64(1023)) << np.int64(52))


@nb.njit(**_OPTS)
def _lse_row(z):
    """log sum exp of one row of fp32 logits, in float64."""
    m = np.float32(-np.inf)
    for i in range(z.size):
        m = max(m, z[i])
    top = np.float64(m)
    total = 0.0
    for i in range(z.size):
        total += _exp64(np.float64(z[i]) - top)
    return top + math.log(total)


@nb.njit(**_OPTS)
def _probs_row(z, lse, p):
    """p[i] = exp(z[i] - lse) in float64; returns sum p."""
    total = 0.0
    for i in range(z.size):
        e = _exp64(np.float64(z[i]) - lse)
        p[i] = e
        total += e
    return total


@nb.njit(**_OPTS)
def _dot_row(p, z):
    """sum p[i] z[i], z widened to float64."""
    total = 0.0
    for i in range(z.size):
        total += p[i] * np.float64(z[i])
    return total


# The row loops live in the helpers above: numba compiles a prange body without the fastmath flags, and the sums
# would then stay scalar.

@nb.njit(parallel=True, **_OPTS)
def lse_rows(z, out):
    """out[r] = log sum exp z[r] (z: [n, V] fp32, C-contiguous; out: [n] float64)."""
    for r in nb.prange(z.shape[0]):
        out[r] = _lse_row(z[r])


@nb.njit(parallel=True, **_OPTS)
def probs_rows(z, lse, p, sums):
    """p[r] = exp(z[r] - lse[r]) (p: [n, V] float64) and sums[r] = sum p[r]."""
    for r in nb.prange(z.shape[0]):
        sums[r] = _probs_row(z[r], lse[r], p[r])


@nb.njit(parallel=True, **_OPTS)
def dot_rows(p, z, out):
    """out[r] = sum p[r] z[r] (p: [n, V] float64, z: [n, V] fp32)."""
    for r in nb.prange(z.shape[0]):
        out[r] = _dot_row(p[r], z[r])
