"""Two op graphs whose engine runs coincide up to a time, so that one is resumed from the other's state there.

A fast-forward sample of M micro-batches (simdist.plan.fastforward) runs what the sample of M + c micro-batches
runs until its own cool-down departs from it: the same ops on every track, in the same order, with the same
dependencies and the same priced jobs. `simdist.engine.graph.run_graph` records the larger run's state at that
time (per transfer under way, its bytes left) and resumes the smaller from it, so the smaller costs SimPy events
for its tail only.

Why the two runs agree up to the cut `shared_prefix` returns. Call an op of either graph *common* when it sits at
the same place of its track (rank, stream, position) in both and is the same op there: name, kind, engine time
alone, how the engine runs it (a plain timeout, or a transfer of the same links, weights, bytes and cap), its
dependencies (by place) and its collective's members (by place). On each track the ops before the first one that
is not common are the track's prefix. The cut is the earliest start, on the engine-alone timeline of its graph
(simdist.engine.contention.alone_durations), of a track's first op past its prefix, over both graphs. The engine
never starts an op earlier than that timeline does (every op takes at least its time alone: a transfer's max-min
rate is at most its rate alone, and an op starts when its track and dependencies are done, a max of ends), so
before the cut each run executes prefix ops only. Those are the same ops in both graphs with the same
dependencies, so by induction over event times both runs start, share and end them identically up to the cut (the
engine is deterministic, and max-min rates depend on the set of transfers under way only). From the cut on, the
smaller run starts from the larger's state: ops ended keep their times, a timeout under way its end, a transfer
under way its bytes left. Ties at the cut and re-share orders may differ in the last bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simdist.engine.contention import Alone
from simdist.engine.graph import GraphTrace
from simdist.plan.opgraph import OpGraph

__all__ = ["EARLIER", "Prefix", "resumed_trace", "shared_prefix"]

EARLIER = 1e-9
"""The cut is this much earlier (relative) than the earliest engine-alone start of an op that differs."""


@dataclass(frozen=True, slots=True)
class Prefix:
    """Up to ``cut_s`` the engine runs of two graphs coincide (module docstring)."""

    cut_s: float
    """0: nothing shared (no gain); inf: the same graph."""
    to_big: list[int]
    """Per op of the smaller graph: the same op of the larger one, -1 past its track's prefix."""


def _places(graph: OpGraph, order: dict[tuple[int, str], int]
            ) -> tuple[dict[tuple[int, str], list[int]], list[int]]:
    """The graph's tracks, and per op its place as one integer: track number (``order``) x 2^32 + position."""
    tracks = graph.tracks()
    where = np.full(len(graph.ops), -1, dtype=np.int64)
    for key, ids in tracks.items():
        where[np.asarray(ids, dtype=np.int64)] = (order[key] << 32) + np.arange(len(ids), dtype=np.int64)
    return tracks, where.tolist()


def _members(graph: OpGraph, where: list[int]) -> dict[int, tuple[int, ...]]:
    groups: dict[int, list[int]] = {}
    for i, op in enumerate(graph.ops):
        if op.sync >= 0:
            groups.setdefault(op.sync, []).append(where[i])
    return {sync: tuple(sorted(places)) for sync, places in groups.items()}


class _View:
    """What `shared_prefix` compares of one graph's ops (module docstring: *common*)."""

    __slots__ = ("_members", "alone", "graph", "ops", "share_of", "solo", "where")

    def __init__(self, graph: OpGraph, alone: Alone, where: list[int]) -> None:
        self.graph = graph
        self.ops = graph.ops
        self.alone = alone.durations
        self.solo, self.share_of = alone.private
        self.where = where
        self._members: dict[int, tuple[int, ...]] | None = None

    def members(self, sync: int) -> tuple[int, ...]:
        """The places of collective instance ``sync``'s members, in order (found on the first call)."""
        if self._members is None:
            self._members = _members(self.graph, self.where)
        return self._members[sync]

    def share(self, i: int) -> object:
        """How the engine runs job op ``i``: its plain duration, or (latency, what the shared links see of it)."""
        op = self.ops[i]
        solo = self.solo[i]
        if not math.isnan(solo):
            return solo
        job = op.job
        assert job is not None
        key = (id(job), -1, "") if op.sync >= 0 else (id(job), op.rank, op.stream)
        return job.latency_s, self.share_of[key]


