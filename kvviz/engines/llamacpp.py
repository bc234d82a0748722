"""llama.cpp in-process through llama-cpp-python: teacher-forced KLD of its KV cache types against an f16 cache.

For each K/V type pair the GGUF is loaded once (`llama_cpp.Llama(..., logits_all=True, type_k=..., type_v=...,
flash_attn=True)`), the same tokens are evaluated, and every position's logits are kept: [tokens, vocab] float32.
The baseline is the same model with an f16 K and V cache. Statistics are kvviz.metrics' (llama.cpp's own
`llama-perplexity --kl-divergence` definitions) over positions 0..tokens-2, each predicting the next token.

Why llama.cpp's figures differ from kvviz's bare formats (measured: benchmarks/llamacpp_fidelity.py), each
simulated by kvviz.engines.simulate.llamacpp_kld with kvviz.ggml_attention:
- every weight matmul rounds its input to 8 bits (q8_0 / q8_1 / q8_K, the weight type's vec_dot_type): a KV
  error flips some of those roundings in each later layer, which is most of q8_0's KLD (0.0034 here, 0.0003 for
  kvviz's bare q8_0 at 512 tokens of SmolLM2);
- builds since April 2026 (this one included) rotate a quantized K (and Q) by a Hadamard transform of the largest
  power of two >= 64 dividing head_dim, and a quantized V by 64-wide blocks, un-rotating the output
  (`rotate=False` sets LLAMA_ATTN_ROT_DISABLE=1);
- for Llama-family GGUFs Q/K channels are RoPE-interleaved (the converter permutes the weights), so the cache's
  32-value blocks group other channels than transformers' order does;
- its CPU flash attention converts Q to K's dot-product partner (q8_0 for q4_0 ...) when the cache is quantized;
- within one batch, the tokens' own K/V are written to the cache first and read back as stored, position 0 too.
The baseline is llama.cpp's own f16 cache with the same arithmetic.

    from kvviz.engines import llamacpp
    stats = llamacpp.kld(["q8_0", "k=q8_0,v=q4_0"], tokens=256)   # {spec: {"mean": ..., "p99": ..., ...}}

Needs `pip install llama-cpp-python==0.3.36` (builds llama.cpp from source: about 4 minutes on 2 idle cores).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch

from kvviz import export, models
from kvviz.formats import parse_kv
from kvviz.metrics import kld_stats, log_probs
from kvviz.quality.corpus import wikitext

ENGINE = "llama.cpp"
_ROT_ENV = "LLAMA_ATTN_ROT_DISABLE"
MIN_TOKENS = 16


def import_llama_cpp():
    try:
        import llama_cpp
    except ImportError as err:
        raise ValueError("The llama.cpp bridge needs llama-cpp-python: `pip install llama-cpp-python==0.3.36` "
                         f"(it builds llama.cpp from source, a few minutes) ({err}).") from err
    return llama_cpp


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


_ENV_LOCK = threading.Lock()  # the app serves requests on threads; os.environ is one per process


@contextlib.contextmanager
def _rotation(rotate: bool):
    """llama.cpp reads LLAMA_ATTN_ROT_DISABLE when it builds a KV cache (at context creation); held under a lock so
    two requests with different rotations cannot see each other's setting."""
    with _ENV_LOCK:
        old = os.environ.get(_ROT_ENV)
        if not rotate:
            os.environ[_ROT_ENV] = "1"
        else:
            os.environ.pop(_ROT_ENV, None)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(_ROT_ENV, None)
            else:
                os.environ[_ROT_ENV] = old


def type_pair(spec: str) -> tuple[str, str]:
    """llama.cpp's (-ctk, -ctv) types for a kvviz spec ("q8_0", "k=q8_0,v=q4_0", "fp16"); ValueError with
    kvviz.export's reason when llama.cpp has no such cache type."""
    kv = parse_kv(spec)
    row = export.export_commands(kv, "model.gguf")["llama.cpp"]
    if not row["supported"]:
        raise ValueError(f"{spec!r} cannot run in llama.cpp: {row['note']}")
    flags = row["flags"].split()  # "-ctk K -ctv V [-fa on]"
    return flags[flags.index("-ctk") + 1], flags[flags.index("-ctv") + 1]


def _load(llama_cpp, path: Path, n_ctx: int, k_type: str, v_type: str, flash_attn: bool, rotate: bool,
          threads: int | None):
    """A llama_cpp.Llama with these cache types and all logits kept; llama.cpp's own reason when it refuses."""
    kwargs = dict(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=min(n_ctx, 512), logits_all=True,
                  flash_attn=flash_attn, verbose=False, type_k=getattr(llama_cpp, f"GGML_TYPE_{k_type.upper()}"),
                  type_v=getattr(llama_cpp, f"GGML_TYPE_{v_type.upper()}"))
    if threads:
        kwargs.update(n_threads=threads, n_threads_batch=threads)
    with _captured_log(llama_cpp) as log, _rotation(rotate):
        try:
            return llama_cpp.Llama(**kwargs)
        except ValueError as err:  # "Failed to create llama_context" / "Failed to load model": why is in the log
            reason = " ".join(line.strip() for line in log if line.strip()) or str(err)
            raise ValueError(f"llama.cpp refused K {k_type}, V {v_type}"
                             f"{'' if flash_attn else ' without flash attention'} for {path.name}: {reason}") from err


