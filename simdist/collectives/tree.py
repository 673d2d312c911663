"""Tree algorithms: NCCL's double binary tree all_reduce, pipelined tree broadcast and reduce.

Double binary tree (Sanders, Speck & Traeff 2009, "Two-tree algorithms for full bandwidth broadcast,
reduction and scan"; NCCL 2.4 blog, "Massively scale your deep learning training with NCCL 2.4"):
two binary trees over the same ranks, the second the mirror (even count) or the shift by one (odd
count) of the first, so that no rank is interior in both (odd counts: rank 0 excepted, the root of
the first tree with one child). Each tree carries half the buffer, cut into k pieces that stream up
the tree (reduce: a rank sends piece j to its parent once every child's piece j has arrived) and back
down (broadcast: a rank forwards piece j to its children once it holds the final piece j). The two
directions overlap: the root sends piece j down as soon as it has reduced it, as NCCL's tree kernel
does (src/device/all_reduce.h, runTreeSplit: the root's directRecvReduceCopyDirectSend per chunk, the
other ranks reducing up and broadcasting down on separate warps at once).

Tree shape: NCCL's binary and double binary trees, joined across nodes with a chain through each node
(simdist.collectives.tree_shape), one double tree per channel.

Pipeline (simdist.collectives.pacing): every hop of a tree moves at the tree's rate, its share of its
busiest link among all the trees' connections of the op (up and down), and each connection (a tree
edge in one direction) sends its pieces in order, a piece's latency overlapping the previous piece's
bytes, as NCCL's primitives do on a tree channel (one bandwidth per tree graph, src/graph/tuning.cc).
A piece is NCCL's pipeline step (512 KiB, simdist.collectives.ring.PIPELINE_CHUNK_BYTES). The time of
a tree is then its longest chain of hops: for all_reduce, the longest leaf-to-root path up plus the
longest root-to-leaf path down, each hop paying its latency and one piece's wire time d, plus (k - 1) d
for the pieces behind the first (`tree_schedule`): NCCL's model, latency 2 x depth x hop latency plus
size / bandwidth (tuning.cc, tree: "2 * ((nRanks/nNodes-1) * intraLat + log2i(nNodes) * interLat)"),
with the pipeline's fill of (depth - 1) pieces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from simdist.collectives.group import Group
from simdist.collectives.pacing import edge_shares
from simdist.collectives.plan import Plan, Transfer
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.collectives.ring import pipeline_pieces
from simdist.collectives.tree_shape import children_of, peer_tree

DIRECTIONS = {"all_reduce": (True, True), "barrier": (True, True), "reduce": (True, False),
              "broadcast": (False, True)}
"""(reduces up, broadcasts down) per op."""

def tree_pieces(nbytes: float, num_trees: int) -> int:
    """Pieces per tree: NCCL's 512 KiB pipeline steps of the tree's share (at least one)."""
    return pipeline_pieces(nbytes / num_trees)


def tree_parents_for(op: str, group: Group, root: int = 0, channels: int = 1) -> list[list[int]]:
    """The trees the plan of ``op`` uses: for all_reduce both trees of every channel; for broadcast
    and reduce one tree per channel, rooted at ``root``.
    # Assumption: broadcast and reduce use a pipelined tree re-rooted at the root (NCCL runs them
    # as rings; the tree variant is the textbook one of Sanders et al. 2009 sec. 2)."""
    key = ("tree_parents", op in ("broadcast", "reduce"), root if op in ("broadcast", "reduce") else 0, channels)
    hit = group.memo.get(key)
    if hit is not None:
        return hit
    groups = list(group.by_node().values())
    if op in ("broadcast", "reduce"):
        out = [peer_tree(groups, 0, root, c) for c in range(channels)]
    else:
        out = [peer_tree(groups, w, None, c) for c in range(channels) for w in (0, 1)]
    group.memo[key] = out
    return out


