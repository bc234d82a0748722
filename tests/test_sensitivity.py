"""Per-layer sensitivity (kvviz.analysis.sensitivity), the plan search (kvviz.analysis.search) and kld() over windows
(kvviz.quality.divergence), on a 4-layer tiny Llama whose layer 2 carries huge K channels; the prefix-tree rows
(kvviz.analysis.teacher_forced) against the plain definition, one QuantizedKVCache per variant; the sensitivity and plan
CLIs."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import kvviz
import kvviz.models
from kvviz import cli
from kvviz.analysis.teacher_forced import _forking_hook, _prefix_tree, _runs, row_hidden, row_values
from kvviz.analysis.sensitivity import _prompt_ids, layer_norms, layer_sensitivity, plans_kl, ranking, variant_plans
from kvviz.analysis.search import SearchResult, SearchStep, search, search_stream
from kvviz.formats import as_plan
from kvviz.metrics import Baseline
from kvviz.quality.divergence import base_logprobs, kld, load_base, save_base
from kvviz.tiny import ByteTokenizer, tiny_config, tiny_model

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
    assert plans_kl(model, [ids[None]], [as_plan(plan)])[0] == pytest.approx(sens["k"][OUTLIER_LAYER], rel=1e-4)


def _plain_sensitivity(model, tok, text: str, spec: str, max_tokens: int) -> dict:
    """The definition, computed the straightforward way: per variant its own batch-1 QuantizedKVCache over the whole
    model, the first token alone then the rest, float64 log-softmax, KL(exact || variant) averaged over 1..T-2."""
    ids = _prompt_ids(model, tok, text, max_tokens)
    n_layers = model.config.num_hidden_layers

    def logprobs(plan):
        cache = kvviz.QuantizedKVCache(model.config, plan)
        with torch.no_grad():
            model(input_ids=ids[:, :1], cache=cache, use_cache=True)
            logits = model(input_ids=ids[:, 1:], cache=cache, use_cache=True).logits[0, :-1]  # positions 1..T-2
        return torch.log_softmax(logits.double(), dim=-1)

    lp = logprobs([None] * n_layers)
    out = {"k": [math.nan] * n_layers, "v": [math.nan] * n_layers}
    for plan, (side, i) in zip(*variant_plans(model, kvviz.parse_kv(spec))):
        out[side][i] = float((lp.exp() * (lp - logprobs(plan))).sum(-1).mean())
    return out


@pytest.mark.parametrize("arch, spec", [("outlier", "int4"), ("gemma3", "int4"), ("qwen2", "k8v4"),
                                        ("gemma4", "int4"), ("llama4", "int4"), ("qwen3_next", "int4"),
                                        ("falcon_h1", "k8v4")])
def test_fast_sensitivity_equals_the_plain_definition(outlier_model, arch, spec):
    """The prefix-tree rows (variants forking from the exact run) give the numbers of the plain definition. gemma3
    and qwen2 have sliding layers; gemma4's KV-shared layers make the rows run unshared (every row every layer);
    llama4's causal LM is its own get_decoder(); qwen3_next and falcon_h1 hold linear-attention / Mamba states,
    forked with their rows."""
    model, tok = outlier_model if arch == "outlier" else tiny_model(arch)
    fast = layer_sensitivity(model, tok, TEXT, spec, max_tokens=48)
    plain = _plain_sensitivity(model, tok, TEXT, spec, 48)
    for side in ("k", "v"):
        assert [math.isnan(x) for x in fast[side]] == [math.isnan(x) for x in plain[side]]
        got = [x for x in fast[side] if not math.isnan(x)]
        # float noise: float32 logits in another batch shape move a KL by ~1e-9 nats
        assert got == pytest.approx([x for x in plain[side] if not math.isnan(x)], rel=1e-3, abs=1e-8)
        assert max(got) > 1e-6  # something was quantized: the comparison is not between zeros


def test_prefix_tree_shares_the_exact_trunk():
    """Sensitivity's variants: layer j runs the exact row, the variants of layers < j and the two forking at j."""
    plans = [[None] * 5] + [[("k" if s == 0 else "v") if j == i else None for j in range(5)] for s in (0, 1)
                            for i in range(5)]
    specs = [[None if x is None else kvviz.parse_kv("int4" if x == "k" else "int8") for x in p] for p in plans]
    owners, parents, leaves = _prefix_tree(specs)
    assert [len(o) for o in owners] == [2 * j + 3 for j in range(5)]
    assert parents[0] == [0, 0, 0]  # every row of layer 0 reads the one input row
    assert sorted(leaves) == list(range(11))  # every plan ends in its own row
    # two plans that differ only in their last layer share every row before it
    same = _prefix_tree([specs[5], [*specs[5][:4], specs[10][4]]])[0]
    assert [len(o) for o in same] == [1, 1, 1, 1, 2]


