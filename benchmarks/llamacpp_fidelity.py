"""kvviz's simulation of llama.cpp's KV cache types against llama.cpp itself, on the same tokens (issue 21 item 4).

For each bundled GGUF model and each type pair, the mean KLD (nats) that llama.cpp measures against its own f16
cache (kvviz.engines.llamacpp, llama-cpp-python in-process, flash attention), with its default rotation and with
LLAMA_ATTN_ROT_DISABLE=1, beside kvviz's simulation of the same run (kvviz.engines.simulate.llamacpp_kld: the
GGUF's weights in fp32 with every matmul input rounded as ggml's CPU matmul rounds it, and
kvviz.ggml_attention's flash attention, rotation on / off) and kvviz's bare formats (kvviz.engines.simulate.kvviz_kld).
A ratio is simulated / llama.cpp; "!" marks one outside the bound (simulate.within_bound: 20%, or 0.0005 absolute
when both are below 0.0025).

    python benchmarks/llamacpp_fidelity.py                                  # both models, 512 tokens
    python benchmarks/llamacpp_fidelity.py --models smollm2-135m --tokens 256 --specs q8_0,q4_0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvviz.engines import llamacpp, simulate  # noqa: E402
from kvviz.memory import split_formats  # noqa: E402

SPECS = "q8_0,q4_0,q4_1,q5_0,q5_1,iq4_nl,k=q8_0,v=q4_0"
MODELS = "smollm2-135m,gemma-3-270m"


def _ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}{'' if simulate.within_bound(ours, theirs) else ' !'}"


def measure(model: str, specs: list[str], tokens: int, threads: int | None) -> list[list[str]]:
    from kvviz.models import load_model

    gguf = llamacpp.resolve_gguf(model)
    ids, rot = llamacpp.run(specs, model=model, tokens=tokens, rotate=True, threads=threads)
    _, norot = llamacpp.run(specs, model=model, tokens=tokens, rotate=False, threads=threads)
    lm, _ = load_model(model)
    sim_rot = simulate.llamacpp_kld(specs, ids, lm, gguf, rotate=True)
    sim_norot = simulate.llamacpp_kld(specs, ids, lm, gguf, rotate=False)
    bare = simulate.kvviz_kld(specs, ids, lm)
    rows = []
    for s in specs:
        a, b, c, d = rot[s]["mean"], sim_rot[s]["mean"], norot[s]["mean"], sim_norot[s]["mean"]
        rows.append([model, s, f"{a:.5f}", f"{b:.5f}", _ratio(b, a), f"{c:.5f}", f"{d:.5f}", _ratio(d, c),
                     f"{bare[s]['mean']:.5f}"])
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=MODELS, help="bundled model names, comma-separated (default %(default)s)")
    p.add_argument("--specs", default=SPECS, help="llama.cpp type pairs (default %(default)s)")
    p.add_argument("--tokens", type=int, default=512, help="WikiText-2 tokens (default %(default)s)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    start = time.perf_counter()
    table = [["model", "K/V", "llama.cpp", "kvviz llama.cpp:", "ratio", "llama.cpp norot", "kvviz /norot", "ratio",
              "kvviz bare"]]
    for model in args.models.split(","):
        table += measure(model.strip(), split_formats(args.specs), args.tokens, args.threads)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    print(f"mean KLD (nats) against each side's f16-cache baseline, {args.tokens} WikiText-2 tokens; "
          "'!' = outside the bound (20%, or 0.0005 where both < 0.0025)")
    for row in table:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    print(f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
