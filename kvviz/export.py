"""vLLM, SGLang and llama.cpp flags for a kvviz KV spec: which KV cache dtype each engine offers for it, or none.

    >>> export_commands("fp8_e4m3")["sglang"]["cli"]
    'python -m sglang.launch_server --model-path MODEL --kv-cache-dtype fp8_e4m3 --quantization-param-path scales.json'
    >>> export_commands("k8v4")["vllm"]["supported"]
    False
    >>> export_commands("k=q8_0,v=q4_0")["llama.cpp"]["flags"]
    '-ctk q8_0 -ctv q4_0 -fa on'

A format is reported as supported only when the engine stores the same thing: same element format, same scale
granularity. Otherwise `supported` is False, `cli`/`python` are empty, and `note` names the closest engine option
(if any) and how it differs. Nothing is mapped silently.

Sources (checked against the engines' own code as found in public repositories, late 2026; flags move between
releases, so the notes say from which release a value exists):
- vLLM `vllm/config/cache.py` `CacheDType`: "auto", "float16", "bfloat16", "fp8" (= E4M3 on CUDA), "fp8_e4m3",
  "fp8_e5m2", "fp8_inc", "fp8_ds_mla"; recent releases (0.24+) add "int8_per_token_head", "fp8_per_token_head"
  (dynamic per token-head fp32 scales, Triton attention backend only), "int4_per_token_head" (asymmetric with a
  rotation), "nvfp4" (0.25+, Blackwell) and TurboQuant modes; 0.32 lists "ultraquant_4bit" and "nvfp4_ds_mla".
  The DeepSeek layouts fp8_ds_mla / nvfp4_ds_mla apply to MLA models only (kvviz.formats.engines.check_model). FP8 per-tensor scales come from the checkpoint
  (`k_scale`/`v_scale`, e.g. written by llm-compressor) or `--calculate-kv-scales` (computed on the first batch);
  without either they are 1.0.
- SGLang `server_args.py` `--kv-cache-dtype` choices: "auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16",
  "nvfp4", "fp4_mx_block16" ("fp4_e2m1" is deprecated in favour of fp4_mx_block16). FP8 scales come from the
  checkpoint or `--quantization-param-path scales.json` ({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor":
  {tp_rank: {layer: scale}}}}, one per-tensor scale per layer used for both K and V; see kvviz.calibrate). The
  FP4 modes compute their block scales on the fly and take no file.
- llama.cpp `common/arg.cpp`: `-ctk` / `--cache-type-k` and `-ctv` / `--cache-type-v` take f32, f16, bf16, q8_0,
  q4_0, q4_1, iq4_nl, q5_0, q5_1 (K and V independently; kvviz's llama.cpp formats are bit-exact with these, see
  kvviz/formats/ggml.py). A quantized V needs flash attention (`-fa on`; llama.cpp refuses the context otherwise:
  "V cache quantization requires flash_attn"). Builds since April 2026 (pull request 21038) rotate Q, K and V with
  a Hadamard transform before storing a quantized type; `LLAMA_ATTN_ROT_DISABLE=1` turns that off and stores what
  kvviz's unrotated formats store. llama-cpp-python takes the same as `type_k` / `type_v` / `flash_attn`.
"""

from __future__ import annotations

import warnings

from kvviz.formats import ENGINE_NAMES, Format, KVSpec, as_plan, engine_skip_layers, parse_kv, spec_text
from kvviz.formats.engines import VLLM_CPU

_SCALES_FILE = "scales.json"
# K/V type pairs whose CUDA flash-attention kernels a default llama.cpp build compiles (GGML_CUDA_FA_ALL_QUANTS off)
_CUDA_FA_DEFAULT_PAIRS = {("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0")}


