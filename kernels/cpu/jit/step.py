"""numba code of one decode step of one cache layer on the CPU: append the new token's K and V (quantize, pack,
write into the buffers) and attend over the packed history, this token included, in one compiled call. The
launcher is kernels/cpu/step.py (it imports this lazily).

It strings together what the two launchers call separately: kernels/cpu/jit/pack.py's packers (exact rounding, no
fastmath) write row `pos` of each side's buffers; kernels/cpu/jit/decode.py's work items (`_unit`, fastmath) and
`combine` read the rows start..pos. Both see the same buffers: the packers through the uint8 views [B, Hkv, cap,
n] of the buffers, the decode through the flat uint8 view of their storage with byte offsets and strides (`meta`).

    step_serial / step_parallel(xk, xv, q, ..., out) -> (K, V) values saturated under a static fp8 scale
"""

from __future__ import annotations

import numba as nb
import numpy as np

from kernels.cpu.jit.contract import M_D_OFF, M_D_ST, M_S_OFF, M_S_ST, M_Z_OFF, M_Z_ST
from kernels.cpu.jit.decode import _unit, combine, decode_partials_serial
from kernels.cpu.jit.pack import _OPTS, ggml_pack_rows, quant_pack_rows
from kernels.cpu.jit.pack_engines import engine_pack_rows


@nb.njit(**_OPTS)
def _append(x, pk, data, scale, zero, pos):
    """Quantize x: fp32 [B, Hkv, 1, D] into row pos of one side's buffers. pk: the side's packing plan, (ts, kind, bits, exp, group, static, half_div, count,
    ggml, engine, aux, xdt) (kernels/cpu/step.py builds it once per model dtype)."""
    ts, kind, bits, exp, group, static, half_div, count, ggml, engine, aux, xdt = pk
    if engine >= 0:
        engine_pack_rows(x, data, scale, zero, engine, bits, pos, aux, xdt)
        return 0
    if ggml >= 0:
        ggml_pack_rows(x, data, scale, zero, ggml, bits, pos)
        return 0
    return quant_pack_rows(x, ts, data, scale, zero, kind, bits, exp, group, static, half_div, pos, count)


@nb.njit(**_OPTS)
def _prepare(xk, xv, q, q_order, qp, start, pos, lengths,
             kpk, kbuf, km, vpk, vbuf, vm):
    """Append both sides' token at row pos, point both sides' meta at row `start` (the first live row), set the
    lengths to the live rows and lay q out in K's planar order. Returns the saturated values counted (K, V)."""
    over_k = _append(xk, kpk, kbuf[0], kbuf[1], kbuf[2], pos)
    over_v = _append(xv, vpk, vbuf[0], vbuf[1], vbuf[2], pos)
    for meta in (km, vm):
        meta[M_D_OFF] = start * meta[M_D_ST]
        meta[M_S_OFF] = start * meta[M_S_ST]
        meta[M_Z_OFF] = start * meta[M_Z_ST]
    lengths[:] = pos + 1 - start
    batch, hq, dk = qp.shape
    for b in range(batch):
        for h in range(hq):
            for i in range(dk):
                qp[b, h, i] = q[b, h, 0, q_order[i]]
    return over_k, over_v


@nb.njit(**_OPTS)
def _finish(mid_m, mid_l, mid_acc, sinks, has_sinks, n_kv, splits, outp, out_order, out):
    """Merge the splits (decode.combine) and write out [B, 1, Hq, Dv] in channel order."""
    combine(mid_m, mid_l, mid_acc, sinks, has_sinks, n_kv, splits, outp)
    batch, _, hq, dv = out.shape
    for b in range(batch):
        for h in range(hq):
            for i in range(dv):
                out[b, 0, h, i] = outp[b, h, out_order[i]]


@nb.njit(**_OPTS)
def step_serial(xk, xv, q, q_order, qp, start, pos, lengths, mask, has_mask, sm_scale, softcap, n_kv, splits,
                per_split, kpk, kbuf, km, kdata, klut, kscale, kzero, kslut, kts, ktz, ktail,
                vpk, vbuf, vm, vdata, vlut, vscale, vzero, vslut, vts, vtz, vtail,
                mid_m, mid_l, mid_acc, sinks, has_sinks, outp, out_order, out):
    """One step on the calling thread (small work: waking the pool costs more).

    xk, xv: fp32 [B, Hkv, 1, D_k / D_v], the new token (rotated for /rot); q: fp32 [B, Hq, 1, D_k] (rotated);
    q_order: [D_k] K's planar order; start: first live row of the buffers, pos: the row the token goes to;
    kbuf / vbuf: (data, scale, zero) uint8 views [B, Hkv, cap, n]; km .. ktail, vm .. vtail: decode.py's side
    arguments over the same storage; lengths [B] int64 (written: pos + 1 - start), also each side's packed count.
    Writes out [B, 1, Hq, D_v] (fp32, channel order: the attention function's layout); returns the static fp8
    values saturated (K, V)."""
    over = _prepare(xk, xv, q, q_order, qp, start, pos, lengths, kpk, kbuf, km, vpk, vbuf, vm)
    decode_partials_serial(qp, lengths, mask, has_mask, sm_scale, softcap, n_kv, splits, per_split,
                           km, kdata, klut, kscale, kzero, kslut, kts, ktz, ktail, lengths,
                           vm, vdata, vlut, vscale, vzero, vslut, vts, vtz, vtail, lengths, mid_m, mid_l, mid_acc)
    _finish(mid_m, mid_l, mid_acc, sinks, has_sinks, n_kv, splits, outp, out_order, out)
    return over


@nb.njit(parallel=True, **_OPTS)
def step_parallel(xk, xv, q, q_order, qp, start, pos, lengths, mask, has_mask, sm_scale, softcap, n_kv, splits,
                  per_split, kpk, kbuf, km, kdata, klut, kscale, kzero, kslut, kts, ktz, ktail,
                  vpk, vbuf, vm, vdata, vlut, vscale, vzero, vslut, vts, vtz, vtail,
                  mid_m, mid_l, mid_acc, sinks, has_sinks, outp, out_order, out):
    """step_serial with the (batch, KV head, split) work items on numba's thread pool."""
    over = _prepare(xk, xv, q, q_order, qp, start, pos, lengths, kpk, kbuf, km, vpk, vbuf, vm)
    sm = np.float32(sm_scale)
    cap = np.float32(softcap)
    for u in nb.prange(qp.shape[0] * n_kv * splits):
        _unit(u, qp, lengths, mask, has_mask, sm, cap, n_kv, splits, per_split,
              km, kdata, klut, kscale, kzero, kslut, kts, ktz, ktail, lengths,
              vm, vdata, vlut, vscale, vzero, vslut, vts, vtz, vtail, lengths, mid_m, mid_l, mid_acc)
    _finish(mid_m, mid_l, mid_acc, sinks, has_sinks, n_kv, splits, outp, out_order, out)
    return over
