"""vLLM's DeepSeek MLA latent records (kvviz/formats/ds_mla.py, `vllm:fp8_ds_mla`, `vllm:nvfp4_ds_mla`): codes and
scales of hand-checked tiles, error bounds, vLLM's 656 / 352 bytes per token in the memory model, the MLA cache path
on a tiny DeepSeek-V3, and vLLM's rules on which dtypes an MLA model takes.

    python -m pytest tests/test_formats_ds_mla.py -q
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

import kvviz
from kvviz import QuantizedKVCache, parse_kv
from kvviz.formats.packing import unpack
from kvviz.memory import kv_cache_bytes_for
from kvviz.tiny import ByteTokenizer, tiny_config

FP8 = parse_kv("vllm:fp8_ds_mla")
NVFP4 = parse_kv("vllm:nvfp4_ds_mla")


def _tile(*values: float, d: int) -> torch.Tensor:
    x = torch.zeros(1, 1, 1, d)
    x[..., : len(values)] = torch.tensor(values)
    return x


# ------------------------------------------------------------------------------------------ fp8_ds_mla

def test_fp8_scale_is_the_power_of_two_at_or_above_amax_over_448():
    """amax 56: 56 / 448 = 2**-3 exactly, the values fill E4M3's range (56 -> 448, 1 -> 8); amax 57 rounds the
    scale up to 2**-2 (57 / 0.25 = 228 -> E4M3 224); a tile of tiny values takes the floor 1e-4, rounded up to
    2**-13."""
    tiles = [_tile(56.0, 1.0, d=128), _tile(57.0, -1.0, d=128), torch.full((1, 1, 1, 128), 1e-3)]
    q = FP8.k.quantize(torch.cat(tiles, dim=-1))
    assert q.scale.tolist() == [[[[0.125, 0.25, 2.0**-13]]]]
    assert q.data.float()[0, 0, 0, [0, 1, 128, 129]].tolist() == [448.0, 8.0, 224.0, -4.0]
    assert q.data.float()[0, 0, 0, 256].item() == 8.0  # 1e-3 / 2**-13 = 8.19 -> E4M3 8
    assert q.data.dtype == torch.float8_e4m3fn and q.scale.dtype == torch.float32


def test_fp8_round_trip_error_bound():
    """E4M3 keeps 3 mantissa bits: each value within half its step, at most 16 scale units (the step is 32 between
    256 and 448); Gaussian latents come back within 3% (relative error)."""
    x = torch.randn(2, 1, 30, 512, generator=torch.Generator().manual_seed(0))
    q = FP8.k.quantize(x)
    s = q.scale.repeat_interleave(128, -1)
    err = (FP8.k.dequantize(q) - x).abs()
    assert (err <= 16 * s).all() and (err <= x.abs() * 2.0**-4 + 2.0**-9 * s).all()
    assert ((FP8.k.dequantize(q) - x).norm() / x.norm()).item() < 0.03


def test_fp8_rope_part_is_bf16_verbatim():
    assert FP8.v.base == "bf16" and FP8.v.spec == "vllm:fp8_ds_mla"
    x = torch.randn(1, 1, 4, 64).to(torch.bfloat16)
    assert torch.equal(FP8.v.roundtrip(x), x)


# ------------------------------------------------------------------------------------------ nvfp4_ds_mla

def test_nvfp4_scale_and_codes_of_a_hand_checked_block():
    """amax 6: sf = e4m3(1.0); codes are E2M1 of x itself, ties to even (0.25 -> 0, -0.75 -> -1), the sign of -0
    kept. A block of tiny values takes the floor 2**-9 (E4M3's smallest subnormal)."""
    q = NVFP4.k.quantize(torch.cat([_tile(6.0, -0.75, 0.25, -0.0, 2.9, d=16), torch.full((1, 1, 1, 16), 1e-4)], -1))
    assert q.scale.float().tolist() == [[[[1.0, 2.0**-9]]]] and q.scale.dtype == torch.float8_e4m3fn
    assert unpack(q.data, 4)[0, 0, 0, :5].tolist() == [0b0111, 0b1010, 0b0000, 0b1000, 0b0101]  # 6 -1 0 -0 3
    assert unpack(q.data, 4)[0, 0, 0, 16:].tolist() == [0] * 16  # 1e-4 / 2**-9 = 0.05 -> 0


def test_nvfp4_round_trip_error_bound():
    """e2m1 of x / sf, sf >= amax / 6 rounded to E4M3: clipping can cost up to amax - 6 sf (sf rounded down by at
    most 1/16), the grid half a gap (1 sf at the top): every value within 1.4 sf; Gaussian latents within 11%."""
    x = torch.randn(2, 1, 30, 512, generator=torch.Generator().manual_seed(1))
    q = NVFP4.k.quantize(x)
    s = q.scale.float().repeat_interleave(16, -1)
    assert ((NVFP4.k.dequantize(q) - x).abs() <= 1.4 * s).all()
    assert ((NVFP4.k.dequantize(q) - x).norm() / x.norm()).item() < 0.11
    assert NVFP4.v.base == "fp8_e4m3" and NVFP4.v.scale_source == "unit"  # RoPE: an unscaled E4M3 cast


# ------------------------------------------------------------------------------------------ bytes

@pytest.mark.parametrize("spec,record", [("vllm:fp8_ds_mla", 656), ("vllm:nvfp4_ds_mla", 352)])
def test_bytes_per_token_equal_vllms_record(spec, record):
    """mla_attention.py state_content_bytes: 656 / 352 B per token and layer at DeepSeek's 512 + 64, in both layouts
    of the memory model (nvfp4_ds_mla's RoPE cast also holds vLLM's per-layer fp32 k_scale of 1.0: 4 B a layer)."""
    static = 4 if spec == "vllm:nvfp4_ds_mla" else 0
    for layout in ("engine", "transformers"):
        assert kv_cache_bytes_for("deepseek-v3", 1000, k=spec, layout=layout) == 61 * (1000 * record + static)
    kv = parse_kv(spec)
    assert kv.k.nbytes_for((1, 1, 1, 512)) + kv.v.nbytes_for((1, 1, 1, 64)) - static == record


def test_the_latent_must_fill_whole_tiles():
    with pytest.raises(ValueError, match="tiles of 128"):
        FP8.k.quantize(torch.randn(1, 1, 2, 32))


# ------------------------------------------------------------------------------------------ vLLM's model rules

def test_ds_mla_dtypes_are_refused_on_a_model_without_mla():
    for where in (lambda s: QuantizedKVCache(tiny_config("llama"), s),
                  lambda s: kv_cache_bytes_for("smollm2-135m", 8, k=s)):
        for spec in ("vllm:fp8_ds_mla", "vllm:nvfp4_ds_mla"):
            with pytest.raises(ValueError, match="MLA models only.*vllm:fp8 or vllm:nvfp4"):
                where(spec)


@pytest.mark.parametrize("spec,why", [("vllm:nvfp4", "validate_nvfp4_kv_cache_with_mla"),
                                      ("vllm:int8_per_token_head", "no vLLM MLA attention backend"),
                                      ("vllm:turboquant_4bit_nc", "no vLLM MLA attention backend"),
                                      ("vllm:ultraquant_4bit", "no vLLM MLA attention backend")])
def test_dtypes_no_vllm_mla_backend_takes_are_refused_on_an_mla_model(spec, why):
    for where in (lambda s: QuantizedKVCache(tiny_config("deepseek_v3"), s),
                  lambda s: kv_cache_bytes_for("deepseek-v3", 8, k=s)):
        with pytest.raises(ValueError, match=f"{why}.*vllm:fp8_ds_mla"):
            where(spec)
    QuantizedKVCache(tiny_config("deepseek_v3"), "vllm:fp8")  # what MLA backends take stays accepted


# ------------------------------------------------------------------------------------------ the MLA cache path

def _tiny_deepseek():
    """The tiny DeepSeek-V3 with a latent of 128 (one fp8 tile) and RoPE 16."""
    config = tiny_config("deepseek_v3", kv_lora_rank=128)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=kvviz.attention.ATTN_NAME).eval()
    gen = model.generation_config
    gen.pad_token_id, gen.eos_token_id, gen.bos_token_id = 0, None, None
    return model, ByteTokenizer()


