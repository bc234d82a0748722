"""Browser test: the Korean page shows no English sentence (Debian's Chromium through Playwright, 1400 px wide).

Opens the app as a Korean browser does (Accept-Language ko-KR), reads every visible text node (the header's
warm-up status, the lesson buttons, each tab's labels and intros, the empty figures' placeholders inside their SVG)
and fails on a text that is Latin-only English: no Hangul, and at least one English word that is not a name the
page keeps as it is (format names and spec strings, units, model names, engines' flags, code; see ALLOWED). Then
runs Compare and reads its metrics table: every header in Korean, none broken inside a word (at 1400 px the English
ones were squeezed to "form at", "spe c"; checked in English too). Switching to English and back keeps the
placeholders in the page's language.

The Memory, Long context and Equal bytes tabs are read before and after a run (charts, tables, status and notes
follow the language; Long context's generated texts are the model's, left out); the other tabs before they run (the
engine view's Korean results: tests/test_ui_engines.py).

Run: python -m pytest tests/test_browser_korean.py -q       (needs /usr/bin/chromium)
"""

from __future__ import annotations

import re
import shutil

import pytest

from app_server import _CHROMIUM_FLAGS as CHROMIUM_FLAGS
from app_server import CHROMIUM, serve_app

from kvviz.ui.common import EXAMPLES

playwright_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} missing: apt-get install chromium")

TABS = ("compare", "outliers", "errors", "sensitivity", "long_context", "equal_bytes", "memory", "export")
HANGUL = re.compile(r"[\uac00-\ud7a3]")
# Names the Korean page keeps in Latin letters: models, engines, libraries, measures, units, format families.
ALLOWED = {
    "english", "kl", "top", "nats", "rope", "sdpa", "dynamiccache", "wikitext", "vllm", "sglang", "llama", "cpp",
    "hugging", "face", "dtype", "cpu", "cuda", "torch", "triton", "numba", "hadamard", "mib", "kib", "gb", "gpu",
    "gpus", "mla", "json", "turboquant", "qjl", "tq", "mse", "prod", "kvviz", "gemma", "smollm", "qwen", "kivi",
    "mxfp", "nvfp", "gguf", "tiny", "max", "abs", "nan", "api", "gradio", "plotly", "config", "id", "engine",
    "transformers", "decompressed", "custom", "bits", "fp", "int", "bf", "per", "token", "head", "nc", "ultraquant",
    "rot", "tensor", "channel", "asym", "exact", "baseline", "prompt",  # values API callers pass (layouts, sources)
    "streaming", "snapkv", "knorm", "random",  # the eviction policies' names, as a spec writes them
}
# JS: the visible text nodes of the page (SVG text of the figures included), each once, trimmed. gradio's
# screen-reader announcer (.sr-only) is not on screen; its Korean locale leaves "In queue: 1 of 1" in English.
_VISIBLE_TEXTS = """() => {
    const out = [];
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        const text = n.textContent.trim();
        const el = n.parentElement;
        if (!text || !el || el.closest('script, style, code, pre, textarea, [aria-hidden=true], .modebar, .sr-only'))
            continue;
        const box = el.getBoundingClientRect();
        const style = getComputedStyle(el);
        if (box.width === 0 || box.height === 0 || style.visibility === 'hidden' || style.display === 'none') continue;
        if (el.closest('[hidden], .hidden') || !el.checkVisibility({opacityProperty: true, visibilityProperty: true}))
            continue;
        out.push(text);
    }
    return [...new Set(out)];
}"""


def english_words(text: str) -> list[str]:
    """The words of `text` that make it English: none when it holds Hangul; else its purely alphabetic words of
    two or more letters that ALLOWED does not name (a word with a digit, `_`, `/`, `:`, `=` or `.` inside, or
    starting with `-`, is a spec, a flag or a number: kept)."""
    if HANGUL.search(text):
        return []
    words = []
    for token in text.split():
        token = token.strip("()[]{},;!?*\"'`“”‘’·…|%×")
        if not token or token.startswith("-") or re.search(r"[\d_/:=.@<>+]", token.rstrip(".")):
            continue
        for word in re.split(r"-", token.rstrip(".")):
            if re.fullmatch(r"[A-Za-z]{2,}", word) and word.lower() not in ALLOWED:
                words.append(word)
    return words


