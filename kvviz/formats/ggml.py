"""llama.cpp's KV cache types (`-ctk` / `-ctv`): q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, bit-exact with ggml.

Each quantizes blocks of 32 values along head_dim with one fp16 scale `d` per block (q4_1, q5_1: also an fp16
minimum `m`), following ggml/src/ggml-quants.c (`quantize_row_<type>_ref`, which the CPU backend's copy into the
KV cache calls). Every step runs in fp32 in the C code's order, so the stored fp16 scales and codes, and the
dequantized values, equal llama.cpp's bit for bit (tests/test_formats_ggml.py checks them against the `gguf`
package's numpy ports and a numpy port of the iq4_nl quantizer):

    type    scale from the block                  code                                  value
    q8_0    d = amax / 127                        q = roundf(x / d), int8               q * d
    q4_0    d = max / -8  (max: the signed value  q = min(15, trunc(x / d + 8.5))       (q - 8) * d
                           of largest |x|)
    q4_1    d = (max - min) / 15, m = min         q = min(15, trunc((x - min) / d + .5))  q * d + m
    q5_0    d = max / -16                         q = min(31, trunc(x / d + 16.5))      (q - 16) * d
    q5_1    d = (max - min) / 31, m = min         q = trunc((x - min) / d + 0.5)        q * d + m
    iq4_nl  least-squares d over the table        q = nearest table entry to x / d0     KVALUES_IQ4NL[q] * d

(`x / d` is `x * (1 / d)` in fp32, with 1/d taken as 0 when d is 0, as ggml does.) The quantizer uses the fp32 d;
the stored d is its fp16 rounding, which dequantization reads. iq4_nl (ggml's `quantize_row_iq4_nl_impl` with
ntry = -1, what `quantize_row_iq4_nl_ref` and so the KV cache use): d0 = max / -127, codes pick the nearest of the
16 values KVALUES_IQ4NL (ties upward), then d = sum(w q x) / sum(w q q) with weights w = x^2, summed in order.
`quantize_iq4_nl(x, ntry=7)` is the scale search `llama-quantize` runs on weights; the KV format does not search.

Stored layout (kvviz's QTensor fields; x: [..., T, D], D a multiple of 32, b = D / 32 blocks per token):
    data   q8_0: int8 [..., T, D] (codes in order). Others: uint8 [..., T, D * bits / 8], block by block, each
           block laid out as llama.cpp's block without its d / m: for q5_0 / q5_1 first `qh` (4 bytes, a
           little-endian uint32 whose bit j is bit 4 of code j), then `qs` (16 bytes); for q4_0 / q4_1 / iq4_nl
           only `qs`. qs byte j holds code j in its low nibble and code j + 16 in its high nibble (not kvviz's
           element-2i-low order: this is ggml's).
    scale  fp16 [..., T, b]: d per block.
    zero   fp16 [..., T, b]: m per block (q4_1, q5_1), else None.
So llama.cpp's block `i` of a token is `d[i]` (+ `m[i]`) followed by data[..., i * bytes : (i + 1) * bytes]; see
`gguf_blocks`. Non-finite inputs (undefined in llama.cpp): a block holding Inf or NaN stores d = NaN (and m = NaN),
so it reads back as NaN; its codes come from the finite values. fp16 d overflows to Inf as in ggml, when a block's
amax exceeds 65504 * 127 (q8_0) or 65504 * 8 (q4_0): far beyond any K or V.
"""

from __future__ import annotations

import functools
import sys

import torch

from . import groups
from .family import BaseInfo, Family, Layout, choice, engine_default, rotation_of

QK = 32  # values per block, every type here
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
GROUP_MAX_EPS = 1e-15  # iq4_nl: a block whose amax is below this stores d = 0
# base: (offset subtracted from a code, largest code, has a minimum m)
_LINEAR = {"q8_0": (0, 127, False), "q4_0": (8, 15, False), "q4_1": (0, 15, True), "q5_0": (16, 31, False),
           "q5_1": (0, 31, True)}
TYPES = (*_LINEAR, "iq4_nl")


