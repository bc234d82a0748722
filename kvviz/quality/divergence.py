"""`kld()`: llama.cpp's KLD statistics of KV formats and plans against the exact model over WikiText-2 windows,
with every position reading the quantized cache, as in an engine; and the exact baseline, saved once and reused.

Each window runs as one batch, one row per candidate plus an exact row for the baseline
(kvviz.analysis.teacher_forced.row_values: how the window is chunked, which positions are scored, how rows share
layers).
A `llama.cpp:<type>` name runs as llama.cpp runs it instead (kvviz.analysis.llamacpp: its cache, rotation and
attention arithmetic, its 8-bit matmul inputs, the whole window in one batch) and is measured as llama.cpp measures
it, against the same run with an f16 cache.

A static scale that a cache fits on its first update (a bare `fp8_e4m3`: per tensor, fitted; int8/tensor; nvfp4's
global scale) is fitted on the window's exact K/V instead, as a prefill of the window would fit it and as Compare
fits it on its prompt (`window_scales`): the window's first update is a single token, and a scale fitted on it
saturates the tokens after it (SmolLM2's bare fp8_e4m3 read a mean KLD of 0.73 so). Scales given (`scales`) and
vLLM's / SGLang's unit scale are used as they are.

    report = kld(model, tok, ["fp8_e4m3", "int4", "int4; 0,29=fp16"])   # {spec: stats}, kvviz.metrics.STAT_KEYS
    base = base_logprobs(model, tok)          # saved once (save_base / load_base) and reused: kld(..., base=base)
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvviz.analysis.teacher_forced import check_score_from, decoder, lm_logprobs, row_values
from kvviz.cache import model_layer_types
from kvviz.formats import as_plans
from kvviz.quality.decode import prefill
from kvviz.metrics import summarize
from kvviz.analysis import llamacpp
from kvviz.quality.corpus import wikitext
from kvviz.rowstable import row_stable

BASE_FORMAT = "kvviz-kld-base/1"


def _windows(tokenizer, text: str | None, windows: int, window_tokens: int) -> torch.Tensor:
    """[windows, window_tokens] consecutive, non-overlapping token windows of the text (WikiText-2 by default)."""
    if windows < 1 or window_tokens < 3:
        raise ValueError(f"need windows >= 1 and window_tokens >= 3; got {windows} and {window_tokens}.")
    ids = tokenizer(text if text is not None else wikitext(), return_tensors="pt")["input_ids"][0]
    need = windows * window_tokens
    if ids.shape[0] < need:
        raise ValueError(f"The text has {ids.shape[0]} tokens; {windows} windows of {window_tokens} need {need}. "
                         f"Ask for fewer or shorter windows.")
    return ids[:need].view(windows, window_tokens)


def base_logprobs(model, tokenizer, text: str | None = None, windows: int = 2, window_tokens: int = 512,
                  score_from: int | None = None) -> dict:
    """The exact model's log-probs at the scored positions of every window, to save once and reuse (as
    llama-perplexity's --kl-divergence-base): {"format", "model", "windows", "window_tokens", "score_from",
    "tokens": [windows, window_tokens] int64, "logprobs": [windows, N, vocab] float32}. float32 keeps the KL exact
    to ~1e-7 nats; the file holds windows x N x vocab x 4 bytes (2 x 255 x 49152 x 4 = 100 MB for SmolLM2)."""
    score_from = window_tokens // 2 if score_from is None else score_from
    wins = _windows(tokenizer, text, windows, window_tokens)
    check_score_from(score_from, window_tokens)
    body = decoder(model)
    lps = []
    with torch.no_grad(), row_stable(model):  # as the rows it is compared with (row_values)
        for w in wins:
            h = body(input_ids=w[None].to(model.device)).last_hidden_state[0, score_from : window_tokens - 1]
            lps.append(lm_logprobs(model, h).float())
    return {"format": BASE_FORMAT, "model": getattr(model.config, "_name_or_path", ""), "windows": windows,
            "window_tokens": window_tokens, "score_from": score_from, "tokens": wins, "logprobs": torch.stack(lps)}


def save_base(base: dict, path: str | Path) -> None:
    torch.save(base, Path(path))


def load_base(path: str | Path) -> dict:
    """A baseline written by save_base; ValueError when the file is missing or is not one."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"No baseline file at {p}; write one with `python -m kvviz kld --save-base {p}`.")
    base = torch.load(p, map_location="cpu", weights_only=True)
    if not isinstance(base, dict) or base.get("format") != BASE_FORMAT:
        raise ValueError(f"{p} is not a kvviz KLD baseline (written by `python -m kvviz kld --save-base`).")
    return base


def _fits_scale(fmt) -> bool:
    """A side whose cache fits a scale on its first update: per-tensor / per-head, neither unit nor calibrated;
    NVFP4's global scale."""
    return fmt.global_scale or (fmt.static_scale and fmt.scale_source not in ("unit", "calibrated"))