def test_english_words_finds_sentences_and_keeps_names():
    assert english_words("Run the tab to draw this figure.") == ["Run", "the", "tab", "to", "draw", "this", "figure"]
    assert english_words("form at") == ["form", "at"]
    assert english_words("탭을 실행하면 이 그림이 그려집니다.") == []
    for kept in ("vllm:int4_per_token_head", "k=q8_0,v=q4_0", "tiny-llama", "fp8_e4m3", "KL (nats/token)", "0.25",
                 "int4/channel/g32/asym", "GB", "WikiText-2", "top-1", "vLLM --kv-cache-dtype", "-ctk / -ctv"):
        assert english_words(kept) == [], kept


@pytest.fixture(scope="module")
def server():
    with serve_app(model="tiny-llama") as srv:
        yield srv


@pytest.fixture(scope="module")
def page(server):
    """The page as a Korean browser opens it (Accept-Language ko-KR: the app's language and gradio's own labels),
    1400 px wide."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 900}, locale="ko-KR")
            pg.goto(server.url, wait_until="networkidle")
            pg.wait_for_function("() => document.body.innerText.includes('메모리')", timeout=60_000)
            yield pg
        finally:
            browser.close()


def _example_prompt(text: str) -> bool:
    """Whether `text` is one of the example prompts (or its preview, cut with "..."): text for the model to read,
    English for an English model, not a sentence of the page."""
    return any(ex.startswith(text.removesuffix("...")) for ex in EXAMPLES)


# gradio's own labels that its Korean locale leaves in English (its run history's button)
GRADIOS_OWN = {"Runs"}


def _english(page) -> dict[str, list[str]]:
    return {text: words for text in page.evaluate(_VISIBLE_TEXTS)
            if (words := english_words(text)) and not _example_prompt(text) and text not in GRADIOS_OWN}


def _wait_for_korean_placeholders(page, root: str) -> None:
    page.wait_for_function("""(root) => {
        const figs = Array.from(document.querySelectorAll(root + ' .js-plotly-plot'));
        return figs.length > 0 && figs.every(f => !f.innerText.includes('Run the tab'));
    }""", arg=root, timeout=30_000)


@pytest.mark.parametrize("tab", TABS)
def test_the_korean_page_shows_no_english_sentence(page, tab):
    page.locator(f"#tab-{tab}-button").click()
    page.locator(f"#tab-{tab}").wait_for(state="visible")
    page.wait_for_function("() => document.querySelector('#kv-header')?.innerText.includes('모델')", timeout=30_000)
    figures = page.locator(f"#tab-{tab} .js-plotly-plot")
    if figures.count():
        _wait_for_korean_placeholders(page, f"#tab-{tab}")
        assert "탭을 실행하면" in page.locator(f"#tab-{tab}").inner_text()
    english = _english(page)
    assert not english, f"{tab}: English on the Korean page: {english}"


# JS: the lines a table header cell's text is laid out in (a line ends where the next character sits lower).
_HEADER_LINES = """(th) => {
    const range = document.createRange(); const out = []; let top = null, line = '';
    const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        for (let i = 0; i < n.textContent.length; i++) {
            range.setStart(n, i); range.setEnd(n, i + 1);
            const r = range.getBoundingClientRect();
            if (r.width === 0) { line += n.textContent[i]; continue; }
            if (top !== null && Math.abs(r.top - top) > 2) { out.push(line); line = ''; }
            top = r.top; line += n.textContent[i];
        }
    }
    out.push(line); return out;
}"""


def _pieces(text: str) -> list[str]:
    """`text` cut where a line may break: at spaces, and after a slash or hyphen ("KL (nats/" + "token)")."""
    return [p for p in re.split(r"\s+|(?<=[/-])", text) if re.search(r"\w", p)]


def _broken_headers(page) -> dict[str, list[str]]:
    """The metrics table's headers whose text is broken inside a word ("form at", "spe c"), with their lines."""
    broken = {}
    for th in page.locator("#compare-table th").all():
        text = th.inner_text().strip()
        lines = th.evaluate(_HEADER_LINES)
        if text and any(p not in _pieces(text) for line in lines for p in _pieces(line)):
            broken[text] = lines
    return broken


def _run_compare(page, done: str) -> list[str]:
    page.locator("#tab-compare-button").click()
    page.locator("#compare-run").click()
    page.wait_for_function("(done) => (document.querySelector('#compare-status')?.innerText || '').includes(done)",
                           arg=done, timeout=120_000)
    return [h.strip() for h in page.locator("#compare-table th").all_inner_texts() if h.strip()]


