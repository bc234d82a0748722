"""Quantize new tokens of one side and write them into packed cache buffers, on the CPU: numba loops
(kernels/cpu_pack_jit.py), the CPU twin of kernels/pack.py with the same arguments, bit-identical to kvviz.formats.

Covers the formats whose groups lie inside one token, as `quant_pack` does: int8 / int4 / int2 sym and asym per
token or per token group, fp8 E4M3 / E5M2 per token or group and with static per-tensor / per-head scales, MX FP4
(mxfp4, fp4_mx_block16), NVFP4 (its global scale given as tensor_scale), each with /rot (the Hadamard rotation is one
torch matmul before the loop, as kvviz.formats rotates). llama.cpp's ggml types and channel formats are left to
kvviz.formats. Each buffer is handed over as the uint8 view of its storage with byte offset and strides: nothing is
copied, capacity strides are kept. `fmt` is duck-typed (kvviz Format attributes); nothing here imports kvviz.

    over = quant_pack_cpu(fmt, x, data, scale, zero, pos=cache_len, tensor_scale=ts)   # x: [B, Hkv, T_new, D]

    python -m kernels.cpu_pack      # first-use compile time (or numba cache load)
"""

from __future__ import annotations

import functools
import logging
import time

import torch

from kernels.pack import quant_pack_supported
from kernels.packed import hadamard, per_head

log = logging.getLogger(__name__)

_FP8_EXP = {"fp8_e4m3": 4, "fp8_e5m2": 5}
_NONE = torch.zeros(4, dtype=torch.uint8)  # stands for an absent buffer
_ONE = torch.ones(1)


@functools.cache
def _jit():
    """The jit module, imported once; None when numba is unavailable."""
    try:
        import numba  # noqa: F401

        from kernels import cpu_pack_jit
    except ImportError as err:
        log.warning("kvviz: numba is not installed (%s); the CPU cache appends through kvviz.formats. "
                    "pip install numba to fuse them.", err)
        return None
    return cpu_pack_jit


@functools.cache
def cpu_pack_usable() -> bool:
    """True when numba imports and the packer compiles (or loads from numba's cache) and passes a smoke test."""
    if _jit() is None:
        return False
    start = time.perf_counter()
    try:
        _smoke()
    except Exception as err:  # noqa: BLE001 - any compile or LLVM failure means: quantize with kvviz.formats
        log.warning("kvviz: the CPU quantize-and-pack failed to compile (%s: %s); appending through kvviz.formats.",
                    type(err).__name__, err)
        return False
    log.info("kvviz: CPU quantize-and-pack ready in %.1f s (numba compile or cache load)", time.perf_counter() - start)
    return True


def quant_pack_cpu_supported(fmt, head_dim: int) -> bool:
    """True when `quant_pack_cpu` writes this format at this head_dim (a power of two) and numba runs here."""
    return fmt.kind != "ggml" and quant_pack_supported(fmt, head_dim) and cpu_pack_usable()


def _kind(fmt, jit) -> int:
    if fmt.kind == "int":
        return jit.KIND_INT_ASYM if fmt.asym else jit.KIND_INT_SYM
    if fmt.kind == "fp4":
        return jit.KIND_NV if fmt.base == "nvfp4" else jit.KIND_MX
    return jit.KIND_FP8


def _bytes(t: torch.Tensor | None):
    """(uint8 numpy view of t's whole storage, byte offset, byte strides of dims 0..2); no copy."""
    if t is None:
        return _NONE.numpy(), 0, (0, 0, 0)
    assert t.device.type == "cpu", "quant_pack_cpu writes CPU tensors"
    assert t.dim() == 4 and t.stride(-1) == 1, "buffers must be [B, Hkv, cap, n] and contiguous along the last dim"
    size = t.element_size()
    flat = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    return flat.numpy(), t.storage_offset() * size, tuple(s * size for s in t.stride()[:3])


@functools.cache
def _rotation(head_dim: int) -> torch.Tensor:
    return hadamard(head_dim)  # the same fp32 matrix kvviz.formats rotates with, built once


