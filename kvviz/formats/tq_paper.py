"""TurboQuant, the paper's two quantizers (Zandieh et al., arXiv 2504.19874), as kvviz formats for teaching.

- `tq_mseB` (B = 1..4): TQ-mse. Each token-head x = ||x|| u; u is rotated by a random orthogonal matrix R (Haar,
  from a seeded Gaussian), which makes every coordinate follow the density of one coordinate of a uniform point
  on the sphere, f(t) ~ (1 - t^2)^((d-3)/2) (about N(0, 1/d)); each coordinate is replaced by the nearest of the
  2**B Lloyd-Max centroids for f. Stored: B-bit indices + ||x|| as fp16. The paper's MSE per unit vector is about
  0.36, 0.117, 0.03, 0.009 for B = 1..4.
- `tq_prodB` (B = 2..4): TQ-prod. TQ-mse at B-1 bits, then the residual r = u - u_mse is sketched by QJL: the
  signs of S r (S a d x d standard Gaussian matrix, seeded) and ||r||. Read back,
  u_hat = u_mse + sqrt(pi/2) / d * ||r|| * S^T sign(S r), whose inner product with any y is unbiased:
  E_S[<y, u_hat>] = <y, u>. Stored: (B-1)-bit indices + d sign bits + two fp16 norms.

Any power-of-two head_dim. Bytes per token and head: tq_mseB d * B / 8 + 2; tq_prodB d * B / 8 + 4. The formats use
seed 0; `mse_roundtrip` / `prod_roundtrip` take a seed, for experiments over many draws (tests check the paper's
statements with them). Indices and sign bits are packed 8 per `bits` bytes (turboquant.pack_bits).
"""

from __future__ import annotations

import functools
import math
import sys

import torch

from .family import BaseInfo, Family, Layout, choice
from .family import layout as layout_of

from .turboquant import pack_bits, unpack_bits

FORMAT_SEED = 0
_GRID = 200_001  # points of the density grid the Lloyd-Max iteration integrates on
_ITERS = 500


def token_head_bytes(fmt, head_dim: int) -> int:
    return head_dim * fmt.bits // 8 + (4 if _is_prod(fmt) else 2)


def check_head_dim(fmt, head_dim: int) -> None:
    if head_dim < 8 or head_dim & (head_dim - 1):
        raise ValueError(f"{fmt.spec} needs a head_dim that is a power of two (at least 8), got {head_dim}.")


def _is_prod(fmt) -> bool:
    return fmt.base.startswith("tq_prod")


def kernel_fields(fmt, head_dim: int) -> dict:
    """How the fused kernels read TQ-mse and TQ-prod (kernels.packed.PackedSide's fields beyond data / scale): the
    centroid times the fp16 norm, in the rotated domain (x = stored @ R^T). TQ-prod adds its QJL sketch: the sign
    bits after the (B-1)-bit codes, the residual norm beside the norm, and G = sqrt(pi/2) / d * S, so that
    x = norm * (c[codes] @ R^T + r * (z @ G)) as `decode` reads it."""
    prod = _is_prod(fmt)
    bits = fmt.bits - 1 if prod else fmt.bits
    return dict(elem="table", bits=bits, values=_centroids32(head_dim, bits), scale_kind="token", group=head_dim,
                rotation=_rotation_t(head_dim), qjl=_qjl_matrix(head_dim) if prod else None)


@functools.lru_cache(maxsize=16)
def _qjl_matrix(d: int) -> torch.Tensor:
    return (math.sqrt(math.pi / 2) / d * _sketch(d, FORMAT_SEED)).contiguous()


@functools.lru_cache(maxsize=32)
def _centroids32(d: int, bits: int) -> torch.Tensor:
    return centroids(d, bits).float()


@functools.lru_cache(maxsize=16)
def _rotation_t(d: int) -> torch.Tensor:
    return _rotation(d, FORMAT_SEED).T.contiguous()


