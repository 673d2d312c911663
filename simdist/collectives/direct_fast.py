"""Fast fidelity of the direct algorithm's all-pairs steps: few flows, paced to land with the blocks.

The detailed all-pairs step (all_to_all, direct all_gather / reduce_scatter, each step of the two-shot
all_reduce) has one block per ordered pair of peers, P (P - 1) transfers. The fast plan keeps the blocks
between peers of one node as they are and stands one flow for all the blocks from one peer to one block
of destination nodes (simdist.collectives.all_pairs.FAST_FLOWS: one node per block up to ~128 nodes of 8
peers; 16 nodes per block at 512):

- each such flow goes to one of the block's peers, chosen (below) so that the flows' bytes on the NIC
  downlinks and the leaf-spine links track the detailed plan's;
- it carries all its blocks' bytes, and moves at the rate that makes it land when its last block does in
  the detailed plan (the all-pairs landings, `AllPairs.flow_lands`): a rate bound, as every planned rate.

Preserved exactly: the bytes on every link inside nodes and on every NIC uplink (each peer sends all its
inter-node blocks from its own NIC), and when each source's blocks to each node block land, hence the
step's time alone, as long as the flows' own bytes fit their links by then (the busiest detailed link
sets the time and the flows track the detailed loads, so they do: tests, and benchmarks/collectives.py
prints the fast/closed-form ratio). Approximated: which NIC downlink and which leaf-spine link carry
each flow's bytes (within about one flow of the detailed plan's bytes per link); and next to other
traffic a flow shares its links as one flow, not as its blocks.

Choosing the destination: for every (source node, node block) the source node's peers a = 0, 1, ...
send to the block's peers (a + k) mod m (m of them, the source node's own excluded): a shift k per
pair, so one node's flows to a block go to distinct peers (with one node per block, a bijection: every
NIC downlink gets exactly the detailed plan's bytes). k is chosen greedily, pairs taken by distance
between source and block and in four interleaved batches, as the k that least raises the squared excess
of the flows' bytes over the detailed plan's on the leaf-spine links and the NIC downlinks it loads.
"""

from __future__ import annotations

import math
from itertools import repeat

import numpy as np

from simdist.collectives.all_pairs import FAST_FLOWS, AllPairs, all_pairs, step_lands
from simdist.collectives.plan import Plan, Transfer
from simdist.collectives.request import Request

BATCH_NODES = 16
"""Source nodes per batch (per distance, interleaved) in the greedy choice of destinations: the choices of
one batch are made against the same loads, so fewer nodes per batch collide less."""
REPAIR_ROUNDS = 4
SHIFTS = 64
"""Shifts tried per (source node, node block): all of them for blocks of up to 8 nodes of 8 peers."""
OVERFLOW_PENALTY = 1e3
"""Weight of the bytes a choice puts on a leaf-spine link or NIC downlink beyond what the detailed plan's
busiest link carries (the fast flows would then outlast the detailed plan): a choice without overflow wins."""


