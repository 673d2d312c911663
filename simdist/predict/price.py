"""Price the communication ops of an op graph: time alone, and the load they put on every link.

Each distinct (op, group, size) is priced once: the algorithm and protocol NCCL's tuner would pick
(simdist.analytic.select.rank_choices: least predicted time over the algorithms NCCL runs for the op),
timed by its closed form on the group's real placement (NVLink inside a node, the NICs and fabric between
nodes). That time splits into a latency part (the same closed form for a one-byte message) and a transfer
part; the transfer part's bytes on every directed link come from the algorithm's plan over the group's
routes. The engine (simdist.engine.jobs) then runs each op as a job on the shared links, so collectives
that overlap in time and share links slow each other down; alone, each takes its closed-form time.

Symmetry: a reduced graph simulates one rank of each class of equivalent ranks (simdist.plan.step). The
ranks it leaves out run the same collectives at the same instants on their own groups, the *translates* of
the simulated group (simdist.plan.mesh.Mesh.translates). Their bytes on links the simulated group also
uses are added to its demand, so the shared links (NICs shared by GPUs, leaf uplinks, spines, NVSwitch
ports) carry the whole class's traffic; this equals simulating every rank when the translates are
symmetric (each sees the same bottleneck), which `class_symmetric` checks per collective.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from simdist.analytic.select import evaluate, priced_request, rank_choices
from simdist.collectives.group import Group
from simdist.collectives.plan import SWITCH
from simdist.collectives.registry import algorithm_for
from simdist.collectives.request import Request
from simdist.hardware import batch
from simdist.hardware.topology import Topology
from simdist.plan.mesh import Mesh
from simdist.plan.opgraph import Comm, Job, OpGraph

_SYMMETRY_REL = 1e-9


@dataclass(frozen=True, slots=True)
class PricedComm:
    op: str
    axis: str
    nbytes: float
    num_ranks: int
    algorithm: str
    protocol: str
    time_s: float
    """One run of the collective, alone (the closed form, after any calibration)."""
    latency_s: float = 0.0
    """The part of time_s that does not depend on the bytes (one-byte closed form)."""
    link_bytes: dict[int, float] = field(default_factory=dict)
    """Bytes one run puts on each directed link of its own group."""
    class_bytes: dict[int, float] = field(default_factory=dict)
    """Bytes one run of the group *and its translates* put on the links of the group (== link_bytes alone)."""
    num_translates: int = 1
    symmetric: bool = True
    """Every translate meets the same bottleneck (the reduction is exact for this collective)."""


Adjust = Callable[[str, int, float, float], float]
"""(op, num_ranks, nbytes, predicted_s) -> seconds: a calibration's correction of a collective's time."""


def _plan_links(topology: Topology, request: Request, choice) -> list[tuple[int, int, float]]:
    """(src peer, dst peer, wire bytes) of the chosen algorithm's plan."""
    algo = algorithm_for(choice.algorithm, request)
    priced = priced_request(request, choice.priced)
    builder = algo.build_fast if algo.build_fast is not None else algo.build
    plan = builder(priced)
    rate = choice.priced.cost.rate_factor
    wire = 1.0 / rate if rate else 1.0  # bytes on the wire per payload byte (simdist.engine.executor)
    return [(t.src, t.dst, t.nbytes * wire) for t in plan.transfers]


def _loads(topology: Topology, ranks: tuple[int, ...], transfers: list[tuple[int, int, float]]) -> dict[int, float]:
    group = Group(topology, ranks)
    out: dict[int, float] = {}
    for src, dst, nbytes in transfers:
        for link in group.path(src, dst).links:
            out[link] = out.get(link, 0.0) + nbytes
    return out


def _capacity(topology: Topology, link: int, _cache: dict = {}) -> float:  # noqa: B006 - a deliberate memo
    key = (id(topology), link)
    c = _cache.get(key)
    if c is None:
        if len(_cache) > 1 << 20:
            _cache.clear()
        c = _cache[key] = topology.link(link).effective_bandwidth_Bps
    return c


