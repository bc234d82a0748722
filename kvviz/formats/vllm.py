"""vLLM's per-token-head and NVFP4 KV caches, stored bit for bit as vLLM's store kernels compute them.

Rows of spec.BASES reached as `vllm:<dtype>` (engines.py). Each follows one vLLM store path, on the CPU in fp32:

- `int8_per_token_head`, `fp8_per_token_head`: vllm/v1/attention/ops/triton_reshape_and_cache_flash.py,
  `_reshape_cache_per_token_head`. One fp32 scale per token and head, `max(absmax / QMAX, 1e-6)`; `q = x * (1 / scale)`;
  int8 first rounds half away from zero (`where(q >= 0, q + 0.5, q - 0.5)`, each a multiply-add the GPU fuses), then
  clamps to QMIN..QMAX and `tl.store` casts into the cache's dtype: int8 truncates toward zero (Triton's float-to-int
  cast), E4M3 (no rounding step before it) rounds to nearest even. QMAX/QMIN: 127/-128 (int8), 448/-448 (E4M3).
- `int4_per_token_head`: vllm/v1/attention/ops/int4_per_token_head.py. `single_rht`: signs from a CPU generator
  seeded 0x9E3779B9, then the unnormalized Walsh-Hadamard butterfly (H x, norm sqrt(b)), cast back to the model's
  dtype, over blocks of b, the largest power of two dividing d (b = d for a power of two; head_dim 96: three blocks
  of 32, each with the same b signs); `_reshape_cache_int4_kernel`: asymmetric 4 bits over [min, max] with scale
  `max((max - min) / 15, 1e-6)`, zero point `round(-min / scale)` in 0..15 hidden in the low 4 bits of the fp32
  scale, codes `round(x * (1 / scale) + zp)` in 0..15 (round half away from zero: `trunc(v +- 0.5)`); two per byte,
  even element low. The read path takes `(u - zp) * scale_with_low_bits_cleared` and un-rotates the output by
  D H / b.
- `nvfp4`, `nvfp4_4over6`: csrc cache kernel `reshape_and_cache_nvfp4_kernel` (DEFAULT / FOUR_OVER_SIX scale
  search) with vLLM's default k_scale = v_scale = 1.0 (no checkpoint scales). Per 16 values an E4M3 block scale
  `e4m3(amax * (1 / 6))` (saturating, nearest even), elements `e2m1(x * (1 / scale))` (nearest even, saturating at
  6). 4over6 also tries the divisor 4 and keeps it when its squared error (fp32, summed pair by pair) is lower.
  vLLM 0.32 stores NVFP4 only through FlashInfer's backend (`torch.ops._C_cache_ops.reshape_and_cache_flash`, this
  CUDA kernel; no Triton store). nvcc may fuse the error's multiply-adds; that can only change the choice between
  two candidates whose errors agree to the last bit.

The GPU's approximate reciprocal (`rcp.approx.ftz`, Triton's fp32 division) is taken as the IEEE result here, and
Triton's fused multiply-add in `x * inv + zp` is computed exactly (float64, then rounded once to fp32), as an FMA
rounds. vLLM computes the int4 rotation with hadacore on CUDA (through bf16), the butterfly on the CPU: this follows
the butterfly. tests/test_vllm_stores.py runs vLLM's own Triton store kernels (the pinned package, in Triton's CPU
interpreter) and checks every store here but NVFP4 against them, bit for bit. Bytes per token and head equal vLLM's
page-size formula (v1/kv_cache_interface.py): int8 / fp8 d + 4, int4 d / 2 + 4, nvfp4 d / 2 + d / 16.
"""

from __future__ import annotations

import functools
import sys

import torch

from .family import BaseInfo, Family, Layout, choice
from .family import layout as layout_of

from .fp4 import E2M1_VALUES, e2m1_encode
from .packing import decode_bytes, pack

_QRANGE = {"vllm.int8_per_token_head": (127.0, -128.0), "vllm.fp8_per_token_head": (448.0, -448.0)}
RHT_SEED = 0x9E3779B9  # int4_per_token_head.py _get_rht_signs(d, round_idx=0)
NVFP4_BLOCK = 16


