"""The figures the lesson notes quote, measured: each lesson that quotes figures run as its button runs it, on the
bundled models, in-process, and its figures read back from what the lesson shows (kvviz.ui.strings.figures), then
written to kvviz/ui/strings/lesson_figures.json, which the notes read.

    python benchmarks/lessons_figures.py                                  # every measured lesson, both models
    python benchmarks/lessons_figures.py --models smollm2-135m --lessons 8,9

Only the lessons and models named are measured again; the file keeps the others' figures. On an idle 2-core CPU
SmolLM2's lessons take about 5 minutes (5 and 7 the longest), Gemma 3 270M's about 4 (lesson 7's figures are
SmolLM2's only). tests/test_lessons_models.py checks the file against its own lesson runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("smollm2-135m", "gemma-3-270m")


def main() -> int:
    import app
    from kvviz.ui import lessons
    from kvviz.ui.strings import figures

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--lessons", default=",".join(map(str, figures.MEASURED)))
    p.add_argument("--out", default=str(figures.PATH))
    args = p.parse_args()
    wanted = [int(x) for x in args.lessons.split(",")]
    unknown = [i for i in wanted if i not in figures.MEASURED]
    if unknown:
        p.error(f"lessons {unknown} quote no measured figures; pick from {sorted(figures.MEASURED)}")
    path = Path(args.out)
    record = json.loads(path.read_text()) if path.exists() else {"models": {}}
    parts = app.build_demo().parts  # the page built in this process (nothing is loaded: models load lazily)
    for model in args.models.split(","):
        outputs = {}
        for i in wanted:
            if model not in figures.ONLY.get(i, (model,)):
                continue
            start = time.perf_counter()
            outputs[i] = lessons.run(parts, i, model)
            print(f"{model}: lesson {i} in {time.perf_counter() - start:.0f} s", flush=True)
        measured = figures.measure(outputs)
        record["models"].setdefault(model, {}).update(measured)
        for key, value in sorted(measured.items()):
            print(f"  {key} = {value}")
    record["about"] = ("The figures the lesson notes quote (kvviz/ui/strings/lessons.py), by bundled model: written "
                       "by benchmarks/lessons_figures.py from lesson runs, checked by tests/test_lessons_models.py.")
    record["machine"] = f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}"
    path.write_text(json.dumps(dict(sorted(record.items())), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
