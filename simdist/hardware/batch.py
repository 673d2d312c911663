"""Routes and link capacities for many GPU pairs at once, as numpy arrays.

`Topology.route` resolves one pair in Python (~10 us cold); a 16,384-rank ring has 131,072 edges and
an all_to_all a million pairs. Every route is a node-local shape placed by arithmetic on link ids
(simdist.hardware.topology), so pairs that share (source local GPU, destination local GPU, same node
or not, same leaf or not) share everything but their offsets: one template per such class (computed
by `Topology.route` itself, so bandwidths and latencies are bit-for-bit the same floats) and numpy
arithmetic for the link ids of every member. Link ids, NIC ids, leaves and the ECMP spine of a leaf-crossing
pair come from the same functions `Topology.route` uses (`Topology.layout`, `Fabric.nic_id`, `Fabric.leaf_of`,
`Fabric.spine_for`), applied to arrays.

`RouteBatch` stores routes as CSR: route ``i`` crosses ``links[indptr[i]:indptr[i + 1]]`` in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from typing import get_args

import numpy as np

from simdist.hardware.layout import LinkLayout
from simdist.hardware.link import Route, join
from simdist.hardware.topology import ROUTE_TEMPLATES_MAX, Topology
from simdist.spec.topology import LinkKind

LINK_KINDS: tuple[str, ...] = get_args(LinkKind)
"""Bit ``k`` of `RouteBatch.kind_mask` is set when a route crosses a link of kind ``LINK_KINDS[k]``."""
KIND_BIT = {kind: 1 << k for k, kind in enumerate(LINK_KINDS)}

@dataclass(frozen=True, slots=True, eq=False)
class RouteBatch:
    """Routes of n pairs: links in CSR form plus each route's figures (see `Route`)."""

    src: np.ndarray
    dst: np.ndarray
    indptr: np.ndarray
    links: np.ndarray
    bandwidth_Bps: np.ndarray
    effective_bandwidth_Bps: np.ndarray
    latency_s: np.ndarray
    kind_mask: np.ndarray
    """Bit mask of the link kinds each route crosses (bits: `KIND_BIT`)."""
    _derived: dict = field(default_factory=dict, repr=False)
    """What `link_index` and `distinct_capacities_Bps` computed, shared with the `with_latency` copies (same links)."""

    def __len__(self) -> int:
        return len(self.src)

    @property
    def hops(self) -> np.ndarray:
        return np.diff(self.indptr)

    def route(self, i: int) -> Route:
        """Route ``i`` as a `Route` (the same value `Topology.route` gives)."""
        lo, hi = self.indptr[i], self.indptr[i + 1]
        return Route(int(self.src[i]), int(self.dst[i]), tuple(int(x) for x in self.links[lo:hi]),
                     float(self.bandwidth_Bps[i]), float(self.effective_bandwidth_Bps[i]), float(self.latency_s[i]))

    def owners(self) -> np.ndarray:
        """Route index of every entry of ``links``."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.hops)

    def with_latency(self, latency_s: np.ndarray) -> RouteBatch:
        return RouteBatch(self.src, self.dst, self.indptr, self.links, self.bandwidth_Bps,
                          self.effective_bandwidth_Bps, latency_s, self.kind_mask, self._derived)

    def link_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct link ids, ascending; the index of each entry of ``links`` among them), as ``np.unique``
        with ``return_inverse`` gives them; computed once per batch."""
        hit = self._derived.get("index")
        if hit is None:
            ids, compact = np.unique(self.links, return_inverse=True)
            hit = self._derived["index"] = (ids, compact.reshape(-1))
        return hit

    def distinct_capacities_Bps(self, layout: LinkLayout) -> np.ndarray:
        """Effective capacity of each of ``link_index()[0]`` on ``layout`` (the topology the batch was routed on);
        computed once per batch."""
        hit = self._derived.get("capacities")
        if hit is None or hit[0] is not layout:
            hit = self._derived["capacities"] = (layout, layout.capacities_Bps(self.link_index()[0]))
        return hit[1]

    @property
    def nbytes(self) -> int:
        """Bytes its arrays hold, plus the most `link_index` and `distinct_capacities_Bps` hold once computed
        (one int64 per entry of ``links``, and at most as many distinct ids and capacities)."""
        arrays = (self.src, self.dst, self.indptr, self.links, self.bandwidth_Bps, self.effective_bandwidth_Bps,
                  self.latency_s, self.kind_mask)
        return sum(int(a.nbytes) for a in arrays) + 3 * int(self.links.nbytes)

    @classmethod
    def from_routes(cls, routes: list[Route], kind_mask: np.ndarray) -> RouteBatch:
        lengths = np.fromiter((len(r.links) for r in routes), dtype=np.int64, count=len(routes))
        return cls(
            src=np.fromiter((r.src for r in routes), dtype=np.int64, count=len(routes)),
            dst=np.fromiter((r.dst for r in routes), dtype=np.int64, count=len(routes)),
            indptr=np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
            links=np.fromiter((x for r in routes for x in r.links), dtype=np.int64, count=int(lengths.sum())),
            bandwidth_Bps=np.array([r.bandwidth_Bps for r in routes], dtype=float),
            effective_bandwidth_Bps=np.array([r.effective_bandwidth_Bps for r in routes], dtype=float),
            latency_s=np.array([r.latency_s for r in routes], dtype=float),
            kind_mask=np.asarray(kind_mask, dtype=np.int64),
        )


