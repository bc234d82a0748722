"""The format-family registry: a toy family registered in a temporary registry reaches every view that asks the
registry (the UI's choices, the parser, byte accounting, the memory model, the exporter); docs/formats.md's table is
the registry's; the built-in families' choices are what the UI offered before the registry."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvviz import export, memory
from kvviz.formats import get_format, parse_kv, parse_spec
from kvviz.formats.family import REGISTRY, VIEWS, BaseInfo, Family, register
from kvviz.formats.kv import format_table
from kvviz.formats.spec import BASES, kvviz_bases

from toy_family import TOY, toy_format

ROOT = Path(__file__).resolve().parent.parent


def test_toy_family_reaches_choices_parser_and_bytes():
    assert "toy3" not in REGISTRY.choices("compare")
    with toy_format() as fmt:
        assert fmt.kind == "toy" and fmt.family is TOY and fmt.bits == 3
        assert REGISTRY.choices("compare")[-1] == "toy3"  # after the built-in choices
        assert "toy3" in REGISTRY.choices("memory") and "toy3" not in REGISTRY.choices("export")
        assert "toy3" in kvviz_bases() and BASES["toy3"].kind == "toy"
        # bytes: 3 bits per value and one fp16 scale per token and head
        assert fmt.bits_per_value(64) == 3 + 16 / 64
        x = torch.randn(1, 2, 5, 64)
        q = fmt.quantize(x)
        assert q.nbytes == fmt.nbytes_for(x.shape) == 2 * 5 * (64 * 3 // 8 + 2)
        err = (fmt.dequantize(q) - x).abs().amax()
        assert 0 < float(err) <= float(x.abs().amax()) / 3  # half a step of amax / 3, at most
        layout = fmt.layout(64)
        assert (layout.elem, layout.bits, layout.per_unit, layout.unit_bytes) == ("int", 3, 8, 3)
    # gone with its temporary registry: the parser and the choices forget it
    assert "toy3" not in REGISTRY.choices("compare") and "toy3" not in BASES
    with pytest.raises(ValueError, match="Unknown KV format 'toy3'"):
        get_format("toy3")


def test_toy_family_in_the_memory_model():
    with toy_format() as fmt:
        toy = memory.kv_cache_bytes(2, 4, 64, 1000, k="toy3")
        fp16 = memory.kv_cache_bytes(2, 4, 64, 1000, k="fp16")
        assert toy == 2 * 2 * 4 * 1000 * fmt.bits_per_value(64) * 64 // 8
        assert toy < fp16 / 4


def test_toy_family_in_the_exporter_no_engine_stores_it():
    with toy_format():
        rows = export.export_commands("toy3")
        for engine, row in rows.items():
            assert not row["supported"] and row["kv_cache_dtype"] is None and not row["cli"], engine
        assert "vLLM has no toy3 KV cache dtype" in rows["vllm"]["note"]
        assert "llama.cpp has no toy3 KV cache type" in rows["llama.cpp"]["note"]


def test_a_base_has_one_family():
    with REGISTRY.temporary():
        clash = Family(name="clash", bases={"int4": BaseInfo("clash", 4, "token", ("token",))}, codec=None)
        with pytest.raises(ValueError, match="belong to another family"):
            register(clash)
        with pytest.raises(ValueError, match="registered already"):
            register(Family(name="int", bases={}, codec=None))
    assert REGISTRY.of_base("int4").name == "int"


def test_every_base_belongs_to_its_family_and_parses():
    for family in REGISTRY.families():
        for name, info in family.bases.items():
            assert info.kind == family.name and REGISTRY.of_base(name) is family
            if info.engine is None:
                assert parse_spec(name).base == name


def test_docs_format_table_is_the_registry():
    page = (ROOT / "docs" / "formats.md").read_text().splitlines()
    start = next(i for i, line in enumerate(page) if line.startswith("| base | elements |"))
    end = next(i for i in range(start, len(page)) if not page[i].startswith("|"))
    assert "\n".join(page[start:end]) == format_table(), (
        "docs/formats.md's format table differs from the registry: paste kvviz.formats.kv.format_table()")


BEFORE = {  # the UI's hand-copied lists before the registry, in their order
    "compare": ["fp8_e4m3", "fp8_e5m2", "int8", "k8v4", "k4v8", "int4", "kivi4", "kivi2", "mxfp4", "nvfp4",
                "k=q8_0,v=q4_0", "vllm:int4_per_token_head", "vllm:turboquant_4bit_nc", "vllm:ultraquant_4bit",
                "llama.cpp:q8_0"],
    "errors": ["int8", "int4", "int2", "fp8_e4m3", "fp8_e5m2", "mxfp4", "nvfp4", "int4/channel/g32/asym", "int4/rot",
               "k8v4", "k4v8", "kivi2", "q8_0", "q4_0", "iq4_nl"],
    "export": ["fp8_e4m3", "fp8_e5m2", "fp16", "bf16", "int8", "fp8_e4m3/token", "k8v4", "kivi4", "mxfp4",
               "fp4_mx_block16", "nvfp4", "q8_0", "k=q8_0,v=q4_0", "vllm:turboquant_4bit_nc",
               "vllm:int4_per_token_head", "vllm:ultraquant_4bit", "vllm:fp8_ds_mla", "llama.cpp:k=q8_0,v=q4_0"],
    "export_support": ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3/token", "int8", "int4", "k8v4", "kivi2",
                       "mxfp4", "fp4_mx_block16", "nvfp4", "q8_0", "q4_0", "k=q8_0,v=q4_0"],
    "fused": ["int8", "k8v4", "int4", "fp8_e4m3", "mxfp4", "nvfp4", "kivi4"],
    "memory": ["fp16", "fp8_e4m3", "k8v4", "int4", "kivi2", "mxfp4", "nvfp4", "int4/g16", "int2", "q8_0", "q4_0",
               "vllm:turboquant_4bit_nc", "vllm:int4_per_token_head", "vllm:ultraquant_4bit", "vllm:fp8_ds_mla",
               "vllm:nvfp4_ds_mla", "llama.cpp:q4_0"],
    "sensitivity": ["int4", "int2", "int4/tensor", "int8", "fp8_e4m3", "fp8_e5m2", "k8v4", "kivi2", "mxfp4", "nvfp4",
                    "q4_0", "int4/rot", "vllm:int4_per_token_head", "vllm:turboquant_4bit_nc",
                    "vllm:ultraquant_4bit"],
    "candidates": ["int2", "int4", "k8v4", "int8", "fp8_e4m3", "fp16", "vllm:int4_per_token_head",
                   "vllm:turboquant_3bit_nc", "vllm:fp8", "llama.cpp:q4_0", "llama.cpp:q8_0"],
    "rotation": ["int4", "int4/rot", "vllm:int4_per_token_head", "vllm:turboquant_4bit_nc", "tq_mse4", "tq_prod4"],
}


@pytest.mark.parametrize("view", VIEWS)
def test_views_offer_what_they_offered(view):
    assert REGISTRY.choices(view) == BEFORE[view]
    for spec in BEFORE[view]:  # each choice is declared by the family of its K side
        assert any(c.spec == spec for c in parse_kv(spec).k.family.choices), spec


def test_ui_defaults_are_choices():
    from kvviz.ui import compare, errors, fused, memory as ui_memory, sensitivity

    for view, defaults in (("compare", compare.DEFAULT_SPECS), ("errors", errors.DEFAULT_FORMATS),
                           ("fused", fused.DEFAULT_SPECS), ("memory", ui_memory.DEFAULT_FORMATS),
                           ("candidates", sensitivity.DEFAULT_CANDIDATES)):
        assert set(defaults) <= set(REGISTRY.choices(view)), view


def test_nvfp4_global_scale_is_a_parameter_of_the_cache():
    """The cache fits NVFP4's global scale on its first states and passes it to every quantize: what it stores is
    fmt.quantize(x, scale=fmt.fit_scale(prefill)), token by token, and the scale stays."""
    from kvviz.cache import QuantizedKVLayer

    fmt = get_format("nvfp4")
    layer = QuantizedKVLayer(fmt, fmt)
    x = torch.randn(1, 2, 30, 64)
    x[:, :, 20:] *= 4  # louder tokens after the prefill saturate under its scale
    layer.update(x[:, :, :10], x[:, :, :10])
    for t in range(10, 30):
        layer.update(x[:, :, t : t + 1], x[:, :, t : t + 1])
    g = fmt.fit_scale(x[:, :, :10])
    assert torch.equal(layer.k.static, g) and torch.equal(g, x[:, :, :10].abs().amax() / (448.0 * 6.0))
    assert torch.equal(layer.k.packed().dequantize(), fmt.roundtrip(x, scale=g))
    assert not torch.equal(fmt.roundtrip(x), fmt.roundtrip(x, scale=g))  # the fitted scale is what differs
    # an all-zero prefill fits a global scale of 0: every later value stays 0, as the cache always did
    zero = QuantizedKVLayer(fmt, fmt)
    zero.update(torch.zeros(1, 2, 4, 64), torch.zeros(1, 2, 4, 64))
    zero.update(x[:, :, :1], x[:, :, :1])
    assert float(zero.k.static) == 0.0 and not zero.k.packed().dequantize().any()
    with pytest.raises(ValueError, match="global scale"):
        fmt.quantize(x, scale=torch.ones(2))
