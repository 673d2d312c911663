"""Whether an op graph's collectives would ever share a link under `simdist.engine.graph.run_graph`, decided on
its uncontended timeline (`simdist.engine.uncontended.uncontended`) without running the engine.

The engine puts on its shared links (`simdist.engine.links.SharedLinks`) only the jobs whose links another track
may load too (`simdist.engine.graph._private_links`: the others run as plain timeouts of their alone time). If

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

import numpy as np

from simdist.engine.graph import GraphTrace, _private_links
from simdist.plan.opgraph import OpGraph

__all__ = ["contention_free"]

REL = 1e-12
"""Rounding tolerance, relative to the makespan (overlaps) or to a job's duration (alone times)."""


def contention_free(graph: OpGraph, alone: GraphTrace, capacity_of: Callable[[int], float],
                    capacities: Callable[[np.ndarray], np.ndarray] | None = None) -> bool:
    """True when the engine cannot slow any collective of ``graph`` down (see the module docstring); ``alone`` is
    its uncontended trace, ``capacity_of``/``capacities`` the link capacities `run_graph` would be given."""
    ops = graph.ops
    solo, share_of = _private_links(ops, capacity_of, capacities)
    tol = REL * max(alone.makespan_s, 0.0)
    busy: dict[int, list[tuple[float, float]]] = {}  # shared link -> the transfers on it, (start, end)
    cap_ok: dict[int, bool] = {}  # id(share) -> condition 1
    capacity: dict[int, float] = {}
    seen_sync: set[int] = set()
    for i, op in enumerate(ops):
        job = op.job
        if job is None:
            continue
        if not math.isnan(solo[i]):  # a plain timeout in the engine: of its uncontended duration?
            if abs(solo[i] - op.duration_s) > REL * max(abs(op.duration_s), 1e-300):
                return False
            continue
        if op.sync >= 0:
            if op.sync in seen_sync:  # one transfer per collective instance
                continue
            seen_sync.add(op.sync)
            share = share_of[(id(job), -1, "")]
        else:
            share = share_of[(id(job), op.rank, op.stream)]
        if share.bandwidth_s <= 0 or not share.links:
            continue  # a plain timeout in the engine too
        ok = cap_ok.get(id(share))
        if ok is None:
            rate = share.size / share.bandwidth_s
            for link, w in zip(share.links, share.weights, strict=True):
                c = capacity.get(link)
                if c is None:
                    c = capacity[link] = float(capacity_of(link))
                if c / w < rate:
                    rate = c / w
            engine_s = job.latency_s + share.size / rate
            ok = cap_ok[id(share)] = abs(engine_s - op.duration_s) <= REL * max(abs(op.duration_s), 1e-300)
        if not ok:
            return False
        start, end = alone.start_s[i] + job.latency_s, alone.end_s[i]
        for link in share.links:
            busy.setdefault(link, []).append((start, end))
    for spans in busy.values():
        if len(spans) < 2:
            continue
        spans.sort()
        last = spans[0][1]
        for start, end in spans[1:]:
            if start < last - tol:
                return False
            last = max(last, end)
    return True
