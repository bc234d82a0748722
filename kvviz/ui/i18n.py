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

from typing import Any

import gradio as gr

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
    """Remembers which component attribute shows which string key, to relabel them all on a language switch."""

    def __init__(self) -> None:
        self._items: list[tuple[Any, dict[str, str]]] = []

    def __call__(self, component: Any, **attr_keys: str) -> Any:
        """Register `component`; attr_keys maps an attribute (label, value, info, placeholder) to a string key."""
        for key in attr_keys.values():
            assert key in EN, f"unknown UI string key {key!r}"
        self._items.append((component, attr_keys))
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
        return [gr.update(**{attr: t(key, lang) for attr, key in keys.items()}) for _, keys in self._items]


def choice_from_request(request: gr.Request) -> str:
    """The language radio's starting value for this visitor: `?lang=ko` wins, else the browser's first language."""
    query = dict(request.query_params) if request is not None else {}
    if query.get("lang") in ("ko", "en"):
        return "한국어" if query["lang"] == "ko" else "English"
    accept = request.headers.get("accept-language", "") if request is not None else ""
    return "한국어" if accept.lower().startswith("ko") else "English"
