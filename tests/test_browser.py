"""Browser test: the app in Debian's Chromium (Playwright), every tab run as a user would, every plot drawn.

Opens the app (served by `python app.py`, tiny model by default), then for each tab: opens it, clicks its Run
button, waits until every plotly figure in the tab has traces drawn in the DOM, checks that no error toast shows,
and saves a screenshot. Also switches the page to Korean and back, and runs one lesson button.

Screenshots go to $KVVIZ_SCREENSHOTS when set (`make screenshots` sets it to assets/ and uses the real model),
else to pytest's temporary directory, so CI never rewrites tracked files. $KVVIZ_TEST_MODEL picks the model
(default tiny-llama).

Run: python -m pytest tests/test_browser.py -q       (needs /usr/bin/chromium: `apt-get install -y chromium`)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from app_server import CHROMIUM, browser_page, screenshot_dir, serve_app

from kvviz.ui.lessons import LESSONS

playwright_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} missing: apt-get install chromium")

MODEL = os.environ.get("KVVIZ_TEST_MODEL", "tiny-llama")
OTHER_MODEL = "tiny-qwen3"  # a second model to pick in the page
# A real model's first call converts and loads it (~1 min on a 2-core CPU); the tiny one answers at once.
RUN_TIMEOUT_MS = 60_000 if MODEL.startswith("tiny-") else 900_000
MAX_SCREENSHOT_BYTES = 300_000
TABS = ("compare", "outliers", "errors", "memory", "export")
# The text output each tab's run writes last, and a string it holds once the run has ended: waiting for it, rather
# than for a fixed time, is what makes "the run is over" hold on a slow machine too (figures can draw first).
DONE = {"compare": [("#compare-status", "Done in"), ("#compare-needle-status", "Retrieved")],
        "outliers": [("#outliers-summary", "Outlier channels")], "errors": [("#errors-summary", "Mean over layers")],
        "memory": [("#memory-formula", "GB")], "export": [("#export-commands", "vLLM")]}

# JS: for every plotly figure inside `root`, how many drawn marks (bars, lines, points, heatmap images) it holds.
_COUNT_MARKS = """(root) => Array.from(root.querySelectorAll('.js-plotly-plot')).map(p =>
    p.querySelectorAll('.trace path, .trace .point, .cartesianlayer image, .layer-below image').length)"""


@pytest.fixture(scope="module")
def server():
    with serve_app(model=MODEL, KVVIZ_MODELS=OTHER_MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return screenshot_dir(tmp_path_factory, "screenshots")


@pytest.fixture(scope="module")
def page(server):
    with browser_page(server.url, "#tab-memory-button, [role=tab]") as pg:
        yield pg


@pytest.fixture(autouse=True)
def _no_stale_toasts(request):
    """Each test starts without the toasts an earlier one left (they stay up for 10 s)."""
    if "page" in request.fixturenames:
        _close_toasts(request.getfixturevalue("page"))
    yield


def _close_toasts(page) -> None:
    """Close every toast and wait until they have left the DOM: a closed toast fades out for a moment and is
    still matched by `.toast-body` until its animation ends, so asserting right after the click races it."""
    for close in page.locator(".toast-close").all():
        if close.is_visible():
            close.click()
    page.wait_for_function("() => document.querySelectorAll('.toast-body').length === 0", timeout=20_000)


def _open_tab(page, tab: str) -> None:
    page.locator(f"#tab-{tab}-button").click()
    page.locator(f"#tab-{tab}").wait_for(state="visible")


def _error_toasts(page) -> list[str]:
    return [t.strip() for t in page.locator(".toast-body.error").all_inner_texts()]


def _wait_for_plots(page, tab: str, server) -> list[int]:
    root = page.locator(f"#tab-{tab}")
    try:
        page.wait_for_function(f"""() => {{
            const root = document.querySelector('#tab-{tab}');
            const counts = ({_COUNT_MARKS})(root);
            return (counts.length > 0 && counts.every(n => n > 0)) || document.querySelector('.toast-body.error');
        }}""", timeout=RUN_TIMEOUT_MS)
    except playwright_api.TimeoutError:
        raise AssertionError(f"{tab}: plots never drew data; marks per plot {root.evaluate(_COUNT_MARKS)}; "
                             f"error toasts {_error_toasts(page)}\nserver log:\n{server.log_tail()}") from None
    assert not _error_toasts(page), f"{tab}: error shown: {_error_toasts(page)}"
    return root.evaluate(_COUNT_MARKS)


def _wait_for_text(page, selector: str, text: str) -> None:
    """Wait until the element `selector` shows `text` (an output the queue delivers when its event ends)."""
    page.wait_for_function("([sel, text]) => (document.querySelector(sel)?.innerText || '').includes(text)",
                           arg=[selector, text], timeout=RUN_TIMEOUT_MS)


def _screenshot(page, shots: Path, name: str) -> Path:
    """The whole tab (header and lesson buttons above it left out), as a PNG reduced to a 256-colour palette so
    it stays well under MAX_SCREENSHOT_BYTES."""
    from PIL import Image

    path = shots / f"screenshot-{name}.png"
    page.locator(f"#tab-{name}").screenshot(path=str(path))
    Image.open(path).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path


@pytest.mark.parametrize("tab", TABS)
def test_tab_runs_and_draws(page, server, shots, tab):
    _open_tab(page, tab)
    if tab == "compare":  # add per-tensor int4: it loses needles that per-token int4 still finds (lesson 5)
        page.locator("#compare-custom textarea").fill("int4/tensor")
    page.locator(f"#{tab}-run").click()
    if tab == "compare":  # the needle chart sits in a closed accordion: open it and run the test too
        page.locator("#compare-needle").get_by_text("Needle in a haystack").click()
        page.locator("#compare-needle-run").click()
    counts = _wait_for_plots(page, tab, server)
    assert all(n > 0 for n in counts), f"{tab}: a plot without data: {counts}"
    for selector, text in DONE[tab]:  # the run's last outputs have arrived: nothing is still on its way
        _wait_for_text(page, selector, text)
    assert not _error_toasts(page), f"{tab}: error shown: {_error_toasts(page)}"
    path = _screenshot(page, shots, tab)
    assert 0 < path.stat().st_size < MAX_SCREENSHOT_BYTES, f"{path} is {path.stat().st_size} bytes"


def test_bad_input_shows_an_error_and_the_app_keeps_serving(page, server):
    _open_tab(page, "memory")
    custom = page.locator("#memory-custom textarea")
    custom.fill("int5")
    page.locator("#memory-run").click()
    page.locator(".toast-body.error").first.wait_for(timeout=20_000)
    assert any("Unknown KV format 'int5'" in t for t in _error_toasts(page)), _error_toasts(page)
    _close_toasts(page)
    custom.fill("int4/g8")
    page.locator("#memory-run").click()
    page.wait_for_function("() => document.querySelector('#memory-formula').innerText.includes('int4/g8')",
                           timeout=RUN_TIMEOUT_MS)
    assert not _error_toasts(page)


def test_compare_a_plan_with_perplexity(page, server):
    """A plan typed in Compare with perplexity ticked: it once failed after the whole run with "Malformed pair spec"
    (perplexity parsed the plan again with the pair parser). The table gains a perplexity column, the plan's row
    with it, and no error shows."""
    _open_tab(page, "compare")
    custom = page.locator("#compare-custom textarea")
    custom.fill("int4; 1=fp16")
    ppl = page.locator("#tab-compare").get_by_label("Also measure perplexity", exact=False)
    ppl.check()
    page.locator("#compare-run").click()
    page.wait_for_function("""() => document.querySelector('.toast-body.error') ||
        Array.from(document.querySelectorAll('#tab-compare th')).some(th => th.innerText.includes('perplexity'))""",
                           timeout=RUN_TIMEOUT_MS)
    assert not _error_toasts(page), _error_toasts(page)
    _wait_for_text(page, "#compare-status", "Done in")
    _wait_for_text(page, "#compare-table", "int4; 1=fp16")  # the plan's row, with its perplexity
    ppl.uncheck()
    custom.fill("")


def test_language_switch_relabels_the_page(page):
    page.get_by_label("한국어").check()
    page.get_by_role("tab", name="메모리").wait_for(timeout=10_000)
    page.get_by_label("English").check()
    page.get_by_role("tab", name="Memory").wait_for(timeout=10_000)


def test_lesson_button_opens_its_tab_and_runs(page, server):
    page.locator("#lesson-6").click()
    page.locator("#tab-memory").wait_for(state="visible")
    _wait_for_text(page, "#kv-lesson-note", "Lesson 6")
    # the memory plots are drawn already (an earlier test ran the tab): wait for this lesson's own formats, which
    # no earlier run used, instead of for plots that may be the previous run's
    _wait_for_text(page, "#memory-formula", "int2/g8")
    _wait_for_plots(page, "memory", server)
    assert "int4/g16" in page.locator("#memory-formula").inner_text()


def test_needle_lesson_opens_the_needle_chart(page, server):
    page.locator("#lesson-5").click()
    page.locator("#compare-needle-run").wait_for(state="visible", timeout=10_000)  # the accordion opened
    page.wait_for_function("() => /int4\\/tensor \\d+% \\(\\d+\\/15\\)/.test("
                           "document.querySelector('#compare-needle-status').innerText)",
                           timeout=RUN_TIMEOUT_MS)  # the lesson's own run: three needles at each of five depths
    status = page.locator("#compare-needle-status").inner_text()
    assert "3 needles at each of 5 depths" in status and "int4/tensor" in status, status
    assert not _error_toasts(page)


def _pick_model(page, tab: str, name: str) -> None:
    page.locator(f"#tab-{tab} .kv-model input").click()
    page.get_by_role("option", name=name, exact=True).click()


def test_switching_models_changes_the_header_the_other_tabs_and_the_result(page, server):
    _open_tab(page, "outliers")
    _pick_model(page, "outliers", OTHER_MODEL)
    _wait_for_text(page, "#kv-header", f"{OTHER_MODEL} (")
    _open_tab(page, "errors")  # picking in one tab picks in all
    assert page.locator("#tab-errors .kv-model input").input_value() == OTHER_MODEL
    _open_tab(page, "outliers")
    page.locator("#outliers-run").click()
    _wait_for_text(page, "#outliers-summary", OTHER_MODEL)
    _wait_for_text(page, "#kv-header", OTHER_MODEL)
    page.get_by_label("한국어").check()  # results follow the page's language
    page.get_by_role("tab", name="메모리").wait_for(timeout=10_000)
    page.locator("#outliers-run").click()
    _wait_for_text(page, "#outliers-summary", "이상치 채널")
    assert OTHER_MODEL in page.locator("#outliers-summary").inner_text()
    page.get_by_label("English").check()
    _pick_model(page, "outliers", MODEL)  # the other tests run on the default model
    _wait_for_text(page, "#kv-header", f"{MODEL} (")
    assert not _error_toasts(page)


def test_sensitivity_tab_measures_and_finds_a_plan(page, server, shots):
    """The Sensitivity tab on a short prompt: the map and the ranking draw, then the plan search draws its curve
    and names a plan, which the Memory button hands over to the Memory tab."""
    _open_tab(page, "sensitivity")
    page.locator("#tab-sensitivity").get_by_label("prompt", exact=True).check()
    page.locator("#sensitivity-run").click()
    _wait_for_text(page, "#sensitivity-summary", "The worst")
    page.locator("#sensitivity-plan-run").click()
    _wait_for_text(page, "#sensitivity-plan-summary", "Searched in")
    counts = _wait_for_plots(page, "sensitivity", server)
    assert len(counts) == 3 and all(n > 0 for n in counts), counts
    plan = page.locator("#sensitivity-plan textarea").input_value()
    assert plan and plan in page.locator("#sensitivity-plan-summary").inner_text()
    _screenshot(page, shots, "sensitivity")
    page.locator("#sensitivity-to-memory").click()
    page.locator("#tab-memory").wait_for(state="visible")
    assert page.locator("#memory-custom textarea").input_value().splitlines()[0] == plan
    _open_tab(page, "sensitivity")
    page.locator("#sensitivity-to-compare").click()
    page.locator("#tab-compare").wait_for(state="visible")
    assert page.locator("#compare-custom textarea").input_value().splitlines()[0] == plan
    assert not _error_toasts(page)


def test_sensitivity_lesson_runs_the_map_and_the_plan_search(page, server):
    page.locator("#lesson-8").click()
    page.locator("#tab-sensitivity").wait_for(state="visible")
    _wait_for_text(page, "#kv-lesson-note", "Lesson 8")
    tokens = LESSONS[7].settings["tokens"]  # the lesson's window
    _wait_for_text(page, "#sensitivity-summary", f"vllm:int4_per_token_head, {tokens} tokens")
    _wait_for_text(page, "#sensitivity-plan-summary", "budget 0.03")  # then its own plan search
    assert not _error_toasts(page)


def test_fused_lesson_times_fused_against_unfused(page, server):
    """Lesson 7 opens the Compare tab's fused view, fills int4 and k8v4 and runs it: the table holds DynamicCache
    and both formats fused and unfused, and both bar panels draw."""
    page.locator("#lesson-7").click()
    page.locator("#compare-fused-run").wait_for(state="visible", timeout=10_000)  # the accordion opened
    _wait_for_text(page, "#kv-lesson-note", "Lesson 7")
    _wait_for_text(page, "#compare-fused-status", "Done in")
    status = page.locator("#compare-fused-status").inner_text()
    assert "`int4`, `k8v4`" in status.replace("\n", " ") or "int4, k8v4" in status, status
    _wait_for_text(page, "#compare-fused-table", "unfused: dequantize")
    box = page.locator("#compare-fused")
    cells = page.locator("#compare-fused-table").inner_text()
    assert cells.count("fused: the cpu kernel") == 2 and cells.count("unfused: dequantize") == 2, cells
    marks = box.evaluate(_COUNT_MARKS)
    assert marks and all(n > 0 for n in marks), marks
    assert not _error_toasts(page)


# JS: [min, max, value, disabled] of each slider's range input inside `root`.
_RANGES = """(root) => Array.from(root.querySelectorAll('input[type=range]')).map(e => [e.min, e.max, e.value,
    e.disabled])"""


def test_sliders_follow_the_picked_models_layers_and_kv_heads(page, server, shots):
    """Gemma 3 270M (18 layers, one KV head), picked but not loaded: the layer slider becomes 0-17 and the head
    slider is held at 0, in the tab where it was picked and in the other; back on the default model they follow
    again. Gemma used to keep the previous model's sliders: gradio refused its 0..0 head slider."""
    _open_tab(page, "outliers")
    _pick_model(page, "outliers", "gemma-3-270m")
    _wait_for_text(page, "#kv-header", "gemma-3-270m (")
    for tab in ("outliers", "errors"):
        _open_tab(page, tab)
        page.wait_for_function(f"() => ({_RANGES})(document.querySelector('#tab-{tab}'))[0]?.[1] === '17'",
                               timeout=20_000)
        (_, layer_max, _, _), (_, _, head, head_locked) = page.locator(f"#tab-{tab}").evaluate(_RANGES)[:2]
        assert layer_max == "17" and head == "0" and head_locked, page.locator(f"#tab-{tab}").evaluate(_RANGES)
    page.locator("#tab-errors").screenshot(path=str(shots / "screenshot-errors-gemma-sliders.png"))
    _open_tab(page, "outliers")
    _pick_model(page, "outliers", MODEL)  # the other tests run on the default model
    _wait_for_text(page, "#kv-header", f"{MODEL} (")
    page.wait_for_function("() => (" + _RANGES + ")(document.querySelector('#tab-outliers'))[0]?.[1] !== '17'",
                           timeout=20_000)
    assert not _error_toasts(page)


