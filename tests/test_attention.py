"""Tests for kvviz.attention: backend choice, the QTensor a cache side hands attention, the torch reference path,
and the fused Triton decode path (run on the CPU through TRITON_INTERPRET=1, in a subprocess so the interpreter is
set before triton is first imported) against the reference.

    python -m pytest tests/test_attention.py -q
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import kvviz
from kvviz import attention, runtime
from kvviz.attention import _bottom_right_causal, active_backend, kvviz_attention_forward
from kvviz.cache import QuantizedKVLayer
from kvviz.formats import QTensor

REPO = Path(__file__).resolve().parent.parent


class _Module(torch.nn.Module):
    """What the attention function reads off the calling attention module."""

    num_key_value_groups = 2
    is_causal = True
    training = False


@pytest.mark.parametrize("value,want", [("torch", "torch"), ("TORCH", "torch"), ("", None), ("auto", None)])
def test_backend_from_env(value, want):
    auto = "triton" if attention._probe()["cuda"] and attention._probe()["triton"] else (
        "cpu" if attention._cpu_fused() else "torch")
    with runtime.Runtime.from_env({"KVVIZ_BACKEND": value}).activate():
        assert active_backend() == (want or auto)


def test_bad_backend_names_the_choices(monkeypatch):
    with pytest.raises(ValueError, match="KVVIZ_BACKEND='cuda' is not one of auto, torch, triton"):
        runtime.Runtime.from_env({"KVVIZ_BACKEND": "cuda"})
    monkeypatch.setattr(runtime.default(), "backend", "cuda")  # set on a runtime after it was built
    with pytest.raises(ValueError, match="auto, torch, triton"):
        active_backend()


def test_triton_without_a_device_is_refused_clearly(monkeypatch):
    monkeypatch.setattr(runtime.default(), "backend", "triton")
    monkeypatch.setattr(attention, "_probe", lambda: {"cuda": False, "triton": True, "usable": False})
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        active_backend()


def test_plain_tensors_take_the_sdpa_path_exactly():
    q, k, v = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 3, 16), torch.randn(2, 2, 3, 16)
    got, _ = kvviz_attention_forward(_Module(), q, k, v, None, scaling=0.25)
    want, _ = sdpa_attention_forward(_Module(), q, k, v, None, scaling=0.25)
    assert torch.equal(got, want)


def test_bottom_right_causal_mask():
    m = _bottom_right_causal(2, 4, "cpu")[0, 0]
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


def _packed(spec: str, tokens: int = 40, residual: int = 0, head_dim: int = 16):
    fmt = kvviz.get_format(spec)
    layer = QuantizedKVLayer(fmt, fmt, residual=residual)
    x = torch.randn(2, 2, tokens, head_dim)
    layer.update(x[:, :, :-1], x[:, :, :-1])
    k, v = layer.update(x[:, :, -1:], x[:, :, -1:])
    return x, k, v


def test_packed_handle_fields_and_dequantize():
    x, k, _ = _packed("int4/channel/g16/asym", tokens=40, residual=4)
    assert isinstance(k, QTensor) and k.seq_len == 40 and k.n_quantized == 32 and k.head_dim == 16
    assert k.data.shape == (2, 2, 32, 8) and k.scale.shape == (2, 2, 2, 16) and k.zero.shape == k.scale.shape
    assert k.tail.shape == (2, 2, 8, 16) and k.tail.dtype == torch.float16
    deq = k.dequantize()
    assert deq.shape == (2, 2, 40, 16) and deq.dtype == torch.float32
    assert torch.allclose(deq[:, :, 32:], x[:, :, 32:], atol=1e-2)  # the tail is only fp16-rounded


@pytest.mark.parametrize("spec", ["int4/channel/g16/asym", "nvfp4", "int8/head", "q4_0"])
def test_slice_reads_what_dequantize_reads(spec):
    """row_stack.py mirrors a cache side slice by slice: each slice dequantizes to its tokens of the whole read."""
    _, k, _ = _packed(spec, tokens=72, residual=4, head_dim=32)  # 71 prefill tokens fit int8/head's scale
    whole = k.dequantize()
    cut = 16 if k.fmt.granularity == "channel" else 13
    parts = [k.slice(0, cut), k.slice(cut, k.n_quantized)]
    assert all(p.tail is None and p.seq_len == p.n_quantized for p in parts)
    assert torch.equal(torch.cat([p.dequantize() for p in parts], dim=2), whole[:, :, : k.n_quantized])


def test_a_side_has_no_shape():
    _, k, _ = _packed("int8")
    with pytest.raises(AttributeError, match="set_attn_implementation"):
        k.shape


@pytest.mark.parametrize("q_len", [1, 3])
def test_packed_path_is_dequantize_then_sdpa(q_len, monkeypatch):
    monkeypatch.setattr(runtime.default(), "backend", "torch")  # auto fuses single-token decode on the CPU (kernels/cpu/decode.py)
    _, k, v = _packed("int8")
    q = torch.randn(2, 4, q_len, 16)
    got, _ = kvviz_attention_forward(_Module(), q, k, v, None, scaling=0.25)
    mask = _bottom_right_causal(q_len, k.seq_len, "cpu") if q_len > 1 else None
    want, _ = sdpa_attention_forward(_Module(), q, k.dequantize(), v.dequantize(), mask, scaling=0.25)
    assert torch.equal(got, want)


_TRITON_SCRIPT = textwrap.dedent("""
    import os, sys, torch
    sys.path.insert(0, sys.argv[1])
    import kvviz
    from kvviz.attention import active_backend, kvviz_attention_forward
    from kvviz.cache import QuantizedKVLayer

    class M(torch.nn.Module):
        num_key_value_groups = 2
        is_causal = True

    worst = 0.0
    for spec, residual in [("int8", 0), ("int4/channel/g16/asym", 3), ("nvfp4", 0), ("fp8", 2)]:
        fmt = kvviz.get_format(spec)
        layer = QuantizedKVLayer(fmt, fmt, residual=residual)
        x = torch.randn(2, 2, 50, 16)
        layer.update(x[:, :, :49], x[:, :, :49])
        k, v = layer.update(x[:, :, 49:], x[:, :, 49:])
        q = torch.randn(2, 4, 1, 16)
        mask = torch.ones(2, 1, 1, 50, dtype=torch.bool)
        mask[1, :, :, :7] = False  # left padding of the second sequence
        out = {}
        for backend in ("torch", "triton"):
            kvviz.runtime.current().backend = backend
            assert active_backend() == backend
            out[backend] = kvviz_attention_forward(M(), q, k, v, mask, scaling=0.25)[0]
        assert out["triton"].shape == out["torch"].shape == (2, 1, 4, 16)
        worst = max(worst, (out["triton"] - out["torch"]).abs().max().item())
    print(worst)
