"""Routes and link capacities for many GPU pairs at once, as numpy arrays.

`Topology.route` resolves one pair in Python (~10 us cold); a 16,384-rank ring has 131,072 edges and
an all_to_all a million pairs. Every route is a node-local shape placed by arithmetic on link ids
(simdist.hardware.topology), so pairs that share (source local GPU, destination local GPU, same node
or not, same leaf or not) share everything but their offsets: one template per such class (computed
by `Topology.route` itself, so bandwidths and latencies are bit-for-bit the same floats) and numpy
arithmetic for the link ids of every member. The spine of a leaf-crossing pair is the fabric's ECMP
hash (MurmurHash3's finaliser) in uint64 arithmetic, which wraps modulo 2^64 as the scalar version's
mask does.

`RouteBatch` stores routes as CSR: route ``i`` crosses ``links[indptr[i]:indptr[i + 1]]`` in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import numpy as np

from simdist.hardware.link import Route
from simdist.hardware.topology import Topology
from simdist.spec.topology import LinkKind

LINK_KINDS: tuple[str, ...] = get_args(LinkKind)
"""Bit ``k`` of `RouteBatch.kind_mask` is set when a route crosses a link of kind ``LINK_KINDS[k]``."""
KIND_BIT = {kind: 1 << k for k, kind in enumerate(LINK_KINDS)}

_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
_S32 = np.uint64(32)


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
                          self.effective_bandwidth_Bps, latency_s, self.kind_mask)

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


def fmix64(key: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser over uint64 arrays (as `simdist.hardware.fabric._fmix64`)."""
    key = np.asarray(key, dtype=np.uint64).copy()
    key ^= key >> _S33
    key *= _C1
    key ^= key >> _S33
    key *= _C2
    key ^= key >> _S33
    return key


