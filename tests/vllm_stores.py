"""Stores K/V with vLLM's own store kernels (the pinned vllm package) on the CPU and writes the cache out.

Test tooling for tests/test_vllm_stores.py: it runs inside the vLLM venv (`make vllm`, .venv-vllm/bin/python), never
in kvviz's, and imports nothing from kvviz. vLLM's Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1):
vllm/triton_utils/importing.py turns Triton off on vLLM's CPU build unless `triton.backends.backends` holds a "cpu"
backend whose driver is active, so a stand-in one is registered before vllm is imported (the interpreter itself
needs no driver).

    python tests/vllm_stores.py OUT.npz --inputs IN.npz     # K/V from IN.npz
    python tests/vllm_stores.py OUT.npz --seed 0 --cases int8_per_token_head.bfloat16.d64 ...

A case is named `<vllm dtype>.<model dtype>.<tag>`; IN.npz holds `<case>.k` and `<case>.v`, fp32 [N, H, D] holding
values of the model dtype (numpy has no bfloat16); --seed draws N=4, H=2 and D from the tag `d<D>`. OUT.npz holds per
case, for K (`<case>.k_*`) and V (`<case>.v_*`), [N, H, ...] arrays:

    int8_per_token_head     data int8 [D], scale fp32 []                   (_reshape_cache_per_token_head)
    fp8_per_token_head      pre_fp8 fp32 [D], scale fp32 []                (the same kernel into an fp32 cache)
    int4_per_token_head     data uint8 [D/2], scale fp32 [] (zp in its low 4 bits),   (reshape_and_cache_int4)
                            rotated fp32 [D] (single_rht's output in the model's dtype: the kernel's input)
    fp8, fp8_e4m3, fp8_e5m2 pre_fp8 fp32 [D]                               (reshape_and_cache_kernel_flash, fp32 cache)
    turboquant_*            data uint8, norm (K) / scale, zero (V) fp16    (triton_turboquant_store), plus
                            `<case>.midpoints` fp32; K's y fp32 [D] and norm32 fp32 [] (the launcher's torch
                            norm and matmul: the kernel's input); turboquant_k8v4's K is `pre_fp8` (its input);
                            read fp16 [D]: what _tq_full_dequant_kv reads back (K in the rotated domain)

The fp8 paths stop before the fp8 cast, which the interpreter does not do as the GPU does: `pre_fp8` is what the
kernel hands `tl.store` / `.to(tl.float8e4nv)`, which the GPU rounds to the nearest E4M3 / E5M2 value (ties to even).

    python tests/vllm_stores.py OUT.json --ptx

compiles the store kernels for an H100 (sm_90, Triton's default options, no GPU needed) instead and writes what
their PTX does that the interpreter does not: the source line of each fused multiply-add (`fma.rn.f32`: the GPU
rounds `a * b + c` once, the interpreter twice) in the int8 and int4 kernels, and the fp32 -> fp8 conversion
instruction of the fp8 stores.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import sys

import numpy as np

# Triton decides between interpreting and compiling when a kernel is decorated, at vllm's import: --ptx compiles
PTX = "--ptx" in sys.argv
os.environ["TRITON_INTERPRET"] = "0" if PTX else "1"

from triton.backends import Backend, backends  # noqa: E402
from triton.backends.compiler import BaseBackend  # noqa: E402


class _CpuDriver:
    """The stand-in "cpu" backend's driver: vllm.triton_utils counts it as the one active Triton driver."""

    @staticmethod
    def is_active() -> bool:
        return True


class _NoCompiler(BaseBackend):
    """The stand-in backend compiles for no target (--ptx names NVIDIA's)."""

    @staticmethod
    def supports_target(target) -> bool:
        return False


backends.setdefault("cpu", Backend(compiler=_NoCompiler, driver=_CpuDriver))

import torch  # noqa: E402
from vllm.triton_utils import HAS_TRITON, triton  # noqa: E402

if not HAS_TRITON:
    sys.exit("vLLM turned Triton off although a 'cpu' backend is registered: vllm/triton_utils changed.")

