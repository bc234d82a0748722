"""Quantize new tokens of one side and write them into packed cache buffers, on the CPU: numba loops
(kernels/cpu/jit/pack.py), the CPU twin of kernels/pack.py with the same arguments, bit-identical to kvviz.formats.

Covers the formats whose groups lie inside one token, as `quant_pack` does: int8 / int4 / int2 sym and asym per
token or per token group, fp8 E4M3 / E5M2 per token or group and with static per-tensor / per-head scales, MX FP4
(mxfp4, fp4_mx_block16), NVFP4 (its global scale given as tensor_scale), and llama.cpp's KV types (q8_0, q4_0, q4_1,
q5_0, q5_1, iq4_nl, in kvviz.formats.ggml's block layout), vLLM's stores (int8 / fp8 / int4 per token head, NVFP4
and 4over6, TurboQuant keys and values: kernels/cpu/jit/pack_engines.py), each kvviz format with /rot (the Hadamard
rotation is one torch matmul before the loop, as kvviz.formats rotates), and any format whose layout names one of
these loops (`layout.packer`): the int loops write any width of 1..8 bits in kvviz's order (3 bits: 8 codes in 3
bytes). Channel formats are left to kvviz.formats. Each buffer is handed over as a uint8 numpy view of its memory:
nothing is copied. `fmt` is duck-typed (kvviz Format attributes, its `layout(head_dim)` above all: the plan is read
from it, never from the format's name); nothing here imports kvviz.

    over = quant_pack_cpu(fmt, x, data, scale, zero, pos=cache_len, tensor_scale=ts)   # x: [B, Hkv, T_new, D]

    python -m kernels.cpu.pack      # first-use compile time (or numba cache load)
"""

from __future__ import annotations

import functools
import logging
import time
from typing import NamedTuple

import numpy as np
import torch

from kernels.pack import token_packer
from kernels.packed import ENGINE_PACKER, GGML_TYPES, PACKERS, layout_of, per_head

log = logging.getLogger(__name__)

_NONE = torch.zeros(1, 1, 1, 4, dtype=torch.uint8).numpy()  # stands for an absent buffer
KIND_ENGINE = -1  # a plan's kind for the engines' stores (plan.engine says which)
# the model's dtype as kernels/cpu/jit/pack_engines.py's DT_* (int4_per_token_head rounds its rotation to it)
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_ONE = torch.ones(1).numpy()


@functools.cache
def _jit():
    """The jit module, imported once; None when numba is unavailable."""
    try:
        import numba  # noqa: F401

        from kernels.cpu.jit import pack as jit
    except ImportError as err:
        log.warning("kvviz: numba is not installed (%s); the CPU cache appends through kvviz.formats. "
                    "pip install numba to fuse them.", err)
        return None
    return jit


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
    return _plan(fmt, head_dim) is not None and cpu_pack_usable()


class _Plan(NamedTuple):
    """What the loop needs to know of a format, read from it once."""

    kind: int
    bits: int
    exp: int  # fp8 exponent bits
    group: int
    static: bool
    takes_scale: bool
    count: bool  # static fp8: count values beyond the range
    rot: bool
    fmax: float
    ggml: int  # llama.cpp's type (its index in GGML_TYPES), -1 for kvviz's formats
    engine: int = -1  # an engine's store (kernels/cpu/jit/pack_engines.py's EN_*), -1 for kvviz's formats
    aux: np.ndarray | None = None  # fp32: int4_per_token_head's RHT signs, TurboQuant's codebook midpoints
    rotation: torch.Tensor | None = None  # /rot: the fp32 [D, D] matrix x is multiplied by before the loop


