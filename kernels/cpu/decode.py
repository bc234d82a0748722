"""Fused decode attention on the CPU: numba loops over the packed K/V buffers, read in place (kernels/cpu/jit/).

The CPU twin of kernels/decode.py, with the same arguments and the same float64 reference. Each packed buffer is
handed to the jit code as the uint8 view of its storage with byte offset and strides (no copy, capacity strides
kept); tokens are dequantized one block at a time inside the loop, so memory while decoding is the packed bytes
plus one [64, D] fp32 tile per thread. Hadamard rotations are applied outside, as the Triton launcher does:
q . (k' H) = (q H) . k' and out = (P V') H.

    out = decode_attention_cpu(q, k, v, lengths)   # q: [B, Hq, D_k] -> [B, Hq, D_v], q's dtype

A format is one branch here: `_element_code` says how one stored code decodes (arithmetic, a table of 256, 16 or 4
floats, or a 16/32-bit float read from its bytes); `kernels.packed.FUSED_KINDS` lists the format families it
knows, and the engines' stores (`ENGINE_KINDS`) come through the same branches: a codebook is a table, 3-bit codes
are read 8 at a time from 3-byte words (meta M_UNIT), the "nc" norm correction and the zero point in an fp32
scale's low bits are per-row steps (M_RENORM, M_ZP), and TQ-prod's sketch is a second dot product per row in a
basis of its own (M_QJL, kernels/cpu/jit/sketch.py). llama.cpp's KV types (layout "ggml") are read in their blocks in place: q8_0 as int8 codes with an fp16 d
per 32; q4_0, q4_1 and iq4_nl (through ggml's table) as 4-bit codes with a scale group of 32, in a planar order of
their own (_planar(..., ggml=True)); q5_0 and q5_1 32 codes at a time (kernels/cpu/jit/rows.py's _ggml_block), in
ggml's element order. The launcher owns the numba entry points (`_jit()`) and the scratch it hands them.
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

from kernels.cpu.jit import contract
from kernels.packed import ENGINE_KINDS, FUSED_KINDS, IQ4NL_VALUES, PackedSide, describes_format, per_head
from kernels.reference import decode_attention_reference
from kernels.splits import split_tokens

log = logging.getLogger(__name__)

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # OCP MX v1.0 FP4 magnitudes by code & 7
_FLOAT_CODES = {torch.float16: contract.E_F16, torch.bfloat16: contract.E_BF16, torch.float32: contract.E_F32}
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
    """Whether this path decodes a kvviz-like format (duck-typed `kind`): kvviz's fused families and the engines'
    stores (vLLM's per-token-head, NVFP4 and TurboQuant caches, TQ-mse, TQ-prod)."""
    kind = getattr(fmt, "kind", None)
    return kind in FUSED_KINDS or (kind in ENGINE_KINDS and describes_format(fmt))


def reads(side: PackedSide) -> bool:
    """Whether this path reads a packed side: kvviz's element order (codebooks and 3 / 1-bit streams included), or
    llama.cpp's ggml blocks (every type)."""
    if getattr(side, "layout", "kvviz") == "ggml":
        return side.elem in ("float", "int", "iq4_nl")
    if side.bits in (3, 1):
        return side.elem in ("int", "table")
    return side.elem in ("float", "int", "fp8_e4m3", "fp8_e5m2", "e2m1", "table")


# ------------------------------------------------------------------------------------------ side arguments

@functools.lru_cache(maxsize=None)
def _table(elem: str, bits: int, offset: int, dtype: torch.dtype) -> torch.Tensor:
    """float32 decode table of one element kind: index = the stored code (a byte, a nibble or 2 bits)."""
    if elem == "int" or (elem == "float" and bits == 8):
        codes = torch.arange(2 ** bits, dtype=torch.int32)
        if dtype == torch.int8:
            codes = codes.to(torch.uint8).view(torch.int8).to(torch.int32)  # int8 sym: two's complement
        return (codes - offset).float()
    if elem == "e2m1":
        mag = torch.tensor(E2M1_VALUES * 2)
        return torch.where(torch.arange(16) >= 8, -mag, mag).float()
    if elem in ("fp8_e4m3", "fp8_e5m2"):
        fp8 = torch.float8_e4m3fn if elem == "fp8_e4m3" else torch.float8_e5m2
        return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8).float()
    if dtype == torch.uint8:  # an E8M0 scale: 2**(byte - 127), 255 = NaN
        out = torch.pow(2.0, torch.arange(256, dtype=torch.float64) - 127).float()
        out[255] = float("nan")
        return out
    raise AssertionError(f"no decode table for elem={elem!r}, bits={bits}, dtype={dtype}")


