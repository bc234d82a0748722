"""kvviz.ui.common: what every tab shares: the model picker, input checks, error translation.

- `model_input(tr)`, `check_model(value)`, `get_model(progress, model)`: every model tab opens with a picker whose
  value is its endpoints' `model` argument; the model loads on first use with a progress bar and stays resident
  in `MODELS` (kvviz/ui/registry.py: which models are allowed, LRU of KVVIZ_MAX_MODELS, one load per name).
  Models are read-only once loaded; every result a user sees is returned from their own call, so users never
  share results.
- `user_errors`: wraps a callback so a library ValueError reaches the user as a gr.Error message (no traceback)
  and the app keeps serving. Works for plain and generator (streaming) callbacks.
- `on_click`: wires a named endpoint: raw values in (`preprocess=False`, so `kvviz.ui.checks` is the one place
  that checks every argument's type and range), the model's queue, queue position and progress shown.
- `model_task`: a model computation as the app runs it: on the CPU, on the app's compute threads
  (`on_compute_threads`), on ZeroGPU in a worker that holds a GPU.
- `check_int`, `check_prompt`, `spec_list`, ...: re-exported from `kvviz.ui.checks`, the input checks at the UI
  boundary, raising ValueError with a sentence that says what to do.

Model choice: env KVVIZ_MODEL is the default selection (default: the bundled SmolLM2-135M-Instruct), KVVIZ_MODELS
lists more (registry.py); a tiny random model name (tiny-llama, tiny-gemma3...) makes tests fast.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gradio as gr
import pandas as pd
import torch

from kvviz import attention, memory, models, quality, tiny
from kvviz.analysis.capture import capture_kv
from kvviz.cache import model_layer_types, notes
from kvviz.formats import Plan

from . import registry, zerogpu
from .checks import (MAX_PROMPT_CHARS, check_bool, check_choice, check_float, check_int,  # noqa: F401
                     check_language, check_names, check_prompt, check_spec, check_text, check_upload, single_specs,
                     spec_list)
from .i18n import lang_code, t

MAX_FORMATS = 6  # columns the Compare tab shows side by side, baseline included
DEFAULT_MODEL = registry.DEFAULT_MODEL  # kvviz.models.DEFAULT_MODEL: the bundled SmolLM2-135M-Instruct
_CONCURRENCY_ENV = "KVVIZ_CONCURRENCY"


def model_name() -> str:
    """The default model: env KVVIZ_MODEL, else the bundled SmolLM2 (what a page selects when it opens)."""
    return registry.default_model()


def concurrency() -> int:
    """How many model computations run at once (env KVVIZ_CONCURRENCY, default 1: a 2-core CPU Space)."""
    text = os.environ.get(_CONCURRENCY_ENV, "1")
    assert text.isdigit() and int(text) >= 1, f"{_CONCURRENCY_ENV} must be a positive integer, got {text!r}"
    return int(text)


MODELS = registry.ModelRegistry()  # the process-wide resident models (kvviz/ui/registry.py)


def model_choices() -> list[str]:
    """The models a user may pick in the page, the served default (model_name()) first."""
    return registry.listed_models()


def check_model(value) -> str:
    """The picked model's name: one of model_choices() (or, with KVVIZ_ALLOW_ANY_MODEL=1, any hub id); None or ""
    means the default (ValueError otherwise)."""
    return registry.check_model(value)


def model_input(tr) -> gr.Dropdown:
    """The model picker every model tab opens with (its value is the `model` argument of the tab's endpoints).
    With KVVIZ_ALLOW_ANY_MODEL=1 it also takes a typed hub id; otherwise only the listed models exist."""
    free = registry.allow_any_model()
    return tr(gr.Dropdown(model_choices(), value=model_name(), label=t("model"), elem_classes=["kv-model"],
                          allow_custom_value=free, info=t("model_info_any") if free else None),
              label="model", **({"info": "model_info_any"} if free else {}))


def get_model(progress: gr.Progress | None = None, model: str | None = None):
    """(model, tokenizer) of the picked `model` (a check_model name; None: the default), loaded on first use.
    ValueError for a name that is not allowed, too large, or fails to load (the other models keep serving)."""
    loaded, tokenizer = MODELS.get(check_model(model), progress)
    return zerogpu.to_device(loaded), tokenizer


@functools.lru_cache(maxsize=16)
def _tiny_shape(arch: str) -> tuple[int, int]:
    config = tiny.tiny_config(arch)
    return config.num_hidden_layers, config.num_key_value_heads


def model_shape(model: str | None = None) -> tuple[int, int] | None:
    """(layers, kv_heads) of `model` (None: the default) without loading its weights, when cheaply known; else None.

    Sizes the layer and head sliders: a loaded model is described directly, tiny models from their config, the
    bundled ones and other presets from kvviz.memory's presets, a listed local directory from its config.json.
    """
    name = model_name() if model is None else model
    loaded = MODELS.peek(name)
    if loaded is not None:
        d = models.describe_model(loaded[0])
        return d["layers"], d["kv_heads"]
    if name.startswith("tiny-"):
        return _tiny_shape(name.removeprefix("tiny-"))
    if name in memory.MODEL_PRESETS:
        p = memory.MODEL_PRESETS[name]
        return p.layers, p.kv_heads
    if name in model_choices() and (Path(name).expanduser() / "config.json").is_file():
        try:
            p = memory.resolve_model(str(Path(name).expanduser() / "config.json"))
            return p.layers, p.kv_heads
        except ValueError:
            return None
    return None


def model_layer_kinds(model: str) -> list[str] | None:
    """One layer type per decoder layer of `model` without loading its weights, when cheaply known (as model_shape
    knows it), else None: what Plan.resolve takes to apply an engine's layer rules (vLLM's TurboQuant keeps a dense
    model's first and last 2 layers in 16 bits, a hybrid's none)."""
    loaded = MODELS.peek(model)
    if loaded is not None:
        return model_layer_types(loaded[0].config)
    if model.startswith("tiny-"):
        return model_layer_types(tiny.tiny_config(model.removeprefix("tiny-")))
    if model in memory.MODEL_PRESETS:
        return [s.kind for s in memory.layer_shapes(memory.MODEL_PRESETS[model])]
    return None


# 0.62: layer 18 of SmolLM2's 30, where post-RoPE K's outlier channels stand out most against V's.
DEFAULT_LAYER_FRACTION = 0.62


def layer_head_inputs(default_layer_fraction: float = DEFAULT_LAYER_FRACTION, model: str | None = None):
    """(layer, head) input components sized to `model` (None: the default): sliders when its shape is known, else
    numbers. layer_head_updates resizes them when the tab's model changes."""
    shape = model_shape(model)
    if shape is None:
        return (gr.Number(0, label="Layer", precision=0, minimum=0),
                gr.Number(0, label="KV head", precision=0, minimum=0))
    layer, head = _slider_ranges(shape, default_layer_fraction)
    return gr.Slider(**layer, step=1, label="Layer"), gr.Slider(**head, step=1, label="KV head")


