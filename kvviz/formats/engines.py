"""Engine KV-cache dtypes by their engine's own name: `vllm:turboquant_k3v4_nc`, `sglang:fp8_e4m3`, `llama.cpp:q4_0`.

What each engine's `--kv-cache-dtype` (vLLM, SGLang) or `-ctk/-ctv` (llama.cpp) value stores, for K and for V: each
format family declares the engine values it stores (`Family.engine_dtypes`), this module reads them from the
registry and holds the engines' own rules. A value maps to the kvviz storage of each side: an existing kvviz
format where the engine stores exactly that (`fp8_e4m3/unit` for vLLM's fp8 with no checkpoint scales, llama.cpp's
ggml blocks), else a row of `spec.BASES` reached only through its engine name (`vllm.*`: formats/vllm.py and
formats/turboquant.py). The parsed format carries an
`EngineRef` (Format.engine, Format.engine_rot) so that everything below the parser knows which engine it models.

    vllm:<dtype>                 one of VLLM_DTYPES (vllm/config/cache.py CacheDType, the ones kvviz models)
    vllm:<fp8 dtype>/cpu         vLLM's CPU build's fp8 store (fp8, fp8_e4m3, fp8_e5m2): rounded toward zero
    sglang:<dtype>               one of SGLANG_DTYPES
    llama.cpp:<type>             K and V of that type;  llama.cpp:k=<type>,v=<type> for a pair
    llama.cpp:...(/norot)        llama.cpp rotates Q, K and V with a Hadamard transform whenever K or V is quantized
                                 (its PR 21038); /norot is LLAMA_ATTN_ROT_DISABLE=1. The format stores the ggml block
                                 of what it is given; the rotation (Q, K and V rotated, the output un-rotated) belongs
                                 to the engine's read path, which Format.engine_rot asks for.

The engine's layer rules live here too: `engine_skip_layers` (vLLM's TurboQuant keeps the first and last 2 layers of
a dense model in 16 bits); and its model rules: `check_model` (vLLM's DeepSeek MLA records on MLA models only, and
on MLA models only the dtypes its MLA backends take).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .family import ENGINE_NAMES, REGISTRY, VLLM_CPU  # the engines kvviz models; vLLM's CPU-build suffix
from .spec import BASES, NOROT, EngineRef, SpecParts, llama_cpp_quantized, parse_spec

# vLLM --kv-cache-dtype -> (K storage, V storage), SGLang's the same, llama.cpp -ctk / -ctv -> kvviz base: each family
# declares the engine values it stores (Family.engine_dtypes: floats.py holds "auto", "fp8", the casts and vLLM's CPU
# fp8 names; vllm.py, turboquant.py, ultraquant.py, ds_mla.py vLLM's own stores; fp4.py SGLang's FP4; ggml.py
# llama.cpp's types). These tables are the built-in families'; engine_values() reads the registry as it is now.
VLLM_DTYPES: dict[str, tuple[str, str]] = REGISTRY.engine_dtypes("vllm")
# vLLM values kvviz does not model, with the reason (named in the error).
VLLM_UNMODELED = {"fp8_inc": "Intel Gaudi's FP8"}
TURBOQUANT_DTYPES = tuple(name for name in VLLM_DTYPES if name.startswith("turboquant_"))
# TurboQuant and UltraQuant rotate with a Sylvester Hadamard matrix of the head's size: power-of-two head_dim only
# (int4_per_token_head rotates blocks of the largest power of two dividing head_dim: any even head_dim).
VLLM_POW2_DTYPES = (*TURBOQUANT_DTYPES, "ultraquant_4bit")
# The latent records of MLA models (DeepSeek's layouts), and the dtypes vLLM's MLA backends take besides them
# (v1/attention/backends/mla/*.py supported_kv_cache_dtypes; fp8_e5m2 on ROCm's AITER MLA).
VLLM_MLA_ONLY_DTYPES = ("fp8_ds_mla", "nvfp4_ds_mla")
VLLM_NVFP4_DTYPES = ("nvfp4", "nvfp4_4over6", "nvfp4_ds_mla")  # E2M1 under an E4M3 scale per 16 values
VLLM_MLA_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", *VLLM_MLA_ONLY_DTYPES)

SGLANG_DTYPES: dict[str, tuple[str, str]] = REGISTRY.engine_dtypes("sglang")
SGLANG_UNMODELED = {"mxfp8": "MX FP8", "fp4_e2m1": "deprecated, use fp4_mx_block16"}

LLAMA_CPP_DTYPES: dict[str, str] = REGISTRY.engine_dtypes("llama.cpp")  # f32 is not modeled
LLAMA_CPP_UNMODELED = {"f32": "32-bit floats (kvviz stores at most 16)"}
_UNMODELED = {"vllm": VLLM_UNMODELED, "sglang": SGLANG_UNMODELED, "llama.cpp": LLAMA_CPP_UNMODELED}


def engine_values() -> dict[str, tuple[dict, dict]]:
    """engine -> (its values -> storage, values kvviz lacks -> why), from the registry as it is now."""
    return {engine: (REGISTRY.engine_dtypes(engine), _UNMODELED[engine]) for engine in ENGINE_NAMES}


# The built-in families' table: engine -> (its values -> storage, values kvviz lacks -> why).
ENGINE_VALUES: dict[str, tuple[dict, dict]] = engine_values()


def is_engine_spec(text: str) -> bool:
    """True for `engine:value` (a colon before any "=" or ","): kvviz's own specs never contain a colon."""
    head = text.split("=", 1)[0].split(",", 1)[0]
    return ":" in head


