"""Lessons and the layer/head sliders: every lesson's setting fits each bundled model, and the sliders follow it;
the figures the notes quote are recorded (kvviz/ui/strings/lesson_figures.json) and fill every placeholder."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pytest

from kvviz.ui import common, lessons
from kvviz.ui.i18n import EN, KO, t
from kvviz.ui.strings import figures
from kvviz.ui.registry import BUNDLED_MODELS


@pytest.mark.parametrize("model", BUNDLED_MODELS)
@pytest.mark.parametrize("i", range(len(lessons.LESSONS)))
def test_lesson_settings_stay_inside_the_model(i, model):
    layers, heads = common.model_shape(model)
    settings = lessons._settings(lessons.LESSONS[i], model)
    assert 0 <= settings.get("layer", 0) < layers, f"lesson {i + 1} on {model}: layer outside 0..{layers - 1}"
    assert 0 <= settings.get("head", 0) < heads, f"lesson {i + 1} on {model}: head outside 0..{heads - 1}"


@pytest.mark.parametrize("model, layers, heads", [("gemma-3-270m", 18, 1), ("smollm2-135m", 30, 3)])
def test_sliders_follow_the_models_layers_and_kv_heads(model, layers, heads):
    """Gemma 3 270M has one KV head: gradio refuses a 0..0 slider, which made the whole update fail and left
    SmolLM2's 0-29 / 0-2 sliders in place; one head is now a locked 0..1 slider held at 0."""
    layer, head = common.layer_head_updates(model)
    assert layer["maximum"] == layers - 1 and 0 <= layer["value"] < layers and layer["interactive"]
    assert head["value"] == 0 and head["interactive"] == (heads > 1)
    assert head["maximum"] == max(1, heads - 1)
    for update in (layer, head):  # what gradio builds from the update must not raise
        gr.Slider(**{k: v for k, v in update.items() if k != "__type__"})
    with gr.Blocks():
        built = common.layer_head_inputs(model=model)
    assert [b.maximum for b in built] == [layers - 1, max(1, heads - 1)]


# --- the figures the notes quote (kvviz/ui/strings/figures.py) ---------------------------------------------------

NOTES = [k for k in EN if k.startswith(("lesson_note", "lesson_models"))]


@pytest.mark.parametrize("key", NOTES)
def test_every_figure_a_note_quotes_is_recorded_and_both_languages_quote_the_same(key):
    recorded = figures.load()
    quoted = figures.placeholders(EN[key])
    assert quoted == figures.placeholders(KO[key]), f"{key}: English and Korean quote different figures"
    missing = [(m, f) for m, f in quoted if f not in recorded.get(figures.MODELS[m], {})]
    assert not missing, f"{key} quotes figures lesson_figures.json lacks: {missing}"
    for lang in ("en", "ko"):
        text = figures.fill(t(key, lang))  # every placeholder filled: format raises on a missing figure
        assert not figures.placeholders(text) and "{" not in text and "}" not in text, (key, lang, text)


def test_notes_quote_the_measured_lessons_figures_not_literals():
    """The notes of the lessons whose figures a lesson run measures quote them through placeholders: the numbers
    of lesson 8's plan and lesson 9's KLs are nowhere in the texts as literals."""
    quoted = {f for key in NOTES for _, f in figures.placeholders(EN[key])}
    measured_prefixes = {f"l{i}_" for i in figures.MEASURED}
    assert {f.split("_")[0] + "_" for f in quoted} == measured_prefixes, sorted(quoted)
    for key in ("lesson_note8", "lesson_note9", "lesson_models9"):
        for literal in ("0.046", "0.027", "0.0038", "0.057", "1.68", "25.6"):
            assert literal not in EN[key] and literal not in KO[key], (key, literal)


def test_a_missing_figure_is_an_error_naming_it():
    recorded = figures.load()
    del recorded["smollm2-135m"]["l8_kl_plan"]
    with pytest.raises(KeyError, match="l8_kl_plan"):
        figures.fill(EN["lesson_note8"], recorded)


def test_readme_quotes_the_recorded_lesson_figures():
    """README's lessons section repeats lesson 5's counts and lesson 8's plans: they match the recorded figures."""
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    smol, gemma = (figures.load()[m] for m in ("smollm2-135m", "gemma-3-270m"))
    assert (f"on SmolLM2 at {smol['l5_ctx']} tokens the exact cache finds {smol['l5_exact']} of {smol['l5_total']}, "
            f"per-token int4 {smol['l5_int4']}, per-tensor int4 {smol['l5_tensor']}") in readme
    gemma_tensor = "none" if gemma["l5_tensor"] == 0 else gemma["l5_tensor"]
    assert (f"on Gemma 3 270M at {gemma['l5_ctx']} tokens {gemma['l5_exact']}, {gemma['l5_int4']} and "
            f"{gemma_tensor}") in readme
    assert f"--kv-cache-dtype-skip-layers {smol['l8_skip']}`" in readme
    assert f"`... --kv-cache-dtype-skip-layers {gemma['l8_skip']}`" in readme
    assert f"cuts int4's KL about {smol['l9_int4_over_rot']:.0f}x" in readme