""")


def test_triton_backend_matches_the_reference_in_the_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT, str(REPO)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.strip().splitlines()[-1]) < 1e-5


# ------------------------------------------------------------------------------------------ drop-in use

_README_BLOCK = re.compile(r"<!-- drop-in:[^\n]*-->\n```python\n(.*?)```", re.S)


def _save_tiny_with_tokenizer(path: Path) -> None:
    """A tiny Llama and a character-level fast tokenizer (ids 0..255), saved as from_pretrained reads them."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from kvviz.tiny import tiny_model

    model, _ = tiny_model("llama")
    model.save_pretrained(path)
    vocab = {chr(i): i for i in range(1, 256)} | {"<unk>": 0}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<unk>").save_pretrained(path)


def test_readme_drop_in_block_runs_verbatim(tmp_path):
    """The README's five lines, as written, in a fresh interpreter where only `import kvviz` registers "kvviz";
    the one change is the hub id, pointed at a tiny model saved to a temporary directory."""
    found = _README_BLOCK.findall((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(found) == 1, "README.md must hold one drop-in python block"
    code = found[0]
    hub_id = re.search(r'from_pretrained\("([^"]+)"', code).group(1)
    assert code.count(hub_id) == 2 and "kvviz.attention" not in code
    _save_tiny_with_tokenizer(tmp_path / "model")
    script = f"import sys; sys.path.insert(0, {str(REPO)!r})\n" + code.replace(hub_id, str(tmp_path / "model"))
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("bytes of K/V")
    assert int(proc.stdout.split()[-4]) > 0  # the cache held packed K/V


def test_use_backend_overrides_the_environment_on_this_thread_only(monkeypatch):
    import threading

    from kvviz.attention import use_backend

    monkeypatch.setattr(runtime.default(), "backend", "torch")
    seen = {}
    with use_backend("auto"):
        auto = active_backend()
        assert auto in ("cpu", "triton", "torch")
        with use_backend("TORCH"):  # nested, any case
            assert active_backend() == "torch"
        assert active_backend() == auto  # the outer block's choice again
        other = threading.Thread(target=lambda: seen.setdefault("other", active_backend()))
        other.start()
        other.join()
    assert seen["other"] == "torch"  # another thread keeps the runtime's backend (KVVIZ_BACKEND)
    assert active_backend() == "torch"  # and so does this one after the block


@pytest.mark.parametrize("name", ["cuda", 5, None])
def test_use_backend_refuses_a_name_it_does_not_know(name):
    from kvviz.attention import use_backend

    with pytest.raises(ValueError, match="not one of auto, torch, triton, cpu"):
        with use_backend(name):
            pass


def test_import_registers_through_the_public_interfaces_without_an_import_hook():
    """`import kvviz` registers "kvviz" with AttentionInterface and AttentionMaskInterface (transformers' public
    registration API) and leaves no finder of its own in sys.meta_path."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    assert AttentionInterface()["kvviz"] is kvviz_attention_forward
    assert AttentionMaskInterface()["kvviz"] is sdpa_mask
    assert not [f for f in sys.meta_path if type(f).__module__.startswith("kvviz")]