from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids  # noqa: E402
from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig  # noqa: E402
from vllm.v1.attention.backends.turboquant_attn import _build_hadamard  # noqa: E402
from vllm.v1.attention.ops import triton_reshape_and_cache_flash as flash  # noqa: E402
from vllm.v1.attention.ops import int4_per_token_head as int4_ops  # noqa: E402
from vllm.v1.attention.ops import triton_turboquant_decode as tq_decode  # noqa: E402
from vllm.v1.attention.ops import triton_turboquant_store as tq_store  # noqa: E402
from vllm.v1.kv_cache_interface import KVQuantMode  # noqa: E402

BLOCK = 16  # tokens per cache block
_SEEN: dict = {}  # what vLLM's launchers handed their kernels, kept by the wrappers below


def _keep_int4_inputs(kernel, **kwargs):
    """int4_per_token_head's _run_reshape_kernel, keeping the rotated K and V it is given."""
    _SEEN["k_rotated"], _SEEN["v_rotated"] = kwargs["key"], kwargs["value"]
    return _run_int4_kernel(kernel, **kwargs)


class _KeepTqInputs:
    """_tq_fused_store_mse, keeping its first two arguments: the rotated unit keys y [N*H, D] and norms [N*H] that
    the launcher computed with torch (a matmul whose summation order is the device's own)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            _SEEN["k_y"], _SEEN["k_norm32"] = args[0], args[1]
            return self.kernel[grid](*args, **kwargs)

        return launch


_run_int4_kernel = int4_ops._run_reshape_kernel
int4_ops._run_reshape_kernel = _keep_int4_inputs
tq_store._tq_fused_store_mse = _KeepTqInputs(tq_store._tq_fused_store_mse)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _blocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


def _unpaged(cache: torch.Tensor, n: int) -> np.ndarray:
    """[blocks, BLOCK, H, ...] -> numpy [n, H, ...]: slot t holds token t."""
    return cache.reshape(-1, *cache.shape[2:])[:n].numpy()


def per_token_head(k: torch.Tensor, v: torch.Tensor, cache_dtype: torch.dtype) -> dict:
    """int8_per_token_head (int8 cache) or fp8_per_token_head (run into an fp32 cache: the values before the cast)."""
    n, h, d = k.shape
    slots = torch.arange(n)
    scales = [torch.zeros(_blocks(n), BLOCK, h) for _ in range(2)]
    if cache_dtype == torch.int8:
        caches = [torch.zeros(_blocks(n), BLOCK, h, d, dtype=torch.int8) for _ in range(2)]
        flash.triton_reshape_and_cache_flash_per_token_head_quant(k, v, *caches, *scales, slots,
                                                                  KVQuantMode.INT8_PER_TOKEN_HEAD)
        name = "data"
    else:
        # the launcher's own arguments for an fp8 cache, given an fp32 cache that keeps what tl.store would cast
        quant_max, quant_min = flash._PER_TOKEN_HEAD_QUANT_PARAMS[flash.FP8_DTYPE]
        caches = [torch.zeros(_blocks(n), BLOCK, h, d) for _ in range(2)]
        kc, vc = caches
        ks, vs = scales
        flash._reshape_cache_per_token_head[(n, h)](
            k, v, kc, vc, ks, vs, slots, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
            ks.stride(0), ks.stride(1), ks.stride(2), vs.stride(0), vs.stride(1), vs.stride(2),
            block_size=BLOCK, head_size=d, head_size_v=d, HEAD_SIZE_PADDED=1 << (d - 1).bit_length(),
            QUANT_MAX=quant_max, QUANT_MIN=quant_min, IS_INT_QUANT=False)
        name = "pre_fp8"
    return {f"k_{name}": _unpaged(caches[0], n), f"v_{name}": _unpaged(caches[1], n),
            "k_scale": _unpaged(scales[0], n), "v_scale": _unpaged(scales[1], n)}


def int4(k: torch.Tensor, v: torch.Tensor) -> dict:
    n, h, d = k.shape
    caches = [torch.zeros(_blocks(n), BLOCK, h, d // 2, dtype=torch.uint8) for _ in range(2)]
    scales = [torch.zeros(_blocks(n), BLOCK, h) for _ in range(2)]
    int4_ops.reshape_and_cache_int4(k, v, *caches, torch.arange(n), k_scale_cache=scales[0],
                                    v_scale_cache=scales[1])
    return {"k_data": _unpaged(caches[0], n), "v_data": _unpaged(caches[1], n),
            "k_scale": _unpaged(scales[0], n), "v_scale": _unpaged(scales[1], n),
            "k_rotated": _SEEN["k_rotated"].float().numpy(), "v_rotated": _SEEN["v_rotated"].float().numpy()}


def fp8_per_tensor(k: torch.Tensor, v: torch.Tensor) -> dict:
    """fp8 / fp8_e4m3 / fp8_e5m2 with vLLM's default k_scale = v_scale = 1.0: reshape_and_cache_kernel_flash's
    `key / k_scale` into an fp32 cache (the launcher asserts an SM89 GPU for fp8, so the kernel is called with the
    launcher's flat-layout arguments)."""
    n, h, d = k.shape
    caches = [torch.zeros(_blocks(n), BLOCK, h, d) for _ in range(2)]
    kc, vc = caches
    one = torch.ones(1)
    tile = min(2048, 1 << (h * d - 1).bit_length())
    flash.reshape_and_cache_kernel_flash[(n, (h * d + tile - 1) // tile)](
        k, v, kc, vc, torch.arange(n), one, one, k.stride(0), v.stride(0), kc.stride(0), kc.stride(2), 0, 0,
        kc.stride(1), num_heads=h, head_size=d, block_size=BLOCK, x=1, USE_HEAD_MAJOR_LAYOUT=False,
        FP8_KV_CACHE=True, TILE_SIZE=tile)
    return {"k_pre_fp8": _unpaged(kc, n), "v_pre_fp8": _unpaged(vc, n)}


def turboquant(k: torch.Tensor, v: torch.Tensor, dtype: str) -> dict:
    """triton_turboquant_store as TurboQuantAttentionImpl calls it (its _ensure_on_device tables), slot split by
    TurboQuantConfig's layout: [key: MSE indices, fp16 norm | key: D fp8 bytes][value: codes, fp16 scale, zero]."""
    n, h, d = k.shape
    cfg = TurboQuantConfig.from_cache_dtype(dtype, d)
    cache = torch.zeros(_blocks(n), BLOCK, h, cfg.slot_size_aligned, dtype=torch.uint8)
    c_sorted, _ = get_centroids(d, cfg.centroid_bits).float().sort()
    midpoints = (c_sorted[:-1] + c_sorted[1:]) / 2
    tq_store.triton_turboquant_store(k, v, cache, torch.arange(n, dtype=torch.int32), _build_hadamard(d, "cpu"),
                                     midpoints, mse_bits=cfg.key_mse_bits, key_packed_size=cfg.key_packed_size,
                                     value_quant_bits=cfg.effective_value_quant_bits, key_fp8=cfg.key_fp8)
    slot = _unpaged(cache, n)  # [n, h, slot_size_aligned]
    kps = cfg.key_packed_size
    val_bytes = cfg.value_packed_size - 4

    def f16(at: int) -> np.ndarray:
        return slot[..., at : at + 2].copy().view(np.float16)[..., 0]

    out = {"midpoints": midpoints.numpy(), "v_data": slot[..., kps : kps + val_bytes],
           "v_scale": f16(kps + val_bytes), "v_zero": f16(kps + val_bytes + 2)}
    if cfg.key_fp8:  # _tq_fused_store_fp8 casts the key, unscaled, with .to(tl.float8e4nv)
        out["k_pre_fp8"] = k.float().numpy()
    else:
        out["k_data"], out["k_norm"] = slot[..., : kps - 2], f16(kps - 2)
        out["k_y"] = _SEEN["k_y"].reshape(n, h, d).numpy()
        out["k_norm32"] = _SEEN["k_norm32"].reshape(n, h).numpy()
    out["k_read"], out["v_read"] = _tq_read(cache, cfg, n, h, d)
    return out


def _tq_read(cache: torch.Tensor, cfg, n: int, h: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """triton_turboquant_decode.py `_tq_full_dequant_kv` over the stored slots, as TurboQuantAttentionImpl calls it
    for a continuation prefill: fp16 [n, h, D] keys (norm * centroids, renormalized with "nc", in the rotated domain)
    and values (code * scale + zero)."""
    k_out, v_out = (torch.zeros(1, h, n, d, dtype=torch.float16) for _ in range(2))
    block_table = torch.arange(cache.shape[0], dtype=torch.int32)[None]
    centroids = get_centroids(d, cfg.centroid_bits).to(torch.float32)
    tq_decode._tq_full_dequant_kv[(n, h)](
        cache, block_table, centroids, k_out, v_out, k_out.stride(0), k_out.stride(1), k_out.stride(2),
        v_out.stride(0), v_out.stride(1), v_out.stride(2), cache.stride(0), cache.stride(1), cache.stride(2),
        block_table.stride(0), HEAD_DIM=d, BLOCK_SIZE=BLOCK, NUM_KV_HEADS=h, MSE_BYTES=-(-d * cfg.key_mse_bits // 8),
        KPS=cfg.key_packed_size, VQB=cfg.effective_value_quant_bits, VAL_DATA_BYTES=cfg.value_packed_size - 4,
        MSE_BITS=cfg.key_mse_bits, KEY_FP8=int(cfg.key_fp8), BLOCK_D=1 << (d - 1).bit_length(),
        NORM_CORRECTION=int(cfg.norm_correction), FP8_E4B15=0)
    return k_out[0].transpose(0, 1).numpy(), v_out[0].transpose(0, 1).numpy()


def store(case: str, k: np.ndarray, v: np.ndarray) -> dict:
    """One case -> its output arrays (keys without the case prefix)."""
    dtype, model_dtype = case.split(".")[:2]
    kt = torch.from_numpy(k).to(DTYPES[model_dtype])
    vt = torch.from_numpy(v).to(DTYPES[model_dtype])
    if dtype == "int8_per_token_head":
        return per_token_head(kt, vt, torch.int8)
    if dtype == "fp8_per_token_head":
        return per_token_head(kt, vt, flash.FP8_DTYPE)
    if dtype == "int4_per_token_head":
        return int4(kt, vt)
    if dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        return fp8_per_tensor(kt, vt)
    if dtype.startswith("turboquant_"):
        return turboquant(kt, vt, dtype)
    raise ValueError(f"vllm_stores.py has no store for {dtype!r}: add one, or drop the case.")


def _seeded(case: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    d = int(case.split(".")[2].removeprefix("d"))
    gen = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(4, 2, d, generator=gen) for _ in range(2))
    return k.numpy(), v.numpy()


def _ptx(fn, ptrs: dict, consts: dict) -> str:
    """A Triton kernel compiled for an H100 (sm_90) with Triton's default options: its PTX (ptrs: the pointer
    arguments' types; the others i64 strides or i32)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    params = list(inspect.signature(fn.fn).parameters)
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "i64" if "stride" in n else "i32") for n in params}
    src = ASTSource(fn=fn, signature=sig, constexprs={(params.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def _fma_lines(fn, ptx: str) -> list[str]:
    """The source line of each fma.rn.f32 in ptx (from the .loc before it)."""
    source = inspect.getsource(sys.modules[fn.fn.__module__]).splitlines()
    base = os.path.basename(inspect.getsourcefile(fn.fn))
    line, found = None, []
    for text in ptx.splitlines():
        loc = re.search(r"//\s*(\S+):(\d+):", text)
        if loc and text.lstrip().startswith(".loc"):
            line = int(loc.group(2)) if loc.group(1) == base else None
        elif text.lstrip().startswith("fma.rn.f32"):
            found.append(source[line - 1].strip() if line else "?")
    return found


def ptx_facts() -> dict:
    """What vLLM's store kernels compile to for an H100, at head_dim 128 from bf16: {"fma": {kernel: [source line
    of each fma.rn.f32]}, "fp8_cvt": {dtype: [the fp32 -> fp8 conversions in its PTX]}} for the int8 per-token-head
    and int4 kernels, and the fp8 per-token-head and per-tensor (E4M3, E5M2) stores."""
    ptrs = dict(key_ptr="*bf16", value_ptr="*bf16", k_scale_cache_ptr="*fp32", v_scale_cache_ptr="*fp32",
                slot_mapping_ptr="*i64", k_scale="*fp32", v_scale="*fp32")
    per_token_head = dict(block_size=16, head_size=128, head_size_v=128, HEAD_SIZE_PADDED=128)
    int8 = _ptx(flash._reshape_cache_per_token_head, {**ptrs, "key_cache_ptr": "*i8", "value_cache_ptr": "*i8"},
                {**per_token_head, "QUANT_MAX": 127.0, "QUANT_MIN": -128.0, "IS_INT_QUANT": True})
    int4 = _ptx(int4_ops._reshape_cache_int4_kernel, {**ptrs, "key_cache_ptr": "*u8", "value_cache_ptr": "*u8"},
                dict(block_size=16, head_size=128, head_size_v=128, PACKED_HEAD_PADDED=64))
    fp8 = {"fp8_per_token_head": _ptx(flash._reshape_cache_per_token_head,
                                      {**ptrs, "key_cache_ptr": "*fp8e4nv", "value_cache_ptr": "*fp8e4nv"},
                                      {**per_token_head, "QUANT_MAX": 448.0, "QUANT_MIN": -448.0,
                                       "IS_INT_QUANT": False})}
    for dtype, elt in (("fp8_e4m3", "*fp8e4nv"), ("fp8_e5m2", "*fp8e5")):  # key_stride & co: i64 like the strides
        fp8[dtype] = _ptx(flash.reshape_and_cache_kernel_flash,
                          {**ptrs, "key_cache_ptr": elt, "value_cache_ptr": elt, "key_stride": "i64",
                           "value_stride": "i64"},
                          dict(num_heads=2, head_size=128, block_size=16, x=1, USE_HEAD_MAJOR_LAYOUT=False,
                               FP8_KV_CACHE=True, TILE_SIZE=256))
    return {"fma": {"int8_per_token_head": _fma_lines(flash._reshape_cache_per_token_head, int8),
                    "int4_per_token_head": _fma_lines(int4_ops._reshape_cache_int4_kernel, int4)},
            "fp8_cvt": {dtype: sorted(set(re.findall(r"cvt\.\S*e[45]m[23]\S*\.f32", ptx)))
                        for dtype, ptx in fp8.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the .npz to write (with --ptx: the .json)")
    ap.add_argument("--ptx", action="store_true", help="write ptx_facts() instead of storing K/V")
    ap.add_argument("--inputs", help="a .npz with <case>.k and <case>.v, fp32 [N, H, D]")
    ap.add_argument("--seed", type=int, default=0, help="with --cases: draw K/V from this seed")
    ap.add_argument("--cases", nargs="*", default=(), help="<vllm dtype>.<model dtype>.d<D>, with --seed")
    args = ap.parse_args(argv)
    if args.ptx:
        with open(args.out, "w") as f:
            json.dump(ptx_facts(), f, indent=1)
        return
    if args.inputs:
        with np.load(args.inputs) as f:
            pairs = {name[:-2]: (f[name], f[name[:-2] + ".v"]) for name in f.files if name.endswith(".k")}
    else:
        pairs = {case: _seeded(case, args.seed) for case in args.cases}
    out = {}
    for case, (k, v) in pairs.items():
        out.update({f"{case}.{key}": np.ascontiguousarray(val) for key, val in store(case, k, v).items()})
    np.savez(args.out, **out)


if __name__ == "__main__":
    main()
