"""kvviz.engines.simulate: kvviz's side of the engine tables, on a tiny random Llama (no download)."""

from __future__ import annotations

import pytest

from kvviz.engines import simulate
from kvviz.tiny import tiny_model


def test_kld_grows_as_the_format_loses_bits():
    model, _ = tiny_model()
    ids = [(7 * i) % 250 + 3 for i in range(80)]
    stats = simulate.kvviz_kld(["fp16", "int8", "int4", "int2"], ids, model)
    assert [stats[s]["n"] for s in stats] == [78] * 4  # positions 1..T-2
    assert stats["fp16"]["mean"] < stats["int8"]["mean"] < stats["int4"]["mean"] < stats["int2"]["mean"]
    assert stats["int8"]["mean"] > 0 and stats["int4"]["estimate"] == "full vocabulary"


def test_bad_specs_and_short_ids_are_refused():
    model, _ = tiny_model()
    with pytest.raises(ValueError, match="Unknown KV format"):
        simulate.kvviz_kld(["int5"], list(range(3, 20)), model)
    with pytest.raises(ValueError, match="at least three token ids"):
        simulate.kvviz_kld(["int8"], [3, 4], model)


def test_side_by_side_names_each_sides_figures():
    from kvviz.engines.side_by_side import side_by_side

    model, _ = tiny_model()
    ids = [(7 * i) % 250 + 3 for i in range(40)]
    ours = simulate.kvviz_kld(["int8", "int4"], ids, model)
    theirs = {s: dict(ours[s], mean=2 * ours[s]["mean"], engine="llama.cpp (test)", rotation="off") for s in ours}
    sim = {s: dict(ours[s], mean=3 * ours[s]["mean"]) for s in ours}
    rows = side_by_side(["int4", "int8"], ours, theirs, sim)
    assert [r.format for r in rows] == ["int4", "int8"]
    assert rows[0].kvviz_mean == ours["int4"]["mean"] and rows[0].engine_mean == 2 * ours["int4"]["mean"]
    assert rows[1].kvviz_p99 == ours["int8"]["p99"] and rows[1].engine_same_top == ours["int8"]["same_top_p"]
    assert rows[0].engine == "llama.cpp (test)" and rows[0].rotation == "off"
    assert rows[0].sim_mean == 3 * ours["int4"]["mean"] and rows[0].sim_ratio == pytest.approx(1.5)
