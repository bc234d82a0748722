"""Every lesson button clicked in Chromium, on each bundled model and in both languages: the lesson opens its tab,
shows its note in the page's language for the picked model, runs to its end without an error toast, and no figure
of the tab it opened is left as the page's placeholder (each holds drawn marks, or says why it has none); a
screenshot per lesson, model and language.

Then the two views of the long-context and equal-bytes questions run as a visitor first meets them: each tab's own
Run button with its default settings (Long context: 4,096 tokens, int4, k8v4 and mxfp4; Equal bytes: a quarter of the
16-bit cache of 256 tokens, the needle at five depths), per model and language: the status says done in the page's
language, the table holds rows, no error toast, every figure drawn.

It runs the lessons twice per model (about 4 minutes on SmolLM2 and 6 on Gemma 3 270M on a 2-core CPU), more
than CI's time budget holds beside the rest of the suite, so it runs when KVVIZ_BROWSER_LESSONS=1 (`make
browser-lessons`); CI asserts every lesson's claim through the API on SmolLM2 (tests/test_lessons_models.py) and
clicks lessons 5-8 in the browser on the tiny model (tests/test_browser.py). Screenshots go to $KVVIZ_SCREENSHOTS
when set, else to pytest's temporary directory.

Run: KVVIZ_BROWSER_LESSONS=1 python -m pytest tests/test_browser_lessons.py -q
(KVVIZ_LESSONS=10,11 clicks those lessons only; -k "gemma and equal_bytes" picks a model and a view.)
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from app_server import CHROMIUM, browser_page, screenshot_dir, serve_app
from kvviz.models import BUNDLED, bundled_installed
from kvviz.ui import lessons
from kvviz.ui.strings import common

pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} missing: apt-get install chromium"),
    pytest.mark.skipif(os.environ.get("KVVIZ_BROWSER_LESSONS") not in ("1", "views"),
                       reason="the browser lesson sweep takes ~20 minutes: KVVIZ_BROWSER_LESSONS=1 runs it (=views: the views only)"),
]
LESSON_TIMEOUT_S = 600
NOTE = {"en": "Lesson {i}", "ko": "레슨 {i}"}  # how each language's lesson note begins (kvviz/ui/i18n.py)

# JS: whether any event of the page is still running (a status tracker shows, or streams: `generating`), and for
# every plotly figure in the visible tab: its block's id, its drawn marks and its annotation text (a figure a lesson
# leaves without data on purpose says why, e.g. "no codebook" for a format without one; the page's placeholder says
# one of PLACEHOLDERS).
_BUSY = """() => Array.from(document.querySelectorAll(
        '.eta-bar, .progress-text, .meta-text, .meta-text-center, [data-testid=status-tracker].generating'))
    .some(e => e.offsetParent !== null)"""
_MARKS = """(tab) => Array.from(document.querySelectorAll('#tab-' + tab + ' .js-plotly-plot'))
    .filter(p => p.offsetParent !== null)
    .map(p => [p.closest('[id]')?.id || '?',
               p.querySelectorAll('.trace path, .trace .point, .cartesianlayer image, .layer-below image').length,
               Array.from(p.querySelectorAll('.annotation-text')).map(a => a.textContent).join(' ')])"""
# a figure nothing drew yet says this, in the page's language (kvviz.plots.empty_figure, kvviz/ui/strings)
PLACEHOLDERS = (common.EN["empty_figure"], common.KO["empty_figure"])


@pytest.fixture(scope="module", params=[m for m in BUNDLED])
def model(request) -> str:
    if not bundled_installed(request.param):
        pytest.skip(f"{request.param} is not installed ({BUNDLED[request.param].install})")
    return request.param


@pytest.fixture(scope="module")
def server(model):
    with serve_app(model=model) as srv:
        yield srv


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return screenshot_dir(tmp_path_factory, "lesson-screenshots")


@pytest.fixture(scope="module")
def page(server):
    with browser_page(server.url, "#lesson-1") as pg:
        yield pg


def _lessons() -> list[tuple[int, lessons.Lesson]]:
    """(number, lesson) of every lesson, or of those KVVIZ_LESSONS names (a comma list of numbers)."""
    every = list(enumerate(lessons.LESSONS, start=1))
    chosen = os.environ.get("KVVIZ_LESSONS", "").strip()
    if not chosen:
        return every
    numbers = {int(n) for n in chosen.split(",") if n.strip()}
    unknown = numbers - {i for i, _ in every}
    assert not unknown, f"KVVIZ_LESSONS={chosen}: no lesson {sorted(unknown)}; there are 1 to {len(every)}"
    return [(i, lesson) for i, lesson in every if i in numbers]


def _idle(page, quiet_s: float = 3.0) -> None:
    """Wait until no event has run for quiet_s seconds (a lesson chains its fill and its actions)."""
    deadline, since = time.monotonic() + LESSON_TIMEOUT_S, None
    while time.monotonic() < deadline:
        if page.evaluate(_BUSY):
            since = None
        elif since is None:
            since = time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.25)
    raise AssertionError(f"the lesson still ran after {LESSON_TIMEOUT_S} s")


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_every_lesson_button_runs_and_draws(page, server, shots, model, lang):
    if os.environ.get("KVVIZ_BROWSER_LESSONS") == "views":
        pytest.skip("KVVIZ_BROWSER_LESSONS=views: the views only")
    page.get_by_label("한국어" if lang == "ko" else "English").check()
    page.locator("#kv-lang").wait_for()
    _idle(page)
    for i, lesson in _lessons():
        started = time.monotonic()
        page.locator(f"#lesson-{i}").click()
        page.locator(f"#tab-{lesson.tab}").wait_for(state="visible", timeout=30_000)
        page.wait_for_function("([text, model]) => { const n = document.querySelector('#kv-lesson-note'); "
                               "return n && n.innerText.includes(text) && n.innerText.includes(model); }",
                               arg=[NOTE[lang].format(i=i), model], timeout=30_000)
        time.sleep(1.0)  # the fill event hands over to the lesson's actions
        _idle(page)
        errors = [t.strip() for t in page.locator(".toast-body.error").all_inner_texts()]
        assert not errors, f"lesson {i} on {model} ({lang}): {errors}\n{server.log_tail()}"
        marks = page.evaluate(_MARKS, lesson.tab)
        empty = [m for m in marks if m[1] == 0 and (not m[2] or any(p in m[2] for p in PLACEHOLDERS))]
        assert not empty, f"lesson {i} on {model} ({lang}): figures left empty {empty}"
        page.locator(f"#tab-{lesson.tab}").screenshot(path=str(shots / f"lesson{i}-{model}-{lang}.png"))
        print(f"lesson {i} on {model} ({lang}): {time.monotonic() - started:.1f} s, marks {[m[1] for m in marks]}")
    page.get_by_label("English").check()


DONE = {"en": "Done in", "ko": "완료"}  # how each language's status of a finished run reads (kvviz/ui/strings)


@pytest.mark.parametrize("lang", ["en", "ko"])
@pytest.mark.parametrize("tab", ["long_context", "equal_bytes"])
def test_the_views_run_their_defaults(page, server, shots, model, lang, tab):
    """The tab's Run button with the tab's own defaults, as a visitor first clicks it: on a fresh page, so no
    lesson clicked before has left its settings in the tab."""
    page.reload(wait_until="networkidle")
    page.wait_for_selector("#lesson-1", timeout=30_000)
    page.get_by_label("한국어" if lang == "ko" else "English").check()
    page.locator("#kv-lang").wait_for()
    _idle(page)
    started = time.monotonic()
    page.locator(f"#tab-{tab}-button").click()
    page.locator(f"#tab-{tab}").wait_for(state="visible", timeout=30_000)
    _idle(page)
    page.locator(f"#{tab}-run").click()
    page.wait_for_function("([id, text]) => (document.querySelector(id)?.innerText || '').includes(text)",
                           arg=[f"#{tab}-status", DONE[lang]], timeout=LESSON_TIMEOUT_S * 1000)
    _idle(page)
    errors = [t.strip() for t in page.locator(".toast-body.error").all_inner_texts()]
    assert not errors, f"{tab} on {model} ({lang}): {errors}\n{server.log_tail()}"
    table = page.locator(f"#{tab}-table").inner_text()
    rows = len([line for line in table.splitlines() if line.strip()])  # the header, then one line per row
    assert rows >= 4 and "int4" in table, f"{tab} on {model} ({lang}): the table reads {table[:300]!r}"
    marks = page.evaluate(_MARKS, tab)
    empty = [m for m in marks if m[1] == 0 and (not m[2] or any(p in m[2] for p in PLACEHOLDERS))]
    assert not empty, f"{tab} on {model} ({lang}): figures left empty {empty}"
    status = page.locator(f"#{tab}-status").inner_text()
    page.locator(f"#tab-{tab}").screenshot(path=str(shots / f"{tab}-{model}-{lang}.png"))
    print(f"{tab} on {model} ({lang}): {time.monotonic() - started:.1f} s, {rows} rows, marks {[m[1] for m in marks]};"
          f" {status[:160]}")
    page.get_by_label("English").check()
