"""A model run as llama.cpp runs it, for the `llama.cpp:<type>` names in quality.kld, Compare, Sensitivity and the
plan search (kvviz.quality.divergence, kvviz.quality.compare, kvviz.analysis.sensitivity): its cache and attention
(kvviz.cache.QuantizedKVCache holding K/V in llama.cpp's channel order and rotation, read by kvviz.ggml_attention
through the "kvviz" attention function) and its weight matmuls, whose inputs ggml's CPU matmul converts to the weight
type's `vec_dot_type` (8-bit blocks for quantized weights: kvviz.ggml_attention.round_activation). The KL of such a
name is measured as llama.cpp's `--kl-divergence` measures it: against the same run with an f16 cache
(`llama.cpp:f16`), all tokens of the window in one batch, every position reading K/V as stored.

Why the matmul inputs matter: a KV error, however small, flips some of those 8-bit roundings in every later layer,
so llama.cpp's KLD of a cache type is several times what the stored values alone cause (docs/engines.md).
kvviz.engines.simulate.llamacpp_kld computes the same figures through kvviz.ggml_attention.attention (store and read
in one call, no cache): the reference these runs are tested against.

A plan's exact layers (None) hold llama.cpp's f16 cache in such a run (`held`): llama.cpp has no unquantized cache,
and its f16 cache is what every KL of the run is taken against. Compare, Sensitivity and the plan search run a plan
holding a `llama.cpp:` name through `values` too (one unbatched run per plan), and Compare its free-running text
through `greedy`.

    vec_dot = weight_vec_dot(model, gguf)        # {Linear name: vec_dot_type}, from the GGUF's tensor types
    lp = logprobs(model, ids, as_plan("llama.cpp:q4_0"), vec_dot)   # ids [1, T] -> [T, vocab] float64
    tokens = greedy(model, ids, as_plan("llama.cpp:q4_0"), vec_dot)  # next(tokens): llama.cpp's next greedy token
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Iterator

import gguf as gguf_lib
import torch

from kvviz import ggml_attention, models
from kvviz.attention import ATTN_NAME
from kvviz.cache import QuantizedKVCache, model_layer_types
from kvviz.formats import KVSpec, Plan, as_plan, parse_kv
from kvviz.formats.engines import LLAMA_CPP_DTYPES
from kvviz.metrics import log_probs, per_position
from kvviz.rowstable import row_stable

ENGINE = "llama.cpp"
BASELINE = "llama.cpp:f16"  # what llama.cpp's KLD of a cache type is measured against
_F16 = parse_kv(BASELINE)
_TYPE = {base: name for name, base in LLAMA_CPP_DTYPES.items()}  # a llama.cpp name's kvviz base -> its -ctk value


def runs_llamacpp(plan: Plan) -> bool:
    """Whether a plan stores a llama.cpp name in some layer: it then runs with llama.cpp's arithmetic throughout."""
    return any(kv.k.engine == ENGINE for kv in plan.specs)


def one_side(kv: KVSpec, side: str, name: str) -> KVSpec:
    """The llama.cpp pair that stores `side` ("k" or "v") of the llama.cpp name kv as kv does and the other side in
    llama.cpp's f16 cache, with kv's rotation setting (llama.cpp rotates only the quantized side), labelled `name`:
    one side of one layer, as Sensitivity measures it against the f16 baseline."""
    assert kv.k.engine == ENGINE and kv.v.engine == ENGINE, f"{kv.name} is not a llama.cpp name"
    types = {"k": _TYPE[kv.k.base], "v": _TYPE[kv.v.base]}
    k, v = (types["k"], "f16") if side == "k" else ("f16", types["v"])
    quantized = any(t not in ("f16", "bf16") for t in types.values())
    pair = parse_kv(f"{ENGINE}:k={k},v={v}" + ("/norot" if quantized and not kv.k.engine_rot else ""))
    return KVSpec(pair.k, pair.v, name)


# ---- the GGUF's tensor types -----------------------------------------------------------------------------------

