"""kvviz.ui.strings.figures: the measured figures the lesson notes quote, recorded from lesson runs.

The notes (kvviz/ui/strings/lessons.py) hold placeholders such as `{smol[l8_kl_start]:.2g}`; `fill(text)` formats
them with the figures in `lesson_figures.json`, by model (`smol`: SmolLM2-135M, `gemma`: Gemma 3 270M).
`benchmarks/lessons_figures.py` writes that file: it runs each lesson on the bundled models as its button does
and reads the figures back from what the lesson shows (`measure`). tests/test_lessons_models.py runs the lessons
again and checks the recorded figures against `measure` of that run; tests/test_ui_lessons.py checks that every
placeholder is filled, tests/test_lessons_run.py that `measure` still reads every figure (on the tiny model).

Lessons 1, 2 and 4 quote figures measured elsewhere (the K channel ratios over every layer, and
benchmarks/fp8_unit_scale.py): they stay in the text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

PATH = Path(__file__).with_name("lesson_figures.json")
MODELS = {"smol": "smollm2-135m", "gemma": "gemma-3-270m"}  # placeholder prefix -> bundled model
# lesson -> the action whose outputs its figures come from (a lesson runs these in order; see kvviz/ui/lessons.py)
MEASURED = {3: "run", 5: "needle", 6: "run", 7: "fused", 8: ("run", "search"), 9: "rotation", 10: "run",
            11: "run"}
ONLY = {7: ("smollm2-135m",)}  # lessons whose notes quote one model's figures (lesson 7: SmolLM2's bytes)
# figures that are counts or names, compared exactly; every other figure is compared to RELATIVE
EXACT = {"l5_ctx", "l5_total", "l5_exact", "l8_plan", "l8_skip", "l8_move1_layer",
         "l8_peak1_layer", "l8_peak2_layer", "l8_peak3_layer", "l8_peak1_side", "l9_layer", "l9_head",
         "l3_bits", "l6_bits_row", "l6_bits_g16", "l6_bits_g8", "l7_ctx", "l10_ctx",
         "l11_ctx"}
RELATIVE = 0.05  # measured figures: within 5% of the recorded ones (CPU kernels round differently across machines)
# lesson 5's counts: one needle either way (per-tensor int4 finds 7 or 8 of SmolLM2's 15 under AVX-512 and AVX2
# kernels: kvviz/ui/lessons.py)
ABSOLUTE = {"l5_int4": 1, "l5_tensor": 1, "l5_int4_pct": 100 / 15 + 1e-9, "l5_tensor_pct": 100 / 15 + 1e-9,
            # lesson 10's generation: the share of its 47 scored steps whose top-1 differs, two steps either way
            **{f"l10_{f}_differ": 2 * 100 / 47 + 1e-9 for f in ("int4", "k8v4", "nvfp4")}}



def load(path: Path = PATH) -> dict[str, dict]:
    """{model: {figure: value}} as recorded."""
    return json.loads(Path(path).read_text())["models"]


def fill(text: str, figures: dict[str, dict] | None = None) -> str:
    """`text` with its placeholders filled from the recorded figures (KeyError naming a figure that is missing)."""
    figures = load() if figures is None else figures
    return text.format(**{short: figures.get(model, {}) for short, model in MODELS.items()})


def placeholders(text: str) -> set[tuple[str, str]]:
    """The (model prefix, figure) pairs `text` quotes."""
    return set(re.findall(r"\{(" + "|".join(MODELS) + r")\[(\w+)\]", text))


def _rows(table) -> dict[str, list]:
    values = table.values.tolist() if hasattr(table, "values") else table["data"]
    return {str(r[0]): r for r in values}


def _ratio(cell) -> float:
    return float(str(cell).rstrip("×"))


def _layers(layers: list[int]) -> str:
    """[1, 2, 3, 10] -> "1-3, 10"."""
    runs, out = [], []
    for x in sorted(layers):
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    for r in runs:
        out.append(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}")
    return ", ".join(out)


def measure(outputs: dict[int, dict]) -> dict:
    """The figures the notes quote, from one model's lesson outputs: {lesson: {action: its outputs}} as
    kvviz.ui.lessons.run returns them (English). Lessons missing from `outputs` give nothing."""
    out: dict = {}
    if 3 in outputs:
        _, table, _, _, _ = outputs[3]["run"]
        row = _rows(table)["k8v4"]
        out["l3_bits"], out["l3_vs16"] = float(row[2]), _ratio(row[9])
    if 5 in outputs:
        fig, status = outputs[5]["needle"]
        per = int(re.search(r"(\d+) needles at each of (\d+) depths in (\d+) tokens", status).group(1))
        ctx = int(re.search(r"(\d+) needles at each of (\d+) depths in (\d+) tokens", status).group(3))
        found = {tr.name: round(sum(y / 100 * per for y in tr.y)) for tr in fig.data}
        total = per * len(fig.data[0].y)
        out |= {"l5_ctx": ctx, "l5_total": total, "l5_exact": found["baseline"], "l5_int4": found["int4"],
                "l5_tensor": found["int4/tensor"], "l5_int4_pct": 100 * found["int4"] / total,
                "l5_tensor_pct": 100 * found["int4/tensor"] / total}
    if 6 in outputs:
        rows = _rows(outputs[6]["run"][1])
        for key, fmt in (("l6_bits_row", "int4"), ("l6_bits_g16", "int4/g16"), ("l6_bits_g8", "int4/g8")):
            out[key] = float(str(rows[fmt][1]).split("/")[0])
    if 7 in outputs:
        table = outputs[7]["fused"][0]
        values = table.values.tolist()  # read per step (MiB): the last column
        int4 = [r for r in values if r[0] == "int4"]
        static = [r for r in values if r[0] == "StaticCache"]
        out |= {"l7_exact_mib": float(values[0][-1]), "l7_static_mib": float(static[0][-1]),
                "l7_int4_fused_mib": float(int4[0][-1]), "l7_int4_unfused_mib": float(int4[1][-1])}
    if 8 in outputs:
        _, _, _, summary = outputs[8]["run"]
        peaks = re.findall(r"- \*\*([KV]) of layer (\d+)\*\*: KL ([0-9.e+-]+) nats/token, ([0-9.]+)× the median; "
                           r"its largest \w channel is ([0-9.]+)×", summary)
        for i, (side, layer, kl, times, ratio) in enumerate(peaks[:3], start=1):
            out |= {f"l8_peak{i}_layer": int(layer), f"l8_peak{i}_kl": float(kl), f"l8_peak{i}_times": float(times),
                    f"l8_peak{i}_ratio": float(ratio)}
            if i == 1:
                out["l8_peak1_side"] = side
        _, plan, md, steps = outputs[8]["search"]
        rows = steps.values.tolist()  # step, move, plan, MiB, KL
        chosen = next(r for r in rows if r[2] == plan)
        fp16 = float(re.search(r"([0-9.]+)× fp16", md).group(1))
        kept = plan.split("; ")[1].split("=")[0].split(",") if "; " in plan else []  # "int4; 1-3,10=fp16"
        layers = [x for part in kept for x in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
        out |= {"l8_kl_start": float(rows[0][4]), "l8_kl_plan": float(chosen[4]),
                "l8_plan": _layers(layers), "l8_skip": " ".join(map(str, layers)), "l8_plan_fp16": fp16,
                "l8_start_fp16": fp16 * float(rows[0][3]) / float(chosen[3])}
        if len(rows) > 1:  # the search's first move: one layer up a rung
            out |= {"l8_kl_move1": float(rows[1][4]),
                    "l8_move1_layer": int(re.search(r"(\d+)", rows[1][1]).group(1))}
    if 9 in outputs:
        table, _, _, status = outputs[9]["rotation"]
        rows = _rows(table)
        for key, fmt in (("int4", "int4"), ("rot", "int4/rot"), ("vllm_int4", "vllm:int4_per_token_head"),
                         ("mse", "tq_mse4"), ("vllm_tq", "vllm:turboquant_4bit_nc"), ("prod", "tq_prod4")):
            out[f"l9_kl_{key}"], out[f"l9_bits_{key}"] = float(rows[fmt][2]), float(rows[fmt][1])
        m = re.search(r"Layer (\d+), head (\d+) .*?coordinates ([0-9.]+) before the rotation, ([0-9.]+) after.*?"
                      r"\|coordinate\| ([0-9.]+) before, ([0-9.]+) after", status, re.S)
        out |= {"l9_layer": int(m.group(1)), "l9_head": int(m.group(2)), "l9_kurt_before": float(m.group(3)),
                "l9_kurt_after": float(m.group(4)), "l9_max_before": float(m.group(5)),
                "l9_max_after": float(m.group(6)), "l9_int4_over_rot": out["l9_kl_int4"] / out["l9_kl_rot"],
                "l9_prod_over_mse": out["l9_kl_prod"] / out["l9_kl_mse"]}
    if 10 in outputs:
        status, _, _, table, _, gen_table, _, _ = outputs[10]["run"]
        out["l10_ctx"] = int(re.search(r"`: ([\d,]+) tokens, chunks of", status).group(1).replace(",", ""))
        for name, row in _rows(table).items():  # format, mean KL, first quarter, last quarter, last / first, ...
            key = re.sub(r"\W", "_", name)
            out |= {f"l10_{key}_first": float(row[2]), f"l10_{key}_last": float(row[3]),
                    f"l10_{key}_growth": float(row[3]) / float(row[2]), f"l10_{key}_top1": float(row[-1])}
        for name, row in _rows(gen_table).items():  # format, first divergence, differing top-1 (%), repetition
            if name != "exact":
                key = re.sub(r"\W", "_", name)
                out[f"l10_{key}_differ"] = float(row[2])
    if 11 in outputs:  # the KL, bytes and keep ratio of each candidate (the needle's counts are not quoted)
        _, _, table, status = outputs[11]["run"]
        out["l11_ctx"] = int(re.search(r"KiB at ([\d,]+) tokens\)", status).group(1).replace(",", ""))
        for row in table.values.tolist():  # candidates no keep ratio fits (Gemma's 16-bit rows) are not rows
            short = _l11_short(str(row[0]))
            out |= {f"l11_kl_{short}": float(row[5]), f"l11_pct_{short}": float(row[4]),
                    f"l11_keep_{short}": float(row[2])}
    return out


def _l11_short(spec: str) -> str:
    """Lesson 11's name for a candidate in its figures: "int4", "streaming" (fp16 under a policy), "int4_snapkv",
    "int4_mixed" (the rest in int2)."""
    base, _, evict = spec.partition(" @ ")
    if not evict:
        return base
    policy = evict.split(":")[0]
    return policy if base == "fp16" else f"{base}_{'mixed' if 'rest=' in evict else policy}"


def disagreements(recorded: dict, measured: dict) -> list[str]:
    """Figures of `measured` that differ from `recorded` (EXACT ones at all, ABSOLUTE ones by more than their
    margin, the others by over RELATIVE)."""
    bad = []
    for key, value in measured.items():
        was = recorded.get(key)
        if was is None:
            bad.append(f"{key}: not recorded (measured {value})")
        elif key in EXACT or isinstance(value, str):
            if value != was:
                bad.append(f"{key}: recorded {was}, measured {value}")
        elif key in ABSOLUTE:
            if abs(value - was) > ABSOLUTE[key]:
                bad.append(f"{key}: recorded {was}, measured {value} (over {ABSOLUTE[key]:.3g} apart)")
        elif abs(value - was) > RELATIVE * abs(was):
            bad.append(f"{key}: recorded {was}, measured {value} (over {RELATIVE:.0%} apart)")
    return bad
