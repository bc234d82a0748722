"""kvviz.ui.strings: the playground's visible strings, one table per tab (English and Korean, keyed alike).

Each module holds `EN` and `KO` for its tab: `common` (the page around the tabs and strings several tabs share),
`lessons`, `compare` (with the accordions it holds: `engines`, `fused`, `rotation`), `outliers`, `errors`,
`memory`, `export`, `sensitivity`, `long_context`, `equal_bytes`. This package merges them into one table per language; a key lives
in exactly one module (checked here, at import). `kvviz.ui.i18n.t(key, lang)` is how callers read them.

The lesson notes quote measured figures through placeholders (`{smol[l8_kl_top]:.4f}`): the figures live in
`lesson_figures.json`, which `benchmarks/lessons_figures.py` writes from lesson runs (`figures`).
"""

from __future__ import annotations

from . import (common, compare, engines, equal_bytes, errors, export, fused, lessons, long_context, memory, outliers,
               rotation, sensitivity)

MODULES = (common, lessons, compare, engines, fused, rotation, outliers, errors, memory, export, sensitivity,
           long_context, equal_bytes)


def _merge(lang: str) -> dict[str, str]:
    merged: dict[str, str] = {}
    for module in MODULES:
        table = getattr(module, lang)
        twice = set(merged) & set(table)
        assert not twice, f"UI string keys in two tables ({module.__name__}): {sorted(twice)}"
        merged.update(table)
    return merged


EN: dict[str, str] = _merge("EN")
KO: dict[str, str] = _merge("KO")
