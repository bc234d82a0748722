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


# ---- the cache path: QuantizedKVCache holds llama.cpp's names in its Layout, the "kvviz" attention reads them ----

def test_layout_maps_k_and_v_into_llama_cpps_basis_and_back():
    lay = ga.layout("q4_0", "q8_0", 128, 64, interleaved=True)
    assert (lay.nk, lay.nv, lay.quantized) == (128, 64, True)
    x = torch.randn(2, 3, 128)
    assert torch.allclose(lay.from_cache(lay.to_cache(x, "k"), "k"), x, atol=1e-5)
    # interleaved: channel 1 of llama.cpp's order is transformers' channel D/2
    flat = ga.layout("q4_0", "q4_0", 128, 128, rotate_kv=False, interleaved=True)
    assert (flat.nk, flat.nv) == (None, None)
    assert torch.equal(flat.to_cache(x, "k")[..., 1], x[..., 64]) and torch.equal(flat.to_cache(x, "v"), x)
    # f16 beside a quantized V: K is not rotated, V is; nothing rotates on a head_dim llama.cpp keeps unrotated
    assert (ga.layout("f16", "q4_0", 64, 64).nk, ga.layout("f16", "q4_0", 64, 64).nv) == (None, 64)
    assert ga.layout("q4_0", "q4_0", 96, 96).nk is None and ga.layout("q4_0", "q4_0", 96, 96).nv is None


def _tiny(arch: str, seed: int = 0):
    from transformers import AutoModelForCausalLM

    from kvviz.tiny import tiny_config

    torch.manual_seed(seed)  # head_dim 64: llama.cpp's blocks of 32 and its 64-wide rotation fit
    return AutoModelForCausalLM.from_config(tiny_config(arch, head_dim=64), attn_implementation="kvviz").eval()


def _reference_logprobs(model, ids, k_type, v_type, rotate):
    """All tokens in one batch through kvviz.ggml_attention.attention (store and read in one call)."""
    from kvviz.engines import simulate

    return simulate.llamacpp_logprobs(model, ids[0].tolist(), {}, k_type, v_type, rotate,
                                      ga.interleaved_model(model.config)).double()


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2"])  # interleaved; sliding window 8; softcap + window
@pytest.mark.parametrize("name, k_type, v_type, rotate", [("llama.cpp:q4_0", "q4_0", "q4_0", True),
                                                          ("llama.cpp:k=q8_0,v=q4_0/norot", "q8_0", "q4_0", False)])
def test_the_cache_path_reads_as_the_reference_in_prefill_and_decode(arch, name, k_type, v_type, rotate):
    """A QuantizedKVCache of a llama.cpp name, read by the "kvviz" attention function, gives the logits of
    llama.cpp's cache and flash attention in one call: the prompt (12 tokens, past the window of 8) in one batch,
    then 3 decode steps, each reading what the cache stored."""
    from kvviz.cache import QuantizedKVCache

    model = _tiny(arch)
    ids = torch.tensor([[(11 * i) % 250 + 3 for i in range(15)]])
    ref = _reference_logprobs(model, ids, k_type, v_type, rotate)  # [15, vocab]
    cache = QuantizedKVCache(model.config, name)
    with torch.no_grad():
        got = [torch.log_softmax(model(input_ids=ids[:, :12], cache=cache, use_cache=True).logits[0].double(), -1)]
        for t in range(12, 15):
            got.append(torch.log_softmax(model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)
                                         .logits[0].double(), -1))
    torch.testing.assert_close(torch.cat(got), ref, atol=2e-5, rtol=0)


def test_llama_cpp_names_differ_from_kvvizs_own_and_norot_from_rotated():
    from kvviz.cache import QuantizedKVCache

    model = _tiny("llama")
    ids = torch.tensor([[(7 * i) % 250 + 3 for i in range(20)]])
    out = {}
    for spec in ("q4_0", "llama.cpp:q4_0", "llama.cpp:q4_0/norot"):
        with torch.no_grad():
            out[spec] = model(input_ids=ids, cache=QuantizedKVCache(model.config, spec), use_cache=True).logits
    assert not torch.allclose(out["q4_0"], out["llama.cpp:q4_0/norot"], atol=1e-4)  # Q in q8_0, stored prompt
    assert not torch.allclose(out["llama.cpp:q4_0"], out["llama.cpp:q4_0/norot"], atol=1e-4)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_fused_kernels_never_take_llama_cpp_sides(backend):
    """Whatever the backend, a llama.cpp layer is read by kvviz.ggml_attention: decode steps are not staged for
    the fused CPU step and give the torch reference's logits exactly."""
    from kvviz.attention import use_backend
    from kvviz.cache import QuantizedKVCache

    model = _tiny("qwen3")
    ids = torch.tensor([[(5 * i) % 250 + 3 for i in range(10)]])
    logits = {}
    for name in (backend, "torch"):
        cache = QuantizedKVCache(model.config, "llama.cpp:q8_0")
        with use_backend(name), torch.no_grad():
            model(input_ids=ids[:, :9], cache=cache, use_cache=True)
            logits[name] = model(input_ids=ids[:, 9:], cache=cache, use_cache=True).logits
        assert all(getattr(layer, "_pending", None) is None for layer in cache.layers)
        assert cache.layers[0].layout is not None and cache.layers[0].layout.k_type == "q8_0"
    assert torch.equal(logits[backend], logits["torch"])


@pytest.mark.parametrize("arch", ["llama", "falcon_h1"])
def test_generation_through_a_llama_cpp_cache_runs(arch):
    """model.generate with a QuantizedKVCache of a llama.cpp name: prefill and decode, on a dense model and on a
    hybrid (Mamba beside attention) one; the cache holds what llama.cpp's q4_0 blocks hold."""
    from kvviz.cache import QuantizedKVCache

    model = _tiny(arch)
    ids = torch.tensor([[(3 * i) % 250 + 3 for i in range(9)]])
    cache = QuantizedKVCache(model.config, "llama.cpp:q4_0")
    out = model.generate(ids, cache=cache, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 14) and cache.get_seq_length() == 13
    kv = model.config.num_key_value_heads
    held = [layer for layer in cache.layers if getattr(layer, "layout", None) is not None]
    assert held and all(layer.nbytes() == 2 * kv * 13 * 64 // 32 * 18 for layer in held)  # q4_0: 18 B / 32


def test_llama_cpp_names_keep_no_full_precision_window():
    from kvviz.cache import QuantizedKVCache

    model = _tiny("llama")
    with pytest.raises(ValueError, match="no full-precision window"):
        QuantizedKVCache(model.config, "llama.cpp:q4_0", residual=8)


def test_a_left_padded_batch_reads_as_its_rows_alone():
    """Padding positions attend to nothing: their rows stay finite (dtype min, not -inf), so the padded row
    generates what it generates alone."""
    from kvviz.cache import QuantizedKVCache

    model = _tiny("llama")
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]])
    out = model.generate(ids, attention_mask=(ids != 0).long(), cache=QuantizedKVCache(model.config, "llama.cpp:q4_0"),
                         max_new_tokens=4, do_sample=False, pad_token_id=0)
    alone = model.generate(ids[:1, 3:], cache=QuantizedKVCache(model.config, "llama.cpp:q4_0"), max_new_tokens=4,
                           do_sample=False, pad_token_id=0)
    assert out[0, 7:].tolist() == alone[0, 4:].tolist()
