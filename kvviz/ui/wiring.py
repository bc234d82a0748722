"""kvviz.ui.wiring: how the app runs its callbacks on the runtime (kvviz.runtime): named endpoints, user errors,
the compute threads, the launch warm-up.

- `user_errors`: wraps a callback so a library ValueError reaches the user as a gr.Error message (no traceback)
  and the app keeps serving. Works for plain and generator (streaming) callbacks.
- `on_click`: wires a named endpoint: raw values in (`preprocess=False`, so `kvviz.ui.checks` is the one place
  that checks every argument's type and range), the model's queue, queue position and progress shown.
- `model_task`: a model computation as the app runs it: on the CPU, on the runtime's compute threads
  (`on_compute_threads`), on ZeroGPU in a worker that holds a GPU.
- `warm_up`, `start_warm_up`: the launch warm-up; its state is the runtime's (the header reads it).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable

import gradio as gr

from kernels.cpu import logits as cpu_logits
from kvviz import attention, quality, runtime

from . import zerogpu
from .picker import check_model, get_model, warming  # noqa: F401  (warming: the header's, re-exported)

WARMUP_PROMPT = "The capital of France is"
_COMPUTE_PREFIX = "kvviz-compute"


def concurrency() -> int:
    """How many model computations run at once (the runtime's: env KVVIZ_CONCURRENCY, default 1: a 2-core CPU
    Space)."""
    return runtime.current().concurrency


# --- the launch warm-up ------------------------------------------------------------------------------------------


def _set_warmup(name: str, state: str) -> None:
    rt = runtime.current()
    with rt.warmup_lock:
        rt.warmups[name] = state


def warm_up(model: str | None = None, specs: list[str] | tuple[str, ...] = ("int4",)) -> float:
    """Make the first click fast: load `model` (None: the default; a bundled model's converted copy is written
    to kvviz's disk cache on first use) and decode three tokens through each of `specs` with the active attention
    backend, so that its kernels compile (numba caches them on disk). Returns the seconds it took; ValueError when
    the model fails to load (the header then says so, and the model loads on first use again)."""
    name = check_model(model)
    _set_warmup(name, "warming")
    start = time.perf_counter()
    try:
        loaded, tok = get_model(model=name)
        with attention.compiling_cpu_kernels():  # meanwhile clicks decode through the reference, not waiting
            # 3 new tokens: the second decode step is the first to take the rows' one-call path (kernels/cpu/mirror.py)
            quality.compare(loaded, tok, WARMUP_PROMPT, list(specs), max_new_tokens=3, speed_tokens=2)
            cpu_logits.warm_up()  # the Long context tab's KL over the vocabulary
    except (ValueError, RuntimeError, OSError) as err:
        _set_warmup(name, f"failed: {err}")
        raise ValueError(f"Warming up {name!r} failed: {err}") from None
    _set_warmup(name, "warm")
    return time.perf_counter() - start


def start_warm_up(model: str | None = None, specs: list[str] | tuple[str, ...] = ("int4",)) -> threading.Thread:
    """warm_up in a daemon thread (in the caller's runtime), so the page is served at once; a failure is logged and
    shown in the header, and the app keeps serving. A click that needs the model meanwhile waits only for what is
    left (the pool's per-model lock; numba's compile lock)."""
    try:
        name = check_model(model)
    except ValueError:
        name = None  # warm_up says why, from the thread
    if name is not None:  # the header says so from this call on, not from when the thread first runs
        _set_warmup(name, "warming")
    ctx = contextvars.copy_context()

    def run():
        try:
            logging.getLogger("kvviz").warning("kvviz: warmed up in %.1f s", warm_up(model, specs))
        except ValueError as err:
            logging.getLogger("kvviz").warning("kvviz: %s", err)

    thread = threading.Thread(target=ctx.run, args=(run,), name="kvviz-warm-up", daemon=True)
    thread.start()
    return thread


# --- errors and endpoints ----------------------------------------------------------------------------------------


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


# --- compute threads ---------------------------------------------------------------------------------------------

_DONE = object()


def _on_compute_thread() -> bool:
    """Whether this thread is one of the app's compute threads (a call from there runs in place: with one compute
    thread, submitting would wait on itself)."""
    return threading.current_thread().name.startswith(_COMPUTE_PREFIX)


def _compute_pool():
    """The current runtime's compute threads (kvviz.runtime.Runtime.compute_pool)."""
    return runtime.current().compute_pool(_COMPUTE_PREFIX)


def on_compute_threads(fn: Callable) -> Callable:
    """`fn` run on the runtime's compute threads, each step of a generator too, in the caller's context (gradio's
    request, for gr.Progress and gr.Warning; the runtime scope); a call from a compute thread runs in place.

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
