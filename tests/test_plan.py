"""Per-layer plans (kvviz.formats.plan): the Plan value and its text form, QuantizedKVCache with a plan (bytes equal
to the memory model), bad plans, and export_plan."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import kvviz
from kvviz.cache.row_stack import RowStackCache
from kvviz.formats import Plan, as_plan, assigns_layers, format_plan, parse_kv, parse_plan
from kvviz.tiny import ByteTokenizer, tiny_config


def _texts(plan):
    return [kv.spec for kv in plan]


@pytest.mark.parametrize("text, expect", [
    ("int4", ["int4"] * 4),
    ("int4; 0,3=fp16", ["fp16", "int4", "int4", "fp16"]),
    ("int8;1-2=int4", ["int8", "int4", "int4", "int8"]),
    ("k8v4; 3=k=int8,v=int8", ["k=int8,v=int4"] * 3 + ["int8"]),
    ("0-1=int8; 2-3=fp8_e4m3", ["int8", "int8", "fp8_e4m3", "fp8_e4m3"]),
    (" int4 ;  ; 0 = fp16 ", ["fp16", "int4", "int4", "int4"]),
])
def test_parse_plan(text, expect):
    assert _texts(parse_plan(text, 4)) == expect


@pytest.mark.parametrize("plan", [
    ["int4"] * 5,
    ["int4", "fp16", "fp16", "int4", "int8"],
    ["k8v4", "k8v4", "kivi2", "k=int4,v=int8", "k8v4"],
    ["fp16", "int4", "fp16", "int4", "fp16"],
])
def test_format_plan_round_trips(plan):
    text = format_plan(plan)
    assert _texts(parse_plan(text, len(plan))) == _texts([parse_kv(s) for s in plan])
    assert [kv.residual for kv in parse_plan(text, len(plan))] == [parse_kv(s).residual for s in plan]


def test_format_plan_is_short():
    assert format_plan(["int4"] * 28) == "int4"
    assert format_plan(["fp16"] + ["int4"] * 26 + ["fp16"]) == "int4; 0,27=fp16"
    assert format_plan(["int8"] * 3 + ["int4"] * 5) == "int4; 0-2=int8"
    assert as_plan(["int4", "int4"]).is_uniform and not as_plan(["int4", "int8"]).is_uniform


def test_plan_is_one_immutable_value_equal_by_meaning():
    plan = as_plan("int4 ; 0,27 = fp16")
    assert isinstance(plan, Plan) and as_plan(plan) is plan  # a Plan passes the boundary as is
    assert plan.text == "int4; 0,27=fp16" and plan.name == "int4 ; 0,27 = fp16" and str(plan) == plan.name
    assert plan == as_plan("int4;27=fp16;0=fp16") and hash(plan) == hash(as_plan("int4;27=fp16;0=fp16"))
    assert as_plan("int4; 3=int4") == as_plan("int4") and as_plan("int4; 3=int4").is_uniform
    assert as_plan("k8v4") == as_plan("k=int8,v=int4") != as_plan("int8")  # the name is a label
    assert as_plan("kivi2") != as_plan(parse_kv("kivi2").spec)  # its residual window is part of what it stores
    assert plan.for_layer(27).spec == "fp16" and plan.for_layer(5).spec == "int4"
    assert [kv.spec for kv in plan.specs] == ["int4", "fp16"]
    assert as_plan(parse_kv("int8")) == as_plan("int8")
    with pytest.raises(AttributeError):
        plan.default = parse_kv("int8")
    # equal per-layer contents on a given model: fitted() writes both the same, shortest way
    fitted = as_plan("int8; 0-2=int4").fitted(4)
    assert fitted == as_plan("int4; 3=int8").fitted(4) == as_plan(["int4"] * 3 + ["int8"])
    assert fitted.text == "int4; 3=int8" and as_plan("int8; 0-2=int4").text == "int8; 0-2=int4"
    with pytest.raises(ValueError, match="3 entries for a model with 4 layers"):
        as_plan(["int4"] * 3).resolve(4)  # a per-layer list fixes its layer count


@pytest.mark.parametrize("text, assigns", [
    ("int4; 0,27=fp16", True),
    ("0-14=int8; 15-29=int4", True),
    ("int4; O=fp16", True),            # a typo in the layers is reported as one, not as an unknown format
    ("k=int8,v=int4", False),
    ("V=int4,K=int8", False),
    ("int4; int8", False),
    ("k8v4; 29=k=int8,v=int8", True),
])
def test_one_rule_says_what_text_assigns_layers(text, assigns):
    assert assigns_layers(text) is assigns

@pytest.mark.parametrize("text, match", [
    ("int4; 4=fp16", "layer 4 does not exist; this model has layers 0-3"),
    ("int4; 0,0=fp16", "names layer 0 twice"),
    ("int4; 0=fp16; 0-1=int8", "names layer 0 twice"),
    ("int4; int8", "two defaults"),
    ("0-1=int8", r"no spec for layers 2-3"),
    ("int4; 3-1=fp16", "runs backwards"),
    ("int4; 1,x=fp16", "'x' is not a layer index"),
    ("int4; 1,=fp16", "not a layer index"),
    ("int4; 1=bogus", "Unknown KV format 'bogus'"),
    ("", "Empty plan"),
])
def test_bad_plan_strings(text, match):
    with pytest.raises(ValueError, match=match):
        parse_plan(text, 4)


def test_plan_list_of_wrong_length():
    with pytest.raises(ValueError, match="3 entries for a model with 4 layers"):
        parse_plan(["int4"] * 3, 4)


@pytest.fixture(scope="module")
def tiny():
    return kvviz.tiny_model("llama")


def _fill(model, cache, ids):
    """First token alone, then the rest: every later position reads the cache."""
    with torch.no_grad():
        model(input_ids=ids[:, :1], cache=cache, use_cache=True)
        model(input_ids=ids[:, 1:], cache=cache, use_cache=True)


@pytest.mark.parametrize("plan", [
    "int4; 1=fp16",
    ["int8", "k=int4,v=int8"],
    "k8v4; 0=k=int4/channel/g16/asym,v=int2/g16/asym",
    ["fp8_e4m3", "nvfp4"],
])
def test_plan_cache_bytes_equal_the_memory_model(tiny, plan):
    model, tok = tiny
    ids = tok("a plan gives each layer its own K and V formats, " * 2, return_tensors="pt")["input_ids"]
    cache = kvviz.QuantizedKVCache(model.config, plan)
    _fill(model, cache, ids)
    layers = parse_plan(plan, model.config.num_hidden_layers)
    expect = kvviz.kv_cache_bytes_for(model.config, ids.shape[1], k=layers, layout="transformers")
    assert cache.nbytes() == expect
    # a different plan holds different bytes: the check above is not trivially true
    assert expect != kvviz.kv_cache_bytes_for(model.config, ids.shape[1], k="fp16", layout="transformers")


def test_plan_cache_matches_uniform_cache_logits(tiny):
    model, tok = tiny
    ids = tok("the same spec on every layer is the uniform cache", return_tensors="pt")["input_ids"]
    outs = []
    for spec in ("int4", "int4; 0-1=int4", ["int4", "int4"]):
        cache = kvviz.QuantizedKVCache(model.config, spec)
        with torch.no_grad():
            model(input_ids=ids[:, :1], cache=cache, use_cache=True)
            outs.append(model(input_ids=ids[:, 1:], cache=cache, use_cache=True).logits)
        assert cache.spec is not None and cache.spec.spec == "int4"
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.testing.assert_close(outs[0], outs[2], rtol=0, atol=0)


def test_exact_layers_in_a_list_plan(tiny):
    model, tok = tiny
    ids = tok("exact layers hold what DynamicCache holds", return_tensors="pt")["input_ids"]
    cache = kvviz.QuantizedKVCache(model.config, [None, None])
    _fill(model, cache, ids)
    cfg = model.config
    assert cache.nbytes() == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * ids.shape[1] * cfg.head_dim * 4


@pytest.mark.parametrize("plan, match", [
    (["int4"] * 3, "3 entries for a model with 2 layers"),
    ("int4; 2=fp16", "layer 2 does not exist"),
    ("int4; 1=q8_0", r"Layer 1 \(full_attention\) K \(head_dim 16\) cannot be stored as q8_0"),
    ("fp16; 0=k=int4,v=mxfp4", r"Layer 0 \(full_attention\) V \(head_dim 16\) cannot be stored as mxfp4"),
])
def test_bad_plans_in_the_cache(tiny, plan, match):
    model, _ = tiny
    with pytest.raises(ValueError, match=match):
        kvviz.QuantizedKVCache(model.config, plan)


def test_export_plan_vllm_skip_layers():
    from kvviz.export import export_plan

    out = export_plan("fp8_e4m3/token; 0,27=fp16", 28, "Qwen/Qwen2.5-7B")
    assert out["vllm"]["supported"]
    assert out["vllm"]["flags"].endswith("--kv-cache-dtype-skip-layers 0 27")
    assert out["vllm"]["cli"].startswith("vllm serve Qwen/Qwen2.5-7B --kv-cache-dtype ")
    assert "kv_cache_dtype_skip_layers=['0', '27']" in out["vllm"]["python"]
    assert not out["sglang"]["supported"] and "cannot express the per-layer plan" in out["sglang"]["note"]
    assert not out["llama.cpp"]["supported"] and "cannot express" in out["llama.cpp"]["note"]


@pytest.mark.parametrize("plan, why", [
    ("fp8_e4m3; 0=int8", "2 quantized formats"),                 # two formats: no engine
    ("int4; 0,27=fp16", "which vLLM cannot store"),               # one format vLLM lacks
    ("fp8_e4m3; 0=k=fp16,v=fp8_e4m3", "2 quantized formats"),    # half a layer skipped
])
def test_export_plan_says_when_no_engine_can(plan, why):
    from kvviz.export import export_plan

    out = export_plan(plan, 28)
    assert not any(out[e]["supported"] for e in out)
    assert why in out["vllm"]["note"] and out["vllm"]["flags"] == ""


def test_export_uniform_plan_is_the_spec():
    from kvviz.export import export_commands, export_plan

    assert export_plan("fp8_e4m3; 0-3=fp8_e4m3", 4) == export_commands("fp8_e4m3")


# ------------------------------------------------------------------------------------------ engine dtypes in plans

@pytest.mark.parametrize("text, assigns", [
    ("llama.cpp:k=q8_0,v=q4_0", False),           # an engine's pair name: its `=` opens no layers
    ("llama.cpp:k=q8_0,v=q4_0/norot", False),
    ("vllm:turboquant_4bit_nc; 0-1=fp16", True),
    ("int4; 5=llama.cpp:k=q8_0,v=q4_0", True),
])
def test_engine_names_inside_plans(text, assigns):
    assert assigns_layers(text) is assigns
    plan = as_plan(text)
    assert as_plan(plan.text) == plan


def test_engine_names_resolve_in_plans():
    assert as_plan("llama.cpp:k=q8_0,v=q4_0").is_uniform
    assert as_plan("llama.cpp:k=q8_0,v=q4_0").default == parse_kv("llama.cpp:k=q8_0,v=q4_0")
    layers = parse_plan("int4; 5=llama.cpp:k=q8_0,v=q4_0", 8)
    assert layers[5].spec == "llama.cpp:k=q8_0,v=q4_0" and layers[4].spec == "int4"
    with pytest.raises(ValueError, match="vllm has no KV cache dtype 'int3'.*vllm's values: auto"):
        as_plan("int4; 2=vllm:int3")
    with pytest.raises(ValueError, match="Unknown engine 'tensorrt'"):
        as_plan("tensorrt:fp8")


def test_turboquant_keeps_a_dense_models_boundary_layers_in_16_bits():
    """vLLM's get_boundary_skip_layers(n=2): the first and last 2 layers of a dense model, at most half of them;
    none on a hybrid (a layer with a recurrent state)."""
    plan = as_plan("vllm:turboquant_4bit_nc")
    specs = _texts(plan.resolve(8))
    assert specs == ["vllm:auto"] * 2 + ["vllm:turboquant_4bit_nc"] * 4 + ["vllm:auto"] * 2
    assert _texts(plan.resolve(8, ["sliding_attention", "full_attention"] * 4)) == specs  # sliding is attention
    assert _texts(plan.resolve(3)) == ["vllm:auto", "vllm:turboquant_4bit_nc", "vllm:auto"]  # min(2, 3 // 2)
    hybrid = ["linear_attention", "full_attention"] * 4
    assert _texts(plan.resolve(8, hybrid)) == ["vllm:turboquant_4bit_nc"] * 8
    assert plan.fitted(30).text == "vllm:turboquant_4bit_nc; 0-1,28-29=vllm:auto"
    assert plan.fitted(30) == as_plan("vllm:turboquant_4bit_nc; 0-1,28-29=vllm:auto").fitted(30)
    # only the layers that hold the TurboQuant value; other engine values keep every layer
    assert _texts(parse_plan("fp16; 2-5=vllm:turboquant_3bit_nc", 8))[1:3] == ["fp16", "vllm:turboquant_3bit_nc"]
    assert _texts(as_plan("vllm:int4_per_token_head").resolve(8)) == ["vllm:int4_per_token_head"] * 8
    with pytest.raises(ValueError, match="layer_types lists 2 layers for a model of 8"):
        plan.resolve(8, ["full_attention"] * 2)


def _tiny_with(arch, layers, **overrides):
    config = tiny_config(arch, num_hidden_layers=layers, **overrides)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="kvviz").eval()
    return model, ByteTokenizer()


@pytest.mark.parametrize("arch, overrides, skipped", [
    ("llama", {}, [0, 1, 4, 5]),
    ("gemma3", {"layer_types": ["sliding_attention", "full_attention"] * 3}, [0, 1, 4, 5]),
    ("qwen3_next", {"layer_types": ["linear_attention", "full_attention"] * 3}, []),  # hybrid: none
])
def test_turboquant_cache_and_memory_model_agree(arch, overrides, skipped):
    model, tok = _tiny_with(arch, 6, **overrides)
    ids = tok("the engine keeps its boundary layers in sixteen bits", return_tensors="pt")["input_ids"]
    cache = kvviz.QuantizedKVCache(model.config, "vllm:turboquant_4bit_nc")
    kv_layers = [i for i, kv in enumerate(cache.plan) if kv is not None and cache.layers[i].__class__.__name__
                 .startswith("Quantized")]
    sixteen = [i for i in kv_layers if cache.plan[i].spec == "vllm:auto"]
    assert sixteen == skipped and len(kv_layers) > len(sixteen)
    _fill(model, cache, ids)
    expect = kvviz.kv_cache_bytes_for(model.config, ids.shape[1], k="vllm:turboquant_4bit_nc", layout="transformers")
    assert cache.nbytes() == expect
    every_layer = kvviz.kv_cache_bytes_for(model.config, ids.shape[1], k=["vllm:turboquant_4bit_nc"] * 6,
                                           layout="transformers")
    assert expect == every_layer  # a list of engine values obeys the same rule
    # rows of the plan written out, and of the value, share one cache (equal as this model stores them)
    written = "vllm:turboquant_4bit_nc" + (f"; {','.join(map(str, skipped))}=vllm:auto" if skipped else "")
    stack = RowStackCache(model.config, [as_plan("vllm:turboquant_4bit_nc"), as_plan(written)])
    assert stack.row_caches[0] is stack.row_caches[1]


def test_memory_table_counts_turboquant_boundary_layers():
    """A 30-layer dense model: 26 TurboQuant layers and 4 in 16 bits, each as vLLM's page size counts it."""
    row, = kvviz.memory.memory_table("smollm2-135m", ["vllm:turboquant_4bit_nc"], 1024)
    kv = parse_kv("vllm:turboquant_4bit_nc")
    heads, dim = 3, 64  # SmolLM2-135M: 3 KV heads of 64
    tq = 26 * 1024 * heads * sum(f.nbytes_for((1, 1, 1, dim)) for f in (kv.k, kv.v))
    assert row["bytes"] == tq + 4 * 1024 * heads * 2 * dim * 2
    assert row["k_bits"] > kv.k.bits_per_value(dim)  # the 16-bit layers raise the mean