def segment_positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for every (s, n) of (starts, lengths)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)


def interleave(mask: np.ndarray, unmasked: RouteBatch, masked: RouteBatch) -> RouteBatch:
    """One batch in pair order from the routes of the pairs where ``mask`` is False and True."""
    mask = np.asarray(mask, dtype=bool)
    n = len(mask)
    lengths = np.empty(n, dtype=np.int64)
    lengths[~mask] = unmasked.hops
    lengths[mask] = masked.hops
    indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    links = np.empty(int(indptr[-1]), dtype=np.int64)
    links[segment_positions(indptr[:-1][~mask], unmasked.hops)] = unmasked.links
    links[segment_positions(indptr[:-1][mask], masked.hops)] = masked.links

    def merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.empty(n, dtype=a.dtype)
        out[~mask] = a
        out[mask] = b
        return out

    return RouteBatch(merge(unmasked.src, masked.src), merge(unmasked.dst, masked.dst), indptr, links,
                      merge(unmasked.bandwidth_Bps, masked.bandwidth_Bps),
                      merge(unmasked.effective_bandwidth_Bps, masked.effective_bandwidth_Bps),
                      merge(unmasked.latency_s, masked.latency_s), merge(unmasked.kind_mask, masked.kind_mask))


def _gpu_nics(topology: Topology, node: np.ndarray, gpu: np.ndarray) -> np.ndarray:
    """Global NIC of GPU ``gpu`` of node ``node`` (`NodeGraph.nic_of_gpu`), -1 where the GPU has none."""
    fabric = topology.fabric
    assert fabric is not None
    nic_of = np.array([-1 if x is None else x for x in topology.node.nic_of_gpu], dtype=np.int64)
    local = nic_of[gpu]
    return np.where(local >= 0, fabric.nic_id(node, local), -1)


def _send_nics(topology: Topology, node: np.ndarray, gpu: np.ndarray, dst_gpu: np.ndarray) -> np.ndarray:
    """Global NIC a route from GPU ``gpu`` of node ``node`` to local GPU ``dst_gpu`` of another node leaves by
    (`Topology.send_nic`: its own, or PXN's on a multi-plane fabric), -1 where the GPU has none."""
    fabric = topology.fabric
    assert fabric is not None
    if fabric.planes == 1:
        return _gpu_nics(topology, node, gpu)
    local = topology.send_nic_table[gpu, dst_gpu]
    return np.where(local >= 0, fabric.nic_id(node, local), -1)


def _kind_mask(topology: Topology, links: tuple[int, ...]) -> int:
    return _kinds_mask(topology.link(link).kind for link in links)


def _kinds_mask(kinds: Iterable[str]) -> int:
    mask = 0
    for kind in kinds:
        mask |= KIND_BIT[kind]
    return mask


# Slots of a route template (`_template`): what each link of a route is, given its pair.
_SRC_NODE, _DST_NODE, _NIC_UP, _NIC_DOWN, _SPINE_UP, _SPINE_DOWN, _CORE_UP, _CORE_DOWN = range(8)


@dataclass(frozen=True, slots=True, eq=False)
class _Template:
    """The route of one class of pairs, with its links as slots: a local link of the source's (or destination's)
    node, or the source NIC's uplink, the spine links, the destination NIC's downlink (placed per pair)."""

    slots: tuple[int, ...]
    local: tuple[int, ...]
    """The local link (an index into `NodeGraph.links`) of each node slot (0 for the others)."""
    bandwidth_Bps: float
    effective_bandwidth_Bps: float
    latency_s: float
    kind_mask: int


