"""Whether an op graph's collectives would ever share a link under `simdist.engine.graph.run_graph`, decided on
its uncontended timeline (`simdist.engine.uncontended.uncontended`) without running the engine.

The engine puts on its shared links (`simdist.engine.links.SharedLinks`) only the jobs whose links another track
may load too (`simdist.engine.private.private_links`: the others run as plain timeouts of their alone time). If

1. every job the engine runs as a plain timeout takes its priced ``duration_s``, and each job on the shared
   links, alone on the network, runs in exactly its uncontended time: its cap (its closed-form speed,
   folded with the links only its own track loads) is not above what any of its shared links offers it (capacity
   / its weight there), and its time with that cap is its priced ``duration_s``; and
2. on the uncontended timeline no two of these jobs' transfers (from the end of their latency to their end) are
   on a common shared link at the same time (beyond a rounding tolerance),

then the engine's timeline *is* the uncontended one: by induction over event times, while the two agree every
transfer is alone on its shared links, so max-min sharing gives it its alone rate, its cap (1), and it ends
when it ends uncontended; every other op takes its duration under the same execution rules (the two modules'
docstrings). The engine's step then equals the uncontended step up to rounding, and ``contention_s`` is 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, is_not

import numpy as np

from simdist.engine.graph import GraphTrace
from simdist.engine.private import private_links
from simdist.plan.opgraph import OpGraph

__all__ = ["Alone", "alone_durations", "contention_free", "departs", "engine_alone", "first_divergence"]

REL = 1e-12
"""Rounding tolerance, relative to the makespan (overlaps) or to a job's duration (alone times)."""


def contention_free(graph: OpGraph, alone: GraphTrace, capacity_of: Callable[[int], float],
                    capacities: Callable[[np.ndarray], np.ndarray] | None = None) -> bool:
    """True when the engine cannot slow any collective of ``graph`` down (see the module docstring); ``alone`` is
    its uncontended trace, ``capacity_of``/``capacities`` the link capacities `run_graph` would be given."""
    return first_divergence(graph, alone, capacity_of, capacities) == math.inf


@dataclass(frozen=True, slots=True)
class Alone:
    """What the engine does with each op of a graph while no other transfer shares its links (`engine_alone`)."""

    durations: list[float]
    """Per op, its time (`alone_durations`)."""
    moves: list[tuple[float, tuple[int, ...], int] | None]
    """Per op on the shared links: (its latency, those links, its collective instance or -1); else None."""
    private: tuple[list[float], dict]
    """`simdist.engine.private.private_links` of the graph (`run_graph`'s ``private``)."""


def engine_alone(graph: OpGraph, capacity_of: Callable[[int], float],
                 capacities: Callable[[np.ndarray], np.ndarray] | None = None) -> Alone:
    """Per op, the time the engine takes for it when no other transfer is on its links (`run_graph`'s arithmetic),
    and which ops move bytes on the shared links."""
    ops = graph.ops
    solo, share_of = private = private_links(ops, capacity_of, capacities)
    engine_s: dict[int, float] = {}  # id(share) -> its time alone
    capacity: dict[int, float] = {}
    times: list[float] = []
    moves: list[tuple[float, tuple[int, ...], int] | None] = []
    for i, op in enumerate(ops):
        job = op.job
        if job is None:
            times.append(op.duration_s)
            moves.append(None)
            continue
        if not math.isnan(solo[i]):  # a plain timeout in the engine
            times.append(solo[i])
            moves.append(None)
            continue
        share = share_of[(id(job), -1, "")] if op.sync >= 0 else share_of[(id(job), op.rank, op.stream)]
        t = engine_s.get(id(share))
        if t is None:
            if share.bandwidth_s <= 0 or not share.links:  # a plain timeout too
                t = job.latency_s + max(share.bandwidth_s, 0.0)
            else:
                rate = share.size / share.bandwidth_s  # its cap; then what each shared link offers it
                for link, w in zip(share.links, share.weights, strict=True):
                    c = capacity.get(link)
                    if c is None:
                        c = capacity[link] = float(capacity_of(link))
                    if c / w < rate:
                        rate = c / w
                t = job.latency_s + share.size / rate
            engine_s[id(share)] = t
        times.append(t)
        moves.append((job.latency_s, share.links, op.sync) if share.bandwidth_s > 0 and share.links else None)
    return Alone(times, moves, private)


