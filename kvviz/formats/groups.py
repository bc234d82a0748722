"""Scale groups: which elements of x [..., T, D] share one scale, as reductions and their inverse broadcast.

Layouts of a per-group tensor (a scale or a zero point) for x: [..., T, D]:
- token, group g along head_dim:   [..., T, D // g]
- channel, group N along tokens:   [..., ceil(T / N), D]  (the last group may be partial)
- tensor:                          []                      (one scalar)
- head:                            [..., H, 1, 1]          (x is [..., H, T, D])
"""

from __future__ import annotations

import math

import torch


def check_shape(shape: torch.Size | tuple[int, ...], granularity: str | None, group: int | None) -> None:
    """ValueError when x's shape cannot be split into this layout's groups."""
    if len(shape) < 2:
        raise ValueError(f"Expected x shaped [..., tokens, head_dim], got shape {tuple(shape)}.")
    if granularity == "head" and len(shape) < 3:
        raise ValueError(f"/head needs x shaped [..., heads, tokens, head_dim], got shape {tuple(shape)}.")


def scale_shape(shape: tuple[int, ...], granularity: str | None, group: int | None) -> tuple[int, ...]:
    """Shape of one per-group tensor for an x of `shape` (empty tuple for per-tensor)."""
    *lead, t, d = shape
    if granularity == "token":
        return (*lead, t, d // (group or d))
    if granularity == "channel":
        return (*lead, math.ceil(t / group), d)
    if granularity == "head":
        return (*lead, 1, 1)
    return ()


def _grouped(x: torch.Tensor, granularity: str, group: int | None) -> tuple[torch.Tensor, tuple[int, ...]]:
    """View x so that each group is one set of reduced dims; returns (view, dims to reduce)."""
    if granularity == "token":
        g = group or x.shape[-1]
        return x.reshape(*x.shape[:-1], x.shape[-1] // g, g), (-1,)  # [..., T, D/g, g]
    if granularity == "channel":
        t = x.shape[-2]
        pad = -t % group
        if pad:  # repeating the last token leaves the partial group's min and max unchanged
            x = torch.cat([x, x[..., -1:, :].expand(*x.shape[:-2], pad, x.shape[-1])], dim=-2)
        return x.reshape(*x.shape[:-2], x.shape[-2] // group, group, x.shape[-1]), (-2,)  # [..., T/N, N, D]
    if granularity == "head":
        return x, (-2, -1)
    return x, tuple(range(x.dim()))


def reduce(x: torch.Tensor, granularity: str, group: int | None, op: str) -> torch.Tensor:
    """Per-group `op` over x in ("absmax", "min", "max", "nonfinite"); non-finite elements count as 0.

    Returns the per-group tensor in the module's layout, dtype fp32 (bool for "nonfinite").
    """
    if x.numel() == 0:  # no tokens: empty groups, or a per-tensor / per-head scale over nothing
        dtype = torch.bool if op == "nonfinite" else torch.float32
        shape = scale_shape(tuple(x.shape), granularity, group) if x.dim() >= 2 else ()
        return torch.zeros(shape, dtype=dtype, device=x.device)
    if op in ("nonfinite", "absmax"):
        amax, bad = absmax_nonfinite(x, granularity, group)
        return bad if op == "nonfinite" else amax
    view, dims = _grouped(_finite(x), granularity, group)
    reducer = torch.amin if op == "min" else torch.amax
    return reducer(view, dim=dims, keepdim=granularity == "head")


def _finite(x: torch.Tensor) -> torch.Tensor:
    """x in fp32 with its non-finite elements as 0 (what the reductions count them as)."""
    return torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype, device=x.device)).float()


def absmax_nonfinite(x: torch.Tensor, granularity: str, group: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """reduce's "absmax" and "nonfinite" of x [..., T, D] in one pass where x is finite: |x|'s group
    maximum is NaN or inf exactly where the group holds a non-finite element (amax carries NaN), and elsewhere it
    is the absmax. Only when some group is not finite are the finite values reduced again."""
    if x.numel() == 0:  # empty groups (reduce's own answer for them)
        return reduce(x, granularity, group, "absmax"), reduce(x, granularity, group, "nonfinite")
    keep = granularity == "head"
    view, dims = _grouped(x.abs(), granularity, group)
    amax = view.amax(dim=dims, keepdim=keep)
    bad = ~torch.isfinite(amax)
    if not bool(bad.any()):
        return amax.float(), bad
    view, dims = _grouped(_finite(x).abs(), granularity, group)
    return view.amax(dim=dims, keepdim=keep), bad


def expand(s: torch.Tensor, granularity: str, group: int | None, shape: tuple[int, ...]) -> torch.Tensor:
    """Broadcast a per-group tensor back to x's `shape` (a view where possible)."""
    if granularity == "token":
        g = shape[-1] // s.shape[-1]
        return s.unsqueeze(-1).expand(*s.shape, g).reshape(shape)
    if granularity == "channel":
        return s.repeat_interleave(group, dim=-2)[..., : shape[-2], :]
    return s.expand(shape) if s.dim() else s


def scale(x: torch.Tensor, s: torch.Tensor, granularity: str, group: int | None) -> torch.Tensor:
    """x * expand(s) for x [..., T, D], broadcasting per-group s through a view instead of a copy where it can."""
    if granularity == "token" and s.dim():
        g = x.shape[-1] // s.shape[-1]
        return (x.reshape(*x.shape[:-1], s.shape[-1], g) * s.unsqueeze(-1)).reshape(x.shape)  # [..., T, D/g, g]
    if granularity == "channel" and x.shape[-2] % group == 0 and s.dim():
        t, d = x.shape[-2:]
        return (x.reshape(*x.shape[:-2], t // group, group, d) * s.unsqueeze(-2)).reshape(x.shape)  # [.., T/N, N, D]
    return x * expand(s, granularity, group, tuple(x.shape))


def scale_(x: torch.Tensor, s: torch.Tensor, granularity: str, group: int | None) -> torch.Tensor:
    """`scale` in place, for an x the caller owns (a decoder's fresh values): one pass and no second [..., T, D]
    allocation on the reference read's hot path. Returns x (or a new tensor when x is not contiguous)."""
    if not x.is_contiguous():
        return scale(x, s, granularity, group)
    if granularity == "token" and s.dim():
        x.view(*x.shape[:-1], s.shape[-1], x.shape[-1] // s.shape[-1]).mul_(s.unsqueeze(-1))  # [..., T, D/g, g]
        return x
    if granularity == "channel" and x.shape[-2] % group == 0 and s.dim():
        t, d = x.shape[-2:]
        x.view(*x.shape[:-2], t // group, group, d).mul_(s.unsqueeze(-2))  # [..., T/N, N, D]
        return x
    return x.mul_(expand(s, granularity, group, tuple(x.shape)))