@pytest.mark.parametrize("spec", ("vllm:fp8_ds_mla", "vllm:nvfp4_ds_mla"))
def test_the_mla_cache_holds_the_record_of_the_latent_and_the_rope_key(spec):
    """The prompt's latent and RoPE key, as the cache hands them to the model after the prefill, are the formats'
    round trip of DynamicCache's (the prefill attends to raw states: every layer sees the same inputs); the
    cache holds the record's bytes per token and layer (128 + 4 + 2 * 16 = 164 for fp8, 64 + 8 + 16 for nvfp4,
    plus its 4 B k_scale a layer), as kvviz.memory counts them."""
    model, tok = _tiny_deepseek()
    enc = tok(["The quick brown fox", "Hi"])
    exact, cache = DynamicCache(config=model.config), QuantizedKVCache(model.config, spec)
    with torch.no_grad():
        model(**enc, cache=exact)
        model(**enc, cache=cache)
    kv, n = parse_kv(spec), enc["input_ids"].shape[1]
    for i in range(model.config.num_hidden_layers):
        latent, rope = cache.layers[i].update(torch.zeros(2, 1, 1, 128), torch.zeros(2, 1, 1, 16))
        assert torch.equal(latent[:, :, :n], kv.k.roundtrip(exact.layers[i].keys)), f"layer {i} latent"
        cast = torch.bfloat16 if spec == "vllm:fp8_ds_mla" else torch.float8_e4m3fn  # the RoPE key, unscaled
        assert torch.equal(rope[:, :, :n], exact.layers[i].values.to(cast).float()), f"layer {i} RoPE key"
    record = {"vllm:fp8_ds_mla": 164, "vllm:nvfp4_ds_mla": 88}[spec]
    static = 4 if spec == "vllm:nvfp4_ds_mla" else 0
    layers = model.config.num_hidden_layers
    assert cache.nbytes() == layers * (2 * (n + 1) * record + static)
    assert cache.nbytes() == kv_cache_bytes_for(model.config, n + 1, batch=2, k=spec, layout="transformers")


def test_fp8_ds_mla_generates_deepseeks_greedy_tokens():
    """Per-tile fp8 with power-of-two scales and a bf16 RoPE key keeps the tiny model's greedy tokens (8 new ones,
    two left-padded prompts) exactly as DynamicCache has them."""
    model, tok = _tiny_deepseek()
    enc = tok(["The quick brown fox", "Hi"])
    want = model.generate(**enc, max_new_tokens=8, do_sample=False, cache=DynamicCache(config=model.config))
    got = model.generate(**enc, max_new_tokens=8, do_sample=False, cache=QuantizedKVCache(model.config,
                                                                                           "vllm:fp8_ds_mla"))
    assert torch.equal(got, want)


@pytest.mark.parametrize("spec", ("vllm:fp8_ds_mla", "vllm:nvfp4_ds_mla"))
def test_export_gives_vllms_flag_and_says_mla_only(spec):
    row = kvviz.export_commands(spec)["vllm"]
    assert row["flags"] == f"--kv-cache-dtype {spec[5:]}" and "MLA models only" in row["note"]
