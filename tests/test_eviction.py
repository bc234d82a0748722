"""Eviction on QuantizedKVCache (kvviz.cache.eviction) and its plan syntax (kvviz.formats.eviction): policies that
keep every token decode DynamicCache's tokens per architecture family, policies at 0.5 keep the tokens they say
(streaming: sinks + window, knorm: the smallest norms, snapkv: the top scores of a direct computation from eager
attention weights), mixed precision stores the rest in the low format, bytes equal the memory model, positions and
masks stay right after compression, and bad input gets its message.

    python -m pytest tests/test_eviction.py -q
"""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import DynamicCache

from kvviz.cache import QuantizedKVCache, evicting_layers
from kvviz.cache.eviction import gather
from kvviz.cache.row_stack import RowStackCache
from kvviz.formats import POLICIES, as_plan, get_format
from kvviz.memory import fit_keep, kv_cache_bytes_for, split_formats
from kvviz.quality import compare, needle
from kvviz.tiny import tiny_model

T = 20  # context tokens: longer than the tiny windows (8), so sliding layers cut on their own
PROMPT = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(0))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@functools.lru_cache(maxsize=None)
def _model(arch: str = "llama", dtype: torch.dtype = torch.float32):
    return tiny_model(arch, dtype=dtype)


def _prefill(arch: str, spec: str, dtype=torch.float32):
    model, _ = _model(arch, dtype)
    cache = QuantizedKVCache(model.config, spec)
    model(input_ids=PROMPT, cache=cache, use_cache=True)
    return model, cache


def _full_layers(cache):
    return [layer for layer in cache.layers if getattr(layer, "evict", None) is not None]


# ------------------------------------------------------------------------------------------ the syntax

@pytest.mark.parametrize("text, canonical", [
    ("int4 @ snapkv:0.50,window=32", "int4 @ snapkv:0.5"),
    ("fp16@streaming:0.25,sinks=4", "fp16 @ streaming:0.25"),
    ("int4 @ knorm:0.5,rest=int2", "int4 @ knorm:0.5,rest=int2"),
    ("int4; 0=fp16 @ random:0.5,seed=3", "int4; 0=fp16 @ random:0.5,seed=3"),
    ("k8v4 @ snapkv:1,kernel=3,window=8", "k8v4 @ snapkv:1,window=8,kernel=3"),
])
def test_syntax_round_trips(text, canonical):
    plan = as_plan(text)
    assert plan.text == canonical and as_plan(plan.text) == plan
    assert plan != as_plan(canonical.partition(" @")[0])  # the eviction is part of what the plan stores
    assert plan.fitted(4).evict == plan.evict