def test_format_anatomy_shows_one_token_through_a_format(page, server, shots):
    """The Quantization error tab's anatomy: int4 then vLLM's TurboQuant (the rotated-coordinate histogram draws),
    then the same in Korean."""
    _open_tab(page, "errors")
    page.locator("#errors-anatomy").get_by_text("Format anatomy").click()
    page.locator("#errors-anatomy-run").click()
    _wait_for_text(page, "#errors-anatomy-summary", "bits per value")
    assert "Step by step" in page.locator("#errors-anatomy-summary").inner_text()
    box = page.locator("#errors-anatomy .kv-anatomy-format input")
    box.fill("vllm:turboquant_k3v4_nc")
    box.press("Enter")
    page.locator("#errors-anatomy-run").click()
    _wait_for_text(page, "#errors-anatomy-summary", "Codebook")
    page.wait_for_function(f"""() => ({_COUNT_MARKS})(document.querySelector('#errors-anatomy')).every(n => n > 0)""",
                           timeout=RUN_TIMEOUT_MS)
    assert not _error_toasts(page)
    page.locator("#errors-anatomy").screenshot(path=str(shots / "screenshot-errors-anatomy.png"))
    page.get_by_label("한국어").check()
    page.get_by_role("tab", name="메모리").wait_for(timeout=10_000)
    page.locator("#errors-anatomy-run").click()
    _wait_for_text(page, "#errors-anatomy-summary", "코드북")
    page.get_by_label("English").check()
    page.get_by_role("tab", name="Memory").wait_for(timeout=10_000)


