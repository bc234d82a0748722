"""Every lesson on the bundled models, run as its button runs it (tests/test_lessons_run.py's `run_lesson`: the
tab's inputs filled with the lesson's settings for that model, then the functions behind the tab's api_names), and
each lesson's claim asserted from the numbers it returns.

SmolLM2-135M runs everywhere, CI included. Gemma 3 270M runs where its packages are installed, outside CI: its half
adds about 2.5 minutes on a 2-core machine, more than CI's time budget holds (the issue asks CI for SmolLM2's; run
`python -m pytest tests/test_lessons_models.py` locally for both). The claims are what the lesson notes say
(kvviz/ui/strings/lessons.py, lesson_note<i> and lesson_models<i>; the figures they quote: the last test); lesson 7
asserts what its table shows by construction (the bytes each decode path reads, and that the fused path ran), not
its tokens/s, which depend on the machine's load.
The slowest lessons dominate the file's time: on a shared 2-core machine (load 4-5, 2026-12-01) the SmolLM2 half
took 738 s (lesson 5 221 s, 7 178 s, 8 164 s, 3 77 s, 9 49 s) and the Gemma half 498 s, far over CI's budget for
one file; the lessons themselves must get faster (issue 23) for this file to fit.

Run: python -m pytest tests/test_lessons_models.py -q
"""

from __future__ import annotations

import os
import re
import statistics

import pandas as pd
import pytest

from kvviz import quality
from kvviz.models import BUNDLED, bundled_installed
from kvviz.ui.compare import NEEDLES_PER_DEPTH
from kvviz.ui.strings import figures
from test_lessons_run import parts, run_lesson  # noqa: F401 (parts: the module-scoped fixture run_lesson takes)


MODELS = [name for name in BUNDLED if name == "smollm2-135m" or os.environ.get("CI", "").lower() != "true"]


@pytest.fixture(scope="module", params=MODELS)
def model(request) -> str:
    name = request.param
    if not bundled_installed(name):
        pytest.skip(f"{name} is not installed ({BUNDLED[name].install})")
    return name


@pytest.fixture(scope="module")
def lesson(parts, model):  # noqa: F811 (the imported fixture)
    """lesson(i): lesson i's outputs on `model`, run once per module and model."""
    done: dict[int, dict] = {}

    def get(i: int) -> dict:
        if i not in done:
            done[i] = run_lesson(parts, i, model)
        return done[i]

    return get


def _rows(table) -> dict[str, list]:
    values = table.values.tolist() if isinstance(table, pd.DataFrame) else table["data"]
    return {r[0]: r for r in values}


def _traces(fig) -> dict[str, object]:
    return {tr.name: tr for tr in fig.data}


def test_lesson1_k_has_outlier_channels_and_v_does_not(lesson):
    _, fig_kv, _, _, md = lesson(1)["run"]
    amax = {tr.name: list(tr.y) for tr in fig_kv.data if tr.name in ("K post-RoPE", "V")}
    ratio = {name: max(y) / statistics.median(y) for name, y in amax.items()}  # the opened layer and head
    assert ratio["K post-RoPE"] > 2 * ratio["V"], ratio
    n_k, n_v = map(int, re.search(r"K post-RoPE has (\d+) outlier channels, V has (\d+)", md).groups())
    assert n_k > 5 * n_v, md  # over all layers and heads


def test_lesson2_per_tensor_scales_fail_where_per_token_and_channel_do_not(lesson):
    _, _, fig_gran, _ = lesson(2)["run"]
    # each panel's subtitle: "rel. error E · B bits/value", in errors.py's _PANELS order
    errors = [float(re.search(r"rel\. error ([0-9.e+-]+)", a.text).group(1)) for a in fig_gran.layout.annotations]
    token, channel, tensor, rotated = errors
    assert tensor > max(token, channel) and rotated < tensor, errors
    assert "int4/tensor" in lesson(2)["anatomy"][-1]


def test_lesson3_k_is_sensitive_and_v_tolerant(lesson):
    _, table, _, _, _ = lesson(3)["run"]
    rows = _rows(table)
    assert rows["k8v4"][8] == rows["k4v8"][8], "the same cache bytes"
    assert rows["k8v4"][3] < rows["k4v8"][3], "4-bit K hurts more than 4-bit V (mean KL)"


