"""kvviz.engines.vllm_local without vLLM: a stand-in "vLLM Python" (a shell script) answers the package probe and
plays a server that dies at start or never answers, so the refusals and the clean-up (process groups stopped on
errors and on Ctrl-C) are checked in seconds. The live servers are tests/test_engines_vllm_live.py's."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kvviz.runtime
from kvviz.engines import vllm_local

ROOT = Path(__file__).resolve().parents[1]
CPU_ATTN = '''
class CPUAttentionBackend(AttentionBackend):
    supported_kv_cache_dtypes: ClassVar[list["CacheDType"]] = [
        "auto",
        "fp8",
        "fp8_e4m3",
        "fp8_e5m2",
    ]
'''
# $1 = -c: the package probe; else a server: "die" prints an error and exits 1, "hang" starts a child (same process
# group) and both sleep without ever listening, their pids written to $FAKE_VLLM_PIDS; "serve" answers vLLM's
# recorded answers (tests/vllm_stand_in.py).
FAKE_PYTHON = '''#!/bin/sh
if [ "$1" = "-c" ]; then echo "$FAKE_VLLM_PKG"; exit 0; fi
case "$FAKE_VLLM_MODE" in
  serve) echo $$ >> "$FAKE_VLLM_PIDS"; exec "$FAKE_VLLM_PY" "$FAKE_VLLM_STAND_IN" "$@";;
  die) echo "INFO 12-06 starting the API server"
       echo "ValueError: Model architectures ['FooForCausalLM'] are not supported for now."; exit 1;;
  hang) sleep 300 & echo "$$ $!" >> "$FAKE_VLLM_PIDS"; wait;;
esac
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """A stand-in vLLM Python and package, and a model directory vLLM would be given; returns the pid file."""
    pkg = tmp_path / "site" / "vllm"
    (pkg / "v1/attention/backends").mkdir(parents=True)
    (pkg / "v1/attention/backends/cpu_attn.py").write_text(CPU_ATTN)
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    pids = tmp_path / "pids"
    monkeypatch.setenv(vllm_local.PYTHON_ENV, str(python))  # for `python -m kvviz` started from a test
    monkeypatch.setattr(kvviz.runtime.default(), "vllm_python", python)  # for this process's runtime
    monkeypatch.setenv("FAKE_VLLM_PKG", str(pkg))
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(pids))
    monkeypatch.setenv("FAKE_VLLM_PY", sys.executable)
    monkeypatch.setenv("FAKE_VLLM_STAND_IN", str(ROOT / "tests" / "vllm_stand_in.py"))
    monkeypatch.setattr(vllm_local, "STOP_TIMEOUT", 3.0)
    return model, pids


def _running(pids: Path) -> list[int]:
    """The stand-in servers' pids (leaders and children) that are still running (not zombies)."""
    out = []
    for pid in (int(p) for p in pids.read_text().split()):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
        except (FileNotFoundError, IndexError):
            continue
        if state != "Z":
            out.append(pid)
    return out


def test_missing_vllm_says_make_vllm(monkeypatch, tmp_path):
    monkeypatch.setattr(kvviz.runtime.default(), "vllm_python", tmp_path / "nothing" / "python")
    with pytest.raises(ValueError, match="not installed: .* does not exist; run `make vllm`"):
        vllm_local.measure_dtypes(["fp8_e4m3"], tokens=8)
    monkeypatch.setattr(kvviz.runtime.default(), "vllm_python", Path(sys.executable))  # kvviz's own: no vllm
    if not vllm_local.installed():
        with pytest.raises(ValueError, match="not installed in .*run `make vllm`"):
            vllm_local.vllm_package()


def test_default_python_is_the_repos_venv(monkeypatch):
    monkeypatch.setattr(kvviz.runtime.default(), "vllm_python", None)
    assert vllm_local.vllm_python() == ROOT / ".venv-vllm" / "bin" / "python"


@pytest.mark.parametrize("dtypes, bad", [(["int4_per_token_head"], "'int4_per_token_head'"), (["auto"], "'auto'"),
                                         ("fp8_e4m3,nvfp4", "'nvfp4'"), ([], "none")])
def test_dtypes_vllms_cpu_build_lacks_are_refused_with_its_list(fake_vllm, dtypes, bad):
    with pytest.raises(ValueError, match=f"takes --kv-cache-dtype fp8, fp8_e4m3, fp8_e5m2 .*; got {bad}"):
        vllm_local.check_dtypes(dtypes)


def test_dtypes_are_read_from_vllms_source(fake_vllm):
    assert vllm_local.cpu_kv_dtypes() == ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
    assert vllm_local.check_dtypes("fp8_e5m2, fp8_e4m3,fp8_e5m2") == ["fp8_e5m2", "fp8_e4m3"]


def test_a_port_in_use_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=f"Port {port} on 127.0.0.1 is in use"):
            vllm_local.free_ports(2, port)
    assert len(set(vllm_local.free_ports(3))) == 3


def test_a_model_vllm_cannot_load_is_refused(fake_vllm, tmp_path):
    with pytest.raises(ValueError, match="has no config.json: vLLM serves a transformers model directory"):
        vllm_local.model_dir(str(tmp_path))
    with pytest.raises(ValueError, match="neither a bundled model .* nor a local directory"):
        vllm_local.model_dir("no-such-model")


def test_a_server_that_dies_at_start_is_quoted(fake_vllm, monkeypatch):
    model, _ = fake_vllm
    monkeypatch.setenv("FAKE_VLLM_MODE", "die")
    with pytest.raises(ValueError, match=r"(?s)--kv-cache-dtype auto exited at start \(code 1\).*cannot serve"
                                         r".*'FooForCausalLM'\] are not supported"):
        vllm_local.measure_dtypes(["fp8_e4m3"], str(model), tokens=8)