def export_commands(spec: "str | KVSpec", model: str = "MODEL", scales_path: str | None = _SCALES_FILE,
                    model_dtype: str | None = None) -> dict:
    """Engine flags for one KV spec (a pair "k=int8,v=int4", one spec for both, or a preset).

    model: the model id or path to put in the commands (llama.cpp: a GGUF file). scales_path: the calibrated
    scale file to pass to SGLang for FP8 E4M3 (`kvviz.calibrate.save_scales` writes it); None leaves it out
    (SGLang then uses 1.0).

    Returns {"vllm": {...}, "sglang": {...}, "llama.cpp": {...}}, each
        {"supported": bool, "kv_cache_dtype": str | None, "flags": str, "cli": str, "python": str, "note": str}
    where flags are the engine's KV options alone (e.g. "--kv-cache-dtype fp8_e4m3", "-ctk q8_0 -ctv q4_0 -fa on"),
    and flags/cli/python are empty strings when unsupported. llama.cpp's kv_cache_dtype is its type for both
    ("q8_0") or, when K and V differ, the pair in kvviz's spelling ("k=q8_0,v=q4_0"). Raises ValueError on a bad
    spec. model_dtype ("bfloat16" / "float16", the model's weights): when given, a combination an engine is known to
    mishandle is warned about (warnings.warn) and named in its note.
    """
    kv = parse_kv(spec)
    rows = {
        "vllm": _vllm(kv, model),
        "sglang": _sglang(kv, model, scales_path),
        "llama.cpp": _llama_cpp(kv, model),
    }
    problem = _vllm_dtype_mismatch(rows["vllm"]["kv_cache_dtype"], model_dtype)
    if problem:
        warnings.warn(problem, stacklevel=2)
        rows["vllm"]["note"] += " " + problem
    return rows


_DTYPE_NAMES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16"}


def _vllm_dtype_mismatch(kv_dtype: str | None, model_dtype: str | None) -> str | None:
    """vLLM stores a 16-bit model's K/V bits as they are and reads them back as the other 16-bit type."""
    model = _DTYPE_NAMES.get(str(model_dtype).lower()) if model_dtype else None
    if kv_dtype not in ("float16", "bfloat16") or model is None or model == kv_dtype:
        return None
    return (f"vLLM --kv-cache-dtype {kv_dtype} on a {model} model stores the model's {model} bits and reads them "
            f"back as {kv_dtype}: fluent nonsense, with no error or warning (vLLM pull request 54338). Use "
            "--kv-cache-dtype auto, which keeps the model's dtype.")


def export_table(specs: list[str], model: str = "MODEL") -> list[dict]:
    """One row per spec for the UI: {"spec", "vllm", "sglang", "llama.cpp"}, each engine's kv_cache_dtype or None."""
    rows = []
    for spec in specs:
        out = export_commands(spec, model)
        rows.append({"spec": parse_kv(spec).spec,
                     **{e: out[e]["kv_cache_dtype"] if out[e]["supported"] else None for e in ENGINE_NAMES}})
    return rows


# ---- per engine ---------------------------------------------------------------------------------------------


def _result(supported: bool, dtype: str | None, cli: str, python: str, note: str, flags: str = "") -> dict:
    if not supported:
        cli = python = flags = ""
    return {"supported": supported, "kv_cache_dtype": dtype if supported else None, "flags": flags, "cli": cli,
            "python": python, "note": note}


def _llama_cpp_problem(kv: KVSpec, engine: str) -> str | None:
    """vLLM and SGLang have none of llama.cpp's block types: say so rather than map them to something else."""
    names = sorted({f.base for f in (kv.k, kv.v) if f.family.native_engine == "llama.cpp"})
    if not names:
        return None
    return (f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'} llama.cpp's KV cache type"
            f"{'' if len(names) == 1 else 's'} (blocks of 32 values with fp16 scales); {engine} has no such "
            "--kv-cache-dtype, and kvviz maps nothing to it. Run it in llama.cpp (-ctk / -ctv), or pick one of "
            f"{engine}'s formats (e.g. fp8_e4m3) to compare.")


