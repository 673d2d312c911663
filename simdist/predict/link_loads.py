"""Where a priced collective's plan puts its load: the bytes and flows on every directed link, of its own group
and of the class of equivalent groups it stands for, and the bottleneck they make.

The transfers are the chosen algorithm's plan (its fast plan where it has one) over the group's routes, in bytes
on the wire (`_plan_links`); simdist.predict.price times the collective and reads its loads from here, the
engine (simdist.engine.links) shares each link's bandwidth per flow.

Flows of a plan on a link: the most of its transfers that cross the link within one dependency level
(`_levels`: transfers whose longest chain of dependencies, connection order included, has the same length
run at the same time uncontended). A fast plan's transfers wait for nothing, so each is one flow: one per
channel and ring edge for the fast ring, one per (peer, node) pair for the fast all_to_all. In a pipelined
tree or NVLS plan a connection's successive pieces are successive levels, i.e. one flow.
# Assumption: each transfer of a level is a flow of its own. Detailed plans that split one message into
# transfers travelling together (halving-doubling's and hierarchical's chunks) would count each; the
# algorithms the tuner picks (simdist.analytic.select: ring, tree, nvls, direct) do not split messages.

Symmetry: a reduced graph simulates one rank of each class of equivalent ranks (simdist.plan.step). The
ranks it leaves out run the same collectives at the same instants on their own groups, the *translates* of
the simulated group (simdist.plan.mesh.Mesh.translates). Their bytes and flows on links the simulated group
also uses are added to its demand (flows: the most of the class's transfers on the link in one level, the
translates running in lockstep), so the shared links (NICs shared by GPUs, leaf uplinks, spines, NVSwitch
ports) carry the whole class's traffic; this equals simulating every rank when the translates are
symmetric (each sees the same bottleneck), which `_class_loads` and `_class_loads_batched` check per collective
(simdist.predict.price.class_symmetric reads it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from simdist.analytic.select import priced_request
from simdist.collectives.group import Group
from simdist.collectives.plan import Transfer
from simdist.collectives.registry import algorithm_for
from simdist.collectives.request import Request
from simdist.engine.executor import wire_predecessor
from simdist.engine.sharing import unique_inverse
from simdist.hardware import batch
from simdist.hardware.topology import Topology

_SYMMETRY_REL = 1e-9


def _plan_links(topology: Topology, request: Request, choice) -> tuple[list[tuple[int, int, float]], np.ndarray | None]:
    """(src peer, dst peer, wire bytes) of the chosen algorithm's plan (its fast plan where it has one), and
    the dependency level of each (`_levels`)."""
    algo = algorithm_for(choice.algorithm, request)
    priced = priced_request(request, choice.priced)
    builder = algo.build_fast if algo.build_fast is not None else algo.build
    plan = builder(priced)
    rate = choice.priced.cost.rate_factor
    wire = 1.0 / rate if rate else 1.0  # bytes on the wire per payload byte (simdist.engine.executor)
    return [(t.src, t.dst, t.nbytes * wire) for t in plan.transfers], _levels(plan.transfers)


def _levels(transfers: Sequence[Transfer]) -> np.ndarray | None:
    """Per transfer, the length of its longest chain of predecessors: its dependencies and the transfer its
    bytes follow on their connection (``after``, simdist.engine.executor.wire_predecessor). None: every
    transfer is at level 0 (none waits for another). Plans list transfers in a dependency-respecting order."""
    if all(not t.deps and wire_predecessor(t) < 0 for t in transfers):
        return None
    level = [0] * len(transfers)
    for i, t in enumerate(transfers):
        before = wire_predecessor(t)
        deepest = level[before] if before >= 0 else -1
        for d in t.deps:
            if level[d] > deepest:
                deepest = level[d]
        level[i] = deepest + 1
    return np.asarray(level, dtype=np.int64)


def _peak_flows(compact: np.ndarray, num_ids: int, levels: np.ndarray | None) -> np.ndarray:
    """Per link (``compact``: the link of every entry, an index below ``num_ids``) the most entries of one
    level (``levels``: the level of every entry; None: all one level)."""
    if levels is None:
        return np.bincount(compact, minlength=num_ids)
    keys, counts = np.unique(levels * num_ids + compact, return_counts=True)
    out = np.zeros(num_ids, dtype=np.int64)
    np.maximum.at(out, keys % num_ids, counts)
    return out


def _routes(topology: Topology, ranks: tuple[int, ...], transfers: list[tuple[int, int, float]]
            ) -> tuple[np.ndarray, np.ndarray]:
    """(links of every route, hops per transfer) of ``transfers`` on the group ``ranks``."""
    if not any(src < 0 or dst < 0 for src, dst, _ in transfers):  # no SWITCH nor FABRIC pseudo-peer
        peers = np.asarray(ranks, dtype=np.int64)
        src, dst = _pairs(transfers)
        routes = batch.routes(topology, peers[src], peers[dst])
        return routes.links, routes.hops
    group = Group(topology, ranks)
    paths = [group.path(src, dst).links for src, dst, _ in transfers]
    hops = np.fromiter(map(len, paths), dtype=np.int64, count=len(paths))
    return np.fromiter(chain.from_iterable(paths), dtype=np.int64, count=int(hops.sum())), hops


def _loads(topology: Topology, ranks: tuple[int, ...], transfers: list[tuple[int, int, float]],
           levels: np.ndarray | None) -> tuple[dict[int, float], dict[int, int]]:
    """(bytes, flows) per directed link of ``transfers`` on the group ``ranks`` (links in order of first use;
    bytes summed transfer by transfer, link by link)."""
    if not transfers:
        return {}, {}
    links, hops = _routes(topology, ranks, transfers)
    nbytes = np.fromiter((t[2] for t in transfers), dtype=float, count=len(transfers))
    ids, first, inverse = np.unique(links, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    sums = np.bincount(inverse, weights=np.repeat(nbytes, hops), minlength=len(ids))
    flows = _peak_flows(inverse, len(ids), None if levels is None else np.repeat(levels, hops))
    order = np.argsort(first, kind="stable")
    keys = ids[order].tolist()
    return dict(zip(keys, sums[order].tolist(), strict=True)), dict(zip(keys, flows[order].tolist(), strict=True))


def _capacities(topology: Topology, links: dict[int, float]) -> np.ndarray:
    """Effective capacities of the links (keys) of ``links``, in its order."""
    return batch.link_capacities(topology, np.fromiter(links, dtype=np.int64, count=len(links)))


def capacity_of(topology: Topology) -> Callable[[int], float]:
    """link id -> effective bytes/s, as ``topology.link(id).effective_bandwidth_Bps`` but without building a
    Link per call (`LinkLayout.capacity_Bps`: link ids are dense by class, and every link of a class has its
    class's capacity; IndexError outside the ids)."""
    return topology.layout.capacity_Bps


def _bottleneck(topology: Topology, load: dict[int, float]) -> float:
    """max over the links of ``load`` of bytes / capacity (0 without links)."""
    if not load:
        return 0.0
    return float((np.fromiter(load.values(), dtype=float, count=len(load)) / _capacities(topology, load)).max())


def _class_loads(topology: Topology, groups: list[tuple[int, ...]], transfers: list[tuple[int, int, float]],
                 levels: np.ndarray | None) -> tuple[dict[int, float], dict[int, float], bool, dict[int, int],
                                                     dict[int, int]]:
    """(own bytes, the class's total bytes on the own links, symmetric, own flows, the class's flows on the own
    links) — one group at a time."""
    per_group = [_loads(topology, g, transfers, levels)[0] for g in groups]
    own = per_group[0]
    total: dict[int, float] = {}
    for load in per_group:
        for link, b in load.items():
            total[link] = total.get(link, 0.0) + b
    necks = [_bottleneck(topology, {link: total[link] for link in load}) for load in per_group]
    symmetric = max(necks) <= necks[0] * (1 + _SYMMETRY_REL) + 1e-300
    routes = [_routes(topology, g, transfers) for g in groups]
    links = np.concatenate([r[0] for r in routes])
    ids, compact = unique_inverse(links)
    entry_levels = None if levels is None else np.concatenate([np.repeat(levels, r[1]) for r in routes])
    flows = _peak_flows(compact, len(ids), entry_levels)
    own_ids, own_compact = unique_inverse(routes[0][0])
    own_flows = _peak_flows(own_compact, len(own_ids), None if entry_levels is None else
                            entry_levels[:len(routes[0][0])])
    own_flow = dict(zip(own_ids.tolist(), own_flows.tolist(), strict=True))
    class_flow = dict(zip(ids.tolist(), flows.tolist(), strict=True))
    return (own, {link: total[link] for link in own}, symmetric, {link: own_flow[link] for link in own},
            {link: class_flow[link] for link in own})


@dataclass(frozen=True, slots=True, eq=False)
class _Layout:
    """Where a plan's transfers land for a set of translates: it depends on the ranks and the (src, dst) peer
    pairs only, not on the bytes, so collectives on the same groups with the same pairs share it."""

    hops: np.ndarray
    """Links of every (translate, transfer) route, translate-major."""
    compact: np.ndarray
    """Index into ``ids`` of every (route, link) entry."""
    ids: np.ndarray
    """The distinct links of all translates, ascending."""
    capacity: np.ndarray
    """Their effective capacities."""
    owner: np.ndarray
    """Translate of every entry."""
    mine: np.ndarray
    """Entries of the first translate (the group itself)."""
    own_ids: np.ndarray
    """The links of the first translate, ascending."""
    own_compact: np.ndarray
    """Index into ``own_ids`` of every entry of the first translate."""
    own_in_class: np.ndarray
    """Index into ``ids`` of every own link."""

    @property
    def nbytes(self) -> int:
        """Bytes its arrays hold (what `Topology.link_layouts` charges it)."""
        return sum(int(getattr(self, f).nbytes) for f in self.__dataclass_fields__)


def _layout_of(topology: Topology, links: np.ndarray, hops: np.ndarray, per_group: int) -> _Layout:
    """The `_Layout` of routes given as their links (CSR, ``hops`` per route), ``per_group`` routes a translate."""
    owner = np.repeat(np.arange(len(hops), dtype=np.int64), hops) // per_group  # translate of every entry
    ids, compact = unique_inverse(links)
    mine = owner == 0
    own_in_class, own_compact = unique_inverse(compact[mine])  # ids ascending: so are the own links'
    return _Layout(hops, compact, ids, batch.link_capacities(topology, ids), owner, mine, ids[own_in_class],
                   own_compact, own_in_class)


def _layout(topology: Topology, groups: np.ndarray, src: np.ndarray, dst: np.ndarray) -> _Layout:
    """The `_Layout` of transfers from peer ``src[i]`` to ``dst[i]`` in every group (row) of ``groups``, kept by the
    topology (`Topology.link_layouts`: collectives on the same groups and pairs share it, whatever their bytes)."""
    ranks = np.asarray(groups, dtype=np.int64)  # (G, P)
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    key = (ranks.shape, ranks.tobytes(), src.tobytes(), dst.tobytes())
    hit = topology.link_layouts.get(key)
    if hit is None:
        routes = batch.routes(topology, ranks[:, src].reshape(-1), ranks[:, dst].reshape(-1))
        hit = topology.link_layouts.put(key, _layout_of(topology, routes.links, routes.hops, len(src)))
    return hit  # type: ignore[return-value]


_BATCH_PAIRS = 1 << 17
"""Most (translate, transfer) routes `_layouts` resolves in one `batch.routes` call (bounds its memory: ~10^6
link entries)."""


def _layouts(topology: Topology, items: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> list[_Layout]:
    """`_layout` of many (groups, src, dst) at once: one `batch.routes` call for all their routes (its cost is
    mostly per call and per class of GPU pair, not per route); items with the same groups and pairs share one."""
    keys = [(groups.shape, groups.tobytes(), src.tobytes(), dst.tobytes()) for groups, src, dst in items]
    first: dict[tuple, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    todo = list(first.values())
    done: dict[int, _Layout] = {}
    start = 0
    while start < len(todo):
        stop, pairs = start, 0
        while stop < len(todo) and (stop == start or pairs + len(items[todo[stop]][0]) * len(items[todo[stop]][1])
                                     <= _BATCH_PAIRS):
            pairs += len(items[todo[stop]][0]) * len(items[todo[stop]][1])
            stop += 1
        chunk = todo[start:stop]
        srcs = [items[i][0][:, items[i][1]].reshape(-1) for i in chunk]
        dsts = [items[i][0][:, items[i][2]].reshape(-1) for i in chunk]
        routes = batch.routes(topology, np.concatenate(srcs), np.concatenate(dsts))
        hops = routes.hops
        lo = 0
        for i, a in zip(chunk, srcs, strict=True):
            hi = lo + len(a)
            done[i] = _layout_of(topology, routes.links[routes.indptr[lo]:routes.indptr[hi]], hops[lo:hi],
                                 len(items[i][1]))
            lo = hi
        start = stop
    return [done[first[key]] for key in keys]


def _pairs(transfers: list[tuple[int, int, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(src peers, dst peers) of the transfers."""
    return (np.fromiter((t[0] for t in transfers), dtype=np.int64, count=len(transfers)),
            np.fromiter((t[1] for t in transfers), dtype=np.int64, count=len(transfers)))


def _class_totals(lay: _Layout, transfers: list[tuple[int, int, float]], num_groups: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the bytes of every (route, link) entry, the class's bytes on each of its links (``lay.ids``), each
    translate's bottleneck: seconds its busiest link takes to carry the class's bytes on it)."""
    nbytes = np.fromiter((t[2] for t in transfers), dtype=float, count=len(transfers))
    weights = np.repeat(np.tile(nbytes, num_groups), lay.hops)
    total = np.bincount(lay.compact, weights=weights, minlength=len(lay.ids))
    necks = np.zeros(num_groups)
    np.maximum.at(necks, lay.owner, (total / lay.capacity)[lay.compact])
    return weights, total, necks


def class_necks_s(topology: Topology, groups: np.ndarray, transfers: list[tuple[int, int, float]]) -> np.ndarray:
    """Each translate's (row of ``groups``) class bottleneck, every translate running the plan ``transfers`` (in
    peers): seconds its busiest link takes to carry what the whole class puts on it (`_class_loads_batched`'s
    ``necks``; for the first translate the `_bottleneck` of its class bytes)."""
    return _class_totals(_layout(topology, groups, *_pairs(transfers)), transfers, len(groups))[2]


def _class_loads_batched(topology: Topology, groups: np.ndarray, transfers: list[tuple[int, int, float]],
                         levels: np.ndarray | None, layout: _Layout | None = None
                         ) -> tuple[dict[int, float], dict[int, float], bool, dict[int, int], dict[int, int]]:
    """`_class_loads` for many translates at once: every translate's routes in one numpy batch (``layout``:
    theirs, if already resolved)."""
    lay = layout if layout is not None else _layout(topology, groups, *_pairs(transfers))
    weights, total, necks = _class_totals(lay, transfers, len(groups))
    symmetric = bool(necks.max() <= necks[0] * (1 + _SYMMETRY_REL) + 1e-300)
    own_bytes = np.bincount(lay.own_compact, weights=weights[lay.mine], minlength=len(lay.own_ids))
    class_bytes = total[lay.own_in_class]
    entry_levels = None
    if levels is not None:  # the level of every entry: of its transfer (routes are translate-major)
        entry_levels = np.repeat(np.tile(levels, len(groups)), lay.hops)
    class_flows = _peak_flows(lay.compact, len(lay.ids), entry_levels)[lay.own_in_class]
    own_flows = _peak_flows(lay.own_compact, len(lay.own_ids), None if entry_levels is None else entry_levels[lay.mine])
    own_ids = lay.own_ids.tolist()
    own = dict(zip(own_ids, own_bytes.tolist(), strict=True))
    return (own, dict(zip(own_ids, class_bytes.tolist(), strict=True)), symmetric,
            dict(zip(own_ids, own_flows.tolist(), strict=True)), dict(zip(own_ids, class_flows.tolist(), strict=True)))