def _slider_range(n: int, value: int) -> dict:
    """A 0..n-1 slider's settings. gradio refuses a slider whose minimum equals its maximum, so a model with one
    KV head (Gemma 3 270M) or one layer gets 0..1 held at 0 and locked (not interactive)."""
    return dict(minimum=0, maximum=max(1, n - 1), value=value, interactive=n > 1)


def _slider_ranges(shape: tuple[int, int], default_layer_fraction: float) -> tuple[dict, dict]:
    layers, heads = shape
    return _slider_range(layers, int(default_layer_fraction * (layers - 1))), _slider_range(heads, 0)


def layer_head_updates(model, default_layer_fraction: float = DEFAULT_LAYER_FRACTION):
    """(layer, head) updates that fit the sliders to the newly picked `model`'s shape; no change when its shape is
    not known before loading (the call then checks the range: check_layer_head)."""
    try:
        shape = model_shape(check_model(model))
    except ValueError:  # a half-typed hub id: nothing to resize to yet
        shape = None
    if shape is None:
        return gr.update(), gr.update()
    layer, head = _slider_ranges(shape, default_layer_fraction)
    return gr.update(**layer), gr.update(**head)


def follow_model(model: gr.Dropdown, layer, head, default_layer_fraction: float = DEFAULT_LAYER_FRACTION) -> None:
    """Resize a tab's layer and head inputs whenever its model picker changes."""
    model.change(lambda m: layer_head_updates(m, default_layer_fraction), model, [layer, head],
                 api_visibility="private", queue=False)


