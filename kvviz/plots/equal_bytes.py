"""kvviz.plots.equal_bytes: the Equal bytes view's figures: every way to spend one byte budget, quality against
bytes, and where each candidate's bits go token by token.

Plain data in, `go.Figure` out (no tensors, no Gradio). Two figures:

- `equal_bytes_chart`: mean KL against the exact run (top, log axis) and the needle's retrieval rate (bottom)
  against the cache bytes each candidate measured, as a percentage of a 16-bit cache; the budget a dashed line.
  One marker shape per way of spending the bytes (fewer bits, fewer tokens, both, or mixed precision).
- `token_bits_map`: the quantization map: one row per candidate, one column per context token, the colour the
  bits per value that token is stored with, averaged over layers and KV heads (0: dropped everywhere).

    fig = equal_bytes_chart(["int4", "fp16 @ snapkv:0.25"], ["bits", "tokens"], [26.6, 25.0], [0.04, 0.3],
                            [15, 9], 15, budget_pct=25.0, title="SmolLM2")
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import _finite, _layout, format_colors

# How a candidate spends the bytes -> its marker: fewer bits on every token, fewer tokens at 16 bits, fewer tokens
# and fewer bits, the dropped tokens kept in a low-bit format (mixed precision).
KIND_SYMBOLS = {"bits": "circle", "tokens": "square", "both": "diamond", "mixed": "triangle-up"}


def equal_bytes_chart(names: Sequence[str], kinds: Sequence[str], bytes_pct: Sequence[float],
                      kl: Sequence[float], found: Sequence[int | None], total: int, budget_pct: float, title: str,
                      kind_labels: dict[str, str] | None = None, kl_floor: float = 1e-6,
                      axis_titles: tuple[str, str, str] = (
                          "KV cache bytes (% of a 16-bit cache, measured)",
                          "mean KL against the exact run (nats/token, log)",
                          "needles found (% of all)"),
                      budget_label: str = "budget") -> go.Figure:
    """Quality against bytes for every candidate of one budget.

    names, kinds (KIND_SYMBOLS' keys), bytes_pct, kl: one per candidate (kl: mean nats/token, drawn on a log axis
    with values under `kl_floor` at the floor; the hover gives the measured value); found: needles retrieved out
    of `total` (None: the needle did not run); budget_pct: the budget as a % of a 16-bit cache, a dashed line.
    kind_labels: the legend's name for each kind (default: the kind)."""
    n = len(names)
    assert len(kinds) == len(bytes_pct) == len(kl) == len(found) == n, "equal_bytes_chart: one value per candidate"
    assert all(k in KIND_SYMBOLS for k in kinds), f"unknown kinds {set(kinds) - set(KIND_SYMBOLS)}"
    labels = kind_labels or {k: k for k in KIND_SYMBOLS}
    colors = format_colors(list(names))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.62, 0.38])
    seen: set[str] = set()
    for name, kind, x, v, hit in zip(names, kinds, bytes_pct, kl, found):
        shown = max(float(v), kl_floor) if v is not None and np.isfinite(float(v)) else None
        rate = None if hit is None or not total else 100 * hit / total
        hover = (f"{name}<br>{x:.1f}% of 16-bit<br>KL {float(v):.3g} nats/token"
                 + ("" if hit is None else f"<br>needles {hit}/{total}") + "<extra></extra>")
        marker = dict(size=11, color=colors[name], symbol=KIND_SYMBOLS[kind], line=dict(width=1, color="#333"))
        fig.add_trace(go.Scatter(x=[x], y=[shown], mode="markers+text", text=[name], textposition="top center",
                                 textfont=dict(size=10), marker=marker, name=labels[kind], legendgroup=kind,
                                 showlegend=kind not in seen, hovertemplate=hover), 1, 1)
        seen.add(kind)
        fig.add_trace(go.Scatter(x=[x], y=[rate], mode="markers", marker=marker, name=labels[kind],
                                 legendgroup=kind, showlegend=False, hovertemplate=hover), 2, 1)
    for row in (1, 2):
        fig.add_vline(x=budget_pct, line=dict(color="#777", dash="dash", width=1.5), row=row, col=1)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"{budget_label} {budget_pct:g}%",
                             line=dict(color="#777", dash="dash")), 1, 1)
    fig.update_xaxes(title_text=axis_titles[0], row=2, col=1)
    fig.update_xaxes(title_text=axis_titles[0], row=1, col=1, showticklabels=True, title_standoff=4,
                     title_font=dict(size=1, color="rgba(0,0,0,0)"))
    fig.update_yaxes(title_text=axis_titles[1], type="log", row=1, col=1)
    fig.update_yaxes(title_text=axis_titles[2], range=[-5, 105], row=2, col=1)
    return _layout(fig, title, height=560)


def token_bits_map(names: Sequence[str], bits: np.ndarray | Sequence[Sequence[float]], title: str,
                   token_labels: Sequence[str] | None = None,
                   axis_titles: tuple[str, str, str] = ("context token (position)", "candidate (spec)",
                                                        "stored bits per value (bits, 0: dropped)")) -> go.Figure:
    """The quantization map: bits [candidates, tokens], each context token's stored bits per value under each
    candidate (averaged over layers and KV heads: a policy may keep a token in one head and drop it in another).
    token_labels: one hover label per token (its text)."""
    z = np.asarray(bits, dtype=float)
    assert z.ndim == 2 and z.shape[0] == len(names), f"token_bits_map: {z.shape} for {len(names)} candidates"
    assert token_labels is None or len(token_labels) == z.shape[1], "token_bits_map: one label per token"
    hover = None
    if token_labels is not None:
        hover = [[f"{name}<br>token {t}: {token_labels[t]!r}" for t in range(z.shape[1])] for name in names]
    fig = go.Figure(go.Heatmap(
        z=[_finite(row) for row in z.tolist()], x=list(range(z.shape[1])), y=list(names), zmin=0, zmax=16,
        colorscale=[[0.0, "#ffffff"], [0.01, "#fde0c5"], [0.125, "#f59e4c"], [0.25, "#d94801"], [0.5, "#7f2704"],
                    [1.0, "#1a1a1a"]],
        colorbar=dict(title=dict(text=axis_titles[2], side="right"), tickvals=[0, 2, 4, 8, 16]),
        text=hover, hovertemplate=("%{text}<br>" if hover else "%{y}<br>token %{x}<br>")
        + "%{z:.2f} bits/value<extra></extra>"))
    fig.update_xaxes(title_text=axis_titles[0])
    fig.update_yaxes(title_text=axis_titles[1], autorange="reversed")
    return _layout(fig, title, height=max(300, 120 + 34 * len(names)))
