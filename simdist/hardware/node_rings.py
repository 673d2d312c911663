"""Ring channels inside a node given as a graph: which rings NCCL would run over its GPU-to-GPU links.

On an NVSwitch crossbar every ring order is as good as another and one ring per GPU port carries all it can, so
a group inside a template node runs its peers in order (simdist.collectives.group). On a node whose GPUs are
linked pairwise (four-GPU HGX boards: 6 NVLinks between each pair; NVLink bridges between pairs of PCIe cards),
one ring uses one link out of each GPU and leaves the others idle; NCCL's topology search
(src/graph/search.cc: ncclTopoCompute searches ring graphs over the GPUs' NVLink and PCIe paths, subtracting the
bandwidth each channel takes from the links it crosses, and keeps adding channels while they fit; src/graph/
tuning.cc then prices the collective at nChannels x the per-channel bandwidth) finds several rings over
different links, e.g. 0-1-2-3 and its reverse 0-3-2-1 on a fully linked board of four.

`node_rings` does the same search greedily over every ring order of the peers (the first peer fixed; (p - 1)!
orders, at most MAX_SEARCH_PEERS peers): it takes the ring whose busiest link gives it the most bandwidth, then
adds the ring that most raises the group's throughput, channels x the slowest channel's share (each channel
carries 1/C of the data, so the slowest ends the collective; a channel's share of a link is capacity / ring edges
crossing it, the rule of simdist.collectives.pacing.edge_shares), and stops when no ring raises it. On a crossbar
a second ring only halves the first one's share, so the search keeps one ring in peer order, the template's
answer.

# Assumption: NCCL's search reaches the greedy optimum here (it tries GPU orders exhaustively on small nodes;
# its speed steps, src/graph/search.cc speedArrayIntra, round each channel's rate down to a step, which this
# search does not).
"""

from __future__ import annotations

import itertools

import numpy as np

from simdist.hardware.node import NodeGraph

__all__ = ["MAX_CHANNELS", "MAX_SEARCH_PEERS", "node_rings"]

MAX_SEARCH_PEERS = 8
"""Peers up to which every ring order is tried: 7! = 5,040 rings of 8 GPUs. Larger groups keep peer order."""
MAX_CHANNELS = 16
"""Rings kept at most (NCCL's MAXCHANNELS is 32 for rings and trees together, src/include/device.h)."""
_RINGS_CACHE_MAX = 4096


def node_rings(node: NodeGraph, gpus: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Ring orders (peer indices 0..p-1) for a group of the node's GPUs ``gpus`` (local indices, peer order),
    one per channel; memoised on the node."""
    cache = node._rings
    hit = cache.get(gpus)
    if hit is None:
        if len(cache) >= _RINGS_CACHE_MAX:
            cache.clear()
        hit = cache[gpus] = _search(node, gpus)
    return hit


def _search(node: NodeGraph, gpus: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    p = len(gpus)
    identity = tuple(range(p))
    if p <= 2 or p > MAX_SEARCH_PEERS:
        return (identity,)
    names = [node.gpus[g] for g in gpus]
    # each ordered pair's route: counts per node link
    used: dict[int, int] = {}
    pair_links: dict[tuple[int, int], list[int]] = {}
    for a in range(p):
        for b in range(p):
            if a != b:
                links = list(node.path(names[a], names[b]).links)
                pair_links[(a, b)] = [used.setdefault(i, len(used)) for i in links]
    capacity = np.zeros(len(used))
    for link, column in used.items():
        lk = node.links[link]
        capacity[column] = lk.bandwidth_Bps * lk.efficiency
    orders = [(0, *rest) for rest in itertools.permutations(range(1, p))]
    edges = np.zeros((len(orders), len(used)))
    for row, order in enumerate(orders):
        for i in range(p):
            for column in pair_links[(order[i], order[(i + 1) % p])]:
                edges[row, column] += 1
    crossed = edges > 0
    chosen: list[int] = []
    load = np.zeros(len(used))
    best_value = 0.0
    with np.errstate(divide="ignore"):
        while len(chosen) < MAX_CHANNELS:
            trial = load + edges  # every candidate added to the chosen channels
            share = capacity / trial
            # the slowest channel after adding a candidate: the candidate's own share and each chosen one's
            slowest = np.where(crossed, share, np.inf).min(axis=1)
            for c in chosen:
                slowest = np.minimum(slowest, np.where(crossed[c], share, np.inf).min(axis=1))
            value = (len(chosen) + 1) * slowest
            pick = int(np.argmax(value))  # the first of equals: the peer order on a crossbar
            if value[pick] <= best_value * (1 + 1e-9):
                break
            best_value = float(value[pick])
            chosen.append(pick)
            load = trial[pick]
    return tuple(orders[c] for c in chosen)
