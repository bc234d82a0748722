"""Teacher-forced rows: many KV specs or per-layer plans run over one token window as rows of one batch, and their
KL divergence against the exact model, with every position reading the quantized cache, as in an engine.

How a window of T tokens runs (`row_hidden`): each row holds its own spec or plan (kvviz.cache.row_stack.RowStackCache).
The first `first_chunk` tokens (default 1) go in alone: a cache's first update hands attention the raw K/V, so
keeping that chunk to one token means every later position reads quantized K/V, as llama.cpp does (it quantizes
the prompt's K/V before attention reads them; so does vLLM's CPU build, whose prefill reads its fp8 cache). The rest
goes through in chunks of `chunk` tokens (default: all at once): each chunk's queries read the quantized history
and their own tokens as the cache stores them (it quantizes on append, before attention reads), so for per-token
formats the chunk size does not change the result; for per-channel (KIVI) formats a group's scales may see later
tokens of the same chunk.

Rows share work as a prefix tree. A decoder layer's output depends only on its input and on what its own cache
layer stores, so two plans that store the same formats in layers 0..j compute the same hidden states through layer
j: they run as ONE row up to there and fork where their plans first differ. Layer j's batch holds one row per
distinct prefix of the plans (formats of layers 0..j); a pre-hook on each decoder layer gathers its input rows from
the previous layer's output (`index_select` by parent). For per-layer sensitivity ("only layer i quantized", plus
the exact row) layer j runs 2j + 3 rows instead of 2L + 1: the variants of layer i start from the exact run's
layer-i input, as the plain definition computes it, with about half the decoder work. The model's own forward builds
the masks, positions and rotary tables (batch 1, broadcast over the rows); nothing of a decoder is re-implemented.

Scoring (`row_values`): positions `score_from`..T-2 (logits at t predict token t+1), each row's logits formed from
its final hidden states one row at a time (memory stays at one [N, vocab]), compared with the exact row's
log-probs (kvviz.metrics.Baseline, computed once per window, or a saved one; for the KL alone through a linear
head, `Baseline.kl_linear`, its buffers kept from row to row).

    plans = [as_plan("int4"), as_plan("int4; 0=fp16")]
    hidden = row_hidden(model, ids, [None, *plans])      # [3, T, hidden]
    values, base = row_values(model, ids, plans)          # per-position (kld, nll, nll_base, top)
"""

from __future__ import annotations

import torch

from kvviz.cache import model_layer_types
from kvviz.cache.row_stack import RowStackCache
from kvviz.formats import spec_key
from kvviz.metrics import Baseline, log_probs
from kvviz.rowstable import row_stable

HEAD_ROWS = 4  # candidates whose KL shares each product of a linear LM head (Baseline.kl_linear)


def decoder(model):
    """The decoder body of a causal LM (hidden states out, no LM head). transformers' get_decoder() returns the
    causal LM itself for some (Llama 4's Llama4ForCausalLM); its `model` is the body then."""
    body = model.get_decoder()
    return model.model if body is model and hasattr(model, "model") else body


