"""kernels/cpu/logits.py: the float64 row statistics (log-sum-exp, softmax, P . z) read from fp32 logits, against
torch's float64 ops on the widened rows, through numba and through the torch fallback; the vectorizable exp
against numpy's."""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest
import torch

from kernels.cpu import logits as cpu_logits
from kernels.cpu.jit.logits import _exp64


@nb.njit
def _exp_all(xs, out):
    for i in range(xs.size):
        out[i] = _exp64(xs[i])


def test_exp64_matches_numpy_to_a_few_ulp():
    rng = np.random.default_rng(0)
    xs = np.concatenate([-rng.random(200_000) * 60, -rng.random(1000) * 700,
                         [0.0, -0.0, -1e-300, -np.log(2) / 2, -np.log(2), -1.0, -707.9]])
    got = np.empty_like(xs)
    _exp_all(xs, got)
    want = np.exp(xs)
    assert np.max(np.abs(got - want) / want) < 5e-16
    below = np.empty(3)
    _exp_all(np.array([-708.0, -745.0, -1e9]), below)  # clamped at -708: tiny, positive, never 0 or NaN
    assert np.all(below == below[0]) and below[0] == pytest.approx(np.exp(-708.0), rel=1e-15)
    above = np.empty(1)
    _exp_all(np.array([3.0]), above)  # softmax arguments are <= 0: above it is taken as 0
    assert above[0] == 1.0


def _rows(seed: int, n: int = 7, vocab: int = 5003) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z0 = 8 * torch.randn(n, vocab, generator=g)
    return z0, z0 + 0.3 * torch.randn(n, vocab, generator=g)


@pytest.mark.parametrize("through", ["numba", "torch"])
def test_row_statistics_equal_torch_float64(through, monkeypatch):
    if through == "torch":
        monkeypatch.setattr(cpu_logits, "_numba_rows", lambda z: (None, None))
    z0, z = _rows(0)
    lse0 = cpu_logits.lse_rows(z0)
    torch.testing.assert_close(lse0, torch.logsumexp(z0.double(), -1), rtol=0, atol=1e-12)
    p = torch.empty(z0.shape, dtype=torch.float64)
    sums = cpu_logits.probs_rows(z0, lse0, p)
    want = torch.softmax(z0.double(), -1)
    torch.testing.assert_close(p, want, rtol=1e-13, atol=0)
    torch.testing.assert_close(sums, want.sum(-1), rtol=0, atol=1e-13)
    torch.testing.assert_close(cpu_logits.dot_rows(p, z), (want * z.double()).sum(-1), rtol=1e-13, atol=1e-12)


def test_equal_rows_give_equal_statistics_bit_for_bit():
    """The KL's two sums for a format whose logits equal the exact ones are the same numbers: KL 0 exactly."""
    z0, _ = _rows(1)
    p = torch.empty(z0.shape, dtype=torch.float64)
    lse0 = cpu_logits.lse_rows(z0)
    cpu_logits.probs_rows(z0, lse0, p)
    assert torch.equal(cpu_logits.lse_rows(z0.clone()), lse0)
    assert torch.equal(cpu_logits.dot_rows(p, z0.clone()), cpu_logits.dot_rows(p, z0))


def test_float64_logits_keep_their_precision_and_bad_shapes_say_what_to_pass():
    z0, _ = _rows(2)
    z64 = z0.double() / 3  # not representable in fp32: torch's path, no rounding to fp32
    torch.testing.assert_close(cpu_logits.lse_rows(z64), torch.logsumexp(z64, -1), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"\[rows, vocab\]"):
        cpu_logits.lse_rows(z0[0])
    with pytest.raises(ValueError, match="float64 buffer shaped as z"):
        cpu_logits.probs_rows(z0, cpu_logits.lse_rows(z0), torch.empty(z0.shape))


def test_warm_up_compiles_the_three_kernels():
    """What the app's launch warm-up calls (kvviz.ui.wiring.warm_up), so that a first Long context run does not
    compile them."""
    from kernels.cpu.jit import logits as jit

    assert cpu_logits.warm_up()
    assert all(f.signatures for f in (jit.lse_rows, jit.probs_rows, jit.dot_rows))


def test_a_kernel_that_fails_to_compile_leaves_the_kl_to_torch(monkeypatch, caplog):
    from kernels.cpu.jit import logits as jit

    def broken(*args):
        raise RuntimeError("LLVM says no")

    monkeypatch.setattr(jit, "lse_rows", broken)
    cpu_logits._jit.cache_clear()
    try:
        assert not cpu_logits.warm_up()
        assert "failed to compile" in caplog.text
        z0, _ = _rows(3)
        torch.testing.assert_close(cpu_logits.lse_rows(z0), torch.logsumexp(z0.double(), -1), rtol=0, atol=0)
    finally:
        monkeypatch.undo()
        cpu_logits._jit.cache_clear()
    assert cpu_logits.warm_up()
