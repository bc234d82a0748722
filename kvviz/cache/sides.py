"""One side (K or V) of one cache layer: packed buffers, the full-precision tail, static scales, eviction.

A side stores a contiguous run of token positions [base, seen): the oldest part quantized in the format's QTensor
layout (whole groups of N tokens for channel formats), the newest in a 16-bit tail (the residual window plus a
channel format's partial group). Full-attention layers keep base at 0; sliding-window layers move it forward
(`evict`), so that what leaves the window leaves the buffers, scales and tail alike.

Channel formats share one scale per group of N tokens, counted from position 0, so a side evicts only whole
groups: it may keep up to N - 1 positions before the window, which `packed(visible_from)` marks as `skip`. A side
holding [base, seen) stores exactly what a full-attention side holding seen - base tokens stores, which is how
kvviz.memory counts it (see `held_tokens`).
"""

from __future__ import annotations

import functools
import warnings

import torch

from kernels import pack, triton_usable
from kernels.cpu import mirror as cpu_mirror
from kernels.cpu import pack as cpu_pack
from kernels.cpu import step as cpu_step
from kvviz import attention
from kvviz.formats import Format, QTensor, max_value

_MIN_CAPACITY = 64  # tokens; buffers then double
MIN_FIT_TOKENS = 64  # a static scale fitted on fewer tokens is warned about: later tokens tend to exceed it


class ScaleWarning(UserWarning):
    """A static FP8 scale's problem, warned once per layer side (so dozens per run); its fields let a caller merge
    them into one line. kind: "few_tokens" (fitted on `tokens` < MIN_FIT_TOKENS tokens) or "saturated" (`count` of
    `total` values beyond the format's range under the scale, in the update where the side first saturated).
    spec: the format's canonical spec; side: "layer 3 K", or "" for a calibration over all layers."""

    def __init__(self, message: str, kind: str, spec: str, side: str = "", tokens: int = 0, count: int = 0,
                 total: int = 0):
        super().__init__(message)
        assert kind in ("few_tokens", "saturated"), f"unknown ScaleWarning kind {kind!r}"
        self.kind, self.spec, self.side, self.tokens, self.count, self.total = kind, spec, side, tokens, count, total


def aligned(fmt: Format, position: int) -> int:
    """The first position a side of `fmt` can start at while keeping `position`: channel groups stay whole."""
    return position - position % fmt.group if fmt.granularity == "channel" else position


def held_tokens(fmt: Format, seen: int, window: int | None) -> int:
    """Tokens one side holds after `seen` tokens: all of them (window None), else the last window - 1 visible
    ones (transformers' DynamicSlidingWindowLayer), plus for channel formats the start of the oldest group."""
    if window is None:
        return seen
    return seen - aligned(fmt, seen - min(seen, window - 1))


def grown(rows: torch.Tensor, capacity: int, zeros: bool = False) -> torch.Tensor:
    """A new tensor [batch, heads, capacity, *rest] holding `rows` [batch, heads, n, *rest] at the front (the rest
    uninitialized, or zero with zeros=True): how every buffer of the caches grows."""
    make = rows.new_zeros if zeros else rows.new_empty
    new = make((*rows.shape[:2], capacity, *rows.shape[3:]))
    new[:, :, : rows.shape[2]] = rows
    return new


def _fields_of(q: QTensor) -> dict[str, torch.Tensor]:
    """A quantized probe's stored fields (data, and scale / zero where the format has them)."""
    return {name: t for name in ("data", "scale", "zero") if (t := getattr(q, name)) is not None}


@functools.lru_cache(maxsize=512)
def _field_templates(fmt: Format, lead: tuple, probe_len: int, d: int, dtype: torch.dtype,
                     device: torch.device) -> dict[str, torch.Tensor]:
    """Empty [*lead, 0, ...] tensors of each field a side of `fmt` stores, from quantizing zeros once per format,
    shape and dtype (a static scale changes no field's shape): a cache's layers and sides share the probe. The
    templates are only cloned (_Buffer), never written."""
    probe = fmt.quantize(torch.zeros((*lead, probe_len, d), dtype=dtype, device=device))
    if not fmt.takes_scale and probe.tensor_scale is not None:
        raise AssertionError(f"{fmt.spec}: unexpected tensor scale without a static or global scale rule")
    return {name: t[:, :, :0] for name, t in _fields_of(probe).items()}


