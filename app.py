"""kvviz app: the Gradio playground for KV-cache quantization.

`build_demo()` returns the page as a `gr.Blocks` (no side effects at import; the model loads on first use). It
builds the app's runtime (kvviz.runtime.Runtime.from_env: the backend, the model choices, the resident models, the
compute threads; the one place the KVVIZ_* variables are read) and makes it the process default. The tabs live in `kvviz/ui/` (one module per tab); the eleven lessons of docs/DESIGN.md are one-click buttons
(`kvviz/ui/lessons.py`); figures come from `kvviz/plots/`.

Run: `make run` (or `python app.py`) serves http://127.0.0.1:7860; GRADIO_SERVER_NAME and GRADIO_SERVER_PORT
override the address (Spaces and the Dockerfile set them). KVVIZ_MODEL is the default model (default: the bundled
SmolLM2-135M-Instruct), KVVIZ_MODELS lists more to pick from, KVVIZ_ALLOW_ANY_MODEL=1 lets users type any hub id
(up to KVVIZ_MAX_PARAMS parameters), KVVIZ_MAX_MODELS bounds how many stay loaded (kvviz/runtime.py lists them all);
KVVIZ_CONCURRENCY bounds concurrent model computations (default 1). At launch a background thread warms the
default model and the kernels of Compare's default formats (the header says so while it runs); KVVIZ_WARMUP=0
turns that off. `python app.py --warm-up` only warms (the Dockerfile runs it at build time) and exits.
On a machine whose cores other jobs keep busy, OMP_WAIT_POLICY=PASSIVE (OpenMP workers sleep between parallel
regions) steadies the clicks; on an idle one it costs 20-30% of the decode speed, so the app leaves it as given.

api_names (for gradio_client): compare, needle, fused_speed, rotation, engine_compare, outliers, error_map, anatomy,
sensitivity, plan_search, long_context, equal_bytes, memory, export, check_scales. Every one that runs a model (compare, needle,
fused_speed, rotation, outliers, error_map, anatomy, sensitivity, plan_search, long_context, equal_bytes,
export) ends with `model` (a name from the page's model picker; omitted: KVVIZ_MODEL) and `language` ("English", the default, or
"한국어": the results' language);
memory ends with `language` too, and engine_compare with `model` and `language`; check_scales takes (file, model).
"""

from __future__ import annotations

import contextlib
import os
import sys

with contextlib.suppress(ImportError):  # ZeroGPU: `spaces` must be imported before anything initialises CUDA
    import spaces  # noqa: F401

import gradio as gr

from kvviz import runtime
from kvviz.ui import (common, compare, equal_bytes, errors, export, i18n, lessons, long_context, memory, outliers,
                      sensitivity, zerogpu)
from kvviz.ui.i18n import t

CSS = """
.kv-columns {display: flex; gap: 10px; overflow-x: auto; align-items: stretch;}
.kv-col {flex: 1 1 0; min-width: 190px; border: 1px solid var(--border-color-primary); border-radius: 8px;
         padding: 8px 10px; background: var(--block-background-fill);}
.kv-col h4 {margin: 0 0 4px 0; font-size: 0.95em;}
.kv-col .kv-meta {font-size: 0.8em; color: var(--body-text-color-subdued); margin-bottom: 6px;}
.kv-col .kv-text {white-space: pre-wrap; font-size: 0.9em; line-height: 1.45;}
.kv-col mark {background: #ffd8a8; color: inherit; border-radius: 3px; padding: 0 1px;}
.kv-col .kv-after {color: #b35900;}
#kv-lessons button {font-size: 0.85em; min-height: 2.4em;}
#kv-header {font-size: 0.9em;}
#kv-lesson-note {border-left: 4px solid #ff7f0e; padding: 6px 12px; background: var(--block-background-fill);}
/* table headers wrap between words only (at 1400 px Compare's squeezed to "form at", "spe c"), Korean too */
.table-wrap th, .table-wrap th * {word-break: keep-all; overflow-wrap: normal; hyphens: none;}
.table-wrap th {min-width: 4.5em;}
"""