def test_export_plan_of_engine_values():
    from kvviz.export import export_plan

    out = export_plan("vllm:turboquant_4bit_nc", 30, "M")  # the engine's own rule: exactly its flag
    assert out["vllm"]["supported"] and out["vllm"]["flags"] == "--kv-cache-dtype turboquant_4bit_nc"
    out = export_plan(as_plan("vllm:turboquant_4bit_nc; 7=fp16").fitted(30), 30, "M")
    assert out["vllm"]["flags"] == "--kv-cache-dtype turboquant_4bit_nc --kv-cache-dtype-skip-layers 7"
    out = export_plan("vllm:int4_per_token_head; 0,29=fp16", 30, "M")
    assert out["vllm"]["flags"] == "--kv-cache-dtype int4_per_token_head --kv-cache-dtype-skip-layers 0 29"
    assert not export_plan("vllm:fp8; 3=vllm:turboquant_3bit_nc", 30)["vllm"]["supported"]


def test_kld_applies_the_engine_rule_as_the_cache_does():
    """quality.kld (the prefix-tree rows) stores what QuantizedKVCache stores: a TurboQuant value is its plan with
    the boundary layers written out, and differs from TurboQuant in every layer."""
    from kvviz.quality import kld

    model, tok = _tiny_with("llama", 6)
    text = "the engine keeps its boundary layers in sixteen bits, and the middle ones in four " * 2
    specs = ["vllm:turboquant_4bit_nc", "vllm:turboquant_4bit_nc; 0-1,4-5=vllm:auto", "vllm:auto"]
    out = kld(model, tok, specs, text=text, windows=1, window_tokens=64)
    means = [out[s]["mean"] for s in specs]
    assert means[0] == pytest.approx(means[1], rel=1e-6) and means[0] > 2 * means[2] > 0
