"""kvviz.plots: every figure the playground draws, as plotly `go.Figure`s built from plain data.

Functions here take lists, dicts and numpy arrays (never tensors, never Gradio objects) and return a figure; they
compute nothing but layout. Every axis carries a title with its unit, so a figure read out of context still says
what it measures. One colour per format across all figures: `format_colors()` fixes it from the order given.

    import kvviz.plots as P
    fig = P.memory_vs_context([1024, 2048], {"fp16": [0.1, 0.2]}, {"L4 24 GB": 24.0})
    fig.show()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

# D3's category10: ten hues that stay distinct on screen and after PNG palette reduction (the screenshots).
_PALETTE = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
]
_TEMPLATE = "plotly_white"
_FONT = dict(family="Inter, Arial, sans-serif", size=12)


def format_colors(names: Sequence[str]) -> dict[str, str]:
    """One stable colour per name, in the order given (cycled past the palette's length)."""
    return {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(names)}


def _layout(fig: go.Figure, title: str, height: int = 380, **kw) -> go.Figure:
    """Shared look: title top left, legend in one band between the title and the plot, units on the axes."""
    fig.update_layout(
        title=dict(text=title, x=0.01, xanchor="left", y=0.985, yanchor="top", yref="container",
                   font=dict(size=14)),
        template=_TEMPLATE, font=_FONT, height=height,
        margin=dict(l=60, r=20, t=100, b=50),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0.0, font=dict(size=11)),
        **kw,
    )
    return fig


