"""kvviz.ui.lessons: the lessons of docs/DESIGN.md ("What the app teaches"), one button each.

A lesson button opens its tab, fills the inputs that show the lesson, and runs the tab's action: one click, then
the student reads the tab's opening sentence and the figure. Each tab's `build()` returns its components by name
and its actions as `actions[name] = (fn, inputs, outputs, concurrency_id)`; a lesson names the tab, the settings and the action.

Lessons run on the model selected in the page's picker (the tab's own `model` input). Where the lesson reads
differently on another model, `by_model` changes a setting (Gemma 3 270M's outliers live in its full-attention
layers 5 and 11) and the note's `lesson_models<i>` paragraph says what differs, from what the analysis measures.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import gradio as gr

from kvviz.memory import MODEL_PRESETS

from .common import model_task
from .errors import DEFAULT_FORMATS as DEFAULT_ERROR_FORMATS
from .i18n import EN, lang_code, t
from .strings import figures


LESSON10_SPECS = ["int4", "k8v4", "nvfp4"]  # lesson 10's formats (kvviz.ui.strings.figures reads their rows)
OPEN = "<open>"  # a setting for an Accordion: open it so the lesson's figure shows
SELECTED = "<selected model>"  # a setting for the Memory tab's preset: the picked model when it is a preset


@dataclass(frozen=True)
class Lesson:
    tab: str  # tab id in app.py
    settings: dict = field(default_factory=dict)  # component name in the tab's parts -> value
    action: str | tuple[str, ...] | None = "run"  # the tab's action(s) to run, in order, after filling the inputs
    by_model: dict = field(default_factory=dict)  # model name -> {component name: value} replacing settings


LESSONS: tuple[Lesson, ...] = (
    # 1. K has a few huge channels post-RoPE, V does not.
    # On Gemma 3 270M the full-attention layers hold them (layer 11: ~30x the median channel, 256 WikiText-2 tokens).
    # On SmolLM2 layer 0 shows none (K 3.0x, V 9.8x there): the lesson opens layer 17 (K ~5x).
    Lesson("outliers", {"head": 0}, by_model={"smollm2-135m": {"layer": 17}, "gemma-3-270m": {"layer": 11}}),
    # 2. Per-tensor scales are ruined by those outliers; per-token / per-channel are not; rotation spreads them.
    # The anatomy then follows one token through int4/tensor: the outlier channels (listed first) set the one
    # scale, and the other channels' codes crowd around zero.
    # It sets the comparison's formats too: lesson 4 changes them on the same tab, and lesson 2 must not show
    # whatever ran last.
    Lesson("errors", {"format": "int4", "formats": DEFAULT_ERROR_FORMATS, "custom": "", "which": "K (post-RoPE)",
                      "head": 0, "anatomy_format": "int4/tensor", "anatomy_side": "K", "anatomy_box": OPEN},
           action=("run", "anatomy"), by_model={"gemma-3-270m": {"layer": 11}}),
    # 3. K is sensitive, V tolerant: k8v4 beats k4v8 at the same bytes.
    Lesson("compare", {"specs": ["k8v4", "k4v8"], "custom": ""}),
    # 4. E4M3 more precise, E5M2 more range: for KV, E4M3 wins.
    Lesson("errors", {"format": "fp8_e5m2", "formats": ["fp8_e4m3", "fp8_e5m2"], "custom": "",
                      "which": "K (post-RoPE)"}),
    # 5. Per-tensor int4 loses the needle; per-token int4 loses fewer. Three needles per depth (the Compare tab's
    # NEEDLES_PER_DEPTH), so each depth's point is a rate. SmolLM2 at 352 tokens: exact 15/15, int4 14-15,
    # int4/tensor 7-8 under five sets of CPU kernels (AVX-512 and AVX2 ones, through ONEDNN_MAX_CPU_ISA and
    # ATEN_CPU_CAPABILITY: the rounding another x86 CPU does); at 304 tokens int4/tensor found 8-10 (10 on an Intel
    # CPU with AMX), too near the lesson's claim. 640 tokens (4-5) holds more room but doubles the work
    # (docs/benchmarks.md, lesson 5 on any x86 CPU). Gemma 3 270M at 256 tokens (its outliers decide it): 15, 10, 0
    # (2026-12-06; 8 before: kvviz/ui/strings/lesson_figures.json holds the note's figures).
    Lesson("compare", {"specs": ["int4"], "custom": "int4/tensor", "needle_ctx": 512, "needle_box": OPEN},
           action="needle", by_model={"smollm2-135m": {"needle_ctx": 352}, "gemma-3-270m": {"needle_ctx": 256}}),
    # 6. Scale storage eats into the savings at small head_dim / short groups.
    Lesson("memory", {"model": SELECTED, "formats": ["fp16", "int4", "int4/g16", "int2"],
                      "custom": "int4/g8\nint2/g8", "batch": 1}),
    # 7. Dequantizing outside the attention kernel makes a smaller cache slower; fusing fixes that. The Compare
    # tab's fused view times the same decode fused and unfused, live (kvviz/ui/fused.py).
    Lesson("compare", {"fused_specs": ["int4", "k8v4"], "fused_custom": "", "fused_box": OPEN}, action="fused"),
    # 8. A few layers carry most of the damage: keep them in higher precision (the map, then the plan search).
    # The candidates are an engine dtype and fp16, so the plan is one vLLM serves (--kv-cache-dtype-skip-layers).
    # SmolLM2 at 64 WikiText-2 tokens: budget 0.03 keeps layers 1-3 and 10 in fp16 (KL 0.027; every layer int4 0.046);
    # Gemma 3 270M: 0.11 keeps layer 4 (KL 0.1003: at 0.1 the plan would hang on the fourth digit). At 64 tokens the
    # map and the search each take about 5 s on SmolLM2 (at 128, 11-14 s each: over the lesson's 15 s together).
    Lesson("sensitivity", {"source": "WikiText-2", "spec": "vllm:int4_per_token_head", "tokens": 64,
                           "candidates": ["vllm:int4_per_token_head", "fp16"], "custom_candidates": "", "budget": 0.03},
           action=("run", "search"), by_model={"gemma-3-270m": {"budget": 0.11}}),
    # 9. Rotate, then quantize: int4, int4/rot, vLLM's int4_per_token_head and turboquant_4bit_nc, TQ-mse and TQ-prod
    # at 4 bits (kvviz/ui/rotation.py), and one head's K coordinates before and after the rotation against N(0, 1/d).
    Lesson("compare", {"rot_tokens": 256, "rot_box": OPEN}, action="rotation"),
    # 10. Errors pile up with context: the Long context tab reads WikiText-2 through int4, k8v4 and nvfp4 chunk by
    # chunk (kvviz.quality.long_context) and compares each format's mean KL over the last quarter of the positions
    # with the first quarter's; then a short free-running generation. 1,024 tokens (the tiny models' whole context)
    # keep it to seconds (figures: lesson_figures.json, l10_*).
    Lesson("long_context", {"source": "WikiText-2", "specs": LESSON10_SPECS, "custom": "", "context": 1024,
                            "chunk": 256, "new_tokens": 48, "needle": False}),
    # 11. Drop tokens or drop bits? The Equal bytes tab at a quarter of the 16-bit cache, 256 WikiText-2 tokens, 16
    # read teacher-forced, one needle at each of 5 depths: int4 and int2 on every token, fp16 on a quarter of the
    # tokens (streaming, snapkv), int8/int4 under snapkv, the same with the rest in int2 (kvviz/ui/equal_bytes.py).
    Lesson("equal_bytes", {"budget": 25, "context": 256, "continuation": 16, "policies": ["streaming", "snapkv"],
                           "combine": "snapkv", "window": 32, "custom": "", "needles": 1}),
)


def _settings(lesson: Lesson, model: str | None) -> dict:
    """The lesson's settings on `model`: its own, with by_model's for that model on top."""
    return {**lesson.settings, **lesson.by_model.get(model, {})}


def _value(value, model: str | None):
    if value == OPEN:
        return gr.Accordion(open=True)
    if value == SELECTED:
        return model if model in MODEL_PRESETS else "smollm2-135m"
    return value


def calls(parts: dict, i: int, model: str) -> list[tuple[str, Callable, list]]:
    """Lesson i (1-based) as its button runs it on `model`: (action, function, arguments) for each of its actions
    in order, each argument the lesson's setting for that input, the picked model for the page's model picker, else
    the component's own value (the page's default). parts: the tabs' components by name, as `wire` gets them."""
    lesson = LESSONS[i - 1]
    tab = parts[lesson.tab]
    settings = _settings(lesson, model)
    names = {id(c): n for n, c in tab.items() if isinstance(c, gr.components.Component)}
    out = []
    for action in (lesson.action,) if isinstance(lesson.action, str) else lesson.action:
        fn, inputs, _, _ = tab["actions"][action]
        args = []
        for comp in inputs:
            name = names.get(id(comp))
            if name in settings:
                args.append(_value(settings[name], model))
            elif name == "model":  # the page's model picker (the Memory tab's "model" is a preset: a setting)
                args.append(model)
            else:
                args.append(comp.value)
        out.append((action, fn, args))
    return out


