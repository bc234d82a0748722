"""kvviz.rowstable: row-stable linear layers (a row's output does not depend on the rows beside it), and the plans'
numbers they make independent of the plans batched beside them."""

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kvviz import quality, rowstable
from kvviz.analysis.teacher_forced import row_values
from kvviz.formats import as_plan
from kvviz.attention import grouped_decode, kvviz_attention_forward
from kvviz.rowstable import HeadChunks
from kvviz.tiny import tiny_model

pytestmark = pytest.mark.skipif(not rowstable.available(), reason="this torch build has no oneDNN")


def _layer(out_features: int, in_features: int, bias: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(in_features, out_features, bias=bias))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(64, 64), (576, 1536), (1536, 576), (4096, 576)])
def test_a_row_is_the_same_bits_whatever_shares_the_call(shape, bias):
    model = _layer(*shape, bias=bias)
    x = torch.randn(300, shape[1], generator=torch.Generator().manual_seed(1))
    with rowstable.row_stable(model):
        ref = model(x[:1])  # [1, out]
        for rows in (2, 3, 4, 5, 13, 64, 300):
            torch.testing.assert_close(model(x[:rows])[:1], ref, rtol=0, atol=0, msg=f"{rows} rows")
        batched = model(x[:6].reshape(2, 3, -1))  # [2, 3, out]: leading dimensions kept
    assert batched.shape == (2, 3, shape[0])
    torch.testing.assert_close(batched.reshape(6, -1)[:1], ref, rtol=0, atol=0)
    # another float32 rounding of the same product
    torch.testing.assert_close(ref, F.linear(x[:1], model[0].weight, model[0].bias), rtol=1e-5, atol=1e-5)


def test_outside_the_block_and_on_other_threads_the_layer_is_f_linear():
    model = _layer(576, 1536)
    w = model[0].weight
    x = torch.randn(2, 1536, generator=torch.Generator().manual_seed(2))
    with rowstable.row_stable(model):
        stable = model(x)
        seen = {}
        worker = threading.Thread(target=lambda: seen.setdefault("y", model(x)))
        worker.start()
        worker.join()
        with rowstable.row_stable(model, enabled=False):
            plain_inside = model(x)
    assert not torch.equal(stable, F.linear(x, w)), "the shape must round apart, or this test checks nothing"
    for y in (model(x), seen["y"], plain_inside):
        assert torch.equal(y, F.linear(x, w))


def test_a_changed_weight_is_packed_again():
    model = _layer(64, 64)
    x = torch.randn(3, 64)
    with rowstable.row_stable(model):
        before = model(x)
        with torch.no_grad():
            model[0].weight.mul_(2)
        after = model(x)
    torch.testing.assert_close(after, 2 * before, rtol=1e-6, atol=1e-6)


SIDE = ["k8v4", "fp8_e4m3", "int4; 0=fp16", "k4v8", "int8"]


def test_a_plans_kl_does_not_depend_on_the_plans_beside_it():
    # Before row_stable, int4's KL moved by ~3e-8 here (MKL rounds a 1-row call apart from a 6-row one, where the
    # plans fork at the window's first token); on SmolLM2 a plan's mean KL moved in the second significant digit.
    model, _ = tiny_model("llama")
    ids = torch.randint(0, model.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(0))
    alone = row_values(model, ids, [as_plan("int4")], kl_only=True)[0][0]
    beside = row_values(model, ids, [as_plan("int4"), *map(as_plan, SIDE)], kl_only=True)[0][0]
    assert torch.equal(alone, beside)


def test_a_formats_compare_row_does_not_depend_on_the_formats_beside_it():
    model, tok = tiny_model("llama")
    prompt = "The quick brown fox jumps over the lazy dog. " * 3
    alone = quality.compare(model, tok, prompt, ["int4"], max_new_tokens=12).formats[0]
    beside = quality.compare(model, tok, prompt, ["int4", *SIDE], max_new_tokens=12).formats[0]
    assert alone.token_ids == beside.token_ids
    assert (alone.kl == beside.kl).all() and (alone.top1 == beside.top1).all()


