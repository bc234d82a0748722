"""`PackedSide`: how the kernels read one side (K or V) of a packed KV cache: plain tensors and simple values.

kvviz's one type for a packed side is `kvviz.formats.QTensor` (a cache side: quantized buffers plus a
full-precision tail). The kernels never import kvviz, so they read this decoded description of it instead, built
in one place: `side_of(q)` takes anything shaped like a QTensor (`fmt`, `data`, `scale`, `zero`, `tensor_scale`,
`head_dim`, `tail`), `side_from_format` the same pieces one by one. Both read the format only through the packed
layout its family states, `fmt.layout(head_dim)` (`layout_of`; duck-typed, kvviz.formats.family.Layout): every
field below is the layout's, and no kernel branches on a format's name. Which packer loop writes a format is the
layout's too (`layout.packer`: one of PACKERS, "ggml", an ENGINE_PACKER name, or None). Layout (the kvviz QTensor
layout, with a batch and a kv-head axis in front, a token capacity `cap`):

    data          [B, Hkv, cap, D * bits // 8]  fp16/bf16/fp32 (casts), int8 (int8 sym), uint8 (int8 asym, int4,
                                                int2, E2M1: element 2i in the low nibble; int2: 4i+j at bits 2j),
                                                float8_e4m3fn / float8_e5m2 (fp8)
    scale         token:   [B, Hkv, cap, D // group]          fp16 / fp32 / uint8 E8M0 / float8_e4m3fn
                  channel: [B, Hkv, ceil(cap / group), D]     group = tokens per scale row
    zero          asym only, shaped as the tensor holding the group's scale (x = u * scale + zero): as `scale`
                  for token / channel kinds, as `tensor_scale` when scale_kind is None
    tensor_scale  fp32 [] (per tensor) or any shape holding Hkv or B * Hkv values (per head)
    tail          [B, Hkv, R, D] float: full-precision tokens at logical positions n_packed .. n_packed + R - 1
    rotation      [D, D]: stored values are x @ rotation^T, i.e. dequantize(data) @ rotation = x

Dequantized value of token t, channel d (packed tokens t < n_packed):
    x = (decode(code) [* scale] [* tensor_scale] [+ zero]) @ rotation   (scale, zero per group; absent = 1, 0)

The engines' stores (vLLM's per-token-head, NVFP4 and TurboQuant caches, the TurboQuant paper's TQ-mse and TQ-prod)
are described by the same fields plus four, which their families' layouts state (kvviz/formats/vllm.py,
turboquant.py, tq_paper.py):

    elem "table"  value = values[code]: a codebook (fp32 [2**bits]; TurboQuant's Lloyd-Max centroids)
    renorm        each token's decoded codebook vector is divided by sqrt(sum(v^2) + 1e-16) before its scale (vLLM
                  TurboQuant's norm correction, the "nc" presets): x = norm * v / |v|, the scale holding the norm
    zp_bits       the low zp_bits of each fp32 token scale hold an unsigned zero point: value = (code - zp) *
                  (scale with those bits cleared) (vLLM's int4_per_token_head)
    bits 3, 1     packed as 4 and 2 are: element e at bit e * bits of the token's little-endian bit stream (3 bits:
                  8 elements in 3 bytes; 1 bit: 8 a byte, element e at bit e % 8 of byte e // 8)
    qjl           a [D, D] fp32 matrix G: a 1-bit sketch of each token's residual (TQ-prod's QJL). Each data row
                  holds D * bits / 8 bytes of codes, then D / 8 bytes of signs z (element e at bit e % 8 of byte
                  e // 8; 1 is +1, 0 is -1), and the token scale a second column r after s. The row reads
                      x = (values[code] * s) @ rotation + s * r * (z @ G)
                  so a query scores (q @ rotation^T) . (values[code] * s) + s * r * (q @ G^T) . z: two bases, each
                  query turned once per step, the cache never.

A rotated store's kernels rotate the query once per step (score = (q @ rotation^T) . stored) and the output once
(out = softmax @ stored values, then @ rotation); the cache is never rotated back.

llama.cpp's KV types (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl; kvviz/formats/ggml.py's layouts) use the same
fields with token scales in blocks of 32 (group 32): scale fp16 d [B, Hkv, cap, D // 32], zero fp16 m (q4_1, q5_1),
and `layout="ggml"`. data is q8_0: int8 [B, Hkv, cap, D] (elem "float", read natively); else uint8
[B, Hkv, cap, D * bits // 8] in ggml's order, 32 * bits // 8 bytes per block: (q5_0 / q5_1, bits 5: 4 bytes qh, a
little-endian uint32 whose bit j is bit 4 of code j, then) 16 bytes qs, byte j = code j (low nibble) | code j + 16
(high nibble), not the element-2i-low order above. Values: q8_0 code * d; q4_0 (code - 8) * d; q5_0 (code - 16) * d
(elem "int", offset 8 / 16); q4_1 / q5_1 code * d + m (offset 0, zero m); iq4_nl KVALUES_IQ4NL[code] * d
(elem "iq4_nl").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

ELEMS = ("float", "int", "fp8_e4m3", "fp8_e5m2", "e2m1", "iq4_nl", "table")
LAYOUTS = ("kvviz", "ggml")
IQ4NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # ggml's kvalues_iq4nl
SCALE_KINDS = (None, "token", "channel")
GGML_TYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # llama.cpp's KV types, by their packers' TYPE code
# The packers' loops, by the name a format's layout gives (`layout.packer`): kvviz's token-group encoders (both
# packers), llama.cpp's blocks ("ggml", its `ggml_type` one of GGML_TYPES) and the engines' stores
# ("engine:EN_*", kernels/cpu/jit/pack_engines.py's codes; the CPU packer only)
PACKERS = ("int_sym", "int_asym", "fp8", "mx", "nv")
ENGINE_PACKER = "engine:"


def describes_format(fmt) -> bool:
    """True when a PackedSide can describe `fmt`'s packed buffers: its family states a packed layout
    (`fmt.has_layout`, then `fmt.layout(head_dim)`: kvviz/formats' families, read by duck typing). A format without
    one (an MLA latent, read dequantized) is read through the reference."""
    return bool(getattr(fmt, "has_layout", False))


def layout_of(fmt, head_dim: int):
    """The packed layout `fmt` states at head_dim (duck-typed kvviz.formats Layout: elem, bits, storage, per_unit,
    unit_bytes, offset, scale_kind, group, zero, values, renorm, rotation, qjl, packer, pack_table, fp8_exp, fmax,
    ggml_type; `kernel_fields()` the PackedSide keywords), or None when no kernel reads it."""
    return fmt.layout(int(head_dim)) if describes_format(fmt) else None


@dataclass(frozen=True)
class PackedSide:
    """One packed side of a KV cache; see the module docstring for every tensor's layout."""

    data: torch.Tensor
    head_dim: int
    elem: str = "float"  # how a stored element decodes: float (native cast) | int | fp8_e4m3 | fp8_e5m2 | e2m1 |
    #                      iq4_nl (IQ4NL_VALUES[code]) | table (values[code])
    bits: int = 16  # bits per stored element: 16, 8, 4, 3, 2, 1 (ggml layout: 8, 5, 4)
    offset: int = 0  # int codes: value = u - offset (2**(bits-1) for int4/int2 sym, else 0)
    scale: torch.Tensor | None = None
    scale_kind: str | None = None  # None | "token" | "channel" (tensor / head scales live in tensor_scale)
    group: int | None = None  # token: channels per scale (default head_dim); channel: tokens per scale row
    zero: torch.Tensor | None = None
    tensor_scale: torch.Tensor | None = None
    n_packed: torch.Tensor | int | None = None  # [B] tokens held in `data`; None: every valid token
    tail: torch.Tensor | None = None
    rotation: torch.Tensor | None = None
    layout: str = "kvviz"  # "kvviz": element order above; "ggml": llama.cpp's 32-value blocks (qh, then qs)
    values: torch.Tensor | None = None  # elem "table": fp32 [2**bits], value = values[code]
    renorm: bool = False  # divide each token's decoded vector by sqrt(sum(v^2) + 1e-16) before the scale
    zp_bits: int = 0  # the low zp_bits of each fp32 token scale are a zero point: (code - zp) * cleared scale
    qjl: torch.Tensor | None = None  # [D, D]: each row's signs after its codes, its residual norm after its scale
    # A dict its producer keeps from call to call (a cache side: one per side), where a kernel launcher may keep
    # what it derived from the buffers (kernels/cpu/decode.py: numpy views, decode tables); the launcher checks that
    # the buffers are still the ones it saw. None: derive everything on every call.
    memo: dict | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        assert self.elem in ELEMS, f"elem must be one of {ELEMS}, got {self.elem!r}"
        assert self.scale_kind in SCALE_KINDS, f"scale_kind must be one of {SCALE_KINDS}, got {self.scale_kind!r}"
        assert self.layout in LAYOUTS, f"layout must be one of {LAYOUTS}, got {self.layout!r}"
        assert self.data.dim() == 4, f"data must be [B, Hkv, cap, packed_dim], got {tuple(self.data.shape)}"
        if self.layout == "ggml":
            assert self.bits in (8, 5, 4) and self.head_dim % 32 == 0, (
                f"ggml blocks need bits 8 / 5 / 4 and head_dim a multiple of 32: bits={self.bits}, D={self.head_dim}"
            )
            assert self.elem != "iq4_nl" or self.bits == 4, "iq4_nl stores 4-bit codes"
            assert self.data.shape[-1] == self.head_dim * self.bits // 8, (
                f"data's last dim {self.data.shape[-1]} does not hold head_dim {self.head_dim} at {self.bits} bits"
            )
        else:
            assert self.elem != "iq4_nl", "iq4_nl codes are stored in the ggml layout"
            assert self.bits in (16, 8, 4, 3, 2, 1) or (self.bits == 32 and self.elem == "float"), f"bits={self.bits}"
            if self.bits < 8:
                whole = self.head_dim % 8 == 0 if self.bits in (3, 1) else self.head_dim * self.bits % 8 == 0
                row = self.head_dim * self.bits // 8 + (self.head_dim // 8 if self.qjl is not None else 0)
                assert whole and self.data.shape[-1] == row, (
                    f"data's last dim {self.data.shape[-1]} does not hold head_dim {self.head_dim} at {self.bits} bits"
                    + (" and its signs" if self.qjl is not None else "")
                )
            else:
                assert self.data.shape[-1] == self.head_dim, (
                    f"data's last dim {self.data.shape[-1]} does not hold head_dim {self.head_dim}")
        if self.elem == "table":
            assert self.values is not None and self.values.numel() == 2**self.bits, "a table elem needs 2**bits values"
        assert self.zp_bits == 0 or (self.scale_kind == "token" and self.scale.dtype == torch.float32), (
            "a zero point in the scale's low bits needs fp32 token scales")
        if self.scale_kind in ("token", "channel"):
            assert self.scale is not None and self.scale.dim() == 4, "token/channel scales are [B, Hkv, rows, cols]"
        if self.qjl is not None:
            assert self.layout == "kvviz" and self.bits < 8 and self.head_dim % 8 == 0, "signs follow packed codes"
            assert self.scale_kind == "token" and self.group_size == self.head_dim and self.scale.shape[-1] == 2, (
                "a sketch needs one token scale per row and the residual norm beside it: scale [B, Hkv, cap, 2]")
            assert self.zero is None and self.tensor_scale is None and self.zp_bits == 0, "a sketch takes no zeros"
            assert tuple(self.qjl.shape) == (self.head_dim, self.head_dim), "the sketch matrix is [D, D]"
        if self.zero is not None and self.scale_kind in ("token", "channel"):
            assert self.zero.shape == self.scale.shape, "zero must have the shape of scale"

    @property
    def group_size(self) -> int:
        """Channels per token scale (token kind) or tokens per scale row (channel kind)."""
        if self.scale_kind == "token":
            return self.group or self.head_dim
        if self.scale_kind == "channel":
            assert self.group, "channel scales need a token group"
            return self.group
        return 0