def test_forking_gathers_runs_of_rows_as_index_select_does():
    assert _runs([0, 1, 2, 0, 3, 4, 0]) == [(0, 3), (0, 1), (3, 2), (0, 1)]
    assert _runs([2, 2, 1]) == [(2, 1), (2, 1), (1, 1)]
    x = torch.randn(5, 3, 4)
    for parent in ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 0, 0], [0, 0, 0], [4, 3, 1, 2, 2, 0]):
        for call in ((x,), ()):  # the hidden states positional, or by keyword
            args, kwargs = _forking_hook(parent)(None, call, {} if call else {"hidden_states": x})
            got = args[0] if call else kwargs["hidden_states"]
            assert torch.equal(got, x.index_select(0, torch.tensor(parent)))
    assert _forking_hook([0, 1, 2, 3, 4])(None, (x,), {})[0][0] is x  # the rows as they are: no copy


def test_row_values_takes_back_its_baseline(outlier_model):
    """The Baseline a call returns, passed back, gives the numbers its log-probs give (the exact row not run)."""
    model, tok = outlier_model
    ids = tok(TEXT, return_tensors="pt")["input_ids"][:, :24]
    plans = [as_plan("int4"), as_plan("int4; 1=int8")]
    first, ref = row_values(model, ids, plans, kl_only=True)
    assert isinstance(ref, Baseline) and ref.lp.shape[0] == 22
    for base in (ref, ref.lp):
        again, back = row_values(model, ids, plans, base=base, kl_only=True)
        assert back is ref if base is ref else back is not ref
        for a, b in zip(first, again):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    assert max(float(kl.mean()) for kl in first) > 1e-6  # quantized: not a comparison of zeros


def test_tree_rows_equal_unshared_rows(outlier_model):
    """Plans with shared prefixes (a search path) give the same hidden states as each plan run alone, bit for bit:
    the rows are row-stable (kvviz.rowstable)."""
    model, tok = outlier_model
    ids = tok(TEXT, return_tensors="pt")["input_ids"][:, :40]
    plans = [None if p is None else as_plan(p)
             for p in ["int4", "int4; 3=int8", "int4; 2-3=int8", "int8; 0=int4", None, "k8v4; 1=fp16"]]
    together = row_hidden(model, ids, plans)
    for r, plan in enumerate(plans):
        alone = row_hidden(model, ids, [plan])[0]
        torch.testing.assert_close(together[r], alone, rtol=0, atol=0)