def alone_durations(graph: OpGraph, capacity_of: Callable[[int], float],
                    capacities: Callable[[np.ndarray], np.ndarray] | None = None) -> list[float]:
    """Per op, the time the engine gives it while no other transfer shares its links: a compute op's duration, a
    job's on links only its own track loads its folded alone time, a job on the shared links its latency plus its
    bytes at the least of its cap and what each link offers it. Where it is not its priced ``duration_s`` (an op
    whose folded traffic loads a link more than its price assumed), the engine departs from the priced
    uncontended timeline although nothing contends; `simdist.engine.uncontended.uncontended` with these durations
    is the engine's timeline up to the first overlap on a shared link (`first_divergence`)."""
    return engine_alone(graph, capacity_of, capacities).durations


def departs(ops: list, times: list[float], durations: list[float] | None = None) -> np.ndarray:
    """Per op, whether its time in ``times`` (`alone_durations`) is not its duration (``durations``; None: its
    priced ``duration_s``) beyond the rounding tolerance: |time - duration| > REL x max(|duration|, 1e-300), in numpy
    (elementwise IEEE operations: the same booleans as the scalar expression; False where either is NaN)."""
    d = np.asarray(list(map(attrgetter("duration_s"), ops)) if durations is None else durations, dtype=float)
    return np.abs(np.asarray(times, dtype=float) - d) > REL * np.maximum(np.abs(d), 1e-300)


def first_divergence(graph: OpGraph, alone: GraphTrace, capacity_of: Callable[[int], float],
                     capacities: Callable[[np.ndarray], np.ndarray] | None = None,
                     durations: list[float] | None = None, engine: Alone | None = None) -> float:
    """The time up to which the engine's timeline of ``graph`` is ``alone`` (inf: the whole timeline), the graph's
    timeline (simdist.engine.uncontended) with ``durations`` (None: every op's priced ``duration_s``; or
    `alone_durations`).

    The induction of the module docstring, with each op's engine time alone in place of its priced duration,
    holds up to the first instant where one of its conditions fails: an op whose engine time alone is not its
    duration in ``alone`` starts (condition 1; never with `alone_durations`), or a transfer joins a shared link
    another one is still moving bytes on (condition 2). Up to it every op has its start and end in ``alone``, and a
    transfer under way moves at its alone rate, so the engine can be resumed from there
    (`simdist.engine.graph.run_graph`'s ``resume``) with the same result as run from 0. ``engine``: `engine_alone`
    of the graph and capacities, if already found.
    """
    ops = graph.ops
    engine = engine if engine is not None else engine_alone(graph, capacity_of, capacities)
    times, moves = engine.durations, engine.moves
    tol = REL * max(alone.makespan_s, 0.0)
    diverge = math.inf
    failing: set[int] = set()  # the jobs whose engine time alone is not their duration in ``alone`` (condition 1)
    if durations is not times:  # (``times`` themselves: condition 1 holds everywhere)
        job = np.fromiter(map(is_not, map(attrgetter("job"), ops), repeat(None)), dtype=bool, count=len(ops))
        bad = job & departs(ops, times, durations)
        for i in np.flatnonzero(bad).tolist():
            diverge = min(diverge, alone.start_s[i])
            failing.add(i)
    # the transfers (one per collective instance), each from the end of its latency to its end on its shared links
    seen_sync: set[int] = set()
    chosen: list[int] = []
    latencies: list[float] = []
    link_sets: list[tuple[int, ...]] = []
    for i, move in enumerate(moves):
        if move is None or i in failing:  # (a move is a job's)
            continue
        latency_s, links, sync = move
        if sync >= 0:
            if sync in seen_sync:
                continue
            seen_sync.add(sync)
        chosen.append(i)
        latencies.append(latency_s)
        link_sets.append(links)
    if not chosen:
        return diverge
    starts = np.asarray(alone.start_s, dtype=float)[chosen] + np.asarray(latencies, dtype=float)
    ends = np.asarray(alone.end_s, dtype=float)[chosen]
    counts = np.fromiter(map(len, link_sets), dtype=np.int64, count=len(link_sets))
    link = np.fromiter(chain.from_iterable(link_sets), dtype=np.int64, count=int(counts.sum()))
    start, end = np.repeat(starts, counts), np.repeat(ends, counts)
    order = np.lexsort((end, start, link))  # per shared link, its transfers by (start, end)
    link, start, end = link[order], start[order], end[order]
    bounds = np.flatnonzero(np.diff(link)) + 1
    # per link, the first transfer that starts before one ahead of it (in that order) has ended: the first overlap
    # there; the earliest of those (the per-link scan's min, however it is pruned)
    for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), len(link)], strict=True):
        if hi - lo < 2:
            continue
        ahead = np.maximum.accumulate(end[lo:hi - 1])
        hit = np.flatnonzero(start[lo + 1:hi] < ahead - tol)
        if len(hit):
            diverge = min(diverge, float(start[lo + 1 + hit[0]]))
    return diverge