def _pair_problem(kv: KVSpec, engine: str) -> str | None:
    """Both engines take one dtype for K and V and keep no full-precision residual window."""
    if kv.k != kv.v:
        return (f"{engine} stores K and V in one --kv-cache-dtype; a mixed pair ({kv.spec}) is not available "
                "there. Pick one format for both, e.g. the K format.")
    if kv.residual:
        return (f"{engine} has no full-precision residual window (the {kv.name} preset keeps the last "
                f"{kv.residual} tokens unquantized), and no per-channel int2/int4 KV dtype.")
    return None


def _engine_value(kv: KVSpec, engine: str) -> tuple[str | None, str | None]:
    """An engine-qualified spec (vllm:..., sglang:..., llama.cpp:...): (that engine's own value when the spec is
    this engine's, None) or (None, why another engine's value is not offered here); (None, None) for kvviz's own."""
    if kv.engine is None and kv.k.engine is None and kv.v.engine is None:
        return None, None
    if kv.engine == engine:  # vLLM's CPU build takes the same flag: /cpu names its store, not an option
        return kv.k.parts.engine.dtype.removesuffix(VLLM_CPU), None
    return None, (f"{kv.spec} names another engine's own KV cache ({kv.k.engine or kv.v.engine}); {engine} is "
                  f"compared through its own values, e.g. {engine}:{_EXAMPLE[engine]}.")


_EXAMPLE = {"vllm": "fp8", "sglang": "fp8_e4m3", "llama.cpp": "q8_0"}


# What serving an engine value takes beyond the flag (vllm/v1/attention/backends/*.py), added to its note.
_ENGINE_NOTES = {
    ("vllm", "ultraquant_4bit"): " vLLM serves it with its ULTRAQUANT attention backend (bf16 models, no attention "
                                 "sinks; FlyDSL decode at head_dim 256 on AMD gfx950, Triton elsewhere); its decode "
                                 "also casts the rotated query to FP8 E4M3, which kvviz's attention does not.",
    ("vllm", "fp8_ds_mla"): " MLA models only (kv_lora_rank 512 + RoPE 64: 656 B per token and layer), served by "
                            "vLLM's sparse MLA backends (FLASHMLA_SPARSE, which also stores --kv-cache-dtype fp8 "
                            "this way, and FlashInfer's sparse MLA on SM120): DeepSeek-V3.2-style models.",
    ("vllm", "nvfp4_ds_mla"): " MLA models only (352 B per token and layer), served by vLLM's FLASHMLA_SPARSE backend "
                              "on Blackwell (SM100): DeepSeek-V3.2-style models.",
}


def _engine_result(dtype: str, flags: str, cli: str, python: str, engine: str) -> dict:
    note = (f"{engine}'s own --kv-cache-dtype {dtype}: kvviz simulates what its store path stores, byte for byte "
            "(kvviz.formats.engines)." + _ENGINE_NOTES.get((engine, dtype), ""))
    return _result(True, dtype, cli, python, note, flags=flags)


def _vllm(kv: KVSpec, model: str) -> dict:
    own, other = _engine_value(kv, "vllm")
    if other:
        return _result(False, None, "", "", other)
    if own:
        flags = f"--kv-cache-dtype {own}"
        return _engine_result(own, flags, f"vllm serve {model} {flags}",
                              f'from vllm import LLM\nllm = LLM(model="{model}", kv_cache_dtype="{own}")', "vllm")
    problem = _llama_cpp_problem(kv, "vLLM") or _pair_problem(kv, "vLLM")
    if problem:
        pair_note = kv.k.family.extra.get("pair_note")  # a family's word on its mixed pairs (k8v4)
        extra = pair_note(kv.k, kv.v, "vllm") if pair_note else ""
        return _result(False, None, "", "", problem + extra)
    fmt = kv.k
    dtype, note = _vllm_dtype(fmt)
    if dtype is None:
        return _result(False, None, "", "", note)
    flags = f"--kv-cache-dtype {dtype}"
    kwargs = f'kv_cache_dtype="{dtype}"'
    if dtype == "fp8_e4m3" and fmt.scale_source == "first":
        flags += " --calculate-kv-scales"
        kwargs += ", calculate_kv_scales=True"
        note += " /first: --calculate-kv-scales computes them on the first batch, as kvviz does on the first update."
    elif dtype == "fp8_e4m3" and fmt.scale_source == "unit":
        note += " /unit: no flag, vLLM's default scale of 1.0 (assuming the checkpoint has no k_scale/v_scale)."
    elif dtype == "fp8_e4m3" and fmt.scale_source == "calibrated":
        note += (" /calibrated: vLLM reads calibrated k_scale/v_scale from the checkpoint (e.g. llm-compressor); it "
                 "takes no scale file, so put kvviz.calibrate's scales into the checkpoint.")
    cli = f"vllm serve {model} {flags}"
    python = f'from vllm import LLM\nllm = LLM(model="{model}", {kwargs})'
    return _result(True, dtype, cli, python, note, flags=flags)


