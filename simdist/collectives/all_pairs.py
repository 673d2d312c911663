"""Equal blocks between every ordered pair of a group's peers, priced from the route structure.

all_to_all, and the direct all_gather, reduce_scatter and two-shot all_reduce steps, move one block of
b bytes from every peer to every other. The detailed plan has P (P - 1) blocks, each at its planned rate
(its share of its busiest link in proportion to its bytes, simdist.collectives.pacing), so a block lands
after its route's latency plus b x (its busiest link's bytes per block byte) / capacity. With thousands
of peers that is millions of routes; this module gets the same figures from how routes are built
(simdist.hardware.topology.Topology.route): an inter-node route is the source GPU's segment to its NIC,
the NIC's uplink, two leaf-spine links when the NICs sit on different leaves (the ECMP hash of the NIC
pair, `Fabric.spine_for`), two spine-core links when the leaves sit in different pods of a 3-tier fabric
(`Fabric.core_for`), the destination NIC's downlink and its segment to the GPU. So:

- node links and NICs: every inter-node block of a peer crosses the same source segment and NIC, so the
  bytes there are counts x b (plus the intra-node blocks' routes, few);
- leaf-spine links: one ECMP hash per leaf-crossing NIC pair, counted per (leaf, spine), the spine of
  every pair kept as a byte array (the fast plan steers its flows with it); spine-core links likewise, per
  (spine, core) for the pairs in different pods;
- a pair's drain is the most loaded of its route's links, its latency its source segment's + the links'
  + its destination segment's (summed in another order than `Topology.route`: equal to rounding), one of
  a few values (by the two segments' latencies and whether the route climbs to a spine).

`AllPairs` holds all of it per block byte, independent of the protocol and the size (memoised on the
group), reduced per (source peer, block of destination nodes, latency class) to the largest drain: the
closed form of a one-step op, and the landing targets of the fast plan's flows (which stand for the
blocks from one peer to one block of nodes, simdist.collectives.direct_fast), are then O(P x blocks).
The results equal the per-route computation (tests/test_fast_fidelity.py) at O(P^2) numpy work,
one pass of ECMP hashes, and O(P^2) bytes of memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from simdist.collectives.group import Group
from simdist.hardware import batch

ROW_BLOCK = 1 << 21
"""Pairs handled per numpy pass (rows x P), bounding the temporaries to a few tens of MB."""
FAST_FLOWS = 1 << 17
"""Inter-node flows the fast plan may hold: one per (source peer, block of destination nodes), the blocks
as small as this allows (one node each up to ~128 nodes of 8 peers)."""


@dataclass(frozen=True, slots=True, eq=False)
class AllPairs:
    """Per-byte drains and latencies of the P (P - 1) blocks of an all-pairs step (module docstring)."""

    num_peers: int
    node: np.ndarray
    """[P] cluster node of each peer."""
    intra_src: np.ndarray
    intra_dst: np.ndarray
    intra_latency_s: np.ndarray
    """[pairs inside nodes] route latency, without any protocol latency."""
    intra_kind: np.ndarray
    """[pairs inside nodes] kind mask of the route (the protocol's latency class)."""
    intra_drain: np.ndarray
    """[pairs inside nodes] the busiest link's bytes per block byte / capacity (s/B)."""
    out_latency_s: np.ndarray
    """[P] latency of the peer's segment to its NIC plus its NIC's uplink."""
    in_latency_s: np.ndarray
    """[P] latency of the peer's NIC downlink plus its segment from the NIC."""
    spine_latency_s: float
    """The two leaf-spine links of a leaf-crossing route."""
    out_drain: np.ndarray
    in_drain: np.ndarray
    """[P] the busiest of the peer's segment and NIC links, per block byte (s/B)."""
    in_capacity_Bps: np.ndarray
    """[P] effective capacity of the peer's NIC downlink (1 without inter-node pairs)."""
    leaf: np.ndarray
    """[P] leaf of the peer's NIC (-1 without a fabric)."""
    spine: np.ndarray
    """[P, P] spine of each leaf-crossing pair (0 elsewhere)."""
    up_drain: np.ndarray
    down_drain: np.ndarray
    """[leaves x spines] leaf -> spine and spine -> leaf link drains per block byte (s/B)."""
    up_bytes: np.ndarray
    down_bytes: np.ndarray
    """[leaves x spines] blocks crossing each leaf-spine link (per block byte)."""
    spine_capacity_Bps: float
    num_spines: int
    pod: np.ndarray
    """[P] pod of the peer's leaf (0 without a core layer)."""
    core_latency_s: float
    """The two spine-core links of a route between pods (3 tiers)."""
    cores_per_group: int
    """0 without a core layer."""
    core_up_drain: np.ndarray
    core_down_drain: np.ndarray
    """[pods x spines x cores per group] spine -> core and core -> spine link drains per block byte (s/B)."""
    core: np.ndarray
    """[P, P] core (in its spine's group) of each pair between pods (0 elsewhere; empty without a core layer)."""
    node_block: np.ndarray
    """[P] the block of destination nodes each peer belongs to (the fast plan's flow granularity)."""
    num_blocks: int
    class_latency_s: np.ndarray
    """[classes] the inter-node route latencies that occur."""
    flow_drain: np.ndarray
    """[P, blocks, classes] the largest drain per block byte of the blocks from a peer to a node block
    with a route latency of that class (-inf where none)."""

    @property
    def has_inter(self) -> bool:
        return bool((self.node != self.node[0]).any())

    def _rows(self) -> Iterator[slice]:
        step = max(1, ROW_BLOCK // max(1, self.num_peers))
        for lo in range(0, self.num_peers, step):
            yield slice(lo, min(self.num_peers, lo + step))

    def _block(self, rows: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(drain per byte, latency, same node) of the pairs of ``rows`` x all peers."""
        cross = (self.leaf[rows, None] != self.leaf[None, :]) & (self.leaf[rows, None] >= 0)
        same = self.node[rows, None] == self.node[None, :]
        drain = np.maximum(self.out_drain[rows, None], self.in_drain[None, :])
        if self.num_spines:
            sp = self.spine[rows].astype(np.int64)
            up = self.up_drain[self.leaf[rows, None] * self.num_spines + sp]
            down = self.down_drain[np.maximum(self.leaf, 0)[None, :] * self.num_spines + sp]
            drain = np.where(cross & ~same, np.maximum(drain, np.maximum(up, down)), drain)
        lat = np.where(cross, self.out_latency_s[rows, None] + self.spine_latency_s, self.out_latency_s[rows, None])
        if self.cores_per_group:
            pods = cross & (self.pod[rows, None] != self.pod[None, :]) & ~same
            if pods.any():
                c, s = self.cores_per_group, self.num_spines
                sp, core = self.spine[rows].astype(np.int64), self.core[rows].astype(np.int64)
                up = self.core_up_drain[(self.pod[rows, None] * s + sp) * c + core]
                down = self.core_down_drain[(self.pod[None, :] * s + sp) * c + core]
                drain = np.where(pods, np.maximum(drain, np.maximum(up, down)), drain)
                lat = lat + np.where(pods, self.core_latency_s, 0.0)
        return drain, lat + self.in_latency_s[None, :], same

    def hop_class(self, rows: slice) -> np.ndarray:
        """[rows, P] 0: within a leaf (or a node), 1: via a spine, 2: via a spine and a core (3 tiers)."""
        cross = (self.leaf[rows, None] != self.leaf[None, :]) & (self.leaf[rows, None] >= 0)
        out = cross.astype(np.int64)
        if self.cores_per_group:
            out += cross & (self.pod[rows, None] != self.pod[None, :])
        return out

    def inter_landings(self, block_bytes: float, start: np.ndarray, extra_s: float,
                       rate_factor: float) -> Iterator[tuple[slice, np.ndarray]]:
        """(rows, lands[rows, :]) over row blocks: when each inter-node block lands, from ``start`` [P]
        (its source's start) plus route and ``extra_s`` latency plus its wire time; -inf inside nodes."""
        scale = block_bytes / rate_factor
        for rows in self._rows():
            drain, lat, same = self._block(rows)
            lands = start[rows, None] + (lat + extra_s) + scale * drain
            lands[same] = -np.inf
            yield rows, lands

    def flow_lands(self, block_bytes: float, extra_s: float, rate_factor: float) -> np.ndarray:
        """[P, blocks] when the last block from each peer to each node block lands (one step, all
        sources starting at 0; -inf where there is none)."""
        with np.errstate(invalid="ignore"):
            lands = (self.class_latency_s + extra_s)[None, None, :] + block_bytes / rate_factor * self.flow_drain
        return np.where(np.isfinite(self.flow_drain), lands, -np.inf).max(axis=2)

    def intra_lands(self, group: Group, block_bytes: float, start: np.ndarray, per_transfer_s: float,
                    rate_factor: float) -> np.ndarray:
        """When each intra-node block lands (`intra_src`, `intra_dst` order)."""
        return (start[self.intra_src] + (self.intra_latency_s + group.extra_latency(self.intra_kind))
                + per_transfer_s + block_bytes / rate_factor * self.intra_drain)


def step_lands(pairs: AllPairs, group: Group, block_bytes: float, start: np.ndarray | None, per_transfer_s: float,
               rate_factor: float) -> tuple[float, np.ndarray | None]:
    """(when the step's last block lands, when each peer's last incoming block lands) for blocks of
    ``block_bytes`` leaving peer i at ``start[i]`` (None: all at 0, and the second figure is not
    computed), priced as ``group`` prices routes (its protocol latency by route class) plus
    ``per_transfer_s``, with the protocol's ``rate_factor``."""
    p = pairs.num_peers
    zero = start is None
    start = np.zeros(p) if start is None else start
    ready = np.full(p, -np.inf)
    last = -np.inf
    if len(pairs.intra_src):
        lands = pairs.intra_lands(group, block_bytes, start, per_transfer_s, rate_factor)
        np.maximum.at(ready, pairs.intra_dst, lands)
        last = float(lands.max())
    if pairs.has_inter:
        extra = group.extra_latency_by_class.get("net", 0.0) + per_transfer_s
        if zero:
            return max(last, float(pairs.flow_lands(block_bytes, extra, rate_factor).max())), None
        for _, lands in pairs.inter_landings(block_bytes, start, extra, rate_factor):
            ready = np.maximum(ready, lands.max(axis=0))
            last = max(last, float(lands.max()))
    return last, ready


def _segments(group: Group, ranks: np.ndarray, node: np.ndarray) -> tuple[list, np.ndarray, list, np.ndarray]:
    """Per peer: (the links of its inter-node routes up to and including its NIC uplink, their latency),
    and (its NIC downlink and the links after it, their latency), read from one route to (from) a peer
    on another node: every inter-node route of a peer starts (ends) with the same links."""
    p = len(ranks)
    first = 0
    far = int(np.flatnonzero(node != node[first])[0])
    other = np.where(node == node[first], far, first)
    t = group.topology
    out_routes = batch.routes(t, ranks, ranks[other])
    in_routes = batch.routes(t, ranks[other], ranks)
    nodeg = t.node
    gpu = ranks % t.gpus_per_node
    outs, ins = [], []
    out_lat, in_lat = np.empty(p), np.empty(p)
    shapes: dict[int, tuple] = {}
    for i in range(p):
        g = int(gpu[i])
        if g not in shapes:
            nic = nodeg.nic_of_gpu[g]
            shapes[g] = (nodeg.path(nodeg.gpus[g], nodeg.nics[nic]), nodeg.path(nodeg.nics[nic], nodeg.gpus[g]))
        up, down = shapes[g]
        lo = out_routes.indptr[i]
        links = out_routes.links[lo:lo + len(up.links) + 1]
        outs.append(links)
        out_lat[i] = up.latency_s + t.link(int(links[-1])).latency_s
        hi = in_routes.indptr[i + 1]
        links = in_routes.links[hi - len(down.links) - 1:hi]
        ins.append(links)
        in_lat[i] = t.link(int(links[0])).latency_s + down.latency_s
    return outs, out_lat, ins, in_lat


def _node_blocks(node: np.ndarray) -> tuple[np.ndarray, int]:
    """Each peer's block of nodes (consecutive nodes of the group, as few per block as FAST_FLOWS allows)."""
    nodes, rank = np.unique(node, return_inverse=True)
    per_block = max(1, math.ceil(len(node) * (len(nodes) - 1) / FAST_FLOWS))
    block = rank.reshape(-1) // per_block
    return block, int(block.max()) + 1


def all_pairs(group: Group) -> AllPairs:
    """The all-pairs structure of ``group`` (memoised on it; independent of protocol and size)."""
    hit = group.memo.get("all_pairs")
    if hit is not None:
        return hit
    t = group.topology
    ranks = np.asarray(group.ranks, dtype=np.int64)
    p = len(ranks)
    g = t.gpus_per_node
    node = ranks // g
    intra_src, intra_dst = _intra_pairs(node)
    intra = batch.routes(t, ranks[intra_src], ranks[intra_dst])
    entries, weights = [intra.links], [np.ones(len(intra.links))]
    fabric = t.fabric
    inter_count = p - np.bincount(node, minlength=int(node.max()) + 1)[node]  # blocks each peer sends off-node
    leaf = np.full(p, -1, dtype=np.int64)
    num_spines = fabric.num_spines if fabric is not None and (inter_count > 0).any() else 0
    spine = np.zeros((p, p) if num_spines else (0, 0), dtype=np.uint8 if num_spines <= 256 else np.uint16)
    size = fabric.num_leaves * num_spines if num_spines else 0
    up_count, down_count = np.zeros(size), np.zeros(size)
    out_lat = in_lat = np.zeros(p)
    outs: list = []
    ins: list = []
    spine_lat, spine_capacity = 0.0, 1.0
    cores = fabric.cores_per_group if num_spines and fabric is not None else 0
    pod = np.zeros(p, dtype=np.int64)
    core = np.zeros((p, p) if cores else (0, 0), dtype=np.uint8 if cores <= 256 else np.uint16)
    core_size = fabric.num_pods * num_spines * cores if cores else 0
    core_up, core_down = np.zeros(core_size), np.zeros(core_size)
    core_lat, core_capacity = 0.0, 1.0
    if (inter_count > 0).any():
        assert fabric is not None
        outs, out_lat, ins, in_lat = _segments(group, ranks, node)
        for links, count in zip(outs + ins, np.concatenate((inter_count, inter_count)), strict=True):
            entries.append(links)
            weights.append(np.full(len(links), float(count)))
        nic_of = np.array([-1 if x is None else x for x in t.node.nic_of_gpu], dtype=np.int64)
        nic = fabric.nic_id(node, nic_of[ranks % g])
        leaf = fabric.leaf_of(nic)
        if cores:
            pod = fabric.pod_of(leaf)
        if num_spines:
            crossing = None
            for rows in _row_blocks(p):
                # NICs on one leaf never climb, so the pairs of one node (one NIC or NICs of one leaf
                # group) need no mask of their own: a node's NICs on different leaves are rails
                cross = (leaf[rows, None] != leaf[None, :]) & (node[rows, None] != node[None, :])
                if not cross.any():
                    continue
                sp = np.where(cross, fabric.spine_for(nic[rows, None], nic[None, :]), 0)
                spine[rows] = sp
                up_count += np.bincount((leaf[rows, None] * num_spines + sp)[cross], minlength=size)
                down_count += np.bincount((leaf[None, :] * num_spines + sp)[cross], minlength=size)
                if cores:
                    pods = cross & (pod[rows, None] != pod[None, :])
                    if pods.any():
                        c = np.where(pods, fabric.core_for(nic[rows, None], nic[None, :]), 0)
                        core[rows] = c
                        core_up += np.bincount(((pod[rows, None] * num_spines + sp) * cores + c)[pods],
                                               minlength=core_size)
                        core_down += np.bincount(((pod[None, :] * num_spines + sp) * cores + c)[pods],
                                                 minlength=core_size)
                if crossing is None:
                    i, j = np.argwhere(cross)[0]
                    crossing = (rows.start + int(i), int(j))
            if crossing is not None:
                r = batch.routes(t, ranks[[crossing[0]]], ranks[[crossing[1]]])
                u = len(outs[crossing[0]])
                up_link = int(r.links[u])
                # the leaf-spine link down is the next one, or the third after it past the two core links
                down_link = int(r.links[u + 3 if cores and pod[crossing[0]] != pod[crossing[1]] else u + 1])
                spine_lat = t.link(up_link).latency_s + t.link(down_link).latency_s
                spine_capacity = float(batch.link_capacities(t, np.array([up_link]))[0])
            if cores and core_up.any():  # the two spine-core links of a route between pods
                core_lat = fabric.latency_s + fabric.latency_s
                core_capacity = t.layout.core_capacity_Bps
    ids, inverse = np.unique(np.concatenate(entries), return_inverse=True)
    load = np.bincount(inverse.reshape(-1), weights=np.concatenate(weights), minlength=len(ids))
    drain = load / batch.link_capacities(t, ids)
    intra_drain = np.zeros(len(intra_src))
    if len(intra.links):
        per_entry = drain[np.searchsorted(ids, intra.links)]
        nonempty = intra.hops > 0
        intra_drain[nonempty] = np.maximum.reduceat(per_entry, intra.indptr[:-1][nonempty])

    def worst(groups: list) -> np.ndarray:
        if not groups:
            return np.zeros(p)
        lengths = np.array([len(x) for x in groups])
        per_entry = drain[np.searchsorted(ids, np.concatenate(groups))]
        return np.maximum.reduceat(per_entry, np.concatenate(([0], np.cumsum(lengths)[:-1])))

    block, num_blocks = _node_blocks(node)
    pairs = AllPairs(
        num_peers=p, node=node, intra_src=intra_src.astype(np.int64), intra_dst=intra_dst.astype(np.int64),
        intra_latency_s=intra.latency_s, intra_kind=intra.kind_mask, intra_drain=intra_drain,
        out_latency_s=np.asarray(out_lat), in_latency_s=np.asarray(in_lat), spine_latency_s=spine_lat,
        out_drain=worst(outs), in_drain=worst(ins),
        in_capacity_Bps=batch.link_capacities(t, np.array([x[0] for x in ins], dtype=np.int64)) if ins else np.ones(p),
        leaf=leaf, spine=spine, up_drain=up_count / spine_capacity,
        down_drain=down_count / spine_capacity, up_bytes=up_count, down_bytes=down_count,
        spine_capacity_Bps=spine_capacity, num_spines=num_spines, pod=pod, core_latency_s=core_lat,
        cores_per_group=cores, core_up_drain=core_up / core_capacity, core_down_drain=core_down / core_capacity,
        core=core, node_block=block, num_blocks=num_blocks,
        class_latency_s=np.zeros(0), flow_drain=np.zeros((p, num_blocks, 0)))
    pairs = _with_flow_drains(pairs)
    group.memo["all_pairs"] = pairs
    return pairs


def _intra_pairs(node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair of distinct peers on one node, grouped by node."""
    order = np.argsort(node, kind="stable")
    bounds = np.flatnonzero(np.diff(node[order])) + 1
    src, dst = [], []
    for members in np.split(order, bounds):
        a, b = np.meshgrid(members, members, indexing="ij")
        keep = a != b
        src.append(a[keep])
        dst.append(b[keep])
    return np.concatenate(src).astype(np.int64), np.concatenate(dst).astype(np.int64)


def _row_blocks(p: int) -> Iterator[slice]:
    step = max(1, ROW_BLOCK // max(1, p))
    for lo in range(0, p, step):
        yield slice(lo, min(p, lo + step))


def _with_flow_drains(pairs: AllPairs) -> AllPairs:
    """``pairs`` with the largest drain per (source, node block, latency class) filled in."""
    p = pairs.num_peers
    if not pairs.has_inter:
        return pairs
    out_values, out_class = np.unique(pairs.out_latency_s, return_inverse=True)
    in_values, in_class = np.unique(pairs.in_latency_s, return_inverse=True)
    n_in = len(in_values)
    # class = (source segment, tiers climbed: `AllPairs.hop_class`, destination segment); its latency as `_block`
    # sums it
    oc, cr, ic = np.meshgrid(np.arange(len(out_values)), np.arange(3), np.arange(n_in), indexing="ij")
    climb = np.where(cr >= 1, out_values[oc] + pairs.spine_latency_s, out_values[oc])
    latency = (np.where(cr == 2, climb + pairs.core_latency_s, climb) + in_values[ic]).reshape(-1)
    classes = len(latency)
    flow = np.full(p * pairs.num_blocks * classes, -np.inf)
    for rows in pairs._rows():
        drain, _, same = pairs._block(rows)
        code = (out_class.reshape(-1)[rows, None] * 3 + pairs.hop_class(rows)) * n_in + in_class.reshape(-1)[None, :]
        index = ((np.arange(rows.start, rows.stop)[:, None] * pairs.num_blocks + pairs.node_block[None, :])
                 * classes + code)
        keep = ~same
        np.maximum.at(flow, index[keep], drain[keep])
    return AllPairs(**{**{name: getattr(pairs, name) for name in AllPairs.__slots__},
                       "class_latency_s": latency, "flow_drain": flow.reshape(p, pairs.num_blocks, classes)})
