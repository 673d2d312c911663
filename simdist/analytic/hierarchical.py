"""Closed form of the hierarchical all_reduce (the plans of simdist.collectives.hierarchical).

The phases run one after another (the plan starts a phase on a peer once the previous one is done
there), so the time is the sum of the phases. A phase is a set of concurrent rings (one per node
inside nodes, one per local position across them), costed like the ring closed form
(simdist.analytic.ring; Thakur, Rabenseifner & Gropp 2005 sec. 4.1): steps x (busiest link's load
of one step over all the phase's rings / capacity) plus the latency of the longest chain of steps.
With N nodes of L peers, intra-node bandwidth B and latency alpha, cross-node B_n and alpha_n, and no
shared links,

    all_reduce = 2 (L-1) (alpha + S/(L B)) + 2 (N-1) (alpha_n + S/(L N B_n)),

reduce_scatter and all_gather half of it. Counting every ring's bytes on a link prices rings that
meet (on a NIC two GPUs share, an oversubscribed spine) as if they shared it evenly all phase long;
exact where no two rings share a link and each ring's edges are alike (NVSwitch nodes on a
rail-optimized fabric), an estimate elsewhere (PCIe rings, ECMP collisions: see the tests).
"""

from __future__ import annotations

from simdist.analytic.loads import drain_time_s
from simdist.analytic.registry import register_closed_form
from simdist.collectives.group import Group
from simdist.collectives.hierarchical import PHASES, node_groups
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request


def _rings_time_s(group: Group, rings: list[list[int]], nbytes: float, steps: int, lat: float,
                  factor: float) -> float:
    """``steps`` steps of concurrent ``rings`` (peer lists in ring order, each over ``nbytes``): the
    ring closed form (simdist.analytic.ring.ring_time_s, which this is for a single ring), with each
    step's bandwidth term the busiest link's load over all the rings' edges."""
    edges = [[group.path(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))] for ring in rings]
    flows = ((route, nbytes / len(ring)) for ring, routes in zip(rings, edges, strict=True) for route in routes)
    step_bw = drain_time_s(group.topology, flows, factor)
    latency = 0.0
    for routes in edges:
        hop = [r.latency_s + lat for r in routes]
        for start in range(len(hop)):
            latency = max(latency, sum(hop[(start + s) % len(hop)] for s in range(steps)))
    return latency + steps * step_bw


def hierarchical_time_s(group: Group, op: str, nbytes: float, per_transfer_latency_s: float = 0.0,
                        rate_factor: float = 1.0) -> float:
    groups = node_groups(group)
    n, local = len(groups), len(groups[0])
    total = 0.0
    for phase in PHASES[op]:
        if phase.startswith("intra"):
            total += _rings_time_s(group, groups, nbytes, local - 1, per_transfer_latency_s, rate_factor)
        else:
            rings = [[g[pos] for g in groups] for pos in range(local)]
            total += _rings_time_s(group, rings, nbytes / local, n - 1, per_transfer_latency_s, rate_factor)
    return total


def hierarchical_closed_form(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.hierarchical builds for ``req``."""
    return proto.base_latency_s + hierarchical_time_s(req.group, req.op, req.nbytes,
                                                      proto.per_transfer_latency_s, proto.rate_factor)


register_closed_form("hierarchical", hierarchical_closed_form)
