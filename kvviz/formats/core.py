"""`Format`: a spec turned into quantize / dequantize / byte accounting (what it stores: `QTensor`, qtensor.py).

A Format is data plus pure functions: it dispatches to its family's codec (family.py's REGISTRY: `floats`, `ints`,
`fp4`, `ggml`; vLLM's own store paths `vllm`, `turboquant`, `ultraquant` and `ds_mla`; the paper's `tq`), applies the optional
Hadamard rotation (`/rot`, QuaRot), and accounts for every byte it stores. A codec that stores a fixed number of
bytes per token and head (the engines' layouts) says so with `token_head_bytes(fmt, head_dim)`, and may refuse a
head_dim with `check_head_dim(fmt, head_dim)`.

    fmt = get_format("int4/channel/g32/asym")
    q = fmt.quantize(x)          # x: [..., tokens, head_dim] float
    x_hat = fmt.dequantize(q)    # same shape and dtype as x
    q.nbytes == fmt.nbytes_for(x.shape)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from . import engines, groups
from .family import REGISTRY, Family, Layout
from .packing import hadamard, rotate
from .qtensor import QTensor
from .spec import BASES, SpecParts


@dataclass(frozen=True)
class Format:
    """One KV storage format, parsed from a spec string. Build it with `get_format`."""

    parts: SpecParts = field(repr=False)

    spec = property(lambda self: self.parts.canonical, doc="canonical spec string")
    base = property(lambda self: self.parts.base, doc="base format name")
    granularity = property(lambda self: self.parts.granularity, doc="token | channel | tensor | head | None")
    group = property(lambda self: self.parts.group, doc="group size (head_dim for token, tokens for channel)")
    asym = property(lambda self: self.parts.asym or BASES[self.parts.base].zero,
                    doc="stores a zero point per group: /asym int formats, llama.cpp's q4_1 and q5_1")
    rot = property(lambda self: self.parts.rot, doc="Hadamard rotation over head_dim before quantizing")
    scale_source = property(lambda self: self.parts.scale_source,
                            doc="FP8 only: first | unit | calibrated (per-tensor / per-head), dynamic; else None")
    kind = property(lambda self: BASES[self.parts.base].kind,
                    doc="float | int | fp4 | ggml | vllm | turboquant | ultraquant | tq (read by the fused kernels: "
                        "kernels.packed.describes_format) | ds_mla (an MLA latent, read dequantized)")
    engine = property(lambda self: None if self.parts.engine is None else self.parts.engine.engine,
                      doc="the engine this format models (vllm | sglang | llama.cpp, from an engine-qualified name) "
                          "or None for kvviz's own formats")
    engine_rot = property(lambda self: self.parts.engine is not None and self.parts.engine.rotates,
                          doc="llama.cpp rotates Q, K and V with a Hadamard transform (on by default when K or V "
                              "is quantized, off with /norot): quantize stores the ggml block of what it is given; "
                              "a cache of llama.cpp: names stores the rotated blocks (kvviz.ggml_attention.Layout) "
                              "and its reads rotate Q and un-rotate the output")
    rounds_toward_zero = property(lambda self: engines.rounds_toward_zero(self.parts.engine),
                                  doc="fp8 stored rounded toward zero, as vLLM's CPU build stores it "
                                      "(`vllm:fp8_e4m3/cpu`); every other format rounds to nearest even")
    static_scale = property(lambda self: self.parts.static_scale,
                            doc="one fp32 scale per tensor or per head, fixed for every token (per-tensor and "
                                "per-head granularities): calibrated, loaded, or fitted on the first states")
    global_scale = property(lambda self: BASES[self.parts.base].global_scale,
                            doc="one fp32 scale for the whole tensor that a cache fits on its first states and "
                                "passes to quantize (NVFP4's global scale), besides the per-block scales")
    takes_scale = property(lambda self: self.static_scale or self.global_scale,
                           doc="a cache of this format takes a given scale: static-scale formats, and a global "
                               "scale (nvfp4's)")
    bits = property(lambda self: BASES[self.parts.base].bits, doc="bits per stored element")

    @property
    def family(self) -> Family:
        """The family that holds this format's behaviour (kvviz.formats.family.REGISTRY)."""
        return REGISTRY.family(self.kind)

    @property
    def codec(self):
        return self.family.codec

    def layout(self, head_dim: int) -> Layout | None:
        """How packed buffers hold this format at head_dim (what the kernels read), or None when no kernel reads
        it (an MLA latent)."""
        own = self.family.layout
        return None if own is None else own(self, head_dim)

    @property
    def has_layout(self) -> bool:
        """Whether the family describes its packed layout (so kernels may read it) at some head_dim."""
        return self.family.layout is not None

    def __repr__(self) -> str:
        return f"Format({self.spec!r})"

    # -- quantize / dequantize ---------------------------------------------------------------------------------
    def quantize(self, x: torch.Tensor, scale: float | torch.Tensor | None = None) -> QTensor:
        """x: float [..., tokens, head_dim] -> QTensor.

        `scale`: a static fp32 scale for per-tensor (a number) or per-head ([H] or [..., H, 1, 1]) formats, e.g.
        calibrated or loaded from a scale file; None computes it from x.
        """
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ValueError(f"{self.spec}.quantize expects a float tensor [..., tokens, head_dim], got {type(x).__name__}.")
        groups.check_shape(x.shape, self.granularity, self.group)
        self._check_head_dim(x.shape[-1])
        work = rotate(x) if self.rot else x
        fields = self.codec.encode(self, work, self._static_scale(scale, x))
        return QTensor(fmt=self, head_dim=x.shape[-1], dtype=x.dtype, **fields)

    def fit_scale(self, x: torch.Tensor) -> torch.Tensor:
        """The static scale quantize(x) fits to x when given none (per-tensor: a 0-d tensor; per-head: one per head,
        [..., H, 1, 1]), without encoding x: what a cache fixes on its first states. A global-scale format
        (nvfp4): its global scale for states x (0-d)."""
        if self.global_scale:
            return self.codec.fit_scale(self, rotate(x) if self.rot else x)
        if not self.static_scale:
            raise ValueError(f"{self.spec} computes its own scales per group; only per-tensor and per-head formats "
                             "fit a static one.")
        groups.check_shape(x.shape, self.granularity, self.group)
        return self.codec.fit_scale(self, rotate(x) if self.rot else x)  # int and float: the static kinds

    def given_scale(self, scale) -> torch.Tensor:
        """A global-scale format's given scale (e.g. calibrated) as a cache keeps and passes it to quantize."""
        if not self.global_scale:
            raise ValueError(f"{self.spec} has no global scale; a static scale is passed to quantize as it is.")
        return self.codec.given_scale(self, scale)

    def dequantize(self, q: QTensor) -> torch.Tensor:
        """QTensor -> its quantized values, [..., n_quantized, head_dim] in q.dtype (a cache side's tail is not
        read: q.dequantize() adds it)."""
        if not isinstance(q, QTensor):
            raise ValueError(f"{self.spec}.dequantize expects a QTensor from quantize(), got {type(q).__name__}.")
        x = self.codec.decode(self, q)  # fp32 [..., T, D]
        if self.rot:
            x = x @ hadamard(x.shape[-1], x.device)  # H is its own inverse
        return x.to(q.dtype)

    def kernel_fields(self, head_dim: int) -> dict | None:
        """For the engines' stores (kinds vllm, turboquant, tq): how the fused kernels read the packed buffers
        (kernels.packed.PackedSide's element, codebook, rotation, sketch and scale fields); None for kvviz's own
        families, which kernels.packed describes from the spec itself."""
        own = getattr(self.codec, "kernel_fields", None)
        return None if own is None else own(self, head_dim)

    def pack_table(self, head_dim: int) -> torch.Tensor | None:
        """For the engines' stores the CPU packer writes (kernels/cpu/pack.py): the fp32 table their encode reads
        (int4_per_token_head's RHT signs, a TurboQuant key's codebook midpoints), or None."""
        own = getattr(self.codec, "pack_table", None)
        return None if own is None else own(self, head_dim)

    def roundtrip(self, x: torch.Tensor, scale: float | torch.Tensor | None = None) -> torch.Tensor:
        """dequantize(quantize(x)): what attention would read back."""
        return self.dequantize(self.quantize(x, scale))

    def _check_head_dim(self, d: int) -> None:
        if self.parts.engine is not None:
            engines.check_head_dim(self.parts.engine, d)
        check = getattr(self.codec, "check_head_dim", None)
        if check is not None:
            check(self, d)
        per_byte = 8 // self.bits if self.bits < 8 else 1
        if d % per_byte:
            raise ValueError(f"{self.spec} packs {per_byte} values a byte: head_dim {d} must be a multiple of it.")
        if self.granularity == "token" and self.group and d % self.group:
            hint = "" if BASES[self.parts.base].block else f" (pick /g{math.gcd(d, self.group)})"
            raise ValueError(f"{self.spec} needs head_dim to be a multiple of {self.group}, got {d}{hint}.")

    def _static_scale(self, scale, x: torch.Tensor) -> torch.Tensor | None:
        if scale is None:
            return None
        if self.global_scale:
            s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
            if s.numel() != 1 or not bool(torch.isfinite(s).all()) or not bool((s >= 0).all()):
                raise ValueError(f"{self.spec} takes one finite, non-negative global scale, got {scale!r}.")
            return s.reshape(())
        if not self.static_scale:
            raise ValueError(
                f"A static scale applies to per-tensor or per-head formats; {self.spec} computes its own scales."
            )
        s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
        if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
            raise ValueError(f"Static scales must be finite and positive, got {scale!r}.")
        if self.granularity == "tensor":
            if s.numel() != 1:
                raise ValueError(f"{self.spec} takes one per-tensor scale, got {s.numel()} values.")
            return s.reshape(())
        heads = x.shape[-3]
        if s.numel() not in (1, heads):
            raise ValueError(f"{self.spec} takes one scale per head ({heads}), got {s.numel()} values.")
        shape = groups.scale_shape(tuple(x.shape), "head", None)
        return s.reshape(-1, 1, 1).expand(shape).contiguous() if s.numel() == heads else s.reshape(()).expand(shape).contiguous()

    # -- byte accounting ---------------------------------------------------------------------------------------
    def _group_bytes(self) -> int:
        """Bytes stored per scale group: the scale, plus the zero point for asym."""
        return self.family.scale_bytes * (2 if self.asym else 1)

    def bits_per_value(self, head_dim: int) -> float:
        """Stored bits per element: element bits + per-group scale and zero-point bits (per-token or per-channel).

        Per-tensor and per-head scalars are not per-element: `static_bytes` counts them.
        """
        own = getattr(self.codec, "token_head_bytes", None)
        if own is not None:
            return 8 * own(self, head_dim) / head_dim
        if self.granularity is None or self.static_scale:
            return float(self.bits)
        per_group = self.group if self.group else head_dim  # token groups default to the whole head_dim
        return self.bits + 8 * self._group_bytes() / per_group

    def static_bytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of fp32 per-tensor / per-head scalars (and zero points) for an x of `shape`."""
        if self.global_scale:
            return 4
        if self.granularity == "tensor":
            return 4 * (2 if self.asym else 1)
        if self.granularity == "head":
            return 4 * (2 if self.asym else 1) * math.prod(shape[:-2])
        return 0

    def nbytes_for(self, shape: tuple[int, ...]) -> int:
        """Exact bytes `quantize` of an x of `shape` holds (partial channel groups included)."""
        shape = tuple(shape)
        groups.check_shape(shape, self.granularity, self.group)
        self._check_head_dim(shape[-1])
        own = getattr(self.codec, "token_head_bytes", None)
        if own is not None:
            return math.prod(shape[:-1]) * own(self, shape[-1])
        data = math.prod(shape) * self.bits // 8
        if self.granularity in ("token", "channel"):
            data += math.prod(groups.scale_shape(shape, self.granularity, self.group)) * self._group_bytes()
        return data + self.static_bytes(shape)