def token_head_bytes(fmt, head_dim: int) -> int:
    """Bytes vLLM's cache holds per token and head (data + scales)."""
    if fmt.base in _QRANGE:
        return head_dim + 4  # int8 / fp8 data + fp32 scale
    if fmt.base == "vllm.int4_per_token_head":
        return head_dim // 2 + 4  # packed nibbles + fp32 scale holding the zero point
    return head_dim // 2 + head_dim // NVFP4_BLOCK  # e2m1 nibbles + one E4M3 scale per 16


def check_head_dim(fmt, head_dim: int) -> None:
    if fmt.base == "vllm.int4_per_token_head" and head_dim % 2:
        raise ValueError(f"vllm:int4_per_token_head packs two values a byte: it needs an even head_dim, got "
                         f"{head_dim}.")
    if fmt.base.startswith("vllm.nvfp4") and head_dim % NVFP4_BLOCK:
        raise ValueError(f"vllm:{fmt.base[5:]} needs head_dim to be a multiple of 16, got {head_dim}.")


def kernel_fields(fmt, head_dim: int) -> dict:
    """How the fused kernels read this store (kernels.packed.PackedSide's fields beyond data / scale / zero): the
    rotation is the matrix R with x = stored @ R."""
    if fmt.base == "vllm.int8_per_token_head":
        return dict(elem="float", bits=8, scale_kind="token", group=head_dim)  # int8 codes load natively
    if fmt.base == "vllm.fp8_per_token_head":
        return dict(elem="fp8_e4m3", bits=8, scale_kind="token", group=head_dim)
    if fmt.base == "vllm.int4_per_token_head":
        return dict(elem="int", bits=4, scale_kind="token", group=head_dim, zp_bits=4, rotation=rht_matrix(head_dim))
    return dict(elem="e2m1", bits=4, scale_kind="token", group=NVFP4_BLOCK)


def pack_table(fmt, head_dim: int) -> torch.Tensor | None:
    """The table the CPU packer reads (kernels/cpu/jit/pack_engines.py): int4's RHT signs [D] (one block's signs
    repeated), else None."""
    return rht_signs(head_dim) if fmt.base == "vllm.int4_per_token_head" else None


@functools.lru_cache(maxsize=16)
def rht_matrix(d: int) -> torch.Tensor:
    """R [d, d] fp32 with `decode`'s un-rotation as one matrix: block-diagonal, walsh_hadamard(r) * signs / b ==
    r @ R (b = rht_block(d))."""
    return rht(torch.eye(d), inverse=True) / rht_block(d)


# ------------------------------------------------------------------------------------------ encode

def encode(fmt, x: torch.Tensor, scale) -> dict:
    """x: [..., T, D] float -> QTensor fields (data, scale)."""
    if scale is not None:
        raise ValueError(f"{fmt.spec} computes its scales per token and head; pass no static scale.")
    if fmt.base in _QRANGE:
        return _per_token_head(x, *_QRANGE[fmt.base], fp8=fmt.base == "vllm.fp8_per_token_head")
    if fmt.base == "vllm.int4_per_token_head":
        return _int4(x)
    return _nvfp4(x, four_over_six=fmt.base == "vllm.nvfp4_4over6")


def _per_token_head(x: torch.Tensor, qmax: float, qmin: float, fp8: bool) -> dict:
    x32 = x.float()
    scale = torch.clamp_min(x32.abs().amax(dim=-1, keepdim=True) / qmax, 1e-6)  # [..., T, 1] fp32
    inv = 1.0 / scale
    if fp8:
        return {"data": torch.clamp(x32 * inv, qmin, qmax).to(torch.float8_e4m3fn), "scale": scale}
    # where(q >= 0, q + 0.5, q - 0.5) with q = x * inv: each branch one fused multiply-add on the GPU (exact in
    # float64 here, then rounded once); the sign test reads the rounded product
    half = torch.where(x32 * inv >= 0, 0.5, -0.5).double()
    q = (x32.double() * inv.double() + half).float()
    data = torch.clamp(q, qmin, qmax).to(torch.int8)  # truncation, as Triton's store casts
    return {"data": data, "scale": scale}


def rht_block(d: int) -> int:
    """The size of single_rht's Hadamard blocks: the largest power of two dividing d (vllm's
    largest_power_of_2_divisor)."""
    return d & -d