def _vllm_dtype(fmt: Format) -> tuple[str | None, str]:
    """(vLLM kv_cache_dtype or None, note) for one format: its family's word (kvviz.formats.family)."""
    return fmt.family.engine_value(fmt, "vllm")


def _sglang(kv: KVSpec, model: str, scales_path: str | None) -> dict:
    own, other = _engine_value(kv, "sglang")
    if other:
        return _result(False, None, "", "", other)
    if own:
        flags = f"--kv-cache-dtype {own}"
        return _engine_result(own, flags, f"python -m sglang.launch_server --model-path {model} {flags}",
                              f'import sglang as sgl\nllm = sgl.Engine(model_path="{model}", kv_cache_dtype="{own}")',
                              "sglang")
    problem = _llama_cpp_problem(kv, "SGLang") or _pair_problem(kv, "SGLang")
    if problem:
        return _result(False, None, "", "", problem)
    fmt = kv.k
    dtype, note = _sglang_dtype(fmt)
    if dtype is None:
        return _result(False, None, "", "", note)
    flags = f"--kv-cache-dtype {dtype}"
    kwargs = f'kv_cache_dtype="{dtype}"'
    if dtype == "fp8_e4m3" and fmt.scale_source == "unit":
        note += " /unit: no --quantization-param-path, SGLang's default scale of 1.0."
    elif dtype == "fp8_e4m3" and fmt.scale_source == "calibrated" and not scales_path:
        return _result(False, None, "", "", "/calibrated needs a scale file for SGLang (--quantization-param-path): "
                       "write one with kvviz.calibrate.save_scales and pass its path.")
    elif dtype == "fp8_e4m3":
        if fmt.scale_source == "first":
            note += (" SGLang cannot fit scales on the first batch as kvviz's /first does; the closest is a "
                     "calibrated file.")
        if scales_path:
            flags += f" --quantization-param-path {scales_path}"
            kwargs += f', quantization_param_path="{scales_path}"'
            note += (f" {scales_path}: per-layer scales in SGLang's JSON layout, from kvviz.calibrate.save_scales "
                     "on your own prompts.")
        else:
            note += " Without --quantization-param-path (or k_scale/v_scale in the checkpoint) the scales are 1.0."
    cli = f"python -m sglang.launch_server --model-path {model} {flags}"
    python = f'import sglang as sgl\nllm = sgl.Engine(model_path="{model}", {kwargs})'
    return _result(True, dtype, cli, python, note, flags=flags)


def _sglang_dtype(fmt: Format) -> tuple[str | None, str]:
    """(SGLang --kv-cache-dtype or None, note) for one format: its family's word."""
    return fmt.family.engine_value(fmt, "sglang")


