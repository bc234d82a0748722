"""kvviz.ui: the Gradio playground's tabs, one module each (compare, outliers, errors, sensitivity, memory,
export), plus the shared pieces (common: model, checks, errors; i18n: English and Korean; lessons: the eight
one-click lessons).

Each tab module has `build(tr) -> dict` (its components by name and its actions) and thin callbacks that call the
library; `app.build_demo()` assembles them. Nothing here runs at import.
"""