def _element_code(side: PackedSide) -> tuple[int, torch.Tensor | None]:
    """(storage code, kernels/cpu/jit/contract.py's E_*, and decode table or None) of a side's stored codes. A new
    element kind is one branch here: arithmetic codes (E_UINT, E_INT8, E_E2M1), a table of 256 floats (E_LUT), or a float storage type."""
    dtype = side.data.dtype
    if side.elem == "table":  # a codebook (TurboQuant's centroids): value = values[code]
        return contract.E_LUT, side.values.detach().to("cpu", torch.float32).contiguous()
    if side.elem == "int" and side.bits in (3, 1):  # codes of a 3- or 1-bit stream: through a table of 8 / 2
        return contract.E_LUT, _table("int", side.bits, side.offset, dtype)
    if side.elem == "float" and side.bits >= 16:
        assert dtype in _FLOAT_CODES, f"a float cast stored as {dtype} is not readable here"
        return _FLOAT_CODES[dtype], None
    if side.elem == "int" or (side.elem == "float" and dtype == torch.uint8):  # int2/int4, asym int8: u - offset
        return contract.E_UINT, None
    if side.elem == "float" and dtype == torch.int8:
        return contract.E_INT8, None
    if side.elem == "e2m1":
        return contract.E_E2M1, None
    if side.elem == "iq4_nl":  # llama.cpp's non-linear 4-bit codes: ggml's kvalues_iq4nl
        return contract.E_LUT, _iq4nl_table()
    assert side.elem in ("fp8_e4m3", "fp8_e5m2"), f"no CPU decode for elem={side.elem!r} stored as {dtype}"
    return contract.E_LUT, _table(side.elem, side.bits, side.offset, dtype)


@functools.cache
def _iq4nl_table() -> torch.Tensor:
    return torch.tensor(IQ4NL_VALUES, dtype=torch.float32)


def _per_byte(side: PackedSide) -> int:
    """Codes per byte in the jit code's planar order: 1 for bytes and for q5_0 / q5_1's blocks (jit's _ggml_block)."""
    if side.layout == "ggml":
        return 2 if side.bits == 4 else 1
    if side.bits == 3:
        return 8  # a unit of 3 bytes
    return 8 // side.bits if side.bits < 8 else 1


def _unit_bytes(side: PackedSide) -> int:
    """Bytes of one packing unit (the `_per_byte(side)` codes of a planar position): 3 for 3-bit codes, else 1."""
    return 3 if side.layout == "kvviz" and side.bits == 3 else 1


def _ggml_nibbles(side: PackedSide) -> bool:
    """q4_0, q4_1, iq4_nl: 16 bytes of nibbles per block of 32, low nibbles codes 0..15, high 16..31."""
    return side.layout == "ggml" and side.bits == 4


