"""Every table of the page shows its real columns before the first run: a gr.Dataframe without headers shows
gradio's placeholder columns "1 2 3" until a run fills it."""

from __future__ import annotations

import gradio as gr
import pandas as pd
import pytest

from kvviz.ui import memory
from kvviz.ui.i18n import Translator


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def tables(monkeypatch_module) -> list[gr.Dataframe]:
    monkeypatch_module.setenv("KVVIZ_MODEL", "tiny-llama")
    import app
    from kvviz import runtime

    monkeypatch_module.setattr(runtime, "_default", runtime.default())  # build_demo installs the app's: undone

    demo = app.build_demo()
    return [b for b in demo.blocks.values() if isinstance(b, gr.Dataframe)]


def test_every_table_has_its_headers_before_the_first_run(tables):
    assert len(tables) >= 9  # Compare (metrics, fused, engine, rotation), Sensitivity (2), Memory (2), Export
    for df in tables:
        headers = df.value["headers"]
        assert headers and not any(str(h).isdigit() for h in headers), (df.label, headers)
        assert headers[0] in ("format", "cache", "layer", "step", "layer kind", "spec"), (df.label, headers)


def test_memory_tables_start_with_the_columns_their_default_run_returns():
    with gr.Blocks():
        c = memory.build(Translator())
    _, fit, _, breakdown = memory.run(*[comp.value for comp in c["inputs"]])
    for component, returned in ((c["table"], fit), (c["breakdown"], breakdown)):
        assert isinstance(returned, pd.DataFrame)
        assert component.value["headers"] == list(returned.columns)
