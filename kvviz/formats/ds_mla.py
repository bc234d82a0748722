"""vLLM's DeepSeek MLA latent caches `fp8_ds_mla` and `nvfp4_ds_mla`, stored bit for bit as vLLM's writer does.

An MLA model (DeepSeek-V2/V3, Kimi K2: `kv_lora_rank` in the config) caches per token one latent: the normalized
compressed KV (`kv_c_normed`, kv_lora_rank = 512 wide; transformers' K side, [batch, 1, T, 512]) and the shared RoPE
key (`k_pe` after RoPE, 64 wide; transformers' V side, [batch, 1, T, 64]). vLLM packs both into one opaque record per
token (vllm/v1/attention/backends/mla/flashmla_sparse.py's layout notes; written by the CUDA
`concat_and_cache_ds_mla` / `concat_and_cache_nvfp4_ds_mla`, whose sources the wheel does not ship, and by the
Triton writer kept "in lockstep" with them, vllm/models/deepseek_v32/common/kernels.py, read here):

    fp8_ds_mla    656 B: 512 E4M3 latent values | 4 fp32 scales, one per 128 | 64 bf16 RoPE values (verbatim)
    nvfp4_ds_mla  352 B: 512 E2M1 latent values, two a byte, even element low | 64 E4M3 RoPE values, no scale |
                  32 E4M3 scales, one per 16, byte-permuted: block s at byte 8 (s & 3) + (s >> 2)

kvviz models the latent as the K side's format (row `vllm.fp8_ds_mla` / `vllm.nvfp4_ds_mla` of spec.BASES) and the
RoPE part as the V side's (`bf16`, `fp8_e4m3/unit`: a cast with scale 1.0); together they hold the record's bytes.
The rules, in fp32:

- fp8: per tile of 128, `scale = max(amax * fp32(1 / 448), 1e-4)`, then rounded up to a power of two,
  `2**ceil(log2(scale))` (the amax maps at most to 448); values `e4m3(x / scale)` (exact division by a power of two,
  nearest even, saturating). The scale stays fp32. A version of the CUDA writer found in public vLLM sources stores
  `max(amax / 448, FLT_MIN)` unrounded; the writer the pinned vLLM ships as source rounds, and kvviz follows it.
- nvfp4: per block of 16, `sf = e4m3(max(amax * fp32(1 / 6), 2**-9))` (nearest even), values
  `e2m1(x * (1 / sf))` (cvt.rn.satfinite.e2m1: nearest even, saturating at 6, the sign kept on -0); no global scale.

vLLM's kernels take kv_lora_rank 512 and RoPE 64 only (DeepSeek's geometry: `assert kv_dim == 512`). kvviz applies
the same per-tile rules to any latent a multiple of the tile (128, 16), so tiny MLA models run them; the record then
holds L + 4 L / 128 + 2 R (fp8) or L / 2 + L / 16 + R (nvfp4) bytes for a latent of L and a RoPE part of R. The
permuted scale order is a byte layout only: kvviz keeps scales in block order (the bytes are the same set).
Triton's log2 is taken as the correctly rounded one (it decides only when amax / 448 lies within an ulp of a power of
two) and its fp32 division as IEEE. tests/test_vllm_extra_stores.py runs the fp8 writer from the pinned vLLM in
Triton's interpreter: its tile scales and RoPE bytes equal kvviz's (the interpreter's fp8 cast is not the GPU's).
"""

from __future__ import annotations

import sys

import torch

from .family import BaseInfo, Family, choice

from .fp4 import E2M1_VALUES, e2m1_encode
from .packing import decode_bytes, pack

FP8_TILE = 128  # one fp32 scale per 128 latent values
NVFP4_BLOCK = 16  # one E4M3 scale per 16 latent values
_TILE = {"vllm.fp8_ds_mla": FP8_TILE, "vllm.nvfp4_ds_mla": NVFP4_BLOCK}
DTYPES = {"fp8_ds_mla": "vllm.fp8_ds_mla", "nvfp4_ds_mla": "vllm.nvfp4_ds_mla"}  # vLLM value -> its latent's row
RECORD_BYTES = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}  # mla_attention.py state_content_bytes, DeepSeek geometry
_FP8_MIN_SCALE = 1e-4
_NVFP4_MIN_SCALE = 2.0**-9  # 0.001953125, E4M3's smallest subnormal


