"""kvviz.ui.common: what every tab shares. The pieces live by concern and are re-exported here, so a tab imports
one module:

- kvviz.ui.picker: the model picker (`model_input`, `check_model`, `get_model`), the layer and head inputs sized to
  the picked model (`model_shape`, `layer_head_inputs`, `follow_model`) and the page header (`header_markdown`);
- kvviz.ui.wiring: named endpoints on the runtime (`on_click`, `model_task`, `on_compute_threads`), `user_errors`,
  the launch warm-up (`warm_up`, `start_warm_up`, `warming`), `concurrency`;
- kvviz.ui.uploads: `UploadFile`, `upload_path`;
- kvviz.ui.checks: `check_int`, `check_prompt`, `spec_list`, ...: the input checks at the UI boundary, raising
  ValueError with a sentence that says what to do.

Here: prompts and K/V captures (cached in the runtime, kvviz.runtime), tables, the library's scale warnings shown to
the user. What the app computes lives in the library (kvviz.shapes.fitting_plans is `fitting_specs` here).
"""

from __future__ import annotations

import gradio as gr
import pandas as pd

from kvviz import runtime
from kvviz.analysis.capture import capture_kv
from kvviz.cache import notes
from kvviz.shapes import fitting_plans as fitting_specs  # noqa: F401

from . import registry, zerogpu  # noqa: F401
from .checks import (MAX_PROMPT_CHARS, check_bool, check_choice, check_float, check_int,  # noqa: F401
                     check_language, check_names, check_prompt, check_spec, check_text, check_upload, single_specs,
                     spec_list)
from .i18n import t
from .picker import (DEFAULT_LAYER_FRACTION, DEFAULT_MODEL, backend_name, check_model, device_name,  # noqa: F401
                     follow_model, get_model, header_markdown, layer_head_inputs, layer_head_updates, model_choices,
                     model_input, model_layer_kinds, model_name, model_shape, warming)
from .uploads import UploadFile, upload_path  # noqa: F401
from .wiring import (WARMUP_PROMPT, concurrency, model_task, on_click, on_compute_threads, start_warm_up,  # noqa: F401
                     user_errors, warm_up)

MAX_FORMATS = 6  # columns the Compare tab shows side by side, baseline included


def table(rows: list[list], headers: list[str]):
    """A gr.Dataframe value: rows under headers (a pandas DataFrame, which the API returns as headers + data)."""
    return pd.DataFrame(rows, columns=headers)


# --- the library's scale warnings, shown to the user -----------------------------------------------------------


class ScaleNotes(notes.ScaleNotes):
    """kvviz.cache.notes.ScaleNotes, shown to the user: as a status paragraph and as pop-ups.

        notes = ScaleNotes()
        with notes.catching():
            ...                                # library calls
        status += notes.markdown()             # "**Warnings**: ..." lines, or ""
        notes.toast()                          # each line as a gr.Warning pop-up, once
    """

    def __init__(self) -> None:
        super().__init__()
        self._toasted: set[tuple[str, str]] = set()

    def markdown(self) -> str:
        """A "**Warnings**: ..." paragraph to append to a status line, or "" when nothing was warned."""
        lines = self.lines()
        return "\n\n**Warnings**: " + " ".join(lines) if lines else ""

    def toast(self) -> None:
        """Show each (problem, format) not shown yet as a gr.Warning pop-up."""
        for key, line in self._lines().items():
            if key not in self._toasted:
                self._toasted.add(key)
                gr.Warning(line.replace("`", ""))


# --- prompts and captures ------------------------------------------------------------------------------------

EXAMPLES = [
    "The capital of France is",
    ("A transformer's KV cache stores the keys and values of every past token, so the model does not recompute "
     "them at each step. For long contexts this cache, not the weights, is what fills the GPU."),
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "대한민국의 수도는 서울이고, 일본의 수도는",
]


def prompt_input(tr, example: int) -> gr.Textbox:
    """The prompt box every model tab opens with, prefilled with EXAMPLES[example], and the examples under it.

    `tr` is the tab's i18n Translator (it relabels the box when the language changes).
    """
    box = tr(gr.Textbox(EXAMPLES[example], lines=3, label=t("prompt"), placeholder=t("prompt_ph"),
                        max_length=MAX_PROMPT_CHARS),
             label="prompt", placeholder="prompt_ph")
    tr(gr.Examples(EXAMPLES, box, label=t("examples")).dataset, label="examples")
    return box


MAX_ANALYSIS_TOKENS = 512  # the K-outlier and error tabs look at one prompt; more tokens add little but time


def prompt_token_ids(tokenizer, prompt: str, limit: int) -> list[int]:
    """Token ids of the checked prompt; ValueError when it is not text, empty, over MAX_PROMPT_CHARS characters
    (checked first, so a huge text never reaches the tokenizer) or longer than `limit` tokens."""
    prompt = check_prompt(prompt)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"][0].tolist()
    if len(ids) > limit:
        raise ValueError(f"The prompt is {len(ids):,} tokens long; this view takes at most {limit:,} tokens. "
                         "Shorten it.")
    return ids


def capture(prompt, progress: gr.Progress | None = None, model: str | None = None):
    """K (pre/post RoPE), V and Q of every layer for `prompt` on `model` (a check_model name; None: the default),
    as a kvviz.analysis KVCapture, cached per (model, prompt) in the runtime (kvviz.runtime.Runtime.captures).

    The cache is keyed by the model and the prompt text alone: the same text gives the same capture to whoever
    asks, so it shares no user's result with another. Raises ValueError for an empty or too long prompt.
    """
    prompt = check_prompt(prompt)
    model = check_model(model)
    _, tok = get_model(progress, model)
    prompt_token_ids(tok, prompt, MAX_ANALYSIS_TOKENS)
    if progress is not None:
        progress(0.5, desc="Capturing K and V of every layer…")
    return runtime.current().captures.get_or_make(("capture", model, prompt), lambda: _capture(model, prompt))


def _capture(model: str, prompt: str):
    loaded, tok = get_model(model=model)
    return capture_kv(loaded, tok, prompt, max_tokens=MAX_ANALYSIS_TOKENS)


def check_layer_head(cap, layer, head) -> tuple[int, int]:
    """Layer and head as ints within the captured model's shape (ValueError naming the range otherwise)."""
    return (check_int(layer, "Layer", 0, cap.layers - 1), check_int(head, "KV head", 0, cap.kv_heads - 1))
