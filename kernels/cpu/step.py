"""One decode step of one cache layer on the CPU in one numba call: append the new token's K and V to the packed
buffers (quantize, pack, write: kernels/cpu/jit/pack.py's loops) and attend over them, that token included
(kernels/cpu/jit/decode.py's loops); the jit code is kernels/cpu/jit/step.py.

The two launchers it fuses (kernels/cpu/pack.py, kernels/cpu/decode.py) derive their arguments on every call; a
`DecodeStep` derives them once per buffer set (`bind`: the numpy views over the buffers, the decode tables and
meta vectors, the packing plans, scratch for the splits), so a step costs the glue of one call: new K/V and q as
numpy views (no copy for fp32 CPU tensors), the mask if any, and the call. Buffers grow by doubling outside the
step: the cache side reserves a row and binds again when its rows reach `capacity` or the buffers moved.

Formats: what both launchers cover, token-granular (int, fp8, MX / NV FP4, llama.cpp's six types, /rot, and the
engines' stores: vLLM's int8 / fp8 / int4 per-token-head, NVFP4 and 4over6, TurboQuant's keys and values); no tail
(residual window) and no channel scales (KIVI): those keep the two-call path, as do TQ-mse and TQ-prod (no CPU
packer). /rot rotates K, V and q with a torch matmul before the call and the output after it, as both launchers do
(the same fp32 matmul kvviz.formats quantizes with, so the stored bytes match). The engines' rotations are the
packer's own, in numba (int4's RHT butterfly, a TurboQuant key's Hadamard product in the format's fixed order); q
takes rotation^T, the output the rotation.

    step = DecodeStep(k_fmt, v_fmt)
    step.bind(k_bufs, v_bufs, k_scale, v_scale, q_heads)      # (data, scale, zero) [B, Hkv, cap, n] each
    out, over_k, over_v = step.run(k_new, v_new, q, start, pos, kv_mask=None, sm_scale=None, sinks=None, softcap=None)
    # k_new, v_new [B, Hkv, 1, D], q [B, Hq, 1, D], out [B, 1, Hq, D_v]: as the attention function has them
"""

from __future__ import annotations

import functools
import logging
import math
import time

import numpy as np
import torch

from kernels.cpu import decode as cpu_decode
from kernels.cpu import meta as cpu_meta
from kernels.cpu import pack as cpu_pack
from kernels.cpu.jit import contract
from kernels.packed import per_head, side_from_format
from kernels.splits import split_tokens

log = logging.getLogger(__name__)


@functools.cache
def _jit():
    """The jit module (imported once; numba's threads sized by kernels/cpu/decode.py), or None without numba."""
    if cpu_decode._jit() is None or cpu_pack._jit() is None:
        return None
    from kernels.cpu.jit import step as jit

    return jit


@functools.cache
def step_usable() -> bool:
    """True when the fused step runs here: both launchers and the step compile (or load from numba's cache) and
    pass their smoke tests. Timed and logged once."""
    if not (cpu_decode.cpu_usable() and cpu_pack.cpu_pack_usable()) or _jit() is None:
        return False
    start = time.perf_counter()
    try:
        _smoke()
    except Exception as err:  # noqa: BLE001 - any compile or LLVM failure means: the two-call path
        log.warning("kvviz: the fused CPU decode step failed to compile (%s: %s); appending and attending in two "
                    "calls.", type(err).__name__, err)
        return False
    log.info("kvviz: fused CPU decode step ready in %.1f s (numba compile or cache load)", time.perf_counter() - start)
    return True


def warm_up() -> bool:
    """Compile (or load from numba's disk cache) every CPU kernel now, so that no generation pays for it: the
    decode, the packers and the fused step. Returns whether the fused step runs here."""
    return step_usable()


