"""vLLM's UltraQuant 4-bit KV cache (kvviz/formats/ultraquant.py, `vllm:ultraquant_4bit`): codes and scales of
hand-checked groups, the exponent's rounding, the key rotation, error bounds, vLLM's bytes per slot, generation on a
tiny Llama. Bit-exactness against vLLM's own Triton store kernel: tests/test_vllm_extra_stores.py.

    python -m pytest tests/test_formats_ultraquant.py -q
"""

from __future__ import annotations

import pytest
import torch

import kvviz
from kvviz import parse_kv
from kvviz.formats import ultraquant as uq
from kvviz.formats.packing import unpack

KV = parse_kv("vllm:ultraquant_4bit")


def _group(*values: float, d: int = 32) -> torch.Tensor:
    """One token of one head, [1, 1, 1, d]: `values` first, zeros after."""
    x = torch.zeros(1, 1, 1, d)
    x[..., : len(values)] = torch.tensor(values)
    return x


def test_codes_and_scale_of_a_hand_checked_group():
    """absmax 1: 0.156 -> log2 -2.68, + 0.5 -> floor -3: divisor 1/8, byte 124. x * 8 snaps to E2M1 with ties to
    the lower level (0.25 -> 0, -0.25 -> -0.5, 2.5 -> 2, -2.5 -> -3) and 8 saturating to 6."""
    q = KV.v.quantize(_group(1.0, 0.25, 0.03125, -0.03125, 0.0625, -0.1875, 0.3125, -0.3125))
    assert q.scale.tolist() == [[[[124]]]]
    #                         6  2  0  -0.5  0.5  -1.5  2  -3
    assert unpack(q.data, 4)[0, 0, 0, :8].tolist() == [7, 4, 0, 9, 1, 11, 4, 13]
    assert unpack(q.data, 4)[0, 0, 0, 8:].tolist() == [0] * 24  # zeros store +0
    assert KV.v.dequantize(q)[0, 0, 0, :8].tolist() == [0.75, 0.25, 0.0, -0.0625, 0.0625, -0.1875, 0.25, -0.375]


def test_the_exponent_rounds_half_up_in_the_log_domain():
    """e = floor(log2(0.156 absmax) + 0.5): the step sits at 0.156 absmax = 2**-2.5 (absmax 1.1332), neither at a
    power of two (floor: 1.6026, ceil: 0.8013) nor at 2**-3 / 0.156 itself."""
    assert KV.v.quantize(_group(1.13)).scale.item() == 127 - 3
    assert KV.v.quantize(_group(1.14)).scale.item() == 127 - 2
    assert KV.v.quantize(_group(0.81)).scale.item() == 127 - 3  # ceil of log2 would give -2 from 0.8013 up
    assert KV.v.quantize(_group(1.60)).scale.item() == 127 - 2  # floor of log2 would give -3 up to 1.6026


def test_a_zero_group_stores_byte_zero_and_reads_zero():
    q = KV.v.quantize(torch.zeros(1, 1, 2, 64))
    assert q.scale.eq(0).all() and q.data.eq(0).all()
    assert KV.v.dequantize(q).eq(0).all()


def test_keys_are_stored_rotated_and_values_are_not():
    """A one-hot key rotates to d equal values 1/sqrt(32) = 0.177: 0.156 * 0.177 -> e = -5, every code 6 (0.177 *
    32 = 5.66 > 5). The value stays one-hot."""
    x = _group(1.0)
    qk, qv = KV.k.quantize(x), KV.v.quantize(x)
    assert qk.scale.tolist() == [[[[122]]]] and unpack(qk.data, 4).eq(7).all()
    assert uq.stored(qk).eq(6 / 32).all()
    assert unpack(qv.data, 4)[0, 0, 0].tolist() == [7] + [0] * 31
    assert torch.allclose(KV.k.dequantize(qk), x * 6 / 32**0.5, atol=1e-6)  # H (6/32, ...) = 6 / sqrt(32) e_0


def test_the_butterfly_is_the_normalized_hadamard_transform():
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(uq.butterfly(x), x @ uq.hadamard(64), atol=1e-5)