@pytest.mark.parametrize("text, message", [
    ("int4 @ snapkv:1.5", "must be in (0, 1]"),
    ("int4 @ snapkv:0", "must be in (0, 1]"),
    ("int4 @ h2o:0.5", "the policies are streaming, snapkv, knorm, random"),
    ("int4 @ snapkv", "gives no keep ratio"),
    ("int4 @ snapkv:0.5,sinks=2", "is not an option of snapkv"),
    ("int4 @ snapkv:0.5,kernel=4", "must be odd"),
    ("@ knorm:0.5", "names no format before '@'"),
    ("int4 @ knorm:0.5 @ knorm:0.2", "write one eviction, last"),
])
def test_syntax_rejects_bad_input(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        as_plan(text)


def test_split_formats_keeps_an_evictions_options():
    assert split_formats("fp16,int4 @ snapkv:0.5,window=16,rest=int2,k8v4") == [
        "fp16", "int4 @ snapkv:0.5,window=16,rest=int2", "k8v4"]


# ------------------------------------------------------------------------------------------ exactness at keep 1

FAMILIES = ("llama", "gemma2", "qwen3_next", "falcon_h1")  # full; sliding + full; linear hybrid; Mamba hybrid


@pytest.mark.parametrize("arch", FAMILIES)
def test_keeping_every_token_decodes_dynamic_caches_tokens(arch):
    model, _ = _model(arch, torch.float16)
    want = model.generate(input_ids=PROMPT, max_new_tokens=6, do_sample=False, cache=DynamicCache(config=model.config))
    for policy in POLICIES:
        cache = QuantizedKVCache(model.config, f"fp16 @ {policy}:1")
        got = model.generate(input_ids=PROMPT, max_new_tokens=6, do_sample=False, cache=cache)
        assert torch.equal(got, want), policy
        assert all(layer.kept_index.shape[2] == T for layer in _full_layers(cache))


def test_a_model_of_sliding_layers_only_says_the_policy_changes_nothing():
    model, _ = _model("mistral")
    assert evicting_layers(model.config) == [] and evicting_layers(_model("gemma2")[0].config) == [1]
    with pytest.raises(ValueError, match="already keeps only its last window"):
        QuantizedKVCache(model.config, "int4 @ knorm:0.5")


# ------------------------------------------------------------------------------------------ what is kept

def test_streaming_keeps_sinks_and_the_recent_window():
    _, cache = _prefill("gemma2", "fp16 @ streaming:0.5,sinks=3")
    kept = T // 2
    want = list(range(3)) + list(range(T - (kept - 3), T))
    for layer in _full_layers(cache):
        assert layer.kept_index.shape[-1] == kept
        assert (layer.kept_index == torch.tensor(want)).all()
        assert layer.k.seen == kept and layer.get_seq_length() == T


def test_knorm_keeps_the_smallest_key_norms_and_stores_those_keys():
    model, cache = _prefill("llama", "fp16 @ knorm:0.5", torch.float16)
    dyn = DynamicCache(config=model.config)
    model(input_ids=PROMPT, cache=dyn, use_cache=True)
    for i, layer in enumerate(cache.layers):
        keys = dyn.layers[i].keys  # [1, H, T, D], post-RoPE, as the cache saw them
        want = (-keys.float().norm(dim=-1)).topk(T // 2, dim=-1).indices.sort(dim=-1).values
        assert torch.equal(layer.kept_index, want)
        assert torch.equal(layer.k.packed().dequantize(), gather(keys, want))  # fp16 of an fp16 model: exact


def test_snapkv_keeps_the_top_scores_of_eager_attention():
    """The scores computed directly: eager attention's weights of the last w queries, averaged over them,
    avg-pooled over the kernel and averaged over each KV head's group of query heads; the window kept."""
    model, cache = _prefill("llama", "int8 @ snapkv:0.5,window=4,kernel=3")
    model.set_attn_implementation("eager")
    try:
        probs = model(input_ids=PROMPT, output_attentions=True).attentions  # per layer [1, Hq, T, T]
    finally:
        model.set_attn_implementation("kvviz")
    w, k = 4, 3
    for layer, p in zip(cache.layers, probs):
        s = p[:, :, -w:, : T - w].mean(dim=2)  # [1, Hq, T - w]
        s = torch.nn.functional.avg_pool1d(s, k, stride=1, padding=k // 2)
        h = layer.kept_index.shape[1]
        s = s.reshape(1, h, -1, T - w).mean(dim=2)  # [1, H, T - w]
        want = torch.cat([s.topk(T // 2 - w, dim=-1).indices, torch.arange(T - w, T).expand(1, h, w)], dim=-1)
        assert torch.equal(layer.kept_index, want.sort(dim=-1).values)


@pytest.mark.parametrize("policy", ["random:0.5", "knorm:0.5", "snapkv:0.5,window=4"])
def test_every_head_keeps_the_same_count(policy):
    _, cache = _prefill("qwen3_next", f"int4 @ {policy}")
    for layer in _full_layers(cache):
        assert layer.kept_index.shape == (1, 2, T // 2)
        assert layer.k.packed().data.shape[2] == T // 2


def test_mixed_precision_stores_the_rest_in_the_low_format():
    model, cache = _prefill("llama", "fp16 @ knorm:0.25,rest=int2", torch.float16)
    dyn = DynamicCache(config=model.config)
    model(input_ids=PROMPT, cache=dyn, use_cache=True)
    int2 = get_format("int2")
    for i, layer in enumerate(cache.layers):
        kept = layer.kept_index.shape[-1]
        assert kept == 5 and layer._rest.tokens == T - kept and layer._dropped == 0
        assert layer._rest.k.fmt.spec == int2.spec and layer.get_seq_length() == T
        mask = torch.ones(1, 2, T, dtype=torch.bool)
        mask.scatter_(-1, layer.kept_index, False)
        rest_keys = dyn.layers[i].keys[mask].reshape(1, 2, T - kept, -1)
        assert torch.equal(layer._rest.k.packed().dequantize(), int2.quantize(rest_keys).dequantize())


def test_a_rest_in_the_plans_own_format_reads_as_the_plain_format():
    """Per-token int4 quantizes each token alone, so keeping the 'dropped' tokens in int4 too holds and reads
    exactly what plain int4 does (up to the order of attention's sums): the mixed path loses nothing on its own."""
    model, _ = _model("llama")
    outs, held = [], []
    for spec in ("int4", "int4 @ knorm:0.5,rest=int4", "int4 @ snapkv:0.3,window=4,rest=int4"):
        cache = QuantizedKVCache(model.config, spec)
        model(input_ids=PROMPT, cache=cache, use_cache=True)
        chunk = model(input_ids=torch.tensor([[65, 66, 67]]), cache=cache, use_cache=True).logits
        step = model(input_ids=torch.tensor([[70]]), cache=cache, use_cache=True).logits
        outs.append(torch.cat([chunk, step], dim=1))
        held.append(cache.nbytes())
    assert held[0] == held[1] == held[2]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------ positions and masks

@pytest.mark.parametrize("spec", ["fp16 @ streaming:0.5", "fp16 @ knorm:0.5,rest=int4"])
def test_a_chunk_after_compression_reads_as_its_tokens_one_by_one(spec):
    """The question as one chunk equals feeding it a token at a time (where no mask is needed): the mask over
    the compressed cache keeps the chunk causal, and its positions continue from the full context."""
    model, _ = _model("llama")
    chunk = torch.tensor([[65, 66, 67, 68, 69]])
    a = QuantizedKVCache(model.config, spec)
    model(input_ids=PROMPT, cache=a, use_cache=True)
    together = model(input_ids=chunk, cache=a, use_cache=True).logits[0]
    b = QuantizedKVCache(model.config, spec)
    model(input_ids=PROMPT, cache=b, use_cache=True)
    apart = torch.cat([model(input_ids=chunk[:, i:i + 1], cache=b, use_cache=True).logits[0] for i in range(5)])
    torch.testing.assert_close(together, apart, atol=1e-4, rtol=1e-4)
    assert a.get_seq_length() == T + 5


# ------------------------------------------------------------------------------------------ loaded from a prefill

LOADED = ["fp16 @ streaming:0.5,sinks=2", "int4 @ snapkv:0.5,window=4", "int8 @ snapkv:0.3,window=6,kernel=3",
          "int4 @ knorm:0.5", "int4 @ random:0.6", "int4 @ snapkv:0.5,window=4,rest=int2",
          "int8 @ streaming:0.3,rest=int2", "k8v4 @ knorm:0.4,rest=int2"]


def _stored(cache) -> list:
    """Everything a cache's K/V layers store: kept indices, the packed fields of both sides and of a rest store."""
    out = []
    for layer in cache.layers:
        if not hasattr(layer, "k"):
            continue
        sides = [layer.k, layer.v] + ([layer._rest.k, layer._rest.v] if layer._rest is not None else [])
        fields = [getattr(layer, "kept_index", None), layer.get_seq_length()]
        for side in sides:
            q = side.packed()
            fields += [q.data, q.scale, q.zero, q.tensor_scale, q.tail]
        out.append(fields)
    return out


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("arch, spec", [(arch, spec) for arch in ("llama", "gemma2", "gemma3") for spec in LOADED]
                         + [("falcon_h1", spec) for spec in LOADED[:2] + LOADED[-3:-1]])  # its hybrid layers
def test_a_cache_loaded_from_the_exact_prefill_stores_what_its_own_prefill_stores(arch, spec):
    """Equal bytes loads every candidate from one exact prefill (kvviz.quality.decode.load_prefill; snapkv scored by
    the queries the prefill kept): each layer keeps the same tokens and stores the same bits as a cache that
    prefilled the context itself, and the next chunk reads the same logits. Two rows: each compressed on its own."""
    from kvviz.quality.decode import load_prefill, prefill
    model, _ = _model(arch)
    prompts = torch.cat([PROMPT, PROMPT.flip(1)]) if arch != "falcon_h1" else PROMPT  # states load from batch 1
    plan = as_plan(spec)
    own = QuantizedKVCache(model.config, plan)
    model(input_ids=prompts, cache=own, use_cache=True)
    window = plan.evict.window if plan.evict.policy == "snapkv" else 0
    exact, _ = prefill(model, prompts, queries=window)
    loaded = load_prefill(QuantizedKVCache(model.config, plan), exact)
    mine, theirs = _stored(loaded), _stored(own)
    assert len(mine) == len(theirs) and any(f[0] is not None for f in mine), "layers that evict"
    for i, (a, b) in enumerate(zip(mine, theirs)):
        assert all(_same(x, y) for x, y in zip(a, b)), f"layer {i}: {[_same(x, y) for x, y in zip(a, b)]}"
    assert loaded.nbytes() == own.nbytes()
    chunk = torch.tensor([[65, 66, 67]]).expand(prompts.shape[0], -1)
    assert torch.equal(model(input_ids=chunk, cache=loaded, use_cache=True).logits,
                       model(input_ids=chunk, cache=own, use_cache=True).logits)


def test_load_prefill_takes_one_row_and_asks_for_the_queries_snapkv_scores_by():
    from kvviz.quality.decode import load_prefill, prefill
    model, _ = _model("llama")
    prompts = torch.cat([PROMPT, PROMPT.flip(1)])
    exact, _ = prefill(model, prompts, queries=4)
    both = load_prefill(QuantizedKVCache(model.config, "int4 @ snapkv:0.5,window=4"), exact)
    second = load_prefill(QuantizedKVCache(model.config, "int4 @ snapkv:0.5,window=4"), exact, row=1)
    for a, b in zip(_full_layers(both), _full_layers(second)):
        assert torch.equal(a.kept_index[1:], b.kept_index) and b.kept_index.shape[0] == 1
    model(input_ids=torch.tensor([[1], [2]]), cache=exact, use_cache=True)  # tokens after the prompt: not recorded
    assert all(q.shape == (2, q.shape[1], 4, q.shape[3]) for q, _ in exact.queries.values())
    with pytest.raises(ValueError, match="queries=window"):
        load_prefill(QuantizedKVCache(model.config, "int4 @ snapkv:0.5,window=4"), prefill(model, PROMPT)[0])
    with pytest.raises(AssertionError, match="window of 6 queries, given the last 4"):
        load_prefill(QuantizedKVCache(model.config, "int4 @ snapkv:0.5,window=6"), exact)


# ------------------------------------------------------------------------------------------ bytes

@pytest.mark.parametrize("arch", ["llama", "gemma2", "falcon_h1"])
@pytest.mark.parametrize("spec", ["int4 @ snapkv:0.5,window=4", "k8v4 @ streaming:0.3,sinks=2", "int8 @ knorm:0.4",
                                  "int4 @ random:0.5", "int4 @ knorm:0.5,rest=int2",
                                  "fp8_e5m2/token @ streaming:0.25,rest=int2",
                                  "k=int2/channel/g16/asym,v=int4 @ random:0.6,rest=int2/channel/g16"])
def test_bytes_equal_the_memory_model(arch, spec):
    _, cache = _prefill(arch, spec)
    model, _ = _model(arch)
    assert cache.nbytes() == kv_cache_bytes_for(model.config, T, k=spec, layout="transformers")


def test_fit_keep_finds_the_largest_ratio_within_the_budget():
    config = _model("llama")[0].config
    budget = kv_cache_bytes_for(config, 100, k="fp16", layout="transformers") // 4
    assert fit_keep(config, "fp16 @ snapkv:1", budget, 100) == 0.25
    keep = fit_keep(config, "int8 @ knorm:1,rest=int2", budget, 100)
    at = lambda r: kv_cache_bytes_for(config, 100, k=f"int8 @ knorm:{r},rest=int2", layout="transformers")  # noqa
    assert at(keep) <= budget < at(keep + 0.01)
    with pytest.raises(ValueError, match="No keep ratio .* fits 10 bytes"):
        fit_keep(config, "fp16", 10, 100)


# ------------------------------------------------------------------------------------------ bad input at run time

def test_a_snapkv_window_longer_than_the_prompt_is_refused():
    model, _ = _model("llama")
    with pytest.raises(ValueError, match="window of 32 queries is not shorter than the 20-token context"):
        model(input_ids=PROMPT, cache=QuantizedKVCache(model.config, "int4 @ snapkv:0.5"), use_cache=True)


def test_row_batches_refuse_eviction_plans():
    model, _ = _model("llama")
    with pytest.raises(ValueError, match="evicts context tokens"):
        RowStackCache(model.config, [None, as_plan("int4 @ knorm:0.5")])


# ------------------------------------------------------------------------------------------ compare and needle

def test_compare_and_needle_run_eviction_plans_beside_the_batch():
    model, tok = _model("llama")
    report = compare(model, tok, "the quick brown fox jumps over it", ["fp16", "fp16 @ knorm:1", "int4 @ knorm:0.25"],
                     max_new_tokens=4)
    exact, kept_all, quarter = report.formats
    assert kept_all.token_ids == exact.token_ids and float(kept_all.kl.max()) < 1e-4
    assert quarter.cache_bytes < exact.cache_bytes / 4 and quarter.spec == "int4 @ knorm:0.25"
    res = needle(model, tok, ["fp16", "fp16 @ streaming:1"], context_tokens=200, depths=(0.5,), answer_tokens=3)
    assert res["answers"]["fp16 @ streaming:1"] == res["answers"]["fp16"]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_needle_alone_answers_as_each_plans_own_cache_prefilling_each_haystack(arch):
    """needle(alone=True) (Equal bytes) prefills the haystacks once and loads each plan's cache from it, the
    haystacks as its rows: every answer is the one a batch-1 cache of the plan gives prefilling its own haystack
    (and the baseline's, a DynamicCache's), as the needle ran them before."""
    from kvviz.quality.decode import prefill
    from kvviz.quality.needle import haystack
    model, tok = _model(arch)
    specs = ["int4 @ snapkv:0.5,window=8", "fp16 @ streaming:0.4,rest=int2", "int4 @ knorm:0.3", "int4", "int2"]
    res = needle(model, tok, specs, context_tokens=160, depths=(0.0, 0.5, 1.0), answer_tokens=4,
                 text="the quick brown fox jumps over the lazy dog " * 40, alone=True)
    for i, (depth, value) in enumerate(zip(res["trial_depths"], res["needles"])):
        prompt, question = haystack(tok, 160, depth, value, "the quick brown fox jumps over the lazy dog " * 40)
        for name in ["baseline", *specs]:
            if name == "baseline":
                cache, _ = prefill(model, prompt)
            else:
                cache = QuantizedKVCache(model.config, name)
                model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
            inp, ids = question, []
            for _ in range(4):
                inp = model(input_ids=inp, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
                ids.append(int(inp))
            assert res["answers"][name][i] == tok.decode(ids, skip_special_tokens=True), (name, depth)


def test_no_engine_flag_claims_an_eviction():
    from kvviz.export import export_plan
    from kvviz.quality.report import engine_flag
    assert engine_flag(as_plan("fp8_e4m3")) is not None and engine_flag(as_plan("fp8_e4m3 @ knorm:0.5")) is None
    with pytest.raises(ValueError, match="no engine flag evicts"):
        export_plan("fp8_e4m3 @ knorm:0.5", 2)


def test_single_format_views_refuse_an_eviction_rather_than_drop_it():
    from kvviz.ui import checks
    with pytest.raises(ValueError, match="also evicts tokens"):
        checks.check_spec("int4 @ snapkv:0.5")
    assert [p.name for p in checks.spec_list([], "int4 @ snapkv:0.5\nfp16", limit=4)] == ["int4 @ snapkv:0.5", "fp16"]