def run(parts: dict, i: int, model: str) -> dict:
    """Lesson i (1-based) on `model`, run in this process as its button runs it (calls): {action: its outputs, a
    streaming action's last update}, in English, progress discarded."""
    results = {}
    for action, fn, args in calls(parts, i, model):
        kwargs = {"progress": lambda *a, **k: None} if "progress" in inspect.signature(fn).parameters else {}
        out = fn(*args, **kwargs)
        if inspect.isgenerator(out):
            last = None
            for last in out:
                pass
            out = last
        results[action] = out
    return results


def note(i: int, lang: str, model: str | None) -> str:
    """Lesson i's note in `lang`: what to read, which model it runs on, and what differs between models; the
    figures it quotes come from the lesson runs recorded in kvviz/ui/strings/lesson_figures.json."""
    parts = [figures.fill(t(f"lesson_note{i}", lang)), t("lesson_on_model", lang).format(model=model or "?")]
    if f"lesson_models{i}" in EN:
        parts.append(figures.fill(t(f"lesson_models{i}", lang)))
    return "\n\n".join(parts)


def wire(buttons: list[gr.Button], tabs: gr.Tabs, parts: dict[str, dict], note_box: gr.Markdown, lang: gr.Radio,
         model: gr.Dropdown) -> None:
    """Connect lesson button i to LESSONS[i]: select the tab, show the lesson's note (in the page's language, for
    the model selected in `model`, the page's picker), set the inputs, then run the tab's action on that model."""
    assert len(buttons) == len(LESSONS), f"{len(buttons)} lesson buttons for {len(LESSONS)} lessons"
    for i, (button, lesson) in enumerate(zip(buttons, LESSONS), start=1):
        tab = parts[lesson.tab]
        names = list(dict.fromkeys([*lesson.settings, *(k for s in lesson.by_model.values() for k in s)]))
        missing = [k for k in names if k not in tab]
        assert not missing, f"tab {lesson.tab!r} has no components {missing}"
        targets = [tab[k] for k in names]

        def fill(choice, picked, _lesson=lesson, _names=names, _i=i):
            settings = _settings(_lesson, picked)
            values = [_value(settings[k], picked) if k in settings else gr.skip() for k in _names]
            return (gr.Tabs(selected=_lesson.tab), gr.Markdown(note(_i, lang_code(choice), picked), visible=True),
                    *values)

        event = button.click(fill, [lang, model], [tabs, note_box, *targets], api_visibility="private", queue=False)
        for action in (lesson.action,) if isinstance(lesson.action, str) else lesson.action or ():
            fn, inputs, outputs, concurrency_id = tab["actions"][action]
            event = event.then(model_task(fn, concurrency_id), inputs, outputs, api_visibility="private",
                               concurrency_id=concurrency_id, show_progress="full",
                               show_progress_on=tab.get("progress_on"))  # where the tab's own Run shows it
