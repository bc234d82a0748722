"""Tests for kvviz.quality on tiny random-weight models: exact specs score KL 0 / top-1 1, lossy ones do not, the
batched per-row-format decode equals each format's own cache, perplexity and needle run end to end."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from kvviz import quality
from kvviz.cache import QuantizedKVCache
from kvviz.formats import as_plan
from kvviz.memory import kv_cache_bytes_for
from kvviz.models import tiny_model
from kvviz.tiny import TINY_ARCHS
from kvviz.quality.decode import WARMUP
from kvviz.quality.speed import EXACT, FUSED

PROMPT = "The quick brown fox jumps over the lazy dog. " * 3
LOSSY = ["int2", "k=int8,v=int4", "int4/channel/g32/asym", "fp8_e4m3", "nvfp4"]


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")


@pytest.mark.parametrize("dtype,exact", [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_full_precision_spec_is_exact(dtype, exact):
    model, tok = tiny_model("llama", dtype=dtype)
    report = quality.compare(model, tok, PROMPT, [exact, "int2"], max_new_tokens=16)
    full, lossy = report.formats
    assert full.mean_kl == 0.0 and full.top1_rate == 1.0 and full.first_divergence is None
    assert full.text == report.baseline_text and full.token_ids == report.baseline_ids
    assert lossy.mean_kl > 0.0 and lossy.kl.shape == (15,) and lossy.top1.shape == (15,)


def test_report_fields(tiny):
    model, tok = tiny
    report = quality.compare(model, tok, PROMPT, ["fp16", *LOSSY], max_new_tokens=12, speed_tokens=2)
    assert len(report.baseline_ids) == 12 and report.prompt_tokens == len(tok.encode(PROMPT))
    assert report.speed_backend in ("torch", "triton", "cpu") and "batched" in report.metrics_backend
    rows = {r["format"]: r for r in report.table()}
    assert list(rows) == ["fp16", *LOSSY]
    assert rows["fp16"]["bytes_vs_baseline"] == pytest.approx(0.5)  # fp16 of an fp32 model
    assert rows["int2"]["cache_bytes"] < rows["fp8_e4m3"]["cache_bytes"] < rows["fp16"]["cache_bytes"]
    assert all(r["tokens_per_s"] > 0 for r in rows.values()) and report.baseline_tokens_per_s > 0
    assert rows["int2"]["mean_kl"] > rows["fp8_e4m3"]["mean_kl"] > 0
    for f in report.formats:
        if f.first_divergence is not None:
            assert f.token_ids[: f.first_divergence] == report.baseline_ids[: f.first_divergence]
            assert f.token_ids[f.first_divergence] != report.baseline_ids[f.first_divergence]
    table = report.rows()  # the baseline first, byte ratios as numbers
    assert [r.name for r in table] == ["baseline", "fp16", *LOSSY] and table[0].baseline and table[0].kl_mean == 0
    assert table[0].bytes_vs_16bit == pytest.approx(2.0) and table[0].spec == "float32"  # an fp32 model
    assert table[1].bytes_vs_16bit == pytest.approx(1.0) and table[1].bytes_vs_exact == pytest.approx(0.5)
    assert all(r.perplexity is None for r in table)
    ppl = report.rows({"baseline": 10.0, "fp16": 10.0, **{n: 11.0 for n in LOSSY}})
    assert [r.perplexity for r in ppl] == [10.0, 10.0, *[11.0] * len(LOSSY)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        table[1].kl_mean = 0.0


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_batched_rows_match_each_formats_own_cache(tiny, arch):
    """The batched per-row-format decode gives the KL a format's own QuantizedKVCache gives alone, on sliding
    windows and chunks shorter than the prompt (rows whose caches evict), on MLA's latents (layers that hand
    back dequantized tensors), beside linear-attention and Mamba states (Qwen3-Next, Falcon-H1) and with layers
    that reuse an earlier layer's K/V (Gemma 4) too. The baseline's bytes are what a DynamicCache holds."""
    model, tok = tiny if arch == "llama" else tiny_model(arch)
    specs = LOSSY if arch == "llama" else ["int2/g16", "k=int8,v=int4", "int4/channel/g8/asym", "fp8_e4m3", "nvfp4"]
    report = quality.compare(model, tok, PROMPT, specs, max_new_tokens=10)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    cont = torch.tensor([report.baseline_ids])
    with torch.no_grad():  # the batch's exact row decodes what the model itself generates (windows included)
        ref = model.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0)[0, ids.shape[1]:].tolist()
    assert report.baseline_ids == ref
    base_cache, _ = quality.prefill(model, ids)
    with torch.no_grad():
        base = torch.cat([model(input_ids=cont[:, i : i + 1], cache=base_cache).logits[:, -1] for i in range(9)])
        for result in report.formats:
            dyn, _ = quality.prefill(model, ids)
            cache = quality.load_prefill(QuantizedKVCache(model.config, result.name), dyn)
            logits = torch.cat([model(input_ids=cont[:, i : i + 1], cache=cache).logits[:, -1] for i in range(9)])
            kl, top1 = quality.kl_top1(base, logits)
            np.testing.assert_allclose(kl.numpy(), result.kl, rtol=1e-3, atol=1e-6)
            assert cache.nbytes() == result.cache_bytes
        dyn = quality.load_prefill(DynamicCache(config=model.config), quality.prefill(model, ids)[0])
        for i in range(9):
            model(input_ids=cont[:, i : i + 1], cache=dyn)
    held = [t for layer in dyn.layers if getattr(layer, "keys", None) is not None for t in (layer.keys, layer.values)]
    assert report.baseline_bytes == sum(t.numel() * t.element_size() for t in held)


@pytest.mark.parametrize("arch", ["llama", "qwen3_next", "falcon_h1", "gemma4"])
def test_free_running_rows_are_each_formats_own_greedy_decode(tiny, arch):
    """A format's free-running row joins the batch at its first divergence, copied from its teacher-forced row: its
    tokens are what its own cache generates greedily, fed its own picks from the start. On hybrids the copy
    carries the row's linear-attention / Mamba states too."""
    model, tok = tiny if arch == "llama" else tiny_model(arch)
    specs = ["int2", "fp8_e4m3", "int4/channel/g8/asym"] if arch == "llama" else ["int2/g16", "fp8_e4m3", "k8v4"]
    report = quality.compare(model, tok, PROMPT, specs, max_new_tokens=12)
    assert report.formats[0].first_divergence is not None  # the copy is exercised
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    for result in report.formats:
        dyn, logits = quality.prefill(model, ids)
        cache = quality.load_prefill(QuantizedKVCache(model.config, result.name), dyn)
        own = [int(logits.argmax(-1))]
        with torch.no_grad():
            for _ in range(11):
                step = model(input_ids=torch.tensor([[own[-1]]]), cache=cache).logits[:, -1]
                own.append(int(step.argmax(-1)))
        assert result.token_ids == own, result.name


