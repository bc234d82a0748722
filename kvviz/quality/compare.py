"""Side-by-side generation for several KV formats: baseline greedy text, free-running text per format with its
first divergence, and teacher-forced per-step KL(baseline || format) and top-1 agreement.

One prefill (DynamicCache, the prompt attends to its own unquantized K/V as in vLLM) serves every format: its K/V
are copied into each format's cache. Then ONE batched decode loop (kvviz.cache.row_stack.RowStackCache) runs row 0,
the exact baseline (greedy), and per format a teacher-forced row (fed the baseline's tokens) and a free-running row
(fed its own greedy tokens). Until the format first picks a token the baseline did not, its free-running row would
be fed what the teacher-forced row is fed, so it is not run: its tokens are the teacher-forced row's picks, and at
the first divergence the teacher-forced row is copied (packed bytes as they are) into a free-running row beside
it; the two then share one cache of batch 2 (one quantize call per layer and step for both). A format that never
diverges costs one row, not two. Step 0's token comes from the shared prefill, so it is
the same everywhere; KL and top-1 are measured on the decode steps 1..N-1, where the format's cache is read.

A plan holding a `llama.cpp:` name runs as llama.cpp runs it instead, outside the batch (kvviz.analysis.llamacpp:
its cache read by its flash-attention arithmetic, every weight matmul's input rounded to 8 bits, the prompt reading
its own K/V as stored): its free-running text is llama.cpp's greedy continuation from the prompt on (step 0
included), and its KL and top-1 are taken teacher-forced on the baseline's tokens against llama.cpp's own f16-cache
run on them (FormatResult.kl_against), in one batch, as kvviz.quality.kld measures it: the same figures kld gives
for the window prompt + baseline tokens scored from the prompt's length on.

A plan with an eviction (`int4 @ snapkv:0.5`) runs outside the batch too (kvviz.quality.evicted): its own cache,
the prompt prefilled and compressed, then its teacher-forced and free-running rows step beside the batch, their KL
and top-1 read against the batch's baseline row; its decode speed is not timed.

    for update in compare_stream(model, tok, "Once upon a time", ["fp8_e4m3", "k8v4", "int4"], max_new_tokens=32):
        if update.report is None: show(update.texts)      # partial texts per format, each step
    report = compare(model, tok, prompt, specs)           # QualityReport (the stream's last item)
"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np
import torch

from kvviz.analysis import llamacpp
from kvviz.cache import model_layer_types
from kvviz.cache.row_stack import RowStackCache
from kvviz.formats import Plan, as_plans, parse_kv
from kvviz.memory import kv_cache_bytes_for
from kvviz.metrics import kl_top1
from kvviz.quality.decode import decode_speed, prefill
from kvviz.quality.evicted import EvictedRows, no_engine_eviction
from kvviz.quality.report import EXACT, LLAMACPP_METRICS, METRICS_BACKEND, FormatResult, QualityReport, StreamUpdate
from kvviz.rowstable import row_stable_steps


def _encode(tokenizer, prompt) -> torch.Tensor:
    if isinstance(prompt, torch.Tensor):
        return prompt.reshape(1, -1)
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("The prompt must be a non-empty string.")
    return tokenizer(prompt, return_tensors="pt")["input_ids"][:, :]


_FP16 = parse_kv("fp16")  # what engines store unquantized: the 16-bit reference of every byte ratio


def _spec_and_bits(plan: Plan, layer_types: list[str], head_dim: int) -> tuple[str, float]:
    """(canonical spec or plan text, bits per value: a plan's mean over its layers), as a model of `layer_types`
    stores it (the engine's layer rules applied: vLLM's TurboQuant keeps boundary layers in 16 bits)."""
    fitted = plan.fitted(len(layer_types), layer_types)
    if fitted.is_uniform and fitted.evict is None:
        return fitted.default.spec, fitted.default.bits_per_value(head_dim)
    kvs = fitted.resolve(len(layer_types), layer_types)
    return fitted.text, float(np.mean([kv.bits_per_value(head_dim) for kv in kvs]))


def compare_stream(model, tokenizer, prompt, specs: list[str], max_new_tokens: int = 32, scales: dict | None = None,
                   speed_tokens: int = 0, free_running: bool = True) -> Iterator[StreamUpdate]:
    """Generator form of `compare`: one StreamUpdate per generated token, the last one carrying the report.
    Its batch runs row-stable (kvviz.rowstable): each row's numbers are what they would be beside any other rows."""
    return row_stable_steps(model, _steps(model, tokenizer, prompt, specs, max_new_tokens, scales, speed_tokens,
                                          free_running))


@torch.no_grad()
def _steps(model, tokenizer, prompt, specs: list[str], max_new_tokens: int, scales: dict | None, speed_tokens: int,
           free_running: bool) -> Iterator[StreamUpdate]:
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    kvs = as_plans(specs, n_layers)  # checked before any compute
    if max_new_tokens < 2:
        raise ValueError("max_new_tokens must be at least 2 (step 0 comes from the shared prefill).")
    names = [p.name for p in kvs]
    n = len(kvs)
    engine = [j for j in range(n) if llamacpp.runs_llamacpp(kvs[j])]  # run as llama.cpp runs them, unbatched
    for j in engine:
        no_engine_eviction(kvs[j])
    evicts = [j for j in range(n) if kvs[j].evict is not None and j not in engine]  # their own caches, beside
    own = [j for j in range(n) if j not in engine and j not in evicts]
    vec_dot = llamacpp.weight_vec_dot(model) if engine else {}
    ids = _encode(tokenizer, prompt)
    t0 = time.perf_counter()
    dyn, logits0 = prefill(model, ids)
    # rows: 0 baseline, then per format j its teacher-forced row. A format's free-running row is fed the baseline's
    # tokens until its first divergence, so until then it equals the teacher-forced row (same inputs, same cache):
    # it joins the batch only when the format first picks another token, as a copy of the teacher-forced row
    # placed next to it (RowStackCache.select_rows), and the two then share one cache of batch 2.
    stack = RowStackCache(model.config, [None, *(kvs[j] for j in own)], scales=scales)
    stack.load_prefill(dyn)
    rows = [("base", -1)] + [("tf", j) for j in own]  # what each batch row is
    first = int(logits0.argmax(-1))
    base_ids, free_ids = [first], [[first] for _ in range(n)]
    # llama.cpp's rows generate on their own, from the prompt on: its step 0 reads their cache already
    greedy = {j: llamacpp.greedy(model, ids, kvs[j], vec_dot) for j in engine} if free_running else {}
    for j, tokens in greedy.items():
        free_ids[j] = [next(tokens)]
    evicted = {j: EvictedRows(model, ids, kvs[j], scales, free_running) for j in evicts}
    evicted_kl: dict = {j: ([], []) for j in evicts}  # j -> (KL per step, top-1 per step)
    kl_steps, top1_steps = [], []
    decode = lambda row_ids: tokenizer.decode(row_ids, skip_special_tokens=True)  # noqa: E731
    yield StreamUpdate(0, decode(base_ids), {names[j]: decode(free_ids[j]) for j in range(n)})
    tf_rows, fr_row = _row_index(rows, own)
    tf_of = dict(zip(own, tf_rows))
    for step in range(1, max_new_tokens):
        fed = [free_ids[j][-1] if kind == "fr" else base_ids[-1] for kind, j in rows]
        inp = torch.tensor(fed, device=model.device)[:, None]  # [rows, 1]
        logits = model(input_ids=inp, cache=stack, use_cache=True).logits[:, -1].float()  # [rows, vocab]
        kl, top1 = kl_top1(logits[:1], logits[tf_rows])  # the baseline's log-softmax once, for all
        kl_steps.append(kl)
        top1_steps.append(top1)
        for j, ev in evicted.items():
            ev_logits = ev.step(model, base_ids[-1], free_ids[j][-1])  # [rows, vocab]
            ev_kl, ev_top1 = kl_top1(logits[:1], ev_logits[:1])
            evicted_kl[j][0].append(float(ev_kl[0]))
            evicted_kl[j][1].append(float(ev_top1[0]))
            if free_running:
                free_ids[j].append(int(ev_logits[-1].argmax()))
        picks = logits.argmax(-1).tolist()  # every row's greedy token, one call
        base_ids.append(picks[0])
        spawn = []
        for j in own if free_running else []:
            free_ids[j].append(picks[fr_row[j]])
            if fr_row[j] == tf_of[j] and free_ids[j][-1] != base_ids[-1]:
                spawn.append(j)
        for j, tokens in greedy.items():
            free_ids[j].append(next(tokens))
        if spawn:  # each diverging format's teacher-forced row, copied as its free-running row right after it
            index, grown = [], []
            for b, (kind, j) in enumerate(rows):
                index.append(b)
                grown.append((kind, j))
                if kind == "tf" and j in spawn:
                    index.append(b)
                    grown.append(("fr", j))
            stack.select_rows(index)
            rows = grown
            tf_rows, fr_row = _row_index(rows, own)
            tf_of = dict(zip(own, tf_rows))
        yield StreamUpdate(step, decode(base_ids), {names[j]: decode(free_ids[j]) for j in range(n)})
    kl_of = dict(zip(own, torch.stack(kl_steps, dim=1).cpu().numpy()))  # {format: [steps]}
    top1_of = dict(zip(own, torch.stack(top1_steps, dim=1).cpu().numpy()))
    for j, (ev_kl, ev_top1) in evicted_kl.items():
        kl_of[j], top1_of[j] = np.array(ev_kl, dtype=np.float32), np.array(ev_top1, dtype=np.float32)
    if engine:  # teacher-forced on the prompt and the baseline's tokens, scored at the decode steps 1..N-1
        window = torch.cat([ids, torch.tensor([base_ids], dtype=ids.dtype)], dim=1)  # [1, prompt + N]
        runs = llamacpp.values(model, window, [kvs[j] for j in engine], ids.shape[1], vec_dot)
        for j, (kld, _, _, same_top) in zip(engine, runs):
            kl_of[j], top1_of[j] = kld.cpu().numpy(), same_top.cpu().numpy()
    seconds = time.perf_counter() - t0

    keys = stack.attention_layers()[0].keys  # [rows, kv_heads, T, head_dim] of the first layer that holds K/V
    head_dim = keys.shape[-1]
    layer_types = model_layer_types(model.config)
    speeds = {}
    base_speed = None
    if speed_tokens > 0:
        base_speed = decode_speed(model, dyn, None, base_ids[0], speed_tokens)
        speeds = {j: decode_speed(model, dyn, kvs[j], base_ids[0], speed_tokens, scales) for j in range(n)
                  if j not in evicted}
    tokens = ids.shape[1] + max_new_tokens - 1  # tokens held after the last step
    # what a DynamicCache holds for them (sliding layers their window, no state layers): at 16 bits (what engines
    # store), and in the model dtype
    bytes_16bit = kv_cache_bytes_for(model.config, tokens, k=_FP16, layout="transformers")
    baseline_bytes = bytes_16bit * keys.element_size() // 2
    results = []
    for j, kv in enumerate(kvs):
        spec, bits = _spec_and_bits(kv, layer_types, head_dim)
        if free_running:
            diverge = next((i for i, (a, b) in enumerate(zip(base_ids, free_ids[j])) if a != b), None)
        else:
            free_ids[j], diverge = [], None
        if j in engine:  # what its own cache holds for the same tokens
            nbytes = kv_cache_bytes_for(model.config, tokens, k=llamacpp.held(model, kv), layout="transformers")
        elif j in evicted:
            nbytes = evicted[j].nbytes()
        else:
            nbytes = stack.row_nbytes(rows.index(("tf", j)))
        results.append(FormatResult(
            name=names[j], spec=spec, text=decode(free_ids[j]), token_ids=free_ids[j], first_divergence=diverge,
            kl=kl_of[j], top1=top1_of[j], cache_bytes=nbytes, bits_per_value=bits,
            bytes_vs_exact=nbytes / baseline_bytes, bytes_vs_16bit=nbytes / bytes_16bit, tokens_per_s=speeds.get(j),
            plan=kvs[j], kl_against=llamacpp.BASELINE if j in engine else EXACT))
    report = QualityReport(prompt=prompt if isinstance(prompt, str) else "", prompt_tokens=ids.shape[1],
                           baseline_text=decode(base_ids), baseline_ids=base_ids, baseline_bytes=baseline_bytes,
                           baseline_bytes_16bit=bytes_16bit, dtype=str(model.dtype).removeprefix("torch."),
                           baseline_bits=8 * model.dtype.itemsize, formats=results, seconds=seconds,
                           baseline_tokens_per_s=base_speed,
                           metrics_backend=METRICS_BACKEND + (LLAMACPP_METRICS if engine else ""))
    yield StreamUpdate(max_new_tokens - 1, report.baseline_text, {r.name: r.text for r in results}, report)


def _row_index(rows: list[tuple[str, int]], own: list[int]) -> tuple[list[int], dict[int, int]]:
    """Where each format's rows sit in the batch: (its teacher-forced row, per format of `own` in order; its
    free-running row by format, the teacher-forced one until the format has diverged)."""
    tf = [rows.index(("tf", j)) for j in own]
    return tf, {j: rows.index(("fr", j)) if ("fr", j) in rows else b for j, b in zip(own, tf)}


def compare(model, tokenizer, prompt, specs: list[str], max_new_tokens: int = 32, scales: dict | None = None,
            speed_tokens: int = 0, free_running: bool = True) -> QualityReport:
    """Compare KV formats on one prompt (see the module docstring). prompt: a string or token ids [1, T].

    specs: KV specs ("fp8_e4m3", "k=int8,v=int4", "kivi2", ...) or per-layer plans ("int4; 0,27=fp16").
    scales: static scales for per-tensor formats, {layer: (k_scale, v_scale)} (kvviz.calibrate.KVScales.for_cache()).
    speed_tokens > 0 also times that many decode steps of each format's own cache with the active attention
    backend (tokens_per_s).
    free_running=False skips the free-running rows (text "", token_ids [], first_divergence None): metrics only,
    half the rows.
    A plan holding a `llama.cpp:` name runs as llama.cpp runs it, its KL against llama.cpp's f16-cache run (see
    the module docstring; FormatResult.kl_against says which baseline a row's KL is against).
    """
    last = None
    for last in compare_stream(model, tokenizer, prompt, specs, max_new_tokens, scales, speed_tokens, free_running):
        pass
    assert last is not None and last.report is not None, "compare_stream ended without a report"
    return last.report
