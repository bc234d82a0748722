"""kvviz.ui.compare in-process on the tiny model: a plan typed in Compare with perplexity ticked runs (it once failed
with "Malformed pair spec": perplexity reparsed the plan with the pair parser), each typed spec is parsed from text
exactly once per request (kvviz.formats.as_plan at the boundary), and the Sensitivity tab's handover lines run in
Compare. The running app's side is tests/test_app_api.py.

Run: python -m pytest tests/test_ui_compare.py -q
"""

from __future__ import annotations

from collections import Counter
from unittest import mock

import pytest

from kvviz.formats import kv as kv_module
from kvviz.formats import plan as plan_module
from kvviz.ui import common, compare, sensitivity

PROMPT = "The capital of France is Paris, and the capital of Korea is"


@pytest.fixture(autouse=True)
def _env(use_runtime):
    # a runtime (and a pool) of their own: the page's pool is process-wide, and other tests expect it empty
    use_runtime(KVVIZ_MODEL="tiny-llama")


def _progress(*args, **kwargs):
    pass


def _last(gen):
    out = None
    for out in gen:
        pass
    return out


def test_compare_parses_each_typed_spec_once_and_measures_a_plans_perplexity():
    """One Compare request with a plan, plain specs and perplexity: every typed string goes through the text
    parser once; the pair parser never sees a plan; the plan's row gets its perplexity."""
    with mock.patch.object(plan_module, "_from_text", wraps=plan_module._from_text) as text_parser, \
            mock.patch.object(kv_module, "split_pair", wraps=kv_module.split_pair) as pair_parser:
        columns, table, _, status, _ = _last(compare.run(PROMPT, ["int4"], "int4; 1=fp16\nk8v4", 4, True,
                                                      "tiny-llama", progress=_progress))
    parsed = Counter(c.args[0] for c in text_parser.call_args_list)
    assert parsed == Counter({"int4": 1, "int4; 1=fp16": 1, "k8v4": 1}), parsed
    pairs = Counter(c.args[0] for c in pair_parser.call_args_list)
    assert not any(";" in text for text in pairs), pairs  # no plan reaches the pair parser
    assert pairs["k8v4"] == 1 and pairs["int4"] == 2, pairs  # the default of "int4" and of the plan
    rows = {r[0]: r for r in table.values.tolist()}
    assert list(rows)[1:] == ["int4", "int4; 1=fp16", "k8v4"]
    assert all(r[12] > 1 for r in rows.values()), rows  # perplexity, the plan's included
    assert rows["int4; 1=fp16"][1] == "int4; 1=fp16" and "Done in" in status


def test_the_sensitivity_tabs_handover_lines_run_in_compare():
    """The plan the search hands to Compare (with the uniform cheapest candidate) compares as typed."""
    _, picked, lines = sensitivity.to_compare("tiny-llama", "int4; 1=fp16", ["int4", "fp16"], "")
    assert picked == [] and lines == "int4; 1=fp16\nint4"
    _, table, _, _, _ = _last(compare.run(PROMPT, picked, lines, 3, False, "tiny-llama", progress=_progress))
    assert [r[0] for r in table.values.tolist()][1:] == ["int4; 1=fp16", "int4"]