def engine_sides(spec: str) -> tuple[SpecParts, SpecParts]:
    """`engine:value` -> (K parts, V parts), each carrying its EngineRef. ValueError naming the engine's list."""
    engine, _, value = spec.strip().partition(":")
    engine, value = engine.strip().lower(), value.strip()
    if engine not in ENGINE_NAMES:
        raise ValueError(f"Unknown engine {engine!r} in {spec!r}: kvviz knows {', '.join(ENGINE_NAMES)} "
                         "(write e.g. vllm:turboquant_k3v4_nc, sglang:fp8_e4m3, llama.cpp:q4_0).")
    if engine == "llama.cpp":
        return _llama_cpp_sides(spec, value)
    table, _ = engine_values()[engine]
    key = value.lower()
    _check_value(engine, key, spec)
    k, v = table[key]
    return _with_ref(k, EngineRef(engine, key, "k")), _with_ref(v, EngineRef(engine, key, "v"))


def _llama_cpp_sides(spec: str, value: str) -> tuple[SpecParts, SpecParts]:
    key = value.lower()
    rotation = not key.endswith(NOROT)
    key = key.removesuffix(NOROT).strip()
    if "=" in key:
        sides = dict(part.strip().partition("=")[::2] for part in key.split(","))
        if set(sides) != {"k", "v"} or key.count(",") != 1:
            raise ValueError(f"Malformed llama.cpp pair {spec!r}: write llama.cpp:k=TYPE,v=TYPE, e.g. "
                             "llama.cpp:k=q8_0,v=q4_0 (add /norot for LLAMA_ATTN_ROT_DISABLE=1).")
        k_type, v_type = sides["k"].strip(), sides["v"].strip()
    else:
        k_type = v_type = key
    for t in (k_type, v_type):
        _check_value("llama.cpp", t, spec)
    dtype = k_type if k_type == v_type else f"k={k_type},v={v_type}"
    rotates = rotation and llama_cpp_quantized(dtype)  # llama.cpp rotates only when K or V is quantized
    table = REGISTRY.engine_dtypes("llama.cpp")
    return (_with_ref(table[k_type], EngineRef("llama.cpp", dtype, "k", rotates)),
            _with_ref(table[v_type], EngineRef("llama.cpp", dtype, "v", rotates)))


def _check_value(engine: str, value: str, spec: str) -> None:
    table, unmodeled = engine_values()[engine]
    if value in table:
        return
    known = ", ".join(table)
    if engine == "vllm" and value.endswith(VLLM_CPU):
        raise ValueError(f"{spec!r}: vLLM's CPU build serves only auto and the fp8 cache dtypes; kvviz models its "
                         f"fp8 stores as vllm:fp8/cpu, vllm:fp8_e4m3/cpu and vllm:fp8_e5m2/cpu.")
    if value in unmodeled:
        raise ValueError(f"{spec!r}: kvviz does not model {engine}'s {value} ({unmodeled[value]}). Pick one of "
                         f"{engine}'s values kvviz models: {known}.")
    raise ValueError(f"{engine} has no KV cache dtype {value!r} ({spec!r}). {engine}'s values: {known}.")


def _with_ref(storage: str, ref: EngineRef) -> SpecParts:
    if storage in BASES and BASES[storage].engine is not None:  # an engine-only row: its block, no options
        info = BASES[storage]
        return SpecParts(storage, info.default_granularity, info.block, False, False, engine=ref)
    return dataclasses.replace(parse_spec(storage), engine=ref)


def rounds_toward_zero(ref: EngineRef | None) -> bool:
    """True for vLLM's CPU-build fp8 names (`vllm:fp8_e4m3/cpu`): its store truncates toward zero."""
    return ref is not None and ref.engine == "vllm" and ref.dtype.endswith(VLLM_CPU)


