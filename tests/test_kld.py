"""llama.cpp's KLD statistics (kvviz.metrics): hand-worked values on tiny distributions, the top-k variant
as a lower bound that becomes exact with full lists, and bad inputs."""

import math

import pytest
import torch

import kvviz

from kvviz.metrics import Baseline, kld_stats, kld_stats_topk, per_position, summarize


def _lp(rows):
    return torch.tensor(rows, dtype=torch.float64).log()


def test_per_position_hand_worked():
    base = _lp([[0.6, 0.4], [0.9, 0.1]])
    cand = _lp([[0.3, 0.7], [0.8, 0.2]])
    kld, nll, nll_base, same = per_position(base, cand, torch.tensor([0, 1]))
    assert kld[0].item() == pytest.approx(0.6 * math.log(0.6 / 0.3) + 0.4 * math.log(0.4 / 0.7))
    assert kld[1].item() == pytest.approx(0.9 * math.log(0.9 / 0.8) + 0.1 * math.log(0.1 / 0.2))
    assert nll.tolist() == pytest.approx([-math.log(0.3), -math.log(0.2)])
    assert nll_base.tolist() == pytest.approx([-math.log(0.6), -math.log(0.1)])
    assert same.tolist() == [False, True]


def test_zero_base_mass_contributes_nothing():
    base = torch.tensor([[0.0, -math.inf]], dtype=torch.float64)  # P = [1, 0]
    cand = _lp([[0.5, 0.5]])
    kld, *_ = per_position(base, cand, torch.tensor([0]))
    assert kld.item() == pytest.approx(math.log(2.0))


def test_summary_percentiles_and_errors_as_llama_cpp():
    n = 11
    kld = torch.arange(n, dtype=torch.float64)  # 0..10
    s = summarize(kld, torch.ones(n), torch.ones(n), torch.ones(n, dtype=torch.bool))
    assert s["mean"] == pytest.approx(5.0)
    assert s["mean_se"] == pytest.approx(1.0)  # var = 385/11 - 25 = 10, sqrt(10 / 10)
    assert s["median"] == pytest.approx(5.0)
    assert (s["p90"], s["p95"], s["p99"], s["p999"]) == pytest.approx((9.0, 9.5, 9.9, 9.99))
    assert s["max"] == 10.0
    assert s["n"] == n


def test_summary_even_median_delta_p_same_top_ratio():
    kld = torch.tensor([4.0, 1.0, 3.0, 2.0])
    nll_base = torch.full((4,), -math.log(0.5), dtype=torch.float64)
    nll = -torch.tensor([0.2, 0.8, 0.2, 0.8], dtype=torch.float64).log()
    same = torch.tensor([True, True, False, True])
    s = summarize(kld, nll, nll_base, same)
    assert s["median"] == pytest.approx(2.5)
    assert s["delta_p_rms"] == pytest.approx(0.3)
    assert s["delta_p_mean"] == pytest.approx(0.0, abs=1e-12)
    assert s["same_top_p"] == pytest.approx(0.75)
    assert s["same_top_p_se"] == pytest.approx(0.25)  # sqrt(0.75 * 0.25 / 3)
    expect = float(nll.double().mean() - nll_base.double().mean())
    assert s["ln_ppl_ratio"] == pytest.approx(expect)
    assert math.log(s["ppl"] / s["ppl_base"]) == pytest.approx(expect)
    assert s["mean_se"] == 0.0  # llama.cpp gives no uncertainty for n <= 10


def test_identical_runs_are_zero():
    lp = torch.randn(64, 32).log_softmax(-1)
    s = kld_stats(lp, lp, torch.randint(0, 32, (64,)))
    assert s["mean"] == pytest.approx(0.0, abs=1e-12) and s["max"] == pytest.approx(0.0, abs=1e-12)
    assert s["same_top_p"] == 1.0 and s["ln_ppl_ratio"] == 0.0 and s["delta_p_rms"] == 0.0