def fuses(fmt, head_dim: int) -> bool:
    """Whether a side of `fmt` at head_dim can take the one-call step: both launchers cover it (token scales, a
    CPU packer, a decode branch; not the lossless casts, which keep DynamicCache's exact read)."""
    if getattr(fmt, "granularity", None) in (None, "channel") or not cpu_decode.supports(fmt):
        return False
    return step_usable() and cpu_pack.quant_pack_cpu_supported(fmt, head_dim)


def _as_bytes(t: torch.Tensor | None) -> np.ndarray:
    """A buffer [B, Hkv, cap, n] as the uint8 numpy array [B, Hkv, cap, n * element_size] over its memory."""
    return cpu_pack._bytes(t)


def same_buffers(held: tuple | None, bufs: tuple) -> bool:
    """Whether a binding made over the buffer tensors `held` (data, scale, zero, ...; None where absent) still
    serves `bufs`: the very same tensors. The binding holds them, so an id is never reused; a buffer that grew or
    was reordered is a new tensor."""
    if held is None or len(held) != len(bufs):
        return False
    for mine, theirs in zip(held, bufs):
        if mine is not theirs:
            return False
    return True


def c_order(a: np.ndarray) -> np.ndarray:
    """a itself when it is C-contiguous (the common case, checked without a call into numpy), else a copy that is."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def packing_args(fmt, bufs, tensor_scale, head_dim: int) -> tuple:
    """(plan, pk, views) for jit/step.py's `_append` into one side's buffers: the format's packing plan
    (kernels/cpu/pack.py), pk = (ts, kind, bits, exp, group, static, half_div, count, ggml, engine, aux, xdt) for
    fp32 tokens (half_div and xdt as an fp32 model has them), and the uint8 views (data, scale, zero) it writes;
    a static scale's format has no scale buffer."""
    data, scale, zero = bufs
    plan = cpu_pack._plan(fmt, head_dim)
    if not plan.takes_scale:
        ts = np.ones(1, np.float32)
    else:
        ts = torch.as_tensor(tensor_scale, dtype=torch.float32).detach().reshape(-1).contiguous().numpy()
    aux = plan.aux if plan.engine >= 0 else np.ones(1, np.float32)
    pk = (ts, int(plan.kind), int(plan.bits), int(plan.exp), int(plan.group), bool(plan.static), False,
          bool(plan.count and not plan.rot), int(plan.ggml), int(plan.engine), aux, 0)
    return plan, pk, (_as_bytes(data), _as_bytes(None if plan.static else scale), _as_bytes(zero))


