"""What makes an op graph runnable, and the errors when it is not: every op a finite duration and dependencies
inside the graph (`check_graph`), and tracks that wait forever named (`ScheduleDeadlock`, `deadlock_error`). Both
engines that run a graph share them: the SimPy one (simdist.engine.graph) and the uncontended one
(simdist.engine.uncontended)."""

from __future__ import annotations

import math

import numpy as np

from simdist.errors import SimdistError
from simdist.plan.opgraph import OpGraph

__all__ = ["MAX_NAMED_TRACKS", "ScheduleDeadlock", "check_graph", "deadlock_error"]

MAX_NAMED_TRACKS = 4
"""Stuck tracks a deadlock error names (the rest counted)."""


class ScheduleDeadlock(SimdistError):
    """Tracks wait forever: an op waits for an op that can never finish (a cycle or contradictory orders)."""


def check_graph(graph: OpGraph) -> None:
    """Every op has a finite duration >= 0 and depends on ops of the graph (an int id in range); else a
    SimdistError naming the first op that does not. One pass of C-level checks over all ops, and the per-op loop
    below only where one fails (it finds which)."""
    ops = graph.ops
    n = len(ops)
    durations = [op.duration_s if op.job is None else op.job.latency_s + op.job.bandwidth_s for op in ops]
    deps = [d for op in ops for d in op.deps]
    try:
        values = np.asarray(durations, dtype=float)
        finite = bool(np.isfinite(values).all() and (values >= 0).all())
    except (TypeError, ValueError):  # not numbers
        finite = False
    if (finite and set(map(type, durations)) <= {int, float} and set(map(type, deps)) <= {int}
            and (not deps or (min(deps) >= 0 and max(deps) < n))):
        return
    for i, op in enumerate(ops):
        d = op.duration_s
        if op.job is not None:
            d = op.job.latency_s + op.job.bandwidth_s
        if not (isinstance(d, int | float) and math.isfinite(d) and d >= 0):
            raise SimdistError(
                f"op {i} '{op.name}' (rank {op.rank}, stream {op.stream}) has no finite duration ({d})",
                field=f"ops[{i}].duration_s", fix="price every op (comm ops via simdist.predict) before running")
        for dep in op.deps:
            if not (isinstance(dep, int) and 0 <= dep < n):
                raise SimdistError(f"op {i} '{op.name}' depends on op {dep}, which is not in the graph",
                                   field=f"ops[{i}].deps", fix=f"use op ids 0..{n - 1}")


def deadlock_error(graph: OpGraph, stuck: list[tuple[tuple[int, str], int]], end: list[float]) -> ScheduleDeadlock:
    ops = graph.ops
    parts = []
    for (rank, stream), i in stuck[:MAX_NAMED_TRACKS]:
        blockers = [d for d in ops[i].deps if math.isnan(end[d])]
        if not blockers and ops[i].sync >= 0:
            others = [j for j, o in enumerate(ops) if o.sync == ops[i].sync and j != i and math.isnan(end[j])]
            b = ops[others[0]] if others else ops[i]
            why = (f"waits for the other members of its collective (op {others[0] if others else i} '{b.name}' on "
                   f"rank {b.rank} stream {b.stream})")
        elif blockers:
            b = ops[blockers[0]]
            why = f"waits for op {blockers[0]} '{b.name}' on rank {b.rank} stream {b.stream}"
        else:  # pragma: no cover - a stuck track always waits for an unfinished dependency
            why = "waits"
        parts.append(f"rank {rank} stream {stream} stuck at op {i} '{ops[i].name}', {why}")
    more = f"; and {len(stuck) - MAX_NAMED_TRACKS} more tracks" if len(stuck) > MAX_NAMED_TRACKS else ""
    return ScheduleDeadlock(
        f"schedule deadlock: {len(stuck)} tracks wait forever: " + "; ".join(parts) + more, field="schedule",
        fix="order each track so that every op's dependencies can finish before it (no cycles)")
