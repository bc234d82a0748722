"""kvviz's `vllm:<dtype>` stores equal vLLM's own store kernels, bit for bit, run from the pinned vllm package.

tests/vllm_stores.py runs in the vLLM venv (KVVIZ_VLLM_PYTHON, else .venv-vllm/bin/python; `make vllm` builds it) and
stores the same K/V with vLLM's Triton store kernels in Triton's CPU interpreter; kvviz stores them here; codes and
scales must agree exactly: int8 / int4 codes and fp32 scales (int4's zero point in their low bits), int4's rotation,
TurboQuant's packed key indices, fp16 norms, value codes and fp16 scale / zero, its codebook midpoints, and what
vLLM's TurboQuant read (`_tq_full_dequant_kv`) makes of its own bytes.

Two differences between the interpreter and a GPU are accounted for element by element: the interpreter computes
`x * inv + c` as a multiply then an add, the GPU as one FMA, which kvviz models (int8's `q +- 0.5`, int4's
`x * inv + zp`: where the two round to different codes, kvviz must hold the fused code and vLLM the unfused one; that
the GPU fuses them is checked on vLLM's kernels compiled for sm_90); TurboQuant's `k / ||k|| @ H` is a torch matmul
outside the kernel, summed in the device's order (the kernel is checked on vLLM's own rotated keys; kvviz's y is
within a few fp32 ulps of vLLM's, and its codes may differ only where the two straddle a codebook midpoint).

fp8 (`fp8`, `fp8_e4m3`, `fp8_e5m2`, `fp8_per_token_head`, turboquant_k8v4's key): the interpreter's fp32 -> fp8 cast
is not round-to-nearest-even (on 4096 normal values in range it differs from it on 85 as E4M3, 165 as E5M2), so
vLLM's kernel runs into an fp32 cache (its scale division, clamp to +-448 for per-token-head) and the fp8 encoding
is done here on the host: nearest, ties to even, saturating at the largest finite value, as Triton's fp32 ->
fp8e4nv / fp8e5 store cast does on the GPU (cvt.rn.satfinite, read from the compiled kernels). turboquant_k8v4's
key kernel casts its input unscaled (`.to(tl.float8e4nv)`), so its "kernel output" is K itself.

Not run here: `auto`, `float16`, `bfloat16` (the model's own values, no quantization) and `nvfp4`, `nvfp4_4over6`
(vLLM's store is a CUDA kernel in its compiled _C library, not shipped as source; tests/test_formats_vllm.py
transcribes it). Data: 5 tokens x 2 heads of bf16 (one case fp16), outliers and exact halves included; head_dim 64,
128, 256, and 80 and 96 for int4_per_token_head (vLLM's block-diagonal Hadamard).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import kvviz
from kvviz.formats.engines import VLLM_DTYPES
from kvviz.formats.turboquant import _bucketize, _midpoints, key_rotation, pack_bits, unpack_bits
from kvviz.formats.vllm import rht

REPO = Path(__file__).resolve().parent.parent
DRIVER = REPO / "tests" / "vllm_stores.py"
VLLM_PYTHON = Path(os.environ.get("KVVIZ_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")

CASTS = ("auto", "float16", "bfloat16")  # the model's values, unquantized
CUDA_ONLY = ("nvfp4", "nvfp4_4over6", "nvfp4_ds_mla")  # csrc/.../nvfp4 kernels, inline PTX: CUDA only
# Checked against vLLM elsewhere: the CPU build's fp8 (its compiled op's bytes, tests/test_formats_vllm.py), and
# UltraQuant's and DeepSeek's fp8 MLA stores (tests/test_vllm_extra_stores.py, the same venv and interpreter).
ELSEWHERE = ("fp8/cpu", "fp8_e4m3/cpu", "fp8_e5m2/cpu", "ultraquant_4bit", "fp8_ds_mla")
HEAD_DIMS = (64, 128, 256)
TOKENS, HEADS = 5, 2

# (vllm dtype, model dtype, head_dim): every dtype the interpreter can run at every head_dim, plus int4's
# non-power-of-two head_dims and an fp16 model (int4 rounds its rotation to the model's dtype)
CASES = [(name, "bfloat16", d) for name in VLLM_DTYPES if name not in CASTS + CUDA_ONLY + ELSEWHERE
         for d in HEAD_DIMS]
CASES += [("int4_per_token_head", "bfloat16", 96), ("int4_per_token_head", "bfloat16", 80),
          ("int4_per_token_head", "float16", 128)]
_TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _run_driver(*args: str) -> None:
    """tests/vllm_stores.py ARGS in the vLLM venv, without this venv's PYTHONPATH (the two venvs' packages differ)."""
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM venv at {VLLM_PYTHON}: run `make vllm` (or set KVVIZ_VLLM_PYTHON to its python)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(VLLM_PYTHON), str(DRIVER), *args], capture_output=True, text=True, timeout=300,
                          check=False, env={**env, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert proc.returncode == 0, proc.stderr[-4000:]


def _case(name: str, model_dtype: str, head_dim: int) -> str:
    return f"{name}.{model_dtype}.d{head_dim}"


def _states(head_dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[TOKENS, HEADS, head_dim] in the model's dtype: vLLM's [num_tokens, num_kv_heads, head_size] order."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, HEADS, head_dim, generator=g) * torch.exp(torch.randn(TOKENS, HEADS, 1, generator=g))
    x[0, 0] = (torch.arange(head_dim) % 16) - 7.5  # asymmetric 4-bit codes on exact halves
    x[1, 0] = (torch.arange(head_dim) % 255) - 127.0  # absmax 127: int8 scale 1.0 ...
    x[1, 0, 1:8] = torch.tensor([0.5, -0.5, 1.5, -2.5, 3.5, -126.5, 99.5])  # ... and exact halves, both signs
    x[2, 1] = 0.0
    return x.to(dtype)


@pytest.fixture(scope="module")
def vllm_out(tmp_path_factory) -> tuple[dict, dict]:
    """Runs the driver once for every case: ({case: (K, V) in the model's dtype}, {output name: array})."""
    tmp = tmp_path_factory.mktemp("vllm_stores")
    inputs = {}
    for seed, (name, model_dtype, d) in enumerate(CASES):
        k = _states(d, _TORCH[model_dtype], 2 * seed)
        v = _states(d, _TORCH[model_dtype], 2 * seed + 1)
        inputs[_case(name, model_dtype, d)] = (k, v)
    np.savez(tmp / "in.npz", **{f"{c}.{side}": t.float().numpy() for c, kv in inputs.items()
                                for side, t in zip("kv", kv)})
    _run_driver(str(tmp / "out.npz"), "--inputs", str(tmp / "in.npz"))
    with np.load(tmp / "out.npz") as f:
        return inputs, {name: f[name] for name in f.files}


def _kvviz_side(spec: str, side: str, x: torch.Tensor):
    """kvviz's store of x [N, H, D] (vLLM's order) as the `side` format of `spec`: (data, scale, zero), each
    [N, H, ...] again (None where the format has none)."""
    fmt = getattr(kvviz.parse_kv(spec), side)
    xt = x.permute(1, 0, 2).unsqueeze(0)  # [1, H, N, D]: kvviz's [batch, heads, tokens, head_dim]
    q = fmt.quantize(xt, scale=1.0) if fmt.scale_source == "unit" else fmt.quantize(xt)

    def back(t):
        return None if t is None else t[0].permute(1, 0, *range(2, t.dim() - 1))

    return back(q.data), back(q.scale), back(q.zero)


def _host_fp8(pre: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """cvt.rn.satfinite: nearest (ties to even), clamped to the largest finite value -> the fp8 bytes."""
    top = torch.finfo(dtype).max
    return torch.from_numpy(pre).clamp(-top, top).to(dtype).view(torch.uint8)


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., D/2] -> codes [..., D], even element low."""
    return np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def _round_away(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v >= 0, (v + 0.5).trunc(), (v - 0.5).trunc())


def _assert_codes(case: str, ours: np.ndarray, theirs: np.ndarray, fused: torch.Tensor, unfused: torch.Tensor):
    """Codes equal wherever the kernel's multiply-add rounds alike fused (the GPU's FMA, which kvviz models) and
    unfused (Triton's interpreter: a multiply, then an add); where the two differ, kvviz holds the fused code and
    vLLM's interpreted kernel the unfused one."""
    fused, unfused = fused.numpy(), unfused.numpy()
    np.testing.assert_array_equal(theirs, unfused, err_msg=f"{case}: the kernel's arithmetic, transcribed")
    np.testing.assert_array_equal(ours, fused, err_msg=f"{case}: kvviz against the kernel's arithmetic with FMA")
    same = fused == unfused
    np.testing.assert_array_equal(ours[same], theirs[same], err_msg=f"{case} codes")
    assert (~same).sum() <= 2, f"{case}: {(~same).sum()} codes hang on the FMA, expected at most a rare one"


def _int8_codes(x: torch.Tensor, scale: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """_reshape_cache_per_token_head's int8 code from x [N, H, D] and its stored scale [N, H]: (fused, unfused)."""
    x32 = x.float()
    inv = 1.0 / torch.from_numpy(scale)[..., None]
    prod = x32 * inv
    half = torch.where(prod >= 0, 0.5, -0.5)
    fused = (x32.double() * inv.double() + half.double()).float()
    return tuple(torch.clamp(v, -128.0, 127.0).trunc().to(torch.int8) for v in (fused, prod + half))


def _int4_codes(rotated: np.ndarray, scale: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """_reshape_cache_int4_kernel's codes from its input (vLLM's rotated x [N, H, D]) and the stored scale, whose
    high bits are the kernel's scale and low 4 bits its zero point: (fused, unfused)."""
    r = torch.from_numpy(rotated)
    k_scale = torch.clamp_min((r.amax(-1) - r.amin(-1)) / 15.0, 1e-6)
    bits = torch.from_numpy(scale).view(torch.int32)
    assert torch.equal(k_scale.view(torch.int32) & -16, bits & -16)
    zp = (bits & 0xF).float()[..., None]
    inv = 1.0 / k_scale[..., None]
    fused = (r.double() * inv.double() + zp.double()).float()
    return tuple(_round_away(v).clamp(0, 15).to(torch.uint8) for v in (fused, r * inv + zp))


def _check_tq_key(case: str, x: torch.Tensor, data: torch.Tensor, norm: torch.Tensor, theirs: dict, bits: int):
    """TurboQuant's key. The store kernel: kvviz's bucket search and packing of vLLM's own y, and the fp16 of its
    norm, equal vLLM's bytes exactly. The launcher's torch norm and matmul (y = k / (||k|| + 1e-8) @ H) sum in the
    device's own order, kvviz in one fixed order (formats.turboquant.key_rotation): kvviz's codes equal vLLM's except
    where its y and vLLM's, a few fp32 ulps apart, fall on the two sides of a codebook midpoint."""
    d = x.shape[-1]
    y_vllm = torch.from_numpy(theirs["y"])
    mids = _midpoints(d, bits)
    packed = pack_bits(_bucketize(y_vllm, mids, bits), bits).numpy()
    np.testing.assert_array_equal(packed, theirs["data"], err_msg=f"{case}: the kernel's bucket search and packing")
    np.testing.assert_array_equal(torch.from_numpy(theirs["norm32"]).to(torch.float16).numpy(), theirs["norm"])
    np.testing.assert_array_equal(_bits(norm), theirs["norm"].view(np.uint8), err_msg=f"{case} key norm")
    _, y_ours = key_rotation(x.permute(1, 0, 2))  # [H * N, D], head-major
    y_ours = y_ours.reshape(x.shape[1], x.shape[0], d).permute(1, 0, 2)
    assert torch.allclose(y_ours, y_vllm, rtol=0, atol=4e-7)  # |y| <= 1: a few fp32 ulps
    ours, vl = unpack_bits(data, bits), unpack_bits(torch.from_numpy(theirs["data"]), bits)
    for n, h, j in (ours != vl).nonzero().tolist():
        lo, hi = sorted((float(y_ours[n, h, j]), float(y_vllm[n, h, j])))
        assert any(lo < float(m) <= hi for m in mids), f"{case}: code {n, h, j} differs away from a midpoint"
    assert (ours != vl).sum() <= 0.01 * ours.numel()


def test_every_vllm_dtype_is_compared_or_said_why_not():
    """A new vLLM dtype in kvviz's table needs a case here (or a reason it cannot run in the interpreter)."""
    covered = {name for name, _, _ in CASES}
    assert set(VLLM_DTYPES) == covered | set(CASTS) | set(CUDA_ONLY) | set(ELSEWHERE)


@pytest.mark.parametrize("name,model_dtype,head_dim", CASES, ids=[_case(*c) for c in CASES])
def test_kvviz_stores_what_vllm_stores(vllm_out, name, model_dtype, head_dim):
    """kvviz's codes and scales of each side equal those vLLM's store kernel wrote for the same K/V (the module
    docstring says what is compared how)."""
    inputs, out = vllm_out
    case = _case(name, model_dtype, head_dim)
    spec = f"vllm:{name}"
    for side, x in zip("kv", inputs[case]):
        data, scale, zero = _kvviz_side(spec, side, x)
        theirs = {key[len(case) + 3 :]: val for key, val in out.items() if key.startswith(f"{case}.{side}_")}
        where = f"{case} {side}"
        if "pre_fp8" in theirs:  # vLLM's kernel up to the cast, the cast on the host
            fp8 = _host_fp8(theirs["pre_fp8"], torch.float8_e5m2 if name == "fp8_e5m2" else torch.float8_e4m3fn)
            np.testing.assert_array_equal(_bits(data), fp8.numpy(), err_msg=f"{where} fp8 bytes")
        elif name == "int8_per_token_head":
            _assert_codes(where, data.numpy(), theirs["data"], *_int8_codes(x, theirs["scale"]))
        elif name == "int4_per_token_head":
            rotated = rht(x.float()).to(x.dtype).float().numpy()  # single_rht(x.float()).to(x.dtype)
            np.testing.assert_array_equal(rotated, theirs["rotated"], err_msg=f"{where} rotation")
            _assert_codes(where, _nibbles(data.numpy()), _nibbles(theirs["data"]),
                          *_int4_codes(theirs["rotated"], theirs["scale"]))
        elif "norm" in theirs:  # a TurboQuant key
            _check_tq_key(where, x, data, scale[..., 0], theirs, 4 if name == "turboquant_4bit_nc" else 3)
        else:  # a TurboQuant value
            np.testing.assert_array_equal(_bits(data), theirs["data"], err_msg=f"{where} codes")
        if name.endswith("_per_token_head"):  # fp32 scale per token and head (int4: zero point in its low bits)
            np.testing.assert_array_equal(_bits(scale[..., 0]), theirs["scale"].view(np.uint8),
                                          err_msg=f"{where} scale")
        elif name.startswith("turboquant_") and side == "v":  # fp16 scale and zero
            np.testing.assert_array_equal(_bits(scale[..., 0]), theirs["scale"].view(np.uint8), err_msg=where)
            np.testing.assert_array_equal(_bits(zero[..., 0]), theirs["zero"].view(np.uint8), err_msg=where)
    if name.startswith("turboquant_"):
        bits = 4 if name in ("turboquant_4bit_nc", "turboquant_k8v4") else 3
        np.testing.assert_array_equal(_midpoints(head_dim, bits).numpy(), out[f"{case}.midpoints"])


TQ_CASES = [c for c in CASES if c[0].startswith("turboquant_")]


@pytest.mark.parametrize("name,model_dtype,head_dim", TQ_CASES, ids=[_case(*c) for c in TQ_CASES])
def test_kvviz_reads_vllms_turboquant_bytes_as_vllm_does(vllm_out, name, model_dtype, head_dim):
    """vLLM's own read of its TurboQuant slots (`_tq_full_dequant_kv`, fp16: keys norm * centroids, renormalized
    with "nc", in the rotated domain; values code * scale + zero) equals kvviz's read of the same bytes, bit for bit.
    (The interpreter sums c^2 in its own order and does not fuse code * scale + zero, where kvviz takes the correctly
    rounded sum and the GPU's FMA; on these inputs no fp16 result depends on it.) So a reconstructed key's norm
    differs from the stored fp16 norm by the fp16 rounding of its elements in vLLM as in kvviz."""
    import dataclasses

    from kvviz.formats import turboquant

    inputs, out = vllm_out
    case = _case(name, model_dtype, head_dim)
    kv = kvviz.parse_kv(f"vllm:{name}")

    def ours(fmt, x, fields):
        """kvviz's QTensor of x with vLLM's stored bytes in place of its own ([N, H, ...] -> [1, H, N, ...])."""
        q = fmt.quantize(x.permute(1, 0, 2).unsqueeze(0))
        return dataclasses.replace(q, **{f: torch.from_numpy(a).transpose(0, 1).unsqueeze(0) for f, a in fields})

    k, v = inputs[case]
    pairs = []
    if not name.endswith("k8v4"):
        qk = ours(kv.k, k, [("data", out[f"{case}.k_data"]), ("scale", out[f"{case}.k_norm"][..., None])])
        pairs.append(("k", turboquant.key_rotated(kv.k, qk), out[f"{case}.k_read"]))
    qv = ours(kv.v, v, [("data", out[f"{case}.v_data"]), ("scale", out[f"{case}.v_scale"][..., None]),
                        ("zero", out[f"{case}.v_zero"][..., None])])
    pairs.append(("v", turboquant.decode(kv.v, qv).to(torch.float16), out[f"{case}.v_read"]))
    for side, got, want in pairs:
        got = got[0].transpose(0, 1)  # [N, H, D]
        np.testing.assert_array_equal(_bits(got), want.view(np.uint8), err_msg=f"{case} {side}: vLLM's read")


def test_vllms_compiled_stores_round_as_kvviz_models_them(tmp_path):
    """What the interpreter cannot show, read from vLLM's kernels compiled for an H100 (Triton's default options):
    int8's `q +- 0.5` (the sign from the rounded product q = x * inv, as kvviz takes it) and int4's `x * inv + zp`
    are fused multiply-adds (fma.rn.f32, one per side and stream, and no other), and every fp8 store converts with
    cvt.rn.satfinite (nearest even, saturating), the host encoding the fp8 comparisons above use."""
    out = tmp_path / "ptx.json"
    _run_driver(str(out), "--ptx")
    facts = json.loads(out.read_text())
    fused = facts["fma"]
    assert sorted(fused["int8_per_token_head"]) == ["k_q = tl.where(k_q >= 0, k_q + 0.5, k_q - 0.5)",
                                                    "v_q = tl.where(v_q >= 0, v_q + 0.5, v_q - 0.5)"]
    int4_lines = {f"{s}_{p}_s = {s}_{p} * inv_{s} + {s}_zp_f" for s in "kv" for p in ("even", "odd")}
    assert len(fused["int4_per_token_head"]) == 4 and set(fused["int4_per_token_head"]) <= int4_lines
    assert facts["fp8_cvt"] == {"fp8_per_token_head": ["cvt.rn.satfinite.e4m3x2.f32"],
                                "fp8_e4m3": ["cvt.rn.satfinite.e4m3x2.f32"],
                                "fp8_e5m2": ["cvt.rn.satfinite.e5m2x2.f32"]}