def test_topk_hand_worked_bucket():
    # base: token 0 at 0.5, token 1 at 0.3 (rest 0.2); candidate lists tokens 1 and 2 at 0.4 and 0.35
    base_ids, base_lp = torch.tensor([[0, 1]]), _lp([[0.5, 0.3]])
    cand_ids, cand_lp = torch.tensor([[1, 2]]), _lp([[0.4, 0.35]])
    tb, tc = torch.tensor([math.log(0.3)]), torch.tensor([math.log(0.4)])
    s = kld_stats_topk(base_ids, base_lp, tb, cand_ids, cand_lp, tc)
    # buckets: {token 1}, rest; P = (0.3, 0.7), Q = (0.4, 0.6)
    assert s["mean"] == pytest.approx(0.3 * math.log(0.3 / 0.4) + 0.7 * math.log(0.7 / 0.6))
    assert s["same_top_p"] == 0.0  # base's top is 0, candidate's is 1
    assert s["delta_p_rms"] == pytest.approx(0.1)


@pytest.mark.parametrize("k", [4, 16, 64])
def test_topk_is_a_lower_bound_and_exact_with_full_lists(k):
    torch.manual_seed(k)
    vocab, n = 64, 100
    base = torch.randn(n, vocab).mul(2).log_softmax(-1)
    cand = (base + 0.5 * torch.randn(n, vocab)).log_softmax(-1)
    targets = torch.randint(0, vocab, (n,))
    full = kld_stats(base, cand, targets)
    bt, ct = base.topk(k), cand.topk(k)
    top = kld_stats_topk(bt.indices, bt.values, base.gather(-1, targets[:, None])[:, 0],
                         ct.indices, ct.values, cand.gather(-1, targets[:, None])[:, 0])
    assert top["mean"] <= full["mean"] + 1e-6
    assert top["same_top_p"] == full["same_top_p"]
    assert top["ln_ppl_ratio"] == pytest.approx(full["ln_ppl_ratio"])
    assert top["delta_p_rms"] == pytest.approx(full["delta_p_rms"])
    if k == vocab:
        assert top["mean"] == pytest.approx(full["mean"], rel=1e-4)
        assert top["p99"] == pytest.approx(full["p99"], rel=1e-4)
    else:
        assert top["mean"] < full["mean"]


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="positions, vocab"):
        kld_stats(torch.zeros(3, 4), torch.zeros(3, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="targets"):
        kld_stats(torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="same positive number"):
        summarize(torch.zeros(0), torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.bool))
    with pytest.raises(ValueError, match="top-k"):
        kld_stats_topk(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4), torch.zeros(2),
                       torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), torch.zeros(2))


def test_cli_kld_save_base_then_reuse(tmp_path, monkeypatch, capsys):
    import kvviz.models
    from kvviz import cli

    tiny = kvviz.tiny_model("llama")
    monkeypatch.setattr(kvviz.models, "load_model", lambda name=None: tiny)
    text = tmp_path / "text.txt"
    text.write_text("Keys and values of every token stay in the cache; attention reads them. " * 8)
    base = tmp_path / "base.pt"
    args = ["kld", "--text-file", str(text), "--windows", "2", "--window-tokens", "64"]
    assert cli.main(args + ["--save-base", str(base), "int8"]) == 0
    first = capsys.readouterr().out
    assert "saved the exact model's log-probs at 62 positions" in first and base.is_file()
    assert cli.main(["kld", "--base", str(base), "int8", "int4; 0=fp16"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("int8", "int4"))}
    assert set(rows) == {"int8", "int4;"} and "62 positions scored" in out
    # the saved baseline gives the same numbers as the live one
    assert [r.split() for r in first.splitlines() if r.startswith("int8")] == [rows["int8"].split()]


def test_cli_kld_bad_arguments(tmp_path, capsys):
    from kvviz import cli

    assert cli.main(["kld"]) == 2
    assert "Name at least one spec" in capsys.readouterr().err
    assert cli.main(["kld", "--base", str(tmp_path / "none.pt"), "int4"]) == 2
    assert "No baseline file" in capsys.readouterr().err



