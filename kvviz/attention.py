"""The "kvviz" attention function: fused Triton decode over packed K/V, or the torch reference.

transformers calls attention as `fn(module, query, key, value, attention_mask, scaling=..., dropout=...)` right
after `cache.update(...)`. With a `DynamicCache` (or during the first prefill of a `kvviz.QuantizedKVCache`) key and
value are plain tensors and this is exactly transformers' SDPA path. Once a `QuantizedKVCache` holds history its
`update()` returns two `QTensor`s instead (one per side, K and V: kvviz/formats/qtensor.py), which this function
dispatches on:

- sides of a `llama.cpp:` name (their codec is kvviz.ggml_attention.Stored: K and V held as llama.cpp holds them,
  rotated unless /norot), whatever the backend and the query length: llama.cpp's CPU flash attention arithmetic
  (kvviz.ggml_attention.read_sides: Q rotated and converted to K's vec_dot type, f32 softmax and V sums, the output
  un-rotated). The fused kernels read kvviz's arithmetic, so they never take these sides;
- backend "torch" (the reference, and the CPU path): `QTensor.dequantize()` both, then SDPA;
- backend "triton": for single-token decode, `_triton_decode(...)`, the fused kernel from `kernels/` that reads the
  packed buffers in place; a multi-token query (teacher forcing, chunked prefill) uses the reference;
- backend "cpu": a single-token step whose token the cache staged (`StagedStep`, a handle for K and one for V) appends
  and attends in one numba call (kernels/cpu/step.py); other packed steps read QTensors as the triton backend does,
  and a multi-token query (chunked prefill, teacher forcing) over sides the CPU path reads takes the fused chunk
  path (`_cpu_chunk`, kernels/cpu/chunk.py: packed tiles decoded by numba, scored by torch's GEMM).

The current runtime's backend (kvviz.runtime: `KVVIZ_BACKEND=auto|torch|triton|cpu` as the runtime is built) picks
the backend (auto: triton when CUDA is available and triton imports,
else "cpu", the numba decode of kernels/cpu/decode.py that reads the packed buffers in place, when numba runs, else torch;
single-token decode on CPU tensors only, formats without a CPU branch take the reference; `TRITON_INTERPRET=1` lets an explicit `triton` run on the CPU). CUDA and Triton are probed once, Triton
through kernels/_triton.py (the one module that imports it). `with use_backend(name):` overrides it in the
calling context for one block (kvviz.quality.fused_vs_unfused times fused against unfused in one process).
Select the function with `model.set_attn_implementation("kvviz")` (kvviz.load_model and kvviz.tiny_model do).
"""

from __future__ import annotations

import functools

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from kernels import decode_attention, side_of, triton_installed, triton_usable
from kernels import decode as triton_decode
from kernels.cpu import chunk as cpu_chunk
from kernels.cpu import decode as cpu_decode
from kvviz import ggml_attention, rowstable, runtime
from kvviz.formats import QTensor
from kvviz.formats.floats import DTYPES as _CAST_DTYPES

ATTN_NAME = "kvviz"
BACKENDS = runtime.BACKENDS


# ------------------------------------------------------------------------------------------ backend choice

@functools.cache
def _probe() -> dict:
    """CUDA and Triton, probed once per process; Triton itself through kernels/_triton.py, its one importer."""
    return {"cuda": torch.cuda.is_available(), "triton": triton_installed(), "usable": triton_usable()}


@functools.cache
def _cpu_fused() -> bool:
    """Whether the fused CPU decode (kernels/cpu/decode.py, numba) runs here; it logs one line when it cannot."""
    return cpu_decode.cpu_usable()


def compiling_cpu_kernels():
    """While this block runs (the app's launch warm-up, which compiles the fused CPU kernels: minutes on a cold
    2-core machine), other threads on the auto backend of the current runtime decode through the torch reference
    instead of waiting for the compile; this thread takes the CPU path, and so compiles it. A visitor's first click
    answers at once, its tokens/s labelled "torch"; the clicks after the block use the fused kernels."""
    return runtime.current().compiling_cpu_kernels()


def use_backend(name: str):
    """Decode through backend `name` (one of BACKENDS) in this context (this thread, or what copies its context)
    while the block runs, whatever the runtime's backend (KVVIZ_BACKEND) says; blocks nest, and other threads keep
    their own choice. Raises ValueError for a name not in BACKENDS.

        with use_backend("torch"):   # the unfused reference, for one comparison
            model(input_ids=nxt, cache=cache)
    """
    return runtime.scope_backend(name)