def test_search_respects_the_budget_and_its_curve(outlier_model):
    model, tok = outlier_model
    # V stays fp16 in the two quantized candidates, so the K outlier decides the order
    cands = ["k=int4,v=fp16", "k=int2,v=fp16", "fp16"]
    loose = search(model, tok, TEXT, cands, kl_budget=1e9, max_tokens=64)
    assert isinstance(loose, SearchResult) and all(isinstance(s, SearchStep) for s in loose.steps)
    assert loose.ladder == ("k=int2,v=fp16", "k=int4,v=fp16", "fp16")
    assert loose.plan == as_plan(["k=int2,v=fp16"] * 4) and loose.plan.text == "k=int2,v=fp16"
    assert loose.within_budget and loose.chosen is loose.steps[0]
    steps = loose.steps
    assert len(steps) == 1 + 4 * 2
    assert all(a.bytes < b.bytes for a, b in zip(steps, steps[1:]))  # the curve is monotone in bytes
    assert steps[-1].plan.text == "fp16" and steps[-1].plan.is_uniform
    to_top = [s.move for s in steps if s.move.endswith("-> fp16")]
    assert to_top[0] == f"layer {OUTLIER_LAYER}: k=int4,v=fp16 -> fp16"  # the outlier layer reaches 16 bits first
    assert steps[0].raised is None and all(s.move == f"layer {s.raised[0]}: {s.raised[1]} -> {s.raised[2]}"
                                           for s in steps[1:])  # the move as data, for the page's language
    from kvviz.ui.sensitivity import _move
    assert _move(steps[0], loose.ladder[0], "ko") == "시작: 모든 레이어 k=int2,v=fp16"
    assert _move(steps[1], loose.ladder[0], "en") == steps[1].move
    assert _move(steps[1], loose.ladder[0], "ko").startswith(f"레이어 {steps[1].raised[0]}: ")
    # a budget between the two ends: the answer is the cheapest step within it
    budget = math.sqrt(max(steps[0].kl, 1e-12) * max(steps[-1].kl, 1e-12))
    mid = search(model, tok, TEXT, cands, kl_budget=budget, max_tokens=64)
    assert mid.within_budget and mid.chosen.kl <= budget
    ok = [s for s in mid.steps if s.kl <= budget]
    assert mid.chosen.bytes == min(s.bytes for s in ok) < steps[-1].bytes
    assert mid.chosen is mid.steps[mid.chosen.step] and mid.plan is mid.chosen.plan


def test_search_reuses_given_sensitivities(outlier_model):
    model, tok = outlier_model
    cands = ["k=int4,v=fp16", "k=int2,v=fp16", "fp16"]
    first = search(model, tok, TEXT, cands, kl_budget=1e-3, max_tokens=48)
    again = search(model, tok, TEXT, cands, kl_budget=1e-3, max_tokens=48, sensitivity=first.sensitivity)
    assert again.sensitivity == first.sensitivity
    assert [s.plan for s in again.steps] == [s.plan for s in first.steps]
    # the exact row ran in another batch (the path's, not the sensitivity run's): row-stable, the same bits
    assert [s.kl for s in again.steps] == [s.kl for s in first.steps]
    with pytest.raises(ValueError, match="previous search's result"):
        search(model, tok, TEXT, cands, kl_budget=1e-3, max_tokens=48, sensitivity={"int4": [0.0] * 4})


def test_search_stream_measures_the_path_in_passes_to_the_same_result(outlier_model):
    model, tok = outlier_model
    cands = ["k=int4,v=fp16", "k=int2,v=fp16", "fp16"]
    whole = search(model, tok, TEXT, cands, kl_budget=1e-3, max_tokens=48)
    passes = list(search_stream(model, tok, TEXT, cands, kl_budget=1e-3, max_tokens=48, first_pass=2))
    assert [len(p.steps) for p in passes] == [2, 6, 9]  # 2, then twice as many each pass, 9 plans in all
    assert [p.complete for p in passes] == [False, False, True] and passes[-1].path_length == 9
    for p in passes:  # each pass's steps are the whole path's first ones, the same bits
        assert [(s.plan, s.kl, s.bytes) for s in p.steps] == [(s.plan, s.kl, s.bytes)
                                                              for s in whole.steps[: len(p.steps)]]
    assert passes[-1].chosen == whole.chosen and passes[-1].steps == whole.steps
    # the tab's view of a pass: what is measured so far, and no "no plan stays within" before the path ends
    from kvviz.ui.sensitivity import _search_view
    tight = list(search_stream(model, tok, TEXT, cands, kl_budget=0.0, max_tokens=48, first_pass=2))
    _, _, md, table = _search_view(tight[0], "tiny", model, "en")
    assert md.startswith("*Measured 2 of the path's 9 plans; the rest follow.*") and len(table) == 2
    assert "none of the path's first 2 plans stays within 0 yet" in md and "no plan on the path" not in md
    _, _, md, table = _search_view(tight[-1], "tiny", model, "en")
    assert "Measured" not in md and "no plan on the path stays within 0" in md and len(table) == 9


