"""Fused decode attention on the CPU: numba loops over the packed K/V buffers, read in place (kernels/cpu/jit/).

The CPU twin of kernels/decode.py, with the same arguments and the same float64 reference. Each packed buffer is
handed to the jit code as the uint8 view of its storage with byte offset and strides (no copy, capacity strides
kept); tokens are dequantized one block at a time inside the loop, so memory while decoding is the packed bytes
plus one [64, D] fp32 tile per thread. Hadamard rotations are applied outside, as the Triton launcher does:
q . (k' H) = (q H) . k' and out = (P V') H.

    out = decode_attention_cpu(q, k, v, lengths)   # q: [B, Hq, D_k] -> [B, Hq, D_v], q's dtype

A format is one branch in kernels/cpu/meta.py: `element_code` says how one stored code decodes (arithmetic, a table
of 256, 16 or 4 floats, or a 16/32-bit float read from its bytes), from the side its format's layout describes
(kernels/packed.py); no format is named. kvviz's families and the engines' stores come through the same branches: a
codebook is a table, 3-bit codes are read 8 at a time from 3-byte words (meta M_UNIT), the "nc" norm correction and
the zero point in an fp32 scale's low bits are per-row steps (M_RENORM, M_ZP), and TQ-prod's sketch is a second dot
product per row in a basis of its own (M_QJL, kernels/cpu/jit/sketch.py). llama.cpp's KV types (storage "ggml") are
read in their blocks in place: q8_0 as int8 codes with an fp16 d per 32; q4_0, q4_1 and iq4_nl (through ggml's
table) as 4-bit codes with a scale group of 32, in a planar order of their own (meta.py's _planar(..., ggml=True));
q5_0 and q5_1 32 codes at a time (kernels/cpu/jit/rows.py's _ggml_block), in ggml's element order.
The launcher owns the numba entry points (`_jit()`) and the scratch it hands them.
`cpu_usable()` is False when numba is missing or fails to compile; callers then use the reference
(kernels/reference.py).

    python -m kernels.cpu.decode      # first-use compile time and a quick timing against the reference
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time

import numpy as np
import torch

from kernels.cpu import meta
from kernels.cpu.jit import contract
from kernels.packed import PackedSide, describes_format
from kernels.reference import decode_attention_reference
from kernels.splits import split_tokens

log = logging.getLogger(__name__)

# Below this many (token x KV head) rows a call runs on the calling thread (jit.decode_partials_serial). On an
# idle 2-core machine the pool wins from a 256-token SmolLM2 layer (768 rows: 208 against 332 us, int4) up; on a
# machine whose cores are all busy it can lose. kvviz passes `parallel` from its runtime's cpu_parallel_rows
# (env KVVIZ_CPU_PARALLEL_ROWS, 0: always the pool); this is the default for a call that passes none.
_PARALLEL_ROWS = 512
# One parallel call at a time: numba picks its OpenMP layer where it loads (its GOMP_parallel binds to torch's
# bundled libgomp, which torch put in the global symbol scope: one thread pool for both), else its workqueue
# layer, which must not be entered by two threads at once
_LOCK = threading.Lock()


@functools.cache
def _jit():
    """The jit module, imported (and its threads sized to torch's) once; None when numba is unavailable."""
    try:
        import numba

        from kernels.cpu.jit import decode as jit
    except ImportError as err:
        log.warning("kvviz: numba is not installed (%s); the CPU decode uses the unfused reference. "
                    "pip install numba to fuse it.", err)
        return None
    numba.set_num_threads(max(1, min(numba.config.NUMBA_NUM_THREADS, torch.get_num_threads())))
    return jit


@functools.cache
def cpu_usable() -> bool:
    """True when the fused CPU path runs here: numba imports and compiles (timed once, logged)."""
    jit = _jit()
    if jit is None:
        return False
    start = time.perf_counter()
    try:
        _smoke()
    except Exception as err:  # noqa: BLE001 - any compile or LLVM failure means: use the reference
        log.warning("kvviz: the fused CPU decode failed to compile (%s: %s); using the unfused reference.",
                    type(err).__name__, err)
        return False
    log.info("kvviz: fused CPU decode ready in %.1f s (numba compile or cache load)", time.perf_counter() - start)
    return True


def supports(fmt) -> bool:
    """Whether this path decodes a kvviz-like format: one whose family states a packed layout (kernels.packed.
    describes_format: kvviz's families and the engines' stores, vLLM's per-token-head, NVFP4 and TurboQuant caches,
    TQ-mse, TQ-prod). Which of its sides it reads is `reads`' answer, from the side's element and storage."""
    return describes_format(fmt)


def reads(side: PackedSide) -> bool:
    """Whether this path reads a packed side: kvviz's element order (codebooks and 3 / 1-bit streams included), or
    llama.cpp's ggml blocks (every type)."""
    if getattr(side, "layout", "kvviz") == "ggml":
        return side.elem in ("float", "int", "iq4_nl")
    if side.bits in (3, 1):
        return side.elem in ("int", "table")
    return side.elem in ("float", "int", "fp8_e4m3", "fp8_e5m2", "e2m1", "table")


_NO_MASK = np.zeros((1, 1), np.uint8)  # has_mask False: never read
_NO_SINKS = np.zeros(1, np.float32)  # has_sinks False: never read


# ------------------------------------------------------------------------------------------ public function

def decode_attention_cpu(
    q: torch.Tensor,
    k: PackedSide,
    v: PackedSide,
    lengths: torch.Tensor | int,
    sm_scale: float | None = None,
    *,
    kv_mask: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
    num_splits: int | None = None,
    parallel: bool | None = None,
) -> torch.Tensor:
    """Decode attention of one new query token per sequence over packed K/V, fused on the CPU.

    q:        [B, Hq, D_k] float CPU tensor (fp32 compute); Hq a multiple of Hkv (q head i reads kv head i // G)
    k, v:     PackedSide (kernels/packed.py), CPU tensors; k.head_dim == D_k, v.head_dim == D_v
    lengths:  [B] int or one int: valid tokens per row (token t reads the packed buffers when t < n_packed[b],
              else the side's tail at t - n_packed[b])
    sm_scale: softmax scale, default 1/sqrt(D_k)
    kv_mask:  optional bool [B, >= max(lengths)], True = attend (left padding, sliding windows)
    sinks:    optional [Hq] logits that join the softmax denominator with no value (gpt-oss)
    softcap:  optional float > 0: scores = softcap * tanh(scores / softcap) (Gemma 2); None / 0 off
    num_splits: token splits per (b, kv head) run as parallel work items; None: enough to keep the threads busy
    parallel: run the work items on numba's thread pool; None: when B * Hkv * max(lengths) >= _PARALLEL_ROWS
    Returns [B, Hq, D_v] in q's dtype. Without numba, or for a side it has no branch for (`reads`), it returns
    the float64 reference's answer.
    """
    jit = _jit()
    if q.dim() != 3:
        raise ValueError(f"decode_attention_cpu takes one query token per sequence, q: [B, Hq, D]; got {tuple(q.shape)}.")
    batch, hq, head_dim = q.shape
    hkv = k.data.shape[1]
    if hq % hkv:
        raise ValueError(f"Query heads ({hq}) must be a multiple of KV heads ({hkv}).")
    # the glue around the jit calls is numpy: a torch op on tensors this small costs several numpy ops
    if isinstance(lengths, int):
        lengths_np = np.full(batch, lengths, dtype=np.int64)
    else:
        lengths_np = torch.as_tensor(lengths).to(device="cpu", dtype=torch.int64).expand(batch).contiguous().numpy()
    max_length = int(lengths_np.max()) if batch else 0
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    if jit is None or not (reads(k) and reads(v)):  # no numba, or a layout without a branch here: the reference
        ref = decode_attention_reference(q, k, v, torch.from_numpy(lengths_np), sm_scale, kv_mask, sinks=sinks,
                                         softcap=softcap)
        return ref.to(q.dtype)
    qk = q.detach().float() if k.rotation is None else q.detach().float() @ k.rotation.float().T  # [B, Hq, D_k]
    k_pb, v_pb = meta.codes_per_unit(k), meta.codes_per_unit(v)
    qk = qk.numpy()
    qk = qk[..., meta.planar_np(head_dim, k_pb, meta.ggml_nibbles(k))] if k_pb > 1 else np.ascontiguousarray(qk)  # K's order
    if k.qjl is not None:  # TQ-prod: the sketch's basis beside the codebook's, q @ G^T after q
        qk = np.concatenate([qk, (q.detach().float() @ k.qjl.float().T).numpy()], axis=-1)
    if parallel is None:
        parallel = batch * hkv * max_length >= _PARALLEL_ROWS
    threads = jit.nb.get_num_threads() if parallel else 1
    num_splits, per_split = split_tokens(max_length, batch * hkv, threads, contract.BLOCK, num_splits)
    if kv_mask is not None:
        assert kv_mask.dim() == 2 and kv_mask.shape[0] == batch and kv_mask.shape[1] >= max_length, (
            f"kv_mask must be [B, >= max(lengths)] = [{batch}, >= {max_length}], got {tuple(kv_mask.shape)}"
        )
        mask = kv_mask.detach()
        if mask.dtype == torch.bool:  # [B, L]: 1 byte per token, read in place
            mask = np.ascontiguousarray(mask.numpy()).view(np.uint8)
        else:
            mask = mask.to(torch.uint8).contiguous().numpy()
    else:
        mask = _NO_MASK
    sink = _NO_SINKS if sinks is None else sinks.detach().float().reshape(-1).contiguous().numpy()
    if sinks is not None and sink.size != hq:
        raise ValueError(f"sinks holds {sink.size} values; pass one logit per query head ({hq}).")
    k_args = meta.side_args(k, lengths_np, batch, hkv, head_dim)
    v_args = meta.side_args(v, lengths_np, batch, hkv, v.head_dim)
    units, gqa, dv = batch * hkv * num_splits, hq // hkv, v.head_dim * (2 if v.qjl is not None else 1)
    mid_m = np.empty((units, gqa), np.float32)
    mid_l = np.empty((units, gqa), np.float32)
    mid_acc = np.empty((units, gqa, dv), np.float32)
    with _LOCK:
        (jit.decode_partials if parallel else jit.decode_partials_serial)(
            qk, lengths_np, mask, kv_mask is not None, sm_scale, float(softcap or 0.0),
            hkv, num_splits, per_split, *k_args, *v_args, mid_m, mid_l, mid_acc,
        )
    out = np.empty((batch, hq, dv), np.float32)
    jit.combine(mid_m, mid_l, mid_acc, sink, sinks is not None, hkv, num_splits, out)
    sketch = torch.from_numpy(out[..., v.head_dim:]) if v.qjl is not None else None
    out = out[..., :v.head_dim]
    if v_pb > 1:  # back from V's planar order: channel c sits at planar position inverse[c]
        out = out[..., meta.unplanar_np(v.head_dim, v_pb, meta.ggml_nibbles(v))]
    out = torch.from_numpy(np.ascontiguousarray(out))
    if v.rotation is not None:
        out = out @ v.rotation.float()
    if sketch is not None:  # TQ-prod's values: the weighted sums of s * r * z, turned by G once
        out = out + sketch @ v.qjl.float()
    return out.to(q.dtype)


def _smoke() -> None:
    """Compile (or load from numba's cache) with a 2-token int4 case and check it against a direct computation."""
    data = torch.tensor([[[[0x98, 0x89], [0x99, 0x88]]]], dtype=torch.uint8)  # codes 8/9: values 0, +-1
    side = PackedSide(data=data, head_dim=4, elem="int", bits=4, offset=8,
                      scale=torch.ones(1, 1, 2, 1, dtype=torch.float16), scale_kind="token")
    q = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]])
    keys = torch.tensor([[0.0, 1, 1, 0], [1, 1, 0, 0]])  # low nibble first
    want = torch.softmax(keys @ q[0, 0], 0) @ keys
    for parallel in (False, True):  # both entry points, so that neither compiles in the middle of a generation
        out = decode_attention_cpu(q, side, side, 2, sm_scale=1.0, parallel=parallel)
        assert torch.allclose(out[0, 0], want, atol=1e-6), f"CPU decode smoke test: {out} != {want}"


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    t0 = time.perf_counter()
    print(f"cpu_usable: {cpu_usable()}  ({time.perf_counter() - t0:.1f} s incl. compile or cache load)")
