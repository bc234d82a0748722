"""Every lesson button clicked in Chromium, on each bundled model and in both languages: the lesson opens its tab,
shows its note in the page's language for the picked model, runs to its end without an error toast, and no figure
of the tab it opened is left as the page's placeholder (each holds drawn marks, or says why it has none); a
screenshot per lesson, model and language.

It runs the nine lessons twice per model (about 4 minutes on SmolLM2 and 6 on Gemma 3 270M on a 2-core CPU), more
than CI's time budget holds beside the rest of the suite, so it runs when KVVIZ_BROWSER_LESSONS=1 (`make
browser-lessons`); CI asserts every lesson's claim through the API on SmolLM2 (tests/test_lessons_models.py) and
clicks lessons 5-8 in the browser on the tiny model (tests/test_browser.py). Screenshots go to $KVVIZ_SCREENSHOTS
when set, else to pytest's temporary directory.

Run: KVVIZ_BROWSER_LESSONS=1 python -m pytest tests/test_browser_lessons.py -q
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

pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} missing: apt-get install chromium"),
    pytest.mark.skipif(os.environ.get("KVVIZ_BROWSER_LESSONS") != "1",
                       reason="the browser lesson sweep takes ~10 minutes: KVVIZ_BROWSER_LESSONS=1 runs it"),
]
LESSON_TIMEOUT_S = 600
NOTE = {"en": "Lesson {i}", "ko": "레슨 {i}"}  # how each language's lesson note begins (kvviz/ui/i18n.py)

# JS: whether any event of the page is still running (a status tracker shows, not hidden), and for every plotly
# figure in the visible tab: its block's id, its drawn marks and its annotation text (a figure a lesson leaves
# without data on purpose says why, e.g. "no codebook" for a format without one; the page's placeholder says
# PLACEHOLDER).
_BUSY = """() => Array.from(document.querySelectorAll('.eta-bar, .progress-text, .meta-text, .meta-text-center'))
    .some(e => e.offsetParent !== null)"""
_MARKS = """(tab) => Array.from(document.querySelectorAll('#tab-' + tab + ' .js-plotly-plot'))
    .filter(p => p.offsetParent !== null)
    .map(p => [p.closest('[id]')?.id || '?',
               p.querySelectorAll('.trace path, .trace .point, .cartesianlayer image, .layer-below image').length,
               Array.from(p.querySelectorAll('.annotation-text')).map(a => a.textContent).join(' ')])"""
PLACEHOLDER = "Run the tab to draw this figure."  # kvviz.plots.empty_figure's default: a figure nothing drew yet


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
    page.get_by_label("한국어" if lang == "ko" else "English").check()
    page.locator("#kv-lang").wait_for()
    _idle(page)
    for i, lesson in enumerate(lessons.LESSONS, start=1):
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
        empty = [m for m in marks if m[1] == 0 and (not m[2] or PLACEHOLDER in m[2])]
        assert not empty, f"lesson {i} on {model} ({lang}): figures left empty {empty}"
        page.locator(f"#tab-{lesson.tab}").screenshot(path=str(shots / f"lesson{i}-{model}-{lang}.png"))
        print(f"lesson {i} on {model} ({lang}): {time.monotonic() - started:.1f} s, marks {[m[1] for m in marks]}")
    page.get_by_label("English").check()
