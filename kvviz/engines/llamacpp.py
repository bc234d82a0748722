"""llama.cpp through llama-cpp-python, in a worker process: teacher-forced KLD of its KV cache types against an
f16 cache, and its decode speed.

For each K/V type pair the GGUF is loaded once (`llama_cpp.Llama(..., logits_all=True, type_k=..., type_v=...,
flash_attn=True)`), the same tokens are evaluated, and every position's logits are kept: [tokens, vocab] float32.
The baseline is the same model with an f16 K and V cache. Statistics are kvviz.metrics' (llama.cpp's own
`llama-perplexity --kl-divergence` definitions) over positions 0..tokens-2, each predicting the next token.

Every llama.cpp call runs in one long-lived child process (kvviz/engines/llamacpp_worker.py), never in this one:
a native crash there (a SIGILL from a build for instructions the CPU lacks took the whole app down once, inside
ggml's AMX code) ends only the worker. The request it was serving gets a ValueError saying what happened and what
to do (death_message), and the next request starts a fresh worker. Requests take turns under a lock; the worker
computes the statistics and returns only token ids and stats dicts. This module checks specs and GGUF files and
never imports llama_cpp itself; LLAMA_ATTN_ROT_DISABLE is set inside the worker, per request.

Why llama.cpp's figures differ from kvviz's bare formats (measured: benchmarks/llamacpp_fidelity.py), each
simulated by kvviz.engines.simulate.llamacpp_kld with kvviz.ggml_attention:
- every weight matmul rounds its input to 8 bits (q8_0 / q8_1 / q8_K, the weight type's vec_dot_type): a KV
  error flips some of those roundings in each later layer, which is most of q8_0's KLD (0.0034 here, 0.0003 for
  kvviz's bare q8_0 at 512 tokens of SmolLM2);
- builds since April 2026 (this one included) rotate a quantized K (and Q) by a Hadamard transform of the largest
  power of two >= 64 dividing head_dim, and a quantized V by 64-wide blocks, un-rotating the output
  (`rotate=False` sets LLAMA_ATTN_ROT_DISABLE=1 in the worker);
- for Llama-family GGUFs Q/K channels are RoPE-interleaved (the converter permutes the weights), so the cache's
  32-value blocks group other channels than transformers' order does;
- its CPU flash attention converts Q to K's dot-product partner (q8_0 for q4_0 ...) when the cache is quantized;
- within one batch, the tokens' own K/V are written to the cache first and read back as stored, position 0 too.
The baseline is llama.cpp's own f16 cache with the same arithmetic.

    from kvviz.engines import llamacpp
    ids, stats = llamacpp.run(["q8_0", "k=q8_0,v=q4_0"], tokens=256)   # {spec: {"mean": ..., "p99": ..., ...}}

Needs `pip install llama-cpp-python==0.3.36` (builds llama.cpp from source: about 4 minutes on 2 idle cores).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import gguf

from kvviz import export, models
from kvviz.formats import parse_kv
from kvviz.quality.corpus import wikitext

ENGINE = "llama.cpp"
ROT_ENV = "LLAMA_ATTN_ROT_DISABLE"
MIN_TOKENS = 16
INSTALL = ("The llama.cpp bridge needs llama-cpp-python: `pip install llama-cpp-python==0.3.36` (it builds llama.cpp "
           "from source, a few minutes; `make test` builds it portable, with the Makefile's LLAMA_CMAKE flags)")
_WORKER_MODULE = "kvviz.engines.llamacpp_worker"


def check_installed() -> None:
    """ValueError saying how to install llama-cpp-python when it is missing. Looks for the package without
    importing it: llama.cpp's native code is only ever loaded in the worker process."""
    try:
        found = importlib.util.find_spec("llama_cpp") is not None
    except ValueError:  # a module object without a spec sits in sys.modules
        found = False
    if not found:
        raise ValueError(f"{INSTALL}.")


def resolve_gguf(model: str | os.PathLike | None) -> Path:
    """The GGUF file to load: None -> the bundled SmolLM2, a bundled model's name, or a path to a .gguf file.

    Refuses (ValueError) a missing file, a file that is not GGUF, and a GGUF that is not a model (a vocab-only
    file, a LoRA adapter, anything without an architecture and weights), before llama.cpp sees it.
    """
    if model is None or str(model) in models.BUNDLED:
        name = models.DEFAULT_MODEL if model is None else str(model)
        path = models.bundled_gguf(name)
        if path is None:
            raise ValueError(f"The bundled model {name} is not installed: `{models.BUNDLED[name].install}`, or "
                             "pass model= a path to a .gguf file.")
    else:
        path = Path(model).expanduser()
        if path.is_dir():
            found = sorted(path.glob("*.gguf"))
            if len(found) != 1:
                raise ValueError(f"{path} holds {len(found)} .gguf files; pass the path of one.")
            path = found[0]
        if not path.is_file():
            raise ValueError(f"No GGUF file at {path}: pass a path to a .gguf model file or one of "
                             f"{', '.join(models.BUNDLED)}.")
    _check_model_gguf(path)
    return path