def active_backend() -> str:
    """"triton", "cpu" or "torch", from this context's use_backend() if inside one, else the current runtime's
    backend (kvviz.runtime: KVVIZ_BACKEND, default auto: triton on CUDA, else the fused CPU path when numba runs,
    else torch; torch too while another thread compiles the CPU kernels, see compiling_cpu_kernels; "cpu" without
    numba falls back to torch). Raises ValueError on a bad or impossible choice."""
    rt = runtime.current()
    wanted = rt.wanted_backend()
    probe = _probe()
    if wanted == "auto" and probe["cuda"] and probe["triton"]:
        return "triton"
    if wanted == "auto" and rt.compiling_elsewhere():
        return "torch"  # another thread is compiling the CPU kernels (compiling_cpu_kernels)
    if wanted in ("auto", "cpu"):
        return "cpu" if _cpu_fused() else "torch"
    if wanted == "triton" and not probe["usable"]:
        raise ValueError(
            "KVVIZ_BACKEND=triton needs triton and a CUDA GPU (or TRITON_INTERPRET=1 to run it on the CPU); "
            f"found triton={probe['triton']}, cuda={probe['cuda']}. Set KVVIZ_BACKEND=torch or auto."
        )
    return wanted


def settled_backend() -> str | None:
    """active_backend() when answering it compiles nothing; None while the fused CPU path's first compile (or
    numba's cache load, minutes on a cold 2-core machine) is still to come or under way. A page header asks this, not
    active_backend(), so that serving the page never waits for a compile."""
    rt = runtime.current()
    wanted = rt.wanted_backend()
    probe = _probe()
    cpu_path = wanted == "cpu" or (wanted == "auto" and not (probe["cuda"] and probe["triton"]))
    if cpu_path and (_cpu_fused.cache_info().currsize == 0 or rt.compiling_elsewhere()):
        return None
    return active_backend()


# ------------------------------------------------------------------------------------------ attention

def _triton_decode(module, query: torch.Tensor, key: QTensor, value: QTensor,
                   attention_mask: torch.Tensor | None, scaling: float, **kwargs) -> torch.Tensor:
    """Fused decode attention over the packed buffers, read in place (kernels.decode_attention).

    query: [batch, q_heads, 1, head_dim_k] (model dtype, RoPE applied); key/value: QTensor cache sides (kvviz/formats/qtensor.py), V's
    head_dim_v may differ from K's (DeepSeek-V3); attention_mask: None or [batch, 1, 1, seq_len] (bool, True =
    attend: left padding, and the window or chunk of a sliding / chunked layer); GQA: q head h reads kv head
    h // (q_heads // kv_heads). As transformers' eager attention: the `s_aux` kwarg (or `module.sinks`) holds
    gpt-oss's attention sinks [q_heads], the `softcap` kwarg Gemma 2's logit cap (only the kwarg: Gemma 3 keeps an
    attn_logit_softcapping attribute that its attention never applies). Returns [batch, 1, q_heads, head_dim_v].
    """
    # the numba twin on CPU tensors under the cpu backend: the same contract
    on_cpu = query.device.type == "cpu" and active_backend() == "cpu"
    k_side, v_side = side_of(key), side_of(value)
    if on_cpu:  # numba's thread pool from the runtime's cpu_parallel_rows (batch x KV head x token) rows up
        rows = query.shape[0] * k_side.data.shape[1] * key.seq_len
        fused = functools.partial(cpu_decode.decode_attention_cpu,
                                  parallel=rows >= runtime.current().cpu_parallel_rows)
    else:
        fused = decode_attention
    kv_mask = _query_row_mask(attention_mask)
    if key.skip:  # stored positions before the window (a channel group kept whole): never attended
        visible = kv_mask if kv_mask is not None else torch.ones(
            (query.shape[0], key.seq_len - key.skip), dtype=torch.bool, device=query.device)
        kv_mask = torch.cat([visible.new_zeros((visible.shape[0], key.skip)), visible], dim=1)
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = getattr(module, "sinks", None)
    out = fused(query[:, :, 0], k_side, v_side, key.seq_len, sm_scale=scaling, kv_mask=kv_mask,
                           sinks=sinks, softcap=kwargs.get("softcap"))
    return out.unsqueeze(1)  # [B, Hq, D_v] -> [B, 1, Hq, D_v]