def leaves_of(topology: Topology, nic: np.ndarray) -> np.ndarray:
    """Leaf of each global NIC (as `Fabric.leaf_of`)."""
    f = topology.fabric
    assert f is not None
    node, local = np.divmod(nic, f.nics_per_node)
    if f.shape == "rail_optimized":
        return (node // f.down_ports) * f.nics_per_node + local
    return nic // f.down_ports


def spines_for(topology: Topology, src_nic: np.ndarray, dst_nic: np.ndarray) -> np.ndarray:
    """ECMP spine of each NIC pair (as `Fabric.spine_for`)."""
    f = topology.fabric
    assert f is not None
    key = (np.asarray(src_nic).astype(np.uint64) << _S32) | np.asarray(dst_nic).astype(np.uint64)
    return (fmix64(key) % np.uint64(f.num_spines)).astype(np.int64)


def _kind_mask(topology: Topology, links: tuple[int, ...]) -> int:
    mask = 0
    for link in links:
        mask |= KIND_BIT[topology.link(link).kind]
    return mask


def routes(topology: Topology, src: np.ndarray, dst: np.ndarray) -> RouteBatch:
    """Routes from GPU ``src[i]`` to GPU ``dst[i]``: the same links, bandwidths and latency as
    ``topology.route(src[i], dst[i])``, computed with one `Topology.route` call per class of pairs."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    n = len(src)
    both = np.concatenate((src, dst))
    outside = (both < 0) | (both >= topology.num_gpus)
    if outside.any():
        topology.locate(int(both[outside][0]))  # raises the TopologyError
    g = topology.gpus_per_node
    node = topology.node
    t = node.num_links
    src_node, src_gpu = np.divmod(src, g)
    dst_node, dst_gpu = np.divmod(dst, g)
    inter = src_node != dst_node
    fabric = topology.fabric
    cross = np.zeros(n, dtype=bool)
    src_nic = dst_nic = np.zeros(n, dtype=np.int64)
    if fabric is not None and inter.any():
        nic_of = np.array([-1 if x is None else x for x in node.nic_of_gpu], dtype=np.int64)
        if (nic_of[src_gpu[inter]] < 0).any() or (nic_of[dst_gpu[inter]] < 0).any():
            k = int(np.flatnonzero(inter & ((nic_of[src_gpu] < 0) | (nic_of[dst_gpu] < 0)))[0])
            topology.route(int(src[k]), int(dst[k]))  # raises the TopologyError
        src_nic = src_node * fabric.nics_per_node + nic_of[src_gpu]
        dst_nic = dst_node * fabric.nics_per_node + nic_of[dst_gpu]
        cross = inter & (leaves_of(topology, src_nic) != leaves_of(topology, dst_nic))
    # class of a pair: (local source GPU, local destination GPU, inter-node, crosses the spine layer)
    code = ((src_gpu * g + dst_gpu) * 2 + inter) * 2 + cross
    classes, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    num = len(classes)
    hops = np.empty(num, dtype=np.int64)
    bw = np.empty(num)
    eff = np.empty(num)
    lat = np.empty(num)
    kind = np.empty(num, dtype=np.int64)
    templates: list[Route] = []
    for c, k in enumerate(first):
        r = topology.route(int(src[k]), int(dst[k]))
        templates.append(r)
        hops[c], bw[c], eff[c], lat[c] = len(r.links), r.bandwidth_Bps, r.effective_bandwidth_Bps, r.latency_s
        kind[c] = _kind_mask(topology, r.links)
    lengths = hops[inverse]
    indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    links = np.empty(int(indptr[-1]), dtype=np.int64)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(num + 1))
    node_end = topology.num_nodes * t
    nic_end = node_end + 2 * (fabric.num_nics if fabric else 0)
    for c in range(num):
        members = order[bounds[c]:bounds[c + 1]]
        h = int(hops[c])
        if h == 0:
            continue
        rep = first[c]
        placed = np.asarray(templates[c].links, dtype=np.int64)
        if not inter[rep]:
            block = placed[None, :] + ((src_node[members] - src_node[rep]) * t)[:, None]
        else:
            assert fabric is not None
            up = node.path(node.gpus[int(src_gpu[rep])], node.nics[node.nic_of_gpu[int(src_gpu[rep])]])
            down = node.path(node.nics[node.nic_of_gpu[int(dst_gpu[rep])]], node.gpus[int(dst_gpu[rep])])
            u, d = len(up.links), len(down.links)
            block = np.empty((len(members), h), dtype=np.int64)
            block[:, :u] = np.asarray(up.links, dtype=np.int64)[None, :] + (src_node[members] * t)[:, None]
            block[:, u] = node_end + 2 * src_nic[members]
            if cross[rep]:
                s_nic, d_nic = src_nic[members], dst_nic[members]
                spine = spines_for(topology, s_nic, d_nic)
                s_leaf, d_leaf = leaves_of(topology, s_nic), leaves_of(topology, d_nic)
                block[:, u + 1] = nic_end + 2 * (s_leaf * fabric.num_spines + spine)
                block[:, u + 2] = nic_end + 2 * (d_leaf * fabric.num_spines + spine) + 1
            block[:, h - d - 1] = node_end + 2 * dst_nic[members] + 1
            block[:, h - d:] = np.asarray(down.links, dtype=np.int64)[None, :] + (dst_node[members] * t)[:, None]
        links[segment_positions(indptr[members], np.full(len(members), h))] = block.reshape(-1)
    return RouteBatch(src, dst, indptr, links, bw[inverse], eff[inverse], lat[inverse], kind[inverse])


def link_capacities(topology: Topology, link_ids: np.ndarray) -> np.ndarray:
    """Effective bandwidth (bytes/s) of each link id: ``topology.link(i).effective_bandwidth_Bps``."""
    ids = np.asarray(link_ids, dtype=np.int64)
    if len(ids) and (ids.min() < 0 or ids.max() >= topology.num_links):
        bad = int(ids[(ids < 0) | (ids >= topology.num_links)][0])
        topology.link(bad)  # raises IndexError
    node = topology.node
    t = node.num_links
    local = np.array([lk.bandwidth_Bps for lk in node.links], dtype=float) * \
        np.array([lk.efficiency for lk in node.links], dtype=float)
    node_end = topology.num_nodes * t
    out = np.empty(len(ids))
    in_node = ids < node_end
    out[in_node] = local[ids[in_node] % t]
    fabric = topology.fabric
    if fabric is not None:
        nic_end = node_end + 2 * fabric.num_nics
        is_nic = ~in_node & (ids < nic_end)
        out[is_nic] = fabric.nic_bandwidth_Bps * fabric.efficiency
        out[ids >= nic_end] = fabric.uplink_bandwidth_Bps * fabric.efficiency
    return out


def link_loads(batch: RouteBatch, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(link ids, bytes) crossing each link used by routes carrying ``nbytes[i]`` each, ids ascending."""
    ids, compact = np.unique(batch.links, return_inverse=True)
    weights = np.repeat(np.asarray(nbytes, dtype=float), batch.hops)
    return ids, np.bincount(compact.reshape(-1), weights=weights, minlength=len(ids))


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
    nic_of = np.array([-1 if x is None else x for x in topology.node.nic_of_gpu], dtype=np.int64)
    src_node, src_gpu = np.divmod(src, g)
    dst_node, dst_gpu = np.divmod(dst, g)
    src_nic = src_node * f.nics_per_node + nic_of[src_gpu]
    dst_nic = dst_node * f.nics_per_node + nic_of[dst_gpu]
    src_leaf, dst_leaf = leaves_of(topology, src_nic), leaves_of(topology, dst_nic)
    climbs = (src_node != dst_node) & (src_leaf != dst_leaf) & (nic_of[src_gpu] >= 0) & (nic_of[dst_gpu] >= 0)
    spine = spines_for(topology, np.where(climbs, src_nic, 0), np.where(climbs, dst_nic, 0))
    base = topology.num_nodes * topology.node.num_links + 2 * f.num_nics
    up = np.where(climbs, base + 2 * (src_leaf * f.num_spines + spine), -1)
    down = np.where(climbs, base + 2 * (dst_leaf * f.num_spines + spine) + 1, -1)
    return up, down