def empty_figure(message: str = "Run the tab to draw this figure.") -> go.Figure:
    """A blank figure holding one line of text: the placeholder before a computation has run."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font=dict(size=14, color="#666"),
                       xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, "", height=260)


def _finite(values: Sequence[float | None]) -> list[float | None]:
    """Plotly draws None as a gap; NaN and inf become None so a missing metric leaves a gap, not a spike."""
    out: list[float | None] = []
    for v in values:
        out.append(None if v is None or not np.isfinite(float(v)) else float(v))
    return out


# --- Compare -------------------------------------------------------------------------------------------------


def metrics_bars(names: Sequence[str], columns: Mapping[str, Sequence[float | None]],
                 title: str = "Quality and cost per format (baseline: the unquantized cache)",
                 x_title: str = "format (K/V spec)") -> go.Figure:
    """One bar panel per metric, one bar per format.

    names: format labels, in display order. columns: {"KL (nats/token)": [one value per name], ...}; each key is the
    panel's y-axis title and must carry its unit in parentheses. A None or NaN value leaves the bar out.
    title, x_title: the figure's title and every panel's x-axis title (the app passes them in the page's language).
    """
    assert columns, "metrics_bars needs at least one metric column"
    for metric, vals in columns.items():
        assert len(vals) == len(names), f"column {metric!r} has {len(vals)} values for {len(names)} formats"
    n = len(columns)
    fig = make_subplots(rows=1, cols=n, subplot_titles=[t.split(" (")[0] for t in columns],
                        horizontal_spacing=0.35 / max(n, 1) + 0.03)
    colors = format_colors(names)
    for col, (metric, vals) in enumerate(columns.items(), start=1):
        fig.add_trace(go.Bar(x=list(names), y=_finite(vals), marker_color=[colors[n_] for n_ in names],
                             name=metric, showlegend=False,
                             hovertemplate="%{x}<br>%{y:.4g}<extra>" + metric + "</extra>"), row=1, col=col)
        fig.update_yaxes(title_text=metric, row=1, col=col, title_font=dict(size=11))
        fig.update_xaxes(title_text=x_title, tickangle=-35, row=1, col=col,
                         title_font=dict(size=11))
    return _layout(fig, title, height=380)


def engine_bars(formats: Sequence[str], series: Mapping[str, Sequence[float | None]],
                title: str = "Mean KLD per format: kvviz's simulation beside the engine's own") -> go.Figure:
    """Grouped bars: one group per format, one bar per source (kvviz, llama.cpp), on a log axis (q8_0 and q4_0
    differ by orders of magnitude).

    formats: K/V specs, in display order. series: {source: [mean KLD in nats per format]}; None or NaN leaves a gap.
    """
    assert series, "engine_bars needs at least one series"
    for name, vals in series.items():
        assert len(vals) == len(formats), f"series {name!r} has {len(vals)} values for {len(formats)} formats"
    fig = go.Figure()
    colors = format_colors(list(series))
    for name, vals in series.items():
        fig.add_trace(go.Bar(x=list(formats), y=_finite(vals), name=name, marker_color=colors[name],
                             hovertemplate="%{x}<br>%{y:.4g} nats<extra>" + name + "</extra>"))
    fig.update_xaxes(title_text="K/V cache type (kvviz spec)")
    fig.update_yaxes(title_text="mean KLD (nats/token, log)", type="log")
    return _layout(fig, title, barmode="group")


def needle_chart(depths_pct: Sequence[float], rates_by_format: Mapping[str, Sequence[float]],
                 context_tokens: int, title: str | None = None,
                 axis_titles: tuple[str, str] = ("needle depth (% of context)", "retrieval rate (%)")) -> go.Figure:
    """Needle-in-a-haystack retrieval rate against the needle's depth, one line per format.

    depths_pct: needle positions as % of the context (0 = start). rates_by_format: {format: [rate in 0..1 per depth]}.
    title (default: says the context length), axis_titles (x, y): the app passes them in the page's language.
    """
    fig = go.Figure()
    colors = format_colors(list(rates_by_format))
    for name, rates in rates_by_format.items():
        assert len(rates) == len(depths_pct), f"{name}: {len(rates)} rates for {len(depths_pct)} depths"
        fig.add_trace(go.Scatter(x=list(depths_pct), y=[None if r is None else 100.0 * r for r in rates],
                                 mode="lines+markers", name=name, line=dict(color=colors[name], width=2)))
    fig.update_xaxes(title_text=axis_titles[0], range=[-3, 103])
    fig.update_yaxes(title_text=axis_titles[1], range=[-5, 105])
    return _layout(fig, title or f"Needle in a haystack at {context_tokens} tokens of context")


# --- K outliers ----------------------------------------------------------------------------------------------


def channel_profile(series: Mapping[str, Sequence[float]], title: str, y_title: str = "|x| max over tokens (abs. value)",
                    outliers: Sequence[int] = ()) -> go.Figure:
    """Per-channel magnitude, one bar series per entry (K pre-RoPE, K post-RoPE, V, rotated K...).

    series: {label: [value per channel]} of equal lengths (head_dim). outliers: channel indices to mark (a few:
    kvviz.analysis.stats.strongest_outliers), each just above its own bars.
    """
    assert series, "channel_profile needs at least one series"
    lengths = {len(v) for v in series.values()}
    assert len(lengths) == 1, f"series have different channel counts: {sorted(lengths)}"
    channels = list(range(lengths.pop()))
    fig = go.Figure()
    colors = format_colors(list(series))
    for name, vals in series.items():
        fig.add_trace(go.Bar(x=channels, y=_finite(vals), name=name, marker_color=colors[name], opacity=0.85))
    if outliers:  # each marker just above its own channel's tallest bar, so nearby channels stay apart
        tallest = [max((v for v in (_finite([vals[c]])[0] for vals in series.values()) if v is not None), default=0.0)
                   for c in outliers]
        fig.add_trace(go.Scatter(x=list(outliers), y=[h * 1.04 for h in tallest], mode="markers+text",
                                 text=[str(c) for c in outliers], textposition="top center",
                                 marker=dict(symbol="triangle-down", size=9, color="#D55E00"),
                                 name="outlier channel", cliponaxis=False,
                                 hovertemplate="channel %{x}<br>|x| max %{y:.3g}<extra></extra>"))
    fig.update_xaxes(title_text="channel (index in head_dim)")
    fig.update_yaxes(title_text=y_title)
    return _layout(fig, title, barmode="group", bargap=0.15)


def layer_channel_heatmap(values: np.ndarray | Sequence[Sequence[float]], title: str,
                          z_title: str = "|K| max (abs. value)") -> go.Figure:
    """A layer x channel heatmap. values: [layers, channels] (e.g. per-channel |K| max per layer, heads merged)."""
    z = np.asarray(values, dtype=float)
    assert z.ndim == 2, f"layer_channel_heatmap expects [layers, channels], got shape {z.shape}"
    fig = go.Figure(go.Heatmap(z=z, x=list(range(z.shape[1])), y=list(range(z.shape[0])), colorscale="Viridis",
                               colorbar=dict(title=dict(text=z_title, side="right")),
                               hovertemplate="layer %{y}, channel %{x}<br>%{z:.3g}<extra></extra>"))
    fig.update_xaxes(title_text="channel (index in head_dim)")
    fig.update_yaxes(title_text="layer (index)")
    return _layout(fig, title, height=420)


# --- Quantization error --------------------------------------------------------------------------------------


def error_heatmap(values: np.ndarray | Sequence[Sequence[float]], title: str,
                  z_title: str = "|x - x̂| (abs. value)", token_labels: Sequence[str] | None = None) -> go.Figure:
    """A token x channel error map. values: [tokens, channels]; token_labels: one string per token (hover only)."""
    z = np.asarray(values, dtype=float)
    assert z.ndim == 2, f"error_heatmap expects [tokens, channels], got shape {z.shape}"
    custom = None
    if token_labels is not None:
        assert len(token_labels) == z.shape[0], f"{len(token_labels)} token labels for {z.shape[0]} tokens"
        custom = [[lab] * z.shape[1] for lab in token_labels]
    fig = go.Figure(go.Heatmap(z=z, colorscale="Magma", reversescale=True, customdata=custom,
                               colorbar=dict(title=dict(text=z_title, side="right")),
                               hovertemplate=("token %{y}" + (" %{customdata}" if custom else "")
                                              + ", channel %{x}<br>%{z:.3g}<extra></extra>")))
    fig.update_xaxes(title_text="channel (index in head_dim)")
    fig.update_yaxes(title_text="token (position)", autorange="reversed")
    return _layout(fig, title, height=420)


def layer_error_lines(errors_by_format: Mapping[str, Sequence[float] | Mapping[str, Sequence[float]]], title: str,
                      y_title: str = "relative error (‖x - x̂‖ / ‖x‖)") -> go.Figure:
    """Per-layer relative error, one colour per format.

    errors_by_format: {format: [error per layer]}, or {format: {"K": [...], "V": [...]}} to draw several series of a
    format in its colour, told apart by dash (solid, dash, dot).
    """
    fig = go.Figure()
    colors = format_colors(list(errors_by_format))
    dashes = ("solid", "dash", "dot", "dashdot")
    for name, errs in errors_by_format.items():
        series = errs.items() if isinstance(errs, Mapping) else [("", errs)]
        for i, (sub, vals) in enumerate(series):
            fig.add_trace(go.Scatter(x=list(range(len(vals))), y=_finite(vals), mode="lines+markers",
                                     name=f"{name} · {sub}" if sub else name, marker=dict(size=5),
                                     line=dict(color=colors[name], width=2, dash=dashes[i % len(dashes)])))
    fig.update_xaxes(title_text="layer (index)")
    fig.update_yaxes(title_text=y_title, type="log", dtick=1)
    return _layout(fig, title)


def granularity_heatmaps(maps: Mapping[str, np.ndarray | Sequence[Sequence[float]]], title: str,
                         z_title: str = "|x - x̂| (abs. value)",
                         subtitles: Mapping[str, str] | None = None) -> go.Figure:
    """Side-by-side token x channel error maps on one colour scale (per-token vs per-channel vs per-tensor...).

    maps: {label: [tokens, channels]}, all the same shape. subtitles: optional extra text under each label
    (e.g. its relative error). A shared zmax makes the panels comparable at a glance.
    """
    assert maps, "granularity_heatmaps needs at least one map"
    arrays = {k: np.asarray(v, dtype=float) for k, v in maps.items()}
    shapes = {a.shape for a in arrays.values()}
    assert len(shapes) == 1, f"maps have different shapes: {sorted(shapes)}"
    finite = [a[np.isfinite(a)] for a in arrays.values()]
    zmax = max((float(f.max()) for f in finite if f.size), default=1.0) or 1.0
    names = list(arrays)
    heads = [f"{n}<br><sup>{subtitles[n]}</sup>" if subtitles and n in subtitles else n for n in names]
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=heads, shared_yaxes=True,
                        horizontal_spacing=0.03)
    for i, name in enumerate(names, start=1):
        fig.add_trace(go.Heatmap(z=arrays[name], zmin=0.0, zmax=zmax, colorscale="Magma", reversescale=True,
                                 showscale=(i == len(names)),
                                 colorbar=dict(title=dict(text=z_title, side="right")),
                                 hovertemplate=name + "<br>token %{y}, channel %{x}<br>%{z:.3g}<extra></extra>"),
                      row=1, col=i)
        fig.update_xaxes(title_text="channel (index)", row=1, col=i)
    fig.update_yaxes(title_text="token (position)", autorange="reversed", row=1, col=1)
    for i in range(2, len(names) + 1):
        fig.update_yaxes(title_text="token (position)", title_font=dict(size=1, color="rgba(0,0,0,0)"),
                         autorange="reversed", row=1, col=i)
    return _layout(fig, title, height=440)


# --- Memory --------------------------------------------------------------------------------------------------


def memory_vs_context(contexts: Sequence[int], gb_by_format: Mapping[str, Sequence[float]],
                      capacities_gb: Mapping[str, float], title: str = "KV cache memory against context length",
                      log_x: bool = True, dashed: Mapping[str, Sequence[float]] | None = None,
                      axis_titles: tuple[str, str] = ("context length (tokens)", "KV cache memory (GB)")) -> go.Figure:
    """KV-cache memory against context length, one line per format, with one dashed line per GPU capacity.

    contexts: token counts (x). gb_by_format: {format: [GB per context]}. capacities_gb: {"L4 24 GB": GB free for
    the KV cache on that GPU (capacity minus weights)}; drawn as grey dashed traces across the context range
    (traces, not layout shapes, so they land right on log axes and show in the legend and on hover).
    dashed: {"fp16: windowed layers": [GB per context]}: a part of a format's line (its sliding and chunked layers,
    which plateau at the window), dotted in the colour of the format its name starts with. axis_titles: (x, y).
    """
    fig = go.Figure()
    colors = format_colors(list(gb_by_format))
    for name, gbs in gb_by_format.items():
        assert len(gbs) == len(contexts), f"{name}: {len(gbs)} values for {len(contexts)} contexts"
        fig.add_trace(go.Scatter(x=list(contexts), y=_finite(gbs), mode="lines", name=name,
                                 line=dict(color=colors[name], width=2.5),
                                 hovertemplate=name + "<br>%{x:,} tokens: %{y:.3g} GB<extra></extra>"))
    for name, gbs in (dashed or {}).items():
        assert len(gbs) == len(contexts), f"{name}: {len(gbs)} values for {len(contexts)} contexts"
        base = next((f for f in gb_by_format if name.startswith(f + ":")), None)
        fig.add_trace(go.Scatter(x=list(contexts), y=_finite(gbs), mode="lines", name=name,
                                 line=dict(color=colors.get(base, "#888"), width=1.5, dash="dot"),
                                 hovertemplate=name + "<br>%{x:,} tokens: %{y:.3g} GB<extra></extra>"))
    greys = ["#555", "#777", "#999", "#aaa", "#666", "#888", "#bbb", "#444"]
    for i, (label, gb) in enumerate(capacities_gb.items()):
        x = [contexts[0], contexts[-1]] if contexts else []
        fig.add_trace(go.Scatter(x=x, y=[gb] * len(x), mode="lines+text", name=label, text=[label, ""],
                                 textposition="top right", textfont=dict(size=10, color="#444"),
                                 line=dict(color=greys[i % len(greys)], dash="dash", width=1.2),
                                 hovertemplate=label + "<extra></extra>"))
    fig.update_xaxes(title_text=axis_titles[0], type="log" if log_x else "linear", dtick=1 if log_x else None)
    fig.update_yaxes(title_text=axis_titles[1], type="log", dtick=1)
    return _layout(fig, title, height=440)


def speed_by_context(contexts: Sequence[int], tps_by_cache: Mapping[str, Sequence[float]],
                     ceilings: Mapping[str, Sequence[float]], live: Mapping[str, tuple[int, float]], title: str,
                     x_title: str = "context (tokens)", y_title: str = "decode speed (tokens/s)") -> go.Figure:
    """Decode speed against context: one line per cache (measured points), each quantized cache's byte ceiling
    dashed in its colour (what it would reach if it cost nothing beyond its bytes), and `live` points as large
    markers ({cache: (context, tokens/s)}, e.g. the run just made). The first cache is the exact one."""
    names = list(dict.fromkeys([*tps_by_cache, *live]))
    colors = format_colors(names)
    fig = go.Figure()
    for name, tps in tps_by_cache.items():
        assert len(tps) == len(contexts), f"{name}: {len(tps)} values for {len(contexts)} contexts"
        fig.add_trace(go.Scatter(x=list(contexts), y=_finite(tps), mode="lines+markers", name=name,
                                 line=dict(color=colors[name], width=2.5),
                                 hovertemplate=name + "<br>%{x:,} tokens: %{y:.2f} tokens/s<extra></extra>"))
    for name, tps in ceilings.items():
        assert len(tps) == len(contexts), f"{name}: {len(tps)} values for {len(contexts)} contexts"
        label = f"{name}: ceiling"
        fig.add_trace(go.Scatter(x=list(contexts), y=_finite(tps), mode="lines", name=label,
                                 line=dict(color=colors.get(name, "#888"), width=1.5, dash="dash"),
                                 hovertemplate=label + "<br>%{x:,} tokens: %{y:.2f} tokens/s<extra></extra>"))
    for name, (context, tps) in live.items():
        label = f"{name}: this run"
        fig.add_trace(go.Scatter(x=[context], y=[tps], mode="markers", name=label,
                                 marker=dict(color=colors[name], size=13, symbol="diamond",
                                             line=dict(color="#222", width=1)),
                                 hovertemplate=label + "<br>%{x:,} tokens: %{y:.2f} tokens/s<extra></extra>"))
    fig.update_xaxes(title_text=x_title, type="log", tickvals=list(contexts), ticktext=[f"{c:,}" for c in contexts])
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    return _layout(fig, title, height=420)


# --- Export --------------------------------------------------------------------------------------------------


def layer_scales(scales: Mapping[str, Sequence[float]], title: str) -> go.Figure:
    """Per-layer per-tensor scales (x = fp8 * scale), one line per series (K, V, the file's shared one)."""
    fig = go.Figure()
    colors = format_colors(list(scales))
    for name, vals in scales.items():
        fig.add_trace(go.Scatter(x=list(range(len(vals))), y=_finite(vals), mode="lines+markers", name=name,
                                 line=dict(color=colors[name], width=2, dash="dot" if "file" in name else "solid")))
    fig.update_xaxes(title_text="layer (index)")
    fig.update_yaxes(title_text="scale (|x| per FP8 unit)", rangemode="tozero")
    return _layout(fig, title)


# --- Sensitivity and plans -----------------------------------------------------------------------------------


def sensitivity_heatmap(k: Sequence[float], v: Sequence[float], title: str,
                        z_title: str = "mean KL (nats/token, log colour)") -> go.Figure:
    """Per-layer sensitivity as a {K, V} x layer heatmap: the mean KL when only that layer's K (or V) is quantized.

    k, v: [layers] KL in nats (NaN for layers that hold no K/V: a gap). The colour is log10 of the KL, so one peak
    does not flatten every other layer; hover shows the KL itself.
    """
    assert len(k) == len(v), f"{len(k)} K values for {len(v)} V values"
    kl = np.array([_finite(k), _finite(v)], dtype=float)  # [2, layers], None -> NaN
    positive = kl[np.isfinite(kl) & (kl > 0)]
    floor = float(positive.min()) if positive.size else 1e-12
    z = np.log10(np.where(np.isfinite(kl), np.maximum(kl, floor), np.nan))
    fig = go.Figure(go.Heatmap(  # plain lists (None for NaN): the JSON a client reads holds the numbers themselves
        z=[_finite(row) for row in z], x=list(range(len(k))), y=["K", "V"], customdata=[_finite(k), _finite(v)],
        colorscale="Inferno", reversescale=True,
        colorbar=dict(title=dict(text=z_title, side="right"), tickprefix="1e", dtick=1),
        hovertemplate="layer %{x} %{y}<br>KL %{customdata:.3g} nats/token<extra></extra>"))
    fig.update_xaxes(title_text="layer (index)", dtick=1 if len(k) <= 32 else None)
    fig.update_yaxes(title_text="side (K or V)", autorange="reversed")  # K on top
    return _layout(fig, title, height=300)


def sensitivity_ranking(rows: Sequence[tuple[str, int, float]], title: str, top: int = 12) -> go.Figure:
    """The `top` most damaging (side, layer) pairs as horizontal bars, worst on top.

    rows: [(side "k" | "v", layer, KL in nats)] sorted worst first (kvviz.analysis.sensitivity.ranking).
    """
    assert rows, "sensitivity_ranking needs at least one (side, layer, kl) row"
    shown = list(rows[:top])[::-1]  # plotly draws the first bar at the bottom
    colors = {"k": _PALETTE[3], "v": _PALETTE[0]}
    fig = go.Figure(go.Bar(
        x=_finite([kl for _, _, kl in shown]), y=[f"{side.upper()} {layer}" for side, layer, _ in shown],
        orientation="h", marker_color=[colors[side] for side, _, _ in shown],
        hovertemplate="%{y}<br>KL %{x:.3g} nats/token<extra></extra>"))
    fig.update_xaxes(title_text="mean KL (nats/token)", type="log")
    fig.update_yaxes(title_text="side and layer (index)")
    return _layout(fig, title, height=max(300, 60 + 24 * len(shown)))


def plan_tradeoff(nbytes: Sequence[float], kl: Sequence[float], labels: Sequence[str], kl_budget: float,
                  chosen: int, title: str, x_title: str = "KV cache (MiB)") -> go.Figure:
    """The plan search's path: cache size against KL for every step, the budget as a dashed line, the chosen plan
    marked. nbytes: [steps] in the unit of `x_title`; kl: [steps] mean KL in nats; labels: [steps] hover text (the
    plan string); chosen: the index of the plan picked."""
    assert len(nbytes) == len(kl) == len(labels), f"{len(nbytes)} sizes, {len(kl)} KLs, {len(labels)} labels"
    assert 0 <= chosen < len(kl), f"chosen step {chosen} outside 0..{len(kl) - 1}"
    y = [None if k is None or not np.isfinite(k) or k <= 0 else float(k) for k in kl]  # log axis: no zeros
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(nbytes), y=y, mode="lines+markers", name="search path", text=list(labels),
                             line=dict(color=_PALETTE[0], width=2), marker=dict(size=6),
                             hovertemplate="%{text}<br>%{x:.4g} · KL %{y:.3g}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[nbytes[0], nbytes[-1]], y=[kl_budget, kl_budget], mode="lines", name="KL budget",
                             line=dict(color="#777", dash="dash", width=1.5), hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=[nbytes[chosen]], y=[y[chosen]], mode="markers", name="chosen plan",
                             text=[labels[chosen]], marker=dict(symbol="star", size=16, color=_PALETTE[1]),
                             hovertemplate="%{text}<br>%{x:.4g} · KL %{y:.3g}<extra></extra>"))
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text="mean KL (nats/token)", type="log")
    return _layout(fig, title, height=400)