@pytest.mark.parametrize("side", ("k", "v"))
@pytest.mark.parametrize("head_dim", (32, 64, 128, 256))
def test_round_trip_error_bounds(side, head_dim):
    """Each stored value is within 1 / 0.156 * sqrt(2) - 6 = 3.07 scales of its (rotated) input (the clip past 6:
    absmax / 2**e < 9.07), within half the widest E2M1 gap (1 scale) where it is not clipped; Gaussian tokens of
    spread norms come back with a relative error under 0.15."""
    fmt = KV.k if side == "k" else KV.v
    g = torch.Generator().manual_seed(head_dim)
    x = torch.randn(2, 3, 40, head_dim, generator=g) * torch.exp(torch.randn(2, 3, 40, 1, generator=g))
    q = fmt.quantize(x)
    src = uq.butterfly(x) if side == "k" else x
    s = uq.scales(q).repeat_interleave(uq.GROUP, -1)
    err = (uq.stored(q) - src).abs() / s
    assert err.max() <= 1 / 0.156 * 2**0.5 - 6 + 1e-5
    assert err[(src / s).abs() <= 6].max() <= 1.0
    rel = ((fmt.dequantize(q) - x).norm() / x.norm()).item()
    assert 0.05 < rel < 0.15, rel


@pytest.mark.parametrize("head_dim", (32, 64, 128, 256))
def test_bytes_per_token_and_head_equal_vllms_slot(head_dim):
    """format.py slot_size: K codes D/2 + K scales D/32 + V codes + V scales (272 B at D=256, 136 B at 128)."""
    slot = {32: 34, 64: 68, 128: 136, 256: 272}[head_dim]
    shape = (2, 3, 5, head_dim)
    assert KV.k.nbytes_for(shape) + KV.v.nbytes_for(shape) == 2 * 3 * 5 * slot
    q = KV.k.quantize(torch.randn(shape))
    assert q.nbytes == KV.k.nbytes_for(shape)
    assert KV.k.bits_per_value(head_dim) + KV.v.bits_per_value(head_dim) == 2 * 4.25


@pytest.mark.parametrize("head_dim", (16, 48, 96))
def test_head_dims_vllm_cannot_store_are_refused(head_dim):
    with pytest.raises(ValueError, match="power of two"):
        KV.k.quantize(torch.randn(1, 1, 2, head_dim))


def test_the_name_parses_and_is_listed():
    from kvviz.formats.engines import VLLM_DTYPES, VLLM_POW2_DTYPES

    assert KV.spec == "vllm:ultraquant_4bit" and KV.k.base == "vllm.uq4_k" and KV.v.base == "vllm.uq4_v"
    assert "ultraquant_4bit" in VLLM_DTYPES and "ultraquant_4bit" in VLLM_POW2_DTYPES
    assert kvviz.export_commands("vllm:ultraquant_4bit")["vllm"]["flags"] == "--kv-cache-dtype ultraquant_4bit"


def test_a_tiny_llama_generates_the_same_tokens_on_the_fused_cpu_decode_and_the_reference():
    """Head_dim 32 (one group): the cache quantizes through encode (no CPU packer writes UltraQuant), the cpu
    backend's fused decode reads the E2M1 codes, UE8M0 scales and the key rotation; its greedy tokens and nbytes
    equal the torch reference's, and nbytes kvviz.memory's figure."""
    from transformers import AutoModelForCausalLM

    from kernels.cpu import decode as cpu_decode
    from kvviz.memory import kv_cache_bytes_for
    from kvviz.tiny import tiny_config

    if not cpu_decode.cpu_usable():
        pytest.skip("numba is not installed: the CPU path is the reference")
    config = tiny_config("llama", head_dim=32)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=kvviz.attention.ATTN_NAME).eval()
    ids = torch.randint(1, 256, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    runs = {}
    for backend in ("cpu", "torch"):
        with kvviz.attention.use_backend(backend), torch.no_grad():
            cache = kvviz.QuantizedKVCache(model.config, "vllm:ultraquant_4bit")
            tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                    cache=cache)
        runs[backend] = tokens, cache.nbytes()
    assert torch.equal(runs["cpu"][0], runs["torch"][0])
    held = 10 + 6 - 1  # the last token is generated, never stored
    want = kv_cache_bytes_for(config, held, batch=2, k="vllm:ultraquant_4bit", layout="transformers")
    assert runs["cpu"][1] == runs["torch"][1] == want
