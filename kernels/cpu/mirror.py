"""Append one token to one side of a batched-rows cache and write its dequantized values into the rows' mirror, in
one numba call (kernels/cpu/jit/mirror.py): what kvviz.cache.row_stack otherwise does in two steps per side and step
(quant_pack_cpu, then the torch decode of the new row and a copy into the mirror).

The values written equal kvviz.formats' torch decode bit for bit (tests/test_quality.py compares the two paths'
mirrors and buffers), so the rows' attention reads what it read before. Formats: those whose layout names one of
kvviz's token-group packers (kernels.packed.PACKERS: ints of 2, 4, 8 bits, sym and asym; fp8 per token, per group,
static per tensor / head; MX and NV FP4), without /rot; an fp32 model (the mirror in fp32). Everything else keeps
the two-step path.

    app = MirrorAppend(fmt, bufs, tensor_scale)      # bufs: (data, scale, zero) [B, Hkv, cap, n], after reserve
    over = app.run(x, pos, rows, at, mirror)         # x [B, Hkv, 1, D] fp32; mirror: fp32 numpy [R, Hkv, cap, D]
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from kernels.cpu import pack as cpu_pack
from kernels.cpu import step as cpu_step
from kernels.cpu.meta import table
from kernels.packed import layout_of


@functools.cache
def _jit():
    """The jit module, or None where the fused step does not run (no numba, or a failed compile)."""
    if not cpu_step.step_usable():
        return None
    from kernels.cpu.jit import mirror as jit

    return jit


def supports(fmt, head_dim: int) -> bool:
    """Whether MirrorAppend writes a side of `fmt` at head_dim (see the module docstring)."""
    if fmt.rot:
        return False
    plan = cpu_pack._plan(fmt, head_dim)  # kvviz's token-group packers only: no channel groups, no static asym
    return plan is not None and plan.engine < 0 and plan.ggml < 0 and plan.bits in (2, 4, 8) and _jit() is not None


@functools.cache
def _half_table() -> np.ndarray:
    """Every fp16 bit pattern's fp32 value (65,536 entries): fp16 scales and zeros read exactly."""
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def _codes(layout, data: torch.Tensor) -> np.ndarray:
    """fp32 [2**bits]: a stored code's value before its scale, as kvviz.formats decodes it (int8 sym: two's
    complement bytes, through data's dtype)."""
    return table(layout.elem, layout.bits, layout.offset, data.dtype).numpy()


def _scale_kind(jit, scale: torch.Tensor | None) -> tuple[int, np.ndarray]:
    """How a stored scale (and zero) is read: (S_* kind, its table)."""
    none = np.zeros(1, np.float32)
    if scale is None:
        return jit.S_STATIC, none
    if scale.dtype == torch.float16:
        return jit.S_HALF, _half_table()
    if scale.dtype == torch.float32:
        return jit.S_F32, none
    if scale.dtype == torch.uint8:  # E8M0
        return jit.S_BYTE, table("scale", 8, 0, torch.uint8).numpy()
    if scale.dtype == torch.float8_e4m3fn:
        return jit.S_BYTE, table("fp8_e4m3", 8, 0, None).numpy()
    raise AssertionError(f"no exact read for {scale.dtype} scales")


class MirrorAppend:
    """One side's appends, bound to its buffers (build again when `bound` says they moved)."""

    def __init__(self, fmt, bufs, tensor_scale):
        data, scale, _ = bufs
        jit = _jit()
        self.held = tuple(bufs)  # the buffer tensors this binding was built over
        head_dim = data.shape[3] * 8 // int(fmt.bits)
        plan, self.pk, self.bufs = cpu_step.packing_args(fmt, bufs, tensor_scale, head_dim)
        layout = layout_of(fmt, head_dim)
        skind, stab = _scale_kind(jit, None if plan.static else scale)
        self.read = (_codes(layout, data), int(plan.bits), int(plan.group), skind, stab, self.pk[0],
                     layout.packer == "nv", layout.packer == "int_asym")
        self.fn = jit.append_mirror

    def bound(self, bufs) -> bool:
        return cpu_step.same_buffers(self.held, tuple(bufs))

    def run(self, x: torch.Tensor, pos: int, rows: np.ndarray, at: int, mirror: np.ndarray) -> int:
        """Pack x [B, Hkv, 1, D] (fp32) at buffer row pos; write its values to mirror[rows[b], :, at]. Returns the
        values saturated under a static fp8 scale."""
        xn = cpu_step.c_order(x.detach().numpy())
        return int(self.fn(xn, self.pk, *self.bufs, pos, *self.read, rows, at, mirror))
