"""kvviz.ui.checks: the type and range checks every named endpoint applies to its arguments, at the boundary.

The app's named endpoints (`compare`, `needle`, `fused_speed`, `outliers`, `error_map`, `sensitivity`, `plan_search`, `memory`,
`export`, `check_scales`) are wired with `preprocess=False` (kvviz.ui.common.on_click), so what a caller sends
(JSON from gradio_client, or the page's own values) reaches these checks before anything else reads it. Each check takes the raw value and the field's
name as the user sees it, and returns the value in the type the callback needs, or raises ValueError with a
sentence naming the field, what it takes and what it got; `common.user_errors` turns that into a gr.Error.
So a number where a format is expected, a string where a list is, None, a huge number or a negative one all
come back as a message, never as "the app has not enabled verbose error reporting".

No gradio here: these are plain functions over JSON-like values, tested directly and through the running app
(tests/test_app_api.py::test_every_endpoint_answers_typed_junk_with_a_message).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from kvviz.formats import Plan, as_plan, assigns_layers

MAX_PROMPT_CHARS = 20_000  # checked before tokenizing: a megabyte of text would cost the tokenizer seconds
MAX_FIELD_CHARS = 4_000  # any other free-text field (custom formats, model id, one calibration prompt)
MAX_LIST_ITEMS = 64  # a list argument longer than any choice list the app offers
LANGUAGES = {"English": "en", "한국어": "ko"}  # the page's language radio: choice -> code (kvviz/ui/i18n.py)


def _shown(value) -> str:
    """How a bad value is quoted in a message: its type in words and a short repr."""
    kind = {bool: "true/false", int: "the number", float: "the number", str: "the text", list: "the list",
            tuple: "the list", dict: "an object"}.get(type(value), type(value).__name__)
    if value is None:
        return "nothing (null)"
    text = repr(value)
    return f"{kind} {text[:60] + '…' if len(text) > 60 else text}"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(value, what: str, lo: int, hi: int) -> int:
    """`value` as an int in [lo, hi] (a whole-valued float such as a slider's 24.0 counts); ValueError otherwise."""
    if value is None:
        raise ValueError(f"{what} is missing: give a whole number from {lo} to {hi}.")
    if not _is_number(value) or not math.isfinite(value) or not float(value).is_integer() or not lo <= value <= hi:
        raise ValueError(f"{what} must be a whole number from {lo} to {hi}, got {_shown(value)}.")
    return int(value)


def check_float(value, what: str, lo: float, hi: float) -> float:
    """`value` as a float in [lo, hi]; ValueError naming the field and the range otherwise."""
    if value is None:
        raise ValueError(f"{what} is missing: give a number from {lo:g} to {hi:g}.")
    if not _is_number(value) or not math.isfinite(value) or not lo <= value <= hi:
        raise ValueError(f"{what} must be a number from {lo:g} to {hi:g}, got {_shown(value)}.")
    return float(value)


def check_bool(value, what: str) -> bool:
    """`value` as a bool (a checkbox); None counts as unticked."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be true or false (a checkbox), got {_shown(value)}.")
    return value


def check_text(value, what: str, max_chars: int = MAX_FIELD_CHARS) -> str:
    """`value` as a stripped string ("" for None) of at most `max_chars` characters."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be text, got {_shown(value)}.")
    if len(value) > max_chars:
        raise ValueError(f"{what} is {len(value):,} characters long; the limit is {max_chars:,}. Shorten it.")
    return value.strip()


def check_prompt(prompt, max_chars: int = MAX_PROMPT_CHARS) -> str:
    """The prompt, stripped; ValueError when it is not text, empty, or over `max_chars` characters.
    (The token limit depends on the view and the tokenizer: common.prompt_token_ids checks it.)"""
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"The prompt must be text, got {_shown(prompt)}.")
    if prompt is not None and len(prompt) > max_chars:
        raise ValueError(f"The prompt is {len(prompt):,} characters long; the limit is {max_chars:,} characters. "
                         "Shorten it.")
    if not prompt or not prompt.strip():
        raise ValueError("The prompt is empty: type some text or pick one of the examples.")
    return prompt.strip()


def check_choice(value, what: str, choices: Iterable[str]) -> str:
    """`value`, which must be one of `choices` (a radio button or a fixed dropdown)."""
    choices = list(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, choices))}; got {_shown(value)}.")
    return value


def check_names(value, what: str, max_items: int = MAX_LIST_ITEMS) -> list[str]:
    """`value` as a list of non-empty strings (checkboxes); None is the empty list. A bare string is refused:
    it is one name where a list of names is expected."""
    if value is None:
        return []
    if isinstance(value, str):
        raise ValueError(f"{what} must be a list of names such as [{value!r}], got {_shown(value)}.")
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a list of names, got {_shown(value)}.")
    if len(value) > max_items:
        raise ValueError(f"{what} holds {len(value):,} items; the limit is {max_items}.")
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise ValueError(f"{what} must hold names (text), but holds {_shown(bad[0])}.")
    return [v.strip() for v in value if v.strip()]


