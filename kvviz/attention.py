"""The "kvviz" attention function: fused Triton decode over packed K/V, or the torch reference.

transformers calls attention as `fn(module, query, key, value, attention_mask, scaling=..., dropout=...)` right
after `cache.update(...)`. With a `DynamicCache` (or during the first prefill of a `kvviz.QuantizedKVCache`) key and
value are plain tensors and this is exactly transformers' SDPA path. Once a `QuantizedKVCache` holds history its
`update()` returns two `PackedKV` handles instead (one for K, one for V), which this function dispatches on:

- backend "torch" (the reference, and the CPU path): `PackedKV.dequantize()` both, then SDPA;
- backend "triton": for single-token decode, `_triton_decode(...)`, the fused kernel from `kernels/` that reads the
  packed buffers in place; a multi-token query (teacher forcing, chunked prefill) uses the reference.

`KVVIZ_BACKEND=auto|torch|triton` picks the backend (auto: triton when CUDA is available and triton imports, torch
otherwise; `TRITON_INTERPRET=1` lets an explicit `triton` run on the CPU). CUDA and Triton are probed once, Triton
through kernels/_triton.py (the one module that imports it).
Select the function with `model.set_attn_implementation("kvviz")` (kvviz.load_model and kvviz.tiny_model do).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_NAME = "kvviz"
BACKENDS = ("auto", "torch", "triton")


@dataclasses.dataclass(frozen=True, eq=False)
class PackedKV:
    """One side (K or V) of one layer of a `QuantizedKVCache`, as the attention function reads it.

    Tokens 0..n_quantized-1 are stored quantized in `fmt`'s QTensor layout (kvviz/formats, see the contract),
    tokens n_quantized..seq_len-1 in full precision in `tail`. The tensors are views into the layer's growable
    buffers (capacity along the token axis, so strides along batch/head include the spare capacity): a kernel
    reads them in place and must use their strides. Nothing is copied to build a handle.

    fmt:          the kvviz Format of the stored tokens (fmt.spec, .base, .granularity, .group, .asym, .rot).
    data:         [batch, kv_heads, n_quantized, packed_head_dim] codes (dtype per format: int8, uint8, fp8, fp16).
    scale:        token granularity: [batch, kv_heads, n_quantized, head_dim // g];
                  channel granularity: [batch, kv_heads, n_quantized // N, head_dim] (whole groups only);
                  None for casts and per-tensor / per-head formats.
    zero:         same shape as `scale` for asymmetric formats, else None.
    tensor_scale: fp32 static scale: shape [] (tensor granularity, fp8 default, nvfp4 global) or
                  [batch, kv_heads, 1, 1] (head granularity); else None.
    tail:         [batch, kv_heads, seq_len - n_quantized, head_dim], 16-bit (the model dtype when that is fp16 or
                  bf16, else fp16): the residual window plus, for channel formats, the partial group not yet
                  quantized. Its positions follow the quantized ones.
    dtype:        the model dtype (of the query, and of what `dequantize` returns).

    Deliberately no `.shape`: handing a PackedKV to an attention function other than "kvviz" fails with the
    AttributeError below instead of computing garbage.
    """

    fmt: Any
    data: torch.Tensor
    scale: torch.Tensor | None
    zero: torch.Tensor | None
    tensor_scale: torch.Tensor | None
    tail: torch.Tensor
    dtype: torch.dtype

    @property
    def n_quantized(self) -> int:
        return self.data.shape[2]

    @property
    def seq_len(self) -> int:
        return self.data.shape[2] + self.tail.shape[2]

    @property
    def head_dim(self) -> int:
        return self.tail.shape[-1]

    def qtensor(self):
        """The quantized part as a kvviz QTensor (contiguous copies), or None when nothing is quantized yet."""
        if self.n_quantized == 0:
            return None
        from kvviz.formats import QTensor

        batch, heads, tokens, _ = self.data.shape
        # Contiguous copies: the views' capacity strides make torch's CPU elementwise kernels ~15x slower.
        data, scale, zero = (t if t is None else t.contiguous() for t in (self.data, self.scale, self.zero))
        return QTensor(data=data, scale=scale, zero=zero, tensor_scale=self.tensor_scale,
                       shape=(batch, heads, tokens, self.head_dim), dtype=self.dtype, fmt=self.fmt)

    def dequantize(self) -> torch.Tensor:
        """The reference read: [batch, kv_heads, seq_len, head_dim] in `dtype` (quantized part dequantized)."""
        tail = self.tail.to(self.dtype)
        q = self.qtensor()
        if q is None:
            return tail
        history = self.fmt.dequantize(q)  # [B, Hkv, n_quantized, D]
        return torch.cat([history, tail], dim=2) if tail.shape[2] else history

    def __getattr__(self, name):
        raise AttributeError(
            f"PackedKV has no attribute {name!r}: this is a packed kvviz.QuantizedKVCache handle, readable only by "
            f"the {ATTN_NAME!r} attention function. Call model.set_attn_implementation({ATTN_NAME!r}) first."
        )


# ------------------------------------------------------------------------------------------ backend choice

@functools.cache
def _probe() -> dict:
    """CUDA and Triton, probed once per process; Triton itself through kernels/_triton.py, its one importer."""
    try:
        from kernels import _triton
    except ImportError:  # kernels/ not importable (repository root not on sys.path): no fused path
        return {"cuda": torch.cuda.is_available(), "triton": False, "usable": False}
    return {"cuda": torch.cuda.is_available(), "triton": _triton.triton is not None, "usable": _triton.triton_usable()}


def active_backend() -> str:
    """"triton" or "torch", from KVVIZ_BACKEND (default auto). Raises ValueError on a bad or impossible choice."""
    wanted = os.environ.get("KVVIZ_BACKEND", "auto").strip().lower() or "auto"
    if wanted not in BACKENDS:
        raise ValueError(f"KVVIZ_BACKEND={wanted!r} is not one of {', '.join(BACKENDS)}; unset it or pick one.")
    probe = _probe()
    if wanted == "auto":
        return "triton" if probe["cuda"] and probe["triton"] else "torch"
    if wanted == "triton" and not probe["usable"]:
        raise ValueError(
            "KVVIZ_BACKEND=triton needs triton and a CUDA GPU (or TRITON_INTERPRET=1 to run it on the CPU); "
            f"found triton={probe['triton']}, cuda={probe['cuda']}. Set KVVIZ_BACKEND=torch or auto."
        )
    return wanted


# ------------------------------------------------------------------------------------------ attention

def _triton_decode(module, query: torch.Tensor, key: PackedKV, value: PackedKV,
                   attention_mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """Fused decode attention over the packed buffers, read in place (kernels.decode_attention).

    query: [batch, q_heads, 1, head_dim] (model dtype, RoPE applied); key/value: PackedKV (see above);
    attention_mask: None or [batch, 1, 1, seq_len] (bool, True = attend; left padding is False);
    GQA: q head h reads kv head h // (q_heads // kv_heads). Returns [batch, 1, q_heads, head_dim], query's dtype.
    """
    try:
        from kernels.decode import decode_attention  # not `from kernels`: the jit submodule shares the name
        from kernels.packed import side_from_format
    except ImportError as err:
        raise RuntimeError(
            f"KVVIZ_BACKEND=triton, but the fused kernel kernels.decode_attention is unavailable ({err}). "
            "Run from the repository root, or set KVVIZ_BACKEND=torch to use the reference path."
        ) from err
    k_side, v_side = (
        side_from_format(p.fmt, p.data, p.scale, p.zero, p.tensor_scale, head_dim=p.head_dim,
                         n_packed=p.n_quantized, tail=p.tail)
        for p in (key, value)
    )
    kv_mask = None
    if attention_mask is not None:
        mask = attention_mask[:, 0, -1, :]  # [B, seq_len]: the one query row
        kv_mask = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    out = decode_attention(query[:, :, 0], k_side, v_side, key.seq_len, sm_scale=scaling, kv_mask=kv_mask)
    return out.unsqueeze(1)  # [B, Hq, D] -> [B, 1, Hq, D]


@functools.cache
def _triton_runs_on(device: torch.device) -> bool:
    """False for CPU tensors on a CUDA machine (auto picks triton there): the reference serves them."""
    from kernels._triton import triton_usable

    return triton_usable(device)


def _fused_reads(*sides: PackedKV) -> bool:
    """False when the kernels cannot read a side's format yet (llama.cpp's q4_0 & co.): the reference reads it."""
    from kernels.packed import reads_format

    return all(reads_format(p.fmt) for p in sides)


def _bottom_right_causal(q_len: int, kv_len: int, device) -> torch.Tensor:
    """bool [1, 1, q_len, kv_len]: query i (absolute position kv_len - q_len + i) attends to keys <= it."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    return (torch.arange(kv_len, device=device)[None, :] <= q_pos)[None, None]


def kvviz_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                            scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers attention function. query: [batch, q_heads, q_len, head_dim]; key/value: tensors
    [batch, kv_heads, kv_len, head_dim] or PackedKV. Returns ([batch, q_len, q_heads, head_dim], None)."""
    if not isinstance(key, PackedKV):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    assert isinstance(value, PackedKV), "a QuantizedKVCache returns PackedKV for both K and V"
    q_len = query.shape[2]
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if q_len == 1 and active_backend() == "triton" and _triton_runs_on(query.device) and _fused_reads(key, value):
        return _triton_decode(module, query, key, value, attention_mask, scaling), None
    k, v = key.dequantize(), value.dequantize()  # [B, Hkv, kv_len, D]
    if attention_mask is None and q_len > 1:
        # sdpa's is_causal is top-left aligned; with history the causal diagonal sits bottom-right.
        attention_mask = _bottom_right_causal(q_len, k.shape[2], query.device)
    return sdpa_attention_forward(module, query, k, v, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=False, **kwargs)


AttentionInterface.register(ATTN_NAME, kvviz_attention_forward)
AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)  # same masks as "sdpa": bool, True = attend
