"""The fast path of the engine's link-sharing mechanism for plans without dependencies (fast-fidelity plans,
one-step direct plans): the same model and times as `simdist.engine.links.SharedLinks` under
`simdist.engine.executor.run_plan`, computed with numpy instead of one callback per transfer.

Declared equal (tests/test_links.py checks both on random dependency-free plans): every transfer pays its
latency first, then joins as one flow (weight 1 on every link of its route, no cap of its own) of
``nbytes / rate_factor`` wire bytes; whenever flows join or finish, rates are re-shared by the engine's one
solver (`simdist.engine.sharing.max_min_rates`); a flow is complete when what remains of it falls below
the same fraction of its size (``transfer.DONE_FRACTION``) or would take less time than the clock resolves.
Flow -> link incidence is built once, as CSR arrays, from the group's vectorised routes (`Group.paths`).

Same arithmetic as the engine: begin = base latency + (route latency + protocol latency + extra
latency); a flow moves no faster than its transfer's ``max_rate_Bps``; flows starting at one instant
join before one re-share; the next event is the earliest
join or finish. Differences are rounding only (within 1e-9 relative of the SimPy path): bytes left are
computed from the last rate change (not decremented at every event), and re-shares after departures
restart from where the leaving flows froze (see `fluid_finish_times`). Per-link byte counts are summed
in the order flows join the network, as `LinkLoad` does, and the dict lists links in that order.

Cost: one re-share per distinct event instant, over the flows at or above the lowest leaving
rate; a fast ring has one start instant and a handful of finish instants whatever its size.
"""

from __future__ import annotations

import numpy as np

from simdist.collectives.group import Group
from simdist.collectives.plan import Plan
from simdist.engine.executor import Trace
from simdist.engine.sharing import max_min_rates
from simdist.engine.transfer import DONE_FRACTION
from simdist.hardware.batch import link_capacities, segment_positions


def fluid_applicable(plan: Plan) -> bool:
    """Whether ``plan`` can run in the fluid solver: no transfer waits for another (dependencies or a
    predecessor on its connection)."""
    return all(not t.deps and t.after < 0 for t in plan.transfers)


def fluid_finish_times(begin: np.ndarray, nbytes: np.ndarray, indptr: np.ndarray, entries: np.ndarray,
                       capacity: np.ndarray, caps: np.ndarray | None = None) -> np.ndarray:
    """When each flow's last byte arrives.

    Flow ``f`` joins at ``begin[f]`` with ``nbytes[f]`` bytes over links ``entries[indptr[f]:indptr[f+1]]``
    (compact ids into ``capacity``, bytes/s); ``caps`` are optional per-flow rate bounds. A flow of no
    bytes ends when it begins. Rates are max-min fair among the flows present, recomputed at every
    instant a flow joins or finishes.

    When flows only leave, the re-share restarts progressive filling where it first froze a leaving
    flow: every flow frozen at a lower level keeps its rate, since the links of the leaving flows
    were not the tightest ones below that level (their fair share only grows when a flow leaves).
    Only the flows at or above the lowest leaving rate are shared again, over what the others leave
    of each link, which is what filling from scratch computes (up to rounding).
    """
    begin = np.asarray(begin, dtype=float)
    nbytes = np.asarray(nbytes, dtype=float)
    n = len(begin)
    ends = begin.copy()
    if n == 0:
        return ends
    sharing = _Sharing(indptr, entries, capacity, caps)
    moving = np.flatnonzero(nbytes > 0)
    # instants at which flows join, in time order; flows of one instant join together
    joins = moving[np.argsort(begin[moving], kind="stable")]
    join_times, join_starts = np.unique(begin[joins], return_index=True)
    join_bounds = np.append(join_starts, len(joins))
    threshold = nbytes * DONE_FRACTION
    # A flow's bytes left at time t: left_at_ref - rate x (t - ref), from the last time its rate changed
    ref = np.zeros(n)
    left_at_ref = nbytes.copy()
    rate = sharing.rate  # 0 for flows not on the network
    finish = np.full(n, np.inf)  # when the flow's bytes run out at its current rate
    settle = np.full(n, np.inf)  # when they fall below the done threshold
    on = np.zeros(n, dtype=bool)  # flows on the network
    count = 0
    k = 0
    while k < len(join_times) or count:
        finish_at = float(finish.min()) if count else np.inf
        join_at = float(join_times[k]) if k < len(join_times) else np.inf
        now = min(finish_at, join_at)
        if not np.isfinite(now):  # flows held at rate 0 forever (a link of no capacity)
            ends[on] = np.inf
            break
        new = np.zeros(0, dtype=np.int64)
        if join_at <= finish_at:
            new = joins[join_bounds[k]:join_bounds[k + 1]]
            k += 1
        # flows whose bytes left are within the done threshold or would take less time than the
        # clock resolves at ``now`` (as SharedLinks); infinite rates finish at once
        near = np.flatnonzero(settle <= now + 1e-9 * abs(now))
        left = left_at_ref[near] - rate[near] * (now - ref[near])
        with np.errstate(divide="ignore", invalid="ignore"):
            done = near[(left <= threshold[near]) | np.isinf(rate[near]) | (now + left / rate[near] <= now)]
        if done.size:
            ends[done] = now
            finish[done] = settle[done] = np.inf
            on[done] = False
            count -= len(done)
        if new.size:
            old = np.flatnonzero(on)
            left_at_ref[old] -= rate[old] * (now - ref[old])
            ref[old] = now
            ref[new] = now
            on[new] = True
            count += len(new)
            changed = np.flatnonzero(on)
            sharing.share_all(changed, done)
        elif done.size and count:
            changed = sharing.release(done, on)
            left_at_ref[changed] -= sharing.old_rate * (now - ref[changed])
            ref[changed] = now
        else:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            finish[changed] = now + left_at_ref[changed] / rate[changed]
            settle[changed] = now + (left_at_ref[changed] - threshold[changed]) / rate[changed]
    return ends