@functools.lru_cache(maxsize=16)
def rht_signs(d: int) -> torch.Tensor:
    """vLLM's ±1 signs for head_dim d (fp32 [d]), drawn exactly as int4_per_token_head.py draws them: b =
    rht_block(d) signs, repeated for each of the d / b blocks."""
    b = rht_block(d)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(RHT_SEED)
    return (2.0 * torch.bernoulli(torch.full((b,), 0.5), generator=gen) - 1.0).repeat(d // b)


def rht(x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """single_rht over the last dim of fp32 x [..., d]: H (x * signs) per block of rht_block(d), or with inverse
    (H x) * signs; unnormalized (norm sqrt(b))."""
    d = x.shape[-1]
    b = rht_block(d)
    signs = rht_signs(d).to(x.device)
    blocks = (x if inverse else x * signs).reshape(*x.shape[:-1], d // b, b)
    y = walsh_hadamard(blocks).reshape(x.shape)
    return y * signs if inverse else y


def walsh_hadamard(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized Walsh-Hadamard transform over the last dim (H x, H H = d I), vLLM's CPU butterfly order."""
    d = x.shape[-1]
    h = 1
    while h < d:
        xv = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)  # [..., d/2h, 2, h]
        a, b = xv[..., 0, :], xv[..., 1, :]
        x = torch.stack([a + b, a - b], dim=-2).reshape(x.shape)
        h <<= 1
    return x


def _round_away(v: torch.Tensor) -> torch.Tensor:
    """Triton's `where(v >= 0, (v + 0.5).to(int32), (v - 0.5).to(int32))` in fp32; out-of-range values saturate as
    the GPU's cvt.rzi does (they are clamped to 0..15 next anyway)."""
    v = v.clamp(-(2.0**30), 2.0**30)
    return torch.where(v >= 0, (v + 0.5).trunc(), (v - 0.5).trunc())


def _int4(x: torch.Tensor) -> dict:
    rotated = rht(x.float()).to(x.dtype).float()  # single_rht(x.float()).to(x.dtype)
    lo = rotated.amin(dim=-1, keepdim=True)
    hi = rotated.amax(dim=-1, keepdim=True)
    scale = torch.clamp_min((hi - lo) / 15.0, 1e-6)  # [..., T, 1] fp32
    zp = _round_away(-lo / scale).clamp(0.0, 15.0)
    inv = 1.0 / scale
    # x * inv + zp: one fused multiply-add on the GPU, exact in float64 here, then rounded once
    s = (rotated.double() * inv.double() + zp.double()).float()
    codes = _round_away(s).clamp(0.0, 15.0)
    bits = (scale.view(torch.int32) & -16) | zp.to(torch.int32)
    return {"data": pack(codes.to(torch.uint8), 4), "scale": bits.view(torch.float32)}


def _e4m3_saturating(v: torch.Tensor) -> torch.Tensor:
    """fp32 >= 0 -> E4M3 (nearest even, saturating at 448, as __nv_fp8_e4m3(float) with __NV_SATFINITE)."""
    return v.clamp(max=448.0).to(torch.float8_e4m3fn)


def _candidate(amax: torch.Tensor, divisor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """nvfp4_candidate_scale with SFScaleVal = 1 / k_scale = 1: (E4M3 block scale, the scale elements multiply by)."""
    sf = _e4m3_saturating(amax * (torch.tensor(1.0) / divisor))  # rcp(divisor) -> IEEE 1 / divisor in fp32
    sf32 = sf.float()
    out = torch.where(sf32 != 0, 1.0 / torch.where(sf32 != 0, sf32, 1.0), 0.0)
    return sf, out


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """cvt.rn.satfinite.e2m1: nearest even, saturating; the sign bit follows the sign of v (-0 included)."""
    return e2m1_encode(v.abs()) | (torch.signbit(v).to(torch.uint8) << 3)


def _sq_error(xb: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """nvfp4_reconstruction_error: fp32 sum over the block's pairs, in order, of dx^2 + dy^2."""
    deq = torch.where(out != 0, 1.0 / torch.where(out != 0, out, 1.0), 0.0)  # [..., G, 1]
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=xb.device)
    q = values[e2m1_encode((xb * out).abs()).long()] * torch.where(torch.signbit(xb * out), -1.0, 1.0)
    diff = torch.where(out != 0, q * deq - xb, xb)  # outputScale == 0: the error is x itself
    err = torch.zeros(xb.shape[:-1], dtype=torch.float32, device=xb.device)
    for i in range(0, xb.shape[-1], 2):
        err = err + (diff[..., i] * diff[..., i] + diff[..., i + 1] * diff[..., i + 1])
    return err


def _nvfp4(x: torch.Tensor, four_over_six: bool) -> dict:
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // NVFP4_BLOCK, NVFP4_BLOCK)  # [..., T, D/16, 16]
    amax = xb.abs().amax(dim=-1)  # [..., T, D/16]
    sf, out = _candidate(amax, 6.0)
    if four_over_six:
        sf4, out4 = _candidate(amax, 4.0)
        use4 = _sq_error(xb, out4.unsqueeze(-1)) < _sq_error(xb, out.unsqueeze(-1))
        sf = torch.where(use4, sf4.float(), sf.float()).to(torch.float8_e4m3fn)
        out = torch.where(use4, out4, out)
    codes = _e2m1_codes(xb * out.unsqueeze(-1)).reshape(x.shape)
    return {"data": pack(codes, 4), "scale": sf}


# ------------------------------------------------------------------------------------------ decode

_INT4_CODES = tuple(float(c) for c in range(16))
_E2M1_SIGNED = tuple(v for sign in (1.0, -1.0) for v in (sign * m for m in E2M1_VALUES))


def int4_unpacked(q) -> torch.Tensor:
    """int4_per_token_head's values in the rotated domain, fp32 [..., T, D]: (u - zp) * scale, as the read kernel
    applies them (zero point from the scale's low 4 bits, scale with those bits cleared)."""
    bits = q.scale.view(torch.int32)  # [..., T, 1]
    zp = (bits & 0xF).float()
    scale = (bits & -16).view(torch.float32)
    return (decode_bytes(q.data, 4, _INT4_CODES) - zp) * scale


def decode(fmt, q) -> torch.Tensor:
    """QTensor -> fp32 x_hat [..., T, D] in the model's space."""
    if fmt.base in _QRANGE:
        return q.data.float() * q.scale
    if fmt.base == "vllm.int4_per_token_head":
        rotated = int4_unpacked(q)
        return rht(rotated, inverse=True) / rht_block(rotated.shape[-1])  # single_rht(inverse) / rht_norm
    values = decode_bytes(q.data, 4, _E2M1_SIGNED)  # [..., T, D]
    scale = q.scale.float()  # [..., T, D/16]; times k_scale = 1.0
    blocks = values.reshape(*values.shape[:-1], scale.shape[-1], NVFP4_BLOCK)  # [..., T, D/16, 16]
    return (blocks * scale.unsqueeze(-1)).reshape(values.shape)


# ------------------------------------------------------------------------------------------ the family

_PACKERS = {"vllm.int8_per_token_head": "engine:EN_INT8", "vllm.fp8_per_token_head": "engine:EN_FP8",
            "vllm.int4_per_token_head": "engine:EN_INT4", "vllm.nvfp4": "engine:EN_NVFP4",
            "vllm.nvfp4_4over6": "engine:EN_NVFP4_4OVER6"}  # kernels/cpu/jit/pack_engines.py's loops
_SCALE_DTYPES = {"vllm.nvfp4": "e4m3", "vllm.nvfp4_4over6": "e4m3"}


def layout(fmt, head_dim: int) -> Layout:
    return layout_of(scale_dtype=_SCALE_DTYPES.get(fmt.base, "fp32"), packer=_PACKERS[fmt.base],
                     pack_table=pack_table(fmt, head_dim), **kernel_fields(fmt, head_dim))


def _row(bits: int, block: int | None = None) -> BaseInfo:
    return BaseInfo("vllm", bits, "token", ("token",), block=block, engine="vllm")


FAMILY = Family(
    name="vllm",
    doc="vLLM's per-token-head and NVFP4 store paths (typed vllm:<dtype>)",
    bases={"vllm.int8_per_token_head": _row(8), "vllm.fp8_per_token_head": _row(8),
           "vllm.int4_per_token_head": _row(4), "vllm.nvfp4": _row(4, 16), "vllm.nvfp4_4over6": _row(4, 16)},
    codec=sys.modules[__name__],
    layout=layout,
    choices=(choice("vllm:int4_per_token_head", compare=11, export=14, memory=12, sensitivity=12, candidates=6,
                    rotation=2),),
)