class _Buffer:
    """A tensor [batch, heads, capacity, *rest] whose rows start..n-1 are live; appends at n, evicts at start.

    Grows by doubling (amortized O(1) append). When the end is reached and at least half the capacity is free
    (evicted rows at the front), the live rows move to the front instead: a sliding window's capacity stays below
    about four times the window.
    """

    def __init__(self, template: torch.Tensor):
        self.buf = template[:, :, :0].clone()  # [B, H, 0, *rest], dtype and trailing shape of the field
        self.start = 0
        self.n = 0

    @property
    def live(self) -> int:
        return self.n - self.start

    def reserve(self, t: int) -> torch.Tensor:
        """Make room for t more rows; returns the whole buffer (rows self.n .. self.n + t - 1 are free)."""
        cap = self.buf.shape[2]
        if self.n + t <= cap:
            return self.buf
        keep = self.live
        if 2 * (keep + t) <= cap:
            new = self.buf  # compact in place: the live rows move to the front
            new[:, :, :keep] = self.buf[:, :, self.start : self.n].clone()
        else:
            new = grown(self.buf[:, :, self.start : self.n], max(keep + t, 2 * cap, _MIN_CAPACITY))
        self.buf, self.start, self.n = new, 0, keep
        return self.buf

    def append(self, x: torch.Tensor) -> None:
        """x: [B, H, t, *rest]."""
        self.reserve(x.shape[2])[:, :, self.n : self.n + x.shape[2]] = x
        self.n += x.shape[2]

    def view(self) -> torch.Tensor:
        return self.buf[:, :, self.start : self.n]  # a view: strides keep the spare capacity

    def evict(self, rows: int) -> None:
        """Forget the oldest `rows` live rows (their memory is reused by the next compaction)."""
        assert 0 <= rows <= self.live, f"cannot evict {rows} of {self.live} rows"
        self.start += rows

    def truncate(self, live: int) -> None:
        assert 0 <= live <= self.live, f"cannot truncate {self.live} rows to {live}"
        self.n = self.start + live

    def nbytes(self) -> int:
        v = self.view()
        return v.numel() * v.element_size()

    def map_batch(self, fn) -> None:
        self.buf = fn(self.buf)