@pytest.mark.parametrize("t", [40, 1100])  # at 1,100 tokens SDPA splits a small batch's history over threads
def test_decode_attention_runs_each_row_as_alone_inside_the_block(t):
    model, _ = tiny_model("llama")
    module = model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(6, 4, 1, 16, generator=gen)  # [B, Hq, 1, D]
    k, v = torch.randn(2, 6, 2, t, 16, generator=gen)  # [B, Hkv, T, D] each
    mask = torch.rand(6, 1, 1, t, generator=gen) > 0.2  # [B, 1, 1, T], True = attend
    with rowstable.row_stable(model):
        batched = kvviz_attention_forward(module, q, k, v, mask)[0]  # [B, 1, Hq, D]
        for b in range(6):
            alone = kvviz_attention_forward(module, q[b : b + 1], k[b : b + 1], v[b : b + 1], mask[b : b + 1])[0]
            torch.testing.assert_close(batched[b : b + 1], alone, rtol=0, atol=0)
    sdpa = kvviz_attention_forward(module, q, k, v, mask)[0]  # outside: transformers' SDPA path
    torch.testing.assert_close(batched, sdpa, rtol=1e-5, atol=1e-6)


def test_grouped_decode_is_attention():
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(3, 8, 1, 32, generator=gen, dtype=torch.float64)  # [B, Hq, 1, D], 4 query heads per KV head
    k = torch.randn(3, 2, 50, 32, generator=gen, dtype=torch.float64)
    v = torch.randn(3, 2, 50, 24, generator=gen, dtype=torch.float64)  # Dv != Dk
    mask = torch.rand(3, 1, 1, 50, generator=gen) > 0.3
    additive = torch.zeros(3, 1, 1, 50, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=mask,
                                         scale=0.3).transpose(1, 2)  # [B, 1, Hq, Dv]
    for m in (mask, additive):
        torch.testing.assert_close(grouped_decode(q, k, v, m, 0.3), ref, rtol=1e-12, atol=1e-12)


def test_calls_run_as_a_few_row_counts():
    """oneDNN builds a kernel per row count: above 64 rows a call is padded to one of 8 counts per octave, never
    more than 1/8 over; a row's result is the same bits padded or not (row-stable)."""
    counts = [rowstable._bucket(m) for m in range(1, 8193)]
    assert counts[0] == 2 and counts[1:64] == list(range(2, 65))
    assert all(b >= m and (m <= 64 or b <= m * 9 / 8) for m, b in enumerate(counts, start=1))
    assert counts == sorted(counts) and len(set(counts[64:])) <= 8 * 7
    layer = _layer(48, 16)
    x = torch.randn(300, 16)
    with rowstable.row_stable(layer):
        whole = layer(x)  # 300 rows run as 320
        for m in (65, 100, 257):
            assert rowstable._bucket(m) != m
            assert torch.equal(layer(x[:m]), whole[:m])


def test_a_vocabulary_head_runs_through_the_shared_head_chunks():
    """A layer as wide as a vocabulary is not packed whole: it runs through HeadChunks.of (one packed copy of the
    head, the same products as Baseline.kl_linear's), each row the same bits for any row count."""
    head = torch.nn.Sequential(torch.nn.Linear(64, HeadChunks.WIDE + 7, bias=False))
    x = torch.randn(5, 64)
    with rowstable.row_stable(head):
        out = head(x)
        alone = [head(x[r : r + 1]) for r in range(5)]
    assert not hasattr(head[0], "_kvviz_packed")
    want = torch.cat([z for _, z in HeadChunks.of(head[0].weight).logits(x)], dim=1)
    assert torch.equal(out, want)
    for r in range(5):
        assert torch.equal(alone[r], out[r : r + 1])
    torch.testing.assert_close(out, F.linear(x, head[0].weight), rtol=1e-5, atol=1e-5)


def test_one_model_at_a_time_keeps_its_packed_weights():
    first, second = _layer(64, 64), _layer(32, 64)
    x = torch.randn(3, 64)
    with rowstable.row_stable(first):
        first(x)
    assert hasattr(first[0], "_kvviz_packed")
    with rowstable.row_stable(second):
        second(x)
    assert hasattr(second[0], "_kvviz_packed") and not hasattr(first[0], "_kvviz_packed")
    with rowstable.row_stable(first):  # packed again on its next use, the same bits
        again = first(x)
    torch.testing.assert_close(again, F.linear(x, first[0].weight), rtol=1e-5, atol=1e-5)
