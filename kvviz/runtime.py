"""kvviz.runtime: one explicit object for what a process shares: the attention backend choice, the resident models,
the K/V captures, the compute threads, the launch warm-up's state and the settings the environment gives.

    rt = Runtime.from_env()            # the one place that reads KVVIZ_* (and SPACES_ZERO_GPU)
    with rt.activate():                # this context decodes, loads and caches through rt
        kvviz.quality.compare(...)

`current()` is the runtime of the calling context: the one a `with rt.activate():` block made current, else the
process default (`default()`: built from the environment on first use; the app builds its own and makes it the
default with `set_default`). Inside a runtime two scoped choices change for a block only, in the calling context
(a `contextvars.ContextVar`: a thread starts with none; `contextvars.copy_context()` carries them, as the app's
compute threads do): `use_backend(name)` (kvviz.attention) and the row-stable mode (`kvviz.rowstable.row_stable`).
A scope is restored by value on exit, so a generator that a server resumes in another context leaves no trace.

Environment (read by `Runtime.from_env` only; every other module takes the runtime's attributes):

    KVVIZ_BACKEND            auto | torch | triton | cpu: the attention backend (kvviz/attention.py); default auto
    KVVIZ_CACHE_DIR          kvviz's disk cache (converted models, assembled GGUFs); default ~/.cache/kvviz
    KVVIZ_CPU_PARALLEL_ROWS  rows from which the fused CPU decode uses numba's thread pool (default 512; 0: always)
    KVVIZ_MODEL              the app's default model (default: smollm2-135m, the bundled SmolLM2-135M-Instruct)
    KVVIZ_MODELS             more choices, comma-separated: hub ids, local directories, bundled or tiny-* names
    KVVIZ_ALLOW_ANY_MODEL    1: a user may also type any hub id ("owner/name"), checked against KVVIZ_MAX_PARAMS
    KVVIZ_MAX_PARAMS         that limit in parameters (default 2e9 on a CPU, 8e9 with CUDA)
    KVVIZ_MAX_MODELS         how many models stay loaded at once (default 2); the least recently used goes first
    KVVIZ_CONCURRENCY        how many model computations the app runs at once (default 1)
    KVVIZ_WARMUP             0: the app does not warm the default model up at launch
    KVVIZ_VLLM_URLS          the app's vLLM servers for the engine view ("baseline=URL,DTYPE=URL")
    KVVIZ_VLLM_PYTHON        the Python that has vLLM (default <repo>/.venv-vllm/bin/python)
    SPACES_ZERO_GPU          true on a Hugging Face ZeroGPU Space (set by the Space)
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

BACKENDS = ("auto", "torch", "triton", "cpu")
DEFAULT_MODEL = "smollm2-135m"  # kvviz.models.DEFAULT_MODEL (checked there), the bundled SmolLM2-135M-Instruct
_TRUE = ("1", "true", "yes", "on", "t")


def check_backend(name, where: str = "backend") -> str:
    """`name` lower-cased ("" means auto), checked against BACKENDS; ValueError naming `where` it came from."""
    wanted = (name.strip().lower() or "auto") if isinstance(name, str) else None
    if wanted not in BACKENDS:
        raise ValueError(f"{where}={name!r} is not one of {', '.join(BACKENDS)}; pick one of them.")
    return wanted


def _positive_int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    text = env.get(name, "").strip() or str(default)
    if not text.isdigit() or int(text) < minimum:
        raise ValueError(f"{name} must be an integer of at least {minimum}, got {text!r}; fix or unset it.")
    return int(text)


class ModelPool:
    """At most `capacity` loaded models, by key (a model's name), least recently used evicted first.

    `get(key, progress, loader)` returns the resident (model, tokenizer) at once, else loads it with `loader(key)`
    (default: the pool's own) under that key's lock (concurrent first requests wait for one load). A load that fails
    raises ValueError and registers nothing, so the other models keep serving. Models are shared read-only.
    """

    def __init__(self, loader: Callable[[object], tuple] | None = None, capacity: Callable[[], int] | int = 2):
        self._loader = loader
        self._capacity = capacity if callable(capacity) else (lambda: capacity)
        self._lock = threading.Lock()  # guards _loaded and _key_locks; never held while loading
        self._loaded: OrderedDict[object, tuple] = OrderedDict()  # least recently used first
        self._key_locks: dict[object, threading.Lock] = {}
        self.loads: dict[object, int] = {}  # key -> completed loads (tests: one load for concurrent first requests)

    def resident(self) -> list:
        """Loaded models' keys, most recently used first."""
        with self._lock:
            return list(reversed(self._loaded))

    def peek(self, key):
        """The resident (model, tokenizer) of `key`, or None; does not count as a use."""
        with self._lock:
            return self._loaded.get(key)

    def _hit(self, key):
        with self._lock:
            if key in self._loaded:
                self._loaded.move_to_end(key)
                return self._loaded[key]
            return None

    def get(self, key, progress=None, loader: Callable[[object], tuple] | None = None):
        hit = self._hit(key)
        if hit is not None:
            return hit
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            hit = self._hit(key)  # loaded by the request we waited for
            if hit is not None:
                return hit
            if progress is not None:
                progress(0.05, desc=f"Loading model {key} (first use; later switches to it are instant)…")
            start = time.perf_counter()
            load = loader or self._loader
            assert load is not None, "a ModelPool without a loader of its own needs one per get()"
            try:
                pair = load(key)
            except (OSError, RuntimeError, ImportError, KeyError) as err:  # ValueError passes as it is
                raise ValueError(f"Could not load the model {key!r} ({err.__class__.__name__}: {err}). The other "
                                 "models still serve; pick one of them.") from None
            with self._lock:
                self._loaded[key] = pair
                self.loads[key] = self.loads.get(key, 0) + 1
                while len(self._loaded) > max(1, self._capacity()):
                    self._loaded.popitem(last=False)  # in-flight users of an evicted model keep their reference
            if progress is not None:
                progress(1.0, desc=f"Model {key} loaded in {time.perf_counter() - start:.1f} s")
            return pair


class LRU:
    """A small thread-safe least-recently-used map: `get_or_make(key, make)` (make runs outside the lock)."""

    def __init__(self, size: int):
        self.size = size
        self._lock = threading.Lock()
        self._items: OrderedDict = OrderedDict()

    def get_or_make(self, key, make: Callable[[], object]):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


@dataclass(eq=False)
class Runtime:
    """Settings (plain attributes: a test may set one for a block) and the shared state built from them."""

    backend: str = "auto"
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "kvviz")
    cpu_parallel_rows: int = 512
    default_model: str = DEFAULT_MODEL
    extra_models: tuple[str, ...] = ()
    allow_any_model: bool = False
    max_params: float | None = None  # None: 2e9 on a CPU, 8e9 with CUDA
    max_models: int = 2
    concurrency: int = 1
    warmup: bool = True
    vllm_urls: str | None = None
    vllm_python: Path | None = None
    zero_gpu: bool = False

    def __post_init__(self) -> None:
        self.backend = check_backend(self.backend, "KVVIZ_BACKEND")
        self.cache_dir = Path(self.cache_dir).expanduser()
        self.extra_models = tuple(self.extra_models)
        self.models = ModelPool(capacity=lambda: self.max_models)  # the resident models (kvviz.models.load_model)
        self.captures = LRU(8)  # (model, prompt) -> KVCapture (the app's analysis tabs)
        self.compiling_thread: int | None = None  # the thread inside compiling_cpu_kernels(), if any
        self.warmups: dict[str, str] = {}  # model -> "warming" | "warm" | "failed: <why>" (the app's header)
        self.warmup_lock = threading.Lock()
        self.packed_holder = None  # weakref to the model whose linear layers hold packed weights (kvviz.rowstable)
        self.packed_head = None  # (weight ref, version key, HeadChunks): the one packed LM head (kvviz.rowstable)
        self._pool: tuple[int, ThreadPoolExecutor] | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Runtime":
        """A runtime from the environment (`env`: os.environ); ValueError naming a malformed variable."""
        env = os.environ if env is None else env
        max_params = None
        text = env.get("KVVIZ_MAX_PARAMS", "").strip()
        if text:
            try:
                max_params = float(text)
            except ValueError:
                max_params = -1.0
            if not max_params > 0:
                raise ValueError(f"KVVIZ_MAX_PARAMS must be a positive number of parameters such as 2e9, got "
                                 f"{text!r}; fix or unset it.")
        cache = env.get("KVVIZ_CACHE_DIR", "").strip()
        python = env.get("KVVIZ_VLLM_PYTHON", "").strip()
        return cls(
            backend=check_backend(env.get("KVVIZ_BACKEND", "auto"), "KVVIZ_BACKEND"),
            cache_dir=Path(cache) if cache else Path.home() / ".cache" / "kvviz",
            cpu_parallel_rows=_positive_int(env, "KVVIZ_CPU_PARALLEL_ROWS", 512, minimum=0),
            default_model=env.get("KVVIZ_MODEL", "").strip() or DEFAULT_MODEL,
            extra_models=tuple(m.strip() for m in env.get("KVVIZ_MODELS", "").split(",") if m.strip()),
            allow_any_model=env.get("KVVIZ_ALLOW_ANY_MODEL", "").strip().lower() in _TRUE,
            max_params=max_params,
            max_models=_positive_int(env, "KVVIZ_MAX_MODELS", 2),
            concurrency=_positive_int(env, "KVVIZ_CONCURRENCY", 1),
            warmup=env.get("KVVIZ_WARMUP", "1").strip() != "0",
            vllm_urls=env.get("KVVIZ_VLLM_URLS") or None,
            vllm_python=Path(python) if python else None,
            zero_gpu=env.get("SPACES_ZERO_GPU", "").strip().lower() in _TRUE,
        )

    # --- scope ------------------------------------------------------------------------------------------------

    def activate(self):
        """A context manager: inside the block, in this context, `current()` is this runtime (the backend its own,
        whatever use_backend said outside; the row-stable mode as it was)."""
        return _scoped(runtime=self, backend=None)

    def wanted_backend(self) -> str:
        """The backend asked for in this context: a use_backend() block's, else this runtime's (checked)."""
        scope = _SCOPE.get()
        if scope.backend is not None and (scope.runtime is None or scope.runtime is self):
            return scope.backend
        return self.backend if self.backend in BACKENDS else check_backend(self.backend)

    # --- the warm-up compile --------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def compiling_cpu_kernels(self):
        """While the block runs, other threads on the auto backend decode through the torch reference instead of
        waiting for the fused CPU kernels' compile; this thread takes the CPU path, and so compiles it."""
        self.compiling_thread = threading.get_ident()
        try:
            yield
        finally:
            self.compiling_thread = None

    def compiling_elsewhere(self) -> bool:
        """Whether another thread is inside compiling_cpu_kernels()."""
        return self.compiling_thread not in (None, threading.get_ident())

    # --- compute threads ------------------------------------------------------------------------------------------

    def compute_pool(self, prefix: str = "kvviz-compute") -> ThreadPoolExecutor:
        """`concurrency` long-lived threads, one pool per process (a ZeroGPU worker is a fork, which inherits no
        threads)."""
        pool = self._pool
        if pool is None or pool[0] != os.getpid():
            pool = self._pool = (os.getpid(), ThreadPoolExecutor(self.concurrency, thread_name_prefix=prefix))
        return pool[1]

    def model_limit(self) -> float:
        """The largest model (parameters) a user may type in: max_params, else 2e9 (8e9 with CUDA)."""
        if self.max_params is not None:
            return self.max_params
        return 8e9 if torch.cuda.is_available() else 2e9


@dataclass(frozen=True)
class _Scope:
    runtime: Runtime | None = None  # None: the process default
    backend: str | None = None  # a use_backend() block's choice
    row_stable: bool = False  # inside an enabled kvviz.rowstable.row_stable block


_SCOPE: contextvars.ContextVar[_Scope] = contextvars.ContextVar("kvviz_scope", default=_Scope())
_default: Runtime | None = None
_default_lock = threading.Lock()


@contextlib.contextmanager
def _scoped(**changes):
    previous = _SCOPE.get()
    _SCOPE.set(replace(previous, **changes))
    try:
        yield
    finally:
        _SCOPE.set(previous)  # by value, not a token: a generator resumed in another context exits cleanly


def default() -> Runtime:
    """The process default runtime: the one set_default() installed, else Runtime.from_env() (built once)."""
    global _default
    found = _default
    if found is None:
        with _default_lock:
            if _default is None:
                _default = Runtime.from_env()
            found = _default
    return found


def set_default(runtime: Runtime | None) -> Runtime | None:
    """Make `runtime` the process default (None: rebuilt from the environment on next use); returns the previous."""
    global _default
    with _default_lock:
        previous, _default = _default, runtime
    return previous


def current() -> Runtime:
    """The runtime of the calling context: the innermost `activate()`d one, else the default."""
    found = _SCOPE.get().runtime
    return found if found is not None else default()


def scope_backend(name: str):
    """A context manager: decode through backend `name` (checked) in this context while the block runs."""
    return _scoped(backend=check_backend(name, "use_backend"))


def scope_row_stable(enabled: bool):
    """A context manager: the row-stable mode on (or off) in this context while the block runs."""
    return _scoped(row_stable=bool(enabled))


def row_stable_active() -> bool:
    """Whether the calling context is inside an enabled row_stable block (the innermost decides)."""
    return _SCOPE.get().row_stable