def test_select_rows_copies_a_row_that_then_decodes_on_its_own(tiny):
    """RowStackCache.select_rows([0, 1, 1]): the copy shares its format's cache (now of batch 2), holds the same
    bytes, and fed the same tokens gives the same logits as the row it was copied from."""
    model, tok = tiny
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    stack = quality.RowStackCache(model.config, [None, as_plan("int4/channel/g8/asym")])
    stack.load_prefill(quality.prefill(model, ids)[0])
    with torch.no_grad():
        for t in (5, 6, 7):
            model(input_ids=torch.tensor([[t], [t]]), cache=stack)
        stack.select_rows([0, 1, 1])
        assert stack.row_caches[1] is stack.row_caches[2] and stack.row_nbytes(2) == stack.row_nbytes(1)
        side = stack.row_caches[1].layers[0].k
        assert side.tail.shape[0] == 2 and torch.equal(side.tail[0], side.tail[1])
        for t in (8, 9, 10, 11):
            logits = model(input_ids=torch.tensor([[t], [t], [t]]), cache=stack).logits[:, -1]
            torch.testing.assert_close(logits[2], logits[1])
    layer = stack.layers[0]
    assert layer.keys.shape[0] == 3 and torch.equal(layer.keys[1], layer.keys[2])


def test_stream_yields_every_step_then_the_report(tiny):
    model, tok = tiny
    updates = list(quality.compare_stream(model, tok, PROMPT, ["int4", "fp8"], max_new_tokens=6))
    assert [u.step for u in updates] == [0, 1, 2, 3, 4, 5, 5]
    assert all(u.report is None for u in updates[:-1]) and updates[-1].report is not None
    assert set(updates[2].texts) == {"int4", "fp8"}
    assert len(updates[-1].baseline) >= len(updates[1].baseline)


