"""Durations of the communication ops of an op graph, from the collective model.

Each distinct (op, group, size) is priced once: the algorithm and protocol NCCL's tuner would pick
(simdist.analytic.select.rank_choices: least predicted time over the algorithms NCCL runs for the op),
timed by its closed form on the group's real placement (NVLink inside a node, the NICs and fabric
between nodes). The bytes each priced collective puts on every link come from its plan's routes.

# Assumption: collectives of different groups that run at the same time do not slow each other down here
# (each is priced alone). On the bundled presets every GPU has its own NIC (rail) and tensor-parallel groups
# stay inside an NVLink domain, so concurrent groups use disjoint links; where they do not (fewer NICs
# than GPUs, groups crossing an oversubscribed spine), this is optimistic. The per-link loads reported
# show where that happens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from simdist.analytic.select import priced_request, rank_choices
from simdist.collectives.group import Group
from simdist.collectives.registry import algorithm_for
from simdist.collectives.request import Request
from simdist.hardware.topology import Topology
from simdist.plan.opgraph import Comm, OpGraph


@dataclass(frozen=True, slots=True)
class PricedComm:
    op: str
    axis: str
    nbytes: float
    num_ranks: int
    algorithm: str
    protocol: str
    time_s: float
    """One run of the collective."""
    link_bytes: dict[int, float] = field(default_factory=dict)
    """Bytes one run puts on each directed link."""


def _link_bytes(request: Request, algorithm: str, choice) -> dict[int, float]:
    algo = algorithm_for(algorithm, request)
    priced = priced_request(request, choice.priced)
    builder = algo.build_fast if algo.build_fast is not None else algo.build
    plan = builder(priced)
    out: dict[int, float] = {}
    group = priced.group
    rate = choice.priced.cost.rate_factor
    wire = 1.0 / rate if rate else 1.0  # bytes on the wire per payload byte (simdist.engine.executor)
    for t in plan.transfers:
        for link in group.path(t.src, t.dst).links:
            out[link] = out.get(link, 0.0) + t.nbytes * wire
    return out


Adjust = Callable[[str, int, float, float], float]
"""(op, num_ranks, nbytes, predicted_s) -> seconds: a calibration's correction of a collective's time."""


def price_comm(topology: Topology, comm: Comm, *, with_links: bool = True, adjust: Adjust | None = None
               ) -> PricedComm:
    request = Request(comm.op, Group(topology, comm.ranks), comm.nbytes)
    choice = rank_choices(request)[0]
    links = _link_bytes(request, choice.algorithm, choice) if with_links else {}
    time_s = choice.predicted_s
    if adjust is not None:
        time_s = adjust(comm.op, len(comm.ranks), comm.nbytes, time_s)
    return PricedComm(comm.op, comm.axis, comm.nbytes, len(comm.ranks), choice.algorithm, choice.protocol,
                      time_s, links)


def price_graph(graph: OpGraph, topology: Topology, *, with_links: bool = True, adjust: Adjust | None = None
                ) -> dict[tuple, PricedComm]:
    """Set the duration of every comm op (count x one run); return the priced collectives by key.

    ``adjust`` (a calibration, see simdist.calibrate) corrects each collective's predicted time.
    """
    cache: dict[tuple, PricedComm] = {}
    for op in graph.ops:
        c = op.comm
        if c is None:
            continue
        key = (c.op, c.ranks, c.nbytes, c.axis)
        priced = cache.get(key)
        if priced is None:
            priced = cache[key] = price_comm(topology, c, with_links=with_links, adjust=adjust)
        op.duration_s = priced.time_s * c.count
    return cache
