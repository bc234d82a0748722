"""The engine bridge: KV formats measured inside a real engine, with llama.cpp's KLD statistics
(kvviz.metrics, the same numbers `llama-perplexity --kl-divergence` prints).

    from kvviz import engines
    engines.measure("llama.cpp", ["q8_0", "k=q8_0,v=q4_0"], tokens=512)        # the bundled SmolLM2 GGUF, in a worker
    engines.measure({"baseline": "http://gpu0:8000", "fp8_e4m3": "http://gpu1:8000"})   # vLLM / SGLang servers

    python -m kvviz engines --specs q8_0,k=q8_0,v=q4_0 --tokens 512
    python -m kvviz engines --baseline http://gpu0:8000 --server fp8_e4m3=http://gpu1:8000
    python -m kvviz engines --vllm fp8_e4m3,fp8_e5m2 --tokens 128                    # local vLLM servers

- llama.cpp (kvviz/engines/llamacpp.py, `run`): llama-cpp-python loads the GGUF once per K/V type pair with flash
  attention on and keeps every position's logits, in a worker process (a native crash ends only it); the baseline
  is an f16 cache. Full-vocabulary KL.
- vLLM and SGLang (kvviz/engines/servers.py, `measure_servers`): one server per `--kv-cache-dtype` plus a baseline
  server, all serving the same model; teacher-forced top-k prompt log-probs; KL over the top-k with the rest of the
  mass lumped (a lower bound). Servers spanning many GPUs are measured the same way as one.
- vLLM's CPU build started here (kvviz/engines/vllm_local.py, `measure_dtypes`; `make vllm`, `--vllm
  fp8_e4m3,fp8_e5m2`): an `auto` baseline and one server per dtype on 127.0.0.1, measured through the server bridge
  and stopped afterwards.
- kvviz's own simulation of the same formats on the same token ids (kvviz/engines/simulate.py: `kvviz_kld`, and
  `llamacpp_kld` / `topk_kld` as llama.cpp and a server measure; `--with-kvviz`), for side-by-side tables, and the
  verdict on a vLLM dtype (kvviz/engines/verdict.py): the engine's KLD beside the simulation measured like with like.

The measure itself, kvviz's formats against the exact model over WikiText-2 windows, is `kvviz.quality.kld`
(`python -m kvviz kld`); the functions here name the engine they run in.
"""

from __future__ import annotations

from kvviz.engines import llamacpp, servers  # llamacpp imports llama_cpp only when asked

# The engines measure() runs a format in, as its `engine` argument names them.
BRIDGES = ("llama.cpp", "vllm / sglang servers (a dict of URLs)")


def measure(engine, specs=None, *, model=None, text: str | None = None, tokens: int = 512,
            **options) -> dict[str, dict]:
    """{spec: stats} of each KV format run inside `engine`, against the engine's own full-precision baseline.

    engine: "llama.cpp" (specs: kvviz specs of llama.cpp's cache types, e.g. ["q8_0", "k=q8_0,v=q4_0"]; model: None
    for the bundled SmolLM2, a bundled name or a .gguf path; options: flash_attn, rotate, threads), or a dict
    {"baseline": url, name: url, ...} of vLLM / SGLang servers (specs: the names to measure, default all; model:
    vLLM's served model name; options: api, top_k, timeout). text: default the WikiText-2 slice; tokens: how many
    of its tokens are scored.

    stats: kvviz.metrics.STAT_KEYS (mean, mean_se, median, p90 ... max KLD in nats, delta_p_*, same_top_p,
    ln_ppl_ratio, ppl, ppl_base, n) plus "engine" and "estimate" (how the KL was taken: full vocabulary, or top-k
    with the rest lumped).
    """
    if engine == "llama.cpp":
        if specs is None:
            raise ValueError("Name the llama.cpp cache types to measure, e.g. specs=['q8_0', 'k=q8_0,v=q4_0'].")
        return llamacpp.run(specs, model=model, text=text, tokens=tokens, **options)[1]
    if isinstance(engine, dict):
        return servers.measure_servers(engine, specs, model=model, text=text, tokens=tokens, **options)
    raise ValueError(f"engine must be 'llama.cpp' or a dict of server URLs ({{'baseline': url, 'fp8_e4m3': url2}}) "
                     f"for vLLM / SGLang; got {engine!r}.")


__all__ = ["BRIDGES", "measure"]
