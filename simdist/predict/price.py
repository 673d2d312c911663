"""Price the communication ops of an op graph: time alone, and the load they put on every link.

Each distinct (op, group, size) is priced once: the algorithm and protocol NCCL's tuner would pick
(simdist.analytic.select.rank_choices: least predicted time over the algorithms NCCL runs for the op),
timed by its closed form on the group's real placement (NVLink inside a node, the NICs and fabric between
nodes). That time splits into a latency part (the same closed form for a one-byte message) and a transfer
part; the transfer part's bytes on every directed link come from the algorithm's plan over the group's
routes, and so do the flows it drives across each link (links share their bandwidth per flow;
simdist.predict.link_loads counts both). The engine (simdist.engine.links) then runs each op as a job on the
shared links, so collectives that overlap in time and share links slow each other down; alone, each takes its
closed-form time.

Symmetry: a reduced graph simulates one rank of each class of equivalent ranks (simdist.plan.step); the
collectives of the ranks it leaves out, on the translates of each simulated group (`translate_axes`,
simdist.plan.mesh.Mesh.translates), load the shared links with it (simdist.predict.link_loads), exactly where
the translates are symmetric (`class_symmetric`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from simdist.analytic.select import Choice, evaluate, rank_choices
from simdist.collectives.group import Group
from simdist.collectives.plan import SWITCH
from simdist.collectives.request import Request
from simdist.collectives.uneven import imbalanced_matrix
from simdist.hardware.topology import Topology
from simdist.plan.mesh import DP_SUB_AXES, EXPERT_AXES, Mesh, component_axes
from simdist.plan.opgraph import Comm, Job, OpGraph
from simdist.predict.link_loads import (
    _bottleneck,
    _class_loads,
    _class_loads_batched,
    _Layout,
    _layouts,
    _loads,
    _pairs,
    _plan_links,
    class_necks_s,
)


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
    link_flows: dict[int, int] = field(default_factory=dict)
    """Flows one run drives across each link of link_bytes (see simdist.predict.link_loads)."""
    class_flows: dict[int, int] = field(default_factory=dict)
    """Flows the group and its translates drive across each link of class_bytes, in its order (== link_flows
    alone)."""


Adjust = Callable[[str, int, float, float], float]
"""(op, num_ranks, nbytes, predicted_s) -> seconds: a calibration's correction of a collective's time."""


def class_bottleneck_s(topology: Topology, priced: PricedComm) -> float:
    """Seconds the busiest link of a collective's group takes to carry what the group and its translates put on it
    (``class_bytes`` / capacity): no schedule of the class's transfers finishes sooner (each link carries at most
    its capacity), so the class's transfers, run together, take at least this."""
    return _bottleneck(topology, priced.class_bytes)


@dataclass(slots=True)
class _Pending:
    """A collective priced alone, its link loads still to come (`_finish`)."""

    comm: Comm
    choice: Choice
    time_s: float
    latency_s: float
    transfers: list[tuple[int, int, float]] | None = None
    """(src peer, dst peer, wire bytes) of its plan; None: priced without links."""
    levels: np.ndarray | None = None
    """The dependency level of each transfer (simdist.predict.link_loads._levels; None: all 0)."""
    groups: np.ndarray | None = None
    """The translates that share links with it, itself first."""
    batched: bool = False
    """Its class loads come from one numpy batch of every translate's routes (`_class_loads_batched`)."""


def request_of(topology: Topology, op: str, ranks: tuple[int, ...], nbytes: float, imbalance: float = 1.0,
               groups: dict[tuple[int, ...], Group] | None = None, kernel: str = "nccl") -> Request:
    """The collectives layer's request for ``op`` over ``ranks``; an all_to_all with ``imbalance`` > 1 is the
    uneven all_to_all whose busiest peer receives that many times the mean (simdist.collectives.uneven); ``kernel``:
    what runs an all_to_all (simdist.collectives.ep_kernels). ``groups``: groups already made, by ranks (a group
    memoises its routes' structure for every op and size)."""
    group = groups.get(ranks) if groups is not None else None
    if group is None:
        group = Group(topology, ranks)
        if groups is not None:
            groups[ranks] = group
    if op == "all_to_all" and imbalance != 1.0:
        return Request(op, group, nbytes, matrix=imbalanced_matrix(len(ranks), nbytes, imbalance), kernel=kernel)
    return Request(op, group, nbytes, kernel=kernel)


