"""kvviz.metrics against plain definitions on small random tensors: KL (direction included), top-1, NLL,
perplexity, the Baseline fast paths, and llama.cpp's KLD statistics."""

import math

import pytest
import torch

from kvviz import metrics
from kvviz.rowstable import HeadChunks


def _pair(n=6, vocab=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = 2 * torch.randn(n, vocab, generator=g)
    cand = base + torch.randn(n, vocab, generator=g)
    return base, cand


def _plain_kl(p_logits, q_logits):
    """sum_i P_i ln(P_i / Q_i) per row, one row at a time, in float64 Python arithmetic."""
    out = []
    for pr, qr in zip(p_logits.double().softmax(-1).tolist(), q_logits.double().softmax(-1).tolist()):
        out.append(sum(p * math.log(p / q) for p, q in zip(pr, qr) if p > 0))
    return torch.tensor(out, dtype=torch.float64)


def test_kl_is_the_definition_and_takes_the_baseline_first():
    base, cand = _pair()
    lp, lq = metrics.log_probs(base), metrics.log_probs(cand)
    torch.testing.assert_close(metrics.kl(lp, lq), _plain_kl(base, cand), rtol=1e-10, atol=1e-12)
    # KL is not symmetric: swapping the arguments gives KL(Q || P), a different number
    assert not torch.allclose(metrics.kl(lp, lq), _plain_kl(cand, base), rtol=1e-3)
    torch.testing.assert_close(metrics.kl(lq, lp), _plain_kl(cand, base), rtol=1e-10, atol=1e-12)


def test_kl_counts_nothing_where_the_baseline_has_no_mass():
    lp = torch.tensor([[0.0, -math.inf]])  # P = (1, 0)
    lq = torch.tensor([[math.log(0.5), math.log(0.5)]])
    torch.testing.assert_close(metrics.kl(lp, lq), torch.tensor([math.log(2.0)], dtype=torch.float64))


def test_kl_top1_broadcasts_one_baseline_row():
    base, cand = _pair(n=5)
    kl, top = metrics.kl_top1(base[:1], cand)
    torch.testing.assert_close(kl, _plain_kl(base[:1].expand_as(cand), cand), rtol=1e-10, atol=1e-12)
    assert top.tolist() == [int(base[0].argmax()) == int(c.argmax()) for c in cand]
    same, agree = metrics.kl_top1(base, base)
    assert float(same.max()) == 0.0 and bool(agree.all())  # rounding below zero is clamped


def test_nll_and_perplexity():
    base, _ = _pair()
    targets = torch.tensor([0, 3, 5, 1, 10, 2])
    lp = metrics.log_probs(base)
    plain = [-math.log(float(base[i].double().softmax(-1)[t])) for i, t in enumerate(targets.tolist())]
    torch.testing.assert_close(metrics.nll(lp, targets), torch.tensor(plain, dtype=torch.float64))
    assert metrics.perplexity([1.0, 2.0]) == pytest.approx(math.exp(1.5))
    with pytest.raises(ValueError, match="at least one"):
        metrics.perplexity([])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_baseline_fast_paths_equal_the_definition(dtype):
    base, cand = _pair(n=8, vocab=40, seed=3)
    targets = torch.randint(0, 40, (8,), generator=torch.Generator().manual_seed(4))
    ref = metrics.Baseline(metrics.log_probs(base), targets)
    plain = _plain_kl(base, cand)
    torch.testing.assert_close(ref.kl(cand.to(dtype)), plain, rtol=1e-6, atol=1e-9)
    kld, nll, nll_base, same = ref.values(cand.to(dtype))
    torch.testing.assert_close(kld, _plain_kl(base, cand.to(dtype)), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(nll, metrics.nll(metrics.log_probs(cand.to(dtype)), targets))
    torch.testing.assert_close(nll_base, metrics.nll(metrics.log_probs(base), targets))
    assert same.tolist() == (base.argmax(-1) == cand.argmax(-1)).tolist()


def test_baseline_p_z_is_sum_p_z_of_a_linear_head():
    g = torch.Generator().manual_seed(5)
    weight, hidden = torch.randn(30, 7, generator=g), torch.randn(4, 7, generator=g)
    base = torch.randn(4, 30, generator=g)
    ref = metrics.Baseline(metrics.log_probs(base), torch.zeros(4, dtype=torch.long))
    logits = hidden @ weight.T  # [4, 30]
    p = base.double().softmax(-1)
    torch.testing.assert_close(ref.p_z(weight, hidden), (p * logits.double()).sum(-1), rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(ref.kl(logits, ref.p_z(weight, hidden)), _plain_kl(base, logits), rtol=1e-5,
                               atol=1e-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("vocab", [50, 3 * HeadChunks.CHUNK + 17])  # one chunk; several and a partial one
def test_baseline_kl_linear_is_kl_of_the_head(dtype, vocab):
    """kl_linear, the head's logits formed and reduced a vocabulary chunk at a time, is kl of the whole logits to
    float32 rounding, for one candidate after another and after another shape."""
    g = torch.Generator().manual_seed(8)
    weight = torch.randn(vocab, 7, generator=g).to(dtype)
    base = torch.randn(6, vocab, generator=g)
    ref = metrics.Baseline(metrics.log_probs(base), torch.zeros(6, dtype=torch.long))
    for n in (6, 6, 4, 1):
        hidden = torch.randn(n, 7, generator=g).to(dtype)
        if n != ref.lp.shape[0]:
            ref = metrics.Baseline(metrics.log_probs(base[:n]), torch.zeros(n, dtype=torch.long))
        want = ref.kl(torch.nn.functional.linear(hidden, weight), ref.p_z(weight, hidden))
        got = ref.kl_linear(weight, hidden)
        torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-8)
        torch.testing.assert_close(want, _plain_kl(base[:n], hidden @ weight.T), rtol=1e-5, atol=1e-8)


def test_kl_linear_of_stacked_candidates_is_each_candidates_own():
    """Candidates stacked [R, N, hidden] share the head's products; each one's KL is the same bits as alone."""
    g = torch.Generator().manual_seed(11)
    weight = torch.randn(2 * HeadChunks.CHUNK + 9, 16, generator=g)
    base = torch.randn(5, weight.shape[0], generator=g)
    ref = metrics.Baseline(metrics.log_probs(base), torch.zeros(5, dtype=torch.long))
    stack = torch.randn(3, 5, 16, generator=g)
    got = ref.kl_linear(weight, stack)
    assert got.shape == (3, 5)
    for r in range(3):
        assert torch.equal(got[r], ref.kl_linear(weight, stack[r]))


def test_head_chunks_are_kept_for_one_head_and_repacked_when_it_changes():
    g = torch.Generator().manual_seed(12)
    first, second = torch.randn(HeadChunks.CHUNK + 3, 8, generator=g), torch.randn(40, 8, generator=g)
    assert HeadChunks.of(first) is HeadChunks.of(first)
    held = HeadChunks.of(first)
    assert HeadChunks.of(second) is not held and HeadChunks.of(first) is not held  # one head at a time
    with torch.no_grad():
        first.mul_(2.0)  # the weight changed in place: packed again
    x = torch.randn(3, 8, generator=g)
    z = torch.cat([z for _, z in HeadChunks.of(first).logits(x)], dim=1)
    torch.testing.assert_close(z, x @ first.T, rtol=1e-5, atol=1e-5)


def test_head_chunks_give_each_row_the_same_bits_whatever_the_row_count():
    g = torch.Generator().manual_seed(9)
    head = HeadChunks(torch.randn(2 * HeadChunks.CHUNK + 5, 64, generator=g))
    hidden = torch.randn(130, 64, generator=g)
    whole = torch.cat([z for _, z in head.logits(hidden)], dim=1)  # [130, vocab]
    assert whole.shape == (130, 2 * HeadChunks.CHUNK + 5)
    torch.testing.assert_close(whole, hidden @ head.weight.T, rtol=1e-5, atol=1e-5)
    for n in (1, 2, 5, 64):
        assert torch.equal(torch.cat([z for _, z in head.logits(hidden[:n])], dim=1), whole[:n])


def test_kld_stats_from_plain_definitions():
    base, cand = _pair(n=40, vocab=9, seed=6)
    targets = torch.randint(0, 9, (40,), generator=torch.Generator().manual_seed(7))
    s = metrics.kld_stats(metrics.log_probs(base), metrics.log_probs(cand), targets)
    kl = sorted(_plain_kl(base, cand).tolist())
    p, q = base.double().softmax(-1), cand.double().softmax(-1)
    rows = range(40)
    dp = [float(q[i, targets[i]] - p[i, targets[i]]) for i in rows]
    assert s["n"] == 40 and s["mean"] == pytest.approx(sum(kl) / 40)
    assert s["median"] == pytest.approx((kl[19] + kl[20]) / 2) and s["max"] == pytest.approx(kl[-1])
    assert s["p90"] == pytest.approx(kl[35] + 0.1 * (kl[36] - kl[35]))  # 0.9 * 39 = 35.1
    assert s["delta_p_mean"] == pytest.approx(sum(dp) / 40)
    assert s["delta_p_rms"] == pytest.approx(math.sqrt(sum(d * d for d in dp) / 40))
    assert s["same_top_p"] == pytest.approx(sum(int(p[i].argmax() == q[i].argmax()) for i in rows) / 40)
    nll = [-math.log(float(q[i, targets[i]])) for i in rows]
    nll_base = [-math.log(float(p[i, targets[i]])) for i in rows]
    assert s["ln_ppl_ratio"] == pytest.approx((sum(nll) - sum(nll_base)) / 40)
    assert s["ppl"] == pytest.approx(math.exp(sum(nll) / 40))
    var = sum(x * x for x in kl) / 40 - (sum(kl) / 40) ** 2
    assert s["mean_se"] == pytest.approx(math.sqrt(var / 39))


def test_topk_stats_equal_full_stats_when_the_lists_hold_the_vocabulary():
    base, cand = _pair(n=12, vocab=8, seed=8)
    targets = torch.randint(0, 8, (12,), generator=torch.Generator().manual_seed(9))
    lp, lq = metrics.log_probs(base), metrics.log_probs(cand)
    full = metrics.kld_stats(lp, lq, targets)
    b, c = lp.topk(8), lq.topk(8)
    top = metrics.kld_stats_topk(b.indices, b.values, metrics.nll(lp, targets).neg(), c.indices, c.values,
                                 metrics.nll(lq, targets).neg())
    for key in ("mean", "p99", "same_top_p", "ln_ppl_ratio", "delta_p_rms"):
        assert top[key] == pytest.approx(full[key], rel=1e-6, abs=1e-9), key