def test_compare_takes_a_per_layer_plan(tiny):
    """A plan is one row: its cache holds each layer in its own format (bytes between the two uniform specs),
    its bits per value are the layers' mean; a uniform plan is the spec itself."""
    model, tok = tiny
    report = quality.compare(model, tok, PROMPT, ["int4", "int4; 1=fp16", "int4; 0-1=int4", "fp16"],
                             max_new_tokens=4)
    int4, plan, same, fp16 = report.formats
    assert plan.spec == "int4; 1=fp16" and same.spec == "int4"
    assert int4.cache_bytes < plan.cache_bytes < fp16.cache_bytes
    assert plan.cache_bytes == (int4.cache_bytes + fp16.cache_bytes) // 2  # 2 layers: one of each
    assert plan.bits_per_value == pytest.approx((int4.bits_per_value + fp16.bits_per_value) / 2)
    assert same.cache_bytes == int4.cache_bytes
    with pytest.raises(ValueError, match="layer 2 does not exist"):
        quality.compare(model, tok, PROMPT, ["int4; 2=fp16"], max_new_tokens=4)


@pytest.mark.parametrize("kwargs", [dict(specs=[]), dict(specs="int4"), dict(specs=["int3"]),
                                    dict(specs=["int4"], max_new_tokens=1), dict(specs=["int4"], prompt="")])
def test_compare_rejects_bad_input(tiny, kwargs):
    model, tok = tiny
    args = dict(prompt=PROMPT, max_new_tokens=4) | kwargs
    with pytest.raises(ValueError):
        quality.compare(model, tok, **args)


def test_kl_top1():
    a = torch.tensor([[2.0, 0.0, -1.0]])
    kl, top1 = quality.kl_top1(a, a)
    assert kl.item() == 0.0 and top1.item()
    kl, top1 = quality.kl_top1(a, torch.tensor([[0.0, 2.0, -1.0]]))
    assert kl.item() > 0 and not top1.item()


def test_perplexity(tiny):
    model, tok = tiny
    res = quality.perplexity(model, tok, ["bf16", "int2"], windows=2, window=48, prefill_tokens=16, chunk=8)
    assert list(res["ppl"]) == ["baseline", "bf16", "int2"] and res["tokens_scored"] == 64
    assert res["ppl"]["baseline"] > 1 and res["ppl"]["int2"] != res["ppl"]["baseline"]
    assert res["ppl"]["bf16"] == pytest.approx(res["ppl"]["baseline"], rel=0.05)
    with pytest.raises(ValueError, match="windows"):
        quality.perplexity(model, tok, ["int4"], windows=1000, window=512)
    with pytest.raises(ValueError):
        quality.perplexity(model, tok, ["int4"], window=16, prefill_tokens=16)


def test_prefill_shared_runs_each_shared_prefix_once_and_holds_what_one_prefill_holds(tiny):
    """Prompts that share their first tokens (a needle at two depths of one filler, the deeper one twice, and a
    prompt of its own) prefill each shared run once, batched by span, and hold the K/V of one prefill of their batch
    (up to float32 rounding: the matrix products' shapes differ), rows in order."""
    from kvviz.quality.decode import prefill_shared

    model, _ = tiny
    g = torch.Generator().manual_seed(0)
    filler = torch.randint(5, 200, (1, 64), generator=g)
    needle = torch.tensor([[1, 2, 3, 4]])
    deep, shallow = (torch.cat([filler[:, :at], needle, filler[:, at:60]], dim=1) for at in (40, 20))
    other = torch.randint(5, 200, (1, 64), generator=g)
    prompts = [shallow, deep, other, deep]  # deep twice: one row of work, two rows of K/V
    ran = []
    real = model.forward

    def forward(*args, **kwargs):
        ran.append(tuple(kwargs["input_ids"].shape))
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model, "forward", forward)
        shared = prefill_shared(model, prompts)
    # the filler's first 20 tokens once; after them both needles' runs over positions 20..63 as one batch (the
    # deep prompt once for its two rows); the other prompt alone: 172 tokens of 4 x 64
    assert sorted(ran) == [(1, 20), (1, 64), (2, 44)], ran
    whole, _ = quality.prefill(model, torch.cat(prompts))
    for mine, theirs in zip(shared.layers, whole.layers):
        assert mine.keys.shape == theirs.keys.shape == (4, *theirs.keys.shape[1:])
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mine.values, theirs.values, rtol=1e-5, atol=1e-5)
        assert torch.equal(mine.keys[1], mine.keys[3])
    alone = prefill_shared(model, [other, shallow])  # nothing shared: one pass, the batch's own cache
    for mine, theirs in zip(alone.layers, quality.prefill(model, torch.cat([other, shallow]))[0].layers):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