def test_rotation_lesson_compares_six_formats_and_draws_the_histogram(page, server):
    """Lesson 9 opens the Compare tab's rotate-then-quantize view and runs it: the six formats' KL in the table, both
    figures drawn (the histogram: coordinates before and after the rotation, and the N(0, 1/d) curve)."""
    page.locator("#lesson-9").click()
    page.locator("#compare-rotation-run").wait_for(state="visible", timeout=10_000)  # the accordion opened
    _wait_for_text(page, "#kv-lesson-note", "Lesson 9")
    _wait_for_text(page, "#compare-rotation-status", "TQ-prod 4-bit: KL")
    cells = page.locator("#compare-rotation-table").inner_text()
    for name in ("int4/rot", "vllm:int4_per_token_head", "vllm:turboquant_4bit_nc", "tq_mse4", "tq_prod4"):
        assert name in cells, cells
    marks = page.locator("#compare-rotation").evaluate(_COUNT_MARKS)
    assert len(marks) == 2 and all(n > 0 for n in marks), marks
    assert not _error_toasts(page)


ENGINE_NAMES = ("vllm:turboquant_k3v4_nc",)  # with Compare's four ticked defaults and the one below: six, the most
LLAMA_CPP_NAME = "llama.cpp:k=q8_0,v=q4_0/norot"  # on a tiny model (head_dim 16) a skipped row, named in the status