# --- Format anatomy ------------------------------------------------------------------------------------------


def format_anatomy(inputs: Sequence[float], quantized_input: Sequence[float], levels: Sequence[float],
                   quantized_output: Sequence[float], reconstructed: Sequence[float], codes: Sequence[int],
                   code_bits: Sequence[str], arithmetic: Sequence[str], title: str, domain: str = "input",
                   outliers: Sequence[int] = (), value_unit: str = "value (abs. units of K or V)") -> go.Figure:
    """One token of one head through a format, element by element (kvviz.analysis.anatomy.Anatomy's fields).

    Three panels sharing the element axis: the value the codes quantize (the input, or its rotation) beside its
    reconstruction in that domain; each element's code (hover: its bits and the arithmetic back to a value); the
    error of the value attention reads back. outliers: channels to mark (the head's outlier channels).
    """
    d = len(inputs)
    assert all(len(s) == d for s in (quantized_input, levels, quantized_output, reconstructed, codes, code_bits,
                                     arithmetic)), "format_anatomy: every per-element list must be head_dim long"
    x = list(range(d))
    err = [r - i for r, i in zip(reconstructed, inputs)]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.11,
                        subplot_titles=(f"1 · {domain} and its reconstruction", "2 · stored code per element",
                                        "3 · error after the read (reconstructed − input)"))
    hover = [f"element {i}<br>{domain}: {qi:.5g}<br>code {c} = bits {b}<br>{a}<br>reads back {r:.5g} "
             f"(input {v:.5g}, error {e:+.3g})"
             for i, qi, c, b, a, r, v, e in zip(x, quantized_input, codes, code_bits, arithmetic, reconstructed,
                                                 inputs, err)]
    fig.add_trace(go.Scatter(x=x, y=_finite(quantized_input), mode="markers", name=domain,
                             marker=dict(color=_PALETTE[0], size=7), hovertext=hover, hoverinfo="text"), 1, 1)
    fig.add_trace(go.Scatter(x=x, y=_finite(quantized_output), mode="markers", name="reconstruction (same domain)",
                             marker=dict(color=_PALETTE[1], size=7, symbol="x"), hovertext=hover,
                             hoverinfo="text"), 1, 1)
    fig.add_trace(go.Bar(x=x, y=list(codes), name="code", marker_color=_PALETTE[2], hovertext=hover,
                         hoverinfo="text", text=list(code_bits) if d <= 64 else None, textposition="outside",
                         textfont=dict(size=8)), 2, 1)
    fig.add_trace(go.Bar(x=x, y=_finite(err), name="error", marker_color=_PALETTE[3], hovertext=hover,
                         hoverinfo="text"), 3, 1)
    for c in outliers:
        fig.add_vline(x=c, line=dict(color="#D55E00", width=1, dash="dot"))
    if outliers:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="outlier channel",
                                 line=dict(color="#D55E00", dash="dot")), 1, 1)
    fig.update_xaxes(title_text="element (channel index in head_dim)", row=3, col=1)
    fig.update_yaxes(title_text=value_unit, row=1, col=1)
    fig.update_yaxes(title_text="code (unsigned integer)", row=2, col=1)
    fig.update_yaxes(title_text="error (abs. units)", row=3, col=1)
    fig.update_xaxes(title_text="element (index)", row=1, col=1)
    fig.update_xaxes(title_text="element (index)", row=2, col=1)
    return _layout(fig, title, height=720)


