"""kvviz.ui.lessons: the eight lessons of docs/DESIGN.md ("What the app teaches"), one button each.

A lesson button opens its tab, fills the inputs that show the lesson, and runs the tab's action: one click, then
the student reads the tab's opening sentence and the figure. Each tab's `build()` returns its components by name
and its actions as `actions[name] = (fn, inputs, outputs, concurrency_id)`; a lesson names the tab, the settings and the action.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr

from .i18n import lang_code, t


OPEN = "<open>"  # a setting for an Accordion: open it so the lesson's figure shows


@dataclass(frozen=True)
class Lesson:
    tab: str  # tab id in app.py
    settings: dict = field(default_factory=dict)  # component name in the tab's parts -> value
    action: str | tuple[str, ...] | None = "run"  # the tab's action(s) to run, in order, after filling the inputs


LESSONS: tuple[Lesson, ...] = (
    # 1. K has a few huge channels post-RoPE, V does not.
    Lesson("outliers", {"head": 0}),
    # 2. Per-tensor scales are ruined by those outliers; per-token / per-channel are not; rotation spreads them.
    Lesson("errors", {"format": "int4", "which": "K (post-RoPE)", "head": 0}),
    # 3. K is sensitive, V tolerant: k8v4 beats k4v8 at the same bytes.
    Lesson("compare", {"specs": ["k8v4", "k4v8"], "custom": ""}),
    # 4. E4M3 more precise, E5M2 more range: for KV, E4M3 wins.
    Lesson("errors", {"format": "fp8_e5m2", "formats": ["fp8_e4m3", "fp8_e5m2"], "which": "K (post-RoPE)"}),
    # 5. int4 loses retrieval from the middle of a long context.
    # On SmolLM2 at 768 tokens per-token int4 still retrieves; per-tensor int4 and 2-bit KIVI lose the needles.
    Lesson("compare", {"specs": ["int4", "kivi2"], "custom": "int4/tensor", "needle_ctx": 768, "needle_box": OPEN},
           action="needle"),
    # 6. Scale storage eats into the savings at small head_dim / short groups.
    Lesson("memory", {"model": "smollm2-135m", "formats": ["fp16", "int4", "int4/g16", "int2"],
                      "custom": "int4/g8\nint2/g8", "batch": 1}),
    # 7. Dequantizing outside the attention kernel can make a smaller cache slower; fusing fixes that.
    Lesson("compare", {"specs": ["int8", "int4"], "custom": ""}),
    # 8. A few layers carry most of the damage: keep them in higher precision (the map, then the plan search).
    # On SmolLM2 at 128 WikiText-2 tokens, layer 19's K tops the int4 map; budget 0.16 keeps it alone in fp16.
    Lesson("sensitivity", {"source": "WikiText-2", "spec": "int4", "tokens": 128, "candidates": ["int4", "fp16"],
                           "custom_candidates": "", "budget": 0.16}, action=("run", "search")),
)


def wire(buttons: list[gr.Button], tabs: gr.Tabs, parts: dict[str, dict], note: gr.Markdown, lang: gr.Radio) -> None:
    """Connect lesson button i to LESSONS[i]: select the tab, show the lesson's note (in the page's language), set
    the inputs, then run the tab's action."""
    assert len(buttons) == len(LESSONS), f"{len(buttons)} lesson buttons for {len(LESSONS)} lessons"
    for i, (button, lesson) in enumerate(zip(buttons, LESSONS), start=1):
        tab = parts[lesson.tab]
        missing = [k for k in lesson.settings if k not in tab]
        assert not missing, f"tab {lesson.tab!r} has no components {missing}"
        targets = [tab[k] for k in lesson.settings]
        values = list(lesson.settings.values())

        def fill(choice, _tab=lesson.tab, _values=values, _key=f"lesson_note{i}"):
            values = [gr.Accordion(open=True) if v == OPEN else v for v in _values]
            return (gr.Tabs(selected=_tab), gr.Markdown(t(_key, lang_code(choice)), visible=True), *values)

        event = button.click(fill, lang, [tabs, note, *targets], api_visibility="private", queue=False)
        for action in (lesson.action,) if isinstance(lesson.action, str) else lesson.action or ():
            fn, inputs, outputs, concurrency_id = tab["actions"][action]
            event = event.then(fn, inputs, outputs, api_visibility="private", concurrency_id=concurrency_id)