@pytest.mark.parametrize("lang", ["ko", "en"])
def test_every_tab_takes_the_engines_names_in_both_languages(page, server, shots, lang):
    """The engines' own values, typed as a user types them, in Compare, Sensitivity, Memory and Export, on a page
    in Korean and in English: each runs, names the value in its result, and shows no error."""
    page.get_by_label("한국어" if lang == "ko" else "English").check()
    page.get_by_role("tab", name="메모리" if lang == "ko" else "Memory").wait_for(timeout=10_000)
    _open_tab(page, "compare")
    page.locator("#compare-custom textarea").fill("\n".join((*ENGINE_NAMES, LLAMA_CPP_NAME)))
    page.locator("#compare-run").click()
    for name in ENGINE_NAMES:  # the table comes with the run's last output
        _wait_for_text(page, "#compare-table", name)
    _wait_for_text(page, "#compare-table" if not MODEL.startswith("tiny-") else "#compare-status", LLAMA_CPP_NAME)
    assert not _error_toasts(page), _error_toasts(page)
    page.locator("#tab-compare").screenshot(path=str(shots / f"screenshot-compare-engines-{lang}.png"))
    page.locator("#compare-custom textarea").fill("")

    _open_tab(page, "sensitivity")
    page.locator("#tab-sensitivity").get_by_label("prompt", exact=True).check()
    _type_and_run(page, "sensitivity", "#sensitivity-spec input", "vllm:turboquant_4bit_nc",
                  "#sensitivity-summary", "vllm:turboquant_4bit_nc")
    _type_and_run(page, "memory", "#memory-custom textarea",
                  "vllm:turboquant_3bit_nc\nvllm:nvfp4_4over6\nvllm:int4_per_token_head",
                  "#memory-formula", "vllm:nvfp4_4over6")
    _type_and_run(page, "export", "#export-spec input", "vllm:turboquant_k8v4",
                  "#export-commands", "--kv-cache-dtype turboquant_k8v4")
    page.get_by_label("English").check()


def _type_and_run(page, tab: str, field: str, value: str, out: str, expect: str) -> None:
    """In `tab`, type `value` into `field` (a dropdown takes it with Enter), run the tab, and wait until `out`
    shows `expect`, with no error shown."""
    _open_tab(page, tab)
    box = page.locator(field)
    box.fill(value)
    if field.endswith(" input"):
        box.press("Enter")
    page.locator(f"#{tab}-run").click()
    _wait_for_text(page, out, expect)
    assert not _error_toasts(page), _error_toasts(page)