def rotated_histogram(rotated: Sequence[float], codebook: Sequence[float], title: str, token: Sequence[float] = (),
                      scale: float = 1.0) -> go.Figure:
    """TurboQuant's rotated coordinates against the Gaussian its codebook is built for.

    rotated: every token's rotated unit-vector coordinates times `scale` (sqrt(head_dim), so the target is N(0, 1));
    codebook: the centroids in unit-vector coordinates (drawn times `scale`); token: the chosen token's coordinates
    (same scaling), marked under the histogram.
    """
    values = np.asarray(rotated, dtype=float)
    fig = go.Figure(go.Histogram(x=values, histnorm="probability density", nbinsx=60, name="rotated coordinates",
                                 marker_color=_PALETTE[0], opacity=0.7,
                                 hovertemplate="%{x}<br>density %{y:.3g}<extra></extra>"))
    grid = np.linspace(-4, 4, 201)
    fig.add_trace(go.Scatter(x=grid, y=np.exp(-grid**2 / 2) / np.sqrt(2 * np.pi), mode="lines",
                             name="N(0, 1): what the codebook is built for", line=dict(color=_PALETTE[1])))
    centroids = [c * scale for c in codebook]
    fig.add_trace(go.Scatter(x=centroids, y=[0.0] * len(centroids), mode="markers", name="codebook entry",
                             marker=dict(symbol="line-ns-open", size=18, color=_PALETTE[3]),
                             hovertemplate="centroid %{x:.4g}<extra></extra>"))
    if len(token):
        fig.add_trace(go.Scatter(x=list(token), y=[-0.02] * len(token), mode="markers", name="this token",
                                 marker=dict(size=5, color=_PALETTE[2]),
                                 hovertemplate="coordinate %{x:.4g}<extra></extra>"))
    fig.update_xaxes(title_text="rotated coordinate × sqrt(head_dim) (unitless)")
    fig.update_yaxes(title_text="probability density (1 / unit)")
    return _layout(fig, title, height=360)