class _Side:
    """What one side's step arguments hold: the packing plan, the pack views and decode.py's side arguments."""

    def __init__(self, fmt, bufs, tensor_scale, batch: int, heads: int, head_dim: int):
        data, scale, zero = bufs
        plan, self.pk, self.bufs = packing_args(fmt, bufs, tensor_scale, head_dim)
        self.fmt, self.plan = fmt, plan
        self.engine = plan.engine >= 0  # an engine's store: quantized by kernels/cpu/jit/pack_engines.py
        self.half_div_pk = self.pk[:6] + (True,) + self.pk[7:]  # an fp16 model's int sym: torch divides in fp16
        self.half_div_ok = plan.kind == cpu_pack._jit().KIND_INT_SYM and not plan.static
        self.pk_by_dtype: dict = {}
        side = side_from_format(fmt, data, scale, zero, tensor_scale, head_dim=head_dim)
        self.rotation = side.rotation  # x = stored @ rotation: q takes rotation^T, the output rotation
        # ... as numpy matmuls: torch's on a [Hq, D] x [D, D] product enters its thread pool, whose barrier waits
        # for a descheduled worker on a busy machine (30-75 ms a call measured at load 30 on 2 cores, numpy 10 us)
        self.rot_np = None if side.rotation is None else side.rotation.detach().float().contiguous().numpy()
        self.rot_t_np = None if side.rotation is None else np.ascontiguousarray(self.rot_np.T)
        self.x_rotation = side.rotation if plan.rot else None  # /rot: the new token is rotated before it is packed
        self.static_limit = None
        if plan.count and plan.rot:  # the count is of the input, before the rotation (as quant_pack_cpu)
            self.static_limit = (per_head(tensor_scale, batch, heads, "cpu") * plan.fmax * (1 + 1e-6)
                                 ).reshape(batch, heads, 1, 1)
        meta, flat, lut, scale_np, zero_np, slut, ts_d, tz_d = cpu_meta.buffer_args(side, batch, heads, head_dim)
        self.decode = (meta, flat, lut, scale_np, zero_np, slut, ts_d, tz_d, cpu_meta.NONE_NP)
        self.per_byte, self.ggml_nibbles = cpu_meta.codes_per_unit(side), cpu_meta.ggml_nibbles(side)

    def pk_for(self, dtype: torch.dtype) -> tuple:
        """The packing plan for new tokens of the model's dtype."""
        pk = self.pk_by_dtype.get(dtype)
        if pk is None:
            pk = self.pk
            if self.half_div_ok and dtype == torch.float16:
                pk = self.half_div_pk
            elif self.engine:  # int4_per_token_head rounds its rotated values to the model's dtype
                pk = self.pk[:11] + (cpu_pack.DTYPE_CODES.get(dtype, 0),)
            self.pk_by_dtype[dtype] = pk
        return pk

    def new_token(self, x: torch.Tensor) -> tuple[np.ndarray, int]:
        """x [B, Hkv, 1, D] -> (fp32 numpy array to pack, values beyond a static fp8 scale counted before /rot)."""
        x = x.detach()
        over = 0
        if self.x_rotation is not None:
            if self.static_limit is not None:
                over = int((x.float().abs() > self.static_limit).sum())
            x = x.float() @ self.x_rotation  # as kvviz.formats rotates: fp32
        if x.dtype != torch.float32:
            x = x.float()  # exact for fp16 / bf16
        return c_order(x.numpy()), over


