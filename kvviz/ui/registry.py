"""kvviz.ui.registry: the models the app serves: which a user may pick, loading them lazily, keeping a few resident.

The Space owner sets the choices (read from the environment each time, so tests can change them):

    KVVIZ_MODEL             the default selection (default: smollm2-135m, the bundled SmolLM2-135M-Instruct)
    KVVIZ_MODELS            more choices, comma-separated: hub ids, local directories, bundled or tiny-* names
    KVVIZ_ALLOW_ANY_MODEL   1: a user may also type any hub id ("owner/name"); its config.json is read first and
                            the model refused when it has more than KVVIZ_MAX_PARAMS parameters, before any weight
                            is downloaded
    KVVIZ_MAX_PARAMS        that limit (default 2e9 on a CPU, 8e9 with CUDA; weights are held in float32)
    KVVIZ_MAX_MODELS        how many models stay loaded at once (default 2); the least recently used goes first

`ModelRegistry` loads a model on first use and keeps at most `capacity`, least recently used evicted first. Two
first requests for one model load it once (a lock per name); a load that fails raises ValueError and registers
nothing, so the other models keep serving. Remote code is never trusted: every load goes through
kvviz.models.load_model (trust_remote_code=False) or kvviz.tiny.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import torch

from kvviz import models
from kvviz.memory import configs, count_params

from .checks import check_model_name, looks_like_hub_id

BUNDLED_MODELS = tuple(models.BUNDLED)
DEFAULT_MODEL = models.DEFAULT_MODEL
_MAX_MODELS_ENV, _MAX_PARAMS_ENV = "KVVIZ_MAX_MODELS", "KVVIZ_MAX_PARAMS"


def default_model() -> str:
    """The model selected when a page opens and an API call names none: env KVVIZ_MODEL, else SmolLM2."""
    return os.environ.get("KVVIZ_MODEL", "").strip() or DEFAULT_MODEL


def listed_models() -> list[str]:
    """The models a user may pick: the default first, then the bundled ones, then KVVIZ_MODELS' (no repeats)."""
    extra = [m.strip() for m in os.environ.get("KVVIZ_MODELS", "").split(",") if m.strip()]
    return list(dict.fromkeys([default_model(), *BUNDLED_MODELS, *extra]))


def allow_any_model() -> bool:
    """Whether a user may type any hub id (env KVVIZ_ALLOW_ANY_MODEL=1)."""
    return os.environ.get("KVVIZ_ALLOW_ANY_MODEL", "").strip().lower() in ("1", "true", "yes", "on")


def max_models() -> int:
    """How many models stay resident (env KVVIZ_MAX_MODELS, default 2)."""
    text = os.environ.get(_MAX_MODELS_ENV, "2").strip()
    assert text.isdigit() and int(text) >= 1, f"{_MAX_MODELS_ENV} must be a positive integer, got {text!r}"
    return int(text)


def max_params() -> float:
    """The largest model (parameters) a user may type in: env KVVIZ_MAX_PARAMS, default 2e9 (8e9 with CUDA)."""
    text = os.environ.get(_MAX_PARAMS_ENV, "").strip()
    if not text:
        return 8e9 if torch.cuda.is_available() else 2e9
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    assert value > 0, f"{_MAX_PARAMS_ENV} must be a positive number of parameters such as 2e9, got {text!r}"
    return value


def check_model(value) -> str:
    """The picked model's name: a listed one, or (KVVIZ_ALLOW_ANY_MODEL=1) any hub id; None or "" is the default."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return default_model()
    return check_model_name(value, listed_models(), allow_any_model())


def check_size(name: str) -> int:
    """Parameters of the unlisted hub model `name`, from its config.json alone (no weights downloaded); ValueError
    when it is over max_params(), needs remote code, or the hub cannot be reached (fast, offline included)."""
    try:
        params = count_params(configs.fetch_hub_config(name))
    except ValueError as err:
        raise ValueError(f"Cannot load {name!r}: its size is checked from its config.json before any download, "
                         f"and that failed. {err}") from None
    limit = max_params()
    if params > limit:
        raise ValueError(f"{name!r} has {params / 1e9:.2f} billion parameters; this app loads models up to "
                         f"{limit / 1e9:g} billion (KVVIZ_MAX_PARAMS). Pick a smaller model.")
    return params


def load(name: str):
    """(model, tokenizer) of a checked name: tiny-<arch> builds kvviz's random test model; a hub id the owner did
    not list passes check_size first; anything else goes to kvviz.models.load_model, unmemoised (the registry
    decides what stays resident). trust_remote_code is False on every path."""
    if name not in listed_models() and looks_like_hub_id(name):
        check_size(name)  # first: refusing reads the config alone, no weights
    if name.startswith("tiny-"):
        return models.tiny_model(name.removeprefix("tiny-"))
    return models.load_model(None if name == DEFAULT_MODEL else name, memoise=False)


class ModelRegistry:
    """At most `capacity` loaded models, by name, least recently used evicted first.

    `get(name)` returns the resident (model, tokenizer) at once, else loads it with `loader(name)` under that
    name's lock (concurrent first requests wait for one load). Models are shared read-only between users.
    """

    def __init__(self, loader: Callable[[str], tuple] = load, capacity: Callable[[], int] | int = max_models):
        self._loader = loader
        self._capacity = capacity if callable(capacity) else (lambda: capacity)
        self._lock = threading.Lock()  # guards _loaded and _name_locks; never held while loading
        self._loaded: OrderedDict[str, tuple] = OrderedDict()  # least recently used first
        self._name_locks: dict[str, threading.Lock] = {}
        self.loads: dict[str, int] = {}  # name -> completed loads (tests: one load for concurrent first requests)

    def resident(self) -> list[str]:
        """Loaded models' names, most recently used first."""
        with self._lock:
            return list(reversed(self._loaded))

    def peek(self, name: str):
        """The resident (model, tokenizer) of `name`, or None; does not count as a use."""
        with self._lock:
            return self._loaded.get(name)

    def _hit(self, name: str):
        with self._lock:
            if name in self._loaded:
                self._loaded.move_to_end(name)
                return self._loaded[name]
            return None

    def get(self, name: str, progress=None):
        hit = self._hit(name)
        if hit is not None:
            return hit
        with self._lock:
            name_lock = self._name_locks.setdefault(name, threading.Lock())
        with name_lock:
            hit = self._hit(name)  # loaded by the request we waited for
            if hit is not None:
                return hit
            if progress is not None:
                progress(0.05, desc=f"Loading model {name} (first use; later switches to it are instant)…")
            start = time.perf_counter()
            try:
                pair = self._loader(name)
            except (OSError, RuntimeError, ImportError, KeyError) as err:  # ValueError passes as it is
                raise ValueError(f"Could not load the model {name!r} ({err.__class__.__name__}: {err}). The other "
                                 "models still serve; pick one of them.") from None
            with self._lock:
                self._loaded[name] = pair
                self.loads[name] = self.loads.get(name, 0) + 1
                while len(self._loaded) > max(1, self._capacity()):
                    self._loaded.popitem(last=False)  # in-flight users of an evicted model keep their reference
            if progress is not None:
                progress(1.0, desc=f"Model {name} loaded in {time.perf_counter() - start:.1f} s")
            return pair
