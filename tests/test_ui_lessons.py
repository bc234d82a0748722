"""Lessons and the layer/head sliders: every lesson's setting fits each bundled model, and the sliders follow it."""

from __future__ import annotations

import gradio as gr
import pytest

from kvviz.ui import common, lessons
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
