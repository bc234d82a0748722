"""kvviz's `vllm:ultraquant_4bit` and `vllm:fp8_ds_mla` equal vLLM's own writers, run from the pinned vllm package.

tests/vllm_extra_stores.py runs in the vLLM venv (KVVIZ_VLLM_PYTHON, else .venv-vllm/bin/python; `make vllm` builds
it) and stores the same values with vLLM's Triton kernels in Triton's CPU interpreter; kvviz stores them here.

- ultraquant_4bit (`_ultraquant_store_kernel`): packed E2M1 codes and UE8M0 scale bytes of K (rotated in the kernel)
  and V agree exactly. 6 tokens x 2 heads of bf16 (one case fp16) with spread norms, a zero group, midpoint ties of
  both signs, an absmax on each side of the exponent's step (0.156 absmax = 2**-2.5); head_dim 32, 64, 128, 256.
- fp8_ds_mla (DeepSeek-V3.2's `fused_norm_rope` writer): the 4 fp32 tile scales and the 64 bf16 RoPE values agree
  exactly, for tiles whose norm weight spreads amax over several octaves and under the 1e-4 floor. The E4M3 bytes are
  not compared: the interpreter does not cast to fp8 as the GPU does; tests/test_formats_ds_mla.py checks kvviz's
  cast (nearest even, as the GPU's cvt.rn.satfinite) by hand.

    KVVIZ_VLLM_PYTHON=/path/to/.venv-vllm/bin/python python -m pytest tests/test_vllm_extra_stores.py -q
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from kvviz import parse_kv

REPO = Path(__file__).resolve().parent.parent
DRIVER = REPO / "tests" / "vllm_extra_stores.py"
VLLM_PYTHON = Path(os.environ.get("KVVIZ_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
TOKENS, HEADS = 6, 2
UQ_CASES = [("bfloat16", 32), ("bfloat16", 64), ("bfloat16", 128), ("bfloat16", 256), ("float16", 128)]
_TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _run(kind: str, tmp_path: Path, **inputs) -> dict:
    """The driver's output arrays for `inputs` (numpy), or a skip naming `make vllm` without the vLLM venv."""
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM venv at {VLLM_PYTHON}: run `make vllm` (or set KVVIZ_VLLM_PYTHON to its python)")
    np.savez(tmp_path / "in.npz", **inputs)
    run = subprocess.run([str(VLLM_PYTHON), str(DRIVER), kind, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return dict(np.load(tmp_path / "out.npz"))


def _states(head_dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[TOKENS, HEADS, head_dim] in the model's dtype (vLLM's [num_tokens, num_kv_heads, head_size])."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, HEADS, head_dim, generator=g) * torch.exp(torch.randn(TOKENS, HEADS, 1, generator=g))
    x[0, 0, :32] = torch.tensor([1.0, 0.25, 0.03125, -0.03125, 0.3125, -0.3125, 0.625, -0.9375] * 4)  # ties
    x[1, 0, :32] = 0.0  # a zero group: byte 0
    x[2, 0, :32] = torch.linspace(-1.13, 1.13, 32)  # absmax just under the exponent's step ...
    x[2, 1, :32] = torch.linspace(-1.14, 1.14, 32)  # ... and just over it
    x[3, 0] = 1e-30  # tiny: the divisor far below 1
    return x.to(dtype)


@pytest.mark.parametrize("model_dtype,head_dim", UQ_CASES)
def test_kvviz_stores_what_vllms_ultraquant_kernel_stores(model_dtype, head_dim, tmp_path):
    k = _states(head_dim, _TORCH[model_dtype], 2 * head_dim)
    v = _states(head_dim, _TORCH[model_dtype], 2 * head_dim + 1)
    out = _run("ultraquant_4bit", tmp_path, k=k.float().numpy(), v=v.float().numpy(), dtype=np.array(model_dtype))
    kv = parse_kv("vllm:ultraquant_4bit")
    held = sum(f.nbytes_for((1, HEADS, TOKENS, head_dim)) for f in (kv.k, kv.v))
    assert int(out["slot_size"]) * TOKENS * HEADS == held  # format.py slot_size: K and V of one token and head
    for side, fmt, x in (("k", kv.k, k), ("v", kv.v, v)):
        q = fmt.quantize(x.transpose(0, 1)[None])  # [1, H, N, D]
        data = q.data[0].transpose(0, 1).numpy()  # [N, H, D/2]
        scale = q.scale[0].transpose(0, 1).numpy()  # [N, H, D/32]
        for name, ours in (("scale", scale), ("data", data)):
            theirs = out[f"{side}_{name}"]
            assert np.array_equal(ours, theirs), f"{side} {name} differs at {np.argwhere(ours != theirs)[:8]}"


def test_kvviz_scales_the_latent_as_vllms_fp8_ds_mla_writer_does(tmp_path):
    g = torch.Generator().manual_seed(0)
    kv_c = (torch.randn(TOKENS, 512, generator=g) * torch.exp(torch.randn(TOKENS, 1, generator=g))).bfloat16()
    k_pe = torch.randn(TOKENS, 64, generator=g).bfloat16()
    # per-tile norm weights: the RMS-normalized latent at 1x, 1/7 and 30x (scales over several octaves) and 1e-3
    # (amax / 448 under the 1e-4 floor: 2**-13)
    norm_w = torch.cat([torch.full((128,), w) for w in (1.0, 1 / 7, 30.0, 1e-3)])
    out = _run("fp8_ds_mla", tmp_path, kv_c=kv_c.float().numpy(), k_pe=k_pe.float().numpy(), norm_w=norm_w.numpy())
    kv = parse_kv("vllm:fp8_ds_mla")
    latent = torch.from_numpy(out["latent"])[None, None]  # [1, 1, N, 512]: what the writer quantized, in bf16
    q = kv.k.quantize(latent)
    assert np.array_equal(q.scale[0, 0].numpy(), out["scale"]), f"ours {q.scale[0, 0]}\nvLLM's {out['scale']}"
    assert len(np.unique(np.log2(out["scale"]))) >= 4 and (out["scale"][:, 3] == 2.0**-13).all()
    rope = kv.v.roundtrip(torch.from_numpy(out["rope"])[None, None])[0, 0].numpy()
    assert np.array_equal(rope, out["rope_bf16"]) and np.array_equal(out["rope"], k_pe.float().numpy())