class DecodeStep:
    """One cache layer's fused append-and-attend (see the module docstring). Build once per layer; `bind` when
    the buffers are new; `run` per decode step."""

    def __init__(self, k_fmt, v_fmt):
        self.k_fmt, self.v_fmt = k_fmt, v_fmt
        self.held = None  # the buffer tensors bind() was built over (k data, scale, zero, v data, scale, zero)
        self.q_heads = None

    def bound(self, k_bufs, v_bufs, q_heads: int) -> bool:
        """Whether bind() was built over these very buffer tensors and q heads."""
        return same_buffers(self.held, (*k_bufs, *v_bufs)) and q_heads == self.q_heads

    def bind(self, k_bufs, v_bufs, k_scale, v_scale, q_heads: int) -> None:
        """Derive every argument fixed by the buffers. k_bufs / v_bufs: (data, scale, zero) tensors [B, Hkv, cap,
        n] (scale / zero None where the format has none); k_scale / v_scale: static or global scales or None."""
        batch, heads = k_bufs[0].shape[:2]
        dk = k_bufs[0].shape[3] * 8 // int(self.k_fmt.bits)
        dv = v_bufs[0].shape[3] * 8 // int(self.v_fmt.bits)
        self.k = _Side(self.k_fmt, k_bufs, k_scale, batch, heads, dk)
        self.v = _Side(self.v_fmt, v_bufs, v_scale, batch, heads, dv)
        self.batch, self.heads, self.q_heads, self.dk, self.dv = batch, heads, q_heads, dk, dv
        self.q_order = (cpu_meta.planar_np(dk, self.k.per_byte, self.k.ggml_nibbles) if self.k.per_byte > 1
                        else np.arange(dk)).astype(np.int64)
        self.out_order = (cpu_meta.unplanar_np(dv, self.v.per_byte, self.v.ggml_nibbles) if self.v.per_byte > 1
                          else np.arange(dv)).astype(np.int64)
        self.qp = np.empty((batch, q_heads, dk), np.float32)
        self.outp = np.empty((batch, q_heads, dv), np.float32)
        self.lengths = np.zeros(batch, np.int64)
        self.threads = _jit().nb.get_num_threads()
        self.units = 0
        self._scratch(1)
        # fp32 tokens and q go to the call as they are (numpy views): no rotation on either side
        self.plain = self.k.x_rotation is None and self.v.x_rotation is None and self.k.rotation is None \
            and self.v.rotation is None
        self.held = (*k_bufs, *v_bufs)
        self.capacity = min(t.shape[2] for t in self.held if t is not None)  # rows the step may write up to
        self.rows = batch * heads
        self.q_shape, self.out_shape = (batch, q_heads, 1, dk), (batch, 1, q_heads, self.dv)
        self.sm_scale = 1.0 / math.sqrt(dk)
        jit = _jit()
        self.parallel_fn, self.serial_fn = jit.step_parallel, jit.step_serial
        self._side_args = {}  # (K, V dtype) -> both sides' call arguments (packing plan, views, decode arguments)

    def _scratch(self, units: int) -> None:
        """mid_m, mid_l, mid_acc for `units` work items (grown by doubling, never per step)."""
        gqa = self.q_heads // self.heads
        self.units = max(units, 2 * self.units)
        self.mid_m = np.empty((self.units, gqa), np.float32)
        self.mid_l = np.empty((self.units, gqa), np.float32)
        self.mid_acc = np.empty((self.units, gqa, self.dv), np.float32)

    def run(self, k_new: torch.Tensor, v_new: torch.Tensor, q: torch.Tensor, start: int, pos: int,
            kv_mask: torch.Tensor | None = None, sm_scale: float | None = None, sinks: torch.Tensor | None = None,
            softcap: float | None = None, parallel: bool | None = None) -> tuple[torch.Tensor, int, int]:
        """Write the new token at row `pos` and attend over rows start..pos.

        k_new, v_new: [B, Hkv, 1, D_k / D_v] (model dtype); q: [B, Hq, 1, D_k]; kv_mask: None or bool
        [B, >= pos + 1 - start], True = attend; sinks: [Hq] or None; softcap: float or None; parallel: numba's
        pool for the work items (None: from cpu_decode._PARALLEL_ROWS batch x KV-head x token rows up, as the
        decode; kvviz passes its runtime's cpu_parallel_rows, env KVVIZ_CPU_PARALLEL_ROWS).
        Returns (out [B, 1, Hq, D_v] in q's dtype, the attention function's layout, and the token's K and V values
        saturated under a static fp8 scale)."""
        views = _fp32_views(k_new, v_new, q) if self.plain else None
        if views is not None:  # fp32 CPU tensors, no rotation: numpy views of them go to the call as they are
            xk, xv, qn = views
            over_k = over_v = 0
            dtypes = _FP32_PAIR
        else:
            xk, over_k = self.k.new_token(k_new)
            xv, over_v = self.v.new_token(v_new)
            dtype = q.dtype
            qn = q.detach().float().numpy()
            if self.k.rot_t_np is not None:
                qn = qn @ self.k.rot_t_np  # score = (q @ R^T) . stored
            qn = c_order(qn)
            dtypes = (k_new.dtype, v_new.dtype)
        if qn.shape != self.q_shape:
            raise ValueError(f"q has shape {tuple(qn.shape)}; the step was bound for {self.q_shape} (one decode "
                             "token per row).")
        length = pos + 1 - start
        rows = self.rows
        if parallel is None:
            parallel = rows * length >= cpu_decode._PARALLEL_ROWS
        splits, per_split = split_tokens(length, rows, self.threads if parallel else 1, contract.BLOCK)
        if rows * splits > self.units:
            self._scratch(rows * splits)
        mask, has_mask, sink, has_sinks = cpu_decode._NO_MASK, False, cpu_decode._NO_SINKS, False
        if kv_mask is not None:
            mask, has_mask = np.ascontiguousarray(kv_mask.detach().numpy()).view(np.uint8), True
        if sinks is not None:
            sink, has_sinks = sinks.detach().float().reshape(-1).contiguous().numpy(), True
            if sink.size != self.q_heads:
                raise ValueError(f"sinks holds {sink.size} values; pass one logit per query head ({self.q_heads}).")
        side_args = self._side_args.get(dtypes)
        if side_args is None:
            k, v = self.k, self.v
            side_args = self._side_args[dtypes] = (k.pk_for(dtypes[0]), k.bufs, *k.decode,
                                                   v.pk_for(dtypes[1]), v.bufs, *v.decode)
        sm = self.sm_scale if sm_scale is None else float(sm_scale)
        out = np.empty(self.out_shape, np.float32)
        with cpu_decode._LOCK:
            over = (self.parallel_fn if parallel else self.serial_fn)(
                xk, xv, qn, self.q_order, self.qp, start, pos, self.lengths, mask, has_mask, sm, float(softcap or 0.0),
                self.heads, splits, per_split, *side_args, self.mid_m, self.mid_l, self.mid_acc, sink, has_sinks,
                self.outp, self.out_order, out)
        if views is None and self.v.rot_np is not None:
            out = out @ self.v.rot_np
        result = torch.from_numpy(out)
        if views is None:
            if dtype != torch.float32:
                result = result.to(dtype)
        return result, int(over[0]) + over_k, int(over[1]) + over_v