@functools.lru_cache(maxsize=256)
def _plan(fmt, head_dim: int) -> _Plan | None:
    """The format's plan at this head_dim, read from its layout (`layout.packer` names the loop), or None when
    quant_pack_cpu does not write it."""
    jit = _jit()
    if jit is None:
        return None
    if getattr(fmt, "rot", False) and head_dim & (head_dim - 1):  # a Hadamard rotation needs a power of two
        return None
    layout = layout_of(fmt, head_dim)
    _, engine, name = (layout.packer or "").partition(ENGINE_PACKER) if layout is not None else ("", "", "")
    if engine:
        return _engine_plan(layout, name, head_dim)
    if layout is not None and layout.packer == "ggml":  # blocks of 32 along head_dim
        if head_dim % 32 or layout.ggml_type not in GGML_TYPES:
            return None
        return _Plan(jit.KIND_GGML, layout.bits, 0, 32, False, False, False, fmt.rot, 0.0,
                     GGML_TYPES.index(layout.ggml_type), rotation=layout.rotation)
    layout = token_packer(fmt, head_dim)
    if layout is None or layout.packer == "ggml" or not 1 <= layout.bits <= 8:
        return None
    if head_dim % (8 // layout.bits if 8 % layout.bits == 0 else 8):  # whole bytes, or whole 8-code words
        return None
    kind = PACKERS.index(layout.packer)  # jit.KIND_INT_SYM .. KIND_NV, in PACKERS' order
    static = fmt.static_scale
    group = head_dim if static else (layout.group or head_dim)
    fmax = layout.fmax or 57344.0
    return _Plan(kind, layout.bits, layout.fp8_exp or 4, group, static, fmt.takes_scale,
                 kind == jit.KIND_FP8 and static, fmt.rot, fmax, -1, rotation=layout.rotation)


def _engine_plan(layout, name: str, head_dim: int) -> _Plan | None:
    """An engine's store (its layout's packer "engine:EN_*" names kernels/cpu/jit/pack_engines.py's code, its
    pack_table the fp32 table that encoder reads) as a plan."""
    from kernels.cpu.jit import pack_engines as jit

    if head_dim < 8 or head_dim & (head_dim - 1) or not hasattr(jit, name):
        return None
    aux = layout.pack_table
    aux = np.ones(1, np.float32) if aux is None else aux.detach().to("cpu", torch.float32).contiguous().numpy()
    group = layout.group or head_dim  # channels per stored scale: NVFP4's 16, else the row
    return _Plan(KIND_ENGINE, layout.bits, 0, group, False, False, False, False, 0.0, -1, getattr(jit, name), aux)


def _bytes(t: torch.Tensor | None):
    """t [B, Hkv, cap, n] as the uint8 numpy array [B, Hkv, cap, n * element_size] over its memory; no copy."""
    if t is None:
        return _NONE
    assert t.device.type == "cpu", "quant_pack_cpu writes CPU tensors"
    assert t.dim() == 4 and t.stride(-1) == 1, "buffers must be [B, Hkv, cap, n] and contiguous along the last dim"
    return t.view(torch.uint8).numpy()


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

    x:            [B, Hkv, T, D] float (fp16 / bf16 / fp32), D a power of two (llama.cpp's types: a multiple of 32)
    data:         [B, Hkv, cap, D * bits / 8]: int8 (int8 sym, q8_0), uint8 (int8 asym, int4, int2, FP4, ggml's 4/5-bit
                  blocks), fp8 dtype
    scale:        [B, Hkv, cap, D / group]: fp16 (int, ggml's d), fp32 (fp8), uint8 E8M0 (MX), float8_e4m3fn (NV);
                  None for static per-tensor / per-head formats
    zero:         asym and q4_1 / q5_1 (ggml's m) only, shaped and typed like an int scale (fp16)
    tensor_scale: the static fp32 scale (fp8 / int sym tensor or head granularity) or NV FP4's global scale:
                  a number, [] or anything holding Hkv or B * Hkv values
    The result is bit-identical to fmt.quantize(x) with that tensor scale (rotation included for /rot).
    Returns, for FP8 with a static scale, how many values of x lie beyond the format's range under it
    (|x| > fmax * scale * (1 + 1e-6), the count kvviz's cache warns about); 0 for other formats.
    """
    batch, heads, n_tokens, head_dim = x.shape
    plan = _plan(fmt, head_dim)
    if plan is None:
        if _jit() is None:
            raise ValueError("quant_pack_cpu needs numba (pip install numba); quantize with kvviz.formats instead.")
        raise ValueError(f"quant_pack_cpu does not write {fmt.spec} at head_dim {head_dim}; use fmt.quantize instead.")
    assert x.device.type == "cpu", "quant_pack_cpu quantizes CPU tensors; kernels.quant_pack runs on CUDA"
    assert data.shape[:2] == (batch, heads) and data.shape[2] >= pos + n_tokens, (
        f"data {tuple(data.shape)} cannot hold tokens {pos}..{pos + n_tokens - 1} of x {tuple(x.shape)}"
    )
    assert data.shape[3] == head_dim * plan.bits // 8, f"data's last dim must be D * {plan.bits} / 8"
    if not plan.static:
        assert scale is not None and scale.shape[:3] == data.shape[:3] and scale.shape[3] == head_dim // plan.group, (
            f"scale must be [B, Hkv, cap, D / group], got {None if scale is None else tuple(scale.shape)}"
        )
    if zero is not None or plan.kind == _jit().KIND_INT_ASYM:
        assert zero is not None and zero.shape == scale.shape, "asym formats need a zero buffer shaped like scale"
    if not plan.takes_scale:
        ts = _ONE
    elif tensor_scale is None:
        raise ValueError(f"{fmt.spec} appends with a fixed tensor scale: pass tensor_scale.")
    else:
        ts = torch.as_tensor(tensor_scale, dtype=torch.float32).detach().reshape(-1).cpu().numpy()
        assert ts.size in (1, heads, batch * heads), f"tensor scale holds {ts.size} values; want 1, Hkv or B*Hkv"
    x = x.detach()
    if plan.engine >= 0:
        from kernels.cpu.jit import pack_engines

        pack_engines.engine_pack_rows(x.float().contiguous().numpy(), _bytes(data), _bytes(scale), _bytes(zero),
                                      plan.engine, plan.bits, pos, plan.aux, DTYPE_CODES.get(x.dtype, 0))
        return 0
    over = 0
    if plan.rot:
        if plan.count:  # the cache counts its input, before the rotation, as the formats path does
            limit = (per_head(tensor_scale, batch, heads, "cpu") * plan.fmax * (1 + 1e-6)).reshape(batch, heads, 1, 1)
            over = int((x.float().abs() > limit).sum())
        x = x.float() @ plan.rotation  # the layout's fp32 matrix: kvviz.formats rotates in fp32 the same way
    # torch divides an fp16 x by an fp16 scale in fp16 (int sym with computed scales only)
    half_div = x.dtype == torch.float16 and plan.kind == _jit().KIND_INT_SYM and not plan.static
    xf = x.float().contiguous().numpy()  # exact for fp16 / bf16
    if plan.ggml >= 0:
        _jit().ggml_pack_rows(xf, _bytes(data), _bytes(scale), _bytes(zero), plan.ggml, plan.bits, pos)
        return 0
    over += _jit().quant_pack_rows(xf, ts, _bytes(data), _bytes(None if plan.static else scale), _bytes(zero),
                                   plan.kind, plan.bits, plan.exp, plan.group, plan.static, half_div, pos,
                                   plan.count and not plan.rot)
    return int(over)


class _Int4Layout(NamedTuple):
    """int4 per token as kvviz.formats' int family states its layout (the fields the kernels read)."""

    group: int
    elem: str = "int"
    bits: int = 4
    storage: str = "kvviz"
    per_unit: int = 2
    unit_bytes: int = 1
    offset: int = 8
    scale_kind: str = "token"
    zero: bool = False
    rotation: torch.Tensor | None = None
    packer: str = "int_sym"
    pack_table: torch.Tensor | None = None
    fp8_exp: int = 0
    fmax: float = 0.0
    ggml_type: str | None = None

    def kernel_fields(self) -> dict:
        return dict(elem=self.elem, bits=self.bits, offset=self.offset, scale_kind=self.scale_kind, group=self.group,
                    layout=self.storage)


class _Int4:
    """The duck-typed format the smoke tests write and read: int4 per token (kernels/cpu/step.py's too)."""

    spec, kind, bits, granularity, group, asym, rot, static_scale, takes_scale, has_layout = (
        "int4", "int", 4, "token", None, False, False, False, False, True)

    def layout(self, head_dim: int) -> _Int4Layout:
        return _Int4Layout(group=head_dim)


def _smoke() -> None:
    """Compile (or load from numba's cache) and check an int4 token against codes worked out by hand."""

    x = torch.tensor([[[[7.0, -7.0, 3.0, 0.5]]]])  # amax 7: scale 1, codes 7, -7, 3, 0 (+8; 0.5 ties to even 0)
    data = torch.zeros(1, 1, 1, 2, dtype=torch.uint8)
    scale = torch.zeros(1, 1, 1, 1, dtype=torch.float16)
    quant_pack_cpu(_Int4(), x, data, scale)
    assert data.tolist() == [[[[0x1F, 0x8B]]]] and scale.item() == 1.0, f"CPU pack smoke test: {data}, {scale}"


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    t0 = time.perf_counter()
    print(f"cpu_pack_usable: {cpu_pack_usable()}  ({time.perf_counter() - t0:.1f} s incl. compile or cache load)")
