"""kvviz.engines.simulate: kvviz's side of the engine tables, on a tiny random Llama (no download)."""

from __future__ import annotations

import torch

from kvviz.engines import simulate
from kvviz.tiny import tiny_model


def test_chunked_baseline_equals_one_forward():
    model, _ = tiny_model()
    ids = list(range(3, 60))
    got = simulate.logprobs(model, ids, None, chunk=16)  # 1 token, then chunks of 16 through a DynamicCache
    with torch.no_grad():
        want = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), -1).float()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def test_kld_grows_as_the_format_loses_bits():
    model, _ = tiny_model()
    ids = [(7 * i) % 250 + 3 for i in range(80)]
    stats = simulate.kld(["int8", "int4", "int2"], ids, model, chunk=32)
    assert [stats[s]["n"] for s in stats] == [79, 79, 79]
    assert 0 < stats["int8"]["mean"] < stats["int4"]["mean"] < stats["int2"]["mean"]
    assert stats["int4"]["estimate"] == "full vocabulary"