def _common_length(a: _View, ids: list[int], b: _View, others: list[int]) -> int:
    """How many ops from the start of two tracks (op ids ``ids`` of ``a``, ``others`` of ``b``) are the same op at
    the same place (module docstring): each pair compared in the order of the cheapest tests first."""
    ops_a, ops_b, alone_a, alone_b = a.ops, b.ops, a.alone, b.alone
    where_a, where_b = a.where, b.where
    solo_a, solo_b = a.solo, b.solo
    share_of_a, share_of_b = a.share_of, b.share_of
    equal: dict[tuple[int, int], bool] = {}
    n = min(len(ids), len(others))
    for p in range(n):
        i, j = ids[p], others[p]
        x, y = ops_a[i], ops_b[j]
        if x.name != y.name or x.kind != y.kind or alone_a[i] != alone_b[j]:
            return p
        dx, dy = x.deps, y.deps
        if dx or dy:  # the same places, in order (one dep the most common: compared alone)
            num = len(dx)
            if num != len(dy):
                return p
            if num == 1:
                if where_a[dx[0]] != where_b[dy[0]]:
                    return p
            else:
                for u, v in zip(dx, dy, strict=True):
                    if where_a[u] != where_b[v]:
                        return p
        if (x.job is None) != (y.job is None) or (x.sync >= 0) != (y.sync >= 0):
            return p
        if x.job is not None:
            sa, sb = solo_a[i], solo_b[j]
            if sa == sa and sb == sb:  # both plain timeouts (not NaN): `_View.share` is the duration
                if sa != sb:
                    return p
            elif sa == sa or sb == sb:  # one a float, the other a tuple
                return p
            else:  # `_View.share` of each: (latency, `Share`), compared as tuples compare (identity, then ==)
                la, lb = x.job.latency_s, y.job.latency_s  # type: ignore[union-attr]
                if la is not lb and la != lb:
                    return p
                share_a = share_of_a[(id(x.job), -1, "") if x.sync >= 0 else (id(x.job), x.rank, x.stream)]
                share_b = share_of_b[(id(y.job), -1, "") if y.sync >= 0 else (id(y.job), y.rank, y.stream)]
                if share_a is not share_b:
                    pair = (id(share_a), id(share_b))
                    same = equal.get(pair)
                    if same is None:
                        same = equal[pair] = share_a == share_b  # (many ops share the two: compared once)
                    if not same:
                        return p
        if x.sync >= 0 and a.members(x.sync) != b.members(y.sync):
            return p
    return n


def shared_prefix(small: OpGraph, small_timeline: GraphTrace, small_alone: Alone,
                  big: OpGraph, big_timeline: GraphTrace, big_alone: Alone) -> Prefix:
    """The time up to which the engine runs of ``small`` and ``big`` coincide, and which ops they share (module
    docstring); each graph with its engine-alone timeline and `simdist.engine.contention.engine_alone`."""
    to_big = [-1] * len(small.ops)
    if set(small.tracks()) != set(big.tracks()):
        return Prefix(0.0, to_big)
    order = {key: n for n, key in enumerate(small.tracks())}
    small_tracks, small_where = _places(small, order)
    big_tracks, big_where = _places(big, order)
    a, b = _View(small, small_alone, small_where), _View(big, big_alone, big_where)
    cut = math.inf
    for key, ids in small_tracks.items():
        others = big_tracks[key]
        p = _common_length(a, ids, b, others)
        for i, j in zip(ids[:p], others[:p], strict=True):
            to_big[i] = j
        if p < len(ids):
            cut = min(cut, small_timeline.start_s[ids[p]])
        if p < len(others):
            cut = min(cut, big_timeline.start_s[others[p]])
    # the engine may start an op that waits for nothing contended a rounding error before the timeline does: shave
    # the cut by far more than that (EARLIER relative), far less than anything the resumption saves
    return Prefix(cut * (1.0 - EARLIER) if cut < math.inf else cut, to_big)


def resumed_trace(prefix: Prefix, big_trace: GraphTrace, recorded: dict[int, float]
                  ) -> tuple[GraphTrace, float, dict[int, float]] | None:
    """`simdist.engine.graph.run_graph`'s ``resume`` for the smaller graph: the larger run's times of the shared ops
    (NaN elsewhere), the cut, and the bytes left at the cut of the transfers under way (``recorded``: the larger
    run's `record` at the cut, by its op ids). None where the larger run had an op that is not shared under way at
    the cut or ended by it (the premise of the module docstring fails: simulate the smaller graph on its own)."""
    start = [math.nan] * len(prefix.to_big)
    end = [math.nan] * len(prefix.to_big)
    back: dict[int, int] = {}
    for i, j in enumerate(prefix.to_big):
        if j >= 0:
            start[i], end[i] = big_trace.start_s[j], big_trace.end_s[j]
            if j in recorded:
                back[j] = i
    if len(back) != len(recorded):
        return None
    shared = set(prefix.to_big)
    cut = prefix.cut_s
    if any(s < cut and j not in shared for j, s in enumerate(big_trace.start_s)):
        return None
    return GraphTrace(tuple(start), tuple(end), math.nan), cut, {back[j]: left for j, left in recorded.items()}