@functools.lru_cache(maxsize=32)
def centroids(d: int, bits: int) -> torch.Tensor:
    """Lloyd-Max centroids (float64 [2**bits], ascending) for one coordinate of a uniform unit vector in R^d."""
    half = min(1.0, 12.0 / math.sqrt(d))
    t = torch.linspace(-half, half, _GRID, dtype=torch.float64)
    f = (1 - t * t).clamp(min=0) ** ((d - 3) / 2)
    dt = t[1] - t[0]
    mass = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum((f[1:] + f[:-1]) / 2 * dt, 0)])
    moment = torch.cat([torch.zeros(1, dtype=torch.float64),
                        torch.cumsum((t[1:] * f[1:] + t[:-1] * f[:-1]) / 2 * dt, 0)])

    def integral(cum: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        pos = ((edges + half) / dt).clamp(0, _GRID - 1)  # linear interpolation of the cumulative integral
        i = pos.floor().long().clamp(max=_GRID - 2)
        return cum[i] + (pos - i) * (cum[i + 1] - cum[i])

    n = 2**bits
    sigma = 1 / math.sqrt(d)
    c = torch.linspace(-2 * sigma, 2 * sigma, n, dtype=torch.float64) if n > 1 else torch.zeros(1)
    for _ in range(_ITERS):
        edges = torch.cat([torch.tensor([-half]), (c[1:] + c[:-1]) / 2, torch.tensor([half])]).double()
        new = (integral(moment, edges[1:]) - integral(moment, edges[:-1])) / (
            integral(mass, edges[1:]) - integral(mass, edges[:-1]))
        if float((new - c).abs().max()) < 1e-13:
            c = new
            break
        c = new
    return c


@functools.lru_cache(maxsize=32)
def _rotation(d: int, seed: int) -> torch.Tensor:
    """A Haar-random orthogonal matrix [d, d] (fp32): QR of a seeded Gaussian with R's diagonal made positive."""
    g = torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    return (q * torch.sign(torch.diagonal(r))).float()


def rotation(d: int, seed: int = FORMAT_SEED) -> torch.Tensor:
    """The format's rotation R [d, d] (fp32): a unit row u is coded as the centroid indices of y = u @ R."""
    return _rotation(d, seed)


@functools.lru_cache(maxsize=32)
def _sketch(d: int, seed: int) -> torch.Tensor:
    """QJL's Gaussian matrix S [d, d] (fp32), drawn from a seed of its own."""
    return torch.randn(d, d, generator=torch.Generator().manual_seed(seed + 1_000_003), dtype=torch.float32)


def _mse_codes(u: torch.Tensor, bits: int, seed: int) -> torch.Tensor:
    """Unit rows u [N, D] -> centroid indices [N, D] of u @ R."""
    d = u.shape[-1]
    c = centroids(d, bits).float().to(u.device)
    y = u @ _rotation(d, seed).to(u.device)
    return torch.bucketize(y, (c[1:] + c[:-1]) / 2)


def _mse_read(codes: torch.Tensor, bits: int, seed: int) -> torch.Tensor:
    d = codes.shape[-1]
    c = centroids(d, bits).float().to(codes.device)
    return c[codes] @ _rotation(d, seed).to(codes.device).T


def _split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (fp32 rows [N, D] of unit length (zero rows stay zero), norms [N, 1] fp32)."""
    rows = x.float().reshape(-1, x.shape[-1])
    norm = rows.norm(dim=-1, keepdim=True)
    return rows / torch.where(norm > 0, norm, 1.0), norm


def _quantize(x: torch.Tensor, bits: int, prod: bool, seed: int) -> dict:
    d = x.shape[-1]
    u, norm = _split(x)
    mse_bits = bits - 1 if prod else bits
    codes = _mse_codes(u, mse_bits, seed)
    data = [pack_bits(codes, mse_bits)]
    norms = [norm]
    if prod:
        r = u - _mse_read(codes, mse_bits, seed)
        signs = (r @ _sketch(d, seed).to(x.device).T) >= 0  # sign(S r), 0 counted as +
        data.append(pack_bits(signs, 1))
        norms.append(r.norm(dim=-1, keepdim=True))
    lead = x.shape[:-1]
    return {"data": torch.cat(data, dim=-1).reshape(*lead, -1),
            "scale": torch.cat(norms, dim=-1).to(torch.float16).reshape(*lead, len(norms))}


def _read(data: torch.Tensor, scale: torch.Tensor, d: int, bits: int, prod: bool, seed: int) -> torch.Tensor:
    lead = data.shape[:-1]
    data, scale = data.reshape(-1, data.shape[-1]), scale.float().reshape(-1, scale.shape[-1])
    mse_bits = bits - 1 if prod else bits
    cut = d * mse_bits // 8
    u = _mse_read(unpack_bits(data[:, :cut], mse_bits), mse_bits, seed)
    if prod:
        z = unpack_bits(data[:, cut:], 1).float() * 2 - 1  # ±1
        u = u + math.sqrt(math.pi / 2) / d * scale[:, 1:2] * (z @ _sketch(d, seed).to(data.device))
    return (scale[:, :1] * u).reshape(*lead, d)


def encode(fmt, x: torch.Tensor, scale) -> dict:
    """x: [..., T, D] -> QTensor fields: data (indices, then for tq_prod the sign bits), scale (fp16 [..., T, 1]:
    the norm; tq_prod [..., T, 2]: the norm and the residual's norm)."""
    if scale is not None:
        raise ValueError(f"{fmt.spec} computes its norms per token and head; pass no static scale.")
    return _quantize(x, fmt.bits, _is_prod(fmt), FORMAT_SEED)


def decode(fmt, q) -> torch.Tensor:
    return _read(q.data, q.scale, q.head_dim, fmt.bits, _is_prod(fmt), FORMAT_SEED)


def mse_roundtrip(x: torch.Tensor, bits: int, seed: int = FORMAT_SEED) -> torch.Tensor:
    """TQ-mse at `bits` of x [..., D] with the rotation drawn from `seed`: what the format reads back (fp32)."""
    f = _quantize(x, bits, False, seed)
    return _read(f["data"], f["scale"], x.shape[-1], bits, False, seed)


def prod_roundtrip(x: torch.Tensor, bits: int, seed: int = FORMAT_SEED) -> torch.Tensor:
    """TQ-prod at `bits` of x [..., D] with the rotation and QJL matrix drawn from `seed` (fp32)."""
    f = _quantize(x, bits, True, seed)
    return _read(f["data"], f["scale"], x.shape[-1], bits, True, seed)


# ------------------------------------------------------------------------------------------ the family

def layout(fmt, head_dim: int) -> Layout:
    """kernel_fields as a Layout: codebook codes in a little-endian bit stream, an fp16 norm per token (TQ-prod:
    the residual norm beside it, the sign bits after the codes)."""
    fields = kernel_fields(fmt, head_dim)
    return layout_of(scale_dtype="fp16", **fields)


def rotation_note(fmt, head_dim: int) -> str:
    return f"Haar-random orthogonal R ({head_dim}x{head_dim}, seed 0, the paper's): y = (k / ||k||) @ R"


_ELEMENTS = {"mse": "TurboQuant (the paper): a Haar rotation, then a {b}-bit Lloyd-Max codebook index per coordinate",
             "prod": "TurboQuant (the paper): a {m}-bit TQ-mse code plus a 1-bit QJL sketch of the residual"}
FAMILY = Family(
    name="tq",
    doc="the TurboQuant paper's quantizers (arXiv 2504.19874): TQ-mse and TQ-prod",
    bases={**{f"tq_mse{b}": BaseInfo("tq", b, "token", ("token",), elements=_ELEMENTS["mse"].format(b=b),
                                     scales="fp16 norm per token and head") for b in (1, 2, 3, 4)},
           **{f"tq_prod{b}": BaseInfo("tq", b, "token", ("token",), elements=_ELEMENTS["prod"].format(m=b - 1),
                                      scales="fp16 norm and fp16 residual norm per token and head")
              for b in (2, 3, 4)}},
    codec=sys.modules[__name__],
    layout=layout,
    rotation_note=rotation_note,
    choices=(choice("tq_mse4", rotation=4), choice("tq_prod4", rotation=5)),
)