def node_translate(topology: Topology, ranks: tuple[int, ...]) -> tuple[int, ...]:
    """``ranks`` moved to the cluster's first node when they all sit on one other node, else ``ranks``: the group
    there prices exactly as here. Every route between GPUs of one node (and to its NVSwitch) crosses that node's
    links only (simdist.hardware.topology.Topology.route), and every node is the one node graph placed at an offset
    (simdist.hardware.layout: node n's local link t has id n x T + t and the capacity of t), so each route of the
    translate crosses the same local links with the same figures, its link ids shifted in order, and the closed
    forms compute the same floats. Failed leaf-spine links (faults.failed_links) switch it off, as they switch off
    `simdist.analytic.pricing.CommPricer`'s re-placing; degraded links never enter a price (they are capacities of
    the engine's shared links only, simdist.predict.faults)."""
    g = topology.gpus_per_node
    base = ranks[0] - ranks[0] % g
    if base == 0 or (topology.fabric is not None and topology.fabric.failed_uplinks):
        return ranks
    if any(not base <= r < base + g for r in ranks):
        return ranks
    return tuple(r - base for r in ranks)


def _tuned(topology: Topology, comm: Comm, groups: dict[tuple[int, ...], Group] | None,
           stand_in: tuple[int, ...] | None = None) -> tuple[Choice, float, Request]:
    """(the tuner's choice for ``comm`` alone, the closed form of that choice for one byte, the request they were
    found on: ``comm`` on its group's `node_translate`, or on ``stand_in``), kept in that group's memo: a
    collective on every node's copy of a group is priced once."""
    ranks = plan_basis(topology, comm.ranks, stand_in)
    basis = request_of(topology, comm.op, ranks, comm.nbytes, comm.imbalance, groups, comm.kernel)
    key = ("tuned", comm.op, float(comm.nbytes), float(comm.imbalance), comm.kernel)
    hit = basis.group.memo.get(key)
    if hit is None:
        choice = rank_choices(basis)[0]
        tiny = evaluate(request_of(topology, comm.op, ranks, 1.0, comm.imbalance, groups, comm.kernel),
                        choice.algorithm, choice.protocol)
        hit = basis.group.memo[key] = (choice, tiny.predicted_s)
    return (*hit, basis)


def _planned(topology: Topology, comm: Comm, basis: Request, choice: Choice
             ) -> tuple[list[tuple[int, int, float]], np.ndarray | None]:
    """`_plan_links` of ``choice`` on ``basis`` (``comm``'s `_tuned` request: the plan, in peers, of every node's
    copy of the group), kept in its group's memo (read-only: shared by every collective priced with it)."""
    key = ("planned", comm.op, float(comm.nbytes), float(comm.imbalance), comm.kernel, choice.algorithm,
           choice.protocol)
    hit = basis.group.memo.get(key)
    if hit is None:
        hit = basis.group.memo[key] = _plan_links(topology, basis, choice)
    return hit


