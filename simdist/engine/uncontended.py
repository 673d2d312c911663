"""An op graph's timeline without link sharing: every op takes its own (uncontended) ``duration_s``.

The same execution rules as `simdist.engine.graph.run_graph` (an op starts when the op before it on its (rank,
stream) track and every op in its ``deps`` have finished; ops with one ``sync`` id start together, when all of
them are ready), but no collective slows another down: a longest-path pass over the graph, no SimPy. The engine's
step minus this one is what contention added (simdist.predict reports it), and the closed form
(simdist.analytic.step) must equal it exactly.

The pass goes through the ops in id order (program order, so most find what they wait for timed already) and times
each op whose predecessors are all timed; one that waits for an op not timed yet is set aside on that op and tried
again when it is timed. The members of a sync group start at the latest time any of them is ready, once all are.
An op that waits, directly or through others, for itself (a cycle) or for such an op is never timed (NaN): the
graph deadlocks.
"""

from __future__ import annotations

import math
from itertools import pairwise

from simdist.engine.graph import GraphTrace, _check, _deadlock
from simdist.plan.opgraph import OpGraph

__all__ = ["uncontended", "uncontended_pair"]


def uncontended(graph: OpGraph, *, checked: bool = False, durations: list[float] | None = None) -> GraphTrace:
    """Start and end of every op with uncontended durations (see the module docstring); ``checked``: the graph
    has been checked already (`simdist.engine.graph.run_graph` ran on it). ``durations``: per op, instead of its
    ``duration_s`` (`simdist.engine.contention.alone_durations`: the engine's times alone)."""
    return _timelines(graph, checked, durations, None)[0]


def uncontended_pair(graph: OpGraph, durations: list[float], *, checked: bool = False
                     ) -> tuple[GraphTrace, GraphTrace]:
    """`uncontended` of ``graph`` with its ops' ``duration_s`` and with ``durations``, in one pass (the order in
    which ops are timed depends on the graph only, so both timelines are read off the same walk); each equal to
    its own `uncontended` call."""
    first, second = _timelines(graph, checked, None, durations)
    assert second is not None
    return first, second


def _timelines(graph: OpGraph, checked: bool, durations: list[float] | None, other: list[float] | None
               ) -> tuple[GraphTrace, GraphTrace | None]:
    if not checked:
        _check(graph)
    ops = graph.ops
    n = len(ops)
    duration = [op.duration_s for op in ops] if durations is None else durations
    if n == 0:
        return GraphTrace((), (), 0.0), (None if other is None else GraphTrace((), (), 0.0))
    # Kahn's order: an op is timed once every predecessor (the op before it on its track, its deps) has ended
    waiting = [len(op.deps) for op in ops]
    dependents: list[list[int]] = [[] for _ in range(n)]
    groups: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        for d in op.deps:
            dependents[d].append(i)
        if op.sync >= 0:
            groups.setdefault(op.sync, []).append(i)
    after = [-1] * n  # the next op on the same track
    tracks = graph.tracks()
    for ids in tracks.values():
        for a, b in pairwise(ids):
            after[a] = b
            waiting[b] += 1
    sync = [op.sync for op in ops]
    ready = [0.0] * n  # the latest end of an op's predecessors so far
    start = [math.nan] * n
    end = [math.nan] * n
    arrived: dict[int, int] = {}
    todo = [i for i in range(n) if waiting[i] == 0]
    # one walk times both (without ``other``: the first twice, at about the cost of once; the copy is dropped)
    second_durations = duration if other is None else other
    ready2 = [0.0] * n
    start2 = [math.nan] * n
    end2 = [math.nan] * n
    while todo:
        i = todo.pop()
        g = sync[i]
        if g < 0:
            members: tuple[int, ...] | list[int] = (i,)
            t0 = ready[i]
            u0 = ready2[i]
        else:
            arrived[g] = arrived.get(g, 0) + 1
            members = groups[g]
            if arrived[g] < len(members):
                continue
            t0 = max(ready[j] for j in members)
            u0 = max(ready2[j] for j in members)
        for j in members:
            start[j] = t0
            e = end[j] = t0 + duration[j]
            start2[j] = u0
            f = end2[j] = u0 + second_durations[j]
            for k in dependents[j]:
                if e > ready[k]:
                    ready[k] = e
                if f > ready2[k]:
                    ready2[k] = f
                waiting[k] -= 1
                if not waiting[k]:
                    todo.append(k)
            k = after[j]
            if k >= 0:
                if e > ready[k]:
                    ready[k] = e
                if f > ready2[k]:
                    ready2[k] = f
                waiting[k] -= 1
                if not waiting[k]:
                    todo.append(k)
    second = None if other is None else GraphTrace(tuple(start2), tuple(end2), max(end2))
    if any(math.isnan(e) for e in end):
        position = {key: next((p for p, i in enumerate(ids) if math.isnan(end[i])), len(ids))
                    for key, ids in tracks.items()}
        stuck = [(key, ids[position[key]]) for key, ids in tracks.items() if position[key] < len(ids)]
        raise _deadlock(graph, stuck, end)
    return GraphTrace(tuple(start), tuple(end), max(end)), second
