"""Tree algorithms: NCCL's double binary tree all_reduce, pipelined tree broadcast and reduce.

Double binary tree (Sanders, Speck & Traeff 2009, "Two-tree algorithms for full bandwidth broadcast,
reduction and scan"; NCCL 2.4 blog, "Massively scale your deep learning training with NCCL 2.4"):
two binary trees over the same ranks, the second the mirror (even count) or the shift by one (odd
count) of the first, so that no rank is interior in both (odd counts: rank 0 excepted, the root of
the first tree with one child). Each tree carries half the buffer, cut into k pieces that stream up
the tree (reduce: a rank sends piece j to its parent once every child's piece j has arrived), then
back down (broadcast: a rank forwards piece j to its children once it holds the final piece j).

Tree shape: NCCL's ncclGetBtree / ncclGetDtree (src/graph/trees.cc), ported below: rank 0 is the
root with one child, every other rank has at most two, depth ceil(log2 P). Across nodes the trees
join nodes and a chain runs through each node (see peer_tree), one double tree per channel.
"""

from __future__ import annotations

from simdist.collectives.group import Group
from simdist.collectives.plan import Plan, Transfer
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.collectives.ring import pipeline_pieces

MAX_TREE_PIECES = 64
"""Pipeline pieces per tree at most (NCCL cuts into 512 KiB steps, thousands for a GB).
# Assumption: coarser pieces than NCCL's lengthen the pipeline fill: a phase takes about
# (depth + k - 1) piece times instead of k, i.e. + (depth - 1) / k (+ 5 % at depth 4, k = 64)."""

TREE_TRANSFER_BUDGET = 4096
"""Transfers a tree plan may hold: pieces shrink below MAX_TREE_PIECES so that 2 phases x trees x
(P - 1) edges x pieces stays within it (a 16-peer double tree: 64 pieces; with 8 channels: 8), which
keeps a 16-peer, 1 GB all_reduce well under 0.5 s of simulation."""


def btree_parent(n: int, rank: int) -> int:
    """Parent of ``rank`` in NCCL's binary tree over ``n`` ranks (-1 for the root, rank 0).

    Port of ncclGetBtree (src/graph/trees.cc): a rank's parent clears its lowest set bit and sets
    the next one up, or only clears it when that overshoots.
    """
    if rank == 0:
        return -1
    bit = 1
    while not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return rank ^ bit if up >= n else up


def dtree_parents(n: int, which: int) -> list[int]:
    """Parents in tree ``which`` (0 or 1) of NCCL's double binary tree (ncclGetDtree): tree 1 mirrors
    tree 0 (r -> n-1-r) when n is even and shifts it by one (r -> r+1 mod n) when n is odd."""
    first = [btree_parent(n, r) for r in range(n)]
    if which == 0:
        return first
    out = [-1] * n
    for r in range(n):
        if n % 2 == 0:
            p = first[n - 1 - r]
            out[r] = -1 if p == -1 else n - 1 - p
        else:
            p = first[(r - 1) % n]
            out[r] = -1 if p == -1 else (p + 1) % n
    return out


def peer_tree(groups: list[list[int]], which: int, root: int | None = None, channel: int = 0) -> list[int]:
    """Parent of every peer (-1 at the root) in tree ``which`` of ``channel``; ``groups`` = peers by node.

    One node: the binary tree over its peers. Several nodes: NCCL's layout, a binary tree over nodes
    whose edges join each node's head peer, and a chain through the node's peers from its head
    (src/graph/connect.cc, connectTrees; NCCL_TOPO_PATTERN_TREE: the head links up and down).
    # Assumption: channel c chains a node's peers starting at its c-th peer, tree 0 in order and
    # tree 1 in reverse, so trees and channels leave a node through different GPUs and NICs, as
    # NCCL's tree channels do (one per NIC).
    ``root``: the peer the tree is re-rooted at (rotating the rank order), for broadcast and reduce.
    """
    num_peers = sum(len(g) for g in groups)
    parent = [-1] * num_peers
    if len(groups) == 1:
        units = [[p] for p in groups[0]]
    else:
        units = [g[channel % len(g):] + g[:channel % len(g)] for g in groups]
        units = [u if which == 0 else u[::-1] for u in units]
    if root is not None:
        home = next(i for i, u in enumerate(units) if root in u)
        units = units[home:] + units[:home]
        at = units[0].index(root)
        units[0] = units[0][at:] + units[0][:at]
    for u, up in enumerate(dtree_parents(len(units), which)):
        chain = units[u]
        parent[chain[0]] = -1 if up == -1 else units[up][0]
        for i in range(1, len(chain)):
            parent[chain[i]] = chain[i - 1]
    return parent


