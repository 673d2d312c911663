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
from collections.abc import Sequence
from itertools import chain

import numpy as np

from simdist.engine.graph import GraphTrace
from simdist.engine.graph_checks import check_graph, deadlock_error
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
        check_graph(graph)
    ops = graph.ops
    n = len(ops)
    duration = [op.duration_s for op in ops] if durations is None else durations
    if n == 0:
        return GraphTrace((), (), 0.0), (None if other is None else GraphTrace((), (), 0.0))
    # Kahn's order: an op is timed once every predecessor (the op before it on its track, its deps) has ended.
    # Who waits for whom, in numpy: per op its successors (``successors[first[i]:first[i + 1]]``: its dependents,
    # then the next op on its track) and how many predecessors it waits for (``waiting``)
    deps = [op.deps for op in ops]
    num_deps = np.fromiter(map(len, deps), dtype=np.int64, count=n)
    flat = np.fromiter(chain.from_iterable(deps), dtype=np.int64, count=int(num_deps.sum()))
    tracks = graph.tracks()
    on_tracks = [np.asarray(ids, dtype=np.int64) for ids in tracks.values()]
    source = np.concatenate([flat, *(ids[:-1] for ids in on_tracks)])
    target = np.concatenate([np.repeat(np.arange(n, dtype=np.int64), num_deps), *(ids[1:] for ids in on_tracks)])
    order = np.argsort(source, kind="stable")  # (any order of an op's successors times the same)
    successors = target[order].tolist()
    bounds = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(source, minlength=n), out=bounds[1:])
    first = bounds.tolist()
    waiting_of = np.bincount(target, minlength=n)
    waiting = waiting_of.tolist()
    todo = np.flatnonzero(waiting_of == 0).tolist()
    sync = [op.sync for op in ops]
    groups: dict[int, list[int]] = {}
    if max(sync) >= 0:
        for i, g in enumerate(sync):
            if g >= 0:
                groups.setdefault(g, []).append(i)
    second = duration if other is None else other  # (without ``other``: the first twice; the copy is dropped)
    ready = [0.0] * n  # the latest end of an op's predecessors so far
    ready2 = [0.0] * n
    start = [math.nan] * n
    end = [math.nan] * n
    start2 = [math.nan] * n
    end2 = [math.nan] * n
    arrived: dict[int, int] = {}
    pop, push = todo.pop, todo.append
    while todo:
        i = pop()
        g = sync[i]
        if g < 0:
            members: Sequence[int] = (i,)
            t, u = ready[i], ready2[i]
        else:
            arrived[g] = arrived.get(g, 0) + 1
            members = groups[g]
            if arrived[g] < len(members):
                continue
            t = max(ready[j] for j in members)
            u = max(ready2[j] for j in members)
        for j in members:
            start[j] = t
            e = end[j] = t + duration[j]
            start2[j] = u
            f = end2[j] = u + second[j]
            for k in successors[first[j]:first[j + 1]]:
                if e > ready[k]:
                    ready[k] = e
                if f > ready2[k]:
                    ready2[k] = f
                w = waiting[k] - 1
                waiting[k] = w
                if not w:
                    push(k)
    isnan = math.isnan
    second_trace = None if other is None else GraphTrace(tuple(start2), tuple(end2), max(end2))
    if any(map(isnan, end)):
        position = {key: next((p for p, i in enumerate(ids) if math.isnan(end[i])), len(ids))
                    for key, ids in tracks.items()}
        stuck = [(key, ids[position[key]]) for key, ids in tracks.items() if position[key] < len(ids)]
        raise deadlock_error(graph, stuck, end)
    return GraphTrace(tuple(start), tuple(end), max(end)), second_trace
