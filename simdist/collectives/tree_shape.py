"""NCCL's tree shapes: which peer is whose parent in its binary and double binary trees, and across nodes.

Port of ncclGetBtree / ncclGetDtree (src/graph/trees.cc): rank 0 is the root with one child, every other rank has
at most two, depth ceil(log2 P); the second tree mirrors (even count) or shifts by one (odd count) the first, so that
no rank is interior in both (Sanders, Speck & Traeff 2009, "Two-tree algorithms for full bandwidth broadcast,
reduction and scan"). Across nodes the trees join nodes and a chain runs through each node (`peer_tree`; NCCL's
src/graph/connect.cc, connectTrees). simdist.collectives.tree builds its plans and schedules on these shapes,
simdist.collectives.nvls_tree its trees between the nodes' NVLS heads.
"""

from __future__ import annotations

__all__ = ["btree_parent", "children_of", "dtree_parents", "peer_tree", "subtree_heights"]


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
