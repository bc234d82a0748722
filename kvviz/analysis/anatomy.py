"""Format anatomy: one token of one head of the real K or V, followed through a format's quantizer step by step.

Every number comes from the format itself: `Format.quantize` on the head's tokens, the QTensor's stored fields
(data, scale, zero, tensor_scale) read back for the chosen token, and `Format.dequantize` for the reconstruction.
Nothing here re-implements a codec; it only unpacks what the codec stored (each family's own unpack function) and
derives, per element, the level a code stands for (reconstruction in the quantized domain, minus the zero point,
over the scale). The arithmetic line of an element is shown only where it reproduces the reconstruction.

    from kvviz.analysis.anatomy import format_anatomy
    a = format_anatomy(cap, "int4", side="K", layer=18, head=0, token=5)
    a.inputs, a.codes, a.code_bits, a.scales, a.reconstructed, a.error     # one entry per element (head_dim)

TurboQuant (vLLM's `vllm:turboquant_*` keys, the paper's `tq_mse*` / `tq_prod*`) stores a norm and, per rotated
coordinate, a codebook index: the anatomy then holds the rotation, the codebook, the norm, and every token's rotated
coordinates (scaled by sqrt(head_dim)) for a histogram against the N(0, 1) the codebook is built for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvviz.formats import Format, groups, rotate, turboquant, unpack
from kvviz.formats.ggml import unpack_block_codes
from kvviz.formats.kv import parse_kv

from .capture import KVCapture
from .stats import outlier_mask

SIDES = {"K": "keys_post", "V": "values"}  # what the cache stores: K after RoPE, V


@dataclass(frozen=True)
class Stored:
    """One stored number besides the codes (a scale, a zero point, a norm), as the format keeps it."""

    name: str  # "scale", "zero", "tensor scale", "norm", "residual norm"
    value: float
    dtype: str  # "float16", "float32", "float8_e4m3fn", "uint8 (E8M0)"...
    bits: str  # the stored bits, most significant first
    elements: tuple[int, int]  # the elements [start, stop) it applies to


@dataclass(frozen=True)
class Anatomy:
    """One token of one head through a format; lists are per element (head_dim long) unless noted."""

    format: str  # canonical spec
    side: str  # "K" | "V"
    layer: int
    head: int
    token: int
    token_text: str
    head_dim: int
    bits_per_value: float  # the format's stored bits per value, scales included
    domain: str  # what the codes quantize: "input", "Hadamard-rotated input", "rotated unit vector"
    inputs: list[float]  # the token's K or V
    quantized_input: list[float]  # the same in the codes' domain (rotated for /rot and TurboQuant)
    codes: list[int]  # each element's stored code (unsigned as stored, int8 as signed)
    code_bits: list[str]  # the code's bits, most significant first
    levels: list[float]  # what each code stands for before the scale (the codebook entry for TurboQuant)
    element_scale: list[float] | None  # the scale each element was multiplied by, None when there is none
    element_zero: list[float] | None
    scales: list[Stored]  # every scale / zero / norm this token's elements use
    quantized_output: list[float]  # the reconstruction in the codes' domain
    reconstructed: list[float]  # what attention reads back (Format.dequantize)
    error: list[float]  # reconstructed - inputs
    rel_error: float  # ||error|| / ||inputs||
    arithmetic: list[str]  # per element, the sum that reproduces quantized_output (checked), or the lookup
    outliers: list[int]  # this head's outlier channels over the prompt (kvviz.analysis.stats.outlier_mask)
    rotation: str | None  # which rotation the format applies before its codes, or None
    codebook: list[float] | None  # TurboQuant: the centroids (unit-vector coordinates)
    norm: float | None  # TurboQuant: the stored norm of the token
    rotated_all: list[float] | None  # TurboQuant: every token's rotated coordinates times sqrt(head_dim)
    notes: list[str]


def _bits(value: torch.Tensor, width: int | None = None) -> str:
    """The stored bits of one element (any dtype), most significant first."""
    size = value.element_size()
    raw = value.reshape(1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])
    n = int(raw.item()) & ((1 << (8 * size)) - 1)
    return format(n, f"0{width or 8 * size}b")


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _codes(fmt: Format, row: torch.Tensor, head_dim: int) -> tuple[list[int], list[str]]:
    """(codes, their bits) of one token's stored data row, unpacked by the family that packed it."""
    if row.shape[-1] == head_dim:  # one stored element per value: int8, fp8, 16-bit casts, q8_0
        if row.is_floating_point():  # a float's code is its bit pattern, read as an unsigned integer
            codes = [int(_bits(v), 2) for v in row]
        else:
            codes = [int(v) for v in row]
        return codes, [_bits(row[i]) for i in range(head_dim)]
    layout = fmt.layout(head_dim)
    bits = fmt.bits if layout is None else layout.bits  # TQ-prod: its codes' bits, the sign bits after them
    if layout is not None and layout.storage == "ggml":
        codes = unpack_block_codes(row.reshape(head_dim // 32, -1), bits).reshape(-1)
    elif layout is not None and (layout.elem == "table" or layout.unit_bytes > 1 or bits == 1):  # a bit stream
        codes = turboquant.unpack_bits(row[: head_dim * bits // 8], bits)
    else:
        codes = unpack(row, bits)
    return [int(c) for c in codes], [format(int(c), f"0{bits}b") for c in codes]


def _per_element(t: torch.Tensor | None, fmt: Format, shape: tuple[int, ...], token: int) -> torch.Tensor | None:
    """A stored per-group tensor spread over the token's elements: [head_dim] fp32, or None."""
    if t is None:
        return None
    d = shape[-1]
    if t.dim() == 0 or t.numel() == 1:
        return t.float().reshape(()).expand(d)
    if fmt.granularity == "channel":
        return groups.expand(t, "channel", fmt.group, shape)[0, 0, token].float()
    row = t[0, 0, token].float().reshape(-1)  # [groups of this token]
    if d % row.numel():
        return None
    return row.repeat_interleave(d // row.numel())


def _stored(name: str, t: torch.Tensor | None, fmt: Format, shape: tuple[int, ...], token: int) -> list[Stored]:
    """Each stored number of `t` this token uses, with the elements it covers."""
    if t is None:
        return []
    d = shape[-1]
    if t.numel() == 1:
        return [Stored(name, float(t.float().reshape(())), _dtype_name(t), _bits(t.reshape(())), (0, d))]
    if fmt.granularity == "channel":
        row = t[0, 0, token // fmt.group]  # [head_dim]: one per channel
        return [Stored(f"{name} {c}", float(row[c].float()), _dtype_name(t), _bits(row[c]), (c, c + 1))
                for c in range(d)]
    row = t[0, 0, token].reshape(-1)
    g = d // row.numel() if d % row.numel() == 0 else d
    return [Stored(name if row.numel() == 1 else f"{name} {i}", float(row[i].float()), _dtype_name(t),
                   _bits(row[i]), (i * g, min(d, (i + 1) * g))) for i in range(row.numel())]


def format_anatomy(cap: KVCapture, fmt: str | Format, side: str = "K", layer: int = 0, head: int = 0,
                   token: int = 0) -> Anatomy:
    """Token `token` of KV head `head` in captured layer `layer` (side "K": post-RoPE keys, "V": values) through
    `fmt`, quantized with the head's whole prompt as the format would store it (channel groups and per-tensor
    scales see every token). ValueError for a side, layer, head or token outside the capture, or a format that
    cannot hold this head_dim."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {sorted(SIDES)}, got {side!r}.")
    if isinstance(fmt, str):  # a spec, a K/V pair or an engine's dtype: the side's format
        kv = parse_kv(fmt)
        f = kv.k if side == "K" else kv.v
    else:
        f = fmt
    x_all = cap.tensor(SIDES[side])  # [layers, kv_heads, T, D]
    n_layers, n_heads, n_tokens, d = x_all.shape
    for what, value, n in (("layer", layer, n_layers), ("head", head, n_heads), ("token", token, n_tokens)):
        if not isinstance(value, int) or not 0 <= value < n:
            raise ValueError(f"{what} must be an integer in 0..{n - 1} for this capture, got {value!r}.")
    x = x_all[layer, head][None, None]  # [1, 1, T, D]: one batch, one head
    q = f.quantize(x)
    x_hat = f.dequantize(q).float()  # [1, 1, T, D]
    inputs, recon = x[0, 0, token], x_hat[0, 0, token]  # [D]

    notes: list[str] = []
    codes, code_bits = _codes(f, q.data[0, 0, token], d)
    scale = _per_element(q.scale if q.scale is not None else q.tensor_scale, f, tuple(x.shape), token)
    zero = _per_element(q.zero, f, tuple(x.shape), token)
    if q.scale is not None and q.tensor_scale is not None:  # nvfp4: block scale times a per-tensor global scale
        scale = scale * q.tensor_scale.float().reshape(())
    stored = (_stored("scale", q.scale, f, tuple(x.shape), token) + _stored("zero", q.zero, f, tuple(x.shape), token)
              + _stored("tensor scale", q.tensor_scale, f, tuple(x.shape), token))

    rotation_note, codebook, norm, rotated_all = None, None, None, None
    domain, q_in, q_out = "input", inputs.float(), recon
    layout = f.layout(d)
    turbo_key = layout is not None and layout.elem == "table"  # a codebook index per rotated coordinate
    if f.rot:
        rotation_note = f"normalized Hadamard H ({d}x{d}): the codes store x @ H; the read multiplies by H again"
        domain, q_in, q_out = "Hadamard-rotated input", rotate(inputs), rotate(recon)
    if turbo_key:
        r = layout.rotation.T.contiguous()  # stored = x @ rotation^T (the layout reads x = stored @ rotation)
        cb = layout.values
        rotation_note = f.family.rotation_note(f, d)
        unit = x[0, 0].float() / x[0, 0].float().norm(dim=-1, keepdim=True).clamp(min=1e-30)  # [T, D]
        y = unit @ r  # [T, D] rotated unit vectors
        domain, q_in = "rotated unit vector", y[token]
        codebook = [float(c) for c in cb]
        levels = [codebook[c] for c in codes]
        q_out = torch.tensor(levels)
        norm = float(q.scale[0, 0, token, 0].float())
        stored = [Stored("norm", norm, _dtype_name(q.scale), _bits(q.scale[0, 0, token, 0]), (0, d))]
        if layout.qjl is not None:
            stored.append(Stored("residual norm", float(q.scale[0, 0, token, 1].float()), _dtype_name(q.scale),
                                 _bits(q.scale[0, 0, token, 1]), (0, d)))
            notes.append("tq_prod adds one sign bit per coordinate (QJL of the residual) read through a Gaussian "
                         "sketch: the reconstruction is the codebook vector plus that correction.")
        if layout.renorm:
            notes.append("\"nc\": the centroid vector is renormalized to unit length before the norm multiplies it.")
        rotated_all = (y * math.sqrt(d)).reshape(-1).tolist()
        scale = zero = None
        arithmetic = [f"codebook[{c}] = {lv:.4g} (rotated coordinate {float(v):.4g})"
                      for c, lv, v in zip(codes, levels, q_in)]
    else:
        if scale is not None:
            levels_t = (q_out - (zero if zero is not None else 0)) / torch.where(scale == 0, 1.0, scale)
        else:
            levels_t = q_out.clone()
        levels = levels_t.tolist()
        arithmetic = []
        for i in range(d):
            if scale is None:
                arithmetic.append(f"code {code_bits[i]} reads as {levels[i]:.6g}")
                continue
            s = float(scale[i])
            z = float(zero[i]) if zero is not None else 0.0
            again = levels[i] * s + z
            ok = math.isclose(again, float(q_out[i]), rel_tol=1e-3, abs_tol=1e-6)
            arithmetic.append(f"{levels[i]:.4g} × {s:.4g}" + (f" + {z:.4g}" if zero is not None else "")
                              + f" = {float(q_out[i]):.4g}" if ok else
                              f"code {code_bits[i]} reads as {float(q_out[i]):.4g}")
    if f.engine_rot:
        notes.append("llama.cpp rotates Q, K and V with a Hadamard transform by default (/norot turns it off): "
                     "its cache holds the blocks of the rotated K and V, and its attention un-rotates the output. "
                     "The blocks above are of the values as given, before that rotation.")
    if f.rot:
        arithmetic = [a + f" → rotated back: {float(r):.4g}" for a, r in zip(arithmetic, recon)]

    err = recon - inputs.float()
    amax = x[0, 0].float().abs().amax(dim=0)  # [D]
    return Anatomy(
        format=f.spec, side=side, layer=layer, head=head, token=token, token_text=cap.tokens[token], head_dim=d,
        bits_per_value=f.bits_per_value(d), domain=domain, inputs=inputs.float().tolist(),
        quantized_input=q_in.float().tolist(), codes=codes, code_bits=code_bits, levels=[float(v) for v in levels],
        element_scale=None if scale is None else scale.tolist(), element_zero=None if zero is None else zero.tolist(),
        scales=stored, quantized_output=q_out.float().tolist(), reconstructed=recon.tolist(), error=err.tolist(),
        rel_error=float(err.norm() / inputs.float().norm().clamp(min=1e-30)), arithmetic=arithmetic,
        outliers=torch.nonzero(outlier_mask(amax)).flatten().tolist(), rotation=rotation_note, codebook=codebook,
        norm=norm, rotated_all=rotated_all, notes=notes)
