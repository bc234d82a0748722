"""The Equal bytes view: kvviz.quality.equal_bytes (candidates fitted to one budget, measured from their caches), its
figures (kvviz.plots.equal_bytes) and its tab's function (kvviz.ui.equal_bytes.run), on kvviz's tiny models.

On the tiny random models the KLs mean nothing; what holds on any model is asserted: every fitted candidate's bytes
(read from its cache) are within the budget and equal the memory model's, a policy keeping every token reads the
exact run's log-probs, the quantization map marks the tokens a streaming policy drops, and each bad input comes back
as a message that says what to do. (What the bundled models show: tests/test_lessons_models.py, lesson 11.)

Run: python -m pytest tests/test_equal_bytes.py -q
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from kvviz.formats import as_plan
from kvviz.memory import kv_cache_bytes_for
from kvviz.metrics import kl, log_probs
from kvviz.plots import equal_bytes as eb_plots
from kvviz.quality import equal_bytes as eb
from kvviz.tiny import tiny_model

CONTEXT, CONTINUATION = 256, 8  # bytes of WikiText-2 (the tiny models' tokenizer): the needle needs 256


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _last(steps):
    last = None
    for last in steps:
        pass
    return last


@pytest.fixture(scope="module")
def result(llama):
    model, tok = llama
    return _last(eb.run(model, tok, 0.25, CONTEXT, CONTINUATION, needles_per_depth=1))


def test_every_fitted_candidate_is_within_the_budget_and_its_cache_holds_the_memory_models_bytes(llama, result):
    model, _ = llama
    rows = {r.spec: r for r in result.rows}
    kinds = {r.candidate.kind for r in result.rows}
    assert kinds == set(eb.KINDS), kinds
    full = kv_cache_bytes_for(model.config, CONTEXT, k="fp16", layout="transformers")
    assert all(r.nbytes_16bit == full for r in result.rows)
    for r in result.rows:
        assert r.nbytes == kv_cache_bytes_for(model.config, CONTEXT, k=r.candidate.plan, layout="transformers"), r.spec
        if r.candidate.plan.evict is not None:
            assert r.nbytes <= 0.25 * full, (r.spec, r.pct_16bit)
            assert 0 < r.candidate.keep < 1, r.spec
    tokens = [r for r in result.rows if r.candidate.kind == "tokens"]
    assert len(tokens) == len(eb.POLICIES) and all(abs(r.candidate.keep - 0.25) < 0.02 for r in tokens), rows
    assert "int2" in rows and rows["int2"].candidate.keep == 1.0
    assert all(r.found is not None and r.needles == 5 for r in result.rows)


def _context(model, tok, plans=()):
    """(the context's exact prefill, the continuation ids, the exact run's log-probs)."""
    ctx, cont = eb._split(tok, CONTEXT, CONTINUATION)
    prefilled = eb.context_prefill(model, ctx, plans)
    return prefilled, cont, eb.exact_logprobs(model, prefilled, cont)


def test_a_policy_that_keeps_every_token_reads_the_exact_run(llama):
    model, tok = llama
    prefilled, cont, base = _context(model, tok, [as_plan("fp16 @ snapkv:1")])
    for policy in eb.POLICIES:
        row = eb.measure(model, eb.Candidate(as_plan(f"fp16 @ {policy}:1"), "tokens"), prefilled, cont, base, 1)
        assert row.kl < 1e-6, (policy, row.kl)
    dropped = eb.measure(model, eb.Candidate(as_plan("fp16 @ streaming:0.25"), "tokens"), prefilled, cont, base, 1)
    assert dropped.kl > 1e-4, "dropping three quarters of the context changes the continuation's log-probs"


@pytest.mark.parametrize("spec", ["int4", "fp16 @ streaming:0.25", "int8 @ snapkv:0.4", "int4 @ snapkv:0.8,rest=int2"])
def test_a_candidate_loaded_from_the_prefill_measures_what_its_own_prefill_measures(llama, spec):
    """measure loads each candidate's cache from one exact prefill of the context: the bytes, the kept tokens and
    the continuation's KL are bit for bit those of a cache that prefilled the context itself."""
    model, tok = llama
    plan = as_plan(spec)
    prefilled, cont, base = _context(model, tok, [plan])
    row = eb.measure(model, eb.Candidate(plan, eb.kind_of(plan)), prefilled, cont, base, 1)
    ctx, _ = eb._split(tok, CONTEXT, CONTINUATION)
    own = eb.QuantizedKVCache(model.config, plan)
    with torch.no_grad():
        model(input_ids=ctx, cache=own, use_cache=True, logits_to_keep=1)
        nbytes, bits = own.nbytes(), eb.token_bits(model.config, plan, own, CONTEXT)
        lp = log_probs(model(input_ids=cont, cache=own, use_cache=True).logits[0])
    assert row.nbytes == nbytes and row.token_bits == bits
    assert row.kl == float(kl(base, lp).mean()), (row.kl, float(kl(base, lp).mean()))


