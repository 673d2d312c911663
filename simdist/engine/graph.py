"""Execute an op graph: one SimPy process per (rank, stream) track, ops in program order.

An op starts when its track has finished the op before it and every op in its ``deps`` has finished; it
then holds the track for ``duration_s``. The engine reads durations and dependencies only.

Cost: each op is one timeout plus, only when it has to wait, one event; finishing an op decrements a
counter per dependent (lists, no dicts), so 10^5 ops run in about a second. A dependency cycle, or two
tracks whose program orders contradict their dependencies, leaves processes waiting on events nobody
will trigger: SimPy runs out of events and returns, and `ScheduleDeadlock` names the stuck tracks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import simpy

from simdist.errors import SimdistError
from simdist.plan.opgraph import OpGraph

__all__ = ["GraphTrace", "ScheduleDeadlock", "run_graph"]

MAX_NAMED_TRACKS = 4


class ScheduleDeadlock(SimdistError):
    """Tracks wait forever: an op waits for an op that can never finish (a cycle or contradictory orders)."""


@dataclass(frozen=True, slots=True)
class GraphTrace:
    start_s: tuple[float, ...]
    """Per op id; NaN for an op that never ran."""
    end_s: tuple[float, ...]
    makespan_s: float


def _check(graph: OpGraph) -> None:
    n = len(graph.ops)
    for i, op in enumerate(graph.ops):
        d = op.duration_s
        if not (isinstance(d, int | float) and math.isfinite(d) and d >= 0):
            raise SimdistError(
                f"op {i} '{op.name}' (rank {op.rank}, stream {op.stream}) has no finite duration ({d})",
                field=f"ops[{i}].duration_s", fix="price every op (comm ops via simdist.predict) before running")
        for dep in op.deps:
            if not (isinstance(dep, int) and 0 <= dep < n):
                raise SimdistError(f"op {i} '{op.name}' depends on op {dep}, which is not in the graph",
                                   field=f"ops[{i}].deps", fix=f"use op ids 0..{n - 1}")


def run_graph(graph: OpGraph) -> GraphTrace:
    """Simulate ``graph``; start and end of every op, and the makespan (seconds from 0)."""
    _check(graph)
    ops = graph.ops
    n = len(ops)
    if n == 0:
        return GraphTrace((), (), 0.0)
    remaining = [len(op.deps) for op in ops]
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, op in enumerate(ops):
        for d in op.deps:
            dependents[d].append(i)
    waiting: list[simpy.Event | None] = [None] * n
    start = [math.nan] * n
    end = [math.nan] * n
    tracks = graph.tracks()
    position: dict[tuple[int, str], int] = dict.fromkeys(tracks, 0)
    env = simpy.Environment()

    def track(key: tuple[int, str], ids: list[int]):
        timeout = env.timeout
        for pos, i in enumerate(ids):
            position[key] = pos
            if remaining[i]:
                ev = waiting[i] = env.event()
                yield ev
            start[i] = env.now
            d = ops[i].duration_s
            if d > 0:
                yield timeout(d)
            end[i] = env.now
            for j in dependents[i]:
                left = remaining[j] - 1
                remaining[j] = left
                if not left and waiting[j] is not None:
                    waiting[j].succeed()
        position[key] = len(ids)

    for key, ids in tracks.items():
        env.process(track(key, ids))
    env.run()
    stuck = [(key, ids[position[key]]) for key, ids in tracks.items() if position[key] < len(ids)]
    if stuck:
        raise _deadlock(graph, stuck, end)
    return GraphTrace(tuple(start), tuple(end), max(end))


def _deadlock(graph: OpGraph, stuck: list[tuple[tuple[int, str], int]], end: list[float]) -> ScheduleDeadlock:
    ops = graph.ops
    parts = []
    for (rank, stream), i in stuck[:MAX_NAMED_TRACKS]:
        blockers = [d for d in ops[i].deps if math.isnan(end[d])]
        if blockers:
            b = ops[blockers[0]]
            why = f"waits for op {blockers[0]} '{b.name}' on rank {b.rank} stream {b.stream}"
        else:  # pragma: no cover - a stuck track always waits for an unfinished dependency
            why = "waits"
        parts.append(f"rank {rank} stream {stream} stuck at op {i} '{ops[i].name}', {why}")
    more = f"; and {len(stuck) - MAX_NAMED_TRACKS} more tracks" if len(stuck) > MAX_NAMED_TRACKS else ""
    return ScheduleDeadlock(
        f"schedule deadlock: {len(stuck)} tracks wait forever: " + "; ".join(parts) + more, field="schedule",
        fix="order each track so that every op's dependencies can finish before it (no cycles)")