# ---- the quantizers, on blocks [..., n_blocks, 32] fp32 ------------------------------------------------------

def _first(blocks: torch.Tensor, hit: torch.Tensor) -> torch.Tensor:
    """The first value of each block where `hit` holds (ggml's scans keep the first of equal candidates)."""
    return blocks.gather(-1, hit.to(torch.int32).argmax(-1, keepdim=True))  # [..., nb, 1]


def _signed_max(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(amax, max): the largest |x| of each block and the signed value that first reaches it; max is +0 for an
    all-zero block (ggml starts from amax = max = 0 and takes a value only when |v| > amax)."""
    amax = blocks.abs().amax(-1, keepdim=True)  # [..., nb, 1]
    mx = _first(blocks, blocks.abs() == amax)
    return amax, torch.where(amax > 0, mx, torch.zeros((), device=blocks.device))


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """ggml's `id = d ? 1.0f/d : 0.0f`, in fp32."""
    return torch.where(d != 0, 1.0 / d, torch.zeros((), device=d.device))


def _roundf(v: torch.Tensor) -> torch.Tensor:
    """C's roundf: to nearest, halves away from zero (torch.round takes halves to even). Exact in fp32."""
    r = torch.trunc(v)
    return r + torch.sign(v) * ((v - r).abs() >= 0.5).to(v.dtype)


def quantize_linear(blocks: torch.Tensor, base: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """ggml's quantize_row_<base>_ref for q8_0 / q4_0 / q4_1 / q5_0 / q5_1.

    blocks: fp32 [..., nb, 32] (finite). Returns (codes [..., nb, 32] int16 in 0..2**bits-1, or -127..127 for
    q8_0; d fp32 [..., nb, 1] before its fp16 rounding; m fp32 [..., nb, 1] or None).
    """
    offset, top, has_min = _LINEAR[base]
    if base == "q8_0":
        d = blocks.abs().amax(-1, keepdim=True) / 127
        return _roundf(blocks * _inverse(d)).to(torch.int16), d, None
    if has_min:
        lo = _first(blocks, blocks == blocks.amin(-1, keepdim=True))  # signed zeros as ggml's first-wins scan
        hi = _first(blocks, blocks == blocks.amax(-1, keepdim=True))
        d = (hi - lo) / top
        q = torch.trunc((blocks - lo) * _inverse(d) + 0.5)
        return q.clamp(0, top).to(torch.int16), d, lo
    _, mx = _signed_max(blocks)
    d = mx / -(offset)
    q = torch.trunc(blocks * _inverse(d) + (offset + 0.5))
    return q.clamp(0, top).to(torch.int16), d, None


@functools.lru_cache(maxsize=8)
def _iq4nl_tables(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(KVALUES_IQ4NL as fp32 [16], the doubled midpoints values[j-1] + values[j] for j = 1..15, fp32 [15])."""
    values = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32)
    return values.to(device), (values[:-1] + values[1:]).to(device)


def best_index_iq4nl(v: torch.Tensor) -> torch.Tensor:
    """ggml's best_index_int8 over KVALUES_IQ4NL: the nearest value's index, ties to the larger one (long)."""
    _, mids2 = _iq4nl_tables(str(v.device))
    # index j is reached once 2x >= values[j-1] + values[j]: exact in fp32, as ggml compares x + x
    return ((v + v).unsqueeze(-1) >= mids2).sum(-1)


def _weighted_sums(blocks, w, q) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_j w q x and sum_j w q q over each block, accumulated in fp32 in index order as ggml's loop does."""
    sumqx = torch.zeros(blocks.shape[:-1], device=blocks.device)
    sumq2 = torch.zeros(blocks.shape[:-1], device=blocks.device)
    for j in range(blocks.shape[-1]):
        wq = w[..., j] * q[..., j]
        sumqx = sumqx + wq * blocks[..., j]
        sumq2 = sumq2 + wq * q[..., j]
    return sumqx, sumq2


def quantize_iq4_nl(blocks: torch.Tensor, ntry: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's quantize_row_iq4_nl_impl for one 32-value block per row: ntry = -1 is quantize_row_iq4_nl_ref (the
    KV cache's), ntry = 7 is quantize_iq4_nl without importance weights (llama-quantize's scale search).

    blocks: fp32 [..., nb, 32] (finite). Returns (codes [..., nb, 32] int16 in 0..15, d fp32 [..., nb, 1]).
    """
    values, _ = _iq4nl_tables(str(blocks.device))
    w = blocks * blocks
    amax, mx = _signed_max(blocks)
    amax, mx = amax[..., 0], mx[..., 0]  # [..., nb]
    live = amax >= GROUP_MAX_EPS
    mx = torch.where(live, mx, torch.ones((), device=blocks.device))  # dead blocks: any finite divisor
    d = mx / 127.0 if ntry > 0 else mx / -127.0  # ggml: ntry > 0 ? -max/values[0] : max/values[0]
    codes = best_index_iq4nl((1.0 / d).unsqueeze(-1) * blocks)
    sumqx, sumq2 = _weighted_sums(blocks, w, values[codes])
    d = torch.where(sumq2 > 0, sumqx / sumq2, torch.zeros((), device=blocks.device))
    if ntry > 0:
        best = d * sumqx
        for itry in range(-ntry, ntry + 1):
            idx = best_index_iq4nl(((itry + KVALUES_IQ4NL[0]) / mx).unsqueeze(-1) * blocks)
            sqx, sq2 = _weighted_sums(blocks, w, values[idx])
            better = (sq2 > 0) & (sqx * sqx > best * sq2)
            d = torch.where(better, sqx / sq2, d)
            best = torch.where(better, d * sqx, best)
    d = torch.where(live, d, torch.zeros((), device=blocks.device))  # ggml skips a dead block: d = 0, codes 0
    if ntry > 0:  # ggml requantizes every block with the chosen d (a dead one: 1/d = 0 picks the code of 0)
        codes = best_index_iq4nl(_inverse(d).unsqueeze(-1) * blocks)
    else:
        codes = torch.where(live.unsqueeze(-1), codes, torch.zeros((), dtype=codes.dtype, device=codes.device))
    return codes.to(torch.int16), d.unsqueeze(-1)


# ---- packing: ggml's byte order ----------------------------------------------------------------------------

def pack_block_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes [..., nb, 32] (0..2**bits-1) -> uint8 [..., nb, 32 * bits / 8]: (qh for 5 bits, then) qs."""
    c = codes.to(torch.uint8)
    qs = (c[..., :16] & 15) | ((c[..., 16:] & 15) << 4)  # [..., nb, 16]
    if bits == 4:
        return qs
    high = ((c >> 4) & 1).reshape(*c.shape[:-1], 4, 8)  # [..., nb, 4 bytes, 8 bits]: code 8k + i -> byte k bit i
    qh = (high << torch.arange(8, dtype=torch.uint8, device=c.device)).sum(-1, dtype=torch.uint8)
    return torch.cat([qh, qs], dim=-1)  # [..., nb, 20]


def unpack_block_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of pack_block_codes: uint8 [..., nb, 32 * bits / 8] -> codes uint8 [..., nb, 32]."""
    qs = packed[..., -16:]
    codes = torch.cat([qs & 15, qs >> 4], dim=-1)  # [..., nb, 32]
    if bits == 5:
        qh = packed[..., :4]
        high = (qh.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8, device=qh.device)) & 1  # [..., nb, 4, 8]
        codes = codes | (high.reshape(codes.shape) << 4)
    return codes


# ---- the codec kvviz.formats.Format dispatches to ------------------------------------------------------------

def _blocks(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(*t.shape[:-1], t.shape[-1] // QK, QK)  # [..., T, D] -> [..., T, D/32, 32]


def encode(fmt, x: torch.Tensor, scale: torch.Tensor | None) -> dict:
    """x: [..., T, D] float -> QTensor fields (data, scale = d, zero = m)."""
    if scale is not None:
        raise ValueError(f"{fmt.spec} computes its block scales from the data, as llama.cpp does; pass no scale.")
    xf = x.float()
    finite = torch.isfinite(xf)
    blocks = _blocks(torch.where(finite, xf, torch.zeros((), device=x.device)))  # [..., T, D/32, 32]
    if fmt.base == "iq4_nl":
        codes, d, m = *quantize_iq4_nl(blocks), None
    else:
        codes, d, m = quantize_linear(blocks, fmt.base)
    bad = groups.reduce(x, "token", QK, "nonfinite")  # [..., T, D/32]
    nan = torch.full((), float("nan"), device=x.device)
    d = torch.where(bad, nan, d[..., 0]).to(torch.float16)
    m = None if m is None else torch.where(bad, nan, m[..., 0]).to(torch.float16)
    if fmt.base == "q8_0":
        data = codes.to(torch.int8).reshape(x.shape)
    else:
        data = pack_block_codes(codes, fmt.bits).reshape(*x.shape[:-1], x.shape[-1] * fmt.bits // 8)
    return {"data": data, "scale": d, "zero": m}


@functools.lru_cache(maxsize=32)
def _byte_tables(base: str, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode tables indexed by a stored byte, fp32: a qs byte's low-nibble value [256] and high-nibble value [256]
    (offset or iq4_nl table applied), and a qh byte's 8 bits times 16 [256, 8]."""
    byte = torch.arange(256)
    if base == "iq4_nl":
        values = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32)
        low, high = values[byte & 15], values[byte >> 4]
    else:
        low, high = ((byte & 15) - _LINEAR[base][0]).float(), ((byte >> 4) - _LINEAR[base][0]).float()
    qh = ((byte.unsqueeze(-1) >> torch.arange(8)) & 1).float() * 16  # [256, 8]
    return low.to(device), high.to(device), qh.to(device)


def codes_of(fmt, q) -> torch.Tensor:
    """The stored codes of a QTensor as fp32 values before the scale, by block: [..., T, D / 32, 32] (offset or
    table applied).

    Table lookups per stored byte (index_select: several times faster on the CPU than advanced indexing), without
    unpacking the codes: the reference attention path decodes the whole history at every step. Equal to
    code - offset, or KVALUES_IQ4NL[code], of unpack_block_codes."""
    if fmt.base == "q8_0":
        return _blocks(q.data.float())
    low, high, qh_table = _byte_tables(fmt.base, str(q.data.device))
    blocks = q.data.reshape(*q.data.shape[:-1], q.head_dim // QK, 4 * fmt.bits)  # [..., T, D/32, block bytes]
    qs = blocks[..., -16:].reshape(-1).long()
    half = (*blocks.shape[:-1], 16)
    values = torch.cat([low.index_select(0, qs).reshape(half), high.index_select(0, qs).reshape(half)], dim=-1)
    if fmt.bits == 5:  # qh byte k, bit i: bit 4 of code 8k + i
        qh = blocks[..., :4].reshape(-1).long()
        values = values + qh_table.index_select(0, qh).reshape(values.shape)
    return values  # [..., T, D/32, 32]


def decode(fmt, q) -> torch.Tensor:
    """QTensor -> fp32 x_hat [..., T, D]: code * d (+ m), in fp32 as ggml's dequantize_row_<type>."""
    x = codes_of(fmt, q) * q.scale.float().unsqueeze(-1)  # [..., T, D/32, 32] * [..., T, D/32, 1]
    if q.zero is not None:
        x = x + q.zero.float().unsqueeze(-1)  # a separate add after the product, not a fused multiply-add
    return x.reshape(q.values_shape)


def gguf_blocks(q) -> torch.Tensor:
    """A QTensor of a llama.cpp type as llama.cpp stores it: uint8 [..., T, D / 32 * block_bytes], each block
    d (fp16, little-endian) [+ m] + the block's data bytes (what `gguf.quantize` returns for the same rows)."""
    fmt = q.fmt
    nb = q.head_dim // QK
    data = q.data.view(torch.uint8).reshape(*q.data.shape[:-1], nb, 4 * fmt.bits)  # [..., T, nb, bytes]
    parts = [q.scale.contiguous().view(torch.uint8).reshape(*q.scale.shape, 2)]  # fp16 as 2 bytes (little-endian)
    if q.zero is not None:
        parts.append(q.zero.contiguous().view(torch.uint8).reshape(*q.zero.shape, 2))
    blocks = torch.cat([*parts, data], dim=-1)
    assert fmt.base in TYPES, f"{fmt.spec} is not a llama.cpp type"
    return blocks.reshape(*blocks.shape[:-2], nb * blocks.shape[-1])


# ------------------------------------------------------------------------------------------ the family

def layout(fmt, head_dim: int) -> Layout:
    """ggml's blocks of 32 (see the module docstring): codes in ggml's order, an fp16 d per block (and m)."""
    offset, _, has_min = _LINEAR.get(fmt.base, (0, 0, False))
    elem = "iq4_nl" if fmt.base == "iq4_nl" else ("float" if fmt.base == "q8_0" else "int")
    return Layout(elem=elem, bits=fmt.bits, storage="ggml", per_unit=2 if fmt.bits == 4 else 1, unit_bytes=1,
                  offset=offset, scale_kind="token", scale_dtype="fp16", group=QK, zero=has_min,
                  values=torch.tensor(KVALUES_IQ4NL, dtype=torch.float32) if fmt.base == "iq4_nl" else None,
                  rotation=rotation_of(fmt, head_dim), packer="ggml", ggml_type=fmt.base)


def engine_value(fmt, engine: str) -> tuple[str | None, str]:
    """llama.cpp stores each type under its own name (-ctk / -ctv); no other engine has ggml's blocks."""
    return (fmt.base, "") if engine == "llama.cpp" else engine_default(fmt, engine)


_SCALES = {"q8_0": "fp16 `d = amax / 127` per 32 values",
           "q4_0": "fp16 `d = max / -8` per 32 (`max`: the signed value of largest \\|x\\|)",
           "q4_1": "fp16 `d = (max - min) / 15` and fp16 `m = min` per 32", "q5_0": "fp16 `d = max / -16` per 32",
           "q5_1": "fp16 `d = (max - min) / 31` and fp16 `m = min` per 32",
           "iq4_nl": "fp16 `d` per 32, a weighted least-squares fit"}
_ELEMENTS = {"q8_0": "llama.cpp: int8, `roundf(x / d)`", "q4_0": "llama.cpp: 4-bit, `(q - 8) d`",
             "q4_1": "llama.cpp: 4-bit, `q d + m`", "q5_0": "llama.cpp: 5-bit, `(q - 16) d`",
             "q5_1": "llama.cpp: 5-bit, `q d + m`",
             "iq4_nl": "llama.cpp: 4-bit index into 16 non-linear levels (-127 .. 113)"}
_BITS = {"q8_0": 8, "q4_0": 4, "q4_1": 4, "q5_0": 5, "q5_1": 5, "iq4_nl": 4}

FAMILY = Family(
    name="ggml",
    doc="llama.cpp's KV cache types (-ctk / -ctv), bit-exact with ggml's reference quantizers",
    bases={name: BaseInfo("ggml", _BITS[name], "token", ("token",), block=QK, zero=name in ("q4_1", "q5_1"),
                          block_hint="every llama.cpp type uses 32", elements=_ELEMENTS[name], scales=_SCALES[name])
           for name in TYPES},
    codec=sys.modules[__name__],
    layout=layout,
    scale_bytes=2,
    engine_value=engine_value,
    native_engine="llama.cpp",
    choices=(
        choice("k=q8_0,v=q4_0", compare=10, export=12, export_support=14),
        choice("llama.cpp:q8_0", compare=14, candidates=10),
        choice("q8_0", errors=12, export=11, export_support=12, memory=9),
        choice("q4_0", errors=13, export_support=13, memory=10, sensitivity=10),
        choice("iq4_nl", errors=14),
        choice("llama.cpp:k=q8_0,v=q4_0", export=17),
        choice("llama.cpp:q4_0", memory=16, candidates=9),
    ),
)