def _cpu_chunk(module, query: torch.Tensor, key: QTensor, value: QTensor, attention_mask: torch.Tensor | None,
               scaling: float, kwargs: dict) -> torch.Tensor | None:
    """A chunk of queries (chunked prefill, teacher forcing) over packed K/V read in place on the CPU
    (kernels/cpu/chunk.py: tiles of rows decoded by numba, scored by torch's GEMM under an online softmax).
    query: [B, Hq, q_len, D_k]; attention_mask: None (causal, bottom-right) or [B or 1, 1, q_len, visible kv_len].
    Returns [B, q_len, Hq, D_v], or None for a side the chunk path does not read (the reference takes it)."""
    k_side, v_side = side_of(key), side_of(value)
    if not (cpu_chunk.reads(k_side) and cpu_chunk.reads(v_side)):
        return None
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = _module_sinks(module)
    out = cpu_chunk.chunk_attention_cpu(query, k_side, v_side, key.seq_len, scaling, mask=attention_mask,
                                        start=key.skip, sinks=sinks, softcap=kwargs.get("softcap"))
    return out.transpose(1, 2).contiguous()  # [B, Hq, q_len, D_v] -> [B, q_len, Hq, D_v]


def _query_row_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The one query row of a decode step's mask [B, 1, 1, seq_len] as bool [B, seq_len] (True = attend)."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, 0, -1, :]
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


class StagedStep:
    """What a cache layer's `update` returns, for K and V alike, when it staged a decode token instead of storing
    it: the attention function calls `attend`, which appends the token to the packed cache and attends over it in
    one fused call (kvviz.cache on the cpu backend: kernels/cpu/step.py). Like QTensor it has no `.shape`, so any
    other attention function fails loudly."""

    def attend(self, query: torch.Tensor, kv_mask: torch.Tensor | None, scaling: float,
               sinks: torch.Tensor | None, softcap: float | None) -> torch.Tensor:
        """query: [B, Hq, 1, D_k] (one token); kv_mask: None or bool [B, kv_len] (True = attend); sinks: [Hq] or
        None; softcap: float or None. Returns [B, 1, Hq, D_v] in query's dtype (what the attention function
        returns)."""
        raise NotImplementedError

    def __getattr__(self, name):
        if name == "shape":
            raise AttributeError(
                "A kvviz cache staged this decode token for kvviz's fused attention (attn_implementation='kvviz'); "
                "this attention function read it as a tensor. Use model.set_attn_implementation('kvviz').")
        raise AttributeError(name)


class ObservedPrefill:
    """What a cache layer's `update` returns, for K and V alike, on a prefill it scores by the queries before storing
    it (kvviz.cache.eviction: SnapKV keeps the context tokens the last queries attend to): the attention function
    calls `observe(query, scaling)`, which returns this side's uncompressed states [B, H, T, D] to attend over.
    Like StagedStep it has no `.shape`, so any other attention function fails loudly."""

    def observe(self, query: torch.Tensor, scaling: float) -> torch.Tensor:
        raise NotImplementedError

    def __getattr__(self, name):
        if name == "shape":
            raise AttributeError(
                "A kvviz cache scores this prefill by its queries (eviction: snapkv) and needs kvviz's attention "
                "function to hand them over. Use model.set_attn_implementation('kvviz').")
        raise AttributeError(name)


@functools.cache
def _triton_runs_on(device: torch.device) -> bool:
    """False for CPU tensors on a CUDA machine (auto picks triton there): the reference serves them."""
    return triton_usable(device)


def _fused_reads(*sides: QTensor) -> bool:
    """False when the Triton kernel has no decode branch for a side's format (kernels.decode.supports: kvviz's
    families and the engines' stores): the reference reads it then."""
    return all(_triton_reads_format(p.fmt) for p in sides)


@functools.lru_cache(maxsize=256)
def _triton_reads_format(fmt) -> bool:
    return triton_decode.supports(fmt)


def _cpu_reads(*sides: QTensor) -> bool:
    """False for formats the fused CPU path has no decode branch for (kernels.cpu.decode.supports: kvviz's float,
    int and fp4 families, llama.cpp's ggml types and the engines' stores have one): the reference reads
    those. False for a lossless cast too (fp16 / bf16 storing a model of that dtype): the reference hands SDPA the
    very tensors DynamicCache would, so the spec keeps DynamicCache's tokens exactly (the kernel's float32 sums can
    flip a near tie: tiny Falcon-H1 in bf16, tests/test_cache.py). A cast that rounds (bf16 under an fp32 model:
    `vllm:auto`, vLLM TurboQuant's 16-bit boundary layers) is read by the kernel like any stored format."""
    return all(_cpu_reads_format(p.fmt) and not lossless_cast(p.fmt, p.dtype) for p in sides)


