"""kvviz.engines.verdict and simulate.topk_kld: the like-with-like simulation an engine's KLD is judged against, and
the verdict's thresholds. On a tiny random model (vocab 256), so a top-256 estimate lumps nothing."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvviz.attention import ATTN_NAME
from kvviz.engines import simulate, verdict
from kvviz.tiny import tiny_config, tiny_model

IDS = [3, 70, 101, 32, 116, 111, 119, 101, 114, 32, 105, 115, 32, 116, 97, 108, 108, 46]


def test_topk_with_the_whole_vocabulary_is_the_full_kld():
    model, _ = tiny_model()
    full = simulate.kvviz_kld(["int4", "vllm:fp8_e5m2"], IDS, model)
    topk = simulate.topk_kld(["int4", "vllm:fp8_e5m2"], IDS, model, top_k=256)
    for spec in full:
        assert topk[spec]["n"] == full[spec]["n"] == len(IDS) - 2  # positions 1..T-2 on both
        assert topk[spec]["mean"] == pytest.approx(full[spec]["mean"], rel=1e-6, abs=1e-12)
        assert topk[spec]["same_top_p"] == full[spec]["same_top_p"]
        assert topk[spec]["ln_ppl_ratio"] == pytest.approx(full[spec]["ln_ppl_ratio"], rel=1e-9, abs=1e-12)


def test_topk_is_a_lower_bound_that_rises_with_k():
    model, _ = tiny_model()
    means = [simulate.topk_kld(["int4"], IDS, model, top_k=k)["int4"]["mean"] for k in (2, 20, 256)]
    assert 0 < means[0] <= means[1] <= means[2]
    assert "top-2" in simulate.topk_kld(["int4"], IDS, model, top_k=2)["int4"]["estimate"]


@pytest.mark.parametrize("engine, sim, expected", [
    (0.010, 0.010, verdict.WITHIN), (0.0149, 0.010, verdict.WITHIN), (0.0067, 0.010, verdict.WITHIN),
    (0.0151, 0.010, verdict.MORE), (0.0066, 0.010, verdict.LESS), (0.010, 0.0, verdict.MORE),
    (0.0, 0.010, verdict.LESS), (2e-6, 9e-6, verdict.WITHIN),  # both below FLOOR: nothing measurable lost
])
def test_verdict_thresholds(engine, sim, expected):
    assert verdict.verdict(engine, sim) == expected


def test_simulated_spec_names_the_cpu_build_s_truncating_fp8_store():
    assert verdict.simulated_spec("fp8_e4m3") == "vllm:fp8_e4m3/cpu"
    assert verdict.simulated_spec("fp8", "cpu") == "vllm:fp8/cpu"
    assert verdict.simulated_spec("fp8_e5m2", "gpu") == "vllm:fp8_e5m2"
    assert verdict.simulated_spec("int4_per_token_head", "cpu") == "vllm:int4_per_token_head"  # no CPU store of its own
    with pytest.raises(ValueError, match="cpu, gpu"):
        verdict.simulated_spec("fp8", "tpu")


def _tiny_head_dim_32():
    """The tiny Llama with head_dim 32: vLLM's CPU attention takes an fp8 cache only at multiples of 32."""
    config = tiny_config("llama")
    config.head_dim = 32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, attn_implementation=ATTN_NAME).eval()


@pytest.mark.parametrize("build, spec", [("gpu", "vllm:fp8_e4m3"), ("cpu", "vllm:fp8_e4m3/cpu")])
def test_rows_judge_engine_results_against_the_simulation(build, spec):
    model = _tiny_head_dim_32()
    sim = simulate.topk_kld([spec], IDS, model, top_k=5)[spec]
    engine = {"fp8_e4m3": dict(sim, ids=IDS, top_k=5, score_from=1, mean=3 * sim["mean"])}
    (row,) = verdict.rows(engine, model, build=build)
    assert row.spec == spec and row.sim["mean"] == pytest.approx(sim["mean"], rel=1e-12)
    assert row.ratio == pytest.approx(3.0) and row.verdict == verdict.MORE
    with pytest.raises(ValueError, match="score_from=1"):
        verdict.rows({"fp8_e4m3": dict(engine["fp8_e4m3"], score_from=0)}, model)