def build_demo(rt: runtime.Runtime | None = None) -> gr.Blocks:
    """The whole page: title, language switch, header, lesson buttons and the seven tabs, served by `rt` (None: a
    runtime built from the environment), which becomes the process default (gradio runs callbacks on its threads).
    The returned Blocks' `parts` holds each tab's components by name (what kvviz.ui.lessons.calls and run take)."""
    runtime.set_default(rt if rt is not None else runtime.Runtime.from_env())
    tr = i18n.Translator()
    with gr.Blocks(title="kvviz: KV-cache quantization playground") as demo:
        with gr.Row(equal_height=True):
            with gr.Column(scale=5):
                tr(gr.Markdown(t("title")), value="title")
                tr(gr.Markdown(t("subtitle")), value="subtitle")
            with gr.Column(scale=1, min_width=170):
                lang = tr.language_input(tr(gr.Radio(list(i18n.LANGUAGES), value="English", label=t("language"),
                                                 elem_id="kv-lang"), label="language"))
        header = gr.Markdown(common.header_markdown(), elem_id="kv-header")
        tr(gr.Markdown(t("lessons")), value="lessons")
        with gr.Row(elem_id="kv-lessons"):
            lesson_buttons = [tr(gr.Button(t(f"lesson{i}"), size="sm", elem_id=f"lesson-{i}"), value=f"lesson{i}")
                              for i in range(1, len(lessons.LESSONS) + 1)]
        lesson_note = gr.Markdown(visible=False, elem_id="kv-lesson-note")
        with gr.Tabs() as tabs:
            parts = {}
            for tab_id, module in (("compare", compare), ("outliers", outliers), ("errors", errors),
                                   ("sensitivity", sensitivity), ("long_context", long_context),
                                   ("equal_bytes", equal_bytes), ("memory", memory),
                                   ("export", export)):
                with tr(gr.Tab(t(f"tab_{tab_id}"), id=tab_id, elem_id=f"tab-{tab_id}"), label=f"tab_{tab_id}"):
                    parts[tab_id] = module.build(tr)
        pickers = [p["model"] for p in parts.values() if "kv-model" in (getattr(p.get("model"), "elem_classes", None)
                                                                         or [])]
        lessons.wire(lesson_buttons, tabs, parts, lesson_note, lang, pickers[0])
        sensitivity.wire_handover(parts["sensitivity"], tabs, parts)
        for picker in pickers:  # one selected model for the page: picking it in one tab picks it in all
            others = [p for p in pickers if p is not picker]
            picker.input(lambda m, n=len(others): m if n == 1 else [m] * n, picker, others,
                         api_visibility="private", queue=False)
            picker.change(common.header_markdown, [picker, lang], header, api_visibility="private", queue=False)
        # A run that loaded a model writes its text outputs after the load: the header then says "loaded".
        finished = [o.change for part in parts.values() for *_, outputs, _ in part["actions"].values()
                    for o in outputs if isinstance(o, gr.Markdown)]
        gr.on(list(dict.fromkeys(finished)), common.header_markdown, [pickers[0], lang], header,
              api_visibility="private", queue=False)
        lang.change(lambda choice: tr.updates(i18n.lang_code(choice)), lang, tr.components,
                    api_visibility="private", queue=False)
        lang.change(common.header_markdown, [pickers[0], lang], header, api_visibility="private", queue=False)
        # the figures still showing their placeholder ("Run the tab to draw this figure.") follow the language,
        # and so do the tables' headers before their first run
        for figure in (b for b in demo.blocks.values() if isinstance(b, gr.Plot)):
            tr.figure(figure)
        lang.change(tr.placeholder_updates, [lang, *tr.placeholders], tr.placeholders, js=i18n.PLACEHOLDER_JS,
                    api_visibility="private", queue=False)
        demo.load(i18n.choice_from_request, None, lang, api_visibility="private", queue=False)
        # model loaded yet? While the launch warm-up runs, the header refreshes itself every 3 s until it ends.
        timer = gr.Timer(3, active=False)
        refresh = (lambda m, choice: (common.header_markdown(m, choice), gr.Timer(active=common.warming())),
                   [pickers[0], lang], [header, timer])
        demo.load(*refresh, api_visibility="private", queue=False)
        timer.tick(*refresh, api_visibility="private", queue=False)
    demo.parts = parts
    return demo


def launch(demo: gr.Blocks, **kwargs):
    """Queue and launch `demo` with the app's CSS; kwargs go to Blocks.launch (server_name, server_port...)."""
    demo.queue(default_concurrency_limit=common.concurrency(), max_size=64)
    _quiet_queue(demo)
    return demo.launch(css=CSS, theme=gr.themes.Soft(), **kwargs)


QUEUE_POLL_S = 0.02  # how often gradio's queue looks for new events (its default 1 ms), and progress at 5x this


def _quiet_queue(demo: gr.Blocks) -> None:
    """Slow gradio's queue polling: it looks for new events every millisecond and for progress every 10 ms, busy
    or idle; on a 2-core Space each wake-up takes a core from a computation's two OpenMP threads, which then wait
    for each other. 20 ms later at most, an event starts (gradio's own attributes: left as they are if renamed)."""
    queue = getattr(demo, "_queue", None)
    if queue is not None and hasattr(queue, "sleep_when_free"):
        queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_POLL_S)
    if queue is not None and hasattr(queue, "progress_update_sleep_when_free"):
        queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, 5 * QUEUE_POLL_S)


if __name__ == "__main__":
    runtime.set_default(runtime.Runtime.from_env())  # the app's runtime (build_demo keeps it: see below)
    if "--warm-up" in sys.argv[1:]:  # build time (Dockerfile): convert the models and compile the kernels, then exit
        for name in common.model_choices():
            print(f"warmed {name} in {common.warm_up(name, compare.DEFAULT_SPECS):.1f} s", flush=True)
        sys.exit(0)
    if zerogpu.active():  # the documented ZeroGPU pattern: load in the main process and move to "cuda" there
        common.get_model()[0].to("cuda")
    demo = build_demo(runtime.default())
    launch(
        demo,
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        prevent_thread_lock=True,
    )
    # Warm up once the page is served: started earlier, the conversion and the kernels' compile hold the GIL
    # while the page is being built, and the page itself comes late.
    if not zerogpu.active() and runtime.current().warmup:
        common.start_warm_up(specs=compare.DEFAULT_SPECS)
    demo.block_thread()