_F32 = np.dtype(np.float32)
_FP32_PAIR = (torch.float32, torch.float32)


def _fp32_views(k_new: torch.Tensor, v_new: torch.Tensor, q: torch.Tensor) -> tuple | None:
    """C-ordered numpy views of three fp32 CPU tensors, or None where any is not one (another dtype, another
    device, a tensor that requires grad). One call into torch per tensor: at a decode step the layer's code and
    data are cold, and each torch property read costs microseconds there."""
    try:
        xk, xv, qn = k_new.numpy(), v_new.numpy(), q.numpy()
    except (RuntimeError, TypeError):  # requires grad; a dtype numpy lacks (bfloat16); not on the CPU
        return None
    if xk.dtype is not _F32 or xv.dtype is not _F32 or qn.dtype is not _F32:
        return None
    return c_order(xk), c_order(xv), c_order(qn)


def _smoke() -> None:
    """Two int4 tokens appended one step at a time (both entry points), checked against a direct computation."""

    keys = torch.tensor([[[[7.0, 0.0, 0.0, 0.0]]], [[[0.0, 7.0, 0.0, 0.0]]]])  # [2 steps, 1, 1, D]: int4 exact
    q = torch.tensor([[[[1.0, 0.0, 0.0, 0.0]]]])  # [B, Hq, 1, D]
    bufs = (torch.zeros(1, 1, 2, 2, dtype=torch.uint8), torch.zeros(1, 1, 2, 1, dtype=torch.float16), None)
    for parallel in (False, True):
        step = DecodeStep(cpu_pack._Int4(), cpu_pack._Int4())  # the duck-typed int4 per token
        step.bind(bufs, bufs, None, None, 1)
        for pos in range(2):
            out, _, _ = step.run(keys[pos][None], keys[pos][None], q, 0, pos, sm_scale=1.0, parallel=parallel)
        want = torch.softmax(keys[:, 0, 0] @ q[0, 0, 0], 0) @ keys[:, 0, 0]
        assert torch.allclose(out[0, 0, 0], want, atol=1e-5), f"CPU decode step smoke test: {out} != {want}"


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    t0 = time.perf_counter()
    print(f"step_usable: {step_usable()}  ({time.perf_counter() - t0:.1f} s incl. compile or cache load)")
