"""`python -m kvviz bench --contexts 1024,4096,8192`: decode speed per context, against both of transformers' exact
caches, with the byte ceiling each format could reach and the time a decode step spends per layer in the cache's
update and in attention.

The two exact baselines: DynamicCache, whose update appends with torch.cat and so copies every layer's whole K/V at
every step, and StaticCache, preallocated to the tokens the run will hold and written in place (the best exact cache
for eager decode; SDPA reads it under a mask). Both hold the model's dtype and run the model's SDPA path, on the same
torch threads as the formats (numba's pool is sized to torch's, kernels/cpu/decode.py).

A decode step reads the weights and the cache, so a cache that costs nothing beyond its bytes speeds a step up by
at most (weights + the exact K/V bytes) / (weights + the format's bytes): the ceiling. `share` is the ratio to
StaticCache reached over that ceiling. On the cpu backend the fused formats append their token inside the attention
call (one numba call per layer, kernels/cpu/step.py), so their `update` column is the staging alone and `attention`
holds the append; on the two-call path (torch backend, channel formats) `update` is the append.

Ratios are taken in one process, each cache timed step by step in interleaved rounds and its median step kept, so
that a burst of other work on a busy machine is set aside; the machine's cores and load average at the start and the
end are printed with them. The timed steps run as a user's do: the per-layer times come from one more step per round
with every layer's update and attention call timed (the timers' own cost stays out of tokens/s).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import statistics
import time

from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer, StaticLayer, StaticSlidingWindowLayer

from kvviz import attention, quality
from kvviz.cache import QuantizedKVCache, QuantizedKVLayer
from kvviz.cache.layers import QuantizedSlidingLayer
from kvviz.engines import llamacpp
from kvviz.quality.decode import DYNAMIC, STATIC, WARMUP, rotated
from kvviz.quality.speed import dynamic_bytes

TIMING = ("one over the median step, each cache's steps timed alone in interleaved rounds (kvviz.quality.step_times), "
          "no per-layer timers in the timed steps")
LLAMA_CPP_TYPES = (("f16", "f16"), ("q4_0", "q4_0"), ("q8_0", "q8_0"))  # the peer: f16 K/V against two KV types


class _Timer:
    """Seconds spent in the cache layers' update and in the attention function per cache, summed over the steps
    timed per layer (the patched() block): while `current` names a cache, its calls count for it (None: not timed)."""

    def __init__(self, names):
        self.update = dict.fromkeys(names, 0.0)
        self.attention = dict.fromkeys(names, 0.0)
        self.calls = dict.fromkeys(names, 0)
        self.current: str | None = None

    @contextlib.contextmanager
    def timing(self, name: str):
        """Count the calls made inside the block for cache `name`."""
        self.current = name
        try:
            yield
        finally:
            self.current = None

    @contextlib.contextmanager
    def patched(self):
        """While the block runs, time every layer update and every "kvviz" attention call (restored after)."""
        saved = {cls: cls.update for cls in (DynamicLayer, StaticLayer, StaticSlidingWindowLayer, QuantizedKVLayer,
                                              QuantizedSlidingLayer)}
        fn = attention.kvviz_attention_forward

        def timed_update(original):
            def update(layer, key_states, *args, **kwargs):
                name = self.current
                if name is None or key_states.shape[-2] != 1:  # untimed, or a prefill loaded into the cache
                    return original(layer, key_states, *args, **kwargs)
                t0 = time.perf_counter()
                try:
                    return original(layer, key_states, *args, **kwargs)
                finally:
                    self.update[name] += time.perf_counter() - t0
            return update

        def timed_attention(*args, **kwargs):
            name = self.current
            if name is None:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.attention[name] += time.perf_counter() - t0
                self.calls[name] += 1

        for cls, original in saved.items():
            cls.update = timed_update(original)
        AttentionInterface.register(attention.ATTN_NAME, timed_attention)
        try:
            yield self
        finally:
            for cls, original in saved.items():
                cls.update = original
            AttentionInterface.register(attention.ATTN_NAME, fn)


def load() -> tuple[float, float, float]:
    return os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)


def _cache_bytes(cache) -> int:
    """K/V bytes a cache holds: DynamicCache's or StaticCache's tensors, or a kvviz cache's packed buffers (nbytes)."""
    return cache.nbytes() if isinstance(cache, QuantizedKVCache) else dynamic_bytes(cache)


