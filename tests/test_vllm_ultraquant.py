"""kvviz's `vllm:ultraquant_4bit` equals vLLM's own UltraQuant store kernel, bit for bit, run from the pinned vllm.

tests/vllm_ultraquant_store.py runs in the vLLM venv (KVVIZ_VLLM_PYTHON, else .venv-vllm/bin/python; `make vllm`
builds it) and stores the same K/V with `_ultraquant_store_kernel` in Triton's CPU interpreter; kvviz stores them
here; packed E2M1 codes and UE8M0 scale bytes of K (rotated in the kernel) and V must agree exactly. Data: 6 tokens x
2 heads of bf16 (one case fp16) with spread norms, plus a zero group, midpoint ties of both signs, values past the
clip and an absmax on each side of the exponent's step (0.156 absmax = 2**-2.5); head_dim 32, 64, 128, 256.

    KVVIZ_VLLM_PYTHON=/path/to/.venv-vllm/bin/python python -m pytest tests/test_vllm_ultraquant.py -q
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
DRIVER = REPO / "tests" / "vllm_ultraquant_store.py"
VLLM_PYTHON = Path(os.environ.get("KVVIZ_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
TOKENS, HEADS = 6, 2
CASES = [("bfloat16", 32), ("bfloat16", 64), ("bfloat16", 128), ("bfloat16", 256), ("float16", 128)]
_TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16}


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


@pytest.mark.parametrize("model_dtype,head_dim", CASES)
def test_kvviz_stores_what_vllms_ultraquant_kernel_stores(model_dtype, head_dim, tmp_path):
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM venv at {VLLM_PYTHON}: run `make vllm` (or set KVVIZ_VLLM_PYTHON to its python)")
    k = _states(head_dim, _TORCH[model_dtype], 2 * head_dim)
    v = _states(head_dim, _TORCH[model_dtype], 2 * head_dim + 1)
    np.savez(tmp_path / "in.npz", k=k.float().numpy(), v=v.float().numpy(), dtype=np.array(model_dtype))
    run = subprocess.run([str(VLLM_PYTHON), str(DRIVER), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
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
