"""Tests for kvviz.cli.bench: the CLI wiring, argument checks and the markdown table (the full run is `make bench`)."""

from __future__ import annotations

import argparse

import pytest
import torch

from kvviz.cli import bench
from kvviz.quality.decode import WARMUP
from kvviz.cli import build_parser


def _result():
    row = dict(tokens_per_s=10.0, speed_vs_dynamic=1.0, mean_kl=0.0, top1=1.0)
    return {
        "rows": {
            "DynamicCache": dict(row, kind="exact", bits=16, bytes=2**20),  # a bf16 model's cache
            "tf fp8 (per-tensor)": dict(row, kind="transformers", tokens_per_s=5.0, speed_vs_dynamic=0.5,
                                        mean_kl=0.0058, top1=0.951),
            "k8v4": dict(row, kind="kvviz", bits=6.5, bytes=1000, model_bytes=1000, mean_kl=0.01, top1=0.9),
        },
        "side_by_side": {"formats": ["fp8", "int4"], "tokens": 32, "seconds": 6.0, "baseline_seconds": 3.0,
                         "ratio": 2.0},
        "meta": {"date": "2026-01-01", "machine": "2 CPU cores", "backend": "torch", "context": 1024,
                 "decode_tokens": 8, "rounds": 2, "prompts": 3, "prompt_tokens": 128, "tf_tokens": 64,
                 "prefill_s": 1.0, "torch_threads": 2, "model": "SmolLM2-135M-Instruct"},
    }


def test_markdown_table():
    text = bench.markdown(_result())
    lines = text.splitlines()
    assert "2 CPU cores" in lines[0] and "2026-01-01" in lines[0]
    assert lines[2].startswith("| cache |") and len([l for l in lines if l.startswith("| ")]) == 4
    assert "| kvviz `k8v4` | 6.5 | 10.00 | 1.00x |" in text and "+0.00%" in text and "95.1%" in text
    assert "| DynamicCache | 16 | 10.00 | 1.00x | 1.00 MiB |" in text  # measured bits, not a fixed 32
    assert "(2.00x)" in lines[-1]


def test_cli_registers_bench():
    args = build_parser().parse_args(["bench", "--quick", "--formats", "fp8,k8v4"])
    assert args.command == "bench" and args.quick and args.formats == "fp8,k8v4"


def test_run_rejects_bad_numbers():
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    with pytest.raises(ValueError, match="--tf-tokens"):
        bench.run(p.parse_args(["--tf-tokens", "0"]))


def test_default_formats_cover_bases_and_presets():
    from kvviz.formats import FORMAT_NAMES, PRESETS

    assert bench.default_formats() == [*FORMAT_NAMES, *PRESETS]


def test_a_stale_quanto_build_lock_skips_the_quanto_rows(tmp_path, monkeypatch, capsys):
    """An interrupted build of optimum-quanto's extension leaves build/lock behind and torch waits on it forever:
    the bench names the file and skips those rows instead of hanging."""
    import importlib.util
    import types

    real = importlib.util.find_spec
    fake = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: fake if name == "optimum.quanto" else real(name, *a))
    assert not bench._quanto_locked()
    lock = tmp_path / "library" / "extensions" / "cpp" / "build" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    assert bench._quanto_locked()
    out = capsys.readouterr().out
    assert str(lock) in out and "Delete it" in out


def test_run_prints_one_line_per_scale_problem_and_format(monkeypatch, capsys):
    """The caches warn once per layer side (60 times per format on SmolLM2): the bench merges them into one line
    per problem and format after its table, and lets other warnings through."""
    import warnings

    from kvviz.cache import ScaleWarning

    def fake_run_bench(*args, **kwargs):
        for layer in range(30):
            for side in "KV":
                warnings.warn(ScaleWarning("few", "few_tokens", "fp8_e4m3", f"layer {layer} {side}", tokens=32))
        warnings.warn(ScaleWarning("sat", "saturated", "fp8_e4m3", "layer 7 K", count=3, total=192))
        warnings.warn(UserWarning("something else"))
        return _result()

    monkeypatch.setattr(bench, "run_bench", fake_run_bench)
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    with pytest.warns(UserWarning, match="something else"):
        assert bench.run(p.parse_args(["--formats", "fp8_e4m3"])) == 0
    out = capsys.readouterr().out.splitlines()
    warned = [line for line in out if line.startswith("Warning:")]
    assert len(warned) == 2 and out[-2:] == warned
    assert "fitted on 32 token(s)" in warned[0] and "(60 layer sides)" in warned[0] and "fp8_e4m3" in warned[0]
    assert "at least 3 values saturated" in warned[1] and "`" not in warned[1]