def _check_model_gguf(path: Path) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'); llama.cpp loads GGUF "
                         "models (convert a checkpoint with llama.cpp's convert_hf_to_gguf.py).")
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as err:  # truncated or corrupt headers
        raise ValueError(f"{path} is not a readable GGUF file ({err}).") from err

    def field(key: str):
        f = reader.fields.get(key)
        return None if f is None else bytes(f.parts[f.data[0]]).decode("utf-8", "replace")

    arch, kind = field("general.architecture"), field("general.type")
    if arch is None or not reader.tensors or kind not in (None, "model"):
        what = (f"general.type is {kind!r}" if kind not in (None, "model") else
                "it has no general.architecture" if arch is None else "it holds no tensors (vocab only?)")
        raise ValueError(f"{path} is a GGUF file but not a model ({what}); pass a GGUF that holds a model's weights.")


def type_pair(spec: str) -> tuple[str, str]:
    """llama.cpp's (-ctk, -ctv) types for a kvviz spec ("q8_0", "k=q8_0,v=q4_0", "fp16"); ValueError with
    kvviz.export's reason when llama.cpp has no such cache type."""
    kv = parse_kv(spec)
    row = export.export_commands(kv, "model.gguf")["llama.cpp"]
    if not row["supported"]:
        raise ValueError(f"{spec!r} cannot run in llama.cpp: {row['note']}")
    flags = row["flags"].split()  # "-ctk K -ctv V [-fa on]"
    return flags[flags.index("-ctk") + 1], flags[flags.index("-ctv") + 1]


def run(specs: list[str], *, model=None, text: str | None = None, tokens: int = 512, flash_attn: bool = True,
        rotate: bool = True, threads: int | None = None,
        on_pair: Callable[[int, str], None] | None = None) -> tuple[list[int], dict[str, dict]]:
    """llama.cpp's teacher-forced KLD of each spec's K/V cache types against an f16 cache.

    specs: kvviz specs llama.cpp can store ("q8_0", "k=q8_0,v=q4_0", "q4_1", ...). model: None (the bundled SmolLM2
    GGUF), a bundled model's name, or a .gguf path. text: default the WikiText-2 slice; its first `tokens` tokens are
    evaluated (tokens - 1 positions scored). flash_attn: llama.cpp refuses a quantized V without it (ValueError with
    its reason). rotate: llama.cpp's default Hadamard rotation of a quantized K/V (False: LLAMA_ATTN_ROT_DISABLE=1).
    on_pair(i, spec): called before the i-th spec runs (0-based, after the baseline), for a progress bar.
    Runs in the llama.cpp worker process: a ValueError (death_message) when it dies under the request.

    Returns (token ids scored [T], {spec: stats}), stats: kvviz.metrics.STAT_KEYS plus "engine", "k_type",
    "v_type", "rotation", "model" and "estimate" ("full vocabulary").
    """
    if isinstance(specs, str):
        raise ValueError("specs must be a list of KV specs, e.g. ['q8_0', 'k=q8_0,v=q4_0'].")
    if not isinstance(tokens, int) or tokens < MIN_TOKENS:
        raise ValueError(f"tokens must be a whole number >= {MIN_TOKENS}; got {tokens!r}.")
    pairs = {spec: type_pair(spec) for spec in specs}  # bad specs fail before any model loads
    path = resolve_gguf(model)
    check_installed()
    return _WORKER.request("run", dict(path=str(path), text=wikitext() if text is None else text, tokens=tokens,
                                       pairs=pairs, flash_attn=flash_attn, rotate=rotate, threads=threads),
                           on_pair=on_pair)


def decode_speed(types: list[tuple[str, str]], *, context: int, tokens: int = 8, rounds: int = 2, model=None,
                 threads: int | None = None, text: str | None = None) -> dict[tuple[str, str], float]:
    """{(k_type, v_type): tokens/s} of llama.cpp's single-token decode after a `context`-token prompt, one GGUF
    load per pair (flash attention, llama.cpp's default rotation), in interleaved rounds (best kept): the peer of
    `python -m kvviz bench --contexts`. types: llama.cpp cache types, e.g. [("f16", "f16"), ("q4_0", "q4_0")];
    threads: llama.cpp's threads (None: its default). The prompt is `text` (default WikiText-2) repeated."""
    path = resolve_gguf(model)
    check_installed()
    return _WORKER.request("decode_speed", dict(path=str(path), types=list(types), context=context, tokens=tokens,
                                                rounds=rounds, threads=threads, text=text or wikitext()))