@dataclass(frozen=True, slots=True)
class TreeSchedule:
    """When every connection of a tree plan delivers its last piece, uncontended.

    Flat over the trees: entry t x P + c is peer c of tree t. ``up_end[i]`` is when peer c's edge to
    its parent delivers its last piece (nan at a root or without an up phase), ``down_end[i]`` when
    the edge from c's parent to c does (nan at a root or without a down phase).
    """

    parents: np.ndarray
    """[trees, P] parent of each peer (-1 at the root)."""
    rates_Bps: np.ndarray
    """[trees] each tree's rate (wire bytes/s)."""
    pieces: int
    piece_bytes: float
    up_end: np.ndarray
    down_end: np.ndarray
    up_latency_s: np.ndarray
    down_latency_s: np.ndarray

    @property
    def time_s(self) -> float:
        ends = np.concatenate((self.up_end, self.down_end))
        ends = ends[~np.isnan(ends)]
        return float(ends.max()) if ends.size else 0.0


def _depths(parents: np.ndarray) -> np.ndarray:
    """Depth of every entry of a flat parent array (global indices, -1 at roots)."""
    depth = np.where(parents < 0, 0, -1)
    while (depth < 0).any():
        todo = np.flatnonzero(depth < 0)
        known = depth[parents[todo]] >= 0
        depth[todo[known]] = depth[parents[todo[known]]] + 1
    return depth


def tree_connections(parents: np.ndarray, up: bool, down: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tree, src peer, dst peer) of every connection of the trees ``parents`` [trees, P]: up edges
    (child to parent) then down edges (parent to child), non-roots in peer order."""
    t, c = np.nonzero(parents >= 0)
    p = parents[t, c]
    parts = ([(t, c, p)] if up else []) + ([(t, p, c)] if down else [])
    return tuple(np.concatenate(x) for x in zip(*parts, strict=True))  # type: ignore[return-value]


def tree_rates(group: Group, parents: np.ndarray, up: bool, down: bool) -> np.ndarray:
    """Each tree's rate (wire bytes/s): the least over its connections of their share of their links
    among all the trees' connections (simdist.collectives.pacing.edge_shares)."""
    tree, src, dst = tree_connections(parents, up, down)
    out = np.full(len(parents), math.inf)
    if len(tree):
        np.minimum.at(out, tree, edge_shares(group, src, dst))
    return out


def tree_schedule(req: Request) -> TreeSchedule:
    """The uncontended schedule of the tree plan of ``req`` (see the module docstring), vectorised over
    the trees and their levels: with d a piece's wire time at the tree's rate (protocol rate factor
    included) and lat a hop's latency (protocol latency included),
    up_end(c) = lat + d + max(0, max over c's children of their up_end - (k - 1) d) + (k - 1) d, and
    down_end(c) = lat + d + (start of c's parent) + (k - 1) d, the root starting once it has every
    child's first piece (all_reduce) or at once (broadcast)."""
    up, down = DIRECTIONS[req.op]
    parents = np.asarray(tree_parents_for(req.op, req.group, req.root, req.num_channels()), dtype=np.int64)
    trees, p = parents.shape
    k = tree_pieces(req.nbytes, trees)
    size = req.nbytes / (trees * k)
    key = ("tree_rates", parents.tobytes(), up, down)
    rates = req.group.memo.get(key)
    if rates is None:
        rates = req.group.memo[key] = tree_rates(req.group, parents, up, down)
    proto = req.protocol
    with np.errstate(invalid="ignore"):
        d = np.where(size > 0, size / proto.rate_factor / rates, 0.0)
    key = ("tree_levels", parents.tobytes(), parents.shape)
    shape = req.group.memo.get(key)
    if shape is None:  # the trees' shape: shared by every protocol and size
        flat = np.where(parents >= 0, parents + np.arange(trees)[:, None] * p, -1).reshape(-1)
        depth = _depths(flat)
        levels = [np.flatnonzero(depth == level) for level in range(int(depth.max()) + 1)]
        shape = req.group.memo[key] = (flat, depth, levels)
    flat, depth, levels = shape
    child = np.flatnonzero(flat >= 0)
    ranks_src = child % p
    ranks_dst = flat[child] % p
    lat_up = np.full(trees * p, np.nan)
    lat_down = np.full(trees * p, np.nan)
    extra = proto.per_transfer_latency_s
    if up:
        lat_up[child] = req.group.paths(ranks_src, ranks_dst).latency_s + extra
    if down:
        lat_down[child] = req.group.paths(ranks_dst, ranks_src).latency_s + extra
    hop_d = np.repeat(d, p)
    first_up = np.full(trees * p, np.nan)  # when c's first piece reaches its parent
    if up:
        best = np.zeros(trees * p)  # latest first piece into c from its children
        for nodes in reversed(levels[1:]):
            first_up[nodes] = lat_up[nodes] + hop_d[nodes] + best[nodes]
            np.maximum.at(best, flat[nodes], first_up[nodes])
        start = best  # at a root: when it holds every child's first piece
    else:
        start = np.zeros(trees * p)
    first_down = np.full(trees * p, np.nan)
    if down:
        for nodes in levels[1:]:
            above = flat[nodes]
            begin = np.where(depth[above] == 0, start[above], first_down[above])
            first_down[nodes] = begin + lat_down[nodes] + hop_d[nodes]
    tail = (k - 1) * hop_d
    return TreeSchedule(parents, rates, k, size, first_up + tail, first_down + tail, lat_up, lat_down)


