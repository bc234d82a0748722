"""kvviz.ui.i18n: the lookup of the playground's English and Korean strings, and the switch that relabels the page.

The strings live in `kvviz/ui/strings/`, one table per tab, merged into two flat dicts keyed alike (a test checks
that they are); `t(key, lang)` reads them. Tabs register each translatable component
with a `Translator` as they build it: `tr(gr.Button(t("run", "en")), value="run")`. The language radio's change
event then returns `tr.updates(lang)`, one `gr.update` per registered component, so switching language is one
round trip and touches no per-user state on the server.

Results follow the page's language too: the language radio (`Translator.language_input()`) is the last input of
every model endpoint, so an API caller may ask for Korean ("한국어") and gets English by default. Table headers,
figure titles, status lines and summaries are translated (`t("key", lang).format(...)`); format names, numbers and
the library's own error messages stay as they are. (Not a gr.State: a State makes every page hold a heartbeat
connection open.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import gradio as gr
import pandas as pd

from kvviz import plots

from .checks import LANGUAGES  # noqa: F401 (the radio's choices, kept beside the check of its value)
from .strings import EN, KO  # the tables, one module per tab

STRINGS = {"en": EN, "ko": KO}


def t(key: str, lang: str = "en") -> str:
    """The string for `key` in `lang` ("en" or "ko"); English when the language lacks it."""
    assert key in EN, f"unknown UI string key {key!r}"
    return STRINGS.get(lang, EN).get(key, EN[key])


def lang_code(choice: str | None) -> str:
    """Map the radio's choice ("English", "한국어") or a code ("ko") to a code; unknown means English."""
    if choice in LANGUAGES:
        return LANGUAGES[choice]
    return choice if choice in STRINGS else "en"


class Translator:
    """Remembers which component attribute shows which string key, to relabel them all on a language switch; and
    which components still show a placeholder value (a figure's "Run the tab to draw this figure.", a table's
    headers before its first run), to put them in the new language without touching a result."""

    def __init__(self) -> None:
        self._items: list[tuple[Any, dict[str, str | Callable[[str], Any]]]] = []
        self._placeholders: list[tuple[Any, Callable[[str], Any], Callable[[Any], bool]]] = []

    def __call__(self, component: Any, headers: Callable[[str], list[str]] | None = None,
                 **attr_keys: str | Callable[[str], Any]) -> Any:
        """Register `component`; attr_keys maps an attribute (label, value, info, placeholder) to a string key, or
        to a function of the language code (choices as (label, value) pairs: the labels follow the language, the
        values an API caller passes stay). headers (a gr.Dataframe's): its headers in a language code, shown while
        the table holds no rows."""
        for key in attr_keys.values():
            assert callable(key) or key in EN, f"unknown UI string key {key!r}"
        self._items.append((component, attr_keys))
        if headers is not None:
            self._placeholders.append((component, lambda lang: pd.DataFrame(columns=headers(lang)), _empty_table))
        return component

    def figure(self, component: Any) -> Any:
        """Register a gr.Plot: while it shows plots.empty_figure's placeholder, the placeholder follows the
        language."""
        self._placeholders.append((component, lambda lang: plots.empty_figure(t("empty_figure", lang)),
                                   _placeholder_figure))
        return component

    def language_input(self, radio: gr.Radio | None = None) -> gr.Radio:
        """The page's language radio, which callbacks take as their `lang` input. app.py registers its radio
        here; a tab built alone gets a hidden English one."""
        if radio is not None:
            self._language = radio
        elif getattr(self, "_language", None) is None:
            self._language = gr.Radio(list(LANGUAGES), value="English", label="Language", visible=False)
        return self._language

    @property
    def components(self) -> list[Any]:
        return [c for c, _ in self._items]

    def updates(self, lang: str) -> list[Any]:
        """One gr.update per registered component, in registration order, with every attribute in `lang`."""
        return [gr.update(**{attr: key(lang) if callable(key) else t(key, lang) for attr, key in keys.items()})
                for _, keys in self._items]

    @property
    def placeholders(self) -> list[Any]:
        """The components `placeholder_updates` takes and returns, in order."""
        return [c for c, _, _ in self._placeholders]

    def placeholder_updates(self, choice: str, *values: Any) -> list[Any]:
        """On a language switch (the radio's choice, then each placeholder component's value): each component
        still showing its placeholder gets it in the new language; the others (a result) are left as they are."""
        lang = lang_code(choice)
        return [make(lang) if empty(value) else gr.skip()
                for (_, make, empty), value in zip(self._placeholders, values)]


# A placeholder figure's JSON is a few kB; a drawn one can be megabytes: the browser sends back only the small ones
# (the language switch's `js`; a figure sent as null is a result, left alone). Tables are sent as they are.
PLACEHOLDER_JS = ("(choice, ...values) => [choice, ...values.map(v => (v && typeof v.plot === 'string' "
                  "&& v.plot.length > 20000) ? null : v)]")


def _placeholder_figure(value: Any) -> bool:
    """Whether a gr.Plot's value (PlotData, as callbacks get it) is plots.empty_figure's placeholder, in any of the
    page's languages."""
    try:
        fig = json.loads(value.plot)
    except (AttributeError, TypeError, ValueError):
        return False
    if not isinstance(fig, dict) or fig.get("data"):
        return False
    notes = fig.get("layout", {}).get("annotations") or []
    return len(notes) == 1 and notes[0].get("text") in {table["empty_figure"] for table in STRINGS.values()}


def _empty_table(value: Any) -> bool:
    """Whether a gr.Dataframe's value (a pandas DataFrame) holds no rows: the headers-only table before a run."""
    return value is None or len(value) == 0


def choice_from_request(request: gr.Request) -> str:
    """The language radio's starting value for this visitor: `?lang=ko` wins, else the browser's first language."""
    query = dict(request.query_params) if request is not None else {}
    if query.get("lang") in ("ko", "en"):
        return "한국어" if query["lang"] == "ko" else "English"
    accept = request.headers.get("accept-language", "") if request is not None else ""
    return "한국어" if accept.lower().startswith("ko") else "English"
