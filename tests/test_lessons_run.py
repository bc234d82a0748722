"""Every lesson, run as its button runs it (the tab's inputs filled with the lesson's settings, then the tab's
actions), in-process on the tiny model; the claims that hold on any model are asserted from the returned numbers.

On the tiny random model: every lesson runs to its end without an error (lesson 5's needle at 768 tokens included);
lesson 3's k8v4 and k4v8 hold the same bytes; lesson 6's bits per value grow as the groups shrink (4.25, 5 and 6
bits at head_dim 64, SmolLM2's preset). The claims about what a trained model does (K's outlier channels, k8v4
beating k4v8 on KL, retrieval, fused speed against DynamicCache) need the bundled models: not asserted here.
"""

from __future__ import annotations

import pandas as pd
import pytest

from kvviz.ui import lessons


@pytest.fixture(scope="module")
def parts():
    mp = pytest.MonkeyPatch()
    mp.setenv("KVVIZ_MODEL", "tiny-llama")
    import app
    from kvviz import runtime

    mp.setattr(runtime, "_default", runtime.default())  # build_demo installs the app's runtime: undone below

    yield app.build_demo().parts
    mp.undo()


def run_lesson(parts: dict, i: int, model: str = "tiny-llama") -> dict:
    """Lesson i (1-based) on `model`: {action: its outputs}, its functions called with the arguments its button
    fills in (kvviz.ui.lessons.calls)."""
    return lessons.run(parts, i, model)


@pytest.mark.parametrize("i", range(1, len(lessons.LESSONS) + 1))
def test_every_lesson_runs_on_the_tiny_model(parts, i):
    out = run_lesson(parts, i)
    assert out and all(v is not None for v in out.values())


def test_lesson3_k8v4_and_k4v8_hold_the_same_bytes(parts):
    _, table, _, status, _ = run_lesson(parts, 3)["run"]
    rows = {r[0]: r for r in (table.values.tolist() if isinstance(table, pd.DataFrame) else table["data"])}
    assert rows["k8v4"][8] == rows["k4v8"][8], "cache KiB"


def test_lesson6_scales_eat_into_the_savings(parts):
    out = run_lesson(parts, 6)["run"]
    text = " ".join(str(o) for o in out if isinstance(o, str))
    for bits in ("4.25", "5", "6"):
        assert bits in text, text[:400]


def test_the_figures_the_notes_quote_are_read_back_from_every_measured_lesson(parts):
    """kvviz.ui.strings.figures.measure reads every figure the notes quote from what the lessons show (on the tiny
    model: the values differ from the bundled models', the parsing does not); tests/test_lessons_models.py compares
    them with the recorded ones on the bundled models."""
    from kvviz.ui.strings import figures

    measured = figures.measure({i: run_lesson(parts, i) for i in figures.MEASURED})
    quoted = {f for model in figures.load().values() for f in model}
    missing = sorted(quoted - set(measured))
    assert not missing, f"figures the lessons no longer show: {missing}"
    assert measured["l3_bits"] > 0 and measured["l5_total"] == 15 and measured["l7_exact_mib"] > 0
    assert measured["l7_static_mib"] == measured["l7_exact_mib"]  # StaticCache sized to the tokens DynamicCache holds
