"""The Long context tab in-process (kvviz/ui/long_context.py): its input checks, and the library's message for a
context beyond the free memory reaching the user (gradio_client tests: tests/test_app_api.py, long_context)."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.quality.long_context import checks
from kvviz.ui import long_context as tab


@pytest.mark.parametrize("value, whole, want", [("2048, 4096", True, [2048, 4096]),
                                               ("0; 50, 100", False, [0.0, 50.0, 100.0]), (" 4096 ,4096 ", True, [4096])])
def test_numbers_reads_a_comma_separated_list(value, whole, want):
    assert tab._numbers(value, "Needle contexts", 0, 8192, 4, whole) == want


@pytest.mark.parametrize("value, message", [
    ("", "is empty"), ("a, 2", "'a' is not a number"), ("0, 150", "150 is out of range"),
    ("12.5", "whole numbers from 0 to 100; 12.5 is out of range"), ("1, 2, 3, 4, 5", "give at most 4"),
    (5, "must be text"),
])
def test_numbers_names_what_is_wrong(value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        tab._numbers(value, "Needle depths (%)", 0, 100, 4, True)


def test_the_default_needle_settings_are_the_issues(monkeypatch):
    """Ten depths from the start to the end of the context, at 2K, 4K and 8K."""
    assert tab._numbers(tab.DEFAULT_NEEDLE_DEPTHS, "d", 0, 100, tab.MAX_DEPTHS, False)[::9] == [0, 100]
    assert len(tab._numbers(tab.DEFAULT_NEEDLE_DEPTHS, "d", 0, 100, tab.MAX_DEPTHS, False)) == 10
    assert tab._numbers(tab.DEFAULT_NEEDLE_CONTEXTS, "c", 256, 32768, 4, True) == [2048, 4096, 8192]


@pytest.fixture
def tiny(monkeypatch):
    """The app's runtime on the tiny model (as tests/test_lessons_run.py builds it)."""
    monkeypatch.setenv("KVVIZ_MODEL", "tiny-llama")
    from kvviz import runtime

    monkeypatch.setattr(runtime, "_default", runtime.default())
    runtime.set_default(runtime.Runtime.from_env())
    return "tiny-llama"


def _first(gen):
    return next(iter(gen))


def test_a_context_beyond_the_free_memory_says_how_much_it_needs(tiny, monkeypatch):
    monkeypatch.setattr(checks, "available_bytes", lambda: 20_000_000)  # 20 MB free
    with pytest.raises(gr.Error, match=r"needs about [0-9.]+ GB .* this machine has 0.02 GB free"):
        _first(tab.run("WikiText-2", "", None, ["int4"], "", 512, 128, 4, False, "512", "50", tiny, "English",
                       progress=lambda *a, **k: None))


def test_a_bad_needle_setting_is_refused_before_the_position_pass(tiny):
    """The library checks the needle's contexts when called: the tab calls it first, so no chunk has run."""
    with pytest.raises(gr.Error, match="positions"):
        _first(tab.run("WikiText-2", "", None, ["int4"], "", 512, 128, 4, True, "4096", "50", tiny, "English",
                       progress=lambda *a, **k: None))
    with pytest.raises(gr.Error, match="prompt .* and 1,000 new tokens make 1,256, beyond"):
        _first(tab.run("WikiText-2", "", None, ["int4"], "", 512, 128, 1000, False, "512", "50", tiny, "English",
                       progress=lambda *a, **k: None))
