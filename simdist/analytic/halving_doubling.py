"""Closed form of recursive halving / doubling (the plans of simdist.collectives.halving_doubling).

Textbook form (Thakur, Rabenseifner & Gropp 2005, sec. 4.1, Rabenseifner's all_reduce): with
P' = 2^m peers, 2 log2(P') alpha + 2 (P'-1)/P' S/B, i.e. the sum over the log2(P') halving steps of
(alpha + S d / (P' B)) for d = P'/2 .. 1, and the same for doubling; P not a power of two adds the
fold and unfold steps, alpha + S/B each (the whole buffer between the paired peers).

Here each step's message of n bytes from a to b takes its route's latency (plus the protocol's) and
n over its share of the busiest link it crosses in that step (the step's load on the link over its
capacity, simdist.analytic.loads): exactly alpha + n/B when no two messages of a step share a link,
as on an NVSwitch. A message starts when both its peers have finished their previous step (the
plan's dependencies), so the time is that recurrence's last finish: with equal messages in every step
it is the sum over steps; with the uneven blocks of reduce_scatter/all_gather on 2^m + r peers a
peer with a light step may wait less.
"""

from __future__ import annotations

from simdist.analytic.loads import link_loads
from simdist.analytic.registry import register_closed_form
from simdist.collectives.group import Group
from simdist.collectives.halving_doubling import schedule
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request


def halving_doubling_time_s(group: Group, op: str, nbytes: float, per_transfer_latency_s: float = 0.0,
                            rate_factor: float = 1.0) -> float:
    """Time of the halving/doubling plan of ``op`` over ``group`` (without the protocol's start-up)."""
    steps, num_chunks, _ = schedule(op, group.size)
    size = nbytes / num_chunks
    topo = group.topology
    ready = [0.0] * group.size  # when each peer finished its last step
    for step in steps:
        routes = [group.path(ex.src, ex.dst) for ex in step]
        load = link_loads((route, size * len(ex.chunks)) for route, ex in zip(routes, step, strict=True))
        finish = list(ready)
        for route, ex in zip(routes, step, strict=True):
            drain = max((load[lk] / (topo.link(lk).effective_bandwidth_Bps * rate_factor) for lk in route.links),
                        default=0.0)
            end = max(ready[ex.src], ready[ex.dst]) + route.latency_s + per_transfer_latency_s + drain
            finish[ex.src] = max(finish[ex.src], end)
            finish[ex.dst] = max(finish[ex.dst], end)
        ready = finish
    return max(ready)


def halving_doubling_closed_form(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.halving_doubling builds for ``req``."""
    return proto.base_latency_s + halving_doubling_time_s(req.group, req.op, req.nbytes,
                                                          proto.per_transfer_latency_s, proto.rate_factor)


register_closed_form("halving_doubling", halving_doubling_closed_form)