def test_needle_runs(tiny):
    model, tok = tiny
    res = quality.needle(model, tok, ["fp16", "int2"], context_tokens=160, depths=(0.0, 1.0), answer_tokens=3)
    assert list(res["retrieved"]) == ["baseline", "fp16", "int2"]
    assert all(len(v) == 2 for v in res["retrieved"].values()) and len(res["needles"]) == 2
    assert res["rate"] == {n: sum(hits) / len(hits) for n, hits in res["retrieved"].items()}  # share of depths found
    prompt, question = quality.haystack(tok, 200, 0.5, "12345")
    assert abs(prompt.shape[1] + question.shape[1] - 200) <= 2
    with pytest.raises(ValueError):
        quality.haystack(tok, 20, 0.5, "1")
    with pytest.raises(ValueError):
        quality.haystack(tok, 200, 1.5, "1")


@pytest.mark.parametrize("arch", ["qwen3_next", "falcon_h1", "gemma4"])
def test_metrics_run_beside_states_and_shared_kv(arch):
    """Perplexity, the needle test and fused-against-unfused on models whose caches hold linear-attention or Mamba
    states (Qwen3-Next, Falcon-H1) or layers that reuse another layer's K/V (Gemma 4): a 16-bit cache scores as
    the baseline does and decodes its tokens, and the bytes read count only the layers that hold K/V."""
    model, tok = tiny_model(arch)
    res = quality.perplexity(model, tok, ["bf16", "int2/g16"], windows=1, window=48, prefill_tokens=16, chunk=8)
    assert res["ppl"]["bf16"] == pytest.approx(res["ppl"]["baseline"], rel=0.05)
    assert res["ppl"]["int2/g16"] != res["ppl"]["baseline"]
    res = quality.needle(model, tok, ["fp16"], context_tokens=160, depths=(0.5,), answer_tokens=3)
    assert list(res["retrieved"]) == ["baseline", "fp16"] and len(res["retrieved"]["fp16"]) == 1
    report = quality.fused_vs_unfused(model, quality.wikitext_ids(tok, 40), ["fp16", "int4/g16"], new_tokens=3,
                                      rounds=1)
    dyn = report.run("DynamicCache", EXACT)
    assert report.run("fp16", FUSED).tokens == dyn.tokens and report.same_tokens("int4/g16")
    tokens = 40 + 3 + WARMUP  # the prompt, the warm-up steps' tokens and the timed steps'
    assert dyn.bytes_read == kv_cache_bytes_for(model.config, tokens, k="fp16", layout="transformers") * 2  # fp32


def test_rows_of_one_spec_share_one_batched_cache(tiny):
    """RowStackCache batches rows of one spec in one cache; each row still holds (and counts) what it would alone."""
    model, tok = tiny
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    stack = quality.RowStackCache(model.config, [None, *map(as_plan, ["int4", "int4", "fp8_e4m3"])])
    stack.load_prefill(quality.prefill(model, ids)[0])
    assert [len(layer.groups) for layer in stack.layers] == [2] * len(stack.layers)
    assert stack.row_caches[1] is stack.row_caches[2] is not stack.row_caches[3]
    for row, spec in ((1, "int4"), (3, "fp8_e4m3")):
        alone = quality.load_prefill(QuantizedKVCache(model.config, spec), quality.prefill(model, ids)[0])
        assert stack.row_nbytes(row) == alone.nbytes()


MIRRORED = ["int4", "int8", "int2", "int4/g32", "int4/token/asym", "int8/token/asym", "int2/token/asym", "k8v4",
            "fp8_e4m3", "fp8_e5m2", "fp8_e4m3/token", "fp8_e4m3/head", "int4/tensor", "int8/head", "mxfp4",
            "fp4_mx_block16", "nvfp4"]