def test_lesson4_e4m3_beats_e5m2(lesson):
    *_, md = lesson(4)["run"]
    k_error = {m.group(1): float(m.group(2)) for m in re.finditer(r"\| `(fp8_e[45]m[23])` \| ([0-9.]+) \|", md)}
    assert k_error["fp8_e4m3"] < k_error["fp8_e5m2"], k_error


def test_lesson5_per_tensor_int4_loses_the_needle_and_per_token_loses_fewer(lesson, model):
    fig, status = lesson(5)["needle"]
    rates = {name: [y / 100 for y in tr.y] for name, tr in _traces(fig).items()}
    assert set(rates) == {"baseline", "int4", "int4/tensor"}
    for name, per_depth in rates.items():  # each point a rate over NEEDLES_PER_DEPTH needles
        assert len(per_depth) == 5 and all(abs(r * NEEDLES_PER_DEPTH - round(r * NEEDLES_PER_DEPTH)) < 1e-6
                                           for r in per_depth), (name, per_depth)
    assert f"{NEEDLES_PER_DEPTH} needles at each of 5 depths" in status
    mean = {name: statistics.mean(v) for name, v in rates.items()}
    assert mean["baseline"] == 1.0, "the exact cache finds every needle: the test is fair"
    # SmolLM2 at 352 tokens: 7-8 of 15 under AVX-512 and AVX2 kernels (at 304 tokens 8-10: docs/benchmarks.md,
    # "Lesson 5 on any x86 CPU"); Gemma 3 270M: none
    assert mean["int4/tensor"] <= 0.6, mean
    assert mean["int4"] >= mean["int4/tensor"] + 0.3, mean


def test_lesson6_scales_eat_into_the_savings(lesson):
    text = " ".join(str(o) for o in lesson(6)["run"] if isinstance(o, str))
    for bits in ("5", "6"):
        assert f"× {bits} ÷ 8" in text, text[:400]


def test_lesson7_fused_reads_the_packed_bytes_and_unfused_copies_them(lesson, model):
    table, _, status, curve = lesson(7)["fused"]
    values = table.values.tolist()
    assert [r[0] for r in values[:2]] == ["DynamicCache", "StaticCache"]
    exact_mib = values[0][-1]  # read per step (MiB): the last column
    # the StaticCache holds what DynamicCache does (on Gemma 3 270M within 0.2%: their sliding-window layers differ
    # by a few tokens)
    assert abs(values[1][-1] - exact_mib) <= 0.01 * exact_mib and values[1][4] == "1.00×"
    for name in ("int4", "k8v4"):
        fused, unfused = [r for r in values if r[0] == name]
        assert fused[1].startswith("fused:"), fused  # the numba kernel really ran
        assert fused[-1] < exact_mib < unfused[-1], (fused, unfused, exact_mib)
    # speed against context: the recorded curves (SmolLM2: 1K to 8K, with the byte ceilings) and this run's points
    traces = {tr.name: tr for tr in curve.data}
    assert {"DynamicCache: this run", "StaticCache: this run", "int4: this run", "k8v4: this run"} <= set(traces)
    if quality.recorded_by_context(model) is None:
        assert "no recorded run" in status
        return
    assert "python -m kvviz bench --contexts" in status
    exact, int4, ceiling = traces["DynamicCache"], traces["int4"], traces["int4: ceiling"]
    assert list(exact.x) == [1024, 2048, 4096, 8192]
    assert all(c > e for c, e in zip(ceiling.y, exact.y))  # a 4-bit cache's ceiling is above the exact cache
    assert exact.y[-1] < exact.y[0]  # the exact cache slows as the context grows
    assert int4.y[-1] > exact.y[-1], "the recorded 8K run shows the smaller cache ahead"


PLAN8 = {"smollm2-135m": "1-3,10", "gemma-3-270m": "4"}  # lesson_note8 / lesson_models8
TOP8 = {"smollm2-135m": ["K of layer 1"], "gemma-3-270m": ["K of layer 5", "K of layer 11"]}  # the map's peaks


def test_lesson8_ends_in_a_plan_an_engine_serves(lesson, model):
    out = lesson(8)
    _, _, norms, summary = out["run"]
    assert len(norms) == {"smollm2-135m": 30, "gemma-3-270m": 18}[model]
    peaks = [line for line in summary.splitlines() if line.startswith("- **")]
    assert [p.split("**")[1] for p in peaks[: len(TOP8[model])]] == TOP8[model], peaks
    _, plan, md, steps = out["search"]
    layers = PLAN8[model]
    assert plan == f"vllm:int4_per_token_head; {layers}=fp16"
    skip = " ".join(str(i) for part in layers.split(",")
                    for i in (range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)))
    assert f"--kv-cache-dtype int4_per_token_head --kv-cache-dtype-skip-layers {skip}`" in md
    assert "No engine can express" not in md
    kl = steps.values[:, 4].tolist()
    chosen = steps.values[:, 2].tolist().index(plan)
    assert kl[chosen] < kl[0], "the fp16 layers lower the KL of the all-int4 start"


