"""`QTensor`: values stored in a kvviz format; the one type for a quantized tensor and for a packed cache side.

One type serves both uses:
- `Format.quantize(x)` returns one for x [..., tokens, head_dim]: every token quantized, no tail;
- a `kvviz.QuantizedKVCache` layer returns one per side (K, V) from `update`: tokens 0..n_quantized-1 quantized,
  held in views of the cache's growable buffers, tokens n_quantized..seq_len-1 in the full-precision `tail`. The
  "kvviz" attention function reads it: `dequantize()` (the torch reference), or `kernels.packed.side_of(q)` to
  hand its buffers to a fused kernel in place.

Fields (the layout of kvviz.formats; a cache side has [batch, kv_heads] in front and its views' strides along
batch and head include the buffers' spare token capacity, so a kernel must use the strides):

    data          [..., n_quantized, head_dim * bits / 8] element codes (uint8 when packed: int4 and FP4 two a byte,
                  element 2i in the low nibble; int2 four), or [..., n_quantized, head_dim] (int8, fp8, casts)
    scale         token granularity [..., n_quantized, head_dim / g]; channel [..., ceil(n_quantized / N), head_dim];
                  None for casts and per-tensor / per-head formats
    zero          asym group minimums, shaped as the tensor that holds the group's scale; else None
    tensor_scale  fp32 per-tensor [] or per-head [..., H, 1, 1] static scale (nvfp4: its global scale), or None
    tail          None, or [..., seq_len - n_quantized, head_dim] 16-bit full-precision tokens following the
                  quantized ones (a cache's residual window and a channel format's partial group)
    skip          leading tokens attention must not see (a sliding-window side keeps its oldest channel group whole)
    memo          a cache side's dict, the same on every call, where a fused kernel's launcher keeps what it derived
                  from the buffers (kernels.packed.PackedSide.memo); None for anything else
    dtype         the dtype `dequantize` returns (the quantized x's; a cache side's model dtype)

Deliberately no `.shape`: code that takes a QTensor for a tensor (an attention function other than "kvviz" given
a cache side) fails with the AttributeError below instead of computing garbage. `values_shape` is the shape of
the quantized values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch


class Codec(Protocol):
    """What a QTensor needs of the format that made it (kvviz.formats.core.Format, one floor up, is one): QTensor
    sits below the formats so that Format.quantize can return it."""

    granularity: str | None
    group: int | None

    def dequantize(self, q: "QTensor") -> torch.Tensor: ...


@dataclass(frozen=True, eq=False)
class QTensor:
    """Quantized tokens (and, for a cache side, a full-precision tail). See the module docstring for the fields."""

    fmt: Codec
    head_dim: int
    dtype: torch.dtype
    data: torch.Tensor
    scale: torch.Tensor | None = None
    zero: torch.Tensor | None = None
    tensor_scale: torch.Tensor | None = None
    tail: torch.Tensor | None = None
    skip: int = 0
    memo: dict | None = dataclasses.field(default=None, repr=False)  # a cache side's, for fused kernels (below)

    @property
    def n_quantized(self) -> int:
        return self.data.shape[-2]

    @property
    def seq_len(self) -> int:
        """Tokens held: quantized plus tail."""
        return self.n_quantized + (0 if self.tail is None else self.tail.shape[-2])

    @property
    def values_shape(self) -> tuple[int, ...]:
        """Shape of the quantized values, [..., n_quantized, head_dim] (the x that `Format.quantize` took)."""
        return (*self.data.shape[:-1], self.head_dim)

    @property
    def nbytes(self) -> int:
        """Bytes of the quantized part: packed data + scales + zero points + per-tensor scalars (not the tail)."""
        parts = (self.data, self.scale, self.zero, self.tensor_scale)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def slice(self, start: int, stop: int) -> "QTensor":
        """Quantized tokens start..stop-1 as a QTensor of views, without tail (channel formats: whole groups)."""
        if self.fmt.granularity == "channel":
            g = self.fmt.group
            assert start % g == 0 and (stop % g == 0 or stop == self.n_quantized), (
                f"channel groups of {g} cut at {start}..{stop}")
            rows = slice(start // g, -(-stop // g))
        else:
            rows = slice(start, stop)
        pick = lambda t: None if t is None else t[..., rows, :]  # noqa: E731
        return QTensor(fmt=self.fmt, head_dim=self.head_dim, dtype=self.dtype, data=self.data[..., start:stop, :],
                       scale=pick(self.scale), zero=pick(self.zero), tensor_scale=self.tensor_scale)

    def dequantize(self) -> torch.Tensor:
        """The reference read of the visible tokens: [..., seq_len - skip, head_dim] in `dtype`."""
        tail = None if self.tail is None else self.tail.to(self.dtype)
        if self.n_quantized == 0:
            assert tail is not None, "nothing quantized and no tail"
            return tail[..., self.skip :, :]
        # Contiguous copies: a cache side's capacity strides make torch's CPU elementwise kernels ~15x slower.
        dense = QTensor(fmt=self.fmt, head_dim=self.head_dim, dtype=self.dtype, data=self.data.contiguous(),
                        scale=_contiguous(self.scale), zero=_contiguous(self.zero), tensor_scale=self.tensor_scale)
        history = self.fmt.dequantize(dense)  # [..., n_quantized, head_dim]
        full = torch.cat([history, tail], dim=-2) if tail is not None and tail.shape[-2] else history
        return full[..., self.skip :, :]

    def __getattr__(self, name):
        raise AttributeError(
            f"QTensor has no attribute {name!r}: it holds packed, quantized values (kvviz.formats); read them with "
            f"q.dequantize(). A kvviz.QuantizedKVCache hands attention one QTensor per side, readable only by the "
            f"'kvviz' attention function: call model.set_attn_implementation('kvviz') first."
        )


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()