def window_scales(model, ids: torch.Tensor, plans: list) -> list[dict | None]:
    """Per plan, the static scales its cache would fit on a prefill of the whole window ids [1, T]: {layer:
    (k_scale, v_scale)} from the exact model's K/V (None for a side that fits none), or None for a plan with no
    such side (then nothing is run). Per tensor: formats' fit_scale (0-d); per head: [1, H, 1, 1]; NVFP4: the
    global scale amax / (448 * 6) that kvviz.cache derives from the prefill's amax."""
    config = model.config.get_text_config(decoder=True)
    resolved = [p.resolve(config.num_hidden_layers, model_layer_types(model.config)) for p in plans]
    if not any(_fits_scale(f) for specs in resolved for kv in specs if kv is not None for f in (kv.k, kv.v)):
        return [None] * len(plans)
    dyn, _ = prefill(model, ids)  # every token kept, sliding layers included
    out = []
    for specs in resolved:
        scales = {}
        for i, (kv, layer) in enumerate(zip(specs, dyn.layers)):
            if kv is None or getattr(layer, "keys", None) is None:
                continue
            scales[i] = tuple(_fit(f, x) for f, x in ((kv.k, layer.keys), (kv.v, layer.values)))
        out.append(scales if any(s is not None for pair in scales.values() for s in pair) else None)
    return out


def _fit(fmt, x: torch.Tensor) -> torch.Tensor | None:
    """The scale a cache side of fmt fits on its first states x [1, H, T, D] (kvviz.cache.sides.Side.init)."""
    if not _fits_scale(fmt):
        return None
    if fmt.global_scale:  # NVFP4: amax / (448 * 6), the global scale kvviz.cache fits on the prefill
        return fmt.fit_scale(x)
    return fmt.fit_scale(x).reshape(() if fmt.granularity == "tensor" else (1, x.shape[1], 1, 1))


def kld(model, tokenizer, specs: list, text: str | None = None, windows: int = 2, window_tokens: int = 512,
        score_from: int | None = None, first_chunk: int = 1, chunk: int | None = None, base: dict | None = None,
        scales: dict | None = None, gguf=None) -> dict:
    """llama.cpp's KLD statistics of each spec or plan against the exact model, over `windows` consecutive
    windows of `window_tokens` tokens of WikiText-2's test text (or `text`).

    specs: specs ("int4", "k8v4"), plan strings ("int4; 0,29=fp16") or per-layer lists. Positions
    score_from..window_tokens-2 of each window are scored (default: the second half, as llama.cpp scores each
    context); first_chunk / chunk: see the module docstring. base: a saved baseline (base_logprobs / load_base),
    whose windows, text tokens and settings are then used; else the exact model runs beside the candidates.
    scales: static scales for every plan ({layer: (k_scale, v_scale)}); None fits each plan's per-tensor,
    per-head and NVFP4 global scales on each window's exact K/V (see the module docstring).
    A plan holding a `llama.cpp:` name runs with llama.cpp's arithmetic against llama.cpp's f16-cache run (see the
    module docstring; first_chunk, chunk, base and scales do not apply to it); gguf: the GGUF the model's weights
    came from, whose tensor types set llama.cpp's matmul input rounding (None: a bundled model's own, else the
    weights' dtype: kvviz.analysis.llamacpp.weight_vec_dot).
    Returns {name: stats} in the order given, stats keyed as kvviz.metrics.STAT_KEYS (nats, fractions).
    """
    plans = as_plans(specs, model.config.get_text_config(decoder=True).num_hidden_layers)  # checked before compute
    names = [p.name for p in plans]
    if base is not None:
        wins, score_from = base["tokens"], base["score_from"]
        if base["logprobs"].shape[-1] != model.get_output_embeddings().weight.shape[0]:
            raise ValueError("The saved baseline's vocabulary differs from this model's: it was saved from another "
                             "model. Save a new one with --save-base.")
    else:
        wins = _windows(tokenizer, text, windows, window_tokens)
        score_from = wins.shape[1] // 2 if score_from is None else score_from
    engine = [i for i, p in enumerate(plans) if llamacpp.runs_llamacpp(p)]  # run as llama.cpp runs them
    own = [i for i in range(len(plans)) if i not in engine]
    vec_dot = llamacpp.weight_vec_dot(model, gguf) if engine else {}
    parts: list[list[tuple]] = [[] for _ in plans]
    for w, ids in enumerate(wins):
        check_score_from(score_from, ids.shape[0])
        saved = None if base is None else base["logprobs"][w].double()
        window = ids[None].to(model.device)
        fitted = scales if scales is not None or not own else window_scales(model, window, [plans[i] for i in own])
        values = row_values(model, window, [plans[i] for i in own], first_chunk, chunk, score_from, saved,
                            fitted)[0] if own else []
        if engine:
            values = values + llamacpp.values(model, ids[None], [plans[i] for i in engine], score_from, vec_dot)
        for i, v in zip(own + engine, values):
            parts[i].append(v)
    return {name: summarize(*(torch.cat(col) for col in zip(*acc))) for name, acc in zip(names, parts)}