def test_the_quantization_map_marks_what_streaming_keeps(llama):
    model, tok = llama
    prefilled, cont, base = _context(model, tok)
    plan = as_plan("fp16 @ streaming:0.25,sinks=4")
    row = eb.measure(model, eb.Candidate(plan, "tokens"), prefilled, cont, base, 1)
    bits = row.token_bits
    kept = plan.evict.kept(CONTEXT)
    assert bits[:4] == (16.0,) * 4, "the sinks"
    assert set(bits[CONTEXT - (kept - 4):]) == {16.0}, "the recent window"
    assert set(bits[4:CONTEXT - (kept - 4)]) == {0.0}, "the middle: dropped"
    mixed = eb.measure(model, eb.Candidate(as_plan("int4 @ streaming:0.25,rest=int2"), "mixed"), prefilled, cont,
                       base, 1).token_bits
    assert min(mixed) > 0 and max(mixed) > min(mixed), "mixed precision: nothing dropped, the kept tokens richer"


@pytest.mark.parametrize("call, words", [
    (dict(budget=1e-5), ["No candidate fits", "smallest any candidate reaches"]),
    (dict(budget=1.5), ["(0, 1]"]),
    (dict(policies=["h2o"]), ["Unknown eviction policy", "streaming", "snapkv", "knorm", "random"]),
    (dict(window=CONTEXT), ["window", "shorter"]),
    (dict(custom=[as_plan("int4 @ snapkv:0.5")], policies=[], combine="knorm", window=None), None),
])
def test_bad_inputs_say_what_to_do(llama, call, words):
    model, tok = llama
    kwargs = dict(budget=0.25, context_tokens=CONTEXT, continuation_tokens=CONTINUATION, needles_per_depth=0) | call
    if words is None:  # a custom candidate is measured as given, not fitted
        rows = _last(eb.run(model, tok, **kwargs)).rows
        assert rows[-1].spec == "int4 @ snapkv:0.5" and rows[-1].candidate.kind == "both"
        return
    with pytest.raises(ValueError) as info:
        _last(eb.run(model, tok, **kwargs))
    assert all(w in str(info.value) for w in words), str(info.value)


def test_keep_ratio_outside_zero_one_is_refused_where_it_is_typed():
    for text in ("int4 @ snapkv:1.5", "int4 @ snapkv:0"):
        with pytest.raises(ValueError, match=r"\(0, 1\]"):
            as_plan(text)


def test_a_model_whose_layers_all_slide_is_told_why_a_policy_changes_nothing():
    model, tok = tiny_model("mistral")
    with pytest.raises(ValueError, match="sliding"):
        _last(eb.run(model, tok, 0.25, CONTEXT, CONTINUATION, needles_per_depth=0))


def test_the_figures_take_the_rows():
    fig = eb_plots.equal_bytes_chart(["int4", "fp16 @ snapkv:0.25"], ["bits", "tokens"], [26.6, 25.0], [0.04, 0.3],
                                     [15, 9], 15, 25.0, "t")
    assert isinstance(fig, go.Figure) and len(fig.data) == 5
    for axis in ("xaxis2", "yaxis", "yaxis2"):
        assert "(" in fig.layout[axis].title.text, axis
    fig = eb_plots.token_bits_map(["a", "b"], [[16, 0, 16], [4, 2, 4]], "m", token_labels=["x", "y", "z"])
    assert fig.data[0].z[1] == (4, 2, 4) or list(fig.data[0].z[1]) == [4, 2, 4]
    assert "(" in fig.data[0].colorbar.title.text
    with pytest.raises(AssertionError):
        eb_plots.equal_bytes_chart(["a"], ["bits", "tokens"], [1], [1], [1], 1, 25, "t")


def test_the_tab_streams_rows_and_ends_in_korean():
    from kvviz import runtime
    from kvviz.ui import equal_bytes as tab

    rt = runtime.Runtime.from_env({"KVVIZ_MODEL": "tiny-llama", "KVVIZ_WARMUP": "0"})
    with rt.activate():
        steps = list(tab.run(25, CONTEXT, CONTINUATION, ["streaming"], "knorm", 32, "", 0, "tiny-llama", "한국어",
                             progress=lambda *a, **k: None))
    assert len(steps) == 7 + 1, "one update per candidate (int4, int2, streaming, 2 both, 2 mixed), then the last"
    assert [len(s[2]) for s in steps[:-1]] == list(range(1, 8)), "the table grows a row at a time"
    chart, fig_map, table, status = steps[-1]
    assert isinstance(table, pd.DataFrame) and list(table.columns)[0] == "스펙"
    assert "완료" in status and "16비트 캐시의 25%" in status
    assert "예산" in chart.layout.title.text and fig_map.data