def _llama_cpp(kv: KVSpec, model: str) -> dict:
    _, other = _engine_value(kv, "llama.cpp")
    if other:
        return _result(False, None, "", "", other)
    if kv.residual:
        return _result(False, None, "", "", f"llama.cpp has no full-precision residual window (the {kv.name} preset "
                       f"keeps the last {kv.residual} tokens unquantized), and no per-channel KV type.")
    types, problems = [], []
    for side, fmt in (("K", kv.k), ("V", kv.v)):
        name, problem = _llama_cpp_type(fmt)
        types.append(name)
        if problem and not (side == "V" and kv.v == kv.k):  # one format for both: say it once
            problems.append(f"{'K and V' if kv.k == kv.v else side} ({fmt.spec}): {problem}")
    if problems:
        return _result(False, None, "", "", " ".join(problems))
    k_type, v_type = types
    rotated = [f.rot for f in (kv.k, kv.v) if f.family.native_engine == "llama.cpp"]
    if any(rotated):  # kvviz rotates one Hadamard over head_dim; llama.cpp's own rotation is not checked against it
        return _result(False, None, "", "", (
            "llama.cpp rotates a quantized K / V with its own Hadamard transform by default (builds since April "
            "2026, head_dim a multiple of 64), which kvviz has not checked against its /rot (one Hadamard matrix over "
            "the whole head_dim). The closest: drop /rot here and compare with llama.cpp's default, which rotates."))
    v_quantized = v_type not in ("f16", "bf16")
    flags = f"-ctk {k_type} -ctv {v_type}" + (" -fa on" if v_quantized else "")
    # llama.cpp:<type> is llama.cpp's default (it rotates); a bare ggml type or /norot is its unrotated cache
    ggml = any(f.family.native_engine == "llama.cpp" for f in (kv.k, kv.v))
    env = "LLAMA_ATTN_ROT_DISABLE=1 " if ggml and not (kv.k.engine_rot or kv.v.engine_rot) else ""
    cli = f"{env}llama-server -m {model} {flags}"
    kwargs = (f"type_k=llama_cpp.GGML_TYPE_{k_type.upper()}, type_v=llama_cpp.GGML_TYPE_{v_type.upper()}"
              + (", flash_attn=True" if v_quantized else ""))
    python = ("import os\nos.environ[\"LLAMA_ATTN_ROT_DISABLE\"] = \"1\"  # store K/V unrotated, as kvviz does\n"
              if env else "") + f'import llama_cpp\nllm = llama_cpp.Llama(model_path="{model}", {kwargs})'
    note = (f"K {k_type}, V {v_type}" + (": a quantized V needs flash attention (-fa on), llama.cpp refuses it "
                                          "otherwise." if v_quantized else "."))
    if env:
        note += (" LLAMA_ATTN_ROT_DISABLE=1 keeps llama.cpp (builds since April 2026) from rotating K / V before "
                 "quantizing, so it stores exactly what kvviz simulates; leave it out to get llama.cpp's default, "
                 "rotated cache.")
    if (k_type, v_type) not in _CUDA_FA_DEFAULT_PAIRS and env:  # a quantized side outside the default pairs
        note += (" On CUDA, a default llama.cpp build has flash-attention kernels only for f16/f16, q8_0/q8_0 and "
                 "q4_0/q4_0: build with -DGGML_CUDA_FA_ALL_QUANTS=ON for this pair, or its attention silently runs "
                 "on the CPU, many times slower (llama.cpp issue 24485).")
    if not model.endswith(".gguf"):
        note += (" llama.cpp loads a GGUF file: convert a transformers checkpoint with convert_hf_to_gguf.py, or use "
                 "-hf <repo> for a repository that holds GGUF files.")
    dtype = k_type if k_type == v_type else f"k={k_type},v={v_type}"
    return _result(True, dtype, cli, python, note, flags=flags)


def _llama_cpp_type(fmt: Format) -> tuple[str | None, str | None]:
    """(llama.cpp cache type, None) for one side, or (None, why not): its family's word."""
    name, note = fmt.family.engine_value(fmt, "llama.cpp")
    return (name, None) if name else (None, note)


# ---- per-layer plans ------------------------------------------------------------------------------------------