def device_name() -> str:
    """The device computations run on: "cuda (NVIDIA ...)", "cpu", or ZeroGPU's lent GPU."""
    if zerogpu.active():
        return zerogpu.device_note()
    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return "cpu"


def backend_name(lang: str = "en") -> str:
    """The attention backend that decodes from the quantized cache: "triton", "cpu" or "torch" (on ZeroGPU:
    triton, which each call's lent GPU runs). Never compiles: before the CPU kernels have loaded, it says so (in
    `lang`)."""
    if zerogpu.active():
        return "triton"
    settled = attention.settled_backend()
    if settled is not None:
        return settled
    return t("hdr_backend_compiling" if warming() else "hdr_backend_first_use", lang)


# --- the launch warm-up ------------------------------------------------------------------------------------------

_WARMUP: dict[str, str] = {}  # model name -> "warming" | "warm" | "failed: <why>" (the header reads it)
_WARMUP_LOCK = threading.Lock()
WARMUP_PROMPT = "The capital of France is"


def warm_up(model: str | None = None, specs: list[str] | tuple[str, ...] = ("int4",)) -> float:
    """Make the first click fast: load `model` (None: the default; a bundled model's converted copy is written
    to kvviz's disk cache on first use) and decode three tokens through each of `specs` with the active attention
    backend, so that its kernels compile (numba caches them on disk). Returns the seconds it took; ValueError when
    the model fails to load (the header then says so, and the model loads on first use again)."""
    name = check_model(model)
    with _WARMUP_LOCK:
        _WARMUP[name] = "warming"
    start = time.perf_counter()
    try:
        loaded, tok = get_model(model=name)
        with attention.compiling_cpu_kernels():  # meanwhile clicks decode through the reference, not waiting
            # 3 new tokens: the second decode step is the first to take the rows' one-call path (kernels/cpu/mirror.py)
            quality.compare(loaded, tok, WARMUP_PROMPT, list(specs), max_new_tokens=3, speed_tokens=2)
    except (ValueError, RuntimeError, OSError) as err:
        with _WARMUP_LOCK:
            _WARMUP[name] = f"failed: {err}"
        raise ValueError(f"Warming up {name!r} failed: {err}") from None
    with _WARMUP_LOCK:
        _WARMUP[name] = "warm"
    return time.perf_counter() - start


def start_warm_up(model: str | None = None, specs: list[str] | tuple[str, ...] = ("int4",)) -> threading.Thread:
    """warm_up in a daemon thread, so the page is served at once; a failure is logged and shown in the header, and
    the app keeps serving. A click that needs the model meanwhile waits only for what is left (the registry's
    per-model lock; numba's compile lock)."""
    try:
        name = check_model(model)
    except ValueError:
        name = None  # warm_up says why, from the thread
    if name is not None:
        with _WARMUP_LOCK:  # the header says so from this call on, not from when the thread first runs
            _WARMUP[name] = "warming"

    def run():
        try:
            logging.getLogger("kvviz").warning("kvviz: warmed up in %.1f s", warm_up(model, specs))
        except ValueError as err:
            logging.getLogger("kvviz").warning("kvviz: %s", err)

    thread = threading.Thread(target=run, name="kvviz-warm-up", daemon=True)
    thread.start()
    return thread


