"""Tests for the command line (`python -m kvviz ...`, kvviz/cli/): the memory table and one-line errors."""

from __future__ import annotations

import json

import pytest

from kvviz import cli, memory

EXAMPLE = ["memory", "--model", "llama-3.1-70b", "--context", "32768", "--formats", "fp16,fp8,k8v4,mxfp4",
           "--gpu", "h100-80gb"]


def _row(stdout: str, name: str) -> list[str]:
    rows = [line.split() for line in stdout.splitlines() if line.split()[:1] == [name]]
    assert len(rows) == 1, f"no single row for {name!r} in:\n{stdout}"
    return rows[0]


def test_memory_example_prints_one_row_per_format(run_cli):
    out = run_cli(*EXAMPLE)
    assert out.returncode == 0, out.stderr
    assert _row(out.stdout, "fp16")[1:4] == ["16/16", "10.74", "1.00x"]
    assert _row(out.stdout, "fp8")[1:4] == ["8/8", "5.37", "2.00x"]
    assert _row(out.stdout, "k8v4")[1] == "8.125/4.125"
    assert _row(out.stdout, "mxfp4")[1] == "4.25/4.25"
    assert "weights do not fit" in out.stdout  # 141 GB of bf16 weights on one 80 GB GPU


def test_memory_fit_columns_agree_with_the_library(capsys):
    assert cli.main([*EXAMPLE, "--gpus", "4"]) == 0
    stdout = capsys.readouterr().out
    for spec in ("fp16", "mxfp4"):
        longest = memory.max_context("llama-3.1-70b", "h100-80gb", spec, gpus=4)
        batch = memory.max_batch("llama-3.1-70b", "h100-80gb", 32768, spec, gpus=4)
        assert _row(stdout, spec)[-2:] == [f"{longest:,}*", f"{batch:,}"]
    assert "trained context" in stdout


def test_memory_custom_dimensions(capsys):
    args = ["memory", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--context", "32768",
            "--formats", "fp16,k=int8,v=int4", "--gpu", "b200", "--params", "70.6"]
    assert cli.main(args) == 0
    stdout = capsys.readouterr().out
    assert _row(stdout, "fp16")[2] == "10.74"
    assert _row(stdout, "k=int8,v=int4")[1] == "8.125/4.125"


@pytest.mark.parametrize("args, says", [
    (["memory", "--model", "gpt-5", "--context", "100"], "Unknown model preset"),
    (["memory", "--model", "llama-3.1-8b", "--context", "-5"], "--context"),
    (["memory", "--model", "llama-3.1-8b", "--context", "1k"], "--context"),
    (["memory", "--model", "llama-3.1-8b", "--context", "100", "--formats", "int5"], "Unknown KV format"),
    (["memory", "--model", "llama-3.1-8b", "--context", "100", "--gpu", "h900"], "Unknown GPU"),
    (["memory", "--model", "llama-3.1-8b", "--context", "100", "--gpus", "0"], "--gpus"),
    (["memory", "--layers", "8", "--context", "100"], "--kv-heads"),
    (["memory", "--layers", "8", "--kv-heads", "2", "--head-dim", "64", "--context", "9", "--gpu", "l4"], "--params"),
    (["memory", "--model", "llama-3.1-8b", "--head-dim", "64", "--context", "100"], "not both"),
    (["memory", "--model", "llama-3.1-8b"], "--context"),
    (["memory", "--layers", "8", "--kv-heads", "2", "--head-dim", "64", "--context", "9", "--params", "268e6"],
     "--params is in billions"),
    (["nope"], "invalid choice"),
    ([], "COMMAND"),
])
def test_bad_arguments_exit_2_with_one_line(args, says, capsys):
    try:
        status = cli.main(args)
    except SystemExit as stop:  # argparse's own errors
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("kvviz") and says in err


def test_bad_argument_from_a_real_process(run_cli):
    out = run_cli("memory", "--model", "llama-3.1-8b", "--context", "100", "--formats", "fp16,int4/g48")
    assert out.returncode == 2
    assert out.stdout == "" and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("kvviz memory: error: ") and "48" in out.stderr


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--help"])
    assert stop.value.code == 0 and "memory" in capsys.readouterr().out


def test_memory_prints_the_per_layer_kind_breakdown(capsys):
    assert cli.main(["memory", "--model", "gpt-oss-20b", "--context", "4096", "--formats", "fp16"]) == 0
    stdout = capsys.readouterr().out
    assert _row(stdout, "full_attention")[1:3] == ["12", "4,096"]
    assert _row(stdout, "sliding_attention")[1:4] == ["(128)", "12", "128"]


def test_memory_from_a_config_file(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(memory.MODEL_PRESETS["gemma-3-27b"].config))
    assert cli.main(["memory", "--config", str(path), "--context", "131072", "--formats", "fp16",
                     "--gpu", "h100-80gb", "--params", "27.4"]) == 0
    from_file = capsys.readouterr().out
    assert cli.main(["memory", "--model", "gemma-3-27b", "--context", "131072", "--formats", "fp16",
                     "--gpu", "h100-80gb"]) == 0
    assert _row(from_file, "fp16") == _row(capsys.readouterr().out, "fp16")


@pytest.mark.parametrize("args, says", [
    (["--config", "/nonexistent/config.json"], "No config file"),
    (["--config", "x.json", "--model", "phi-4"], "not both"),
    (["--hf-id", "nobody/no-such-model"], "Cannot reach the Hugging Face hub for 'nobody/no-such-model'"),
    (["--model", "phi-4", "--params", "14"], "not both"),
    (["--model", "phi-4", "--layout", "vllm"], "--layout"),
])
def test_memory_model_source_errors(args, says, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        status = cli.main(["memory", *args, "--context", "100"])
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and says in err, err
