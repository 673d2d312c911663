"""The pipeline bubble read off a simulated timeline (`simdist bubble`).

bubble_fraction is simdist.plan.accounting's one definition, the same as `simdist run` reports: the share of
stage-time inside the pipeline phase in which a stage does no pipeline work (Narayanan et al. 2021,
arXiv:2104.04473 sec. 2.2: the bubble is the idle share of the pipeline's devices during a batch). A bare
pipeline's work is its compute ops; a send runs on its own stream and does not fill a bubble.
"""

from __future__ import annotations

from simdist.engine.graph import GraphTrace
from simdist.plan.opgraph import OpGraph
from simdist.report.step_metrics import bubble_fraction

__all__ = ["busy_time_s", "simulated_bubble"]


def busy_time_s(graph: OpGraph, trace: GraphTrace, *, stream: str = "compute") -> dict[int, float]:
    """Per rank, the seconds its ``stream`` track was running an op."""
    busy: dict[int, float] = {}
    for i, op in enumerate(graph.ops):
        if op.stream == stream:
            busy[op.rank] = busy.get(op.rank, 0.0) + (trace.end_s[i] - trace.start_s[i])
    return busy


def simulated_bubble(graph: OpGraph, trace: GraphTrace) -> float:
    """The bubble fraction over every rank that computes (one per stage); 0 for an empty timeline."""
    ranks = sorted({op.rank for op in graph.ops if op.stream == "compute"})
    if not ranks or trace.makespan_s <= 0:
        return 0.0
    return bubble_fraction(graph, trace, ranks)