# --- Compare: quality against bytes --------------------------------------------------------------------------


def quality_map(names: Sequence[str], bits: Sequence[float], kl: Sequence[float], frontier: Sequence[bool],
                flags: Sequence[str | None], title: str, kl_floor: float = 1e-6,
                axis_titles: tuple[str, str] = ("stored bits per value (bits, scales included)",
                                                "mean KL against the exact cache (nats/token, log)")) -> go.Figure:
    """Mean KL against bits per value, one point per format or plan run, the Pareto frontier drawn as a line.

    flags: each point's engine flag (kvviz.export) or None, written beside the point. KL is drawn on a log axis,
    so a value under `kl_floor` (a lossless cast) sits at the floor; its hover gives the measured value.
    """
    n = len(names)
    assert len(bits) == len(kl) == len(frontier) == len(flags) == n, "quality_map: one value per run in every list"
    shown = [max(float(v), kl_floor) for v in kl]
    colors = format_colors(list(names))
    fig = go.Figure()
    front = sorted((b, s) for b, s, f in zip(bits, shown, frontier) if f)
    if front:
        fig.add_trace(go.Scatter(x=[b for b, _ in front], y=[s for _, s in front], mode="lines",
                                 name="Pareto frontier", line=dict(color="#444", dash="dash"), hoverinfo="skip"))
    for name, b, s, v, f, flag in zip(names, bits, shown, kl, frontier, flags):
        label = name if not flag else f"{name}<br><sub>{flag}</sub>"
        fig.add_trace(go.Scatter(
            x=[b], y=[s], mode="markers+text", name=name, text=[label], textposition="top center",
            marker=dict(size=12 if f else 9, color=colors[name], symbol="circle" if f else "circle-open",
                        line=dict(width=2, color=colors[name])),
            hovertemplate=(f"{name}<br>{b:.3g} bits/value<br>mean KL {float(v):.3g} nats/token"
                           + ("<br>on the Pareto frontier" if f else "") + (f"<br>{flag}" if flag else "")
                           + "<extra></extra>")))
    fig.update_xaxes(title_text=axis_titles[0])
    fig.update_yaxes(title_text=axis_titles[1], type="log")
    return _layout(fig, title, height=440, showlegend=False)