def test_search_bad_input(outlier_model):
    model, tok = outlier_model
    with pytest.raises(ValueError, match="kl_budget"):
        search(model, tok, TEXT, ["int4"], kl_budget=-1)
    with pytest.raises(ValueError, match="same spec twice"):
        search(model, tok, TEXT, ["int4", "int4"], kl_budget=0.1)
    with pytest.raises(ValueError, match="cannot be stored as q8_0"):
        search(model, tok, TEXT, ["int4", "q8_0"], kl_budget=0.1)
    with pytest.raises(ValueError, match="is a per-layer plan"):
        search(model, tok, TEXT, ["int4", "int4; 0=fp16"], kl_budget=0.1)


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


def test_cli_sensitivity_and_plan(outlier_model, monkeypatch, capsys, tmp_path):
    """The CLIs print the map (the outlier layer first), the path and a plan within the budget."""
    monkeypatch.setattr(kvviz.models, "load_model", lambda name=None: outlier_model)
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert cli.main(["sensitivity", "--spec", "int4", "--tokens", "48", "--text-file", str(text)]) == 0
    out = capsys.readouterr().out
    assert f"most damaging: K{OUTLIER_LAYER} " in out and "sensitivity took" in out
    assert len([line for line in out.splitlines() if line.strip()[:1].isdigit()]) == 4  # one row per layer
    assert cli.main(["plan", "--candidates", "int4,int8,fp16", "--kl-budget", "1e9", "--tokens", "48",
                     "--text-file", str(text)]) == 0
    out = capsys.readouterr().out
    assert "plan: int4\n" in out and "within the budget" in out and "uniform fp16:" in out
    assert cli.main(["plan", "--candidates", "k=int8,v=int4,fp16", "--kl-budget", "0.1"]) == 2
    assert "cannot go in it" in capsys.readouterr().err
    assert cli.main(["sensitivity", "--spec", "bogus"]) == 2
    assert "Unknown KV format" in capsys.readouterr().err


def test_search_takes_engine_dtypes_and_ends_in_a_plan_vllm_serves():
    """Engine dtypes as candidates: the search sees what the engine stores (vLLM's TurboQuant keeps layers 0, 1, 4
    and 5 of this 6-layer model in 16 bits), and a plan of one vLLM dtype and 16-bit layers is what vLLM serves
    with --kv-cache-dtype-skip-layers."""
    from kvviz.export import export_plan

    torch.manual_seed(0)
    config = tiny_config("llama", num_hidden_layers=6)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="kvviz").eval()
    tok = ByteTokenizer()
    three = search(model, tok, TEXT, ["vllm:turboquant_3bit_nc", "vllm:fp8", "fp16"], kl_budget=1e9, max_tokens=32)
    # on 6 layers of head_dim 16, TurboQuant's four 16-bit layers make it dearer than fp8 everywhere
    assert three.ladder == ("vllm:fp8", "vllm:turboquant_3bit_nc", "fp16")
    tq = three.sensitivity["vllm:turboquant_3bit_nc"]
    assert max(tq[i] for i in (0, 1, 4, 5)) < min(tq[i] for i in (2, 3))  # 16 bits against 3
    two = search(model, tok, TEXT, ["vllm:turboquant_3bit_nc", "fp16"], kl_budget=1e9, max_tokens=32,
                 sensitivity={"vllm:turboquant_3bit_nc": tq})
    start = two.steps[0].plan
    assert start == as_plan("vllm:turboquant_3bit_nc; 0-1,4-5=vllm:auto").fitted(6)
    out = export_plan(start, 6, "M")  # only the engine's own rule: exactly its flag
    assert out["vllm"]["supported"] and out["vllm"]["flags"] == "--kv-cache-dtype turboquant_3bit_nc"
    for step in two.steps:  # every plan on the path is one vLLM dtype and layers in 16 bits
        out = export_plan(step.plan, 6, "M")["vllm"]
        assert out["supported"], (step.plan.text, out["note"])
    flags = [export_plan(s.plan, 6)["vllm"]["flags"] for s in two.steps]
    assert any(f.startswith("--kv-cache-dtype turboquant_3bit_nc --kv-cache-dtype-skip-layers ") for f in flags)