def tree_plan(op: str, parents: list[list[int]], nbytes: float, pieces: int,
              rates: np.ndarray | None = None) -> Plan:
    """Pipelined tree ``op`` (all_reduce, barrier, broadcast, reduce) over the trees ``parents``,
    each tree carrying 1/len(parents) of the buffer in ``pieces`` pieces (chunk = tree x pieces + piece).

    Dependencies: a peer sends piece j up once every child's piece j arrived (the children reduce into
    it concurrently: reductions commute), and down once it holds the final piece j (the root: once it
    has reduced it). ``rates``: per tree, the rate its transfers move at (`tree_rates`), each also sent
    after the previous piece on its connection (`Transfer.after`); None: plain transfers (to verify).
    """
    up_phase, down_phase = DIRECTIONS[op]
    p, k = len(parents[0]), pieces
    size = nbytes / (len(parents) * k)
    transfers: list[Transfer] = []
    trees = []
    for parent in parents:
        kids = children_of(parent)
        root = parent.index(-1)
        order = [root]  # parents before children
        for peer in order:
            order.extend(kids[peer])
        trees.append((parent, kids, root, order))
    last: dict[tuple[int, int, int], int] = {}  # (tree, src, dst) -> the connection's last transfer

    def emit(t: int, src: int, dst: int, chunk: int, reduce: bool, deps: list[int]) -> int:
        i = len(transfers)
        if rates is None:
            transfers.append(Transfer(src, dst, size, chunk, reduce, tuple(deps)))
        else:
            transfers.append(Transfer(src, dst, size, chunk, reduce, tuple(deps), max_rate_Bps=float(rates[t]),
                                      after=last.get((t, src, dst), -1)))
        last[(t, src, dst)] = i
        return i

    for piece in range(k):
        for t, (parent, kids, root, order) in enumerate(trees):
            chunk = t * k + piece
            arrived: dict[int, list[int]] = {}  # peer -> transfers that brought it this piece (up)
            if up_phase:
                for peer in reversed(order):  # children before parents
                    if peer != root:
                        arrived.setdefault(parent[peer], []).append(
                            emit(t, peer, parent[peer], chunk, True, arrived.get(peer, [])))
            if down_phase:
                held = {root: arrived.get(root, [])}
                for peer in order:
                    for child in kids[peer]:
                        held[child] = [emit(t, peer, child, chunk, False, list(held[peer]))]
    root = parents[0].index(-1)
    return Plan(op=op, algorithm="tree", num_peers=p, nbytes=nbytes, transfers=tuple(transfers),
                num_chunks=len(parents) * k, root=root)


def detailed_size(req: Request) -> int:
    """Transfers of the detailed plan of ``req`` (trees x pieces x edges x directions)."""
    up, down = DIRECTIONS[req.op]
    trees = req.num_channels() * (1 if req.op in ("broadcast", "reduce") else 2)
    return trees * tree_pieces(req.nbytes, trees) * (req.num_peers - 1) * (up + down)