def _bottleneck(topology: Topology, links, load: dict[int, float]) -> float:
    return max((load[link] / _capacity(topology, link) for link in links), default=0.0)


def _class_loads(topology: Topology, groups: list[tuple[int, ...]], transfers: list[tuple[int, int, float]]
                 ) -> tuple[dict[int, float], dict[int, float], bool]:
    """(own loads, the class's total loads on the own links, symmetric) — one group at a time."""
    per_group = [_loads(topology, g, transfers) for g in groups]
    own = per_group[0]
    total: dict[int, float] = {}
    for load in per_group:
        for link, b in load.items():
            total[link] = total.get(link, 0.0) + b
    necks = [_bottleneck(topology, load, total) for load in per_group]
    symmetric = max(necks) <= necks[0] * (1 + _SYMMETRY_REL) + 1e-300
    return own, {link: total[link] for link in own}, symmetric


def _class_loads_batched(topology: Topology, groups: list[tuple[int, ...]], transfers: list[tuple[int, int, float]]
                         ) -> tuple[dict[int, float], dict[int, float], bool]:
    """`_class_loads` for many translates at once: every translate's routes in one numpy batch."""
    ranks = np.asarray(groups, dtype=np.int64)  # (G, P)
    src = np.fromiter((t[0] for t in transfers), dtype=np.int64, count=len(transfers))
    dst = np.fromiter((t[1] for t in transfers), dtype=np.int64, count=len(transfers))
    nbytes = np.fromiter((t[2] for t in transfers), dtype=float, count=len(transfers))
    routes = batch.routes(topology, ranks[:, src].reshape(-1), ranks[:, dst].reshape(-1))
    owner = routes.owners() // len(transfers)  # group of every (route, link) entry
    weights = np.repeat(np.tile(nbytes, len(groups)), routes.hops)
    ids, compact = np.unique(routes.links, return_inverse=True)
    compact = compact.reshape(-1)
    total = np.bincount(compact, weights=weights, minlength=len(ids))
    ratio = (total / batch.link_capacities(topology, ids))[compact]
    necks = np.zeros(len(groups))
    np.maximum.at(necks, owner, ratio)
    symmetric = bool(necks.max() <= necks[0] * (1 + _SYMMETRY_REL) + 1e-300)
    mine = owner == 0
    own_ids, own_compact = np.unique(routes.links[mine], return_inverse=True)
    own_bytes = np.bincount(own_compact.reshape(-1), weights=weights[mine], minlength=len(own_ids))
    class_bytes = total[np.searchsorted(ids, own_ids)]
    own = dict(zip(own_ids.tolist(), own_bytes.tolist(), strict=True))
    return own, dict(zip(own_ids.tolist(), class_bytes.tolist(), strict=True)), symmetric