def _template(topology: Topology, src: int, dst: int, inter: bool, cross: bool, pods: bool = False) -> _Template:
    """The template of the class of the pair (src, dst): its route as `Topology.route` builds it (the same
    segments joined by `join`: the same floats), a route inside a node without placing it."""
    node, g = topology.node, topology.gpus_per_node
    src_gpu, dst_gpu = src % g, dst % g
    if not inter:
        shape = node.path(node.gpus[src_gpu], node.gpus[dst_gpu])
        r = join(src, dst, [(shape.links, shape)])
        return _Template((_SRC_NODE,) * len(shape.links), shape.links, r.bandwidth_Bps, r.effective_bandwidth_Bps,
                         r.latency_s, _kinds_mask(node.links[i].kind for i in shape.links))
    r = topology.route(src, dst)
    up = tuple(link for shape in topology.send_path(src_gpu, dst_gpu) for link in shape.links)
    down = node.path(node.nics[node.nic_of_gpu[dst_gpu]], node.gpus[dst_gpu]).links
    middle = ((_NIC_UP, _SPINE_UP, _CORE_UP, _CORE_DOWN, _SPINE_DOWN, _NIC_DOWN) if pods
              else (_NIC_UP, _SPINE_UP, _SPINE_DOWN, _NIC_DOWN) if cross else (_NIC_UP, _NIC_DOWN))
    slots = (_SRC_NODE,) * len(up) + middle + (_DST_NODE,) * len(down)
    assert len(slots) == len(r.links)
    return _Template(slots, tuple(up) + (0,) * len(middle) + tuple(down), r.bandwidth_Bps,
                     r.effective_bandwidth_Bps, r.latency_s, _kind_mask(topology, r.links))


