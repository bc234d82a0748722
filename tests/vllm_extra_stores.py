"""Stores K/V with vLLM's own UltraQuant and fp8_ds_mla writers (the pinned vllm package) on the CPU, writes them out.

Test tooling for tests/test_vllm_extra_stores.py: it runs inside the vLLM venv (`make vllm`, .venv-vllm/bin/python),
never in kvviz's, and imports nothing from kvviz. vLLM's Triton kernels run in Triton's interpreter
(TRITON_INTERPRET=1): vllm/triton_utils/importing.py turns Triton off on vLLM's CPU build unless
`triton.backends.backends` holds a "cpu" backend whose driver is active, so a stand-in one is registered before vllm
is imported (the interpreter itself needs no driver).

    python tests/vllm_extra_stores.py ultraquant_4bit IN.npz OUT.npz
    python tests/vllm_extra_stores.py fp8_ds_mla IN.npz OUT.npz

ultraquant_4bit (vllm/v1/attention/ops/ultraquant/triton_store.py `ultraquant_store`): IN.npz holds `k`, `v` fp32
[N, H, D] of `dtype`'s values ("bfloat16" / "float16"; numpy has no bfloat16). OUT.npz: the slot split by format.py's
layout, [N, H, ...]: k_data uint8 [D/2], k_scale uint8 [D/32], v_data, v_scale, and `slot_size`.

fp8_ds_mla (vllm/models/deepseek_v32/common/kernels.py `fused_norm_rope`, DeepSeek-V3.2's fused RMS norm, RoPE and
cache write; no indexer, identity RoPE): IN.npz holds `kv_c` fp32 [N, 512] and `k_pe` fp32 [N, 64] of bf16 values and
the norm's weight `norm_w` fp32 [512]. OUT.npz, per token: `latent` (the normalized latent the writer quantizes, bf16
values) and `rope` fp32, then the 656 B record split: data uint8 [512] (E4M3 bytes), scale fp32 [4], rope_bf16 fp32
[64]. The interpreter does not cast to fp8 as the GPU does (it gives 16 for 31.5), so `data` is not a reference.
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

from vllm.models.deepseek_v32.common import kernels as ds_kernels  # noqa: E402
from vllm.v1.attention.ops.ultraquant import format as uq_format  # noqa: E402
from vllm.v1.attention.ops.ultraquant.triton_store import ultraquant_store  # noqa: E402

BLOCK = 16  # tokens per cache block
DS_MLA_RECORD = 656  # bytes per token: 512 E4M3 | 4 fp32 scales | 64 bf16


def ultraquant(k: torch.Tensor, v: torch.Tensor) -> dict:
    """k, v [N, H, D] bf16 / fp16 -> the cache's fields per token and head (numpy)."""
    n, h, d = k.shape
    slot = uq_format.slot_size(d)
    cache = torch.zeros((n + BLOCK - 1) // BLOCK, BLOCK, h, slot, dtype=torch.uint8)
    ultraquant_store(k, v, cache, torch.arange(n, dtype=torch.int64))
    rows = cache.reshape(-1, h, slot)[:n].numpy()  # slot t holds token t
    ks, vc, vs = uq_format.k_scales_offset(d), uq_format.v_codes_offset(d), uq_format.v_scales_offset(d)
    return {"k_data": rows[..., :ks], "k_scale": rows[..., ks:vc], "v_data": rows[..., vc:vs],
            "v_scale": rows[..., vs:slot], "slot_size": np.array(slot)}


def fp8_ds_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, norm_w: torch.Tensor) -> dict:
    """kv_c [N, 512], k_pe [N, 64] bf16, norm_w [512] -> the records fused_norm_rope writes (numpy)."""
    n, rope = kv_c.shape[0], k_pe.shape[1]
    cos_sin = torch.cat([torch.ones(n, rope // 2), torch.zeros(n, rope // 2)], -1)  # position p: cos 1, sin 0
    cache = torch.zeros((n + BLOCK - 1) // BLOCK, BLOCK, DS_MLA_RECORD, dtype=torch.uint8)
    latent, rope_out = torch.empty_like(kv_c), torch.empty_like(k_pe)
    q_c = torch.zeros(n, 64, dtype=kv_c.dtype)  # the kernel normalizes a query too; unused here
    ds_kernels.fused_norm_rope(torch.arange(n), q_c, torch.ones(64), 1e-6, kv_c, norm_w, 1e-6, k_pe, cos_sin,
                               None, None, None, 1e-6, None, torch.zeros(n, 8, dtype=torch.int32),
                               slot_mapping=torch.arange(n), mla_kv_cache=cache, mla_kv_cache_dtype="fp8_ds_mla",
                               has_indexer=False, kv_c_out=latent, k_pe_out=rope_out)
    rows = cache.reshape(-1, DS_MLA_RECORD)[:n]
    return {"latent": latent.float().numpy(), "rope": rope_out.float().numpy(), "data": rows[:, :512].numpy(),
            "scale": rows[:, 512:528].contiguous().view(torch.float32).numpy(),
            "rope_bf16": rows[:, 528:].contiguous().view(torch.bfloat16).float().numpy()}


def main(argv: list[str]) -> None:
    kind, src, dst = argv
    inputs = np.load(src)
    if kind == "ultraquant_4bit":
        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[str(inputs["dtype"])]
        out = ultraquant(torch.from_numpy(inputs["k"]).to(dtype), torch.from_numpy(inputs["v"]).to(dtype))
    elif kind == "fp8_ds_mla":
        out = fp8_ds_mla(torch.from_numpy(inputs["kv_c"]).to(torch.bfloat16),
                         torch.from_numpy(inputs["k_pe"]).to(torch.bfloat16), torch.from_numpy(inputs["norm_w"]))
    else:
        sys.exit(f"unknown store {kind!r}: ultraquant_4bit or fp8_ds_mla")
    np.savez(dst, **out)


if __name__ == "__main__":
    main(sys.argv[1:])