def _choose_destinations(pairs: AllPairs, block_bytes: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source peer, destination peer, blocks carried) of every inter-node flow (module docstring)."""
    p = pairs.num_peers
    node_ids, node_rank = np.unique(pairs.node, return_inverse=True)
    node_rank = node_rank.reshape(-1)
    num_nodes = len(node_ids)
    members = [np.flatnonzero(node_rank == n) for n in range(num_nodes)]
    block_of_node = np.array([pairs.node_block[m[0]] for m in members])
    block_members = [np.flatnonzero(pairs.node_block == b) for b in range(pairs.num_blocks)]
    spines = pairs.num_spines
    # the detailed plan's bytes (per block byte) and what the flows have placed so far
    target_nic = (p - np.array([len(members[r]) for r in node_rank])).astype(float)  # blocks into each peer
    placed_nic = np.zeros(p)
    placed_up, placed_down = np.zeros(len(pairs.up_bytes)), np.zeros(len(pairs.down_bytes))
    spine_capacity = pairs.spine_capacity_Bps
    # the bytes a leaf-spine link may carry without outlasting the detailed plan's busiest link
    worst = max(float(pairs.up_drain.max(initial=0.0)), float(pairs.down_drain.max(initial=0.0)),
                float(pairs.in_drain.max(initial=0.0)), float(pairs.out_drain.max(initial=0.0)))
    budget = block_bytes * spine_capacity * worst
    nic_budget = block_bytes * pairs.in_capacity_Bps * worst
    src_out, dst_out, count_out = [], [], []
    # (source node, node block) pairs by distance, in interleaved batches
    home = block_of_node
    for distance in range(pairs.num_blocks):
        batches = max(1, num_nodes // BATCH_NODES)
        for batch_index in range(batches):
            sources = range(batch_index, num_nodes, batches)
            work = []
            for n in sources:
                b = (home[n] + distance) % pairs.num_blocks
                cand = block_members[b][pairs.node[block_members[b]] != node_ids[n]]
                if cand.size:
                    work.append((n, cand))
            if not work:
                continue
            # pad to arrays: [work, sources a, shifts k]
            g = max(len(members[n]) for n, _ in work)
            m = max(len(c) for _, c in work)
            src = np.full((len(work), g), -1, dtype=np.int64)
            cands = np.full((len(work), m), -1, dtype=np.int64)
            sizes = np.empty(len(work), dtype=np.int64)
            for w, (n, cand) in enumerate(work):
                src[w, :len(members[n])] = members[n]
                cands[w, :len(cand)] = cand
                sizes[w] = len(cand)
            # candidate shifts: all of them up to SHIFTS, else SHIFTS spread over the block (staggered by pair)
            j = np.arange(min(m, SHIFTS))
            stride = np.maximum(sizes // SHIFTS, 1)
            shift = (np.arange(len(work))[:, None] % stride[:, None] + j[None, :] * stride[:, None]) % sizes[:, None]
            a = np.arange(g)
            pick = (a[None, :, None] + shift[:, None, :]) % sizes[:, None, None]  # [w, a, k] index into cands
            dst = np.take_along_axis(cands[:, None, :].repeat(g, axis=1), pick, axis=2)
            k = j
            valid = (src >= 0)[:, :, None] & (k[None, None, :] < sizes[:, None, None])
            s3 = np.broadcast_to(src[:, :, None], dst.shape)
            carried = np.array([len(c) for _, c in work], dtype=float)  # blocks a flow stands for
            flow = carried[:, None, None] * block_bytes
            score = np.zeros(dst.shape)
            if spines:
                srcc, dstc = np.maximum(s3, 0), np.maximum(dst, 0)
                cross = (pairs.leaf[srcc] != pairs.leaf[dstc]) & valid
                sp = pairs.spine[srcc, dstc].astype(np.int64)
                up = pairs.leaf[srcc] * spines + sp
                down = pairs.leaf[dstc] * spines + sp
                for placed, target, link in ((placed_up, pairs.up_bytes, up),
                                             (placed_down, pairs.down_bytes, down)):
                    excess = 2 * (placed[link] - target[link] * block_bytes) + flow
                    over = np.maximum(placed[link] + flow - budget, 0.0) * OVERFLOW_PENALTY
                    score += np.where(cross, excess + over, 0.0) / spine_capacity
            dstc = np.maximum(dst, 0)
            excess = 2 * (placed_nic[dstc] - target_nic[dstc] * block_bytes) + flow
            excess += np.maximum(placed_nic[dstc] + flow - nic_budget[dstc], 0.0) * OVERFLOW_PENALTY
            score += np.where(valid, excess, 0.0) / pairs.in_capacity_Bps[dstc]
            score = np.where(valid, score, 0.0).sum(axis=1)  # [w, k]
            score[k[None, :] >= sizes[:, None]] = np.inf
            best = score.argmin(axis=1)
            rows = np.arange(len(work))
            chosen = dst[rows, :, best]  # [w, a]
            ok = src >= 0
            s_flat, d_flat = src[ok], chosen[ok]
            c_flat = np.broadcast_to(carried[:, None], src.shape)[ok]
            src_out.append(s_flat)
            dst_out.append(d_flat)
            count_out.append(c_flat)
            np.add.at(placed_nic, d_flat, c_flat * block_bytes)
            if spines:
                cross = pairs.leaf[s_flat] != pairs.leaf[d_flat]
                sp = pairs.spine[s_flat, d_flat].astype(np.int64)
                np.add.at(placed_up, (pairs.leaf[s_flat] * spines + sp)[cross], (c_flat * block_bytes)[cross])
                np.add.at(placed_down, (pairs.leaf[d_flat] * spines + sp)[cross], (c_flat * block_bytes)[cross])
    if not src_out:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    src, dst, count = np.concatenate(src_out), np.concatenate(dst_out), np.concatenate(count_out)
    loads = _Loads(pairs, placed_up, placed_down, placed_nic, budget, nic_budget, block_bytes)
    _repair(pairs, src, dst, count, block_members, loads)
    return src, dst, count


class _Loads:
    """What the fast flows put on the leaf-spine links and NIC downlinks, against their budgets."""

    def __init__(self, pairs: AllPairs, up: np.ndarray, down: np.ndarray, nic: np.ndarray, budget: float,
                 nic_budget: np.ndarray, block_bytes: float) -> None:
        self.pairs, self.up, self.down, self.nic = pairs, up, down, nic
        self.budget, self.nic_budget, self.block_bytes = budget, nic_budget, block_bytes

    def links(self, src: int, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(up link, down link, climbs) of flows from ``src`` to each of ``dst``."""
        return self.links_of(np.full(len(dst), src), dst)

    def links_of(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(up link, down link, climbs) of flows ``src[i] -> dst[i]``."""
        pairs, spines = self.pairs, self.pairs.num_spines
        sp = pairs.spine[src, dst].astype(np.int64) if spines else np.zeros(len(dst), dtype=np.int64)
        climbs = (pairs.leaf[dst] != pairs.leaf[src]) & (spines > 0)
        return pairs.leaf[src] * spines + sp, pairs.leaf[dst] * spines + sp, climbs

    def overflow(self, src: int, dst: np.ndarray, nbytes: float) -> np.ndarray:
        """How far beyond its budgets each candidate destination would push the busiest of its links."""
        up, down, climbs = self.links(src, dst)
        out = np.maximum(self.nic[dst] + nbytes - self.nic_budget[dst], 0.0) / self.nic_budget[dst]
        if self.pairs.num_spines:
            spine = np.maximum(np.maximum(self.up[up], self.down[down]) + nbytes - self.budget, 0.0) / self.budget
            out = np.maximum(out, np.where(climbs, spine, 0.0))
        return out

    def move(self, src: int, dst: int, nbytes: float) -> None:
        """Add (negative: remove) a flow's bytes."""
        up, down, climbs = self.links(src, np.array([dst]))
        self.nic[dst] += nbytes
        if climbs[0]:
            self.up[up[0]] += nbytes
            self.down[down[0]] += nbytes


def _over_budget(pairs: AllPairs, src: np.ndarray, dst: np.ndarray, loads: _Loads) -> np.ndarray:
    """Flows crossing a leaf-spine link or NIC downlink that carries more than its budget."""
    flagged = loads.nic[dst] > loads.nic_budget[dst] * (1 + 1e-12)
    if pairs.num_spines:
        up, down, climbs = loads.links_of(src, dst)
        hot = loads.budget * (1 + 1e-12)
        flagged |= climbs & ((loads.up[up] > hot) | (loads.down[down] > hot))
    return flagged


def _repair(pairs: AllPairs, src: np.ndarray, dst: np.ndarray, count: np.ndarray, block_members: list,
            loads: _Loads) -> None:
    """Take flows off links their batch pushed past the budget (two choices of one batch may land on one
    link), one flow at a time, until no link is over or nothing helps. With one node per block a flow
    swaps destinations with another flow of its source node to that node: each NIC downlink keeps
    exactly the detailed plan's bytes. With several nodes per block a flow moves to the peer of its
    block that leaves the least overflow."""
    one_node_blocks = pairs.num_blocks == len(np.unique(pairs.node))
    if one_node_blocks:
        group_key = pairs.node[src] * pairs.num_blocks + pairs.node_block[dst]
        order = np.argsort(group_key, kind="stable")
        lo = np.searchsorted(group_key[order], group_key)
        hi = np.searchsorted(group_key[order], group_key, side="right")
    for _ in range(REPAIR_ROUNDS):
        todo = np.flatnonzero(_over_budget(pairs, src, dst, loads) & (count > 0))
        changed = False
        for i in todo:
            if one_node_blocks:
                mates = order[lo[i]:hi[i]]
                changed |= _best_swap(loads, src, dst, count, int(i), mates[mates != i])
            else:
                changed |= _best_move(pairs, loads, src, dst, count, int(i), block_members)
        if not changed:
            return


def _best_move(pairs: AllPairs, loads: _Loads, src: np.ndarray, dst: np.ndarray, count: np.ndarray, i: int,
               block_members: list) -> bool:
    s, d = int(src[i]), int(dst[i])
    nbytes = float(count[i]) * loads.block_bytes
    loads.move(s, d, -nbytes)
    if loads.overflow(s, np.array([d]), nbytes)[0] <= 0.0:
        loads.move(s, d, nbytes)  # its links have come back within budget
        return False
    cand = block_members[int(pairs.node_block[d])]
    cand = cand[pairs.node[cand] != pairs.node[s]]
    best = int(cand[int(loads.overflow(s, cand, nbytes).argmin())])
    dst[i] = best
    loads.move(s, best, nbytes)
    return best != d


def _best_swap(loads: _Loads, src: np.ndarray, dst: np.ndarray, count: np.ndarray, i: int,
               mates: np.ndarray) -> bool:
    """Swap flow i's destination with the mate's (a few flows) that most lowers the overflow on the
    leaf-spine links involved; none when no swap lowers it."""

    def involved(f: int, g: int) -> tuple[list[int], list[int]]:
        ups, downs = [], []
        for s_, d_ in ((src[f], dst[f]), (src[g], dst[g]), (src[f], dst[g]), (src[g], dst[f])):
            up, down, climbs = loads.links_of(np.array([s_]), np.array([d_]))
            if climbs[0]:
                ups.append(int(up[0]))
                downs.append(int(down[0]))
        return sorted(set(ups)), sorted(set(downs))

    def over(ups: list[int], downs: list[int]) -> float:
        return float(np.maximum(loads.up[ups] - loads.budget, 0.0).sum()
                     + np.maximum(loads.down[downs] - loads.budget, 0.0).sum())

    best, best_gain = -1, 0.0
    for j in mates.tolist():
        ups, downs = involved(i, j)
        before = over(ups, downs)
        _swap(loads, src, dst, count, i, j)
        gain = before - over(ups, downs)
        _swap(loads, src, dst, count, i, j)
        if gain > best_gain * (1 + 1e-12) and gain > 0.0:
            best, best_gain = j, gain
    if best < 0:
        return False
    _swap(loads, src, dst, count, i, best)
    return True


def _swap(loads: _Loads, src: np.ndarray, dst: np.ndarray, count: np.ndarray, i: int, j: int) -> None:
    """Exchange the destinations of flows i and j (of one source node to one node), loads following."""
    for f in (i, j):
        loads.move(int(src[f]), int(dst[f]), -float(count[f]) * loads.block_bytes)
    dst[i], dst[j] = dst[j], dst[i]
    for f in (i, j):
        loads.move(int(src[f]), int(dst[f]), float(count[f]) * loads.block_bytes)


def all_pairs_fast(req: Request, steps: int, reduce_first: bool) -> Plan:
    """Fast plan of an all-pairs op of ``steps`` steps (module docstring); the first step reduces when
    ``reduce_first`` (reduce_scatter, all_reduce)."""
    group = req.group
    pairs = all_pairs(group)
    p = pairs.num_peers
    block = req.nbytes / p
    proto = req.protocol
    extra_net = group.extra_latency_by_class.get("net", 0.0) + proto.per_transfer_latency_s
    per_block = p * (p - 1) <= FAST_FLOWS
    if per_block:  # a flow per block: the detailed plan's blocks
        src, dst = np.nonzero(pairs.node[:, None] != pairs.node[None, :])
        carried = np.ones(len(src))
    else:
        key = ("direct_fast_destinations", block)
        chosen = group.memo.get(key)
        if chosen is None:
            chosen = group.memo[key] = _choose_destinations(pairs, block)
        src, dst, carried = chosen
    start = np.zeros(p)
    transfers: list[Transfer] = []
    with np.errstate(divide="ignore"):
        intra_rate = np.where(pairs.intra_drain > 0, 1.0 / pairs.intra_drain, math.inf)
    for step in range(steps):
        reduces = reduce_first and step == 0
        # blocks inside nodes, as in the detailed plan (their planned rate: 1 / drain per byte)
        n = len(pairs.intra_src)
        transfers.extend(map(Transfer, pairs.intra_src.tolist(), pairs.intra_dst.tolist(), repeat(block, n),
                             repeat(-1, n), repeat(reduces, n), repeat((), n), start[pairs.intra_src].tolist(),
                             intra_rate.tolist()))
        end, ready = step_lands(pairs, group, block, None if step == 0 else start, proto.per_transfer_latency_s,
                                proto.rate_factor)
        if len(src):
            # every inter-node flow lands when the step's last block does; in a step another follows,
            # when its own blocks do (their links free up for the next step's blocks as in the detailed plan)
            if step + 1 < steps:
                end = _own_lands(pairs, block, start, extra_net, proto.rate_factor, src, dst, per_block)
            begin = start[src] + _pair_latency(pairs, src, dst) + extra_net
            wire = carried * block / proto.rate_factor
            with np.errstate(divide="ignore", invalid="ignore"):
                cap = np.where((end > begin) & (wire > 0), wire / (end - begin), math.inf)
            # without bytes (barrier) a flow lands when it starts: it waits out the step as extra latency
            extra = start[src] + (np.maximum(end - begin, 0.0) if block == 0 else 0.0)
            n = len(src)
            transfers.extend(map(Transfer, src.tolist(), dst.tolist(), (carried * block).tolist(), repeat(-1, n),
                                 repeat(reduces, n), repeat((), n), extra.tolist(), cap.tolist()))
        if step + 1 < steps:
            if ready is None:
                _, ready = step_lands(pairs, group, block, start, proto.per_transfer_latency_s, proto.rate_factor)
            start = ready
    return Plan(op=req.op, algorithm="direct", num_peers=p, nbytes=req.nbytes, transfers=tuple(transfers),
                num_chunks=0, verifiable=False)


def _own_lands(pairs: AllPairs, block: float, start: np.ndarray, extra_s: float, rate_factor: float, src: np.ndarray,
               dst: np.ndarray, per_block: bool) -> np.ndarray:
    """When the blocks each flow stands for land in the detailed plan: its block's landing (a flow per
    block), or the last landing of its source's blocks to its node block."""
    if not per_block:
        return start[src] + pairs.flow_lands(block, extra_s, rate_factor)[src, pairs.node_block[dst]]
    out = np.empty(len(src))
    for rows, lands in pairs.inter_landings(block, start, extra_s, rate_factor):
        mine = (src >= rows.start) & (src < rows.stop)
        out[mine] = lands[src[mine] - rows.start, dst[mine]]
    return out


def _pair_latency(pairs: AllPairs, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Route latency of inter-node pairs (as `AllPairs._block` sums it)."""
    cross = (pairs.leaf[src] != pairs.leaf[dst]) & (pairs.leaf[src] >= 0)
    out = np.where(cross, pairs.out_latency_s[src] + pairs.spine_latency_s, pairs.out_latency_s[src])
    if pairs.cores_per_group:
        out = np.where(cross & (pairs.pod[src] != pairs.pod[dst]), out + pairs.core_latency_s, out)
    return out + pairs.in_latency_s[dst]