def _build(req: Request) -> Plan:
    parents = tree_parents_for(req.op, req.group, req.root, req.num_channels())
    up, down = DIRECTIONS[req.op]
    rates = tree_rates(req.group, np.asarray(parents, dtype=np.int64), up, down)
    return tree_plan(req.op, parents, req.nbytes, tree_pieces(req.nbytes, len(parents)), rates)


def tree_fast(req: Request) -> Plan:
    """Fast fidelity: one flow per channel and tree edge direction, carrying the pieces of every
    connection of the channel on it (both trees of a channel may cross a pair, one up, one down).

    Each flow moves from the end of its latency at a steady rate that lands it when its tree ends
    (`tree_schedule`, with the request's protocol): its bytes over (the tree's time - its latency),
    the sum over its connections where it stands for several. That is below the tree's rate (a
    connection's pieces take k d of the tree's time), so alone every flow holds its rate, the flows of
    a tree end together, and the plan takes the detailed plan's time; next to other traffic a flow
    shares its links as the pieces do, spread over the whole collective, without holding up the hops
    after it. (Without bytes, barrier, a flow waits out its tree's time as extra latency.) Building
    costs O(trees x P) (numpy); the engine sees one join per distinct latency and one departure per tree.
    """
    sched = tree_schedule(req)
    up, down = DIRECTIONS[req.op]
    trees, p = sched.parents.shape
    k, size = sched.pieces, sched.piece_bytes
    flat = sched.parents.reshape(-1)
    child = np.flatnonzero(flat >= 0)
    tree = child // p
    ends = np.full(trees, 0.0)
    for part in (sched.up_end, sched.down_end):
        lands = part[child]
        ok = ~np.isnan(lands)
        np.maximum.at(ends, tree[ok], lands[ok])
    per_tree = 2 if req.op in ("all_reduce", "barrier") else 1
    channel = tree // per_tree
    src_parts, dst_parts, lat_parts = [], [], []
    if up:
        src_parts.append(child % p)
        dst_parts.append(flat[child] % p)
        lat_parts.append(sched.up_latency_s[child])
    if down:
        src_parts.append(flat[child] % p)
        dst_parts.append(child % p)
        lat_parts.append(sched.down_latency_s[child])
    directions = len(src_parts)
    src, dst, lat = np.concatenate(src_parts), np.concatenate(dst_parts), np.concatenate(lat_parts)
    tree_of, channel_of = np.tile(tree, directions), np.tile(channel, directions)
    reduces = np.repeat(np.array([True, False][:directions] if up else [False]), len(child))
    wire = k * size / req.protocol.rate_factor
    with np.errstate(divide="ignore", invalid="ignore"):
        cap = np.where((wire > 0) & (ends[tree_of] > lat), wire / (ends[tree_of] - lat), math.inf)
    # one flow per (channel, src, dst): its connections' bytes at the sum of their rates (they end together
    # when their trees do; trees of a channel that end at different times keep their own flows)
    end_class = np.unique(ends, return_inverse=True)[1].reshape(-1)
    key = ((channel_of * p + src) * p + dst) * trees + end_class[tree_of]
    _, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    rate = np.bincount(inverse, weights=np.where(np.isinf(cap), 0.0, cap))
    rate = np.where(np.bincount(inverse, weights=np.isinf(cap)) > 0, math.inf, rate)
    n = len(first)
    # without bytes (barrier) a flow lands when it starts: it starts when its tree ends
    extra = np.zeros(n) if wire > 0 else np.maximum(ends[tree_of[first]] - lat[first], 0.0)
    transfers = tuple(map(Transfer, src[first].tolist(), dst[first].tolist(), (counts * k * size).tolist(),
                          repeat(-1, n), reduces[first].tolist(), repeat((), n), extra.tolist(), rate.tolist()))
    return Plan(op=req.op, algorithm="tree", num_peers=p, nbytes=req.nbytes, transfers=transfers,
                num_chunks=0, root=req.root, channels=req.num_channels(), verifiable=False)


register(Algorithm(
    name="tree",
    ops=frozenset(DIRECTIONS),
    build=_build,
    build_fast=tree_fast,
    detailed_size=detailed_size,
    summary="NCCL's double binary tree, pipelined (tree over nodes, chain inside a node)",
))