def test_peaks_name_the_worst_pairs_against_the_median():
    """The Sensitivity tab's peak lines come from kvviz.analysis: KL over the median pair's, and the layer's channel
    ratio beside the median layer's."""
    from kvviz.analysis.sensitivity import peaks

    sens = {"k": [0.1, 0.5, 0.2], "v": [0.05, 0.01, float("nan")]}
    norms = {"k_channel_ratio": [2.0, 7.0, 3.0], "v_channel_ratio": [1.0, 1.5, float("nan")],
             "k_max": [1.0, 9.0, 2.0], "v_max": [1.0, 1.0, 1.0]}
    top = peaks(sens, norms, top=2)
    assert [(p.side, p.layer) for p in top] == [("k", 1), ("k", 2)]
    assert top[0].times_median == pytest.approx(0.5 / 0.1)  # median of 0.5, 0.2, 0.1, 0.05, 0.01 (NaN left out)
    assert top[0].channel_ratio == 7.0 and top[0].median_channel_ratio == 3.0 and top[0].peak == 9.0


def test_sensitivity_and_search_run_llama_cpp_names_as_llama_cpp_does():
    """A `llama.cpp:` spec is measured as llama.cpp runs it, against its f16 cache run: llama.cpp:f16 costs nothing
    in any layer (every other layer is held in f16 too), q4_0 differs from kvviz's bare q4_0, /norot from the
    rotated name (the other side keeps the name's rotation setting); the search climbs to llama.cpp:f16's 0."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama", num_hidden_layers=3, head_dim=64),
                                             attn_implementation="kvviz").eval()
    tok = ByteTokenizer()
    sens = {s: layer_sensitivity(model, tok, TEXT, s, max_tokens=40)
            for s in ("q4_0", "llama.cpp:q4_0", "llama.cpp:q4_0/norot", "llama.cpp:f16")}
    assert sens["llama.cpp:q4_0"]["other"] == "llama.cpp:f16" and sens["q4_0"]["other"] == "fp16"
    assert sens["llama.cpp:f16"]["k"] == sens["llama.cpp:f16"]["v"] == [0.0] * 3
    for side in ("k", "v"):
        ours, rotated, plain = (sens[s][side] for s in ("q4_0", "llama.cpp:q4_0", "llama.cpp:q4_0/norot"))
        assert all(x > 0 for x in rotated + plain)
        assert all(a != pytest.approx(b, rel=1e-3) for a, b in zip(ours, rotated)), (ours, rotated)
        assert all(a != pytest.approx(b, rel=1e-3) for a, b in zip(rotated, plain)), (rotated, plain)
    res = search(model, tok, TEXT, ["llama.cpp:q4_0", "llama.cpp:f16"], kl_budget=1e9, max_tokens=40)
    assert res.steps[0].kl > 0 and res.steps[-1].kl == 0
    assert res.steps[-1].plan == as_plan("llama.cpp:f16").fitted(3)