def test_lesson9_rotation_lowers_int4s_kl_and_tq_prod_pays_for_its_variance(lesson):
    table, _, _, _ = lesson(9)["rotation"]
    kl = {name: row[2] for name, row in _rows(table).items()}
    assert kl["int4/rot"] < kl["int4"] / 2, kl
    assert kl["vllm:turboquant_4bit_nc"] < kl["int4"], kl
    assert kl["tq_prod4"] > kl["tq_mse4"], kl


def test_lesson10_errors_pile_up_with_context(lesson):
    """Each format's mean KL over the last quarter of the positions against the first quarter's (the table's
    columns 2 and 3): int4's grows on both models, nvfp4's (its global scale fitted on the first chunk) grows most,
    by over half, and k8v4 stays over 10x below int4 at both ends."""
    status, kl_fig, _, table, _, gen_table, columns, _ = lesson(10)["run"]
    rows = _rows(table)
    assert list(rows) == ["int4", "k8v4", "nvfp4"], rows
    first, last = {n: r[2] for n, r in rows.items()}, {n: r[3] for n, r in rows.items()}
    assert last["int4"] > 1.05 * first["int4"], (first, last)
    assert last["nvfp4"] > 1.5 * first["nvfp4"], (first, last)
    assert last["nvfp4"] / first["nvfp4"] > last["int4"] / first["int4"], (first, last)
    assert all(10 * v < rows["int4"][i] for i, v in ((2, first["k8v4"]), (3, last["k8v4"]))), (first, last)
    assert {tr.name for tr in kl_fig.data} >= {"int4", "k8v4", "nvfp4"} and "1,024 tokens" in status
    assert [r[0] for r in gen_table.values.tolist()] == ["exact", "int4", "k8v4", "nvfp4"]


def test_lesson11_more_tokens_at_fewer_bits_beat_fewer_tokens_at_16(lesson, model):
    """At a quarter of the 16-bit cache: int4 on every token reads the continuation with less KL than 16 bits on a
    quarter of the tokens under either policy, and int2 on every token is several times worse than int4; on Gemma 3
    270M the 16-bit (and 8-bit) evicting candidates cannot reach the budget at all (its sliding layers keep every
    token of a 256-token context)."""
    _, _, table, status = lesson(11)["run"]
    rows = {r[0]: r for r in table.values.tolist()}  # spec -> [spec, how, kept %, KiB, % of 16-bit, KL, found]
    kl = {spec: r[5] for spec, r in rows.items()}
    evicting = [r for spec, r in rows.items() if " @ " in spec]
    assert evicting and all(r[4] <= 25.0 for r in evicting), "every fitted candidate within the budget"
    fp16 = [spec for spec in rows if spec.startswith("fp16 @ ")]
    if model == "gemma-3-270m":
        assert not fp16 and not any(spec.startswith("int8 @ ") for spec in rows), rows
        assert "fp16 @ streaming" in status and "fp16 @ snapkv" in status, "the tab says which could not fit"
    else:
        assert len(fp16) == 2, rows
        assert all(kl["int4"] < kl[spec] / 2 for spec in fp16), kl
    assert kl["int2"] > 3 * kl["int4"], kl  # SmolLM2 about 65x, Gemma 3 270M about 4x


def test_the_notes_figures_are_what_the_lessons_measure(lesson, model):
    """The figures the notes quote (kvviz/ui/strings/lesson_figures.json, written by benchmarks/lessons_figures.py)
    agree with this run of the lessons: counts, layers and plans exactly, KLs and ratios within 5%."""
    outputs = {i: lesson(i) for i in figures.MEASURED if model in figures.ONLY.get(i, (model,))}
    measured = figures.measure(outputs)
    assert len(measured) > 20, sorted(measured)
    bad = figures.disagreements(figures.load()[model], measured)
    assert not bad, f"{model}: run python benchmarks/lessons_figures.py --models {model}:\n" + "\n".join(bad)