@functools.lru_cache(maxsize=256)
def _cpu_reads_format(fmt) -> bool:
    return cpu_decode.supports(fmt)


def lossless_cast(fmt, dtype: torch.dtype) -> bool:
    """Whether `fmt` stores states of `dtype` bit for bit: a plain cast (no scale) to the model's own dtype."""
    return fmt.granularity is None and _CAST_DTYPES.get(fmt.base) == dtype


def _bottom_right_causal(q_len: int, kv_len: int, device) -> torch.Tensor:
    """bool [1, 1, q_len, kv_len]: query i (absolute position kv_len - q_len + i) attends to keys <= it."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    return (torch.arange(kv_len, device=device)[None, :] <= q_pos)[None, None]


def _module_sinks(module) -> torch.Tensor | None:
    """`module.sinks` where it is a tensor (gpt-oss's learned sinks), else None. An nn.Module keeps parameters and
    buffers outside its __dict__, and getattr of a name it lacks raises inside nn.Module (microseconds, asked by
    every layer at every step), so its own stores are looked in directly."""
    stores = getattr(module, "__dict__", None)
    if stores is not None and "_parameters" in stores and "sinks" not in stores and not hasattr(type(module), "sinks"):
        found = stores["_parameters"].get("sinks")
        if found is None:
            found = stores.get("_buffers", {}).get("sinks")
    else:
        found = getattr(module, "sinks", None)
    return found if isinstance(found, torch.Tensor) else None


def _sinks_and_softcap(module, kwargs: dict):
    """(sinks [q_heads] or None, softcap float or None) as transformers' eager attention reads them: gpt-oss
    passes its sinks as `s_aux` (eager reads `module.sinks`), Gemma 2 its logit cap as `softcap`."""
    sinks = kwargs.pop("s_aux", None)
    if sinks is None:
        sinks = _module_sinks(module)
    return sinks, kwargs.pop("softcap", None)


def eager_reference(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                    sinks: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """Attention with logit softcapping and/or sinks, op for op as transformers' eager attention computes them
    (modeling_gemma2.eager_attention_forward, modeling_gpt_oss.eager_attention_forward), which SDPA cannot.

    query: [B, Hq, q_len, Dk]; key: [B, Hkv, kv_len, Dk]; value: [B, Hkv, kv_len, Dv]; attention_mask: None or
    [B, 1, q_len, kv_len] (bool, True = attend, or additive float); sinks: [Hq] logits of an extra softmax column
    that takes probability mass and is then dropped. Returns [B, q_len, Hq, Dv].
    """
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1) if groups > 1 else key  # transformers' repeat_kv: [B, Hq, kv_len, Dk]
    v = value.repeat_interleave(groups, dim=1) if groups > 1 else value
    weights = torch.matmul(query, k.transpose(2, 3)) * scaling  # [B, Hq, q_len, kv_len]
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # as transformers' eager mask: 0 where attended, dtype min elsewhere
            attention_mask = torch.where(attention_mask, torch.tensor(0.0, device=weights.device, dtype=weights.dtype),
                                         torch.finfo(weights.dtype).min)
        weights = weights + attention_mask
    if sinks is not None:
        column = sinks.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)
        logits = torch.cat([weights, column], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = torch.nn.functional.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]  # drop the sink
        probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training).to(v.dtype)
    else:
        probs = torch.nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
        probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, v).transpose(1, 2).contiguous()


def kvviz_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                            scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers attention function. query: [batch, q_heads, q_len, head_dim_k]; key/value: tensors
    [batch, kv_heads, kv_len, head_dim_k / head_dim_v] or QTensor cache sides. Returns ([batch, q_len, q_heads, head_dim_v],
    None). Plain tensors without sinks or softcap take transformers' SDPA path exactly; sinks (`s_aux`, gpt-oss)
    and logit softcapping (`softcap`, Gemma 2) take `eager_reference`, as transformers' eager attention."""
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if isinstance(key, StagedStep):  # append and attend in one fused call (kvviz.cache on the cpu backend)
        assert isinstance(value, StagedStep), "a cache stages K and V together"
        sinks = kwargs.get("s_aux")
        if sinks is None:
            sinks = _module_sinks(module)
        return key.attend(query, _query_row_mask(attention_mask), scaling, sinks, kwargs.get("softcap")), None
    if isinstance(key, ObservedPrefill):  # a prefill the cache compresses by these queries (kvviz.cache.eviction)
        key, value = key.observe(query, scaling), value.observe(query, scaling)
    q_len = query.shape[2]
    packed = isinstance(key, QTensor)
    if packed:
        assert isinstance(value, QTensor), "a QuantizedKVCache returns a QTensor for both K and V"
        if ggml_attention.reads(key, value):  # llama.cpp's names: its arithmetic, never kvviz's fused kernels
            sinks, softcap = _sinks_and_softcap(module, kwargs)
            return ggml_attention.read_sides(query, key, value, attention_mask, scaling, softcap, sinks), None
        backend = active_backend()
        fused = q_len == 1 and key.skip == value.skip  # one kv_mask serves both
        if fused and (_fused_reads(key, value) and _triton_runs_on(query.device) if backend == "triton" else
                      backend == "cpu" and query.device.type == "cpu" and _cpu_reads(key, value)):
            return _triton_decode(module, query, key, value, attention_mask, scaling, **kwargs), None
        if (q_len > 1 and backend == "cpu" and query.device.type == "cpu" and key.skip == value.skip
                and _cpu_reads(key, value)):
            chunk = _cpu_chunk(module, query, key, value, attention_mask, scaling, kwargs)
            if chunk is not None:
                return chunk, None
        key, value = key.dequantize(), value.dequantize()  # [B, Hkv, visible kv_len, D]
    sinks, softcap = _sinks_and_softcap(module, kwargs)
    if attention_mask is None and q_len > 1 and (packed or sinks is not None or softcap is not None):
        # sdpa's is_causal is top-left aligned; with history the causal diagonal sits bottom-right.
        attention_mask = _bottom_right_causal(q_len, key.shape[2], query.device)
    if rowstable.active() and q_len == 1 and sinks is None and softcap is None:
        return grouped_decode(query, key, value, attention_mask, scaling), None
    if sinks is not None or softcap is not None:
        def attend(q, k, v, mask):
            return eager_reference(module, q, k, v, mask, scaling, dropout, sinks, softcap)
    else:
        def attend(q, k, v, mask):
            return sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, scaling=scaling,
                                          is_causal=False if packed else is_causal, **kwargs)[0]
    if query.shape[0] > 1 and rowstable.active():  # each row on its own, as it would run alone
        return torch.cat([attend(query[b : b + 1], key[b : b + 1], value[b : b + 1], _row_of(attention_mask, b))
                          for b in range(query.shape[0])]), None
    return attend(query, key, value, attention_mask), None


