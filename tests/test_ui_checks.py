"""kvviz.ui.checks, directly: each check returns the value in the type the callback needs, and refuses wrong types,
missing values and out-of-range numbers with a sentence naming the field (the app test drives the same checks
through every endpoint: tests/test_app_api.py::test_every_endpoint_answers_typed_junk_with_a_message)."""

from __future__ import annotations

import pytest

from kvviz.formats import Plan
from kvviz.ui import checks


@pytest.mark.parametrize("value, expected", [(3, 3), (3.0, 3), (0, 0), (10, 10)])
def test_check_int_accepts_whole_numbers_in_range(value, expected):
    assert checks.check_int(value, "Layer", 0, 10) == expected and type(checks.check_int(value, "Layer", 0, 10)) is int


@pytest.mark.parametrize("value, message", [
    (None, "Layer is missing: give a whole number from 0 to 10."),
    ("3", "Layer must be a whole number from 0 to 10, got the text '3'."),
    (True, "Layer must be a whole number from 0 to 10, got true/false True."),
    (2.5, "got the number 2.5"), (-1, "got the number -1"), (11, "got the number 11"),
    (10**30, "got the number 1000000000000000000000000000000"), (float("nan"), "got the number nan"),
    ([1], "got the list [1]"),
])
def test_check_int_refuses(value, message):
    with pytest.raises(ValueError) as info:
        checks.check_int(value, "Layer", 0, 10)
    assert message in str(info.value)


def test_check_float_bool_text_choice():
    assert checks.check_float(2, "Params", 0, 5) == 2.0
    with pytest.raises(ValueError, match="Params must be a number from 0 to 5, got the number inf"):
        checks.check_float(float("inf"), "Params", 0, 5)
    assert checks.check_bool(None, "PPL") is False and checks.check_bool(True, "PPL") is True
    with pytest.raises(ValueError, match="PPL must be true or false"):
        checks.check_bool(1, "PPL")
    assert checks.check_text(None, "Model id") == "" and checks.check_text("  m ", "Model id") == "m"
    with pytest.raises(ValueError, match="Model id must be text, got the number 5"):
        checks.check_text(5, "Model id")
    with pytest.raises(ValueError, match="Model id is 11 characters long; the limit is 10"):
        checks.check_text("x" * 11, "Model id", max_chars=10)
    assert checks.check_choice("V", "Tensor", ["K", "V"]) == "V"
    with pytest.raises(ValueError, match="Tensor must be one of 'K', 'V'; got the text 'Q'"):
        checks.check_choice("Q", "Tensor", ["K", "V"])


def test_check_prompt_names_its_bound():
    assert checks.check_prompt("  hi ") == "hi"
    for empty in (None, "", "   "):
        with pytest.raises(ValueError, match="The prompt is empty"):
            checks.check_prompt(empty)
    with pytest.raises(ValueError, match="The prompt must be text, got the number 0"):
        checks.check_prompt(0)
    with pytest.raises(ValueError, match="The prompt is 20,001 characters long; the limit is 20,000 characters"):
        checks.check_prompt("x" * 20_001)


def test_names_and_specs():
    assert checks.check_names(None, "Formats") == [] and checks.check_names(["a", " ", "b"], "Formats") == ["a", "b"]
    with pytest.raises(ValueError, match=r"Formats must be a list of names such as \['int4'\], got the text 'int4'"):
        checks.check_names("int4", "Formats")
    with pytest.raises(ValueError, match="Formats must hold names \\(text\\), but holds the number 1"):
        checks.check_names(["int4", 1], "Formats")
    names = [p.name for p in checks.spec_list(["int4", "int8"], "k8v4; int4", limit=6)]
    assert names == ["int4", "int8", "k8v4"]  # deduplicated
    with pytest.raises(ValueError, match="3 formats chosen; compare at most 2"):
        checks.spec_list(["int4", "int8", "int2"], "", limit=2)
    with pytest.raises(ValueError, match="Unknown KV format 'int5'"):
        checks.check_spec("int5")


