"""kvviz.ui.registry: the models the app serves: which a user may pick, loading them lazily, keeping a few resident.

The Space owner sets the choices in the environment, which the app's runtime reads once as it starts
(kvviz.runtime.Runtime.from_env; tests set the runtime's attributes instead):

    KVVIZ_MODEL             the default selection (default: smollm2-135m, the bundled SmolLM2-135M-Instruct)
    KVVIZ_MODELS            more choices, comma-separated: hub ids, local directories, bundled or tiny-* names
    KVVIZ_ALLOW_ANY_MODEL   1: a user may also type any hub id ("owner/name"); its config.json is read first and
                            the model refused when it has more than KVVIZ_MAX_PARAMS parameters, before any weight
                            is downloaded
    KVVIZ_MAX_PARAMS        that limit (default 2e9 on a CPU, 8e9 with CUDA; weights are held in float32)
    KVVIZ_MAX_MODELS        how many models stay loaded at once (default 2); the least recently used goes first

The resident models are the runtime's pool (`kvviz.runtime.ModelPool`, which kvviz.models.load_model fills too: one
cache of models per process): it loads a model on first use and keeps at most `max_models`, least recently used
evicted first. Two first requests for one model load it once (a lock per name); a load that fails raises ValueError
and registers nothing, so the other models keep serving. Remote code is never trusted: every load goes through
kvviz.models.load_model (trust_remote_code=False) or kvviz.tiny.
"""

from __future__ import annotations

from collections.abc import Callable

from kvviz import models, runtime
from kvviz.memory import configs, count_params

from .checks import check_model_name, looks_like_hub_id

BUNDLED_MODELS = tuple(models.BUNDLED)
DEFAULT_MODEL = models.DEFAULT_MODEL


def default_model() -> str:
    """The model selected when a page opens and an API call names none: env KVVIZ_MODEL, else SmolLM2."""
    return runtime.current().default_model


def listed_models() -> list[str]:
    """The models a user may pick: the default first, then the bundled ones, then KVVIZ_MODELS' (no repeats)."""
    return list(dict.fromkeys([default_model(), *BUNDLED_MODELS, *runtime.current().extra_models]))


def allow_any_model() -> bool:
    """Whether a user may type any hub id (env KVVIZ_ALLOW_ANY_MODEL=1)."""
    return runtime.current().allow_any_model


def max_models() -> int:
    """How many models stay resident (env KVVIZ_MAX_MODELS, default 2)."""
    return runtime.current().max_models


def max_params() -> float:
    """The largest model (parameters) a user may type in: env KVVIZ_MAX_PARAMS, default 2e9 (8e9 with CUDA)."""
    return runtime.current().model_limit()


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


class ModelRegistry(runtime.ModelPool):
    """A pool of the app's models (kvviz.runtime.ModelPool) whose loader is `load` and whose capacity is the current
    runtime's max_models unless given; the app's own pool is the runtime's (`models_pool()`)."""

    def __init__(self, loader: Callable[[str], tuple] | None = None, capacity: Callable[[], int] | int = max_models):
        super().__init__(loader or load, capacity)


def models_pool() -> runtime.ModelPool:
    """The resident models: the current runtime's pool (kvviz.models.load_model keeps its models there too)."""
    return runtime.current().models
