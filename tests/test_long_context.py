"""kvviz.quality.long_context and `python -m kvviz drift` on tiny models and short texts: the lockstep position
pass against the one-shot teacher-forced reference, its streaming, crossings, repetition, generation drift,
needle counts, the needle's batch against the per-question loop, every bad-input message, the CLI's files."""

from __future__ import annotations

import copy
import csv
import json
import random

import numpy as np
import pytest
import torch

import kvviz.models
from kvviz.analysis.teacher_forced import lm_logits, row_values
from kvviz.cache import QuantizedKVCache
from kvviz.cli import main
from kvviz.formats import as_plan
from kvviz.metrics import kl, log_probs
from kvviz.quality import long_context as lc
from kvviz.quality.decode import load_prefill
from kvviz.quality.long_context import needles
from kvviz.quality.needle import rotated_filler
from kvviz.tiny import tiny_model

TEXT = "The quick brown fox jumps over the lazy dog; then it rests by the river and counts the stones. " * 3


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _last(stream):
    last = None
    for last in stream:
        pass
    return last


def test_exact_format_gives_kl_zero_and_full_top1():
    model, tok = tiny_model("llama", dtype=torch.float16)  # an fp16 cache holds fp16 K/V as they are
    res = _last(lc.position_drift(model, tok, ["fp16"], context=48, chunk=16, text=TEXT))
    assert res.done and res.kl["fp16"].shape == (48,)
    assert np.all(res.kl["fp16"] == 0.0) and res.top1["fp16"].all()


def test_matches_the_one_shot_teacher_forced_reference_and_streams_per_chunk(llama):
    model, tok = llama
    updates = list(lc.position_drift(model, tok, ["int4", "k8v4"], context=70, chunk=16, text=TEXT))
    assert [u.done_tokens for u in updates] == [17, 33, 49, 65, 70]  # ceil(69 / 16) updates, the first token inside
    assert [u.done for u in updates] == [False] * 4 + [True]
    res = updates[-1]
    ids = torch.tensor([res.tokens])
    for name in ("int4", "k8v4"):
        [(kld, _, _, same)], _ = row_values(model, ids, [as_plan(name)], first_chunk=1, chunk=16, score_from=1)
        assert np.allclose(res.kl[name][1:69], kld.numpy(), rtol=1e-4, atol=1e-7)
        assert np.array_equal(res.top1[name][1:69], same.numpy())
        assert res.kl[name][0] == 0.0 and res.kl[name][1:].max() > 0
    assert res.kl["int4"].mean() > res.kl["k8v4"].mean()
    assert set(res.seconds) == {"exact", "int4", "k8v4", "metrics"}