def price_comm(topology: Topology, comm: Comm, *, translates: list[tuple[int, ...]] | None = None,
               with_links: bool = True, adjust: Adjust | None = None) -> PricedComm:
    """Price one run of ``comm`` (count ignored); ``translates``: the equivalent groups (first = comm.ranks)."""
    request = Request(comm.op, Group(topology, comm.ranks), comm.nbytes)
    choice = rank_choices(request)[0]
    time_s = choice.predicted_s
    tiny = evaluate(Request(comm.op, Group(topology, comm.ranks), 1.0), choice.algorithm, choice.protocol)
    latency_s = min(tiny.predicted_s, time_s)
    if adjust is not None:
        adjusted = adjust(comm.op, len(comm.ranks), comm.nbytes, time_s)
        latency_s *= adjusted / time_s if time_s > 0 else 1.0
        time_s = adjusted
    if not with_links:
        return PricedComm(comm.op, comm.axis, comm.nbytes, len(comm.ranks), choice.algorithm, choice.protocol,
                          time_s, latency_s)
    transfers = _plan_links(topology, request, choice)
    groups = translates or [comm.ranks]
    own = _loads(topology, comm.ranks, transfers)
    if len(groups) > 1 and all(link < topology.num_node_links for link in own):
        # The plan stays inside its nodes: a translate on other nodes shares no link with it, and its own
        # bottleneck is the same (every node is built alike), so only translates on the same nodes matter.
        gpn = topology.gpus_per_node
        nodes = {r // gpn for r in comm.ranks}
        groups = [groups[0]] + [g for g in groups[1:] if nodes & {r // gpn for r in g}]
    if len(groups) == 1:
        class_load, symmetric = own, True
    elif any(src == SWITCH or dst == SWITCH for src, dst, _ in transfers):
        own, class_load, symmetric = _class_loads(topology, groups, transfers)
    else:
        own, class_load, symmetric = _class_loads_batched(topology, groups, transfers)
    return PricedComm(comm.op, comm.axis, comm.nbytes, len(comm.ranks), choice.algorithm, choice.protocol,
                      time_s, latency_s, own, class_load, len(groups), symmetric)


def job_of(topology: Topology, priced: PricedComm, count: int, host_s: float = 0.0) -> Job:
    """The engine's job for ``count`` back-to-back runs: alone it takes count x (time_s + host_s) exactly.

    ``host_s``: host time each run adds to the collective (Comm.host_s), paid like latency.

    The demand is scaled so that the group's own bottleneck drains in exactly the transfer part of the
    closed form (they differ where the closed form's bandwidth term is not the plan's most loaded link, e.g.
    protocol pipelining); the class's extra load on shared links then stretches it in proportion.
    """
    transfer_s = max(priced.time_s - priced.latency_s, 0.0)
    own_neck = _bottleneck(topology, priced.link_bytes, priced.link_bytes)
    scale = transfer_s / own_neck if own_neck > transfer_s and own_neck > 0 else 1.0
    demand = tuple((link, b * scale * count) for link, b in sorted(priced.class_bytes.items()))
    return Job(latency_s=(priced.latency_s + host_s) * count, bandwidth_s=transfer_s * count, demand=demand)


def price_graph(graph: OpGraph, topology: Topology, *, mesh: Mesh | None = None, reduced_axes: tuple[str, ...] = (),
                with_links: bool = True, adjust: Adjust | None = None) -> dict[tuple, PricedComm]:
    """Price every comm op: its ``duration_s`` (alone, count x one run) and its engine ``job``.

    ``mesh`` and ``reduced_axes`` describe the symmetry of a reduced graph (simdist.plan.step.StepPlan):
    each collective's translates along the reduced axes (other than its own) load the links with it.
    ``adjust`` (a calibration, see simdist.calibrate) corrects each collective's predicted time.
    """
    cache: dict[tuple, PricedComm] = {}
    jobs: dict[tuple, Job] = {}
    for op in graph.ops:
        c = op.comm
        if c is None:
            continue
        key = (c.op, c.ranks, c.nbytes, c.axis)
        priced = cache.get(key)
        if priced is None:
            translates = None
            if mesh is not None and with_links:
                axes = tuple(a for a in reduced_axes if a != c.axis)
                if axes:
                    translates = mesh.translates(c.ranks, axes)
            priced = cache[key] = price_comm(topology, c, translates=translates, with_links=with_links,
                                             adjust=adjust)
        op.duration_s = (priced.time_s + c.host_s) * c.count
        if with_links:
            job = jobs.get((key, c.count, c.host_s))
            if job is None:
                job = jobs[(key, c.count, c.host_s)] = job_of(topology, priced, c.count, c.host_s)
            op.job = job
    return cache


def class_symmetric(priced: dict[tuple, PricedComm]) -> bool:
    """True when every priced collective's translates meet the same bottleneck (the reduction is exact)."""
    return all(p.symmetric for p in priced.values())
