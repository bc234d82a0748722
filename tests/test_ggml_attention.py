"""kvviz.ggml_attention: llama.cpp's rotation sizes, its matmul-input rounding and its flash attention in torch,
on small random tensors (llama.cpp itself is compared in tests/test_engines_llamacpp.py).

    python -m pytest tests/test_ggml_attention.py -q
"""

from __future__ import annotations

import pytest
import torch

from kvviz import ggml_attention as ga
from kvviz.formats import get_format


def _qkv(seed: int = 0, hq: int = 4, hkv: int = 2, t: int = 9, d: int = 64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, hq, t, d, generator=g)
    k = torch.randn(1, hkv, t, d, generator=g)
    k[..., 3] *= 20  # an outlier channel, as real K has
    v = torch.randn(1, hkv, t, d, generator=g)
    return q, k, v


@pytest.mark.parametrize("head_dim, size", [(64, 64), (128, 128), (256, 256), (192, 64), (320, 64), (96, None),
                                            (80, None)])
def test_k_rotation_is_the_largest_power_of_two_from_64_dividing_head_dim(head_dim, size):
    assert ga.k_rotation(head_dim) == size


def test_rotation_is_its_own_inverse_and_blockwise():
    x = torch.randn(3, 256)
    assert torch.allclose(ga.rotate(ga.rotate(x, 64), 64), x, atol=1e-5)
    # blockwise: each 64-wide block rotated alone
    assert torch.allclose(ga.rotate(x, 64)[:, 64:128], ga.rotate(x[:, 64:128], 64), atol=1e-6)


def test_q8_0_activation_rounding_is_kvvizs_q8_0_but_for_halfway_codes():
    x = torch.randn(64, 128) * 3
    ours = ga.round_activation(x, "q8_0")
    fmt = get_format("q8_0")
    same = (ours == fmt.dequantize(fmt.quantize(x))).float().mean()
    assert same > 0.999, same  # AVX2 rounds halves to even and divides by amax / 127 via 127 / amax
    assert torch.equal(ga.round_activation(x, "q8_1"), ours)
    assert torch.equal(ga.round_activation(x, "f32"), x)


def test_q8_k_rounding_keeps_each_blocks_largest_value_and_half_a_step():
    x = torch.randn(4, 512)
    y = ga.round_activation(x, "q8_K")
    step = x.unflatten(-1, (-1, 256)).abs().amax(-1, keepdim=True) / 127  # [4, 2, 1]
    err = (y - x).unflatten(-1, (-1, 256)).abs()
    assert (err <= step / 2 * 1.0001).all() and (err.amax(-1) > 0).all()
    assert torch.allclose(y.abs().amax(-1), x.abs().amax(-1))


def test_f16_cache_is_sdpa_over_fp16_rounded_kv_and_never_rotated():
    q, k, v = _qkv()
    mask = torch.ones(9, 9, dtype=torch.bool).tril()[None, None]
    out = ga.attention(q, k, v, mask, 0.125, "f16", "f16", rotate_kv=True)
    k2, v2 = (x.half().float().repeat_interleave(2, dim=1) for x in (k, v))  # GQA: 4 q heads on 2 kv heads
    ref = torch.nn.functional.scaled_dot_product_attention(q, k2, v2, mask, scale=0.125).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # mask None means causal (bottom-right)
    torch.testing.assert_close(ga.attention(q, k, v, None, 0.125, "f16", "f16"), out)


def test_interleaved_order_changes_a_quantized_cache_only():
    q, k, v = _qkv(1)
    f16 = [ga.attention(q, k, v, None, 0.125, "f16", "f16", interleaved=i) for i in (False, True)]
    torch.testing.assert_close(f16[0], f16[1], atol=1e-5, rtol=1e-5)
    q4 = [ga.attention(q, k, v, None, 0.125, "q4_0", "q4_0", rotate_kv=False, interleaved=i) for i in (False, True)]
    assert not torch.allclose(q4[0], q4[1], atol=1e-4)


@pytest.mark.parametrize("k_type, v_type", [("q4_0", "q4_0"), ("q8_0", "q4_0"), ("iq4_nl", "iq4_nl")])
def test_rotation_cuts_the_error_of_an_outlier_channel(k_type, v_type):
    """The reason llama.cpp rotates: an outlier channel inflates its block's scale; spread by the Hadamard
    transform, every block shares it. The output error against the f16 cache drops."""
    q, k, v = _qkv(2)
    base = ga.attention(q, k, v, None, 0.125, "f16", "f16")
    err = {r: (ga.attention(q, k, v, None, 0.125, k_type, v_type, rotate_kv=r) - base).norm() for r in (False, True)}
    assert err[True] < err[False], err
