"""kvviz's KLD beside an engine's, per format: the rows of the app's engine view and of
`python -m kvviz engines --with-kvviz`, from the two {spec: stats} results (kvviz.engines.simulate.kld and
kvviz.engines.llamacpp.run, each against its own baseline; stats keyed as kvviz.metrics.STAT_KEYS).

    ids, theirs = llamacpp.run(["q8_0", "q4_0"], tokens=128)
    rows = side_by_side(["q8_0", "q4_0"], simulate.kld(["q8_0", "q4_0"], ids), theirs)
    rows[0].kvviz_mean, rows[0].engine_mean           # nats per token
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineRow:
    """One format: mean and 99th-percentile KLD (nats per token) and the fraction of positions whose top token
    agrees with the baseline's, as kvviz simulates it and as the engine measures it; engine: which engine and
    release ran; rotation: the engine's K/V rotation ("" when it has none to report)."""

    format: str
    kvviz_mean: float
    kvviz_p99: float
    kvviz_same_top: float
    engine_mean: float
    engine_p99: float
    engine_same_top: float
    engine: str
    rotation: str


def side_by_side(specs: list[str], ours: dict[str, dict], theirs: dict[str, dict]) -> list[EngineRow]:
    """One EngineRow per spec, in the order given, from kvviz's and the engine's {spec: stats}."""
    return [EngineRow(format=s, kvviz_mean=ours[s]["mean"], kvviz_p99=ours[s]["p99"],
                      kvviz_same_top=ours[s]["same_top_p"], engine_mean=theirs[s]["mean"],
                      engine_p99=theirs[s]["p99"], engine_same_top=theirs[s]["same_top_p"],
                      engine=theirs[s]["engine"], rotation=theirs[s].get("rotation", "")) for s in specs]
