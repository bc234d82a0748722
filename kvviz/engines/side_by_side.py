"""kvviz's KLD beside an engine's, per format: the rows of the app's engine view, from three {spec: stats}
results, each against its own baseline (stats keyed as kvviz.metrics.STAT_KEYS): kvviz's bare format
(kvviz.engines.simulate.kvviz_kld), the engine's own (kvviz.engines.llamacpp.run) and kvviz's simulation of the engine's
arithmetic (kvviz.engines.simulate.llamacpp_kld, with the engine run's rotation setting).

    ids, theirs = llamacpp.run(["q8_0", "q4_0"], tokens=128, rotate=False)
    rows = side_by_side(["q8_0", "q4_0"], simulate.kvviz_kld(["q8_0", "q4_0"], ids), theirs,
                        simulate.llamacpp_kld(["q8_0", "q4_0"], ids, rotate=False))
    rows[0].kvviz_mean, rows[0].engine_mean, rows[0].sim_mean    # nats per token
    rows[0].sim_ratio                                            # sim_mean / engine_mean
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineRow:
    """One format: mean and 99th-percentile KLD (nats per token) and the fraction of positions whose top token
    agrees with the baseline's, as kvviz simulates it and as the engine measures it; engine: which engine and
    release ran; rotation: the engine's K/V rotation ("" when it has none to report); sim_mean: kvviz's simulation
    of the engine's arithmetic, its mean KLD; sim_ratio: sim_mean / engine_mean (inf when the engine measured 0 and
    the simulation did not, 1.0 when both are 0)."""

    format: str
    kvviz_mean: float
    kvviz_p99: float
    kvviz_same_top: float
    engine_mean: float
    engine_p99: float
    engine_same_top: float
    engine: str
    rotation: str
    sim_mean: float
    sim_ratio: float


def side_by_side(specs: list[str], ours: dict[str, dict], theirs: dict[str, dict],
                 simulated: dict[str, dict]) -> list[EngineRow]:
    """One EngineRow per spec, in the order given, from kvviz's bare formats', the engine's and kvviz's simulation
    of the engine's {spec: stats}."""
    return [EngineRow(format=s, kvviz_mean=ours[s]["mean"], kvviz_p99=ours[s]["p99"],
                      kvviz_same_top=ours[s]["same_top_p"], engine_mean=theirs[s]["mean"],
                      engine_p99=theirs[s]["p99"], engine_same_top=theirs[s]["same_top_p"],
                      engine=theirs[s]["engine"], rotation=theirs[s].get("rotation", ""),
                      sim_mean=simulated[s]["mean"], sim_ratio=_ratio(simulated[s]["mean"], theirs[s]["mean"]))
            for s in specs]


def _ratio(sim: float, engine: float) -> float:
    if engine == 0:
        return 1.0 if sim == 0 else float("inf")
    return sim / engine
