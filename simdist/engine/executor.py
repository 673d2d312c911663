"""Execute a plan: each transfer waits for its dependencies, pays its latency, then moves its bytes.

The bytes move as one flow sharing its links max-min fairly with the others (simdist.engine.links).
A transfer may also carry (simdist.collectives.plan.Transfer) a rate bound of its own,
``max_rate_Bps`` (a ring hop moves at its channel's bottleneck rate), and ``after``, the transfer
before it on the same connection: its bytes join the wire once that one's have arrived (in-order
delivery), its latency overlapping them.

The engine knows peers, routes, bytes and durations, nothing about what the data means. A
collective's time is when its last transfer lands, measured from when it was issued. Transfers are
driven by event callbacks rather than one SimPy process each, so a plan of 10^5 transfers costs
10^5 small callbacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from simdist.collectives.plan import Plan, Transfer
from simdist.engine.links import SharedLinks
from simdist.hardware.link import Route


@dataclass(slots=True)
class Trace:
    """Start and end time of every transfer of a plan (seconds from the start of the simulation)."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    makespan_s: float = 0.0


def rate_bound_Bps(transfer: Transfer) -> float:
    """The wire rate a transfer moves at most whatever its links allow (inf: none of its own)."""
    return transfer.max_rate_Bps


def wire_predecessor(transfer: Transfer) -> int:
    """Index of the transfer whose bytes this one's follow on their connection (-1: none)."""
    return transfer.after


def run_plan(env: simpy.Environment, net: SharedLinks, plan: Plan,
             path: Callable[[int, int], Route], trace: Trace | None = None):
    """SimPy process running ``plan``; ``path(src_peer, dst_peer)`` resolves routes."""
    issued = env.now
    if plan.base_latency_s:
        yield env.timeout(plan.base_latency_s)
    transfers = plan.transfers
    n = len(transfers)
    trace = trace if trace is not None else Trace()
    trace.starts = [0.0] * n
    trace.ends = [0.0] * n
    if n == 0:
        return env.now - issued
    waiting = [len(t.deps) for t in transfers]
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, t in enumerate(transfers):
        for d in t.deps:
            dependents[d].append(i)
    all_done = env.event()
    left = [n]
    proto_latency = plan.per_transfer_latency_s
    factor = plan.rate_factor
    finished = [False] * n
    queued: dict[int, int] = {}  # transfer -> the one whose bytes wait for it on their connection

    def finish(i: int) -> None:
        trace.ends[i] = env.now
        finished[i] = True
        follower = queued.pop(i, None)
        if follower is not None:
            flow(follower)
        for j in dependents[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                start(j)
        left[0] -= 1
        if left[0] == 0:
            all_done.succeed()

    def flow(i: int) -> None:
        t = transfers[i]
        # A protocol that carries less payload per wire byte puts nbytes / factor bytes on the wire.
        net.transfer(path(t.src, t.dst).links, t.nbytes / factor, rate_bound_Bps(t)).callbacks.append(
            lambda _ev, i=i: finish(i))

    def begin_flow(i: int) -> None:
        before = wire_predecessor(transfers[i])
        if before >= 0 and not finished[before]:
            queued[before] = i
        else:
            flow(i)

    def start(i: int) -> None:
        trace.starts[i] = env.now
        t = transfers[i]
        latency = path(t.src, t.dst).latency_s + proto_latency + t.extra_latency_s
        if latency > 0:
            env.timeout(latency).callbacks.append(lambda _ev, i=i: begin_flow(i))
        else:
            begin_flow(i)

    for i in range(n):
        if waiting[i] == 0:
            start(i)
    yield all_done
    trace.makespan_s = env.now - issued
    return env.now - issued