def _logprobs(llm, ids: list[int]) -> torch.Tensor:
    """Teacher-forced log-probs [len(ids), vocab] float32 (row t: the distribution of token t + 1); closes llm."""
    try:
        llm.eval(ids)
        logits = torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))  # [T, vocab]
    finally:
        llm.close()
    return log_probs(logits).float()


def kld(specs: list[str], *, model=None, text: str | None = None, tokens: int = 512, flash_attn: bool = True,
        rotate: bool = True, threads: int | None = None) -> dict[str, dict]:
    """{spec: stats}: see run()."""
    return run(specs, model=model, text=text, tokens=tokens, flash_attn=flash_attn, rotate=rotate, threads=threads)[1]


def run(specs: list[str], *, model=None, text: str | None = None, tokens: int = 512, flash_attn: bool = True,
        rotate: bool = True, threads: int | None = None,
        on_pair: Callable[[int, str], None] | None = None) -> tuple[list[int], dict[str, dict]]:
    """llama.cpp's teacher-forced KLD of each spec's K/V cache types against an f16 cache.

    specs: kvviz specs llama.cpp can store ("q8_0", "k=q8_0,v=q4_0", "q4_1", ...). model: None (the bundled SmolLM2
    GGUF), a bundled model's name, or a .gguf path. text: default the WikiText-2 slice; its first `tokens` tokens are
    evaluated (tokens - 1 positions scored). flash_attn: llama.cpp refuses a quantized V without it (ValueError with
    its reason). rotate: llama.cpp's default Hadamard rotation of a quantized K/V (False: LLAMA_ATTN_ROT_DISABLE=1).
    on_pair(i, spec): called before the i-th spec runs (0-based, after the baseline), for a progress bar.

    Returns (token ids scored [T], {spec: stats}), stats: kvviz.metrics.STAT_KEYS plus "engine", "k_type",
    "v_type", "rotation", "model" and "estimate" ("full vocabulary").
    """
    if isinstance(specs, str):
        raise ValueError("specs must be a list of KV specs, e.g. ['q8_0', 'k=q8_0,v=q4_0'].")
    if not isinstance(tokens, int) or tokens < MIN_TOKENS:
        raise ValueError(f"tokens must be a whole number >= {MIN_TOKENS}; got {tokens!r}.")
    pairs = {spec: type_pair(spec) for spec in specs}  # bad specs fail before any model loads
    path = resolve_gguf(model)
    llama_cpp = import_llama_cpp()
    if text is None:
        text = wikitext()
    run = dict(flash_attn=flash_attn, rotate=rotate, threads=threads)
    llm = _load(llama_cpp, path, tokens, "f16", "f16", **run)
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True)[:tokens]
    if len(ids) < MIN_TOKENS:
        llm.close()
        raise ValueError(f"The text has {len(ids)} tokens; the bridge needs at least {MIN_TOKENS}. Give a longer text.")
    targets = torch.tensor(ids[1:])  # [T - 1]
    base = _logprobs(llm, ids)[:-1]  # [T - 1, vocab]
    out = {}
    for i, (spec, (k_type, v_type)) in enumerate(pairs.items()):
        if on_pair is not None:
            on_pair(i, spec)
        cand = _logprobs(_load(llama_cpp, path, tokens, k_type, v_type, **run), ids)[:-1]
        stats = kld_stats(base, cand, targets)
        stats.update(engine=f"llama.cpp (llama-cpp-python {llama_cpp.__version__})", k_type=k_type, v_type=v_type,
                     rotation="llama.cpp's default" if rotate else f"off ({_ROT_ENV}=1)",
                     estimate="full vocabulary", model=path.name)
        out[spec] = stats
    return ids, out


def decode_speed(types: list[tuple[str, str]], *, context: int, tokens: int = 8, rounds: int = 2, model=None,
                 threads: int | None = None, text: str | None = None) -> dict[tuple[str, str], float]:
    """{(k_type, v_type): tokens/s} of llama.cpp's single-token decode after a `context`-token prompt, one GGUF
    load per pair (flash attention, llama.cpp's default rotation), in interleaved rounds (best kept): the peer of
    `python -m kvviz bench --contexts`. types: llama.cpp cache types, e.g. [("f16", "f16"), ("q4_0", "q4_0")];
    threads: llama.cpp's threads (None: its default). The prompt is `text` (default WikiText-2) repeated."""
    llama_cpp = import_llama_cpp()
    path = resolve_gguf(model)
    llms = {pair: _load(llama_cpp, path, context + tokens + 8, *pair, True, True, threads) for pair in types}
    try:
        first = next(iter(llms.values()))
        ids = first.tokenize((text or wikitext()).encode(), add_bos=False)
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
