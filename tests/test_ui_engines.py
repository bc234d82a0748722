"""Tests for kvviz.ui.engines (the Compare tab's engine view, api_name engine_compare) and for the library's
static-scale warnings reaching the user (kvviz.ui.common.ScaleNotes in Compare and Export).

The API tests run the app on the bundled SmolLM2 (tests/app_server.py) and call real llama.cpp through
llama-cpp-python on its GGUF (in the app's llama.cpp worker process; one test kills it and expects the next call
answered), with 32 tokens and one cache type so the call takes seconds. Bad input must come back as a message
before anything runs.

Run: python -m pytest tests/test_ui_engines.py -q
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
import time
import urllib.request
import warnings
from pathlib import Path

import gradio as gr
import pytest
import torch
from gradio_client import Client

from app_server import serve_app
from kvviz.cache import ScaleWarning
from kvviz.cache.sides import MIN_FIT_TOKENS, Side
from kvviz.formats import get_format
from kvviz.engines import servers, verdict
from kvviz.ui import common, engines

GOOD = (["q8_0"], 32, False, "smollm2-135m")


# --- in-process: checks, messages, warnings merged ---------------------------------------------------------------


@pytest.mark.parametrize("pairs, expected", [
    (["q8_0", "k=q8_0,v=q4_0", "q8_0"], ["q8_0", "k=q8_0,v=q4_0"]),  # duplicates dropped, order kept
    (["k=q4_0,v=q4_0", "q4_0"], ["k=q4_0,v=q4_0"]),  # the same pair written twice
    (["k=iq4_nl,v=q5_1"], ["k=iq4_nl,v=q5_1"]),  # any pair of the six types, not only the checkboxes'
])
def test_check_pairs_accepts_llama_cpp_types(pairs, expected):
    assert engines.check_pairs(pairs) == expected


@pytest.mark.parametrize("pairs, message", [
    (["int4"], "must be one of q8_0, q4_0"),
    (["k=q8_0,v=int4"], "got 'k=q8_0,v=int4'"),
    (["q8_0/rot"], "must be one of"),
    (["no-such-type"], "must be one of"),
    ([], "Pick at least one"),
    (None, "Pick at least one"),
    ("q8_0", "must be a list of names"),
    ([3], "must hold names"),
    (list(engines.PAIR_TYPES) + ["k=q8_0,v=q4_0"], "at most 6"),
])
def test_check_pairs_refuses_with_a_message(pairs, message):
    with pytest.raises(ValueError, match=message):
        engines.check_pairs(pairs)


def test_a_model_without_gguf_is_refused_with_what_to_serve(use_runtime):
    use_runtime(KVVIZ_MODEL="tiny-llama")
    with pytest.raises(gr.Error, match="tiny-llama is a random test model.*KVVIZ_MODEL=smollm2-135m"):
        engines.run(["q8_0"], 32, False, "tiny-llama")


def test_missing_llama_cpp_python_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` now raises ImportError
    with pytest.raises(gr.Error, match="pip install llama-cpp-python==0.3.36"):
        engines.run(*GOOD)


def _states(tokens: int, amax: float, seed: int = 0) -> torch.Tensor:
    x = torch.randn(1, 2, tokens, 16, generator=torch.Generator().manual_seed(seed))  # [B, H, T, D]
    return x / x.abs().max() * amax


def test_scale_notes_merge_every_layer_side_into_one_line_per_format():
    notes = common.ScaleNotes()
    counts = []
    with notes.catching():
        for layer in range(3):
            for side_name in ("K", "V"):
                x = _states(MIN_FIT_TOKENS, 1000.0, seed=layer)
                counts.append(int((x.abs() > 448).sum()))
                side = Side(get_format("fp8_e4m3/tensor/unit"), 0, None, f"layer {layer} {side_name}")
                side.init(x)
                side.append(x)
        few = Side(get_format("fp8_e4m3"), 0, None, "layer 0 K")
        few.init(_states(5, 1.0))
    lines = notes.lines()
    assert len(lines) == 2, lines
    assert lines[0] == (f"`fp8_e4m3/unit`: at least {sum(counts):,} values saturated beyond the FP8 range under the "
                        "static scale (6 layer sides), counted where each side first saturated; use calibrated "
                        "scales or a per-token format.")
    assert "`fp8_e4m3`: the static scale was fitted on 5 token(s), fewer than 64;" in lines[1]
    assert notes.markdown().startswith("\n\n**Warnings**: `fp8_e4m3/unit`")
    assert common.ScaleNotes().markdown() == ""


def test_scale_notes_keep_only_their_own_thread_s_warnings():
    """The app's warm-up decodes a 5-token prompt through fp8_e4m3 on its own thread while a click runs: its
    warnings are not the click's."""
    notes = common.ScaleNotes()
    with pytest.warns(ScaleWarning, match="warm-up"):
        with notes.catching():
            other = threading.Thread(target=warnings.warn,
                                     args=(ScaleWarning("warm-up", "few_tokens", "fp8_e4m3", "layer 0 K", tokens=5),))
            other.start()
            other.join()
            warnings.warn(ScaleWarning("mine", "few_tokens", "int8/tensor", "layer 0 K", tokens=3))
    assert [line.split(":")[0] for line in notes.lines()] == ["`int8/tensor`"]