def warming() -> bool:
    """Whether a warm-up is running now (the page's header then refreshes itself until it ends)."""
    with _WARMUP_LOCK:
        return "warming" in _WARMUP.values()


def header_markdown(model: str | None = None, lang: str = "en") -> str:
    """One line: which model (the picked one; None: the default), device and attention backend produce the page's
    numbers, and which models are loaded now (switching to one of those is instant); in `lang` (the radio's choice
    or a code)."""
    lang = lang_code(lang)
    try:
        name = check_model(model)
    except ValueError:  # a half-typed hub id: the header keeps naming what the page would use
        name = model_name()
    with _WARMUP_LOCK:
        warm = _WARMUP.get(name, "")
    if warm == "warming":
        state = t("hdr_warming", lang)
    elif MODELS.peek(name) is not None:
        state = t("hdr_loaded", lang)
    elif warm.startswith("failed"):
        state = t("hdr_failed", lang).format(why=warm.removeprefix("failed: "))
    else:
        state = t("hdr_first_use", lang)
    others = [m for m in MODELS.resident() if m != name]
    also = t("hdr_also", lang).format(models=", ".join(f"`{m}`" for m in others)) if others else ""
    return t("hdr_line", lang).format(model=name, state=state, also=also, device=device_name(),
                                      backend=backend_name(lang))


# --- errors and checks ---------------------------------------------------------------------------------------


