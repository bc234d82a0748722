"""Stores K/V with vLLM's own UltraQuant store kernel (the pinned vllm package) on the CPU and writes the cache out.

Test tooling for tests/test_vllm_ultraquant.py: it runs inside the vLLM venv (`make vllm`, .venv-vllm/bin/python),
never in kvviz's, and imports nothing from kvviz. vLLM's Triton kernel `_ultraquant_store_kernel`
(vllm/v1/attention/ops/ultraquant/triton_store.py) runs in Triton's interpreter (TRITON_INTERPRET=1):
vllm/triton_utils/importing.py turns Triton off on vLLM's CPU build unless `triton.backends.backends` holds a "cpu"
backend whose driver is active, so a stand-in one is registered before vllm is imported (the interpreter itself
needs no driver).

    python tests/vllm_ultraquant_store.py IN.npz OUT.npz

IN.npz holds `k` and `v`, fp32 [N, H, D] holding bf16 values (numpy has no bfloat16; the launcher takes bf16 or
fp16, `dtype` names which: "bfloat16" / "float16"). OUT.npz holds the slot split by format.py's layout, [N, H, ...]:
k_data uint8 [D/2], k_scale uint8 [D/32], v_data uint8 [D/2], v_scale uint8 [D/32], and `slot_size`.
"""

from __future__ import annotations

import os
import sys

import numpy as np

os.environ["TRITON_INTERPRET"] = "1"

from triton.backends import Backend, backends  # noqa: E402
from triton.backends.compiler import BaseBackend  # noqa: E402


class _CpuDriver:
    """The stand-in "cpu" backend's driver: vllm.triton_utils counts it as the one active Triton driver."""

    @staticmethod
    def is_active() -> bool:
        return True


backends.setdefault("cpu", Backend(compiler=BaseBackend, driver=_CpuDriver))

import torch  # noqa: E402
from vllm.triton_utils import HAS_TRITON  # noqa: E402

if not HAS_TRITON:
    sys.exit("vLLM turned Triton off although a 'cpu' backend is registered: vllm/triton_utils changed.")

from vllm.v1.attention.ops.ultraquant import format as uq_format  # noqa: E402
from vllm.v1.attention.ops.ultraquant.triton_store import ultraquant_store  # noqa: E402

BLOCK = 16  # tokens per cache block


def store(k: torch.Tensor, v: torch.Tensor) -> dict:
    """k, v [N, H, D] bf16 / fp16 -> the cache's fields per token and head (numpy)."""
    n, h, d = k.shape
    slot = uq_format.slot_size(d)
    blocks = (n + BLOCK - 1) // BLOCK
    cache = torch.zeros(blocks, BLOCK, h, slot, dtype=torch.uint8)
    ultraquant_store(k, v, cache, torch.arange(n, dtype=torch.int64))
    rows = cache.reshape(-1, h, slot)[:n].numpy()  # slot t holds token t
    ks, vc, vs = uq_format.k_scales_offset(d), uq_format.v_codes_offset(d), uq_format.v_scales_offset(d)
    return {"k_data": rows[..., :ks], "k_scale": rows[..., ks:vc], "v_data": rows[..., vc:vs],
            "v_scale": rows[..., vs:slot], "slot_size": np.array(slot)}


def main(argv: list[str]) -> None:
    src, dst = argv
    inputs = np.load(src)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[str(inputs["dtype"])]
    k = torch.from_numpy(inputs["k"]).to(dtype)
    v = torch.from_numpy(inputs["v"]).to(dtype)
    np.savez(dst, **store(k, v))


if __name__ == "__main__":
    main(sys.argv[1:])