def _rows_decoded(config, states, fast: bool):
    """A RowStackCache layer (row 0 exact, two rows per MIRRORED spec) fed the prefill and decode tokens `states`;
    fast=False turns kernels/cpu/mirror.py's one-call path off (the two-step path: pack, then the torch decode)."""
    from kvviz.cache.layers import QuantizedKVLayer

    with pytest.MonkeyPatch.context() as mp:
        if not fast:
            mp.setattr(QuantizedKVLayer, "append_mirrored", lambda self, *args: False)
        stack = quality.RowStackCache(config, [None, *(as_plan(s) for s in MIRRORED for _ in range(2))])
        layer = stack.layers[0]
        for k, v in states:
            layer.update(k, v)
    return stack, layer


def test_rows_append_and_mirror_in_one_call_as_the_two_step_path_does():
    """Decode tokens of batched rows take one numba call per side (kernels/cpu/mirror.py) for the formats it reads:
    the mirror attention reads, the packed buffers, the saturation counts and the bytes held equal the two-step
    path's (quant_pack_cpu, then kvviz.formats' torch decode of the new row), bit for bit."""
    from kernels.cpu import mirror
    from kvviz.tiny import tiny_config

    if not mirror.supports(as_plan("int4").default.k, 64):
        pytest.skip("numba is not installed: no one-call path to compare")
    config = tiny_config("llama", head_dim=64)
    rows, heads = 1 + 2 * len(MIRRORED), config.num_key_value_heads
    gen = torch.Generator().manual_seed(0)
    big = torch.ones(64)
    big[[3, 17]] = 30.0  # outlier channels: decode tokens beyond the prefill's fp8 range saturate
    states = [(torch.randn(rows, heads, 12, 64, generator=gen), torch.randn(rows, heads, 12, 64, generator=gen))]
    states += [(torch.randn(rows, heads, 1, 64, generator=gen) * big, torch.randn(rows, heads, 1, 64, generator=gen))
               for _ in range(5)]
    fast, fast_layer = _rows_decoded(config, states, True)
    slow, slow_layer = _rows_decoded(config, states, False)
    assert torch.equal(fast_layer.keys, slow_layer.keys) and torch.equal(fast_layer.values, slow_layer.values)
    for (a, _), (b, _) in zip(fast_layer.groups, slow_layer.groups):
        assert a.k._mirror is not None and a.v._mirror is not None, a.k.fmt.spec  # the one-call path ran
        assert b.k._mirror is None
        for side_a, side_b in ((a.k, b.k), (a.v, b.v)):
            assert side_a.fields.keys() == side_b.fields.keys()
            for name in side_a.fields:
                assert torch.equal(side_a.fields[name].view(), side_b.fields[name].view()), (side_a.fmt.spec, name)
            assert (side_a.saturated, side_a.tokens_quantized) == (side_b.saturated, side_b.tokens_quantized)
    assert any(g.k.saturated for g, _ in fast_layer.groups)  # the static fp8 rows did saturate
    assert [fast.row_nbytes(r) for r in range(rows)] == [slow.row_nbytes(r) for r in range(rows)]


# the quality package's floors, bottom first: a module imports only modules on lower floors
FLOORS = [("corpus", "decode", "report", "evicted"), ("compare", "perplexity", "speed"), ("needle", "divergence"),
          ("equal_bytes",)]