def per_head(t, batch: int, heads: int, device) -> torch.Tensor | None:
    """A per-tensor / per-head scale (a number, or 1, Hkv or B * Hkv values) as contiguous fp32 [B * Hkv]."""
    if t is None:
        return None
    t = torch.as_tensor(t).detach().to(device=device, dtype=torch.float32).reshape(-1)
    if t.numel() == 1:
        t = t.expand(batch * heads)
    elif t.numel() == heads:
        t = t.repeat(batch)
    assert t.numel() == batch * heads, f"tensor scale holds {t.numel()} values; want 1, Hkv or B*Hkv"
    return t.contiguous()


def side_from_format(
    fmt,
    data: torch.Tensor,
    scale: torch.Tensor | None = None,
    zero: torch.Tensor | None = None,
    tensor_scale: torch.Tensor | None = None,
    *,
    head_dim: int | None = None,
    n_packed: torch.Tensor | int | None = None,
    tail: torch.Tensor | None = None,
    rotation: torch.Tensor | None = None,
    memo: dict | None = None,
) -> PackedSide:
    """Describe packed buffers of a kvviz-like format `fmt` (duck-typed: `layout(head_dim)`, `spec`; see
    `layout_of`). data/scale/zero/tensor_scale are laid out as kvviz's QTensor fields with [B, Hkv] in front; every
    field of the description is the format's layout's (`layout.kernel_fields()`), its matrices copied to data's
    device once. A rotated format's layout carries its rotation (a /rot format: the normalized Hadamard matrix)."""
    if not describes_format(fmt):
        raise ValueError(f"The fused kernels do not read {fmt.spec} (its family states no packed layout); "
                         "set KVVIZ_BACKEND=torch to read it through the reference.")
    bits = int(fmt.bits)
    head_dim = head_dim or (data.shape[-1] * 8 // bits if bits < 8 else data.shape[-1])
    fields = layout_of(fmt, head_dim).kernel_fields()
    if rotation is not None:
        fields["rotation"] = rotation
    elif fields.get("rotation") is not None:  # the family's cached matrix: one copy per device, not per read
        fields["rotation"] = _on_device(fields["rotation"], data.device)
    return PackedSide(data=data, head_dim=head_dim, scale=scale if fields.get("scale_kind") else None, zero=zero,
                      tensor_scale=tensor_scale, n_packed=n_packed, tail=tail, memo=memo, **fields)


def side_of(q) -> PackedSide:
    """A kvviz QTensor (duck-typed; a cache side's views over its buffers, read in place, or a quantized tensor
    [B, Hkv, T, D]) as the kernels' PackedSide: tokens 0..n_quantized-1 packed, the tail after them."""
    return side_from_format(q.fmt, q.data, q.scale, q.zero, q.tensor_scale, head_dim=q.head_dim,
                            n_packed=q.data.shape[2], tail=q.tail, memo=getattr(q, "memo", None))


@functools.lru_cache(maxsize=64)
def _on_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A codec's cached matrix on `device`, copied once per (matrix, device), not on every read."""
    return t.to(device)