def test_servers_are_stopped_on_ctrl_c(fake_vllm, monkeypatch):
    model, pids = fake_vllm
    monkeypatch.setenv("FAKE_VLLM_MODE", "hang")
    calls = []

    def progress(message):
        calls.append(message)
        if len(calls) == 3 and pids.is_file() and len(pids.read_text().split()) == 4:
            raise KeyboardInterrupt
        assert len(calls) < 30, "the stand-in servers never started"

    with pytest.raises(KeyboardInterrupt):
        vllm_local.measure_dtypes(["fp8_e4m3"], str(model), tokens=8, progress=progress)
    assert "0/2 servers ready (auto, fp8_e4m3; model)" in calls[0]
    assert len(pids.read_text().split()) == 4 and _running(pids) == []  # both leaders and their children


def test_servers_that_never_answer_time_out_and_are_stopped(fake_vllm, monkeypatch):
    model, pids = fake_vllm
    monkeypatch.setenv("FAKE_VLLM_MODE", "hang")
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"did not answer within 2 s \(auto, fp8_e5m2 not ready\)"):
        with vllm_local.serve(["fp8_e5m2"], str(model), timeout=2, together=True):
            pass
    assert time.monotonic() - start < 20
    assert _running(pids) == []


def test_cli_refuses_a_dtype_with_the_list(fake_vllm):
    out = subprocess.run([sys.executable, "-m", "kvviz", "engines", "--vllm", "fp8_e4m3,int8_per_token_head"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120, env=os.environ)
    assert out.returncode == 2 and out.stdout == ""
    assert "takes --kv-cache-dtype fp8, fp8_e4m3, fp8_e5m2" in out.stderr and "'int8_per_token_head'" in out.stderr
    out = subprocess.run([sys.executable, "-m", "kvviz", "engines", "--vllm", "fp8", "--baseline", "http://h:1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120, env=os.environ)
    assert out.returncode == 2 and "--vllm starts its own servers" in out.stderr


def test_kld_runs_end_to_end_on_stand_in_servers(fake_vllm, monkeypatch):
    """vllm_local.measure_dtypes: servers started, measured through the bridge, stopped (the recorded answers: 10
    tokens)."""
    model, pids = fake_vllm
    monkeypatch.setenv("FAKE_VLLM_MODE", "serve")
    got = vllm_local.measure_dtypes("fp8_e4m3", str(model), tokens=10, score_from=1)
    assert list(got) == ["fp8_e4m3"] and got["fp8_e4m3"]["n"] == 8 and got["fp8_e4m3"]["mean"] > 0
    assert got["fp8_e4m3"]["model"] == "smollm2-135m" and got["fp8_e4m3"]["capped"] is None
    assert len(pids.read_text().split()) == 2 and _running(pids) == []


def test_cli_prints_vllm_beside_the_simulation_with_a_verdict(fake_vllm, monkeypatch):
    """--vllm end to end on stand-in servers with the recorded answers, judged against kvviz's SmolLM2."""
    _, pids = fake_vllm
    monkeypatch.setenv("FAKE_VLLM_MODE", "serve")
    out = subprocess.run([sys.executable, "-m", "kvviz", "engines", "--vllm", "fp8_e4m3", "--tokens", "20"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600, env=os.environ)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "2/2 servers ready (auto, fp8_e4m3; smollm2-135m)" in out.stderr
    assert lines[0].startswith("vllm (CPU build, started here): 8 positions (1 to 8)")
    assert lines[2].split()[0] == "fp8_e4m3" and "vllm:fp8_e4m3" in out.stdout
    (verdict_line,) = [line for line in lines if line.startswith("  fp8_e4m3 ")]
    assert any(v in verdict_line for v in ("within the format's expected range", "loses more", "loses less"))
    assert _running(pids) == []


def test_cli_serve_prints_the_urls_and_stops_on_ctrl_c(fake_vllm, monkeypatch):
    model, pids = fake_vllm
    monkeypatch.setenv("FAKE_VLLM_MODE", "serve")
    proc = subprocess.Popen([sys.executable, "-m", "kvviz", "engines", "--vllm", "fp8_e5m2", "--serve", "--model",
                             str(model)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=os.environ)
    try:
        line = ""
        while not line.startswith("KVVIZ_VLLM_URLS="):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
        urls = dict(item.split("=", 1) for item in line.strip().removeprefix("KVVIZ_VLLM_URLS=").split(","))
        assert list(urls) == ["baseline", "fp8_e5m2"]
        from kvviz.engines import servers

        assert servers.vllm_model(urls["fp8_e5m2"], timeout=5) == ("smollm2-135m", 1024)  # the stand-in answers
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(pids.read_text().split()) == 2 and _running(pids) == []


def test_progress_in_a_log_prints_a_line_when_the_status_changes(capsys, monkeypatch):
    from kvviz.cli import engines as cli

    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: False, raising=False)
    progress = cli._progress_line()
    for s in range(5):
        progress(f"vLLM: 0/3 servers ready (auto, fp8_e4m3, fp8_e5m2; smollm2-135m), {s} s")
    progress("vLLM: 3/3 servers ready (auto, fp8_e4m3, fp8_e5m2; smollm2-135m), 5 s")
    assert capsys.readouterr().err.splitlines() == [
        "vLLM: 0/3 servers ready (auto, fp8_e4m3, fp8_e5m2; smollm2-135m), 0 s",
        "vLLM: 3/3 servers ready (auto, fp8_e4m3, fp8_e5m2; smollm2-135m), 5 s"]