def check_head_dim(ref: EngineRef, head_dim: int) -> None:
    """ValueError when the engine would refuse this head_dim for the value (what vLLM requires, said)."""
    pow2 = head_dim >= 8 and not head_dim & (head_dim - 1)
    if ref.engine == "vllm" and ref.dtype in VLLM_POW2_DTYPES and not pow2:
        raise ValueError(f"vllm:{ref.dtype} needs a head_dim that is a power of two (at least 8): vLLM rotates "
                         f"each head with a Sylvester Hadamard matrix of that size; this model's head_dim is "
                         f"{head_dim}. Use vllm:int4_per_token_head, vllm:int8_per_token_head or vllm:fp8 here.")
    if rounds_toward_zero(ref) and head_dim % 32:
        raise ValueError(f"vllm:{ref.dtype} needs head_dim to be a multiple of 32 (vLLM's CPU attention refuses an "
                         f"fp8 cache otherwise), got {head_dim}. Use vllm:{ref.dtype.removesuffix(VLLM_CPU)}, the "
                         "GPU's store.")
    if ref.engine == "vllm" and ref.dtype in VLLM_NVFP4_DTYPES and head_dim % 16:
        raise ValueError(f"vllm:{ref.dtype} needs head_dim to be a multiple of 16 (one E4M3 scale per 16 values), "
                         f"got {head_dim}.")


def check_model(formats, mla: bool) -> None:
    """ValueError where vLLM would refuse the formats of a KV spec (an iterable of Formats: a KVSpec's k and v) on a
    model with MLA (`mla`: kv_lora_rank in the config) or without it:

    - fp8_ds_mla / nvfp4_ds_mla store an MLA latent record: MLA models only (vLLM's MLA attention writes them).
    - On an MLA model vLLM picks an MLA backend, and those take auto, float16, bfloat16, fp8, fp8_e4m3 (fp8_e5m2 on
      ROCm) and the two DeepSeek layouts only (v1/attention/backends/mla/*.py supported_kv_cache_dtypes): nvfp4 is
      refused by VllmConfig.validate_nvfp4_kv_cache_with_mla, the per-token-head, TurboQuant and UltraQuant dtypes
      by backend selection (no MLA backend lists them).
    """
    for ref in {f.parts.engine for f in formats if f.parts.engine is not None}:
        if ref.engine != "vllm":
            continue
        if ref.dtype in VLLM_MLA_ONLY_DTYPES and not mla:
            raise ValueError(f"vllm:{ref.dtype} is DeepSeek's MLA latent cache (one record per token of the "
                             f"compressed KV and the RoPE key): it applies to MLA models only (DeepSeek-V3, Kimi "
                             f"K2: kv_lora_rank in the config), and this model has no MLA. Use vllm:fp8 or "
                             f"vllm:nvfp4 here.")
        if mla and ref.dtype not in VLLM_MLA_DTYPES:
            why = ("vLLM refuses nvfp4 with MLA (VllmConfig.validate_nvfp4_kv_cache_with_mla)"
                   if ref.dtype in VLLM_NVFP4_DTYPES else "no vLLM MLA attention backend takes it")
            raise ValueError(f"vllm:{ref.dtype} cannot serve an MLA model (kv_lora_rank in the config): {why}. "
                             f"On MLA models use one of vllm:{', vllm:'.join(VLLM_MLA_DTYPES)}.")


# ------------------------------------------------------------------------------------------ layer rules

TURBOQUANT_BOUNDARY = 2  # vLLM's get_boundary_skip_layers(n=2)
# Layer types that hold no recurrent state (transformers' names, kvviz.memory's kinds): a model of only these is
# dense for vLLM (ModelConfig.is_hybrid is False); a Mamba / linear-attention / conv layer makes it hybrid.
_STATELESS_TYPES = ("full_attention", "attention", "sliding_attention", "chunked_attention", "shared", "dummy", "mlp",
                    "moe")
# The dtype a skipped layer stores: vLLM's kv_cache_dtype_skip_layers keep "auto", the model's own dtype.
_SKIP_DTYPE = {"vllm": "auto"}


def engine_skip_layers(kv, num_layers: int, layer_types=None) -> frozenset[int]:
    """Layers the engine keeps in 16 bits for this KV spec (a kvviz KVSpec or anything with .k and .v formats).

    vLLM's TurboQuant presets (turboquant/config.py `get_boundary_skip_layers`): on a dense model the first and last
    2 layers (at most half the layers); on a hybrid model (a layer with a recurrent state: Mamba, linear
    attention, a Falcon-H1 "hybrid" layer) none. layer_types: one string per layer, as transformers'
    config.layer_types or kvviz.memory's layer kinds (None: all attention). Every other engine value keeps no
    layer back.
    """
    refs = [f.parts.engine for f in (kv.k, kv.v) if f.parts.engine is not None]
    if not any(r.engine == "vllm" and r.dtype in TURBOQUANT_DTYPES for r in refs):
        return frozenset()
    if layer_types is not None and any(t not in _STATELESS_TYPES for t in layer_types):
        return frozenset()
    n = min(TURBOQUANT_BOUNDARY, num_layers // 2)
    if n <= 0:
        return frozenset()
    return frozenset(range(n)) | frozenset(range(num_layers - n, num_layers))


def skip_layer_spec(kv) -> str:
    """The engine dtype a layer that engine_skip_layers names stores instead: vLLM keeps it in "auto"."""
    engines = {f.parts.engine.engine for f in (kv.k, kv.v) if f.parts.engine is not None}
    (engine,) = engines
    return f"{engine}:{_SKIP_DTYPE[engine]}"
