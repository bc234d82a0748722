"""Tests for kvviz.quality.speed's fused_vs_unfused (lesson 7) on the tiny random Llama: fused and unfused decode the
same tokens, the bytes-read figures match counts made here from the config alone, and a fused path that cannot run
says so instead of passing the reference off as fused."""

from __future__ import annotations

import pytest

import torch

from kvviz import attention, parse_kv, quality
from kvviz.models import tiny_model
from kvviz.quality.decode import WARMUP
from kvviz.quality.speed import EXACT, FUSED, UNFUSED, _fuses

PROMPT_TOKENS, NEW_TOKENS = 96, 5


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")  # fp32, 2 layers, 2 KV heads, head_dim 16


@pytest.fixture(scope="module")
def report(tiny):
    model, tok = tiny
    return quality.fused_vs_unfused(model, quality.wikitext_ids(tok, PROMPT_TOKENS), ["int4", "k8v4", "fp16"],
                                    new_tokens=NEW_TOKENS, rounds=1)


def test_runs_both_exact_caches_then_each_format_fused_and_unfused(report):
    assert [(r.name, r.path) for r in report.runs] == [
        ("DynamicCache", EXACT), ("StaticCache", EXACT), ("int4", FUSED), ("int4", UNFUSED), ("k8v4", FUSED), ("k8v4", UNFUSED),
        ("fp16", FUSED), ("fp16", UNFUSED)]
    assert report.context == PROMPT_TOKENS and report.new_tokens == NEW_TOKENS and report.fused_backend == "cpu"
    assert all(r.tokens_per_s > 0 and len(r.tokens) == NEW_TOKENS + WARMUP for r in report.runs)  # + the warm-up steps
    assert report.run("int4", UNFUSED).backend == "torch" and report.run("DynamicCache", EXACT).backend == "sdpa"
    static = report.run("StaticCache", EXACT)
    assert static.backend == "sdpa" and static.vs_static == 1.0
    assert static.tokens == report.run("DynamicCache", EXACT).tokens  # the same exact attention, preallocated
    for run in report.runs:
        assert run.vs_static == pytest.approx(run.tokens_per_s / static.tokens_per_s)


def test_fused_runs_the_kernel_where_numba_runs_and_never_for_a_lossless_cast(report):
    numba = attention._cpu_fused()
    assert report.fused_available == numba
    assert report.run("int4", FUSED).fused == numba and report.run("k8v4", FUSED).fused == numba
    assert report.run("int4", FUSED).backend == ("cpu" if numba else "torch")
    # fp16 under this fp32 model rounds: the kernel reads it like any stored format (kvviz.attention._cpu_reads)
    assert report.run("fp16", FUSED).fused == numba
    # a cast of the model's own dtype is lossless: the reference hands SDPA the very tensors DynamicCache would
    assert not _fuses(parse_kv("fp16"), "cpu", torch.float16) and not _fuses(parse_kv("bf16"), "cpu", torch.bfloat16)
    assert _fuses(parse_kv("bf16"), "cpu", torch.float32) == numba


def test_fused_and_unfused_decode_the_same_tokens(report):
    assert all(report.same_tokens(f) for f in report.formats), [(r.name, r.path, r.tokens) for r in report.runs]


def test_bytes_read_per_step_match_the_config(report):
    """Counted from the shapes alone: 2 layers x 2 KV heads x head_dim 16, K and V, at the last step's tokens."""
    layers, heads, dim = 2, 2, 16
    tokens = PROMPT_TOKENS + NEW_TOKENS + WARMUP  # the prompt, the warm-up steps' tokens and the timed steps'
    rows = layers * heads * tokens  # rows of head_dim values, per side
    exact = 2 * rows * dim * 4  # K and V in fp32
    int4 = 2 * rows * (dim // 2 + 2)  # 4-bit codes, one fp16 scale per token and head
    k8v4 = rows * (dim + 2) + rows * (dim // 2 + 2)  # K: int8 codes + fp16 scale; V as int4
    fp16 = 2 * rows * dim * 2
    assert report.run("DynamicCache", EXACT).bytes_read == exact
    assert report.run("StaticCache", EXACT).bytes_read == exact  # sized to the last step's tokens, not a row more
    for name, packed in (("int4", int4), ("k8v4", k8v4), ("fp16", fp16)):
        assert report.run(name, FUSED).bytes_read == packed, name
        assert report.run(name, UNFUSED).bytes_read == packed + 2 * exact, name  # + the fp32 copy, written and read


def test_without_numba_the_fused_rows_say_the_reference_ran(tiny, monkeypatch):
    monkeypatch.setattr(attention, "_cpu_fused", lambda: False)  # what active_backend sees where numba is missing
    model, tok = tiny
    report = quality.fused_vs_unfused(model, quality.wikitext_ids(tok, 64), ["int4"], new_tokens=2, rounds=1)
    fused = report.run("int4", FUSED)
    assert not report.fused_available and fused.backend == "torch" and not fused.fused
    assert fused.vs_exact == fused.tokens_per_s / report.run("DynamicCache", EXACT).tokens_per_s
    assert report.run("DynamicCache", EXACT).vs_exact == 1.0
    assert report.same_tokens("int4")


@pytest.mark.parametrize("kwargs, message", [
    ({"formats": []}, "at least one KV format"),
    ({"formats": ["int5"]}, "Unknown KV format 'int5'"),
    ({"new_tokens": 0}, "new_tokens and rounds must be at least 1"),
    ({"rounds": 0}, "new_tokens and rounds must be at least 1"),
])
def test_bad_arguments_are_refused_with_a_message(tiny, kwargs, message):
    model, tok = tiny
    args = {"formats": ["int4"], "new_tokens": 2, "rounds": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        quality.fused_vs_unfused(model, quality.wikitext_ids(tok, 16), **args)


def test_ids_must_be_one_prompt(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match=r"\[1, N\] token ids"):
        quality.fused_vs_unfused(model, quality.wikitext_ids(tok, 16)[0], ["int4"])


def test_wikitext_ids_repeat_the_slice_when_asked_for_more(tiny):
    _, tok = tiny
    one = tok(quality.wikitext(), return_tensors="pt")["input_ids"]
    ids = quality.wikitext_ids(tok, one.shape[1] + 10)
    assert ids.shape == (1, one.shape[1] + 10) and ids[0, -10:].tolist() == one[0, :10].tolist()


def test_a_lossless_cast_keeps_the_reference_and_says_why(tiny):
    """fp16 under an fp16 model stores the states bit for bit: its "fused" run is the reference's exact read
    (DynamicCache's tokens), and the lesson's table says why it is not fused."""
    import copy

    from kvviz.ui.fused import _path_label

    model, tok = tiny
    half = copy.deepcopy(model).half()
    report = quality.fused_vs_unfused(half, quality.wikitext_ids(tok, 32), ["fp16"], new_tokens=3, rounds=1)
    run = report.run("fp16", FUSED)
    assert not run.fused and run.why == ("lossless" if report.fused_available else "unavailable")
    assert run.tokens == report.run("DynamicCache", EXACT).tokens
    if report.fused_available:
        assert "lossless cast" in _path_label(run, report, "en") and "무손실" in _path_label(run, report, "ko")