def test_compare_metrics_headers_are_korean_and_unbroken_at_1400px(page, server):
    headers = _run_compare(page, "완료")
    assert len(headers) >= 12, headers
    english = {h: w for h in headers if (w := english_words(h))}
    assert not english, f"English headers: {english}"
    assert not _broken_headers(page), f"headers broken inside a word at 1400 px: {_broken_headers(page)}"
    english = _english(page)
    assert not english, f"compare after a run: English on the Korean page: {english}"
    # the English headers, longer words, too
    page.locator("#kv-lang label", has_text="English").click()
    headers = _run_compare(page, "Done in")
    assert "format" in headers and "spec" in headers, headers
    assert not _broken_headers(page), f"headers broken inside a word at 1400 px: {_broken_headers(page)}"
    page.locator("#kv-lang label", has_text="한국어").click()
    page.wait_for_function("() => document.querySelector('#kv-header')?.innerText.includes('모델')", timeout=30_000)


def test_switching_language_keeps_placeholders_in_the_pages_language(page):
    page.locator("#tab-outliers-button").click()
    page.locator("#kv-lang label", has_text="English").click()
    page.wait_for_function("() => document.querySelector('#tab-outliers').innerText.includes('Run the tab')",
                           timeout=30_000)
    page.locator("#kv-lang label", has_text="한국어").click()
    _wait_for_korean_placeholders(page, "#tab-outliers")
    page.wait_for_function("() => document.querySelector('#kv-header')?.innerText.includes('모델')", timeout=30_000)


def test_the_memory_tabs_results_are_korean(page):
    """The Memory tab's run (chart title and axes, the GPU-fit and per-layer-kind tables, the formula) in Korean."""
    page.locator("#tab-memory-button").click()
    page.locator("#memory-run").click()
    page.wait_for_function("() => (document.querySelector('#memory-formula')?.innerText || '').includes('바이트')",
                           timeout=60_000)
    page.wait_for_function("() => document.querySelector('#memory-plot')?.innerText.includes('문맥 길이')",
                           timeout=30_000)
    fit = [h.strip() for h in page.locator("#memory-fit th").all_inner_texts() if h.strip()]
    assert "포맷" in fit, fit
    assert "토큰" in page.locator("#memory-fit").inner_text()
    english = _english(page)
    assert not english, f"memory after a run: English on the Korean page: {english}"



def _settled(page, tab: str) -> None:
    """Wait until no component of `tab` shows a pending event's progress bar (gradio's status tracker)."""
    page.wait_for_function(f"() => !document.querySelector('{tab} .eta-bar')", timeout=180_000)


def test_the_long_context_tabs_results_are_korean(page):
    """A short Long context run (256 tokens, the tiny model, int4 and k8v4): its charts, tables, status and notes in
    Korean. The generated texts (the model's own words) are hidden before reading."""
    page.locator("#tab-long_context-button").click()
    tab = page.locator("#tab-long_context")
    tab.wait_for(state="visible")
    _settled(page, "#tab-long_context")  # the picker's updates of this tab's inputs have landed
    page.locator("#long_context-specs label", has_text="mxfp4").click()  # head_dim 16: the skip note is English
    for slider, value in (("context", "256"), ("new-tokens", "4")):
        box = page.locator(f"#long_context-{slider} input[type=number]")
        box.fill(value)
        box.press("Enter")
    page.locator("#long_context-run").click()
    page.wait_for_function("() => (document.querySelector('#long_context-status')?.innerText || '').includes('완료')",
                           timeout=180_000)
    assert "문맥 안의 위치" in page.locator("#long_context-kl").inner_text()
    headers = [h.strip() for h in page.locator("#long_context-table th").all_inner_texts() if h.strip()]
    assert "포맷" in headers and not {h: w for h in headers if (w := english_words(h))}, headers
    page.evaluate("() => { document.querySelector('#long_context-columns').style.display = 'none'; }")
    english = _english(page)
    assert not english, f"long context after a run: English on the Korean page: {english}"


def test_the_equal_bytes_tabs_results_are_korean(page):
    """The Equal bytes tab's run (the chart, the quantization map, the table, the status) in Korean: the tiny model's
    byte tokenizer, the tab's defaults (256 tokens, one needle per depth: seconds)."""
    page.locator("#tab-equal_bytes-button").click()
    page.locator("#tab-equal_bytes").wait_for(state="visible")
    _settled(page, "#tab-equal_bytes")
    page.locator("#equal_bytes-run").click()
    page.wait_for_function("() => (document.querySelector('#equal_bytes-status')?.innerText || '').includes('완료')",
                           timeout=180_000)
    headers = [h.strip() for h in page.locator("#equal_bytes-table th").all_inner_texts() if h.strip()]
    assert "스펙" in headers, headers
    _settled(page, "#tab-equal_bytes")  # the last update (chart, map) renders after the status says done
    assert "예산" in page.locator("#equal_bytes-chart").inner_text()
    english = _english(page)
    assert not english, f"equal bytes after a run: English on the Korean page: {english}"
