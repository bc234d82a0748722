"""The TurboQuant paper's quantizers (arXiv 2504.19874) as kvviz formats: tq_mseB and tq_prodB.

Checks the paper's own statements: the Lloyd-Max centroids for the coordinate density (about N(0, 1/d)), the MSE
per coordinate of a unit vector (Theorem 1's table: about 0.36, 0.117, 0.03, 0.009 of its energy at 1..4 bits),
and TQ-prod's unbiased inner products (Theorem 2), plus byte accounting and a cache round trip.
Run: pytest tests/test_turboquant.py
"""

from __future__ import annotations

import math

import pytest
import torch

import kvviz
from kvviz.formats.tq_paper import centroids, mse_roundtrip, prod_roundtrip

D = 128


def _unit(n: int, d: int = D, seed: int = 0) -> torch.Tensor:
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    return x / x.norm(dim=-1, keepdim=True)


def test_centroids_are_the_papers():
    """b = 1: ±sqrt(2 / pi) / sqrt(d); b = 2: ±0.453 / sqrt(d), ±1.51 / sqrt(d) (the paper's Section 3.1)."""
    s = math.sqrt(D)
    one = centroids(D, 1) * s
    assert torch.allclose(one, torch.tensor([-1.0, 1.0], dtype=torch.float64) * math.sqrt(2 / math.pi), rtol=0.01)
    two = centroids(D, 2) * s
    assert torch.allclose(two, torch.tensor([-1.51, -0.453, 0.453, 1.51], dtype=torch.float64), rtol=0.01)
    for bits in (3, 4):
        c = centroids(D, bits)
        assert torch.allclose(c, -c.flip(0), atol=1e-9)  # symmetric, ascending
        assert bool((c[1:] > c[:-1]).all())


@pytest.mark.parametrize("bits,paper", [(1, 0.36), (2, 0.117), (3, 0.03), (4, 0.009)])
def test_mse_of_a_unit_vector_is_the_papers(bits, paper):
    """E||u - u_hat||^2 over random unit vectors: 0.3634, 0.1175, 0.0345, 0.0095 (Lloyd-Max for a Gaussian), which
    the paper rounds to 0.36, 0.117, 0.03, 0.009."""
    u = _unit(2000)
    mse = float((mse_roundtrip(u, bits) - u).pow(2).sum(dim=-1).mean())
    exact = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497}[bits]
    assert mse == pytest.approx(exact, rel=0.04)
    assert mse == pytest.approx(paper, rel=0.16)


@pytest.mark.parametrize("bits", [2, 3])
def test_prod_inner_products_are_unbiased(bits):
    """<y, x_hat> - <y, x> over many draws of the rotation and the QJL matrix: mean within 3 standard errors of 0,
    while TQ-mse at the same bits is biased (it shrinks the inner product)."""
    x, y = _unit(1, seed=1)[0], _unit(1, seed=2)[0]
    y = (y + 2 * x) / (y + 2 * x).norm()  # correlated, so that the inner product is far from 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 300 small QR decompositions: threads only add overhead
    try:
        errs = torch.tensor([float(prod_roundtrip(x, bits, seed=s) @ y - x @ y) for s in range(300)])
        mse_errs = torch.tensor([float(mse_roundtrip(x, bits, seed=s) @ y - x @ y) for s in range(300)])
    finally:
        torch.set_num_threads(threads)
    se = float(errs.std()) / math.sqrt(errs.numel())
    assert abs(float(errs.mean())) < 3 * se
    assert float(mse_errs.mean()) < -3 * float(mse_errs.std()) / math.sqrt(300)


@pytest.mark.parametrize("name,bytes_128", [("tq_mse4", 66), ("tq_mse3", 50), ("tq_mse1", 18), ("tq_prod4", 68),
                                            ("tq_prod2", 36)])
def test_bytes_per_token_head(name, bytes_128):
    fmt = kvviz.get_format(name)
    assert fmt.bits_per_value(D) * D / 8 == bytes_128
    x = torch.randn(2, 2, 3, D, dtype=torch.bfloat16)
    q = fmt.quantize(x)
    assert q.nbytes == fmt.nbytes_for(x.shape) == bytes_128 * 12
    assert fmt.dequantize(q).shape == x.shape and fmt.dequantize(q).dtype == torch.bfloat16


def test_format_scales_by_the_norm():
    """A token-head x is read back as ||x|| times the unit vector's reconstruction (the norm kept as fp16)."""
    u = _unit(4)
    fmt = kvviz.get_format("tq_mse3")
    assert torch.allclose(fmt.roundtrip(3 * u), 3 * fmt.roundtrip(u), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("bad,fragment", [("tq_mse5", "Unknown KV format"), ("tq_prod1", "Unknown KV format"),
                                          ("tq_mse4/asym", "int formats only")])
def test_bad_names(bad, fragment):
    with pytest.raises(ValueError, match=fragment):
        kvviz.get_format(bad)


def test_head_dim_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        kvviz.get_format("tq_prod3").quantize(torch.randn(1, 1, 2, 96))