class _Sharing:
    """Max-min rates of the active flows of a fixed flow -> link incidence, re-shared incrementally."""

    def __init__(self, indptr: np.ndarray, entries: np.ndarray, capacity: np.ndarray,
                 caps: np.ndarray | None) -> None:
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.entries = np.asarray(entries, dtype=np.int64)
        self.hops = np.diff(self.indptr)
        self.capacity = np.asarray(capacity, dtype=float)
        n = len(self.hops)
        self.caps = np.full(n, np.inf) if caps is None else np.asarray(caps, dtype=float)
        self.rate = np.zeros(n)
        self.old_rate = np.zeros(0)  # rates before the last release, of the flows it re-shared
        self.used = np.zeros(len(self.capacity))  # sum of the active flows' rates on each link

    def _links(self, flows: np.ndarray) -> np.ndarray:
        return self.entries[segment_positions(self.indptr[flows], self.hops[flows])]

    def _load(self, flows: np.ndarray, links: np.ndarray | None = None) -> np.ndarray:
        links = self._links(flows) if links is None else links
        return np.bincount(links, weights=np.repeat(self.rate[flows], self.hops[flows]), minlength=len(self.capacity))

    def _share(self, flows: np.ndarray, free: np.ndarray, links: np.ndarray) -> None:
        """Max-min rates of ``flows`` (crossing ``links``) over links with ``free`` capacity left by the others."""
        present = np.bincount(links, minlength=len(self.capacity)) > 0
        compact = (np.cumsum(present) - 1)[links]  # links renumbered densely, in id order
        self.rate[flows] = max_min_rates(compact, self.hops[flows], free[present], self.caps[flows])

    def share_all(self, active: np.ndarray, gone: np.ndarray) -> None:
        """From scratch (flows joined); ``gone`` left the network."""
        self.rate[gone] = 0.0
        links = self._links(active)
        self._share(active, self.capacity, links)
        self.used = self._load(active, links)

    def release(self, done: np.ndarray, on: np.ndarray) -> np.ndarray:
        """``done`` left; ``on`` marks the flows still there. Returns the flows re-shared (their
        previous rates in ``old_rate``)."""
        lowest = self.rate[done].min()
        self.used -= self._load(done)
        self.rate[done] = 0.0
        # flows frozen below the lowest leaving level keep their rates (see fluid_finish_times);
        # flows off the network have rate 0
        again = np.flatnonzero(on & (self.rate >= lowest * (1.0 - 1e-9)))
        self.old_rate = self.rate[again]
        if again.size:
            links = self._links(again)
            self.used -= self._load(again, links)
            np.maximum(self.used, 0.0, out=self.used)
            self._share(again, np.maximum(self.capacity - self.used, 0.0), links)
            self.used += self._load(again, links)
        return again


def run_fluid(plan: Plan, group: Group) -> tuple[float, dict[int, float], Trace]:
    """Completion time, bytes per link and trace of a dependency-free ``plan`` alone on the network,
    as `simdist.engine.simulate.simulate` reports them from the SimPy engine."""
    transfers = plan.transfers
    n = len(transfers)
    base = plan.base_latency_s
    start = base if base else 0.0
    trace = Trace(starts=[start] * n, ends=[start] * n, makespan_s=start)
    if n == 0:
        return start, {}, trace
    src = np.fromiter((t.src for t in transfers), dtype=np.int64, count=n)
    dst = np.fromiter((t.dst for t in transfers), dtype=np.int64, count=n)
    payload = np.fromiter((t.nbytes for t in transfers), dtype=float, count=n)
    extra = np.fromiter((t.extra_latency_s for t in transfers), dtype=float, count=n)
    routes = group.paths(src, dst)
    latency = routes.latency_s + plan.per_transfer_latency_s + extra
    begin = np.where(latency > 0, start + latency, start)
    wire = payload / plan.rate_factor
    link_ids, compact = np.unique(routes.links, return_inverse=True)
    compact = compact.reshape(-1)
    capacity = link_capacities(group.topology, link_ids)
    caps = np.fromiter((t.max_rate_Bps for t in transfers), dtype=float, count=n)  # as the engine's flow caps
    ends = fluid_finish_times(begin, wire, routes.indptr, compact, capacity, caps)
    trace.ends = ends.tolist()
    trace.makespan_s = float(ends.max())
    return trace.makespan_s, _link_bytes(begin, latency > 0, wire, routes.indptr, routes.links), trace


def _link_bytes(begin: np.ndarray, delayed: np.ndarray, wire: np.ndarray, indptr: np.ndarray,
                links: np.ndarray) -> dict[int, float]:
    """Wire bytes per link, accumulated (and keyed) in the order flows join, as `LinkLoad` does:
    by begin time; at one instant, transfers without latency (joined while the plan starts) first,
    then by transfer index."""
    moving = np.flatnonzero(wire > 0)
    order = moving[np.lexsort((moving, delayed[moving], begin[moving]))]
    hops = np.diff(indptr)[order]
    seq = links[segment_positions(indptr[order], hops)]
    if seq.size == 0:
        return {}
    ids, first, inverse = np.unique(seq, return_index=True, return_inverse=True)
    sums = np.bincount(inverse.reshape(-1), weights=np.repeat(wire[order], hops), minlength=len(ids))
    by_first = np.argsort(first, kind="stable")
    return dict(zip(ids[by_first].tolist(), sums[by_first].tolist(), strict=True))