def test_quality_imports_go_one_way_and_never_from_inside_a_function():
    floor = {name: i for i, names in enumerate(FLOORS) for name in names}
    root = Path(quality.__file__).parent
    assert set(floor) == {p.stem for p in root.glob("*.py")} - {"__init__"}
    for name, level in floor.items():
        tree = ast.parse((root / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                inner = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
                assert not inner, f"quality/{name}.py imports inside {node.name}()"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvviz.quality."):
                other = node.module.split(".")[2]
                assert floor[other] < level, f"quality/{name}.py imports quality/{other}.py, not on a lower floor"


def test_quality_map_marks_the_pareto_frontier_and_engine_flags():
    from kvviz.quality.report import CompareRow, quality_map

    def row(name, bits, kl, baseline=False):
        return CompareRow(name, baseline, name, bits, kl, kl, kl, 1.0, None, 1, 1.0, 1.0, None, None, "",
                          None if baseline else as_plan(name))

    points = quality_map([row("exact (baseline)", 32, 0.0, True), row("fp8_e4m3", 8, 0.002), row("int8", 8.25, 0.003),
                          row("int4", 4.25, 0.05), row("int4; 0=fp16", 4.6, 0.01), row("q4_0", 4.5, 0.06)])
    assert [p.name for p in points] == ["fp8_e4m3", "int8", "int4", "int4; 0=fp16", "q4_0"]
    assert {p.name for p in points if p.frontier} == {"fp8_e4m3", "int4", "int4; 0=fp16"}  # int8, q4_0 dominated
    flags = {p.name: p.engine_flag for p in points}
    assert flags["q4_0"] == "llama.cpp -ctk q4_0 -ctv q4_0 -fa on" and flags["int4; 0=fp16"] is None
    assert flags["fp8_e4m3"].startswith("vllm ") or flags["fp8_e4m3"].startswith("sglang ")


def test_a_prefill_of_several_prompts_tiles_the_rows_in_place(tiny):
    """load_prefill of P prompts gives row r prompt r % P (format-major tiling, the needle test's layout), read
    from the prefill's rows in place: every row's packed bytes and mirror are those of loading the prefill tiled
    by a copy; a count of prompts that does not divide the rows is refused."""
    model, tok = tiny
    ids = tok([PROMPT, PROMPT.upper()], return_tensors="pt", padding=True)["input_ids"][:, :12]  # [2, 12]
    specs = [None, None] + [as_plan("int4")] * 2 + [as_plan("int4/tensor")] * 2
    dyn, _ = quality.prefill(model, ids)
    tiled = quality.RowStackCache(model.config, specs, own={4, 5})
    tiled.load_prefill(dyn, reserve=3)
    for layer in dyn.layers:
        layer.keys, layer.values = layer.keys.repeat(3, 1, 1, 1), layer.values.repeat(3, 1, 1, 1)
    copied = quality.RowStackCache(model.config, specs, own={4, 5})
    copied.load_prefill(dyn, reserve=3)
    for mine, theirs, prompts in zip(tiled.layers, copied.layers, dyn.layers):
        n = mine.get_seq_length()
        assert n == theirs.get_seq_length() == 12
        assert torch.equal(mine.keys[:, :, :n], theirs.keys[:, :, :n])
        assert torch.equal(mine.values[:, :, :n], theirs.values[:, :, :n])
        assert torch.equal(mine.keys[:2, :, :n], prompts.keys[:2])  # the exact rows: the prompts as prefilled
    for row in range(2, 6):
        for a, b in zip(tiled.row_caches[row].layers, copied.row_caches[row].layers):
            for side in ("k", "v"):
                assert torch.equal(getattr(a, side).fields["data"].view(), getattr(b, side).fields["data"].view())
    with pytest.raises(ValueError, match="does not tile"):
        quality.RowStackCache(model.config, specs[:5]).load_prefill(quality.prefill(model, ids)[0])


def test_rows_marked_own_fit_their_own_scale(tiny):
    """Rows of one plan share a batched cache, except rows marked `own` (the needle test's per-tensor rows, one per
    haystack): each of those fits its per-tensor scale on its own states and reads as the same cache alone."""
    model, tok = tiny
    ids = tok([PROMPT, PROMPT.upper()], return_tensors="pt", padding=True)["input_ids"][:, :12]  # [2, 12]
    dyn, _ = quality.prefill(model, ids)
    for layer in dyn.layers:  # rows: int4 x 2 haystacks, int4/tensor x 2 haystacks
        layer.keys, layer.values = layer.keys.repeat(2, 1, 1, 1), layer.values.repeat(2, 1, 1, 1)
    specs = [as_plan("int4")] * 2 + [as_plan("int4/tensor")] * 2
    stack = quality.RowStackCache(model.config, specs, own={2, 3})
    assert stack.row_caches[0] is stack.row_caches[1]
    assert stack.row_caches[2] is not stack.row_caches[3] and stack.row_caches[2] is not stack.row_caches[0]
    stack.load_prefill(dyn)
    nxt = torch.tensor([[5], [7], [5], [7]])
    logits = model(input_ids=nxt, cache=stack, use_cache=True).logits[:, -1]
    for row in (2, 3):
        alone = quality.load_prefill(QuantizedKVCache(model.config, "int4/tensor"),
                                     quality.prefill(model, ids[row - 2:row - 1])[0])
        want = model(input_ids=nxt[row:row + 1], cache=alone, use_cache=True).logits[0, -1]
        assert torch.allclose(logits[row], want, atol=1e-4), row