def lm_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The causal LM head on decoder hidden states [T, hidden] -> logits [T, vocab] (the model's dtype), with
    Gemma's final logit softcapping where the config has it."""
    logits = model.get_output_embeddings()(hidden)
    cap = getattr(model.config.get_text_config(decoder=True), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def lm_logprobs(model, hidden: torch.Tensor) -> torch.Tensor:
    """[T, hidden] -> float64 log-softmax [T, vocab]."""
    return log_probs(lm_logits(model, hidden))


def linear_head(model) -> torch.Tensor | None:
    """The LM head's weight [vocab, hidden] when the head is one linear map z = W h (no bias, no softcapping), so
    that a candidate's sum P z is (P W) . h (kvviz.metrics.Baseline.p_z); None for other heads."""
    head = model.get_output_embeddings()
    if getattr(model.config.get_text_config(decoder=True), "final_logit_softcapping", None) or \
            not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None
    return head.weight


def _prefix_tree(plans: list[list]) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """The rows of every layer for plans (one KVSpec or None per layer each) run as a prefix tree.

    Returns (owners, parents, leaves): owners[j][r], the plan whose layer j row r stores (the first plan with that
    prefix); parents[j][r], the row of layer j - 1 whose output row r of layer j reads (layer 0: row 0 of the
    batch-1 input); leaves[p], plan p's row in the last layer's output."""
    owners, parents = [], []
    row_of = [0] * len(plans)  # each plan's row in the previous layer (layer -1: the input, one row)
    for j in range(len(plans[0])):
        index: dict = {}
        owner, parent = [], []
        for p, plan in enumerate(plans):
            node = (row_of[p], spec_key(plan[j]))
            if node not in index:
                index[node] = len(owner)
                owner.append(p)
                parent.append(row_of[p])
            row_of[p] = index[node]
        owners.append(owner)
        parents.append(parent)
    return owners, parents, row_of


def _forkable_layers(model) -> list | None:
    """The decoder layers rows can fork between, or None where they cannot: no `layers` list on the decoder, or
    layers that read another layer's K/V (Gemma 4's KV sharing: producer and consumer must hold the same rows)."""
    text = model.config.get_text_config(decoder=True)
    layers = getattr(decoder(model), "layers", None)
    if layers is None or len(layers) < text.num_hidden_layers or getattr(text, "num_kv_shared_layers", 0):
        return None
    return list(layers[: text.num_hidden_layers])


def _runs(parent: list[int]) -> list[tuple[int, int]]:
    """parent as runs of consecutive rows [(first row, count)]: [0, 1, 2, 0, 3, 4, 0] -> [(0, 3), (0, 1), (3, 2),
    (0, 1)]. A layer's rows are mostly its parents' in order, with a few forks between them."""
    runs: list[tuple[int, int]] = []
    for r in parent:
        if runs and runs[-1][0] + runs[-1][1] == r:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((r, 1))
    return runs


def _forking_hook(parent: list[int]):
    """A decoder-layer pre-hook that replaces the hidden states [R_prev, t, hidden] with the rows `parent` picks,
    copied a run of consecutive rows at a time (index_select copies a CPU tensor element by element, several
    times slower than slices; a layer that only continues its parents' rows gets them as they are)."""
    runs = _runs(parent)

    def gather(x: torch.Tensor) -> torch.Tensor:  # [R_prev, t, hidden] -> [len(parent), t, hidden]
        if runs == [(0, x.shape[0])]:
            return x
        return torch.cat([x[a : a + n] for a, n in runs])

    def hook(module, args, kwargs):
        if args:
            return (gather(args[0]), *args[1:]), kwargs
        kwargs["hidden_states"] = gather(kwargs["hidden_states"])
        return args, kwargs

    return hook


@torch.no_grad()
def row_hidden(model, ids: torch.Tensor, rows: list, first_chunk: int = 1, chunk: int | None = None,
               scales: dict | None = None) -> torch.Tensor:
    """Final hidden states [rows, T, hidden] of the same tokens ids [1, T], row r holding rows[r] (a kvviz.Plan, its
    None layers exact, or None: an exact row), fed in chunks and run as a prefix tree (see the module docstring)."""
    n, t = len(rows), ids.shape[1]
    if not 1 <= first_chunk < t:
        raise ValueError(f"first_chunk must be in 1..{t - 1} for a window of {t} tokens; got {first_chunk}.")
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    types = model_layer_types(model.config)  # the engine's layer rules apply as the model's caches apply them
    plans = [(None,) * n_layers if r is None else r.resolve(n_layers, types) for r in rows]
    specs = [None if all(kv is None for kv in p) else r for r, p in zip(rows, plans)]
    layers = _forkable_layers(model)
    step = chunk or t
    bounds = [0, first_chunk] + list(range(first_chunk + step, t, step)) + [t]
    body = decoder(model)
    if layers is None:  # one row per plan in every layer, the batch fed as is
        stack = RowStackCache(model.config, specs, scales=scales)
        with row_stable(model):
            return torch.cat([body(input_ids=ids[:, a:b].expand(n, -1), cache=stack, use_cache=True).last_hidden_state
                              for a, b in zip(bounds[:-1], bounds[1:]) if b > a], dim=1)  # [rows, T, hidden]
    owners, parents, leaves = _prefix_tree(plans)
    stack = RowStackCache(model.config, specs, scales=scales, layer_rows=owners)
    hooks = [layer.register_forward_pre_hook(_forking_hook(parent), with_kwargs=True)
             for layer, parent in zip(layers, parents)]
    try:
        with row_stable(model):
            hidden = [body(input_ids=ids[:, a:b], cache=stack, use_cache=True).last_hidden_state
                      for a, b in zip(bounds[:-1], bounds[1:]) if b > a]  # each [last layer's rows, t_chunk, hidden]
    finally:
        for h in hooks:
            h.remove()
    return torch.cat(hidden, dim=1).index_select(0, torch.tensor(leaves, device=ids.device))  # [rows, T, hidden]


def check_score_from(score_from: int, t: int) -> None:
    if not 1 <= score_from <= t - 2:
        raise ValueError(f"score_from must be in 1..{t - 2} for a window of {t} tokens (position 0 reads no "
                         f"cache); got {score_from}.")


@torch.no_grad()
def row_values(model, ids: torch.Tensor, rows: list, first_chunk: int = 1, chunk: int | None = None,
               score_from: int = 1, base: torch.Tensor | Baseline | None = None, scales: dict | None = None,
               kl_only: bool = False):
    """Per-position KL values of every row against the exact model on one window ids [1, T].

    rows: one kvviz.Plan per candidate (its None layers exact).
    scales: static scales for every row ({layer: (k_scale, v_scale)}), or a list of such dicts (or None), one per
    row (kvviz.cache.RowStackCache).
    base: the exact model's log-probs [N, vocab] at the scored positions, when already known (saved), or the
    Baseline an earlier call on the same window returned (what it formed from them is reused); else an exact row
    runs in the same batch (sharing its layers with every row whose first layers are exact).
    Returns (values, baseline): values[r] = (kld, nll, nll_base, same_top), each [N] with N = T - 1 - score_from
    (as kvviz.metrics.per_position gives them), or with kl_only the kld [N] alone; and the kvviz.metrics.Baseline
    (its `lp`: the base log-probs [N, vocab]) to pass back as `base`.
    """
    t = ids.shape[1]
    check_score_from(score_from, t)
    run = rows if base is not None else [None] + list(rows)
    if isinstance(scales, list) and base is None:  # one dict per row: none for the exact row
        scales = [None, *scales]
    hidden = row_hidden(model, ids, run, first_chunk, chunk, scales)[:, score_from : t - 1]  # [R, N, hidden]
    targets = ids[0, score_from + 1 :]  # [N]
    if base is None:
        with row_stable(model):  # a linear head through the products every candidate's KL takes (HeadChunks)
            base = lm_logprobs(model, hidden[0])
        hidden = hidden[1:]
    lp = base.lp if isinstance(base, Baseline) else base
    if lp.shape[0] != targets.shape[0]:
        raise ValueError(f"The saved baseline has {lp.shape[0]} positions per window; this run scores "
                         f"{targets.shape[0]}. Use the window settings it was saved with.")
    ref = base if isinstance(base, Baseline) else Baseline(base, targets)
    if kl_only:  # the vocabulary read in the model's dtype, sum P z from the hidden states where the head allows
        weight = linear_head(model)
        if weight is None:
            return [ref.kl(lm_logits(model, h)) for h in hidden], ref
        stacks = [ref.kl_linear(weight, hidden[i : i + HEAD_ROWS]) for i in range(0, len(hidden), HEAD_ROWS)]
        return [kl for stack in stacks for kl in stack], ref
    return [ref.values(lm_logits(model, h)) for h in hidden], ref