def children_of(parent: list[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parent]
    for peer, up in enumerate(parent):
        if up != -1:
            kids[up].append(peer)
    return kids


def subtree_heights(parent: list[int]) -> list[int]:
    """Longest path from each peer down to a leaf of its subtree."""
    kids = children_of(parent)
    order = [parent.index(-1)]
    for peer in order:
        order.extend(kids[peer])
    height = [0] * len(parent)
    for peer in reversed(order):
        height[peer] = 1 + max((height[c] for c in kids[peer]), default=-1)
    return height


def _postorder(parent: list[int]) -> list[int]:
    """Peers with every child before its parent (root last), shallower subtrees first."""
    kids = children_of(parent)
    height = subtree_heights(parent)
    order: list[int] = []
    stack = [(parent.index(-1), False)]
    while stack:
        peer, expanded = stack.pop()
        if expanded:
            order.append(peer)
        else:
            stack.append((peer, True))
            stack.extend((c, False) for c in sorted(kids[peer], key=lambda c: (height[c], c), reverse=True))
    return order


def tree_plan(op: str, parents: list[list[int]], nbytes: float, pieces: int) -> Plan:
    """Pipelined tree ``op`` (all_reduce, barrier, broadcast, reduce) over the trees ``parents``,
    each tree carrying 1/len(parents) of the buffer in ``pieces`` pieces (chunk = tree x pieces + piece).

    Dependencies: a peer sends piece j up once every child's piece j arrived, and down once it holds
    the final piece j; each sender streams its pieces to one destination in order (piece j after
    j-1), as ring_chain does. Children reduce into their parent one after another per piece (the
    verifier forbids two unordered writes into one chunk): the child with the shallower subtree, whose
    piece is ready first, goes first and the next sibling's piece j waits for it.
    """
    p, k = len(parents[0]), pieces
    up_phase = op in ("all_reduce", "barrier", "reduce")
    down_phase = op in ("all_reduce", "barrier", "broadcast")
    size = nbytes / (len(parents) * k)
    transfers: list[Transfer] = []
    trees = [(parent, children_of(parent), _postorder(parent)) for parent in parents]
    last_send: dict[tuple[int, int, int], int] = {}  # (tree, src, dst) -> last transfer on that edge
    # into[(tree, piece)][peer] = transfers that delivered this piece to the peer
    into: dict[tuple[int, int], dict[int, list[int]]] = {}

    def emit(t: int, src: int, dst: int, chunk: int, reduce: bool, deps: list[int]) -> int:
        prev = last_send.get((t, src, dst))
        if prev is not None:
            deps.append(prev)  # a sender streams its pieces to one destination in order
        transfers.append(Transfer(src, dst, size, chunk, reduce, tuple(deps)))
        last_send[(t, src, dst)] = len(transfers) - 1
        return len(transfers) - 1

    if up_phase:
        for piece in range(k):
            for t, (parent, _kids, post) in enumerate(trees):
                got = into[(t, piece)] = {}
                for peer in post:
                    up = parent[peer]
                    if up != -1:
                        # every child's piece arrived here; the sibling before has reduced into the parent
                        i = emit(t, peer, up, t * k + piece, True, got.get(peer, []) + got.get(up, [])[-1:])
                        got.setdefault(up, []).append(i)
    if down_phase:
        for piece in range(k):
            for t, (_parent, kids, post) in enumerate(trees):
                root = post[-1]
                # Assumption: the root broadcasts once it has reduced its tree's whole share (reduction
                # then broadcast, Sanders et al. 2009 sec. 4); NCCL overlaps the two phases at the root.
                # Port loads are the same either way (measured: overlapping is 1.5 % faster for 1 GB on
                # 8 NVSwitch peers), and the phased plan keeps ports in lockstep: exact closed forms,
                # and 10x fewer engine events than the overlapped one.
                held = {root: into[(t, k - 1)].get(root, [])} if up_phase else {}
                for peer in reversed(post):  # parents before children
                    for child in kids[peer]:
                        held[child] = [emit(t, peer, child, t * k + piece, False, list(held.get(peer, [])))]
    root = parents[0].index(-1)
    return Plan(op=op, algorithm="tree", num_peers=p, nbytes=nbytes, transfers=tuple(transfers),
                num_chunks=len(parents) * k, root=root)


def tree_pieces(nbytes: float, num_trees: int, num_peers: int) -> int:
    """Pieces per tree: NCCL's 512 KiB pipeline steps of the tree's share, at most MAX_TREE_PIECES and
    at most what keeps the plan within TREE_TRANSFER_BUDGET transfers (2 phases x trees x (P-1) edges)."""
    budget = TREE_TRANSFER_BUDGET // (2 * num_trees * max(1, num_peers - 1))
    return max(1, min(MAX_TREE_PIECES, budget, pipeline_pieces(nbytes / num_trees)))


def tree_parents_for(op: str, group: Group, root: int = 0, channels: int = 1) -> list[list[int]]:
    """The trees the plan of ``op`` uses: for all_reduce both trees of every channel; for broadcast
    and reduce one tree per channel, rooted at ``root``.
    # Assumption: broadcast and reduce use a pipelined tree re-rooted at the root (NCCL runs them
    # as rings; the tree variant is the textbook one of Sanders et al. 2009 sec. 2)."""
    groups = list(group.by_node().values())
    if op in ("broadcast", "reduce"):
        return [peer_tree(groups, 0, root, c) for c in range(channels)]
    return [peer_tree(groups, w, None, c) for c in range(channels) for w in (0, 1)]


def _build(req: Request) -> Plan:
    parents = tree_parents_for(req.op, req.group, req.root, req.num_channels())
    return tree_plan(req.op, parents, req.nbytes, tree_pieces(req.nbytes, len(parents), req.num_peers))


register(Algorithm(
    name="tree",
    ops=frozenset({"all_reduce", "broadcast", "reduce", "barrier"}),
    build=_build,
    summary="NCCL's double binary tree, pipelined (tree over nodes, chain inside a node)",
))