def spec_list(chosen, custom, limit: int, what: str = "Formats") -> list[Plan]:
    """The K/V specs picked (checkboxes) plus those typed (one per line or ';'-separated), each parsed once into a
    kvviz.Plan (its name: the text as picked or typed), deduplicated by what they store.

    A typed line that assigns layers ("int4; 0,27=fp16": kvviz.formats.assigns_layers) is one per-layer plan,
    kept whole. An unknown format raises the registry's ValueError (which lists the valid names); the layers a
    plan names meet the model in Plan.resolve. Order: as picked, then as typed. More than `limit` distinct
    formats is refused.
    """
    items = check_names(chosen, what)
    for line in check_text(custom, f"{what} (typed)").splitlines():
        for spec in [line] if assigns_layers(line) else line.split(";"):
            if spec.strip():
                items.append(spec.strip())
    out = list(dict.fromkeys(as_plan(spec) for spec in items))  # equal plans: the first one written
    if len(out) > limit:
        raise ValueError(f"{len(out)} formats chosen; compare at most {limit} at once (untick some).")
    return out


def single_specs(plans: list[Plan], what: str, why: str) -> list[Plan]:
    """`plans` when each is one spec for every layer, keeping every token; else ValueError naming the first per-layer
    plan (and `why`) or eviction."""
    multi = next((p for p in plans if not p.is_uniform), None)
    if multi is not None:
        raise ValueError(f"{what} are single specs; {multi.name!r} is a per-layer plan. {why}")
    evicts = next((p for p in plans if p.evict is not None), None)
    if evicts is not None:  # these views store every token in the format: an eviction would be dropped unseen
        raise ValueError(f"{what} are single specs; {evicts.name!r} also evicts tokens (@ {evicts.evict.text}), "
                         f"which this view does not run. Drop '@ {evicts.evict.text}', or use Compare.")
    return plans


def check_language(value) -> str:
    """The language code ("en", "ko") of the page's language radio value (or a code); None means English."""
    if value is None:
        return "en"
    if value in ("en", "ko"):
        return value
    return LANGUAGES[check_choice(value, "Language", LANGUAGES)]


def check_spec(value, what: str = "Format") -> Plan:
    """One K/V spec for every layer, parsed once into a kvviz.Plan (its name: the text as given); ValueError listing
    the valid names for an unknown format, and for a per-layer plan."""
    spec = check_text(value, what, max_chars=200)
    if not spec:
        raise ValueError(f"{what} is empty: pick a KV format such as int4 or fp8_e4m3.")
    return single_specs([as_plan(spec)], what, "Pick one format for every layer, such as int4.")[0]


def check_upload(value, what: str, upload_root: Path) -> Path:
    """The path of a file the page uploaded: gradio's FileData object {"path": ..., "meta": {"_type":
    "gradio.FileData"}} whose file lies under `upload_root` (gradio's upload folder). Anything else, a bare path
    string included, is refused: the app reads only files uploaded to it."""
    if value is None:
        raise ValueError(f"{what}: upload a file first.")
    meta = value.get("meta") if isinstance(value, dict) else None
    path = value.get("path") if isinstance(value, dict) else None
    if not isinstance(meta, dict) or meta.get("_type") != "gradio.FileData" or not isinstance(path, str):
        raise ValueError(f"{what} must be an uploaded file (gradio_client.handle_file(path) from Python), "
                         f"got {_shown(value)}.")
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(upload_root.resolve()) or not resolved.is_file():
        raise ValueError(f"{what} must be a file uploaded to this app; {Path(path).name!r} is not one.")
    return resolved


def looks_like_hub_id(text: str) -> bool:
    """Whether `text` is spelled like a Hugging Face hub id, "owner/name" (no path tricks: no "..", no 3rd part)."""
    parts = text.split("/")
    return (len(parts) == 2 and all(p and p[0].isalnum() and all(c.isalnum() or c in "-_." for c in p) for p in parts)
            and ".." not in text)


def check_model_name(value, choices: Iterable[str], allow_any: bool) -> str:
    """The model a caller picked: one of `choices`, or any hub id ("owner/name") when `allow_any`.

    A local path is never accepted from a caller (only the Space owner lists local directories, in KVVIZ_MODELS).
    """
    choices = list(choices)
    listed = ", ".join(map(repr, choices))
    if not isinstance(value, str):
        raise ValueError(f"Model must be the name of a model (text): one of {listed}; got {_shown(value)}.")
    name = value.strip()
    if name in choices:
        return name
    if allow_any:
        if looks_like_hub_id(name):
            return name
        raise ValueError(f"Model must be one of {listed} or a Hugging Face hub id such as "
                         f"'HuggingFaceTB/SmolLM2-360M-Instruct'; got {_shown(value)}.")
    raise ValueError(f"Model must be one of {listed}; got {_shown(value)}. This app serves only these models (its "
                     "owner may list more in KVVIZ_MODELS, or allow any hub id with KVVIZ_ALLOW_ANY_MODEL=1).")
