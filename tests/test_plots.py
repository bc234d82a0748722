"""Tests for kvviz.plots: every figure builds from plain data, has data in it, and titles every axis with a unit.

Run: python -m pytest tests/test_plots.py -q
"""

import math
import re

import numpy as np
import plotly.graph_objects as go
import pytest

import kvviz.plots as P

_UNIT = re.compile(r"\(.+\)")


def _used_axes(fig: go.Figure) -> set[str]:
    """Layout names ("xaxis", "yaxis2", ...) of the axes that some trace draws on."""
    used = set()
    for tr in fig.data:
        xa = getattr(tr, "xaxis", None) or "x"
        ya = getattr(tr, "yaxis", None) or "y"
        used.add("xaxis" + xa[1:])
        used.add("yaxis" + ya[1:])
    return used


def _assert_axes_titled(fig: go.Figure) -> None:
    for name in _used_axes(fig):
        axis = fig.layout[name]
        text = axis.title.text if axis.title else None
        assert text, f"{name} has no title"
        assert _UNIT.search(text), f"{name} title {text!r} names no unit in parentheses"
    for tr in fig.data:
        if isinstance(tr, go.Heatmap) and tr.showscale is not False:
            assert tr.colorbar.title.text and _UNIT.search(tr.colorbar.title.text), "colour bar lacks a unit"


def _assert_has_data(fig: go.Figure) -> None:
    assert fig.data, "figure has no traces"
    for tr in fig.data:
        if isinstance(tr, go.Heatmap):
            assert np.asarray(tr.z).size > 0
        elif isinstance(tr, go.Histogram):
            assert len(tr.x) > 0
        else:
            assert len(tr.y) > 0


def _figures():
    rng = np.random.default_rng(0)
    names = ["fp16", "fp8", "k8v4", "k4v8"]
    yield P.metrics_bars(names, {"KL (nats/token)": [0, 0.01, 0.02, 0.2], "top-1 (%)": [100, 99, 98, 80],
                                 "perplexity (exp nats)": [10, 10.1, 10.2, 13], "cache (MiB)": [4, 2, 1.5, 1.5]})
    yield P.engine_bars(["q8_0", "q4_0"], {"kvviz": [0.00025, 0.073], "llama.cpp": [0.0042, None]})
    yield P.needle_chart([0, 25, 50, 75, 100], {"fp16": [1, 1, 1, 1, 1], "int4": [1, 0.5, 0.2, 0.6, 1]}, 2048)
    yield P.channel_profile({"K pre-RoPE": rng.random(64), "K post-RoPE": rng.random(64)}, "K", outliers=[3, 17])
    yield P.layer_channel_heatmap(rng.random((30, 64)), "layers")
    yield P.error_heatmap(rng.random((12, 64)), "error", token_labels=[f"t{i}" for i in range(12)])
    yield P.layer_error_lines({"int4": rng.random(30) + 0.01, "int8": rng.random(30) * 0.1 + 0.001}, "per layer")
    yield P.layer_error_lines({"int4": {"K": rng.random(30), "V": rng.random(30)}}, "per layer, K and V")
    yield P.granularity_heatmaps({"per-token": rng.random((12, 64)), "per-channel": rng.random((12, 64)),
                                  "per-tensor": rng.random((12, 64))}, "granularity",
                                 subtitles={"per-token": "rel. err 0.1"})
    yield P.layer_scales({"K": [0.01, 0.02], "V": [0.005, 0.004]}, "scales")
    yield P.memory_vs_context([1024, 4096, 32768], {"fp16": [0.1, 0.4, 3.2], "fp8": [0.05, 0.2, 1.6]},
                              {"L4 24 GB": 20.0, "H100 80 GB": 70.0})
    yield P.sensitivity_heatmap([0.03, 0.001, math.nan], [0.002, 0.0005, math.nan], "sensitivity")
    yield P.sensitivity_ranking([("k", 0, 0.03), ("v", 0, 0.002), ("k", 1, 0.001)], "ranking")
    yield P.plan_tradeoff([1.0, 1.5, 2.0], [0.2, 0.05, 1e-6], ["int4", "int4; 0=fp16", "fp16"], 0.1, 1, "plans")
    x = rng.standard_normal(8).tolist()
    yield P.format_anatomy(x, x, [round(v * 7) for v in x], [round(v * 7) / 7 for v in x], [round(v * 7) / 7 for v in x],
                           list(range(8)), [format(i, "04b") for i in range(8)], ["3 × 0.14 = 0.43"] * 8,
                           "anatomy", outliers=[2])
    yield P.quality_map(["int4", "k8v4", "int4; 0=fp16"], [4.25, 6.1, 4.6], [0.05, 0.004, 0.0],
                        [True, True, False], ["vllm --kv-cache-dtype int4_per_token_head", None, None], "map")
    yield P.rotated_histogram(rng.standard_normal(256).tolist(), [-0.2, -0.05, 0.05, 0.2], "rotated", token=x,
                              scale=4.0)
    yield P.coordinate_histogram(np.linspace(-0.5, 0.5, 11), {"before": rng.random(10), "after": rng.random(10)},
                                 np.linspace(-0.5, 0.5, 21), rng.random(21), "coordinates")