def test_spec_list_keeps_a_typed_plan_whole():
    """A line that assigns layers is one per-layer plan; ';' still separates plain specs on other lines. Each entry
    is parsed once into a kvviz.Plan that keeps the text as typed for its label."""
    typed = "int4; 0,27=fp16\nk8v4; int8\nk8v4;29=k=int8,v=int8"
    plans = checks.spec_list([], typed, limit=6)
    assert all(isinstance(p, Plan) for p in plans)
    assert [p.name for p in plans] == ["int4; 0,27=fp16", "k8v4", "int8", "k8v4;29=k=int8,v=int8"]
    assert [p.is_uniform for p in plans] == [False, True, True, False]
    same = checks.spec_list([], "int4;0,27=fp16\nint4 ;  0,27=fp16\nint4; 27=fp16; 0=fp16", limit=6)
    assert [p.name for p in same] == ["int4;0,27=fp16"]  # one plan, however it is spelled
    assert [p.name for p in checks.spec_list(["k8v4"], "k=int8,v=int4", limit=6)] == ["k8v4"]  # same K/V
    with pytest.raises(ValueError, match="Unknown KV format 'int5'"):
        checks.spec_list([], "int4; 3=int5", limit=6)
    assert [kv.spec for kv in plans[0].resolve(28)][:2] == ["fp16", "int4"]
    with pytest.raises(ValueError, match="layer 3 does not exist; this model has layers 0-2"):
        checks.spec_list([], "int4; 3=fp16", limit=6)[0].resolve(3)
    with pytest.raises(ValueError, match="Candidates are single specs; 'int4; 0=fp16' is a per-layer plan. Why"):
        checks.single_specs(checks.spec_list(["int8"], "int4; 0=fp16", limit=6), "Candidates", "Why")


def test_check_upload_reads_only_uploaded_files(tmp_path):
    root = tmp_path / "uploads"
    (root / "abc").mkdir(parents=True)
    inside = root / "abc" / "scales.json"
    inside.write_text("{}")
    outside = tmp_path / "secret.json"
    outside.write_text("{}")
    meta = {"_type": "gradio.FileData"}
    assert checks.check_upload({"path": str(inside), "meta": meta}, "Scale file", root) == inside.resolve()
    for bad, message in [(str(inside), "must be an uploaded file"), ({"path": str(inside)}, "must be an uploaded file"),
                         ({"path": str(outside), "meta": meta}, "is not one"),
                         ({"path": str(root / "abc" / ".." / ".." / "secret.json"), "meta": meta}, "is not one"),
                         (5, "got the number 5")]:
        with pytest.raises(ValueError, match=message):
            checks.check_upload(bad, "Scale file", root)


@pytest.mark.parametrize("value, expected", [(None, "en"), ("English", "en"), ("한국어", "ko"), ("ko", "ko")])
def test_check_language(value, expected):
    assert checks.check_language(value) == expected


@pytest.mark.parametrize("value", ["Korean", 3, ["en"]])
def test_check_language_refuses(value):
    with pytest.raises(ValueError, match="Language must be one of 'English', '한국어'"):
        checks.check_language(value)


@pytest.mark.parametrize("value, allow_any, expected", [
    ("a", False, "a"), (" b ", False, "b"), ("org/model-1.5B", True, "org/model-1.5B"), ("a", True, "a"),
])
def test_check_model_name_accepts_listed_models_and_hub_ids_when_allowed(value, allow_any, expected):
    assert checks.check_model_name(value, ["a", "b"], allow_any) == expected


@pytest.mark.parametrize("value, allow_any, message", [
    ("c", False, "Model must be one of 'a', 'b'; got the text 'c'"),
    ("org/model", False, "allow any hub id with KVVIZ_ALLOW_ANY_MODEL=1"),
    ("/etc/passwd", True, "or a Hugging Face hub id"),
    ("../../x", True, "or a Hugging Face hub id"),
    ("a/b/c", True, "or a Hugging Face hub id"),
    (3, True, "Model must be the name of a model (text): one of 'a', 'b'; got the number 3"),
    (None, False, "got nothing (null)"),
])
def test_check_model_name_refuses(value, allow_any, message):
    with pytest.raises(ValueError) as info:
        checks.check_model_name(value, ["a", "b"], allow_any)
    assert message in str(info.value)