class Side:
    """One side (K or V) of one layer. `name` ("layer 3 K") appears in error messages."""

    def __init__(self, fmt: Format, residual: int, static_scale, name: str = "K"):
        self.fmt, self.residual, self.given_scale, self.name = fmt, residual, static_scale, name
        self.static: torch.Tensor | None = None  # fp32 [] or [1, H, 1, 1], shared by the batch; a global scale []
        self.fields: dict[str, _Buffer] = {}
        self.tail: torch.Tensor | None = None  # [B, H, r, D], 16-bit
        self.dtype = torch.float32
        self.base = 0  # absolute position of the first stored token
        self.tokens_quantized = 0  # every token is quantized at most once: the count of quantize inputs
        self.saturated = 0  # FP8 static scale: values clamped to the format's range under it (warned about once)
        self._packer = None  # quant_pack (Triton), quant_pack_cpu (numba) or None (kvviz.formats): chosen per device
        self._packer_device: torch.device | None = None
        self._kernel_memo: dict = {}  # handed to fused kernels with every read (QTensor.memo)
        self._mirror: cpu_mirror.MirrorAppend | None = None  # append_mirrored's call, bound to the buffers
        self._step_ok: bool | None = None  # fuses()'s answer for the format and head dim, once asked

    # -- setup -------------------------------------------------------------------------------------------------
    def init(self, x: torch.Tensor) -> None:
        """First states seen (the prefill), x: [B, H, T, D]: fix static scales, shape the buffers."""
        fmt = self.fmt
        check_fits(fmt, x.shape[3], self.name)
        self.dtype = x.dtype
        tail_dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else torch.float16
        self.tail = x.new_zeros((*x.shape[:2], 0, x.shape[3]), dtype=tail_dtype)
        if fmt.static_scale:
            self.static = self._static_from(x)
        elif fmt.global_scale:  # one fp32 scale fitted on the prefill (or given), passed to every quantize
            self.static = (fmt.fit_scale(x) if self.given_scale is None else fmt.given_scale(self.given_scale)
                           ).to(device=x.device, dtype=torch.float32)
        probe_len = fmt.group if fmt.granularity == "channel" else 1
        templates = _field_templates(fmt, tuple(x.shape[:2]), probe_len, x.shape[3], x.dtype, x.device)
        self.fields = {name: _Buffer(t) for name, t in templates.items()}

    def _static_from(self, x: torch.Tensor) -> torch.Tensor:
        source = self.fmt.scale_source  # first | unit | calibrated for FP8; None (first) for int formats
        if source == "unit":
            if self.given_scale is not None:
                raise ValueError(f"{self.name}: {self.fmt.spec} uses a scale of 1.0 (as vLLM and SGLang do without "
                                 "scales); drop scales=, or write /calibrated to use them.")
            shape = () if self.fmt.granularity == "tensor" else (1, x.shape[1], 1, 1)
            return torch.ones(shape, dtype=torch.float32, device=x.device)
        if source == "calibrated" and self.given_scale is None:
            raise ValueError(f"{self.name}: {self.fmt.spec} needs calibrated scales: pass scales= (e.g. "
                             "kvviz.calibrate.calibrate_scales(...).for_cache(), or load_scales('scales.json') for an "
                             "SGLang scale file), or write /first or /unit.")
        if self.given_scale is None and x.shape[2] < MIN_FIT_TOKENS:
            warnings.warn(ScaleWarning(
                f"{self.name}: {self.fmt.spec}'s static scale was fitted on the first update, {x.shape[2]} token(s) "
                f"(fewer than {MIN_FIT_TOKENS}): later tokens beyond its range saturate. Prefill more tokens, or use "
                "calibrated scales (kvviz.calibrate, /calibrated).", "few_tokens", self.fmt.spec, self.name,
                tokens=x.shape[2]), stacklevel=2)
        if self.given_scale is not None:
            s = torch.as_tensor(self.given_scale, dtype=torch.float32, device=x.device)
            if self.fmt.granularity == "tensor":
                return s.reshape(())
            return s.reshape(1, -1, 1, 1).expand(1, x.shape[1], 1, 1).contiguous()  # one per head
        if self.fmt.granularity == "tensor":
            return self.fmt.fit_scale(x).reshape(())
        heads = x.shape[1]  # one scale per head over the whole batch: [1, H, B * T, D]
        pooled = x.transpose(0, 1).reshape(1, heads, -1, x.shape[3])
        return self.fmt.fit_scale(pooled).reshape(1, heads, 1, 1)

    # -- append ------------------------------------------------------------------------------------------------
    def _quantize_raw(self, x: torch.Tensor):
        """Quantize x [B, H, t, D] with this side's static scale (if any)."""
        if not self.fmt.takes_scale:
            return self.fmt.quantize(x)
        if self.fmt.parts.scale_source is not None and self.static is not None:  # FP8: count what saturates
            self._count_saturated(x)
        return self.fmt.quantize(x, scale=self.static)

    def _count_saturated(self, x: torch.Tensor) -> None:
        """Count (and warn once about) values of x [B, H, t, D] beyond the FP8 range under the static scale."""
        limit = max_value(self.fmt.base) * self.static.to(x.device) * (1 + 1e-6)  # amax / fmax * fmax may round down
        self._note_saturated(int((x.detach().float().abs() > limit).sum()), x)

    def _note_saturated(self, over: int, x: torch.Tensor) -> None:
        """Add `over` saturated values of x to the count; warn the first time any saturate."""
        if over and not self.saturated:
            warnings.warn(ScaleWarning(
                f"{self.name}: {over} of {x.numel()} values exceed {self.fmt.spec}'s range under its "
                f"{self.fmt.scale_source} scale (|x| > {max_value(self.fmt.base):g} x scale) and saturate. Use "
                "calibrated scales (kvviz.calibrate, /calibrated) or a per-token format.", "saturated", self.fmt.spec,
                self.name, count=over, total=x.numel()), stacklevel=4)
        self.saturated += over

    def append(self, x: torch.Tensor, keep_from: int = 0) -> None:
        """Add new tokens x: [B, H, t, D] (model dtype) at positions seen..seen+t-1; quantize every token that
        leaves the tail, once. keep_from: on an empty side, positions before it are dropped unquantized (a
        sliding window's prefill: they are out of the window already)."""
        if self.seen == 0 and keep_from > 0:
            self.base = min(aligned(self.fmt, keep_from), x.shape[2])
            x = x[:, :, self.base :]
        work = torch.cat([self.tail.to(x.dtype), x], dim=2) if self.tail.shape[2] else x
        excess = work.shape[2] - self.residual
        n_q = excess - excess % self.fmt.group if self.fmt.granularity == "channel" else excess
        if n_q > 0:
            self._store(work[:, :, :n_q])
            self.tokens_quantized += n_q
        self.tail = work[:, :, max(n_q, 0):].to(self.tail.dtype).contiguous()

    def _store(self, x: torch.Tensor) -> None:
        """Quantize x [B, H, t, D] into the buffers: with the packer chosen for x's device (once per device)."""
        if x.device != self._packer_device:
            # A global scale fitted on all-zero states pins every value to 0: only the formats path does that.
            pinned_to_zero = self.fmt.global_scale and not bool(self.static > 0)
            self._packer = None if pinned_to_zero else _fused_packer(self.fmt, x)
            self._packer_device = x.device
        if self._packer is None:
            q = self._quantize_raw(x)
            for name, buf in self.fields.items():
                buf.append(getattr(q, name))
            return
        t = x.shape[2]
        bufs = {name: buf.reserve(t) for name, buf in self.fields.items()}
        over = self._packer(self.fmt, x, bufs["data"], bufs.get("scale"), bufs.get("zero"), pos=self.fields["data"].n,
                            tensor_scale=self.static)
        if over is not None:  # the CPU packer counts FP8 values saturated under a static scale as it packs
            self._note_saturated(over, x)
        for buf in self.fields.values():
            buf.n += t

    # -- the fused decode step (kernels/cpu/step.py) -------------------------------------------------------------
    def fuses(self) -> bool:
        """Whether the one-call CPU step can append to this side now: token scales, no residual window, the CPU
        packer chosen (so the cpu backend on CPU states) and a decode branch for the format."""
        if self._packer is not cpu_pack.quant_pack_cpu or self.residual or self.tail.shape[2]:
            return False
        if self._step_ok is None:  # the format's own answer, fixed for the side (asked once: every layer, every step)
            self._step_ok = _step_fuses(self.fmt, self.tail.shape[3])
        return self._step_ok

    def reserve_row(self) -> tuple:
        """Room for one more token; returns the whole buffers (data, scale, zero), None where the format has none."""
        f = self.fields
        scale, zero = f.get("scale"), f.get("zero")
        return (f["data"].reserve(1), None if scale is None else scale.reserve(1),
                None if zero is None else zero.reserve(1))

    def commit_row(self, x: torch.Tensor, over: int) -> None:
        """Count the token x [B, H, 1, D] the fused step wrote at the buffers' end (`over`: values it found
        saturated under a static FP8 scale)."""
        for buf in self.fields.values():
            buf.n += 1
        self.tokens_quantized += 1
        if over:
            self._note_saturated(over, x)

    # -- batched rows: append and mirror in one call (kernels/cpu/mirror.py) ------------------------------------
    def mirrors(self) -> bool:
        """Whether append_mirrored can take a token now: the CPU packer chosen, no residual window or tail, fp32
        states and a format kernels/cpu/mirror.py reads exactly."""
        return (self._packer is cpu_pack.quant_pack_cpu and self.residual == 0 and self.tail.shape[2] == 0
                and self.dtype == torch.float32 and _mirror_reads(self.fmt, self.tail.shape[3]))

    def append_mirrored(self, x: torch.Tensor, rows, at: int, mirror) -> None:
        """Append the token x [B, H, 1, D] (as append would) and write its dequantized values, bit for bit
        QTensor.dequantize()'s, into mirror[rows[b], :, at] (an fp32 numpy view [R, H, cap, D])."""
        bufs = self.reserve_row()
        if self._mirror is None or not self._mirror.bound(bufs):
            self._mirror = cpu_mirror.MirrorAppend(self.fmt, bufs, self.static)
        over = self._mirror.run(x, self.fields["data"].n, rows, at, mirror)
        self.commit_row(x, over)

    # -- evict / read ------------------------------------------------------------------------------------------
    def evict(self, position: int) -> None:
        """Drop every stored token before `position` (channel formats: before the start of its group)."""
        drop = aligned(self.fmt, position) - self.base
        if drop <= 0:
            return
        from_quantized = min(drop, self.n_quantized)
        channel = self.fmt.granularity == "channel"
        for name, buf in self.fields.items():
            buf.evict(from_quantized // self.fmt.group if channel and name != "data" else from_quantized)
        self.tail = self.tail[:, :, drop - from_quantized :]
        self.base += drop

    def packed(self, visible_from: int | None = None) -> QTensor:
        """The stored tokens as a QTensor over the buffers' views (no copy) with the tail; positions before
        `visible_from` (kept only to keep a channel group whole) are marked as `skip`, for attention to leave out."""
        f = self.fields
        skip = 0 if visible_from is None else max(visible_from - self.base, 0)
        return QTensor(
            fmt=self.fmt, head_dim=self.tail.shape[3], dtype=self.dtype, data=f["data"].view(),
            scale=f["scale"].view() if "scale" in f else None, zero=f["zero"].view() if "zero" in f else None,
            tensor_scale=self.static, tail=self.tail, skip=skip, memo=self._kernel_memo,
        )

    @property
    def n_quantized(self) -> int:
        return self.fields["data"].live if self.fields else 0

    @property
    def seq_len(self) -> int:
        """Tokens stored (quantized + tail)."""
        return self.n_quantized + (self.tail.shape[2] if self.tail is not None else 0)

    @property
    def seen(self) -> int:
        """Absolute position after the last token appended (tokens seen, evicted ones included)."""
        return self.base + self.seq_len

    def nbytes(self, one_row: bool = False) -> int:
        """Bytes held (one_row: one batch row's; the static scale is the batch's, counted once)."""
        if self.tail is None:
            return 0
        held = sum(b.nbytes() for b in self.fields.values()) + self.tail.numel() * self.tail.element_size()
        if one_row:
            held //= self.tail.shape[0]
        return held + (self.static.numel() * 4 if self.static is not None else 0)

    def map_batch(self, fn) -> None:
        for buf in self.fields.values():
            buf.map_batch(fn)
        self.tail = fn(self.tail)

    def crop(self, n_remove: int) -> None:
        """Drop the newest n_remove stored tokens."""
        keep = max(self.seq_len - n_remove, 0)
        if keep >= self.n_quantized:
            self.tail = self.tail[:, :, : keep - self.n_quantized]
            return
        channel = self.fmt.granularity == "channel"
        if channel and keep % self.fmt.group:
            raise ValueError(f"Cannot crop {self.fmt.spec} to {keep} tokens: it would split a quantized "
                             f"group of {self.fmt.group}; crop to a multiple of {self.fmt.group}.")
        for name, buf in self.fields.items():
            buf.truncate(keep // self.fmt.group if channel and name != "data" else keep)  # channel scales: per group
        self.tail = self.tail[:, :, :0]
        self.tokens_quantized = keep


def _fused_packer(fmt: Format, x: torch.Tensor):
    """A packer that quantizes and writes straight into the buffers (bit-identical to the formats' quantize), for
    the backend chosen and x's device: kernels.quant_pack (Triton) or kernels.cpu.pack.quant_pack_cpu (numba, CPU
    tensors); None (kvviz.formats quantizes) when neither has a branch for fmt at x's head_dim."""
    backend = attention.active_backend()  # the backend choice (KVVIZ_BACKEND), read once per side and device
    if backend == "cpu" and x.device.type == "cpu":
        return cpu_pack.quant_pack_cpu if cpu_pack.quant_pack_cpu_supported(fmt, x.shape[3]) else None
    if backend != "triton":
        return None
    # auto picks triton whenever CUDA exists, but a model left on the CPU has CPU states: formats path then
    if not (triton_usable(x.device) and pack.quant_pack_supported(fmt, x.shape[3])):
        return None
    return pack.quant_pack


@functools.lru_cache(maxsize=256)
def _mirror_reads(fmt: Format, head_dim: int) -> bool:
    return cpu_mirror.supports(fmt, head_dim)


@functools.lru_cache(maxsize=256)
def _step_fuses(fmt: Format, head_dim: int) -> bool:
    return cpu_step.fuses(fmt, head_dim)


def check_fits(fmt: Format, head_dim: int, where: str) -> None:
    """ValueError naming `where` (e.g. "layer 3 K") and the fix when `fmt` cannot hold head_dim-wide tokens."""
    if fmt.asym and fmt.static_scale:
        raise ValueError(f"{fmt.spec}: a per-tensor / per-head zero point cannot stay fixed while tokens are "
                         f"appended; use {fmt.base}/token/asym or a symmetric format.")
    try:
        fmt.nbytes_for((1, 1, fmt.group if fmt.granularity == "channel" else 1, head_dim))
    except ValueError as err:
        raise ValueError(f"{where} (head_dim {head_dim}) cannot be stored as {fmt.spec}: {err}") from err