@pytest.mark.parametrize("fig", list(_figures()), ids=lambda f: f.layout.title.text[:30] or "untitled")
def test_figure_has_data_and_titled_axes(fig):
    assert isinstance(fig, go.Figure)
    _assert_has_data(fig)
    _assert_axes_titled(fig)
    fig.to_json()  # serializable for gr.Plot


def test_empty_figure_is_a_figure_with_a_message():
    fig = P.empty_figure("nothing yet")
    assert isinstance(fig, go.Figure)
    assert fig.layout.annotations[0].text == "nothing yet"


def test_nan_and_inf_become_gaps():
    fig = P.metrics_bars(["a", "b", "c"], {"KL (nats/token)": [0.1, math.nan, math.inf]})
    assert list(fig.data[0].y) == [0.1, None, None]


def test_format_colors_are_stable_and_distinct():
    c = P.format_colors(["fp16", "fp8", "k8v4"])
    assert len(set(c.values())) == 3
    assert P.format_colors(["fp16", "fp8"])["fp8"] == c["fp8"]


@pytest.mark.parametrize("call", [
    lambda: P.metrics_bars(["a", "b"], {"KL (nats/token)": [0.1]}),
    lambda: P.needle_chart([0, 50], {"fp16": [1.0]}, 100),
    lambda: P.channel_profile({"a": [1, 2], "b": [1, 2, 3]}, "x"),
    lambda: P.layer_channel_heatmap([1, 2, 3], "x"),
    lambda: P.error_heatmap(np.zeros((2, 3)), "x", token_labels=["a"]),
    lambda: P.granularity_heatmaps({"a": np.zeros((2, 3)), "b": np.zeros((3, 3))}, "x"),
    lambda: P.memory_vs_context([1, 2], {"fp16": [1.0]}, {}),
    lambda: P.sensitivity_heatmap([0.1, 0.2], [0.1], "x"),
    lambda: P.plan_tradeoff([1.0, 2.0], [0.1], ["a", "b"], 0.1, 0, "x"),
    lambda: P.plan_tradeoff([1.0, 2.0], [0.1, 0.2], ["a", "b"], 0.1, 2, "x"),
    lambda: P.engine_bars(["q8_0", "q4_0"], {"kvviz": [0.1]}),
])
def test_mismatched_shapes_fail_loudly(call):
    with pytest.raises(AssertionError):
        call()


def test_plots_never_import_gradio():
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(P))
    names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any("gradio" in (m or "") for m in names | mods)


def test_sensitivity_heatmap_colours_log_kl_and_leaves_gaps():
    """The colour is log10 of the KL (one peak does not flatten the rest); hover keeps the KL; NaN is a gap."""
    fig = P.sensitivity_heatmap([0.1, 0.001, math.nan], [0.01, 0.0, 1.0], "s")
    z, kl = fig.data[0].z, fig.data[0].customdata
    assert list(z[0][:2]) == pytest.approx([-1.0, -3.0]) and z[0][2] is None
    assert z[1][1] == pytest.approx(-3.0)  # a zero KL sits at the smallest positive one, not at -inf
    assert list(kl[0]) == [0.1, 0.001, None] and list(fig.data[0].y) == ["K", "V"]


def test_ranking_puts_the_worst_on_top_and_plan_tradeoff_marks_the_choice():
    rows = [("k", 19, 0.03), ("k", 10, 0.013), ("v", 0, 0.001)]
    bars = P.sensitivity_ranking(rows, "r", top=2)
    assert list(bars.data[0].y) == ["K 10", "K 19"]  # plotly draws the first bar at the bottom
    fig = P.plan_tradeoff([25.0, 27.4, 94.4], [0.237, 0.154, 0.0], ["int4", "int4; 19=fp16", "fp16"], 0.16, 1, "p")
    path, budget, chosen = fig.data
    assert list(path.y) == [0.237, 0.154, None]  # a zero KL has no place on the log axis: a gap
    assert list(budget.y) == [0.16, 0.16] and list(chosen.x) == [27.4] and list(chosen.text) == ["int4; 19=fp16"]


@pytest.mark.parametrize("log_y", [True, False])
def test_position_figure_labels_each_threshold_at_its_line(log_y):
    """Each threshold's label sits at its dashed line's height, on a log axis too (where the axis reads log10)."""
    from kvviz.plots.long_context import position_figure

    thresholds = (0.01, 0.05, 0.1)
    fig = position_figure({"int4": np.linspace(0.01, 0.3, 50)}, thresholds=thresholds, log_y=log_y)
    labels = {a.text: a.y for a in fig.layout.annotations if a.text in {f"{t:g}" for t in thresholds}}
    assert labels == {f"{t:g}": pytest.approx(np.log10(t) if log_y else t) for t in thresholds}
    assert sorted(s.y0 for s in fig.layout.shapes) == list(thresholds)
