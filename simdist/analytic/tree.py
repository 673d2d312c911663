"""Closed form of the pipelined tree plans (simdist.collectives.tree).

A phase (reduce up or broadcast down) streams k pieces of s bytes along every root-leaf path. A path
is a tandem of hops; a hop of constant time T_i passes k pieces in sum_i T_i + (k - 1) max_i T_i
(pipelined chain, Hockney model; Thakur, Rabenseifner & Gropp 2005 sec. 4.2; Sanders et al. 2009
sec. 2 for trees: depth + k - 1 piece steps). A hop's time is its route latency plus s over its share
of the busiest link it crosses, the share being that link's capacity over the number of tree edges of
the phase (all trees) that cross it (max-min fair sharing, simdist.analytic.loads): on an NVSwitch a
rank with two children sends at half its port's bandwidth, T = alpha + 2 s / B.

The first piece sees less contention than the full pipeline: its hop time counts only the edges
crossed in the same pipeline step (same depth going down, same subtree height going up). Reduce adds
one thing: children reduce into their parent one after another for each piece (the plan serialises
them, shallower subtree first), so the first piece from a child with m equally deep siblings before
it pays m extra hop latencies. All_reduce is the reduce phase then the broadcast phase (the
plan's root starts broadcasting after its reduction), so it costs their sum, plus the protocol's
start-up. NCCL's own model is the same shape: latency 2 x depth x hop latency and the bandwidth term
of the busiest port (src/graph/tuning.cc, tree: "2 * ((nRanks/nNodes-1) * intraLat + log2i(nNodes)
* interLat)").

Exact where every port's flows start together: on one NVSwitch node, broadcast (any peer count),
reduce on up to 6 peers, all_reduce on 2 or 3 peers and for one-piece messages (<= 1 MiB). Elsewhere
an estimate, measured (tests/test_collectives_tree_hd_hier.py): one NVSwitch node, all_reduce within
6 % (2.5 % at 1 GB, low: it misses some waits the serialised siblings add), reduce within 20 % either
way for 1-2 pieces and 3 % from 16 MB; dgx-h100 nodes, all_reduce within 4 % (2 nodes) and 16 %
(4 nodes, few pieces per tree) at 1 GB.
"""

from __future__ import annotations

from simdist.analytic.registry import register_closed_form
from simdist.collectives.group import Group
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request
from simdist.collectives.tree import children_of, subtree_heights, tree_parents_for, tree_pieces


def _levels(parent: list[int], up: bool) -> list[int]:
    """Pipeline step at which the first piece crosses each peer's edge to its parent: the peer's
    height (longest path down to a leaf) going up, its parent's depth going down."""
    if up:
        return subtree_heights(parent)
    depth = [0] * len(parent)
    order = [parent.index(-1)]
    kids = children_of(parent)
    for peer in order:
        order.extend(kids[peer])
        depth[peer] = 0 if parent[peer] == -1 else depth[parent[peer]] + 1
    return [max(0, d - 1) for d in depth]


def tree_phase_time_s(group: Group, parents: list[list[int]], size: float, pieces: int, up: bool,
                      per_transfer_latency_s: float = 0.0, rate_factor: float = 1.0) -> float:
    """One phase (``up``: reduce toward the roots, else broadcast from them) of ``pieces`` pieces of
    ``size`` bytes over every tree of ``parents`` at once."""
    topo = group.topology
    levels = [_levels(parent, up) for parent in parents]
    routes = {}
    steady: dict[int, int] = {}  # link -> tree edges crossing it (all busy once the pipeline is full)
    first: dict[tuple[int, int], int] = {}  # (level, link) -> edges crossing it in that pipeline step
    for t, parent in enumerate(parents):
        for c, p in enumerate(parent):
            if p == -1:
                continue
            route = routes[(t, c)] = group.path(c, p) if up else group.path(p, c)
            for link in route.links:
                steady[link] = steady.get(link, 0) + 1
                key = (levels[t][c], link)
                first[key] = first.get(key, 0) + 1

    capacity = {link: topo.link(link).effective_bandwidth_Bps for link in steady}

    def hop_time(route, count) -> float:
        share = max((count(lk) / capacity[lk] for lk in route.links), default=0.0)
        return route.latency_s + per_transfer_latency_s + size * share / rate_factor

    worst = 0.0
    for t, parent in enumerate(parents):
        kids = children_of(parent)
        height = subtree_heights(parent)
        # per peer: its hop's first-piece time (plus the siblings reducing into the parent ahead of it,
        # one at a time) and its steady (pipeline-full) time
        first_hop: dict[int, float] = {}
        steady_hop: dict[int, float] = {}
        for peer, p in enumerate(parent):
            if p == -1:
                continue
            route, level = routes[(t, peer)], levels[t][peer]
            hop = hop_time(route, lambda lk, level=level: first[(level, lk)])
            if up:
                twins = sum(height[s] == height[peer] and s < peer for s in kids[p])
                hop += twins * (route.latency_s + per_transfer_latency_s)
            first_hop[peer] = hop
            steady_hop[peer] = hop_time(route, steady.__getitem__)
        for leaf in range(len(parent)):
            if kids[leaf] or parent[leaf] == -1:
                continue
            total, slowest = _path_sums(leaf, parent, first_hop, steady_hop)
            worst = max(worst, total + (pieces - 1) * slowest)
    return worst


def _path_sums(leaf: int, parent: list[int], first_hop: dict[int, float],
               steady_hop: dict[int, float]) -> tuple[float, float]:
    """Sum of first-piece hop times and the slowest steady hop on the path from ``leaf`` to its root."""
    total = slowest = 0.0
    peer = leaf
    while parent[peer] != -1:
        total += first_hop[peer]
        slowest = max(slowest, steady_hop[peer])
        peer = parent[peer]
    return total, slowest


def tree_time_s(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.tree builds for ``req``."""
    if req.num_peers < 2:
        return proto.base_latency_s
    parents = tree_parents_for(req.op, req.group, req.root, req.num_channels())
    k = tree_pieces(req.nbytes, len(parents), req.num_peers)
    size = req.nbytes / (len(parents) * k)
    lat, factor = proto.per_transfer_latency_s, proto.rate_factor
    total = proto.base_latency_s
    if req.op != "broadcast":
        total += tree_phase_time_s(req.group, parents, size, k, True, lat, factor)
    if req.op != "reduce":
        total += tree_phase_time_s(req.group, parents, size, k, False, lat, factor)
    return total


register_closed_form("tree", tree_time_s)
