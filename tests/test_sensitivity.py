"""Per-layer sensitivity (kvviz.analysis.sensitivity), the plan search (kvviz.plan.search) and kld() over windows
(kvviz.quality.divergence), on a 4-layer tiny Llama whose layer 2 carries huge K channels."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvviz.analysis.sensitivity import layer_norms, layer_sensitivity, ranking
from kvviz.plan import parse_plan, search
from kvviz.quality.divergence import base_logprobs, kld, load_base, save_base
from kvviz.tiny import ByteTokenizer, tiny_config

OUTLIER_LAYER = 2
TEXT = ("The cache stores keys and values for every token it has seen, and attention reads them back at every "
        "step. Quantizing them saves memory, but a few layers carry channels so large that a shared scale "
        "crushes everything else. ") * 2


def _model(outlier: bool):
    """A 4-layer tiny Llama with attention biases; with `outlier`, layer 2's k_proj bias puts +200 on channels 3
    and 11 of every KV head: Qwen2.5's mechanism (its k_proj bias makes a few layers' K norms 30x the median),
    which a per-token scale spends its range on, crushing the channels that carry the scores."""
    torch.manual_seed(0)
    config = tiny_config("llama", num_hidden_layers=4, attention_bias=True)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="kvviz")
    model.eval()
    d = config.head_dim
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.bias.zero_()
        if outlier:
            bias = model.model.layers[OUTLIER_LAYER].self_attn.k_proj.bias
            for h in range(config.num_key_value_heads):
                bias[h * d + 3] = bias[h * d + 11] = 200.0
    return model, ByteTokenizer()


@pytest.fixture(scope="module")
def outlier_model():
    return _model(outlier=True)


def test_the_outlier_layer_ranks_first(outlier_model):
    model, tok = outlier_model
    sens = layer_sensitivity(model, tok, TEXT, "int4", max_tokens=96)
    assert len(sens["k"]) == len(sens["v"]) == 4 and sens["tokens"] == 96
    top_k = [r for r in ranking(sens) if r[0] == "k"]
    assert top_k[0][:2] == ("k", OUTLIER_LAYER)
    others = [kl for i, kl in enumerate(sens["k"]) if i != OUTLIER_LAYER]
    assert sens["k"][OUTLIER_LAYER] > 5 * max(others)
    # without the bias the same layer is unremarkable: the ranking comes from the outlier, not the layer
    plain = layer_sensitivity(*_model(outlier=False), TEXT, "int4", max_tokens=96)
    assert plain["k"][OUTLIER_LAYER] < sens["k"][OUTLIER_LAYER] / 5
    assert all(kl >= 0 for kl in sens["k"] + sens["v"])
    # and the norms say why: layer 2's largest K channel stands far above its median channel
    norms = layer_norms(model, tok, TEXT, max_tokens=96)
    ratios = norms["k_channel_ratio"]
    assert max(range(4), key=lambda i: ratios[i]) == OUTLIER_LAYER and ratios[OUTLIER_LAYER] > 20
    assert norms["k_max"][OUTLIER_LAYER] > 20 * norms["k_median_amax"][OUTLIER_LAYER]


def test_sensitivity_rows_per_pass_gives_the_same_answer(outlier_model):
    model, tok = outlier_model
    a = layer_sensitivity(model, tok, TEXT, "int4", max_tokens=48)
    b = layer_sensitivity(model, tok, TEXT, "int4", max_tokens=48, rows_per_pass=3)
    assert a["k"] == pytest.approx(b["k"], rel=1e-4, abs=1e-8)  # batch shapes change float sums
    assert a["v"] == pytest.approx(b["v"], rel=1e-4, abs=1e-8)  # batch shapes change float sums


def test_sensitivity_matches_a_single_plan_run(outlier_model):
    """The batched K variant of layer 2 equals one kld() row of the same plan (K int4, V fp16 on layer 2)."""
    model, tok = outlier_model
    sens = layer_sensitivity(model, tok, TEXT, "int4", max_tokens=48)
    ids = tok(TEXT, return_tensors="pt")["input_ids"][0, :48]
    plan = [None] * 4
    plan[OUTLIER_LAYER] = "k=int4,v=fp16"
    from kvviz.analysis.sensitivity import plans_kl
    assert plans_kl(model, [ids[None]], [plan])[0] == pytest.approx(sens["k"][OUTLIER_LAYER], rel=1e-4)


def test_search_respects_the_budget_and_its_curve(outlier_model):
    model, tok = outlier_model
    # V stays fp16 in the two quantized candidates, so the K outlier decides the order
    cands = ["k=int4,v=fp16", "k=int2,v=fp16", "fp16"]
    loose = search(model, tok, TEXT, cands, kl_budget=1e9, max_tokens=64)
    assert loose["candidates"] == ["k=int2,v=fp16", "k=int4,v=fp16", "fp16"]
    assert loose["plan"] == ["k=int2,v=fp16"] * 4 and loose["within_budget"]
    steps = loose["steps"]
    assert len(steps) == 1 + 4 * 2
    assert all(a["bytes"] < b["bytes"] for a, b in zip(steps, steps[1:]))  # the curve is monotone in bytes
    assert steps[-1]["plan_text"] == "fp16"
    to_top = [s["move"] for s in steps if s["move"].endswith("-> fp16")]
    assert to_top[0] == f"layer {OUTLIER_LAYER}: k=int4,v=fp16 -> fp16"  # the outlier layer reaches 16 bits first
    # a budget between the two ends: the answer is the cheapest step within it
    budget = math.sqrt(max(steps[0]["kl"], 1e-12) * max(steps[-1]["kl"], 1e-12))
    mid = search(model, tok, TEXT, cands, kl_budget=budget, max_tokens=64)
    assert mid["within_budget"] and mid["kl"] <= budget
    ok = [s for s in mid["steps"] if s["kl"] <= budget]
    assert mid["bytes"] == min(s["bytes"] for s in ok) < steps[-1]["bytes"]
    assert parse_plan(mid["plan_text"], 4) == parse_plan(mid["plan"], 4)


def test_search_bad_input(outlier_model):
    model, tok = outlier_model
    with pytest.raises(ValueError, match="kl_budget"):
        search(model, tok, TEXT, ["int4"], kl_budget=-1)
    with pytest.raises(ValueError, match="same spec twice"):
        search(model, tok, TEXT, ["int4", "int4"], kl_budget=0.1)
    with pytest.raises(ValueError, match="cannot be stored as q8_0"):
        search(model, tok, TEXT, ["int4", "q8_0"], kl_budget=0.1)


def test_kld_windows_and_saved_base(tmp_path, outlier_model):
    model, tok = outlier_model
    text = TEXT * 3
    live = kld(model, tok, ["int4", f"int4; {OUTLIER_LAYER}=fp16", "fp16"], text=text, windows=2, window_tokens=64)
    assert live["int4"]["n"] == 2 * (64 - 1 - 32)
    assert live["int4"]["mean"] > 1.5 * live[f"int4; {OUTLIER_LAYER}=fp16"]["mean"] > 0
    assert live["fp16"]["mean"] < 1e-3 * live["int4"]["mean"]
    base = base_logprobs(model, tok, text=text, windows=2, window_tokens=64)
    path = tmp_path / "base.pt"
    save_base(base, path)
    saved = kld(model, tok, ["int4"], base=load_base(path))
    for key in ("mean", "median", "p99", "max", "delta_p_rms", "same_top_p", "ln_ppl_ratio"):
        assert saved["int4"][key] == pytest.approx(live["int4"][key], rel=1e-4, abs=1e-7)


def test_kld_bad_input(tmp_path, outlier_model):
    model, tok = outlier_model
    with pytest.raises(ValueError, match="non-empty list"):
        kld(model, tok, "int4", text=TEXT)
    with pytest.raises(ValueError, match="5 entries for a model with 4 layers"):
        kld(model, tok, [["int4"] * 5], text=TEXT, windows=1, window_tokens=32)
    with pytest.raises(ValueError, match="need"):
        kld(model, tok, ["int4"], text="short", windows=1, window_tokens=32)
    bad = tmp_path / "bad.pt"
    torch.save({"x": 1}, bad)
    with pytest.raises(ValueError, match="not a kvviz KLD baseline"):
        load_base(bad)
    with pytest.raises(ValueError, match="No baseline file"):
        load_base(tmp_path / "missing.pt")