def test_baseline_kl_equals_per_position():
    """Baseline.kl (the vocabulary read in float32, sum P z from the hidden states) against per_position's KL."""
    from kvviz.analysis.teacher_forced import linear_head
    from kvviz.tiny import tiny_model

    model, _ = tiny_model("llama")
    torch.manual_seed(2)
    hidden = torch.randn(40, model.config.hidden_size)
    hidden_q = hidden + 0.05 * torch.randn(40, model.config.hidden_size)
    head = model.get_output_embeddings()
    lp = head(hidden).double().log_softmax(-1)
    targets = torch.randint(0, lp.shape[1], (40,))
    base = Baseline(lp, targets)
    slow = per_position(lp, head(hidden_q).double().log_softmax(-1), targets)[0]
    weight = linear_head(model)
    assert weight is not None
    p_z = base.p_z(weight, hidden_q)
    # p_z is formed in float64 from the hidden states, the reference from float32 logits: their rounding differs
    torch.testing.assert_close(base.kl(head(hidden_q), p_z), slow, rtol=5e-4, atol=1e-7)
    torch.testing.assert_close(base.kl(head(hidden_q)), slow, rtol=5e-5, atol=1e-8)  # exponentials in float32
    assert float(slow.min()) > 1e-6  # the candidate differs: the comparison is not between zeros


def test_fast_row_values_equal_per_position():
    """kvviz.metrics.Baseline.values (two passes over the vocabulary) against the direct per_position."""
    torch.manual_seed(1)
    logits_p, logits_q = 3 * torch.randn(50, 300), 3 * torch.randn(50, 300)
    targets = torch.randint(0, 300, (50,))
    lp = logits_p.double().log_softmax(-1)
    fast = Baseline(lp, targets).values(logits_q)
    slow = per_position(lp, logits_q.double().log_softmax(-1), targets)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10) if a.is_floating_point() else \
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("arch", ["llama4", "qwen3_next", "gemma4"])
def test_kld_on_chunked_hybrid_and_shared_kv_models(arch):
    """The baseline's log-probs are the model's own (Llama 4's causal LM is its own get_decoder(): kvviz takes its
    body); a 16-bit cache scores ~0 nats, a 2-bit one more."""
    from kvviz import quality
    from kvviz.quality.divergence import base_logprobs
    from kvviz.tiny import tiny_model

    model, tok = tiny_model(arch)
    text = "The quick brown fox jumps over the lazy dog. " * 4
    base = base_logprobs(model, tok, text, windows=1, window_tokens=64)
    with torch.no_grad():
        own = model(input_ids=base["tokens"]).logits[0, 32:63].double().log_softmax(-1)
    torch.testing.assert_close(base["logprobs"][0].double(), own, rtol=1e-4, atol=1e-4)
    res = quality.kld(model, tok, ["fp16", "int2/g16"], text=text, windows=1, window_tokens=64)
    assert res["fp16"]["mean"] < 1e-5 < res["int2/g16"]["mean"]


def test_kld_fits_static_scales_on_the_window():
    """A bare fp8_e4m3 (per-tensor scale fitted on the cache's first update) is fitted on the window's exact K/V,
    as a prefill of the window fits it, not on the window's first token alone: no ScaleWarning, the same figures as
    the scales amax / 448 of every layer's exact K and V given as calibrated ones, and lower than a fit on the first
    token. vLLM's unit scale beside it in the same batch takes no scale."""
    import warnings

    from kvviz import quality
    from kvviz.cache import ScaleWarning
    from kvviz.tiny import tiny_model

    model, tok = tiny_model("llama")
    text = "Keys and values of every token stay in the cache; attention reads them. " * 4
    ids = tok(text, return_tensors="pt")["input_ids"][:, :64]
    with torch.no_grad():
        layers = model(input_ids=ids, use_cache=True).past_key_values.layers
    whole = {i: (l.keys.abs().amax() / 448.0, l.values.abs().amax() / 448.0) for i, l in enumerate(layers)}
    first = {i: (l.keys[:, :, :1].abs().amax() / 448.0, l.values[:, :, :1].abs().amax() / 448.0)
             for i, l in enumerate(layers)}
    run = lambda specs, scales=None: quality.kld(model, tok, specs, text=text, windows=1, window_tokens=64,  # noqa
                                                 score_from=1, scales=scales)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScaleWarning)
        fitted = run(["fp8_e4m3", "vllm:fp8"])
    given = run(["fp8_e4m3/calibrated"], whole)["fp8_e4m3/calibrated"]
    assert fitted["fp8_e4m3"]["mean"] == pytest.approx(given["mean"], rel=1e-9)
    with pytest.warns(ScaleWarning, match="saturate"):
        on_first = run(["fp8_e4m3/calibrated"], first)["fp8_e4m3/calibrated"]
    assert on_first["mean"] > 2 * fitted["fp8_e4m3"]["mean"] > 0
    assert fitted["vllm:fp8"]["mean"] > 0
