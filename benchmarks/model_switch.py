"""Switching models in the app: first-use load time, then the cost of switching between resident models, and the
Compare tab's byte ratios (against the exact cache as run here, and against a 16-bit cache) on each model.

Calls the app's own functions in-process (kvviz/ui/registry.py's ModelRegistry through kvviz.ui.common), with the
bundled models by default:

    python benchmarks/model_switch.py                             # smollm2-135m and gemma-3-270m
    python benchmarks/model_switch.py tiny-llama tiny-qwen3       # quick

Prints seconds per first load, microseconds per switch (get_model of a resident model, and a whole K-outliers
call whose capture is cached, so only the switch and the figures are timed), and k8v4's two ratios.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["smollm2-135m", "gemma-3-270m"])
    parser.add_argument("--switches", type=int, default=200)
    args = parser.parse_args()
    os.environ["KVVIZ_MODELS"] = ",".join(args.models)
    os.environ.setdefault("KVVIZ_MAX_MODELS", str(len(args.models)))
    from kvviz.ui import common, compare, outliers

    def quiet(*_, **__):
        pass

    prompt = "The capital of France is Paris, and the capital of Korea is"
    for name in args.models:
        start = time.perf_counter()
        common.get_model(model=name)
        print(f"{name}: first load {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    for i in range(args.switches):
        common.get_model(model=args.models[i % len(args.models)])
    print(f"switch to a resident model (get_model): {1e6 * (time.perf_counter() - start) / args.switches:.1f} us")
    for name in args.models:
        outliers.run(prompt, 0, 0, name, progress=quiet)  # capture once per model
    times = []
    for i in range(10):
        name = args.models[i % len(args.models)]
        start = time.perf_counter()
        outliers.run(prompt, 0, 0, name, progress=quiet)
        times.append(time.perf_counter() - start)
    print(f"K-outliers call right after a switch (capture cached): {1e3 * sum(times) / len(times):.0f} ms mean")
    for name in args.models:
        *_, (_, table, _, _) = compare.run("The capital of France is", ["k8v4"], "", 2, False, name, "en",
                                           progress=quiet)
        row = dict(zip(table.columns, table.values[1]))
        exact = next(h for h in table.columns if h.startswith("cache vs exact"))
        print(f"{name}: k8v4 cache vs 16-bit {row['cache vs 16-bit']}, {exact} {row[exact]}")


if __name__ == "__main__":
    main()