@functools.lru_cache(maxsize=None)
def _planar(head_dim: int, per_byte: int, ggml: bool = False) -> torch.Tensor:
    """Index [D]: planar position -> channel. The jit code holds field p of a row's byte i at planar position
    p * (D / pb) + i: element pb * i + p in kvviz's order; in a ggml nibble block (ggml=True) byte i of block i // 16
    holds elements 32 * (i // 16) + i % 16 (low nibble) and + 16 (high nibble)."""
    if ggml:
        i = torch.arange(head_dim // 2)
        low = 32 * (i // 16) + i % 16
        return torch.cat([low, low + 16])
    return torch.arange(head_dim).reshape(head_dim // per_byte, per_byte).t().reshape(-1)


@functools.lru_cache(maxsize=None)
def _planar_np(head_dim: int, per_byte: int, ggml: bool = False) -> np.ndarray:
    return _planar(head_dim, per_byte, ggml).numpy()


@functools.lru_cache(maxsize=None)
def _unplanar_np(head_dim: int, per_byte: int, ggml: bool = False) -> np.ndarray:
    """Index [D]: channel -> its planar position (the inverse of _planar)."""
    return torch.argsort(_planar(head_dim, per_byte, ggml)).numpy()


def _scale_code(t: torch.Tensor) -> tuple[int, torch.Tensor | None]:
    """(storage code, table) of a scale / zero-point tensor: fp16, bf16, fp32, E8M0 (uint8) or E4M3."""
    if t.dtype in _FLOAT_CODES:
        return _FLOAT_CODES[t.dtype], None
    if t.dtype == torch.float8_e4m3fn:
        return 0, _table("fp8_e4m3", 8, 0, t.dtype)
    assert t.dtype == torch.uint8, f"scales stored as {t.dtype} are not readable here"
    return 0, _table("scale", 8, 0, torch.uint8)


_NONE = torch.zeros(4, dtype=torch.uint8)
_NONE_NP = _NONE.numpy()
_NO_MASK = np.zeros((1, 1), np.uint8)  # has_mask False: never read
_NO_SINKS = np.zeros(1, np.float32)  # has_sinks False: never read


def _bytes(t: torch.Tensor | None):
    """(uint8 numpy view of t's whole storage, byte offset, byte strides of dims 0..2); no copy."""
    if t is None:
        return _NONE.numpy(), 0, (0, 0, 0)
    assert t.device.type == "cpu", "the CPU decode reads CPU tensors"
    assert t.dim() == 4 and (t.stride(-1) == 1 or t.shape[-1] == 1), "buffers must be contiguous along the last dim"
    size = t.element_size()
    flat = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    return flat.numpy(), t.storage_offset() * size, tuple(s * size for s in t.stride()[:3])


def _side_args(side: PackedSide, lengths: np.ndarray, batch: int, heads: int, head_dim: int) -> tuple:
    """(meta, data, lut, scale, zero, scale_lut, tensor_scale, tensor_zero, tail, n_packed) for the jit code.

    What depends only on the buffers (their storages and strides, the decode tables, the static scales) is built
    once per buffer set and kept in `side.memo` when the producer gives one (a cache side: its buffers move only
    when they grow); the offsets, the tail and n_packed are read on every call."""
    key = (batch, heads, head_dim, id(side.tensor_scale), *(
        None if t is None else (t.untyped_storage().data_ptr(), t.dtype, t.stride()) for t in (side.data, side.scale, side.zero)))
    memo = side.memo if side.memo is not None else {}
    cached = memo.get("cpu")
    if cached is None or cached[0] != key:
        cached = memo["cpu"] = (key, _buffer_args(side, batch, heads, head_dim))
    meta_template, data, lut, scale_np, zero_np, slut, ts, tz = cached[1]
    meta = meta_template.copy()
    meta[contract.M_D_OFF] = _byte_offset(side.data)
    if side.scale_kind is not None:
        meta[contract.M_S_OFF] = _byte_offset(side.scale)
        if side.zero is not None:
            meta[contract.M_Z_OFF] = _byte_offset(side.zero)
    if side.n_packed is None:
        n_packed = lengths
    elif isinstance(side.n_packed, int):
        n_packed = np.full(batch, side.n_packed, dtype=np.int64)
    else:
        n_packed = torch.as_tensor(side.n_packed).to(torch.int64).expand(batch).contiguous().numpy()
    tail = side.tail
    if tail is not None and tail.shape[2] == 0:  # an empty tail (no residual window, whole groups): nothing to read
        assert bool((n_packed >= lengths).all()), "tokens past n_packed need a tail"
        meta[contract.M_TAIL] = 0
        return meta, data, lut, scale_np, zero_np, slut, ts, tz, _NONE_NP, n_packed
    if tail is not None:
        assert tail.dim() == 4 and tail.shape[:2] == (batch, heads) and tail.shape[3] == head_dim, (
            f"tail must be [B, Hkv, R, D], got {tuple(tail.shape)}"
        )
        if tail.dtype not in _FLOAT_CODES:
            tail = tail.float()  # a float64 test tail: R rows, never the packed history
        meta[contract.M_TDT], meta[contract.M_TAIL] = _FLOAT_CODES[tail.dtype], 1
    else:
        assert bool((n_packed >= lengths).all()), "tokens past n_packed need a tail"
    tail_np, meta[contract.M_T_OFF], (meta[contract.M_T_SB], meta[contract.M_T_SH], meta[contract.M_T_ST]) = _bytes(tail)
    return meta, data, lut, scale_np, zero_np, slut, ts, tz, tail_np, n_packed


def _byte_offset(t: torch.Tensor) -> int:
    return t.storage_offset() * t.element_size()


def _buffer_args(side: PackedSide, batch: int, heads: int, head_dim: int) -> tuple:
    """The part of `_side_args` fixed by the buffers: (meta without offsets and tail, data, lut, scale, zero,
    scale_lut, tensor_scale, tensor_zero), numpy views of the storages (no copy)."""
    assert side.data.shape[:2] == (batch, heads), (
        f"packed data is [B, Hkv, cap, packed_dim] = {tuple(side.data.shape)}; want B={batch}, Hkv={heads}"
    )
    assert side.head_dim == head_dim, f"side head_dim {side.head_dim} != expected {head_dim}"
    meta = [0] * contract.META_LEN
    meta[contract.M_DIM] = head_dim
    meta[contract.M_ELEM], lut = _element_code(side)
    meta[contract.M_PER_BYTE] = _per_byte(side)
    # q5_0 / q5_1 (5): ggml's blocks; q4_0 / q4_1 / iq4_nl (4): int4/g32's layout with codes in their own planar
    # order (_planar); q8_0 (0) is kvviz's int8/g32 layout byte for byte
    meta[contract.M_GGML] = side.bits if side.layout == "ggml" and side.bits < 8 else 0
    meta[contract.M_OFFSET] = side.offset
    meta[contract.M_UNIT] = _unit_bytes(side)
    meta[contract.M_RENORM] = int(side.renorm)
    meta[contract.M_ZP] = side.zp_bits
    meta[contract.M_QJL] = head_dim * side.bits // 8 if side.qjl is not None else 0  # the signs follow the codes
    assert not side.renorm or (side.scale_kind == "token" and side.group_size == head_dim), (
        "the norm correction needs one token scale per row")
    data, _, (meta[contract.M_D_SB], meta[contract.M_D_SH], meta[contract.M_D_ST]) = _bytes(side.data)
    scale = zero = None
    slut = None
    if side.scale_kind is not None:
        meta[contract.M_SKIND] = contract.S_TOKEN if side.scale_kind == "token" else contract.S_CHANNEL
        meta[contract.M_SDT], slut = _scale_code(side.scale)
        meta[contract.M_GROUP] = side.group_size
        assert side.scale_kind == "channel" or head_dim % side.group_size == 0, "token groups must tile head_dim"
        scale = side.scale
        if side.zero is not None:
            assert side.zero.dtype == side.scale.dtype, "zero points must be stored as the scales are"
            zero, meta[contract.M_ZERO] = side.zero, 1
    scale_np, _, (meta[contract.M_S_SB], meta[contract.M_S_SH], meta[contract.M_S_ST]) = _bytes(scale)
    zero_np, _, (meta[contract.M_Z_SB], meta[contract.M_Z_SH], meta[contract.M_Z_ST]) = _bytes(zero)
    ts = per_head(side.tensor_scale, batch, heads, "cpu")
    tz = per_head(side.zero, batch, heads, "cpu") if side.scale_kind is None else None
    ts = torch.ones(batch * heads) if ts is None else ts
    tz = torch.zeros(batch * heads) if tz is None else tz
    empty = torch.zeros(1)
    return (
        torch.tensor(meta, dtype=torch.int64).numpy(), data, (lut if lut is not None else empty).numpy(),
        scale_np, zero_np, (slut if slut is not None else empty).numpy(), ts.numpy(), tz.numpy(),
    )


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
    k_pb, v_pb = _per_byte(k), _per_byte(v)
    qk = qk.numpy()
    qk = qk[..., _planar_np(head_dim, k_pb, _ggml_nibbles(k))] if k_pb > 1 else np.ascontiguousarray(qk)  # K's order
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
    k_args = _side_args(k, lengths_np, batch, hkv, head_dim)
    v_args = _side_args(v, lengths_np, batch, hkv, v.head_dim)
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
        out = out[..., _unplanar_np(v.head_dim, v_pb, _ggml_nibbles(v))]
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
