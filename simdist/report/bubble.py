"""The pipeline bubble read off a simulated timeline.

bubble_fraction = idle / total stage-time over the pipeline span = 1 - sum(busy compute time of every stage)
/ (K x makespan) (Narayanan et al. 2021, arXiv:2104.04473 sec. 2.2: the bubble is the idle share of the
pipeline's devices during a batch). Only ``compute``-stream ops count as busy: a send overlaps compute on
its own stream and does not fill a bubble.
"""

from __future__ import annotations

from simdist.engine.graph import GraphTrace
from simdist.plan.opgraph import OpGraph

__all__ = ["busy_time_s", "simulated_bubble"]


def busy_time_s(graph: OpGraph, trace: GraphTrace, *, stream: str = "compute") -> dict[int, float]:
    """Per rank, the seconds its ``stream`` track was running an op."""
    busy: dict[int, float] = {}
    for i, op in enumerate(graph.ops):
        if op.stream == stream:
            busy[op.rank] = busy.get(op.rank, 0.0) + (trace.end_s[i] - trace.start_s[i])
    return busy


def simulated_bubble(graph: OpGraph, trace: GraphTrace, *, stream: str = "compute") -> float:
    """1 - busy / (ranks x makespan) over the ranks that run ``stream`` ops; 0 for an empty timeline."""
    busy = busy_time_s(graph, trace, stream=stream)
    if not busy or trace.makespan_s <= 0:
        return 0.0
    return 1.0 - sum(busy.values()) / (len(busy) * trace.makespan_s)