def test_static_scales_are_fitted_on_the_first_chunk_not_the_first_token(llama):
    """nvfp4's global scale and fp8's per-tensor scale come from the first chunk (as its prefill fits them); the
    pass then equals the one-shot reference run with those scales."""
    model, tok = llama
    for name in ("nvfp4", "fp8_e4m3"):
        res = _last(lc.position_drift(model, tok, [name], context=70, chunk=16, text=TEXT))
        ids = torch.tensor([res.tokens])
        scales = lc.position.first_chunk_scales(model, as_plan(name), ids[:, :17])
        one_token = lc.position.first_chunk_scales(model, as_plan(name), ids[:, :1])
        assert any(not torch.equal(scales[i][0], one_token[i][0]) for i in scales)  # the chunk's scale differs
        [(kld, _, _, _)], _ = row_values(model, ids, [as_plan(name)], first_chunk=1, chunk=16, score_from=1,
                                         scales=scales)
        assert np.allclose(res.kl[name][1:69], kld.numpy(), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("through", ["numba", "torch"])  # kernels/cpu/logits.py, and its fallback without numba
def test_block_metrics_equal_kl_of_the_log_softmaxes(llama, monkeypatch, through):
    """The pass's KL (sum P z0 - sum P z + (lse(z) - lse(z0)) sum P over a reused buffer, in equal blocks of
    positions) against kvviz.metrics.kl of the two float64 log-softmaxes: equal to 1e-12 nats, the same top-1, and
    KL 0 exactly where the hidden states are the exact ones."""
    if through == "torch":
        monkeypatch.setattr(lc.position.cpu_logits, "_numba_rows", lambda z: (None, None))
    model, _ = llama
    vocab, width = model.get_output_embeddings().weight.shape
    monkeypatch.setattr(lc.position, "LOGIT_BLOCK", 7 * vocab)  # 7 rows a block: 20 positions run as 7, 7, 6
    g = torch.Generator().manual_seed(0)
    exact = 3 * torch.randn(20, width, generator=g)
    near = exact + 0.05 * torch.randn(20, width, generator=g)
    near[:3] = exact[:3]
    far = exact + torch.randn(20, width, generator=g)
    kls, tops = lc.position._Metrics(model).values(exact, [near, far, exact.clone()])
    head = lambda h: torch.cat([lm_logits(model, h[a : a + 7]) for a in range(0, 20, 7)])  # noqa: E731  the same rows
    with torch.no_grad():
        z0 = head(exact)
        for h, got, top in zip((near, far, exact), kls, tops):
            z = head(h)
            want = kl(log_probs(z0), log_probs(z)).clamp(min=0.0).numpy()
            assert np.allclose(got, want, rtol=0, atol=1e-12), np.abs(got - want).max()
            assert np.array_equal(top, (z.argmax(-1) == z0.argmax(-1)).numpy())
    assert np.all(kls[0][:3] == 0.0) and np.all(kls[0][3:] > 0) and np.all(kls[2] == 0.0)
    assert kls[1].mean() > kls[0].mean() and not tops[1].all()


@pytest.mark.parametrize("arch", ["gemma3", "qwen3_next"])  # sliding + full; linear attention + full
def test_sliding_and_hybrid_architectures_run(arch):
    model, tok = tiny_model(arch)
    res = _last(lc.position_drift(model, tok, ["int4"], context=40, chunk=16, text=TEXT))
    assert res.kl["int4"].shape == (40,) and np.isfinite(res.kl["int4"]).all() and res.kl["int4"].max() > 0
    assert ("sliding window" in res.note) == (arch == "gemma3")


def test_smoothing_and_crossings_on_a_synthetic_curve():
    kl = np.array([0.0, 0.0, 0.02, 0.02, 0.2, 0.2])
    assert np.allclose(lc.smooth(kl, 2), [0.0, 0.0, 0.01, 0.02, 0.11, 0.2])
    assert lc.crossings(kl, (0.01, 0.05, 0.1, 1.0), window=2) == {0.01: 3, 0.05: 4, 0.1: 4, 1.0: None}
    assert lc.crossings(kl, (0.01,), window=1) == {0.01: 2}  # exceeds: 0.01 itself is not a crossing
    # only full windows count: [1, 0, 0, 0] smoothed over 2 is [1, 0.5, 0, 0], a crossing at 1, not at 0
    assert lc.crossings([1.0, 0.0, 0.0, 0.0], (0.4, 0.6), window=2) == {0.4: 1, 0.6: None}
    assert lc.crossings([0.0, 0.2], (0.05,), window=10) == {0.05: 1}  # fewer positions than the window: all count


def test_repetition_on_handmade_token_lists():
    assert lc.repeated_ngrams([1, 2, 3, 1, 2, 3], n=2) == pytest.approx(2 / 5)
    assert lc.repeated_ngrams([1, 2, 3, 4, 5], n=4) == 0.0
    assert lc.repeated_ngrams([7] * 10, n=4) == pytest.approx(6 / 7)
    assert lc.repeated_ngrams([1, 2], n=4) == 0.0
    # the last half: only n-grams starting at index >= 4 count, against everything before them
    assert lc.repetition([1, 2, 3, 4, 5, 1, 2, 3, 4], n=4) == {"whole": pytest.approx(1 / 6),
                                                               "last_half": pytest.approx(1 / 2)}


def test_generation_drift_first_divergence(llama):
    model, tok = llama
    updates = list(lc.generation_drift(model, tok, ["int2", "fp16"], new_tokens=24, prompt=TEXT[:40], every=8))
    assert [u.steps_done for u in updates] == [8, 16, 24] and updates[-1].done
    res = updates[-1]
    base = res.baseline_ids
    for name in ("int2", "fp16"):
        ids = res.token_ids[name]
        first = next((i for i, (a, b) in enumerate(zip(base, ids)) if a != b), None)
        assert res.first_divergence[name] == first
        assert 0.0 <= res.top1_differ[name] <= 1.0 and res.kl[name].shape == (23,)
    assert res.first_divergence["int2"] is not None and res.top1_differ["int2"] > res.top1_differ["fp16"]
    assert set(res.repetition) == {"baseline", "int2", "fp16"}
    assert [r["format"] for r in res.rows()] == ["baseline", "int2", "fp16"]


def test_needle_at_length_counts_add_up(llama):
    model, tok = llama
    updates = list(lc.needle_at_length(model, tok, ["int4"], contexts=(280, 320), depths=(0, 0.5, 1),
                                       needles_per_depth=2, text=TEXT, answer_tokens=2))
    assert len(updates) == 4 and updates[-1].done and updates[-1].fraction == 1.0
    res = updates[-1]
    assert res.names == ["baseline", "int4"]
    for c in (280, 320):
        assert res.total[c] == [2, 2, 2] and len(res.values[c]) == 6
        for n in res.names:
            assert len(res.answers[c][n]) == 6
            assert res.found[c][n] == [sum(str(res.values[c][q]) in res.answers[c][n][q].replace(" ", "")
                                           for q in range(d, 6, 3)) for d in range(3)]
    assert len(res.rows()) == 2 * 2 * 3


@torch.no_grad()
def _per_question_answers(model, tok, formats, context: int, depths, per: int, answer_tokens: int) -> dict:
    """The reference: the per-question loop needle_at_length ran before its batch. Each haystack (the same
    haystacks, seed 0) is prefilled once; its K/V load into each format's QuantizedKVCache; each question then goes
    through a copy of the exact cache and of every format's, batch 1, outside row_stable. {name: [answer text]}."""
    plans = lc.parse_formats(formats, model)
    names = ["baseline"] + [p.name for p in plans]
    rng, out = random.Random(0), {n: [] for n in names}
    for k in range(per):
        values = rng.sample(range(10000, 100000), len(depths))
        prompt, questions = needles.haystack(tok, context, depths, [str(v) for v in values],
                                             rotated_filler(TEXT, k, per), answer_tokens)
        exact = needles._prefill(model, prompt)
        caches = [exact] + [load_prefill(QuantizedKVCache(model.config, p), exact) for p in plans]
        for question in questions:
            for n, cache in zip(names, caches):
                run, inp, ids = copy.deepcopy(cache), question, []
                for _ in range(answer_tokens):
                    logits = model(input_ids=inp, cache=run, use_cache=True, logits_to_keep=1).logits
                    ids.append(int(logits[0, -1].argmax()))
                    inp = torch.tensor([[ids[-1]]])
                out[n].append(tok.decode(ids, skip_special_tokens=True))
    return out


@pytest.mark.parametrize("arch, exact_rows, batches", [
    # amber and birch tokenize to 103 bytes, cobalt to 105: per cache a batch of 2 rows and one of 1
    ("llama", None, {"RowStackCache": [2, 1], "QuantizedKVCache": [2, 1] * 4 + [1] * 3}),
    ("llama", 1, {"RowStackCache": [1, 1, 1], "QuantizedKVCache": [2, 1] * 4 + [1] * 3}),  # one exact row a batch
    ("gemma3", None, {"RowStackCache": [2, 1], "QuantizedKVCache": [2, 1] * 4 + [1] * 3}),  # sliding + full layers
])
def test_needle_batch_answers_as_the_per_question_loop(arch, exact_rows, batches, monkeypatch):
    """The batched needle (a batch per cache and question length: exact rows of a RowStackCache, a format's rows
    in one copy of its cache) gives every answer, and so every count, the per-question loop gives, with fused
    formats (int4, k8v4), a per-tensor scale fitted on the prefill (int4/tensor), NVFP4's global scale, and an
    eviction plan, which answers one question at a time (the last three batches of 1)."""
    model, tok = tiny_model(arch)
    if exact_rows is not None:
        monkeypatch.setattr(needles, "BATCH_BYTES", exact_rows * lc.checks.mirror_bytes(model, 300))
    seen: dict = {}
    greedy = needles.greedy

    def recorded(model, cache, questions, answer_tokens):  # the rows each batch runs, by the cache's kind
        seen.setdefault(type(cache).__name__, []).append(questions.shape[0])
        return greedy(model, cache, questions, answer_tokens)

    monkeypatch.setattr(needles, "greedy", recorded)
    formats, depths = ["int4", "k8v4", "int4/tensor", "nvfp4", "int4 @ streaming:0.5"], (0.0, 0.5, 1.0)
    res = _last(lc.needle_at_length(model, tok, formats, contexts=(300,), depths=depths, needles_per_depth=2,
                                    text=TEXT, answer_tokens=4))
    assert seen == {kind: rows * 2 for kind, rows in batches.items()}  # two haystacks
    want = _per_question_answers(model, tok, formats, 300, depths, 2, 4)
    assert res.answers[300] == want
    assert res.found[300] == {n: [sum(str(res.values[300][q]) in want[n][q].replace(" ", "") for q in range(d, 6, 3))
                                  for d in range(3)] for n in res.names}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_needle_memory_counts_the_batch_and_shrinks_it_to_fit(arch):
    """A row's mirror holds every token of every K/V layer (the prefill's bytes, sliding layers' too); the needle's
    estimate counts the prefill, then the exact rows' mirrors or a format's rows, whichever is larger; the exact
    rows shrink to what the free memory holds, down to one, below which the message names the mirrors."""
    model, tok = tiny_model(arch)
    held = needles._prefill(model, torch.arange(1, 41)[None])
    assert lc.checks.mirror_bytes(model, 40) == sum(layer.keys.nbytes + layer.values.nbytes for layer in held.layers)
    plans = lc.parse_formats(["int4", "k8v4"], model)
    one, two = (lc.estimate_memory(model, 300, plans, needles.PREFILL_CHUNK, 10**12, rows=r, questions=3)
                for r in (1, 2))
    assert two.mirror_bytes == 2 * one.mirror_bytes == 2 * lc.checks.mirror_bytes(model, 300)
    assert one.exact_cache_bytes == lc.checks.mirror_bytes(model, 300)  # the prefill keeps every token
    held_in_turn = max(two.mirror_bytes, *two.format_cache_bytes.values())
    assert two.total_bytes == two.model_bytes + two.exact_cache_bytes + held_in_turn + two.transient_bytes
    assert two.total_bytes > one.total_bytes
    assert needles._exact_rows(model, 300, plans, 3, None) == 3
    assert needles._exact_rows(model, 300, plans, 3, (one.total_bytes + two.total_bytes) // 2) == 1
    with pytest.raises(ValueError, match="exact rows' mirrors") as err:
        lc.needle_at_length(model, tok, ["int4", "k8v4"], contexts=(300,), depths=(0.0, 0.5, 1.0),
                            available=one.total_bytes - 1)
    assert f"needs about {one.total_bytes / 1e9:.2f} GB" in str(err.value)


def test_haystack_places_every_needle():
    _, tok = tiny_model("llama")
    prompt, questions = lc.needles.haystack(tok, 300, [0.0, 0.5, 1.0], ["11111", "22222", "33333"], TEXT)
    text = tok.decode(prompt[0].tolist())
    assert prompt.shape[1] + max(q.shape[1] for q in questions) + lc.needles.ANSWER_TOKENS <= 300
    assert text.index("11111") < text.index("22222") < text.index("33333")
    assert "amber" in tok.decode(questions[0][0].tolist())


def test_long_text_repeats_with_a_marker(llama):
    _, tok = llama
    ids, note = lc.long_text_ids(tok, 700, TEXT)
    assert ids.shape == (1, 700) and "repeats" in note
    assert lc.REPEAT_MARKER.strip() in tok.decode(ids[0].tolist())
    assert lc.long_text_ids(tok, 20, TEXT)[1] == ""


@pytest.mark.parametrize("call, says", [
    (lambda m, t: lc.position_drift(m, t, ["int4"], context=2048), "beyond tiny-llama's 1,024 positions"),
    (lambda m, t: lc.position_drift(m, t, ["int4"], context=512, available=10**6), "this machine has"),
    (lambda m, t: lc.position_drift(m, t, ["int9"], context=64), "Unknown KV format 'int9'"),
    (lambda m, t: lc.position_drift(m, t, [], context=64), "at least one KV format"),
    (lambda m, t: lc.position_drift(m, t, ["int4"], context=64, text="  "), "The text is empty"),
    (lambda m, t: lc.generation_drift(m, t, ["int4"], new_tokens=0), "at least 2"),
    (lambda m, t: lc.generation_drift(m, t, ["int4"], new_tokens=-5), "at least 2"),
    (lambda m, t: lc.generation_drift(m, t, ["int4"], new_tokens=1000), "beyond tiny-llama's 1,024 positions"),
    (lambda m, t: lc.needle_at_length(m, t, ["int4"], contexts=(256,), depths=(0.5, 1.5)), "in [0, 1]"),
    (lambda m, t: lc.needle_at_length(m, t, ["int4"], contexts=(256,), depths=()), "none given"),
    (lambda m, t: lc.needle_at_length(m, t, ["int4"], contexts=(256,), needles_per_depth=0), "a whole number"),
    (lambda m, t: lc.needle_at_length(m, t, ["int4"], contexts=(120,)), "too short for 10 needles"),
])
def test_bad_input_is_a_clear_value_error_before_any_compute(llama, call, says):
    model, tok = llama
    with pytest.raises(ValueError, match=None) as err:
        call(model, tok)
    assert says in str(err.value)


def test_memory_message_says_what_it_needs(llama):
    model, _ = llama
    with pytest.raises(ValueError) as err:
        lc.check_context(model, 512, lc.parse_formats(["int4", "k8v4"], model), 64, available=10**6)
    est = lc.estimate_memory(model, 512, lc.parse_formats(["int4", "k8v4"], model), 64, available=10**6)
    assert f"needs about {est.total_bytes / 1e9:.2f} GB" in str(err.value) and "has 0.00 GB free" in str(err.value)
    assert est.format_cache_bytes["int4"] < est.exact_cache_bytes


def test_text_files(tmp_path):
    empty, binary, good = tmp_path / "empty.txt", tmp_path / "data.bin", tmp_path / "good.txt"
    empty.write_text("  \n")
    binary.write_bytes(b"\x00\x01\x02abc")
    good.write_text("Some text.")
    with pytest.raises(ValueError, match="is empty"):
        lc.read_text_file(empty)
    with pytest.raises(ValueError, match="looks binary"):
        lc.read_text_file(binary)
    with pytest.raises(ValueError, match="does not exist"):
        lc.read_text_file(tmp_path / "missing.txt")
    assert lc.read_text_file(good) == "Some text."


def test_cli_writes_csv_and_json(llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kvviz.models, "load_model", lambda name=None: llama)
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "out"
    code = main(["drift", "--formats", "int4,k=int8,v=int4", "--context", "40", "--chunk", "16", "--text-file",
                 str(text), "--window", "8", "--new-tokens", "6", "--needle-contexts", "240", "--depths", "0,1",
                 "--needles-per-depth", "1", "--out", str(out)])
    assert code == 0
    stdout = capsys.readouterr().out
    assert "Damage by position" in stdout and "exact pass" in stdout and "k=int8,v=int4" in stdout
    with (out / "position.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["format", "position", "kl", "top1", "kl_smoothed"] and len(rows) == 2 * 40
    with (out / "position_summary.csv").open() as f:
        summary = list(csv.DictReader(f))
    assert [r["format"] for r in summary] == ["int4", "k=int8,v=int4"]
    assert {"mean_kl", "top1", "cross_0.01", "cross_0.05", "cross_0.1", "seconds"} <= set(summary[0])
    report = json.loads((out / "drift.json").read_text())
    assert report["context"] == 40 and len(report["position"]) == 2 and "generation" in report
    assert report["needle"]["total"]["240"] == [1, 1]
    assert (out / "generation.csv").is_file() and (out / "needle.csv").is_file()
    assert "plotly" in (out / "drift.html").read_text()[:200000].lower()


@pytest.mark.parametrize("args, says", [
    (["--formats", "int9"], "Unknown KV format"),
    (["--new-tokens", "0"], "at least 2"),
    (["--depths", "0,2"], "in [0, 1]"),
    (["--context", "4096"], "beyond tiny-llama's 1,024 positions"),
])
def test_cli_bad_input_one_line_exit_2(llama, monkeypatch, capsys, args, says):
    monkeypatch.setattr(kvviz.models, "load_model", lambda name=None: llama)
    assert main(["drift", "--context", "64", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvviz drift: error:") and says in err[0]


def test_cli_empty_text_file(llama, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kvviz.models, "load_model", lambda name=None: llama)
    (tmp_path / "e.txt").write_text("")
    assert main(["drift", "--text-file", str(tmp_path / "e.txt")]) == 2
    assert "is empty" in capsys.readouterr().err
