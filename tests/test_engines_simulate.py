"""kvviz.engines.simulate: kvviz's side of the engine tables, on a tiny random Llama (no download)."""

from __future__ import annotations

import pytest

from kvviz.engines import simulate
from kvviz.tiny import tiny_model


def test_kld_grows_as_the_format_loses_bits():
    model, _ = tiny_model()
    ids = [(7 * i) % 250 + 3 for i in range(80)]
    stats = simulate.kld(["fp16", "int8", "int4", "int2"], ids, model)
    assert [stats[s]["n"] for s in stats] == [78] * 4  # positions 1..T-2
    assert stats["fp16"]["mean"] < stats["int8"]["mean"] < stats["int4"]["mean"] < stats["int2"]["mean"]
    assert stats["int8"]["mean"] > 0 and stats["int4"]["estimate"] == "full vocabulary"


def test_bad_specs_and_short_ids_are_refused():
    model, _ = tiny_model()
    with pytest.raises(ValueError, match="Unknown KV format"):
        simulate.kld(["int5"], list(range(3, 20)), model)
    with pytest.raises(ValueError, match="at least three token ids"):
        simulate.kld(["int8"], [3, 4], model)