def user_errors(fn: Callable) -> Callable:
    """Turn a ValueError raised by `fn` (or by the library under it) into gr.Error: a message, not a traceback."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen_wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except ValueError as e:
                raise gr.Error(str(e), print_exception=False) from None
        return gen_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ValueError as e:
            raise gr.Error(str(e), print_exception=False) from None
    return wrapper


def on_click(button: gr.Button, fn: Callable, inputs: list, outputs: list, api_name: str, *,
             concurrency_id: str = "model", progress_on=None, **kwargs):
    """Wire `button` to the named endpoint `fn`: what the page or an API caller sends reaches `fn` unprocessed
    (preprocess=False), so `fn`'s own checks (kvviz.ui.checks) are the boundary for every argument's type and
    range; the call waits in the `concurrency_id` queue, and the queue position, then gr.Progress, show over
    `progress_on` (default: the outputs)."""
    return button.click(model_task(fn, concurrency_id), inputs, outputs, api_name=api_name, preprocess=False,
                        concurrency_id=concurrency_id, show_progress="full", show_progress_on=progress_on, **kwargs)


def model_task(fn: Callable, concurrency_id: str) -> Callable:
    """`fn` as the app runs a computation on a model (an endpoint of the "model" queue): on the app's compute
    threads (`on_compute_threads`) and decorated for ZeroGPU (kvviz.ui.zerogpu.gpu); other endpoints (memory, the
    scale-file check) run as they are."""
    return zerogpu.gpu(on_compute_threads(fn)) if concurrency_id == "model" else fn


_COMPUTE: tuple[int, ThreadPoolExecutor] | None = None  # (the process that made it, the compute threads)
_COMPUTE_PREFIX = "kvviz-compute"


def _compute_pool() -> ThreadPoolExecutor:
    """The app's compute threads: `concurrency()` long-lived threads, one pool per process (a ZeroGPU worker is a
    fork, which inherits no threads)."""
    global _COMPUTE
    if _COMPUTE is None or _COMPUTE[0] != os.getpid():
        _COMPUTE = (os.getpid(), ThreadPoolExecutor(concurrency(), thread_name_prefix=_COMPUTE_PREFIX))
    return _COMPUTE[1]


_DONE = object()


def _on_compute_thread() -> bool:
    """Whether this thread is one of the app's compute threads (a call from there runs in place: with one compute
    thread, submitting would wait on itself)."""
    return threading.current_thread().name.startswith(_COMPUTE_PREFIX)


def on_compute_threads(fn: Callable) -> Callable:
    """`fn` run on the app's compute threads, each step of a generator too, in the caller's context (gradio's
    request, for gr.Progress and gr.Warning); a call from a compute thread runs in place.

    Why: torch's CPU kernels run on OpenMP, which keeps a team of worker threads per calling thread. Once two
    teams exist, more threads than cores wait on OpenMP, and libgomp then lets every idle worker spin only ~100
    times before it sleeps: each of the thousands of small parallel regions in a decode step or a prefix-tree
    batch waits for a sleeping worker to wake. gradio runs callbacks and generator steps on whichever of its
    worker threads is free, so the app's computations ran ~20% slower than in the thread that first ran torch
    (SmolLM2's sensitivity map, 64 tokens: 4.7 s in one thread, 5.4-6.5 s in a second). One long-lived thread
    (per allowed concurrent computation) keeps one team."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def steps(*args, **kwargs):
            if _on_compute_thread():
                yield from fn(*args, **kwargs)
                return
            ctx, pool = contextvars.copy_context(), _compute_pool()
            it = fn(*args, **kwargs)
            try:
                while (item := pool.submit(ctx.run, next, it, _DONE).result()) is not _DONE:
                    yield item
            finally:
                pool.submit(ctx.run, it.close).result()
        return steps

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _on_compute_thread():
            return fn(*args, **kwargs)
        return _compute_pool().submit(contextvars.copy_context().run, fn, *args, **kwargs).result()
    return call


def UploadFile(*args, **kwargs) -> gr.File:  # noqa: N802 (a component constructor, spelled like one)
    """A gr.File whose payload reaches the callback unvalidated, for a named endpoint with preprocess=False;
    read it with `upload_path`. Arguments as gr.File's.

    gradio checks a File payload against its FileData model before any callback runs, outside preprocess, so a
    number or a bare string sent to the API would fail there with gradio's generic "has not enabled verbose
    error reporting". Without the model, kvviz.ui.checks.check_upload checks it and names what is wrong. gradio
    still moves FileData payloads into its cache (and refuses paths outside its allowed folders) before that.
    A factory, not a subclass: gradio writes a .pyi stub beside any module that subclasses a component.
    """
    box = gr.File(*args, **kwargs)
    box.api_info()  # cache the FileData schema, so gradio_client still sees a file parameter
    box.data_model = None
    return box


def upload_path(value, what: str):
    """The local path of a file uploaded through an UploadFile (ValueError for anything else)."""
    from gradio.utils import get_upload_folder

    return check_upload(value, what, Path(get_upload_folder()))


def table(rows: list[list], headers: list[str]):
    """A gr.Dataframe value: rows under headers (a pandas DataFrame, which the API returns as headers + data)."""
    return pd.DataFrame(rows, columns=headers)


def fitting_specs(plans: list[Plan], model) -> tuple[list[Plan], list[str]]:
    """(the plans this model can hold, one "`name`: why not" line per other plan).

    A format with 32-value blocks cannot store a head_dim of 16 (the tiny test model): such formats are skipped
    with a note rather than failing the whole comparison. A plan naming a layer this model lacks raises
    (Plan.resolve).
    """
    head_dim = models.describe_model(model)["head_dim"]
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    fit, skipped = [], []
    for plan in plans:
        plan.resolve(n_layers)
        try:
            for fmt in (f for kv in plan.specs for f in (kv.k, kv.v)):
                fmt.nbytes_for((1, 1, 64, head_dim))  # [batch, kv_heads, tokens, head_dim]
            fit.append(plan)
        except ValueError as e:
            skipped.append(f"`{plan.name}`: {e}")
    if not fit:
        raise ValueError("None of the chosen formats fits this model: " + "; ".join(skipped))
    return fit, skipped


# --- the library's scale warnings, shown to the user -----------------------------------------------------------


class ScaleNotes(notes.ScaleNotes):
    """kvviz.cache.notes.ScaleNotes, shown to the user: as a status paragraph and as pop-ups.

        notes = ScaleNotes()
        with notes.catching():
            ...                                # library calls
        status += notes.markdown()             # "**Warnings**: ..." lines, or ""
        notes.toast()                          # each line as a gr.Warning pop-up, once
    """

    def __init__(self) -> None:
        super().__init__()
        self._toasted: set[tuple[str, str]] = set()

    def markdown(self) -> str:
        """A "**Warnings**: ..." paragraph to append to a status line, or "" when nothing was warned."""
        lines = self.lines()
        return "\n\n**Warnings**: " + " ".join(lines) if lines else ""

    def toast(self) -> None:
        """Show each (problem, format) not shown yet as a gr.Warning pop-up."""
        for key, line in self._lines().items():
            if key not in self._toasted:
                self._toasted.add(key)
                gr.Warning(line.replace("`", ""))


# --- prompts and captures ------------------------------------------------------------------------------------

EXAMPLES = [
    "The capital of France is",
    ("A transformer's KV cache stores the keys and values of every past token, so the model does not recompute "
     "them at each step. For long contexts this cache, not the weights, is what fills the GPU."),
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "대한민국의 수도는 서울이고, 일본의 수도는",
]


def prompt_input(tr, example: int) -> gr.Textbox:
    """The prompt box every model tab opens with, prefilled with EXAMPLES[example], and the examples under it.

    `tr` is the tab's i18n Translator (it relabels the box when the language changes).
    """
    box = tr(gr.Textbox(EXAMPLES[example], lines=3, label=t("prompt"), placeholder=t("prompt_ph"),
                        max_length=MAX_PROMPT_CHARS),
             label="prompt", placeholder="prompt_ph")
    tr(gr.Examples(EXAMPLES, box, label=t("examples")).dataset, label="examples")
    return box


MAX_ANALYSIS_TOKENS = 512  # the K-outlier and error tabs look at one prompt; more tokens add little but time


def prompt_token_ids(tokenizer, prompt: str, limit: int) -> list[int]:
    """Token ids of the checked prompt; ValueError when it is not text, empty, over MAX_PROMPT_CHARS characters
    (checked first, so a huge text never reaches the tokenizer) or longer than `limit` tokens."""
    prompt = check_prompt(prompt)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"][0].tolist()
    if len(ids) > limit:
        raise ValueError(f"The prompt is {len(ids):,} tokens long; this view takes at most {limit:,} tokens. "
                         "Shorten it.")
    return ids


@functools.lru_cache(maxsize=8)
def _capture_cached(model: str, prompt: str):
    loaded, tok = get_model(model=model)
    return capture_kv(loaded, tok, prompt, max_tokens=MAX_ANALYSIS_TOKENS)


def capture(prompt, progress: gr.Progress | None = None, model: str | None = None):
    """K (pre/post RoPE), V and Q of every layer for `prompt` on `model` (a check_model name; None: the default),
    as a kvviz.analysis KVCapture, cached per (model, prompt).

    The cache is keyed by the model and the prompt text alone: the same text gives the same capture to whoever
    asks, so it shares no user's result with another. Raises ValueError for an empty or too long prompt.
    """
    prompt = check_prompt(prompt)
    model = check_model(model)
    _, tok = get_model(progress, model)
    prompt_token_ids(tok, prompt, MAX_ANALYSIS_TOKENS)
    if progress is not None:
        progress(0.5, desc="Capturing K and V of every layer…")
    return _capture_cached(model, prompt)


def check_layer_head(cap, layer, head) -> tuple[int, int]:
    """Layer and head as ints within the captured model's shape (ValueError naming the range otherwise)."""
    return (check_int(layer, "Layer", 0, cap.layers - 1), check_int(head, "KV head", 0, cap.kv_heads - 1))
