"""Figures of the long-context measurements (kvviz.quality.long_context): damage against position, against
generation step, and needle retrieval against depth at several context lengths.

As in kvviz.plots, the functions take plain data (dicts of numpy arrays or lists, as the result objects hold them)
and compute nothing but layout; titles and axis titles are arguments so the app passes them in the page's language.
Long curves are drawn at most MAX_POINTS points per line (every k-th position of the already smoothed curve).

    drift = ...  # a kvviz.quality.long_context.PositionDrift
    fig = position_figure(drift.smoothed(256), drift.crossings((0.01, 0.05, 0.1), 256), (0.01, 0.05, 0.1))
"""

from __future__ import annotations

import math

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvviz.plots import _finite, _layout, format_colors

MAX_POINTS = 4000


def _thin(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, values) with at most MAX_POINTS points, the last position always kept."""
    n = len(values)
    step = max(1, -(-n // MAX_POINTS))
    x = np.arange(0, n, step)
    if n and x[-1] != n - 1:
        x = np.append(x, n - 1)
    return x, np.asarray(values, dtype=np.float64)[x]


def position_figure(smoothed: Mapping[str, np.ndarray],
                    crossings: Mapping[str, Mapping[float, int | None]] | None = None,
                    thresholds: Sequence[float] = (), title: str | None = None,
                    axis_titles: tuple[str, str] = ("position in the text (tokens)",
                                                    "KL(exact ‖ format), nats (moving average)"),
                    log_y: bool = True, context: int | None = None) -> go.Figure:
    """Smoothed KL against position, one line per format; each threshold a dashed line and each format's first
    crossing of it a marker. context: the x axis's extent while the pass is still running."""
    fig = go.Figure()
    colors = format_colors(list(smoothed))
    for name, values in smoothed.items():
        x, y = _thin(values)
        y = np.where(y > 0, y, np.nan) if log_y else y  # a log axis leaves KL 0 (position 0) as a gap
        fig.add_trace(go.Scatter(x=x, y=_finite(y), mode="lines", name=name, line=dict(color=colors[name], width=2)))
        points = [(p, t) for t, p in (crossings or {}).get(name, {}).items() if p is not None]
        if points:
            fig.add_trace(go.Scatter(x=[p for p, _ in points], y=[t for _, t in points], mode="markers",
                                     marker=dict(color=colors[name], size=9, symbol="diamond"), showlegend=False,
                                     name=name, hovertemplate=f"{name}: %{{y}} nats crossed at %{{x}}<extra></extra>"))
    for t in thresholds:  # the label placed by hand: add_hline's annotation takes y as data on a log axis too
        fig.add_hline(y=t, line=dict(color="#999", dash="dash", width=1))
        fig.add_annotation(x=1, xref="paper", xanchor="left", y=math.log10(t) if log_y else t, yref="y",
                           text=f"{t:g}", showarrow=False, font=dict(size=10, color="#666"))
    fig.update_xaxes(title_text=axis_titles[0], range=[0, context] if context else None)
    fig.update_yaxes(title_text=axis_titles[1], type="log" if log_y else "linear")
    return _layout(fig, title or "KL against the exact model by position (each format's cache read as stored)")


def top1_figure(smoothed_top1: Mapping[str, np.ndarray], title: str | None = None,
                axis_titles: tuple[str, str] = ("position in the text (tokens)",
                                                "top-1 agreement with the exact model (%, moving average)"),
                context: int | None = None) -> go.Figure:
    """Smoothed top-1 agreement (fractions in 0..1, drawn as %) against position, one line per format."""
    fig = go.Figure()
    colors = format_colors(list(smoothed_top1))
    for name, values in smoothed_top1.items():
        x, y = _thin(values)
        fig.add_trace(go.Scatter(x=x, y=_finite(100.0 * y), mode="lines", name=name,
                                 line=dict(color=colors[name], width=2)))
    fig.update_xaxes(title_text=axis_titles[0], range=[0, context] if context else None)
    fig.update_yaxes(title_text=axis_titles[1])
    return _layout(fig, title or "Top-1 agreement with the exact model by position")


def generation_figure(kl_by_step: Mapping[str, np.ndarray], first_divergence: Mapping[str, int | None],
                      title: str | None = None,
                      axis_titles: tuple[str, str] = ("generated token (step)",
                                                      "KL(exact ‖ format), nats (moving average)"),
                      log_y: bool = True) -> go.Figure:
    """Teacher-forced KL per decode step (already smoothed; kl_by_step[name][i] is step i + 1), one line per
    format, and a dotted vertical line where each format's free-running text first leaves the exact one."""
    fig = go.Figure()
    colors = format_colors(list(kl_by_step))
    for name, values in kl_by_step.items():
        x, y = _thin(values)
        y = np.where(y > 0, y, np.nan) if log_y else y  # a log axis leaves KL 0 (position 0) as a gap
        fig.add_trace(go.Scatter(x=x + 1, y=_finite(y), mode="lines", name=name,
                                 line=dict(color=colors[name], width=2)))
        step = first_divergence.get(name)
        if step is not None:
            fig.add_vline(x=step, line=dict(color=colors[name], dash="dot", width=1))
    fig.update_xaxes(title_text=axis_titles[0])
    fig.update_yaxes(title_text=axis_titles[1], type="log" if log_y else "linear")
    return _layout(fig, title or "KL by generated token (dotted: where each format's own text first differs)")


def needle_figure(depths: Sequence[float], found: Mapping[int, Mapping[str, Sequence[int]]],
                  total: Mapping[int, Sequence[int]], title: str | None = None,
                  axis_titles: tuple[str, str] = ("needle depth (% of context)", "needles found (%)"),
                  context_label: str = "{context:,} tokens") -> go.Figure:
    """Needles found against depth, one panel per context length and one line per format (baseline first); each
    point's hover gives its count (found / asked). found: {context: {name: [count per depth]}}; total: {context:
    [asked per depth]}."""
    contexts = list(found)
    fig = make_subplots(rows=1, cols=max(1, len(contexts)), shared_yaxes=True,
                        subplot_titles=[context_label.format(context=c) for c in contexts])
    names = list(next(iter(found.values()), {}))
    colors = format_colors(names)
    x = [100.0 * d for d in depths]
    for col, c in enumerate(contexts, start=1):
        asked = list(total[c])
        for name in names:
            hits = list(found[c][name])
            rate = [100.0 * h / a if a else None for h, a in zip(hits, asked)]
            fig.add_trace(go.Scatter(x=x, y=rate, mode="lines+markers", name=name, legendgroup=name,
                                     showlegend=col == 1, line=dict(color=colors[name], width=2),
                                     text=[f"{h}/{a}" for h, a in zip(hits, asked)],
                                     hovertemplate=f"{name}: %{{text}} at %{{x:.0f}}%<extra></extra>"),
                          row=1, col=col)
        fig.update_xaxes(title_text=axis_titles[0], range=[-3, 103], row=1, col=col)
    fig.update_yaxes(title_text=axis_titles[1], range=[-5, 105], row=1, col=1)
    return _layout(fig, title or "Needles found by depth, at each context length (several needles per haystack)")