def quant_pack_cpu(
    fmt,
    x: torch.Tensor,
    data: torch.Tensor,
    scale: torch.Tensor | None = None,
    zero: torch.Tensor | None = None,
    pos: int = 0,
    tensor_scale: torch.Tensor | float | None = None,
) -> int:
    """Quantize x and write it at token rows pos .. pos + T - 1 of the cache buffers, in place (CPU tensors).

    x:            [B, Hkv, T, D] float (fp16 / bf16 / fp32), D a power of two
    data:         [B, Hkv, cap, D * bits / 8]: int8 (int8 sym), uint8 (int8 asym, int4, int2, FP4), fp8 dtype
    scale:        [B, Hkv, cap, D / group]: fp16 (int), fp32 (fp8), uint8 E8M0 (MX), float8_e4m3fn (NV);
                  None for static per-tensor / per-head formats
    zero:         asym only, shaped and typed like an int scale (fp16)
    tensor_scale: the static fp32 scale (fp8 / int sym tensor or head granularity) or NV FP4's global scale:
                  a number, [] or anything holding Hkv or B * Hkv values
    The result is bit-identical to fmt.quantize(x) with that tensor scale (rotation included for /rot).
    Returns, for FP8 with a static scale, how many values of x lie beyond the format's range under it
    (|x| > fmax * scale * (1 + 1e-6), the count kvviz's cache warns about); 0 for other formats.
    """
    jit = _jit()
    if jit is None:
        raise ValueError("quant_pack_cpu needs numba (pip install numba); quantize with kvviz.formats instead.")
    batch, heads, n_tokens, head_dim = x.shape
    if fmt.kind == "ggml" or not quant_pack_supported(fmt, head_dim):
        raise ValueError(f"quant_pack_cpu does not write {fmt.spec} at head_dim {head_dim}; use fmt.quantize instead.")
    assert x.device.type == "cpu", "quant_pack_cpu quantizes CPU tensors; kernels.quant_pack runs on CUDA"
    assert data.shape[:2] == (batch, heads) and data.shape[2] >= pos + n_tokens, (
        f"data {tuple(data.shape)} cannot hold tokens {pos}..{pos + n_tokens - 1} of x {tuple(x.shape)}"
    )
    static = fmt.static_scale
    group = head_dim if static else (fmt.group or head_dim)
    assert data.shape[3] == head_dim * fmt.bits // 8, f"data's last dim must be D * {fmt.bits} / 8"
    if not static:
        assert scale is not None and scale.shape[:3] == data.shape[:3] and scale.shape[3] == head_dim // group, (
            f"scale must be [B, Hkv, cap, D / group], got {None if scale is None else tuple(scale.shape)}"
        )
    if fmt.asym:
        assert zero is not None and zero.shape == scale.shape, "asym formats need a zero buffer shaped like scale"
    if fmt.takes_scale and tensor_scale is None:
        raise ValueError(f"{fmt.spec} appends with a fixed tensor scale: pass tensor_scale.")
    ts = per_head(tensor_scale, batch, heads, "cpu") if fmt.takes_scale else _ONE.expand(batch * heads)
    count = fmt.kind == "float" and static
    meta = [0] * jit.META_LEN
    meta[jit.M_KIND], meta[jit.M_BITS], meta[jit.M_GROUP] = _kind(fmt, jit), fmt.bits, group
    meta[jit.M_FP8_EXP], meta[jit.M_STATIC], meta[jit.M_POS] = _FP8_EXP.get(fmt.base, 4), static, pos
    meta[jit.M_COUNT] = count and not fmt.rot  # /rot counts the input, before rotation, below
    x = x.detach()
    over = 0
    if fmt.rot:
        if count:
            limit = (ts * _fp8_max(fmt.base) * (1 + 1e-6)).reshape(batch, heads, 1, 1)  # as the loop computes it
            over = int((x.float().abs() > limit).sum())
        x = x.float() @ _rotation(head_dim)  # kvviz.formats rotates in fp32 the same way
    # torch divides an fp16 x by an fp16 scale in fp16 (int sym with computed scales only)
    meta[jit.M_HALF_DIV] = x.dtype == torch.float16 and fmt.kind == "int" and not (fmt.asym or static)
    data_np, meta[jit.M_D_OFF], (meta[jit.M_D_SB], meta[jit.M_D_SH], meta[jit.M_D_ST]) = _bytes(data)
    scale_np, meta[jit.M_S_OFF], (meta[jit.M_S_SB], meta[jit.M_S_SH], meta[jit.M_S_ST]) = _bytes(
        None if static else scale)
    zero_np, meta[jit.M_Z_OFF], (meta[jit.M_Z_SB], meta[jit.M_Z_SH], meta[jit.M_Z_ST]) = _bytes(zero)
    xf = x.float().contiguous()  # exact for fp16 / bf16
    over += jit.quant_pack_rows(xf.numpy(), torch.tensor(meta, dtype=torch.int64).numpy(), ts.contiguous().numpy(),
                                data_np, scale_np, zero_np)
    return int(over)


def _fp8_max(base: str) -> float:
    return 448.0 if base == "fp8_e4m3" else 57344.0


def _smoke() -> None:
    """Compile (or load from numba's cache) and check an int4 token against codes worked out by hand."""

    class _Int4:  # the duck-typed format: int4 per token
        base, kind, bits, granularity, group, asym, rot, static_scale, takes_scale, spec = (
            "int4", "int", 4, "token", None, False, False, False, False, "int4")

    x = torch.tensor([[[[7.0, -7.0, 3.0, 0.5]]]])  # amax 7: scale 1, codes 7, -7, 3, 0 (+8; 0.5 ties to even 0)
    data = torch.zeros(1, 1, 1, 2, dtype=torch.uint8)
    scale = torch.zeros(1, 1, 1, 1, dtype=torch.float16)
    quant_pack_cpu(_Int4(), x, data, scale)
    assert data.tolist() == [[[[0x1F, 0x8B]]]] and scale.item() == 1.0, f"CPU pack smoke test: {data}, {scale}"


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    t0 = time.perf_counter()
    print(f"cpu_pack_usable: {cpu_pack_usable()}  ({time.perf_counter() - t0:.1f} s incl. compile or cache load)")