# --- lesson 9: rotate, then quantize ------------------------------------------------------------------------


def coordinate_histogram(edges: Sequence[float], densities: Mapping[str, Sequence[float]],
                         curve_x: Sequence[float], curve_pdf: Sequence[float], title: str,
                         curve_name: str = "N(0, 1/d): the codebook's density",
                         axis_titles: tuple[str, str] = ("coordinate of the unit vector k/‖k‖ (unitless)",
                                                         "density (1 / coordinate unit)")) -> go.Figure:
    """Histograms of one head's unit-vector coordinates (e.g. before and after the rotation) against the density
    a codebook is built for (kvviz.analysis.coordinate_histogram gives every argument).

    edges: [bins + 1] bin edges; densities: {label: [bins] densities}; curve_x, curve_pdf: the reference density.
    """
    centers = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
    widths = [b - a for a, b in zip(edges[:-1], edges[1:])]
    fig = go.Figure()
    colors = format_colors(list(densities))
    for name, dens in densities.items():
        assert len(dens) == len(centers), f"{name}: {len(dens)} densities for {len(centers)} bins"
        fig.add_trace(go.Bar(x=centers, y=_finite(dens), width=widths, name=name, marker_color=colors[name],
                             opacity=0.55))
    fig.add_trace(go.Scatter(x=list(curve_x), y=list(curve_pdf), mode="lines", name=curve_name,
                             line=dict(color="black", width=2, dash="dash")))
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title_text=axis_titles[0])
    fig.update_yaxes(title_text=axis_titles[1])
    return _layout(fig, title)