def grouped_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                   scaling: float) -> torch.Tensor:
    """One decode step's attention as two matrix products per (row, KV head) over its group of query heads, the
    softmax between them in float32 at least: a row's result does not depend on the batch (kvviz.rowstable), where
    SDPA on the CPU splits a long history over threads when the batch is small, and rounds that row differently.
    Faster than SDPA a row at a time, and than SDPA batched up to ~1K tokens.

    query: [B, Hq, 1, Dk] (query head h reads KV head h // (Hq / Hkv)); key: [B, Hkv, T, Dk]; value: [B, Hkv, T, Dv];
    attention_mask: None or [B or 1, 1, 1, T] (bool, True = attend, or additive float). Returns [B, 1, Hq, Dv].
    """
    b, hq, _, dk = query.shape
    hkv = key.shape[1]
    scores = torch.matmul(query.reshape(b, hkv, hq // hkv, dk), key.transpose(2, 3)) * scaling  # [B, Hkv, g, T]
    if attention_mask is not None:
        mask = attention_mask.reshape(attention_mask.shape[0], 1, 1, -1)  # [B or 1, 1, 1, T]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(value.dtype)
    return torch.matmul(probs, value).reshape(b, 1, hq, -1)  # [B, Hkv, g, Dv] -> [B, 1, Hq, Dv]


def _row_of(mask: torch.Tensor | None, b: int) -> torch.Tensor | None:
    """Batch row b of an attention mask [B or 1, 1, q_len, kv_len] (None: none)."""
    return mask if mask is None or mask.shape[0] == 1 else mask[b : b + 1]


AttentionInterface.register(ATTN_NAME, kvviz_attention_forward)
AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)  # same masks as "sdpa": bool, True = attend