def test_scale_notes_pass_other_warnings_on_and_catch_each_step_of_a_stream():
    def stream():
        warnings.warn(ScaleWarning("w", "few_tokens", "fp8_e4m3", "layer 0 K", tokens=3))
        yield 1
        warnings.warn(ScaleWarning("w", "few_tokens", "fp8_e4m3", "layer 0 V", tokens=3))
        yield 2

    notes = common.ScaleNotes()
    with pytest.warns(DeprecationWarning, match="not ours"):
        with notes.catching():
            warnings.warn("not ours", DeprecationWarning)
    assert list(notes.watch(stream())) == [1, 2]
    assert notes.lines() == ["`fp8_e4m3`: the static scale was fitted on 3 token(s), fewer than 64 (2 layer sides); "
                             "later tokens beyond its range saturate. Use a longer prompt or calibrated scales."]
    with pytest.warns(UserWarning, match="fitted on 3 token"):  # gr.Warning outside a request: a Python warning
        notes.toast()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        notes.toast()  # each line pops up once


# --- through the running app, on the bundled SmolLM2 and real llama.cpp --------------------------------------


@pytest.fixture(scope="module")
def server():
    with serve_app(model="smollm2-135m") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return Client(server.url, verbose=False, httpx_kwargs={"timeout": 600})


def _traces(plot: dict) -> list:
    return json.loads(plot["plot"])["data"]


def test_engine_compare_puts_kvviz_beside_llama_cpp(client):
    assert "/engine_compare" in client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    tab, fig, status = client.predict(["q8_0", "k=q8_0,v=q4_0"], 32, False, "smollm2-135m",
                                      api_name="/engine_compare")
    assert tab["headers"] == engines.HEADERS
    rows = tab["data"]
    assert [r[0] for r in rows] == ["q8_0", "k=q8_0,v=q4_0"]
    for r in rows:
        assert all(v >= 0 for v in r[1:3] + r[4:6]) and 0 <= r[3] <= 100 and 0 <= r[6] <= 100, r
    # 4-bit V costs more than 8-bit V, in both engines and in kvviz's simulation of llama.cpp
    assert rows[1][1] > rows[0][1] and rows[1][4] > rows[0][4] and rows[1][7] > rows[0][7], rows
    for r in rows:  # the simulation's ratio to llama.cpp: a finite number, the two means' quotient
        assert isinstance(r[8], float) and math.isfinite(r[8]) and r[8] == pytest.approx(r[7] / r[4], rel=0.05), r
        assert r[9] == verdict.verdict(r[4], r[7]), r  # llama.cpp against kvviz's simulation of llama.cpp
    traces = _traces(fig)
    assert [t["name"] for t in traces] == ["kvviz (simulated)", "llama.cpp (unrotated K/V)",
                                           "kvviz's llama.cpp simulation"]
    assert traces[0]["y"] == [r[1] for r in rows] and traces[1]["y"] == [r[4] for r in rows]
    assert traces[2]["y"] == [r[7] for r in rows]
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in status and "LLAMA_ATTN_ROT_DISABLE=1" in status
    assert "positions 0 to 30" in status and "positions 1 to 30" in status


def test_engine_compare_answers_in_korean(client):
    """engine_compare's last input is the page's language: the table's headers and verdicts, the chart's series and
    the status in Korean, the numbers the same as in English."""
    tab, fig, status = client.predict(["q8_0"], 32, False, "smollm2-135m", "한국어", api_name="/engine_compare")
    english, _, _ = client.predict(["q8_0"], 32, False, "smollm2-135m", api_name="/engine_compare")
    assert tab["headers"] == engines.headers("ko") != engines.HEADERS
    (row,), (row_en,) = tab["data"], english["data"]
    assert row[:9] == row_en[:9]
    assert row[9] == engines._verdict(verdict.verdict(row[4], row[7]), "ko") != row_en[9]
    assert [t["name"] for t in _traces(fig)] == ["kvviz (시뮬레이션)", "llama.cpp (회전하지 않은 K/V)",
                                                 "kvviz의 llama.cpp 시뮬레이션"]
    assert "초 만에 완료" in status and "Done in" not in status and "positions" not in status


