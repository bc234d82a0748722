"""The app's model computations run on its compute threads (kvviz.ui.common.on_compute_threads): one long-lived
thread per allowed concurrent computation, so that torch keeps one OpenMP team."""

from __future__ import annotations

import contextvars
import threading

import pytest

from kvviz.ui import common

REQUEST = contextvars.ContextVar("request", default=None)


def test_a_call_runs_on_a_compute_thread_in_the_callers_context():
    @common.on_compute_threads
    def where(x):
        return threading.current_thread().name, REQUEST.get(), x * 2

    REQUEST.set("r1")
    name, request, value = where(21)
    assert name.startswith("kvviz-compute") and name != threading.current_thread().name
    assert (request, value) == ("r1", 42)
    assert where(1)[0] == name  # the same long-lived thread (KVVIZ_CONCURRENCY 1)


def test_errors_reach_the_caller():
    @common.on_compute_threads
    def fails():
        raise ValueError("say what to do")

    with pytest.raises(ValueError, match="say what to do"):
        fails()


def test_every_step_of_a_generator_runs_there_and_closing_it_closes_the_steps():
    closed = []

    @common.on_compute_threads
    def steps(n):
        try:
            for i in range(n):
                yield i, threading.current_thread().name, REQUEST.get()
        finally:
            closed.append(threading.current_thread().name)

    REQUEST.set("r2")
    out = list(steps(3))
    assert [i for i, _, _ in out] == [0, 1, 2]
    assert {name for _, name, _ in out} == {out[0][1]} and out[0][1].startswith("kvviz-compute")
    assert {r for _, _, r in out} == {"r2"}
    assert closed == [out[0][1]]

    gen = steps(10)
    next(gen)
    gen.close()  # a client that goes away mid-stream: the computation's generator is closed on its thread
    assert closed[-1] == out[0][1] and len(closed) == 2


def test_a_call_from_a_compute_thread_runs_in_place():
    @common.on_compute_threads
    def inner():
        return threading.current_thread().name

    @common.on_compute_threads
    def outer():
        return threading.current_thread().name, inner()  # one compute thread: submitting would wait on itself

    mine, theirs = outer()
    assert mine == theirs and mine.startswith("kvviz-compute")