def test_contexts_tables_say_what_they_measured():
    """--contexts: per context tokens/s, ratio, ceiling and its share, ms per layer; the machine and its load."""
    from kvviz.cli import bench_contexts

    row = dict(tokens_per_s=10.0, ratio=1.0, vs_static=0.8, bytes=200e6, ceiling=1.0, share=0.8, update_ms=0.6,
               attention_ms=0.5)
    static = dict(row, tokens_per_s=12.5, ratio=1.25, vs_static=1.0, share=1.0, update_ms=0.02)
    fused = dict(row, tokens_per_s=15.0, ratio=1.5, vs_static=1.2, bytes=25e6, ceiling=1.3, share=1.2 / 1.3,
                 update_ms=0.01)
    result = {"contexts": {4096: {"DynamicCache": row, "StaticCache": static, "int4": fused}}, "rounds": {4096: 8},
              "weights_bytes": 538e6, "load_start": (4.0, 5.0, 6.0), "load_end": (7.0, 8.0, 9.0)}
    text = bench_contexts.markdown(result, "2 CPU cores")
    assert "2 CPU cores" in text and "4.00 / 5.00 / 6.00" in text and "7.00 / 8.00 / 9.00" in text
    assert "Context 4096 tokens, 8 rounds:" in text
    assert "| vs DynamicCache | vs StaticCache |" in text
    assert "| int4 | 15.00 | 1.50x | 1.20x | 25.0 MB | 1.30x | 92% | 0.010 | 0.500 |" in text
    assert "| StaticCache | 12.50 | 1.25x | 1.00x | 200.0 MB | 1.00x | 100% | 0.020 | 0.500 |" in text
    peer = bench_contexts.llama_cpp_markdown({4096: {("f16", "f16"): 20.0, ("q4_0", "q4_0"): 25.0}})
    assert "| 4096 | q4_0/q4_0 | 25.00 | 1.25x |" in peer


@pytest.mark.parametrize("contexts", ["1k", "8", ","])
def test_contexts_refuses_bad_lists(contexts):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    with pytest.raises(ValueError, match="--contexts"):
        bench.run(p.parse_args(["--contexts", contexts]))


def test_contexts_json_into_a_missing_folder_is_refused_before_the_run(tmp_path):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    with pytest.raises(ValueError, match="does not exist; create it or pick another path"):
        bench.run(p.parse_args(["--contexts", "1024", "--json", str(tmp_path / "nowhere" / "m.json")]))


def test_contexts_json_is_what_lesson_7_reads(tmp_path, monkeypatch):
    """--json writes the run with its command, date and machine; kvviz.quality reads it back by model name."""
    from kvviz.cli import bench_contexts
    from kvviz.quality import speed

    row = dict(tokens_per_s=10.0, ratio=1.0, bytes=200e6, ceiling=1.0, share=1.0, update_ms=0.6, attention_ms=0.5)
    result = {"contexts": {1024: {"DynamicCache": row}, 4096: {"DynamicCache": dict(row, tokens_per_s=8.0)}},
              "weights_bytes": 538e6, "load_start": (1.0, 1.0, 1.0), "load_end": (1.5, 1.0, 1.0)}
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--contexts", "1024,4096", "--json", str(tmp_path / "m.json")])
    command = bench._contexts_command(args)
    assert command.startswith("python -m kvviz bench --contexts 1024,4096 --decode-tokens 6") and "--json" in command
    assert "--rounds 3" in bench._contexts_command(p.parse_args(["--contexts", "1024", "--rounds", "3"]))
    result["rounds"] = {c: bench.context_rounds(c) for c in (1024, 4096)}
    assert result["rounds"] == {1024: bench.SHORT_CONTEXT_ROUNDS, 4096: bench.CONTEXT_ROUNDS}
    assert 24 == result["rounds"][1024] > result["rounds"][4096]
    bench_contexts.write_json(args.json, result, model="m", machine="2 CPU cores", decode_tokens=6, command=command)
    monkeypatch.setattr(speed, "RECORDED", tmp_path)
    recorded = speed.recorded_by_context("m")
    assert recorded["command"] == command and recorded["machine"] == "2 CPU cores" and "UTC" in recorded["date"]
    assert recorded["timing"] == bench_contexts.TIMING
    assert recorded["contexts"]["4096"]["DynamicCache"]["tokens_per_s"] == 8.0
    assert recorded["rounds"] == {"1024": 24, "4096": bench.CONTEXT_ROUNDS}
    assert speed.recorded_by_context("another-model") is None