def speed_by_context(model, text_ids, formats: list[str], contexts: list[int], decode_tokens: int,
                     rounds: int | dict[int, int], log=lambda msg: None) -> dict:
    """{"contexts": {context: {name: row}}, "rounds": {context: rounds}, "weights_bytes", "load_start", "load_end"};
    rows "DynamicCache", "StaticCache", then the formats. A row holds tokens_per_s (one over the median step), ratio
    (to DynamicCache's), vs_static (to StaticCache's), bytes (K/V held), ceiling (from DynamicCache's bytes: the
    exact K/V of the tokens held), share (vs_static over ceiling), update_ms / attention_ms (per layer and step,
    means over the steps timed per layer).

    Per context, `rounds` (one count for all, or a count per context) rounds in which every cache, fresh from one
    prefill, takes two untimed and `decode_tokens` timed steps alone (kvviz.quality.step_times), one cache after
    another (each round starting one cache later), then one step with its layers' update and attention calls timed.
    A cache's speed is one over its median step over all rounds: a burst of other work on a shared machine lands on
    a few steps, and the median sets it aside.
    text_ids: [1, >= max(contexts)] token ids of the prompt; model: decoding through the "kvviz" attention."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    start_load = load()
    out = {}
    names = [DYNAMIC, STATIC, *formats]
    per_context = {c: _rounds_at(rounds, c) for c in contexts}
    for context in contexts:
        rounds = per_context[context]
        ids = text_ids[:, :context]
        if ids.shape[1] < context:
            raise ValueError(f"The prompt text holds {ids.shape[1]} tokens, fewer than --contexts' {context}; "
                             "pick smaller contexts.")
        dyn, logits0 = quality.prefill(model, ids)
        first = int(logits0.argmax())
        timer = _Timer(names)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        held: dict[str, int] = {}
        for r in range(rounds):
            for name in rotated(names, r):  # each round starts one cache later
                # a StaticCache sized to what the run holds: the prompt, its steps and the one timed per layer
                run = quality.Decoding(model, dyn, name, first, steps=WARMUP + decode_tokens + 1)
                seconds[name] += quality.step_times(run, decode_tokens)
                with timer.patched(), timer.timing(name):  # one more step, each layer's calls timed
                    run.step()
                held[name] = _cache_bytes(run.cache)
                del run
            log(f"context {context}: round {r + 1}/{rounds} done")
        rows = {}
        for name in names:
            per_call = 1e3 / max(timer.calls[name], 1)
            rows[name] = dict(tokens_per_s=1.0 / statistics.median(seconds[name]), bytes=held[name],
                              update_ms=timer.update[name] * per_call, attention_ms=timer.attention[name] * per_call)
        base, static = rows[DYNAMIC], rows[STATIC]
        for row in rows.values():
            row["ratio"] = row["tokens_per_s"] / base["tokens_per_s"]
            row["vs_static"] = row["tokens_per_s"] / static["tokens_per_s"]
            row["ceiling"] = (weights + base["bytes"]) / (weights + row["bytes"])
            row["share"] = row["vs_static"] / row["ceiling"]
        out[context] = rows
        del dyn
    return {"contexts": out, "rounds": per_context, "weights_bytes": weights, "load_start": start_load,
            "load_end": load()}


def _rounds_at(rounds: int | dict[int, int], context: int) -> int:
    """The rounds at `context`: `rounds` itself, or its entry for that context."""
    return rounds[context] if isinstance(rounds, dict) else rounds


def markdown(result: dict, machine: str) -> str:
    """One table per context: tokens/s, ratios to DynamicCache and to StaticCache, bytes, ceiling and share (of the
    ratio to StaticCache), update and attention ms per layer."""
    ls, le = result["load_start"], result["load_end"]
    lines = [f"Machine: {machine}; load average {ls[0]:.2f} / {ls[1]:.2f} / {ls[2]:.2f} at the start, "
             f"{le[0]:.2f} / {le[1]:.2f} / {le[2]:.2f} at the end. Weights {result['weights_bytes'] / 1e6:.0f} MB."]
    for context, rows in result["contexts"].items():
        rounds = result.get("rounds", {}).get(context)
        lines += ["", f"Context {context} tokens" + (f", {rounds} rounds:" if rounds else ":"), "",
                  "| cache | tokens/s | vs DynamicCache | vs StaticCache | K/V bytes | ceiling | share of ceiling "
                  "| update ms/layer | attention ms/layer |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, r in rows.items():
            vs_static = f"{r['vs_static']:.2f}x" if "vs_static" in r else ""  # records made before StaticCache
            lines.append(f"| {name} | {r['tokens_per_s']:.2f} | {r['ratio']:.2f}x | {vs_static} | "
                         f"{r['bytes'] / 1e6:.1f} MB | {r['ceiling']:.2f}x | {r['share']:.0%} | {r['update_ms']:.3f} "
                         f"| {r['attention_ms']:.3f} |")
    return "\n".join(lines)


def write_json(path: str, result: dict, model: str, machine: str, decode_tokens: int, command: str) -> None:
    """speed_by_context's result as JSON, with what produced it (kvviz.quality.speed.recorded_by_context reads it);
    "rounds" per context."""
    record = {"model": model, "command": command, "machine": machine,
              "rounds": {str(c): n for c, n in result["rounds"].items()},
              "decode_tokens": decode_tokens, "timing": TIMING,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "weights_bytes": result["weights_bytes"], "load_start": list(result["load_start"]),
              "load_end": list(result["load_end"]),
              "contexts": {str(c): rows for c, rows in result["contexts"].items()}}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


def llama_cpp_speed(contexts: list[int], decode_tokens: int, rounds: int | dict[int, int], threads: int,
                    model=None) -> dict:
    """{context: {(k_type, v_type): tokens/s}} of llama.cpp (kvviz.engines.llamacpp.decode_speed) on the GGUF of
    `model` (None: the bundled SmolLM2), with the same context, steps, rounds and threads as kvviz's run."""
    return {c: llamacpp.decode_speed(list(LLAMA_CPP_TYPES), context=c, tokens=decode_tokens,
                                     rounds=_rounds_at(rounds, c),
                                     model=model, threads=threads) for c in contexts}


def llama_cpp_markdown(result: dict) -> str:
    """llama.cpp's tokens/s per context and KV type, and each type's ratio to its f16 K/V."""
    lines = ["", "llama.cpp (llama-cpp-python, flash attention, the same GGUF, context and threads):", "",
             "| context | K/V | tokens/s | vs f16 K/V |", "|---:|---|---:|---:|"]
    for context, speeds in result.items():
        base = speeds[LLAMA_CPP_TYPES[0]]
        for (k, v), tps in speeds.items():
            lines.append(f"| {context} | {k}/{v} | {tps:.2f} | {tps / base:.2f}x |")
    return "\n".join(lines)