def routes(topology: Topology, src: np.ndarray, dst: np.ndarray) -> RouteBatch:
    """Routes from GPU ``src[i]`` to GPU ``dst[i]``: the same links, bandwidths and latency as
    ``topology.route(src[i], dst[i])``, with one `Topology.route` call per class of pairs the topology has not
    seen yet (`Topology.route_templates`) and numpy arithmetic for every link of every route."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    n = len(src)
    both = np.concatenate((src, dst))
    outside = (both < 0) | (both >= topology.num_gpus)
    if outside.any():
        topology.locate(int(both[outside][0]))  # raises the TopologyError
    g = topology.gpus_per_node
    layout = topology.layout
    src_node, src_gpu = np.divmod(src, g)
    dst_node, dst_gpu = np.divmod(dst, g)
    inter = src_node != dst_node
    fabric = topology.fabric
    cross = np.zeros(n, dtype=bool)
    pods = cross
    src_nic = dst_nic = np.zeros(n, dtype=np.int64)
    if fabric is not None and inter.any():
        src_nic = _send_nics(topology, src_node, src_gpu, dst_gpu)
        dst_nic = _gpu_nics(topology, dst_node, dst_gpu)
        if (src_nic[inter] < 0).any() or (dst_nic[inter] < 0).any():
            k = int(np.flatnonzero(inter & ((src_nic < 0) | (dst_nic < 0)))[0])
            topology.route(int(src[k]), int(dst[k]))  # raises the TopologyError
        cross = inter & (fabric.leaf_of(src_nic) != fabric.leaf_of(dst_nic))
        if fabric.cores_per_group:
            pods = cross & (fabric.pod_of(fabric.leaf_of(src_nic)) != fabric.pod_of(fabric.leaf_of(dst_nic)))
    # class of a pair: (local source GPU, local destination GPU, inter-node, crosses the spine layer, crosses the
    # core); its members' routes differ in the nodes, NICs, spine and core they are placed on only
    # (simdist.hardware.topology)
    code = (((src_gpu * g + dst_gpu) * 2 + inter) * 2 + cross) * 2 + pods
    classes, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    num = len(classes)
    known = topology.route_templates
    templates: list[_Template] = []
    for c, k in zip(classes.tolist(), first.tolist(), strict=True):
        t = known.get(c)
        if t is None:
            if len(known) >= ROUTE_TEMPLATES_MAX:
                known.clear()
            t = known[c] = _template(topology, int(src[k]), int(dst[k]), bool(inter[k]), bool(cross[k]),
                                     bool(pods[k]))
        templates.append(t)
    hops = np.fromiter((len(t.slots) for t in templates), dtype=np.int64, count=num)
    bw = np.fromiter((t.bandwidth_Bps for t in templates), dtype=float, count=num)
    eff = np.fromiter((t.effective_bandwidth_Bps for t in templates), dtype=float, count=num)
    lat = np.fromiter((t.latency_s for t in templates), dtype=float, count=num)
    kind = np.fromiter((t.kind_mask for t in templates), dtype=np.int64, count=num)
    # the classes' slots and local links, end to end (class c's from offset[c]), read per link entry of every route
    offset = np.concatenate(([0], np.cumsum(hops)[:-1])).astype(np.int64)
    size = int(hops.sum())
    slots = np.fromiter(chain.from_iterable(t.slots for t in templates), dtype=np.int64, count=size)
    local = np.fromiter(chain.from_iterable(t.local for t in templates), dtype=np.int64, count=size)
    lengths = hops[inverse]
    indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    total = int(indptr[-1])
    owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
    at = np.arange(total, dtype=np.int64) + (offset[inverse] - indptr[:-1])[owner]
    slot = slots[at]
    loc = local[at]
    links = np.where(slot == _SRC_NODE, layout.node_link(src_node[owner], loc),
                     layout.node_link(dst_node[owner], loc))
    if fabric is not None and inter.any():
        at = slot == _NIC_UP
        links[at] = layout.nic_up(src_nic[owner[at]])
        at = slot == _NIC_DOWN
        links[at] = layout.nic_down(dst_nic[owner[at]])
        if cross.any():
            up, down = np.flatnonzero(slot == _SPINE_UP), np.flatnonzero(slot == _SPINE_DOWN)
            s_nic, d_nic = src_nic[owner[up]], dst_nic[owner[up]]  # the same pairs, in the same order
            spine = fabric.spine_for(s_nic, d_nic)
            s_leaf, d_leaf = fabric.leaf_of(s_nic), fabric.leaf_of(d_nic)
            links[up] = layout.spine_up(s_leaf, spine)
            links[down] = layout.spine_down(d_leaf, spine)
            if pods.any():
                c_up, c_down = np.flatnonzero(slot == _CORE_UP), np.flatnonzero(slot == _CORE_DOWN)
                s_nic, d_nic = src_nic[owner[c_up]], dst_nic[owner[c_up]]
                spine, core = fabric.spine_for(s_nic, d_nic), fabric.core_for(s_nic, d_nic)
                per_pod = fabric.num_spines
                links[c_up] = layout.core_up(fabric.pod_of(fabric.leaf_of(s_nic)) * per_pod + spine, core)
                links[c_down] = layout.core_down(fabric.pod_of(fabric.leaf_of(d_nic)) * per_pod + spine, core)
    return RouteBatch(src, dst, indptr, links, bw[inverse], eff[inverse], lat[inverse], kind[inverse])


def link_capacities(topology: Topology, link_ids: np.ndarray) -> np.ndarray:
    """Effective bandwidth (bytes/s) of each link id: ``topology.link(i).effective_bandwidth_Bps``
    (`LinkLayout.capacities_Bps`; IndexError for an id outside the topology)."""
    return topology.layout.capacities_Bps(link_ids)


def link_loads(batch: RouteBatch, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(link ids, bytes) crossing each link used by routes carrying ``nbytes[i]`` each, ids ascending."""
    ids, compact = batch.link_index()
    weights = np.repeat(np.asarray(nbytes, dtype=float), batch.hops)
    return ids, np.bincount(compact, weights=weights, minlength=len(ids))


def fabric_hops(topology: Topology, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Leaf -> spine and spine -> leaf link ids of the routes from GPU ``src[i]`` to GPU ``dst[i]``
    (the two links `routes` lists after the source NIC's uplink), -1 where a route does not climb
    to the spines (same node, or both NICs on one leaf). Cheaper than `routes` when only the
    fabric's upper tier matters."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    none = np.full(len(src), -1, dtype=np.int64)
    f = topology.fabric
    if f is None or f.num_spines == 0:
        return none, none.copy()
    g = topology.gpus_per_node
    src_node, src_gpu = np.divmod(src, g)
    dst_node, dst_gpu = np.divmod(dst, g)
    src_nic, dst_nic = _send_nics(topology, src_node, src_gpu, dst_gpu), _gpu_nics(topology, dst_node, dst_gpu)
    src_leaf, dst_leaf = f.leaf_of(src_nic), f.leaf_of(dst_nic)
    climbs = (src_node != dst_node) & (src_leaf != dst_leaf) & (src_nic >= 0) & (dst_nic >= 0)
    spine = f.spine_for(np.where(climbs, src_nic, 0), np.where(climbs, dst_nic, 0))
    layout = topology.layout
    up = np.where(climbs, layout.spine_up(src_leaf, spine), -1)
    down = np.where(climbs, layout.spine_down(dst_leaf, spine), -1)
    return up, down