def export_plan(plan, num_layers: int, model: str = "MODEL", layer_types=None) -> dict:
    """Engine flags for a per-layer plan (a kvviz.Plan, or what kvviz.as_plan takes: "int4; 0,27=fp16", one spec
    per layer) on a model of `num_layers` layers (`layer_types`: one per layer, as Plan.resolve takes them; None: a
    dense model).

    A uniform plan exports as its one spec (export_commands). Otherwise only vLLM can express a plan, and only
    "one format, some layers left unquantized": `--kv-cache-dtype X --kv-cache-dtype-skip-layers i j ...`
    (vLLM's CacheConfig.kv_cache_dtype_skip_layers, a list of layer indices or attention types such as
    sliding_window; skipped layers keep the model's dtype, "auto"). So the plan's other layers must be fp16 /
    bf16 for K and V, and the one format must be a vLLM dtype. SGLang and llama.cpp take one KV dtype (llama.cpp
    one per side) for every layer. Returns {"vllm" | "sglang" | "llama.cpp": {"supported", "kv_cache_dtype",
    "flags", "cli", "python", "note"}} as export_commands does, notes saying plainly why a plan cannot be
    expressed. Layers the engine keeps in 16 bits by its own rule (vLLM's TurboQuant boundary layers,
    kvviz.formats.engine_skip_layers) are not written: the dtype alone says them, and a plan whose only 16-bit
    layers are those exports as that one flag. Raises ValueError on a bad plan.
    """
    fitted = as_plan(plan).fitted(num_layers, layer_types)  # the shortest form for this model's layers
    if fitted.evict is not None:
        raise ValueError(f"vLLM, SGLang and llama.cpp keep every token: no engine flag evicts (@ "
                         f"{fitted.evict.text}). Export {fitted.with_eviction(None).text!r} for the formats alone.")
    if fitted.is_uniform:
        return export_commands(fitted.default, model)
    layers, text = fitted.resolve(num_layers, layer_types), fitted.text
    sixteen = [i for i, kv in enumerate(layers) if kv.k.granularity is None and kv.v.granularity is None]  # casts
    quantized = {spec_text(kv) for i, kv in enumerate(layers) if i not in sixteen}
    one = next(kv for i, kv in enumerate(layers) if i not in sixteen) if quantized else None
    if len(quantized) == 1:
        own = engine_skip_layers(one, num_layers, layer_types)
        sixteen = [i for i in sixteen if i not in own]
        if not sixteen:  # only the engine's own rule keeps layers in 16 bits: exactly its dtype
            return export_commands(one, model)
    rows = {"vllm": _vllm_plan(one, sixteen, quantized, text, model)}
    for engine, name, how in (("sglang", "SGLang", "one --kv-cache-dtype for every layer"),
                              ("llama.cpp", "llama.cpp", "one -ctk and one -ctv type for every layer")):
        rows[engine] = _result(False, None, "", "", f"{name} takes {how}; it cannot express the per-layer plan "
                                                     f"{text!r}. Use a uniform spec, or vLLM for skip layers.")
    return rows


def _vllm_plan(kv: KVSpec | None, sixteen: list[int], quantized: set, text: str, model: str) -> dict:
    if len(quantized) != 1:
        return _result(False, None, "", "", f"vLLM expresses one KV format with some layers left in 16 bits "
                                             f"(--kv-cache-dtype-skip-layers); the plan {text!r} uses "
                                             f"{len(quantized)} quantized formats ({', '.join(sorted(quantized))}). "
                                             "No engine can express it.")
    (spec,) = quantized
    one = _vllm(kv, model)
    if not one["supported"]:
        return _result(False, None, "", "", f"The plan's quantized layers use {spec}, which vLLM cannot store: "
                                             f"{one['note']}")
    skip = " ".join(str(i) for i in sixteen)
    flags = f"{one['flags']} --kv-cache-dtype-skip-layers {skip}"
    python = one["python"][:-1] + f", kv_cache_dtype_skip_layers={[str(i) for i in sixteen]!r})"
    note = (f"{one['note']} Layers {', '.join(map(str, sixteen))} skip quantization and keep the model's dtype "
            "(vLLM's \"auto\": bf16 for a bf16 model, where kvviz's plan says fp16 / bf16).")
    return _result(True, one["kv_cache_dtype"], f"vllm serve {model} {flags}", python, note, flags=flags)