def _prepare(topology: Topology, comm: Comm, translates: Sequence[tuple[int, ...]] | np.ndarray | None,
             with_links: bool, adjust: Adjust | None, groups: dict[tuple[int, ...], Group] | None = None,
             stand_in: tuple[int, ...] | None = None) -> _Pending:
    """`price_comm` up to its link loads: the choice, the times, the plan's transfers and the translates."""
    choice, tiny_s, basis = _tuned(topology, comm, groups, stand_in)
    time_s = choice.predicted_s
    latency_s = min(tiny_s, time_s)
    if adjust is not None:
        adjusted = adjust(comm.op, len(comm.ranks), comm.nbytes, time_s)
        latency_s *= adjusted / time_s if time_s > 0 else 1.0
        time_s = adjusted
    if not with_links:
        return _Pending(comm, choice, time_s, latency_s)
    transfers, levels = _planned(topology, comm, basis, choice)
    groups = np.asarray(translates if translates is not None and len(translates) else [comm.ranks], dtype=np.int64)
    gpn = topology.gpus_per_node
    if len(groups) > 1 and all(src == SWITCH or dst == SWITCH
                               or (src >= 0 and dst >= 0 and comm.ranks[src] // gpn == comm.ranks[dst] // gpn)
                               for src, dst, _ in transfers):  # FABRIC (SHARP) leaves the node
        # The plan stays inside its nodes (a route between GPUs of one node, or to its NVSwitch, crosses node
        # links only): a translate on other nodes shares no link with it, and its own bottleneck is the same
        # (every node is built alike), so only translates on the same nodes matter.
        shares = np.isin(groups // gpn, np.asarray(comm.ranks, dtype=np.int64) // gpn).any(axis=1)
        shares[0] = True
        groups = groups[shares]
    switch = any(src < 0 or dst < 0 for src, dst, _ in transfers)  # SWITCH or FABRIC
    return _Pending(comm, choice, time_s, latency_s, transfers, levels, groups, len(groups) > 1 and not switch)


def transfer_alone_s(topology: Topology, comm: Comm, groups: dict[tuple[int, ...], Group] | None = None,
                     stand_in: tuple[int, ...] | None = None) -> float:
    """`price_comm`'s time_s - latency_s of ``comm`` (no ``adjust``), without its link loads."""
    choice, tiny_s, _ = _tuned(topology, comm, groups, stand_in)
    return choice.predicted_s - min(tiny_s, choice.predicted_s)


def plan_basis(topology: Topology, ranks: tuple[int, ...], stand_in: tuple[int, ...] | None = None
               ) -> tuple[int, ...]:
    """The group whose tuner choice and plan (in peers) `price_comm` prices ``ranks`` with (`_tuned`): groups with
    the same basis run the same plan."""
    return node_translate(topology, ranks if stand_in is None else stand_in)


def translate_necks_s(topology: Topology, comm: Comm, translates: np.ndarray,
                      groups: dict[tuple[int, ...], Group] | None = None, stand_in: tuple[int, ...] | None = None
                      ) -> np.ndarray | None:
    """`class_bottleneck_s` of `price_comm` of every row of ``translates`` (comm.ranks's translates, comm.ranks
    among them, each in comm.ranks's peer order) as the group priced, its translates the others, for the rows
    whose `plan_basis` is comm's (they run its plan): one batch of the class's routes for all of them. None where
    `price_comm` would not price the class in one batch (a plan that stays inside its nodes, or through a switch):
    price each with `price_comm`."""
    p = _prepare(topology, comm, translates, True, None, groups, stand_in)
    if not p.batched or p.groups is None or len(p.groups) != len(translates) or p.transfers is None:
        return None
    return class_necks_s(topology, p.groups, p.transfers)


def _finish(topology: Topology, p: _Pending, layout: _Layout | None = None) -> PricedComm:
    """`price_comm` from its `_prepare`: the loads on the links (``layout``: its translates' routes, resolved)."""
    comm, choice = p.comm, p.choice
    if p.transfers is None or p.groups is None:
        return PricedComm(comm.op, comm.axis, comm.nbytes, len(comm.ranks), choice.algorithm, choice.protocol,
                          p.time_s, p.latency_s)
    transfers, groups = p.transfers, p.groups
    if len(groups) == 1:
        own, own_flows = _loads(topology, comm.ranks, transfers, p.levels)
        class_load, symmetric, class_flows = own, True, own_flows
    elif not p.batched:
        own, class_load, symmetric, own_flows, class_flows = _class_loads(
            topology, list(map(tuple, groups.tolist())), transfers, p.levels)
    else:
        own, class_load, symmetric, own_flows, class_flows = _class_loads_batched(topology, groups, transfers,
                                                                                  p.levels, layout)
    return PricedComm(comm.op, comm.axis, comm.nbytes, len(comm.ranks), choice.algorithm, choice.protocol,
                      p.time_s, p.latency_s, own, class_load, len(groups), symmetric, own_flows, class_flows)


def price_comm(topology: Topology, comm: Comm, *, translates: Sequence[tuple[int, ...]] | np.ndarray | None = None,
               with_links: bool = True, adjust: Adjust | None = None,
               groups: dict[tuple[int, ...], Group] | None = None,
               stand_in: tuple[int, ...] | None = None) -> PricedComm:
    """Price one run of ``comm`` (count ignored); ``translates``: the equivalent groups (first = comm.ranks),
    as tuples or as one (groups, ranks) array (simdist.plan.mesh.Mesh.translates_array); ``groups``: groups already
    made, by ranks (`request_of`: the tuner's choice and the plan are kept in them, for every later price);
    ``stand_in``: ranks, in comm.ranks's peer order, whose tuner choice, times and plan (in peers) stand for
    comm.ranks's (a translate the caller prices alike, as simdist.analytic.pricing.CommPricer does); the link loads
    are comm.ranks's and its translates' own."""
    return _finish(topology, _prepare(topology, comm, translates, with_links, adjust, groups, stand_in))


def job_of(topology: Topology, priced: PricedComm, count: int, host_s: float = 0.0) -> Job:
    """The engine's job for ``count`` back-to-back runs: alone it takes count x (time_s + host_s) exactly.

    ``host_s``: host time each run adds to the collective (Comm.host_s), paid like latency.

    The demand is scaled so that the group's own bottleneck drains in exactly the transfer part of the
    closed form (they differ where the closed form's bandwidth term is not the plan's most loaded link, e.g.
    protocol pipelining); the class's extra load on shared links then stretches it in proportion. Its flows
    per link are the class's (``class_flows``): one run's, as the runs follow one another.
    """
    transfer_s = max(priced.time_s - priced.latency_s, 0.0)
    own_neck = _bottleneck(topology, priced.link_bytes)
    scale = transfer_s / own_neck if own_neck > transfer_s and own_neck > 0 else 1.0
    n = len(priced.class_bytes)
    links = np.fromiter(priced.class_bytes.keys(), dtype=np.int64, count=n)
    order = np.argsort(links, kind="stable")
    nbytes = np.fromiter(priced.class_bytes.values(), dtype=float, count=n)[order] * scale * count
    flows = np.fromiter(priced.class_flows.values(), dtype=np.int64, count=n)[order]  # same links, same order
    demand = tuple(zip(links[order].tolist(), nbytes.tolist(), flows.tolist(), strict=True))  # by link id
    return Job(latency_s=(priced.latency_s + host_s) * count, bandwidth_s=transfer_s * count, demand=demand)


def translate_axes(axis: str, reduced_axes: tuple[str, ...]) -> tuple[str, ...]:
    """The axes along which a collective on ``axis`` has translates the reduced graph leaves out: the reduced axes
    but its own (a dp_cp group's own are dp and cp: simdist.plan.mesh.component_axes); for an expert group (ep,
    etp, edp: simdist.plan.mesh's expert generator, whose groups cut across the dense ones) the other expert axes,
    the other expert groups of its stage.
    # Assumption: where the graph simulates every data-parallel replica but not every tp peer (unequal replicas of
    # an expert-parallel layout), the expert groups' translates are counted as if none of them were simulated.
    """
    if axis in EXPERT_AXES:
        return tuple(a for a in EXPERT_AXES if a != axis) if reduced_axes else ()
    own = component_axes(axis)
    if any(a in DP_SUB_AXES for a in own):
        # a hybrid-sharding group's translates along dp are along its complement: the other shard groups (dpr) of a
        # shard group (dps), the other replica groups (dps) of a replica group
        other = "dpr" if "dps" in own else "dps"
        reduced_axes = tuple(other if a == "dp" else a for a in reduced_axes)
    return tuple(a for a in reduced_axes if a not in own)


def price_graph(graph: OpGraph, topology: Topology, *, mesh: Mesh | None = None, reduced_axes: tuple[str, ...] = (),
                with_links: bool = True, adjust: Adjust | None = None,
                known: dict[tuple, PricedComm] | None = None) -> dict[tuple, PricedComm]:
    """Price every comm op: its ``duration_s`` (alone, count x one run) and its engine ``job``.

    ``mesh`` and ``reduced_axes`` describe the symmetry of a reduced graph (simdist.plan.step.StepPlan):
    each collective's translates along the reduced axes (other than its own) load the links with it.
    ``adjust`` (a calibration, see simdist.calibrate) corrects each collective's predicted time. ``known``: what
    `price_graph` returned for another graph of the same step (same mesh, axes, adjust): its collectives are not
    priced again (simdist.predict.step's fast-forward samples). Returns this graph's collectives, in order.
    """
    pending: dict[tuple, _Pending] = {}
    known = known or {}
    images: dict[tuple, np.ndarray] = {}  # translates by (group, axes): shared by its collectives
    made: dict[tuple[int, ...], Group] = topology.groups  # type: ignore[assignment]  # shared with the closed form
    # A step's ops share their Comm objects (one per recipe piece and stage, simdist.plan.step_emitter): each one's
    # key is made and hashed once (by the object's id: every Comm stays alive in the graph meanwhile)
    key_of: dict[int, tuple] = {}
    comms: dict[int, Comm] = {}  # id -> Comm, each distinct object once, in order of first use
    rows = graph.op_rows()
    # the builder's rows hold each op's Comm, in order of first use (simdist.plan.opgraph.OpRows): far fewer than ops
    for c in (rows.comm if rows is not None else (op.comm for op in graph.ops)):
        if c is None or id(c) in comms:  # an object already seen: its key is in ``pending`` already
            continue
        comms[id(c)] = c
        key = key_of[id(c)] = (c.op, c.ranks, c.nbytes, c.axis, c.imbalance, c.kernel)
        if key in pending:
            continue
        if key in known:
            pending[key] = None  # type: ignore[assignment]
            continue
        translates = None
        if mesh is not None and with_links:
            axes = translate_axes(c.axis, reduced_axes)
            if axes:
                # a group's images do not depend on its peer order (a send and its reply share them)
                order = sorted(range(len(c.ranks)), key=c.ranks.__getitem__)
                members = tuple(c.ranks[i] for i in order)
                canonical = images.get((members, axes))
                if canonical is None:
                    canonical = images[(members, axes)] = mesh.translates_array(members, axes)
                translates = canonical[:, np.argsort(order)]
        pending[key] = _prepare(topology, c, translates, with_links, adjust, made)
    # the routes of every translate of every collective priced over its class, resolved in one batch
    batched = {key: p for key, p in pending.items() if p is not None and p.batched}
    items = [(p.groups, *_pairs(p.transfers)) for p in batched.values()]
    layouts = dict(zip(batched, _layouts(topology, items), strict=True))  # type: ignore[arg-type]
    cache = {key: known[key] if p is None else _finish(topology, p, layouts.get(key)) for key, p in pending.items()}
    jobs: dict[tuple, Job] = {}
    done: dict[int, tuple[float, Job | None]] = {}  # id(comm) -> (duration, job)
    for i, c in comms.items():
        key = key_of[i]
        priced = cache[key]
        job = None
        if with_links:
            job = jobs.get((key, c.count, c.host_s))
            if job is None:
                job = jobs[(key, c.count, c.host_s)] = job_of(topology, priced, c.count, c.host_s)
        done[i] = ((priced.time_s + c.host_s) * c.count, job)
    if rows is not None:  # only the ops that have a Comm, found from their rows
        has_comm = np.fromiter((c is not None for c in rows.comm), dtype=bool, count=len(rows.comm))[rows.row]
        which = np.flatnonzero(has_comm)
        of_row = [None if c is None else done[id(c)] for c in rows.comm]
        ops = graph.ops
        if with_links:
            for i, r in zip(which.tolist(), rows.row[which].tolist(), strict=True):
                op = ops[i]
                op.duration_s, op.job = of_row[r]
        else:
            for i, r in zip(which.tolist(), rows.row[which].tolist(), strict=True):
                ops[i].duration_s = of_row[r][0]
        graph.apply_taxes()
        return cache
    for op in graph.ops:
        c = op.comm
        if c is not None:
            op.duration_s, job = done[id(c)]
            if with_links:
                op.job = job
    graph.apply_taxes()
    return cache


def price_runs(runs: dict[tuple, int], topology: Topology, *, adjust: Adjust | None = None
               ) -> dict[tuple, PricedComm]:
    """Each (op, ranks, nbytes, axis, imbalance, kernel) of ``runs`` (simdist.plan.step.collective_runs) priced alone
    with the bytes it puts on its own group's links."""
    out: dict[tuple, PricedComm] = {}
    for key in runs:
        op, ranks, nbytes, axis, imbalance, kernel = key
        out[key] = price_comm(topology, Comm(op, ranks, nbytes, axis, imbalance=imbalance, kernel=kernel),
                              adjust=adjust)
    return out


def class_symmetric(priced: dict[tuple, PricedComm]) -> bool:
    """True when every priced collective's translates meet the same bottleneck (the reduction is exact)."""
    return all(p.symmetric for p in priced.values())