_ADVICE = {
    signal.SIGILL: "Its llama-cpp-python was built for instructions this CPU lacks (a -march=native build, AVX-512 "
                   "or AMX code): rebuild it portable with `make test`, or `pip install llama-cpp-python==0.3.36` "
                   "with CMAKE_ARGS set to the Makefile's LLAMA_CMAKE flags (-DGGML_NATIVE=OFF, x86-64-v3)",
    signal.SIGKILL: "Something killed it, most often the kernel's out-of-memory killer: free memory or score fewer "
                    "tokens, then run again",
}


def death_message(returncode: int, op: str) -> str:
    """The sentence a request gets when the worker ended under it: what happened and what to do."""
    if returncode < 0:
        sig = signal.Signals(-returncode)
        what = f"died with {sig.name} ({(signal.strsignal(sig) or sig.name).lower()})"
        advice = _ADVICE.get(sig, "The crash is inside llama.cpp: run again, and if it repeats, report the model "
                                  "and cache types")
    else:
        what, advice = f"exited with status {returncode}", "Its last lines on stderr (the app's log) say why; run again"
    return (f"llama.cpp's worker process {what} during {op}; the app is unharmed. {advice}. The next request starts "
            "a fresh worker.")


class _Worker:
    """The one llama.cpp worker process of this process (kvviz.engines.llamacpp_worker): started on first use,
    reused, restarted after it dies; requests take turns under a lock (llama.cpp's work is CPU-bound anyway)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _start(self) -> None:
        worker_r, send_w = os.pipe()  # requests: parent -> worker
        recv_r, worker_w = os.pipe()  # replies: worker -> parent
        root = str(Path(__file__).resolve().parents[2])  # this kvviz, whatever the caller's cwd
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        env.pop(ROT_ENV, None)  # the worker sets it per request
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", _WORKER_MODULE, str(worker_r), str(worker_w)],
                                          pass_fds=(worker_r, worker_w), stdin=subprocess.DEVNULL, stdout=2, env=env)
        finally:
            os.close(worker_r)  # the worker holds its own copies; ours would hide its death (no EOF)
            os.close(worker_w)
        self._send, self._recv = Connection(send_w, readable=False), Connection(recv_r, writable=False)
        kind, value = self._reply("starting llama-cpp-python")
        if kind == "error":  # llama-cpp-python does not import there
            self._reap()
            raise ValueError(value)
        assert kind == "ready", f"the llama.cpp worker's first message was {kind!r}, not 'ready'"

    def _reply(self, op: str) -> tuple:
        try:
            return self._recv.recv()
        except (EOFError, OSError):  # its end of the pipe closed: the process is gone
            returncode = self._proc.wait()
            self._close()
            raise ValueError(death_message(returncode, op)) from None

    def _close(self) -> None:
        for conn in (self._send, self._recv):
            if conn is not None:
                conn.close()
        self._proc = self._send = self._recv = None

    def _reap(self) -> None:
        """Stop the worker (it may be mid-request, with replies no one will read) and forget it."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._close()

    def request(self, op: str, kwargs: dict, on_pair: Callable[[int, str], None] | None = None):
        """Run `op` in the worker and return its result; ValueError with llama.cpp's reason when it refuses, or
        with death_message when the worker ends under the request."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is not None:  # died between requests
                self._close()
            if self._proc is None:
                self._start()
            answered = False
            try:
                try:
                    self._send.send((op, kwargs))
                except OSError:  # died after the check above
                    self._reap()
                    self._start()
                    self._send.send((op, kwargs))
                while True:
                    kind, *value = self._reply(op)
                    if kind == "pair":
                        if on_pair is not None:
                            on_pair(*value)
                        continue
                    answered = True
                    if kind == "done":
                        return value[0]
                    if kind == "error":
                        raise ValueError(value[0])
                    raise RuntimeError(f"llama.cpp's worker failed in {op}:\n{value[0]}")
            finally:
                if not answered:  # a callback raised, or an interrupt: the worker's late replies must not answer
                    self._reap()  # the next request

    def stop(self) -> None:
        """End the worker if it runs (at exit, and for tests that want a fresh one)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                try:
                    self._send.send(None)
                    self._proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass  # _reap below ends it either way
            self._reap()


_WORKER = _Worker()
atexit.register(_WORKER._reap)  # not stop(): at exit a daemon thread may still hold the lock mid-request


def worker_pid() -> int | None:
    """The llama.cpp worker process's pid while it runs, else None."""
    return _WORKER.pid
