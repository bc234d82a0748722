"""The llama.cpp worker: the one process where llama-cpp-python (and so llama.cpp's native code) is loaded.

kvviz.engines.llamacpp starts it on first use and talks to it over two pipes, and it answers one request at a time
until its parent closes the request pipe. A native crash here (SIGILL from instructions the CPU lacks, SIGSEGV)
ends only this process; the parent turns its exit status into a ValueError and starts a fresh one for the next
request. The worker computes the statistics itself and sends back only token ids and stats dicts, never the
[tokens, vocab] logits.

    python -m kvviz.engines.llamacpp_worker REQUEST_FD REPLY_FD      # started by kvviz.engines.llamacpp only

Protocol (multiprocessing.connection framing, pickled tuples):
    parent -> worker: (op, kwargs) with op "run" or "decode_speed"; None to stop.
    worker -> parent: ("ready", llama-cpp-python's version) once at start, then per request any number of
        ("pair", i, spec) (progress) and one of ("done", result), ("error", ValueError text) or ("failed", traceback).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import sys
import time
import traceback
from multiprocessing.connection import Connection

import numpy as np
import torch

from kvviz.engines.llamacpp import INSTALL, MIN_TOKENS, ROT_ENV
from kvviz.metrics import kld_stats, log_probs


@contextlib.contextmanager
def _captured_log(llama_cpp):
    """Collect llama.cpp's error lines (its own log, not Python's) while the block runs; restore after."""
    lines: list[str] = []
    last = [0]
    error, cont = 4, 5  # ggml.h's GGML_LOG_LEVEL_ERROR and _CONT (continues the previous line)

    @llama_cpp.llama_log_callback
    def collect(level, text, user_data):
        if level == error or (level == cont and last[0] == error):
            lines.append(text.decode("utf-8", "replace"))
        if level != cont:
            last[0] = level

    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    try:
        yield lines
    finally:
        from llama_cpp import _logger  # llama-cpp-python's own callback (prints errors when not verbose)

        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def _load(llama_cpp, path: str, n_ctx: int, k_type: str, v_type: str, flash_attn: bool, rotate: bool,
          threads: int | None):
    """A llama_cpp.Llama with these cache types and all logits kept; llama.cpp's own reason when it refuses."""
    kwargs = dict(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(n_ctx, 512), logits_all=True,
                  flash_attn=flash_attn, verbose=False, type_k=getattr(llama_cpp, f"GGML_TYPE_{k_type.upper()}"),
                  type_v=getattr(llama_cpp, f"GGML_TYPE_{v_type.upper()}"))
    if threads:
        kwargs.update(n_threads=threads, n_threads_batch=threads)
    # llama.cpp reads the variable when it builds a KV cache (context creation); this process runs one request
    # at a time, so setting it here cannot leak into another request
    if rotate:
        os.environ.pop(ROT_ENV, None)
    else:
        os.environ[ROT_ENV] = "1"
    with _captured_log(llama_cpp) as log:
        try:
            return llama_cpp.Llama(**kwargs)
        except ValueError as err:  # "Failed to create llama_context" / "Failed to load model": why is in the log
            reason = " ".join(line.strip() for line in log if line.strip()) or str(err)
            raise ValueError(f"llama.cpp refused K {k_type}, V {v_type}"
                             f"{'' if flash_attn else ' without flash attention'} for {os.path.basename(path)}: "
                             f"{reason}") from err


def _logprobs(llm, ids: list[int]) -> torch.Tensor:
    """Teacher-forced log-probs [len(ids), vocab] float32 (row t: the distribution of token t + 1); closes llm."""
    try:
        llm.eval(ids)
        logits = torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))  # [T, vocab]
    finally:
        llm.close()
    return log_probs(logits).float()


def run(llama_cpp, replies: Connection, *, path: str, text: str, tokens: int, pairs: dict[str, tuple[str, str]],
        flash_attn: bool, rotate: bool, threads: int | None) -> tuple[list[int], dict[str, dict]]:
    """kvviz.engines.llamacpp.run's work: (token ids [T], {spec: stats}); sends ("pair", i, spec) before each pair."""
    options = dict(flash_attn=flash_attn, rotate=rotate, threads=threads)
    llm = _load(llama_cpp, path, tokens, "f16", "f16", **options)
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True)[:tokens]
    if len(ids) < MIN_TOKENS:
        llm.close()
        raise ValueError(f"The text has {len(ids)} tokens; the bridge needs at least {MIN_TOKENS}. Give a longer text.")
    targets = torch.tensor(ids[1:])  # [T - 1]
    base = _logprobs(llm, ids)[:-1]  # [T - 1, vocab]
    out = {}
    for i, (spec, (k_type, v_type)) in enumerate(pairs.items()):
        replies.send(("pair", i, spec))
        cand = _logprobs(_load(llama_cpp, path, tokens, k_type, v_type, **options), ids)[:-1]
        stats = kld_stats(base, cand, targets)
        stats.update(engine=f"llama.cpp (llama-cpp-python {llama_cpp.__version__})", k_type=k_type, v_type=v_type,
                     rotation="llama.cpp's default" if rotate else f"off ({ROT_ENV}=1)",
                     estimate="full vocabulary", model=os.path.basename(path))
        out[spec] = stats
    return ids, out


def decode_speed(llama_cpp, replies: Connection, *, path: str, types: list[tuple[str, str]], context: int,
                 tokens: int, rounds: int, threads: int | None, text: str) -> dict[tuple[str, str], float]:
    """kvviz.engines.llamacpp.decode_speed's work: {(k_type, v_type): tokens/s}."""
    llms = {pair: _load(llama_cpp, path, context + tokens + 8, *pair, True, True, threads) for pair in types}
    try:
        first = next(iter(llms.values()))
        ids = first.tokenize(text.encode(), add_bos=False)
        while len(ids) < context + tokens:
            ids = ids + ids
        best = dict.fromkeys(llms, 0.0)
        for llm in llms.values():  # logits_all keeps every position's logits: prefill once, then rewind
            llm.eval(ids[:context])
        for _ in range(rounds):
            for pair, llm in llms.items():
                llm.n_tokens = context  # rewind: eval() drops the cache past n_tokens
                start = time.perf_counter()
                for t in range(tokens):
                    llm.eval([ids[context + t]])
                best[pair] = max(best[pair], tokens / (time.perf_counter() - start))
        return best
    finally:
        for llm in llms.values():
            llm.close()


OPS = {"run": run, "decode_speed": decode_speed}


def main(request_fd: int, reply_fd: int) -> int:
    requests, replies = Connection(request_fd, writable=False), Connection(reply_fd, readable=False)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash is reported by the parent, not left as a core file
    try:
        import llama_cpp
    except ImportError as err:
        replies.send(("error", f"{INSTALL} ({err})."))
        return 1
    except (OSError, RuntimeError) as err:  # installed, but its shared library does not load
        replies.send(("error", f"llama-cpp-python is installed but its llama.cpp library does not load ({err}); "
                               f"reinstall it: {INSTALL}"))
        return 1
    replies.send(("ready", llama_cpp.__version__))
    while True:
        try:
            request = requests.recv()
        except EOFError:  # the parent is gone
            return 0
        if request is None:
            return 0
        op, kwargs = request
        try:
            result = OPS[op](llama_cpp, replies, **kwargs)
        except ValueError as err:
            replies.send(("error", str(err)))
        except Exception:  # a bug, not the user's input: the parent raises it with this traceback
            replies.send(("failed", traceback.format_exc()))
        else:
            replies.send(("done", result))


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