def test_engine_compare_rotation_changes_llama_cpp_only(client):
    rotated = client.predict(["q4_0"], 32, True, "smollm2-135m", api_name="/engine_compare")
    plain = client.predict(["q4_0"], 32, False, "smollm2-135m", api_name="/engine_compare")
    assert rotated[0]["data"][0][1] == plain[0]["data"][0][1]  # kvviz's simulation does not rotate
    assert rotated[0]["data"][0][4] != plain[0]["data"][0][4]
    assert rotated[0]["data"][0][7] != plain[0]["data"][0][7]  # the simulation of llama.cpp follows its rotation
    assert "llama.cpp's default" in rotated[2] and _traces(rotated[1])[1]["name"] == "llama.cpp (rotated K/V)"


def _llama_cpp_workers(app_pid: int) -> list[int]:
    """The live children of the app running kvviz's llama.cpp worker, from /proc (a zombie has no command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):  # the process ended while being read
            continue
        if ppid == app_pid and b"kvviz.engines.llamacpp_worker" in cmdline:
            found.append(int(entry.name))
    return found


def test_the_app_survives_its_llama_cpp_worker_dying(server, client):
    """llama.cpp runs in a worker process of the app: killed, it takes nothing else down, and the next engine_compare
    starts a fresh one and gets the same figures."""
    before = client.predict(["q8_0"], 32, False, "smollm2-135m", api_name="/engine_compare")
    [worker] = _llama_cpp_workers(server.pid)
    assert "libllama" not in Path(f"/proc/{server.pid}/maps").read_text()  # llama.cpp is mapped in the worker only
    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _llama_cpp_workers(server.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _llama_cpp_workers(server.pid) == []
    after = client.predict(["q8_0"], 32, False, "smollm2-135m", api_name="/engine_compare")
    assert after[0]["data"] == before[0]["data"] and after[2].startswith("Done in"), after[2]
    [fresh] = _llama_cpp_workers(server.pid)
    assert fresh != worker
    with urllib.request.urlopen(server.url, timeout=10) as page:  # the app still serves its page
        assert page.status == 200


@pytest.mark.parametrize("index, junk, message", [
    (3, "gemma-9b", "Model must be one of"), (3, -1, "Model must be the name of a model"), (3, ["x"], "Model must be the name of a model"),
    (0, "q8_0", "must be a list of names"), (0, 0, "must be a list of names"), (0, [1], "must hold names"),
    (0, ["int4"], "must be one of q8_0"), (0, ["k=q8_0,v=fp8_e4m3"], "must be one of q8_0"),
    (0, ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "k=q8_0,v=q4_0"], "at most 6"), (0, [], "Pick at least"),
    (1, 16, "from 32 to 512"), (1, 1024, "from 32 to 512"), (1, -1, "from 32 to 512"), (1, 10**30, "from 32 to 512"),
    (1, "x", "from 32 to 512"), (1, 64.5, "whole number"), (1, None, "missing"), (1, [1], "from 32 to 512"),
    (2, "yes", "true or false"), (2, 2, "true or false"),
])
def test_engine_compare_refuses_bad_input_with_a_message(client, index, junk, message):
    args = list(GOOD)
    args[index] = junk
    with pytest.raises(Exception) as info:
        client.predict(*args, api_name="/engine_compare")
    text = str(info.value)
    assert message in text and "Traceback" not in text and "verbose error reporting" not in text, text


def test_compare_shows_the_scale_warning_once_per_format(client):
    """A 5-token prompt fits fp8_e4m3's static scale on 5 tokens: each of SmolLM2's 60 layer sides warns, in each
    of the three caches Compare builds per format; the status says it once, and what then saturates."""
    columns, table, fig, status, _ = client.predict("The capital of France is", ["fp8_e4m3", "k8v4"], "", 2, False,
                                                 api_name="/compare")
    assert status.count("**Warnings**") == 1 and status.count("fitted on") == 1, status
    assert "`fp8_e4m3`: the static scale was fitted on 5 token(s), fewer than 64 (60 layer sides)" in status
    assert re.search(r"`fp8_e4m3`: at least [\d,]+ values saturated beyond the FP8 range", status), status
    assert "k8v4`:" not in status  # per-token scales: nothing to warn about


def test_export_shows_the_calibration_warning(client):
    md, *_ = client.predict("fp8_e4m3", "m", "Hello there.", api_name="/export")
    assert "**Warnings**: `fp8_e4m3/calibrated`: the static scale was fitted on" in md, md
    md, *_ = client.predict("fp8_e4m3", "m", " ".join(["The KV cache stores keys and values."] * 12),
                            api_name="/export")
    assert "**Warnings**" not in md  # enough tokens: nothing to warn about


@pytest.mark.parametrize("pairs, rotate, expected", [
    (["llama.cpp:q8_0", "q8_0"], True, ["q8_0"]),  # llama.cpp's own name is the bare pair, once
    (["llama.cpp:k=q8_0,v=q4_0/norot", "q4_0"], False, ["k=q8_0,v=q4_0", "q4_0"]),
    (["llama.cpp:q4_0"], None, ["q4_0"]),
])
def test_check_pairs_takes_llama_cpp_names(pairs, rotate, expected):
    assert engines.check_pairs(pairs, rotate) == expected


@pytest.mark.parametrize("pairs, rotate, message", [
    (["llama.cpp:q4_0"], False, "tick 'Rotate K/V in llama.cpp'"),
    (["llama.cpp:q4_0/norot"], True, "untick 'Rotate K/V in llama.cpp'"),
    (["vllm:int4_per_token_head"], True, "another engine's dtype"),
    (["llama.cpp:q3_k"], True, "llama.cpp has no KV cache dtype 'q3_k'"),
])
def test_check_pairs_refuses_other_engine_names(pairs, rotate, message):
    with pytest.raises(ValueError, match=message):
        engines.check_pairs(pairs, rotate)


# --- vLLM servers beside llama.cpp (KVVIZ_VLLM_URLS), served by the bridge tests' stand-in ---------------------


@pytest.fixture(scope="module")
def vllm_stand_in():
    """The recorded vLLM answers (tests/data/) served as tests/test_engines_servers.py serves them."""
    from http.server import ThreadingHTTPServer

    from test_engines_servers import _Handler

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("value, message", [
    ("fp8_e4m3=http://h:1", "needs baseline=URL"),
    ("baseline=http://h:1", "needs baseline=URL .* and at least one DTYPE=URL"),
    ("baseline=http://h:1,fp8_e4m3", "takes NAME=URL pairs separated by commas"),
    ("baseline=h:1,fp8=http://h:2", "must start with http://"),
])
def test_vllm_urls_are_checked_as_the_app_starts(value, message):
    with pytest.raises(ValueError, match=message):
        engines.vllm_servers(value)
    assert engines.vllm_servers(" ") is None
    assert engines.vllm_servers("baseline=http://h:1/v1, fp8_e4m3=http://h:2") == {"baseline": "http://h:1",
                                                                                "fp8_e4m3": "http://h:2"}


def test_engine_view_puts_vllm_beside_llama_cpp_with_a_verdict(vllm_stand_in):
    urls = engines.vllm_servers(f"baseline={vllm_stand_in}/vbase,fp8_e4m3={vllm_stand_in}/vfp8")
    tab, fig, status = engines.run(["q8_0"], 32, False, "smollm2-135m", progress=lambda *a, **k: None, vllm=urls)
    rows = tab.values.tolist()
    bars = {trace.name: list(trace.y) for trace in fig.data}
    assert list(fig.data[0].x) == ["q8_0", "vllm:fp8_e4m3/cpu (vLLM)"] and bars["vLLM (CPU build)"][0] is None
    assert bars["vLLM (CPU build)"][1] == rows[1][4] and bars["kvviz (simulated)"][1] == rows[1][7]
    assert list(tab.columns) == engines.HEADERS and [r[0] for r in rows] == ["q8_0", "vllm:fp8_e4m3/cpu (vLLM server)"]
    measured = servers.measure_servers(urls, tokens=32, score_from=1)["fp8_e4m3"]  # the recording holds 10 tokens
    (judged,) = verdict.rows({"fp8_e4m3": measured})
    v = rows[1]
    assert v[4] == round(measured["mean"], 5) and v[6] == round(100 * measured["same_top_p"], 1)
    assert v[1] == v[7] == round(judged.sim_mean, 5) and v[9] == judged.verdict
    assert "positions 1 to 8" in status and "within 1.5x" in status
    with pytest.raises(gr.Error, match="serve 'smollm2-135m', not 'gemma-3-270m'"):  # before llama.cpp runs
        engines.run(["q8_0"], 32, False, "gemma-3-270m", progress=lambda *a, **k: None, vllm=urls)


def test_the_app_reads_vllm_urls_as_it_starts(monkeypatch):
    import app
    from kvviz.ui.i18n import t

    def notes(demo) -> int:
        return sum(getattr(b, "value", None) == t("engine_vllm_note") for b in demo.blocks.values())

    monkeypatch.delenv(engines.VLLM_ENV, raising=False)
    assert notes(app.build_demo()) == 0
    monkeypatch.setenv(engines.VLLM_ENV, "baseline=http://127.0.0.1:1,fp8_e4m3=http://127.0.0.1:2")
    assert notes(app.build_demo()) == 1
    monkeypatch.setenv(engines.VLLM_ENV, "fp8_e4m3=http://127.0.0.1:2")
    with pytest.raises(ValueError, match="needs baseline=URL"):
        app.build_demo()