def _architecture(reader) -> str:
    field = reader.fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def gguf_types(gguf_path) -> tuple[str, dict[str, str]]:
    """(architecture, {tensor name without ".weight": ggml type name}) of the GGUF at gguf_path, read once per
    file version (parsing the tokenizer's metadata takes seconds)."""
    path = Path(gguf_path)
    return _read_gguf_types(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_gguf_types(path: str, mtime_ns: int) -> tuple[str, dict[str, str]]:
    reader = gguf_lib.GGUFReader(path)
    return _architecture(reader), {t.name.removesuffix(".weight"): t.tensor_type.name for t in reader.tensors}


_NORM_ROPE = ("llama",)  # llama_model_rope_type() == LLAMA_ROPE_TYPE_NORM among the bundled models' archs


def interleaved_rope(gguf_path) -> bool:
    """Whether llama.cpp holds this GGUF's Q/K channels RoPE-interleaved (its "norm" RoPE: Llama's converter
    permutes q/k weights, transformers un-permutes them): a different head_dim order for the cache's blocks."""
    return gguf_types(gguf_path)[0] in _NORM_ROPE


def source_gguf(model) -> Path | None:
    """The GGUF a bundled model's weights came from (kvviz.models names it by its hub id), or None."""
    for name, spec in models.BUNDLED.items():
        if spec.hub_id == getattr(model.config, "_name_or_path", None):
            return models.bundled_gguf(name)
    return None


_DTYPE_VEC_DOT = {torch.float32: "f32", torch.float16: ggml_attention.F16, torch.bfloat16: "bf16"}


def weight_vec_dot(model, gguf_path=None) -> dict[str, str]:
    """{module name: vec_dot_type} for each nn.Linear of `model`: what ggml's CPU matmul converts that layer's
    input to (kvviz.ggml_attention.WEIGHT_VEC_DOT). gguf_path: the GGUF the weights came from, whose tensor types
    set it (a tied LM head reads the token embedding's type, as llama.cpp does when the GGUF has no
    `output.weight`); None: a bundled model's own GGUF, else a GGUF of the weights as they are (F32, F16, BF16:
    convert_hf_to_gguf's default outtype keeps 16-bit weights)."""
    gguf_path = gguf_path if gguf_path is not None else source_gguf(model)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    if gguf_path is None:
        return {name: _DTYPE_VEC_DOT.get(m.weight.dtype, "f32") for name, m in linears.items()}
    architecture, types = gguf_types(gguf_path)
    arch = {v: k for k, v in gguf_lib.MODEL_ARCH_NAMES.items()}[architecture]
    types = dict(types)
    types.setdefault("output", types.get("token_embd"))
    names = gguf_lib.get_tensor_name_map(arch, model.config.get_text_config(decoder=True).num_hidden_layers)
    out = {}
    for name in linears:
        tensor = names.get_name(name)
        if tensor is not None and types.get(tensor) is not None:
            out[name] = ggml_attention.WEIGHT_VEC_DOT[types[tensor]]
    return out


@contextlib.contextmanager
def rounded_inputs(model, vec_dot: dict[str, str]):
    """Inside the block, every Linear named in `vec_dot` reads its input as ggml's CPU matmul does (rounded to its
    vec_dot_type: kvviz.ggml_attention.round_activation)."""
    modules = dict(model.named_modules())

    def hook(name):
        return lambda module, args: (ggml_attention.round_activation(args[0], vec_dot[name]), *args[1:])

    hooks = [modules[name].register_forward_pre_hook(hook(name)) for name in vec_dot if vec_dot[name] != "f32"]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


# ---- runs ------------------------------------------------------------------------------------------------------

def held(model, plan: Plan) -> Plan:
    """`plan` as a llama.cpp run holds it on `model`: its exact layers (None) in llama.cpp's f16 cache, the
    baseline's, so that a plan quantizing one layer differs from the baseline in that layer alone."""
    text = model.config.get_text_config(decoder=True)
    kvs = plan.resolve(text.num_hidden_layers, model_layer_types(model.config))
    return plan if all(kv is not None for kv in kvs) else as_plan([_F16 if kv is None else kv for kv in kvs])


@contextlib.contextmanager
def arithmetic(model, vec_dot: dict[str, str]):
    """Inside the block, `model` runs with llama.cpp's arithmetic: the "kvviz" attention function (which reads a
    llama.cpp cache layer as kvviz.ggml_attention.read does) and every Linear's input rounded (rounded_inputs),
    row-stable as every kvviz measurement (kvviz.rowstable)."""
    before = model.config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    try:
        with rounded_inputs(model, vec_dot), row_stable(model):
            yield
    finally:
        model.set_attn_implementation(before)


@torch.no_grad()
def logprobs(model, ids: torch.Tensor, plan: Plan, vec_dot: dict[str, str]) -> torch.Tensor:
    """log-softmax [T, vocab] (float64) of the tokens ids [1, T] run through `model` as llama.cpp runs them: one
    batch, a QuantizedKVCache of `plan` (held) read by the "kvviz" attention function (llama.cpp's names through
    kvviz.ggml_attention), every Linear's input rounded as `vec_dot` says (weight_vec_dot)."""
    cache = QuantizedKVCache(model.config, held(model, plan), stage=False)
    with arithmetic(model, vec_dot):
        logits = model(input_ids=ids.to(model.device), cache=cache, use_cache=True).logits[0]
    return log_probs(logits)


def values(model, ids: torch.Tensor, plans: list[Plan], score_from: int, vec_dot: dict[str, str]) -> list[tuple]:
    """Per-position (kld, nll, nll_base, same_top) of each plan (runs_llamacpp) against llama.cpp's f16 cache run
    on the window ids [1, T], positions score_from..T-2, as kvviz.analysis.teacher_forced.row_values returns them."""
    t = ids.shape[1]
    targets = ids[0, score_from + 1 :].to(model.device)
    base = logprobs(model, ids, as_plan(BASELINE), vec_dot)[score_from : t - 1]
    return [per_position(base, logprobs(model, ids, p, vec_dot)[score_from : t - 1], targets) for p in plans]


def greedy(model, ids: torch.Tensor, plan: Plan, vec_dot: dict[str, str]) -> Iterator[int]:
    """llama.cpp's greedy continuation of the prompt ids [1, T] with a cache of `plan` (held): the first token from
    the prompt's batch (which reads its own K/V as stored), then one token per step, each fed back. Endless: the
    caller stops. The arithmetic is on only inside each step, so other runs of `model` may come between two."""
    cache = QuantizedKVCache(model.config, held(model, plan), stage=False)
    step = ids.to(model.device)
    while True:
        with torch.no_grad(), arithmetic(model, vec_dot):
            token = int(model(input_ids=step, cache=cache, use_cache=True).logits[0, -1].argmax())
        yield token
        step = torch.tensor([[token]], device=model.device)