def is_latent(fmt) -> bool:
    """Whether `fmt` stores an MLA latent in one of vLLM's DeepSeek layouts (its V side then stores the RoPE part)."""
    return fmt.base in _TILE


def token_head_bytes(fmt, head_dim: int) -> int:
    """Bytes of the latent part of the record for a latent of head_dim values (the RoPE part is the V side's)."""
    if fmt.base == "vllm.fp8_ds_mla":
        return head_dim + 4 * (head_dim // FP8_TILE)  # E4M3 values + fp32 scale per 128
    return head_dim // 2 + head_dim // NVFP4_BLOCK  # E2M1 nibbles + E4M3 scale per 16


def check_head_dim(fmt, head_dim: int) -> None:
    tile = _TILE[fmt.base]
    if head_dim % tile:
        raise ValueError(f"vllm:{fmt.base[5:]} quantizes the MLA latent in tiles of {tile}; this latent is {head_dim} "
                         f"wide (kv_lora_rank): give a model whose kv_lora_rank is a multiple of {tile} (vLLM serves "
                         f"it for DeepSeek's 512).")


# ------------------------------------------------------------------------------------------ encode / decode

def encode(fmt, x: torch.Tensor, scale) -> dict:
    """x: the latent [..., T, L] float -> fp8: data float8_e4m3fn [..., T, L], scale fp32 [..., T, L / 128];
    nvfp4: data uint8 [..., T, L / 2], scale float8_e4m3fn [..., T, L / 16]."""
    if scale is not None:
        raise ValueError(f"{fmt.spec} computes its scales per tile of the latent; pass no static scale.")
    tile = _TILE[fmt.base]
    g = x.float().reshape(*x.shape[:-1], x.shape[-1] // tile, tile)  # [..., T, L/tile, tile]
    amax = g.abs().amax(dim=-1, keepdim=True)  # [..., T, L/tile, 1]
    if fmt.base == "vllm.fp8_ds_mla":
        s = torch.clamp_min(amax * torch.tensor(1.0 / 448.0, dtype=torch.float32), _FP8_MIN_SCALE)
        s = torch.exp2(torch.ceil(torch.log2(s.double())).float())  # a power of two >= s
        data = (g / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).reshape(x.shape)
        return {"data": data, "scale": s.squeeze(-1)}
    sf = torch.clamp_min(amax * torch.tensor(1.0 / 6.0, dtype=torch.float32), _NVFP4_MIN_SCALE)
    sf = sf.clamp(max=448.0).to(torch.float8_e4m3fn)
    y = g * (1.0 / sf.float())
    codes = e2m1_encode(y.abs()) | (torch.signbit(y).to(torch.uint8) << 3)
    return {"data": pack(codes.reshape(x.shape), 4), "scale": sf.squeeze(-1)}


_E2M1_SIGNED = tuple(v for sign in (1.0, -1.0) for v in (sign * m for m in E2M1_VALUES))


def decode(fmt, q) -> torch.Tensor:
    """QTensor -> fp32 latent [..., T, L]: value * its tile's scale."""
    if fmt.base == "vllm.fp8_ds_mla":
        values = q.data.float()
    else:
        values = decode_bytes(q.data, 4, _E2M1_SIGNED)
    scale = q.scale.float()  # [..., T, L/tile]
    g = values.reshape(*values.shape[:-1], scale.shape[-1], values.shape[-1] // scale.shape[-1])
    return (g * scale.unsqueeze(-1)).reshape(values.shape)



# ------------------------------------------------------------------------------------------ the family

FAMILY = Family(
    name="ds_mla",
    doc="vLLM's DeepSeek MLA latent records (vllm:fp8_ds_mla, vllm:nvfp4_ds_mla); read dequantized, no kernel",
    bases={"vllm.fp8_ds_mla": BaseInfo("ds_mla", 8, "token", ("token",), block=FP8_TILE, engine="vllm"),
           "vllm.nvfp4_ds_mla": BaseInfo("ds_mla", 4, "token", ("token",), block=NVFP4_BLOCK, engine="vllm")},
    codec=sys.modules[__name__],
    choices=(choice("vllm:fp8_ds_mla", export=16, memory=14), choice("vllm:nvfp4_ds_mla", memory=15)),
)
