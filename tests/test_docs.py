"""The docs against the code: the api_names that app.py's docstring, docs/DESIGN.md and the README's tab table list
are the app's own (read from the built page, as gradio_client sees them), and the spec grammar that spec.py, the
README and docs/ state is the one the parser takes, its /SCALE suffix naming spec.SCALE_SOURCES.
(tests/test_readme.py checks the README's own claims: format count, length, set-up commands, the Space.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvviz.formats import spec

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DESIGN = REPO / "docs" / "DESIGN.md"
APP = REPO / "app.py"


@pytest.fixture(scope="module")
def app_api_names() -> set[str]:
    """The named endpoints of the page app.py builds, as gradio_client's view_api lists them (without the '/')."""
    import app

    demo = app.build_demo()
    names = {n.lstrip("/") for n in demo.get_api_info()["named_endpoints"]}
    assert {"compare", "memory"} <= names, f"the built page exposes no usual endpoints: {sorted(names)}"
    return names


def _listed_in_app_docstring() -> set[str]:
    doc = re.search(r'^"""(.*?)"""', APP.read_text(encoding="utf-8"), re.S).group(1)
    listed = re.search(r"api_names \(for gradio_client\): (.*?)\.", doc, re.S)
    assert listed, "app.py's docstring should list the api_names: 'api_names (for gradio_client): a, b, ...'"
    return {n.strip() for n in listed.group(1).replace("\n", " ").split(",")}


def _listed_in_design() -> set[str]:
    listed = re.search(r"\*\*api_names\*\* \(gradio_client\): (.*?)[;(]", DESIGN.read_text(encoding="utf-8"), re.S)
    assert listed, "docs/DESIGN.md should list the api_names: '**api_names** (gradio_client): `a`, `b` ...;'"
    return set(re.findall(r"`(\w+)`", listed.group(1)))


def _listed_in_readme() -> set[str]:
    """The last column of the README's tab table (| tab | what it shows | api_name |)."""
    text = README.read_text(encoding="utf-8")
    table = re.search(r"^\| tab \| what it shows \| api_name \|\n\|[-|]+\|\n((?:\|.*\n)+)", text, re.M)
    assert table, "README.md should hold the app's tab table with an api_name column"
    return {n for row in table.group(1).splitlines() for n in re.findall(r"`(\w+)`", row.rsplit("|", 2)[-2])}


@pytest.mark.parametrize("where, listed", [("app.py's docstring", _listed_in_app_docstring),
                                           ("docs/DESIGN.md", _listed_in_design),
                                           ("README.md's tab table", _listed_in_readme)])
def test_listed_api_names_are_the_apps(app_api_names, where, listed):
    names = listed()
    assert names == app_api_names, (f"{where} lists api_names the app does not have: {sorted(names - app_api_names)}; "
                                    f"and leaves out: {sorted(app_api_names - names)}")


# --- the spec grammar ---------------------------------------------------------------------------------------------

_GRAMMAR = re.compile(r"`(BASE(?:\[/[^\]`]+\])+)`")


def _grammar_of(text: str) -> set[str]:
    return set(_GRAMMAR.findall(text))


def test_spec_docstring_states_the_scale_suffix():
    (grammar,) = _grammar_of(spec.__doc__)
    assert grammar.endswith("[/SCALE]"), f"spec.py's grammar should end with the scale source: {grammar}"
    assert "SCALE_SOURCES" in spec.__doc__


@pytest.mark.parametrize("page", [README, DESIGN, *sorted((REPO / "docs").glob("*.md")),
                                  REPO / "kvviz" / "formats" / "__init__.py"], ids=lambda p: p.name)
def test_every_page_states_spec_py_s_grammar(page):
    (want,) = _grammar_of(spec.__doc__)
    stated = _grammar_of(page.read_text(encoding="utf-8"))
    assert stated <= {want}, f"{page.relative_to(REPO)} states the spec grammar as {stated}; spec.py's is {want}"


def test_the_readme_names_every_scale_source_and_the_parser_takes_them():
    text = README.read_text(encoding="utf-8")
    line = next((p for p in text.split("\n\n") if "[/SCALE]" in p), None)
    assert line, "README.md should state the spec grammar with its [/SCALE] suffix"
    for source in spec.SCALE_SOURCES:
        assert f"`{source}`" in line, f"the README's grammar paragraph should name the scale source `{source}`"
        granularity = "token" if source == "dynamic" else "head"  # a head scale is fixed once written
        parsed = spec.parse_spec(f"fp8_e4m3/{granularity}/{source}")
        assert parsed.scale in (source, None), (source, parsed)
    shown = re.findall(r"\[/(\w+)\]", _GRAMMAR.search(line).group(1))
    assert shown == ["GRANULARITY", "gN", "asym", "rot", "SCALE"], shown
    # each optional part, in the order the grammar gives them, is taken by the parser
    parsed = spec.parse_spec(f"int4/{spec.GRANULARITIES[1]}/g32/asym/rot")
    assert (parsed.granularity, parsed.group, parsed.asym, parsed.rot) == ("channel", 32, True, True)