def test_the_bundled_model_s_recorded_run_covers_lesson_7_s_curve():
    """The shipped record (kvviz/quality/recorded/smollm2-135m.json): 1K to 8K, DynamicCache, StaticCache and
    int4 / k8v4 with their ceilings, and the command that made it."""
    from kvviz.quality import recorded_by_context

    from kvviz.cli.bench_contexts import TIMING

    recorded = recorded_by_context("smollm2-135m")
    assert recorded["command"].startswith("python -m kvviz bench --contexts") and recorded["timing"] == TIMING
    assert sorted(int(c) for c in recorded["contexts"]) == [1024, 2048, 4096, 8192]
    for rows in recorded["contexts"].values():
        assert rows["DynamicCache"]["ratio"] == 1.0 and rows["StaticCache"]["vs_static"] == 1.0
        assert all(rows[f]["ceiling"] > 1.0 and rows[f]["tokens_per_s"] > 0 for f in ("int4", "k8v4"))


def _name_decodings(monkeypatch) -> None:
    """Each quality.Decoding made while the test runs carries `.name`: its spec, or "DynamicCache"."""
    from kvviz import quality

    init = quality.Decoding.__init__

    def named(run, model, prefilled, spec, *args, **kwargs):
        run.name = spec or "DynamicCache"
        init(run, model, prefilled, spec, *args, **kwargs)

    monkeypatch.setattr(quality.Decoding, "__init__", named)


def test_speed_by_context_times_each_cache_alone_in_rotating_rounds(monkeypatch):
    """Per round every cache takes two untimed and then its timed steps alone, one cache after another, each round
    starting one cache later, then one step with its layers timed (the timed steps run without those timers); each
    row holds the cache's bytes, speed, ceiling and per-layer times."""
    from transformers.cache_utils import DynamicLayer

    from kvviz import quality, tiny_model
    from kvviz.cli import bench_contexts

    model, _ = tiny_model("llama")
    order = []
    original, update = quality.Decoding.step, DynamicLayer.update

    def step(run):
        order.append((run.name, DynamicLayer.update is not update))  # (cache, its layers timed)
        return original(run)

    monkeypatch.setattr(quality.Decoding, "step", step)
    _name_decodings(monkeypatch)
    ids = torch.randint(1, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    result = bench_contexts.speed_by_context(model, ids, ["int4", "k8v4"], [24, 40], decode_tokens=3,
                                             rounds={24: 2, 40: 1})
    names = ["DynamicCache", "StaticCache", "int4", "k8v4"]
    block = [False] * (WARMUP + 3) + [True]  # untimed and timed steps, then the one timed per layer
    first_round = [(n, layers) for n in names for layers in block]
    second_round = [(n, layers) for n in names[1:] + names[:1] for layers in block]  # one cache later
    assert order == first_round + second_round + first_round  # 2 rounds at 24 tokens, 1 at 40
    assert result["rounds"] == {24: 2, 40: 1}
    for context, rows in result["contexts"].items():
        assert list(rows) == names and rows["DynamicCache"]["ratio"] == 1.0 and rows["StaticCache"]["vs_static"] == 1.0
        assert rows["int4"]["bytes"] < rows["k8v4"]["bytes"] < rows["DynamicCache"]["bytes"]
        # the StaticCache holds the prompt, the warm-up and timed steps and the step timed per layer: not a row more
        assert rows["StaticCache"]["bytes"] == rows["DynamicCache"]["bytes"]
        for row in rows.values():
            assert row["tokens_per_s"] > 0 and row["attention_ms"] > 0 and row["update_ms"] > 0
            assert row["ceiling"] == pytest.approx((result["weights_bytes"] + rows["DynamicCache"]["bytes"])
                                                   / (result["weights_bytes"] + row["bytes"]))


def test_speed_by_context_is_one_over_the_median_step(monkeypatch):
    """One slow step (a burst of other work) does not move a cache's speed: the median sets it aside."""
    from kvviz import quality, tiny_model
    from kvviz.cli import bench_contexts

    model, _ = tiny_model("llama")
    ticks = {"DynamicCache": [0.1, 0.1, 0.1, 5.0], "StaticCache": [0.08, 0.08, 0.08, 0.08],
             "int4": [0.05, 0.05, 0.05, 0.05]}
    monkeypatch.setattr(quality, "step_times", lambda run, steps: ticks[run.name][:steps])
    _name_decodings(monkeypatch)
    ids = torch.randint(1, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    rows = bench_contexts.speed_by_context(model, ids, ["int4"], [16], decode_tokens=4, rounds=1)["contexts"][16]
    assert rows["DynamicCache"]["tokens_per_s"] == pytest.approx(10.0) and rows["int4"]["ratio"] == pytest.approx(2.0)
    assert rows["int4"]["vs_static"] == pytest.approx(1.6) and rows["DynamicCache"]["vs_static"] == pytest.approx(0.8)
    assert rows["int4"]["share"] == pytest.approx(1.6 / rows["int4"]["ceiling"])
