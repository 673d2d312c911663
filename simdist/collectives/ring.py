"""Ring algorithms (Patarasuk & Yuan 2009; NCCL's ring): all_reduce, reduce_scatter, all_gather,
pipelined broadcast and reduce, and barrier.

With P peers in ring order and C channels (independent rings, each with 1/C of the data, as NCCL
runs them), all_reduce is a reduce-scatter (P-1 steps) then an all-gather (P-1 steps), each step
moving S/(P C) bytes per peer per channel. Uncontended it takes 2(P-1)(alpha + S/(P B))
(Thakur, Rabenseifner & Gropp 2005, eq. for the ring; NCCL docs "ring algorithm"), B the slowest
ring edge's bandwidth and alpha its latency.

Broadcast and reduce run as a pipelined chain from (to) the root: the buffer is cut into k pieces
that stream down the chain, taking (P - 1 + k - 1)(alpha + S/(k B)).
"""

from __future__ import annotations

import math
from itertools import repeat

import numpy as np

from simdist.collectives.plan import Plan, Transfer
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request

# NCCL's Simple protocol moves a connection's buffer in NCCL_STEPS = 8 slots of DEFAULT_BUFFSIZE / 8:
# 4 MiB / 8 = 512 KiB per pipeline step (src/include/device.h, src/init.cc;
# ../shared/reference/nccl_topology_link_constants.csv).
PIPELINE_CHUNK_BYTES = 4 * 2**20 / 8


def pipeline_pieces(nbytes: float, chunk_bytes: float = PIPELINE_CHUNK_BYTES) -> int:
    """How many pieces a pipelined chain cuts ``nbytes`` into."""
    return max(1, math.ceil(nbytes / chunk_bytes))


def _orders(num_peers: int, channels: int, orders: list[list[int]] | None) -> list[list[int]]:
    if orders is None:
        return [list(range(num_peers)) for _ in range(channels)]
    if len(orders) != channels or any(sorted(o) != list(range(num_peers)) for o in orders):
        raise ValueError("each channel needs a ring order that is a permutation of the peers")
    return orders


def ring_all_reduce(num_peers: int, nbytes: float, channels: int = 1, orders: list[list[int]] | None = None,
                    phases: tuple[bool, bool] = (True, True), op: str = "all_reduce") -> Plan:
    """Ring reduce-scatter then all-gather; ``phases`` selects either half (reduce_scatter, all_gather)."""
    p = num_peers
    rings = _orders(p, channels, orders)
    piece = nbytes / (p * channels)
    transfers: list[Transfer] = []
    segment = [0] * (p * channels)
    for ch, order in enumerate(rings):
        base = ch * p
        for k in range(p):
            # ring position i ends the reduce-scatter owning chunk (i + 1) mod P
            segment[base + k] = order[(k - 1) % p]
        # arrived[i] = index of the transfer that last delivered to ring position i
        arrived: list[int | None] = [None] * p
        if phases[0]:
            for step in range(p - 1):
                new_arrived: list[int | None] = [None] * p
                for i in range(p):
                    chunk = (i - step) % p
                    deps = () if arrived[i] is None else (arrived[i],)
                    transfers.append(Transfer(order[i], order[(i + 1) % p], piece, base + chunk, True, deps))
                    new_arrived[(i + 1) % p] = len(transfers) - 1
                arrived = new_arrived
        if phases[1]:
            for step in range(p - 1):
                new_arrived = [None] * p
                for i in range(p):
                    chunk = (i + 1 - step) % p
                    deps = () if arrived[i] is None else (arrived[i],)
                    transfers.append(Transfer(order[i], order[(i + 1) % p], piece, base + chunk, False, deps))
                    new_arrived[(i + 1) % p] = len(transfers) - 1
                arrived = new_arrived
    return Plan(op=op, algorithm="ring", num_peers=p, nbytes=nbytes, transfers=tuple(transfers),
                num_chunks=p * channels, chunk_segment=tuple(segment), channels=channels)


def ring_reduce_scatter(num_peers: int, nbytes: float, channels: int = 1,
                        orders: list[list[int]] | None = None) -> Plan:
    return ring_all_reduce(num_peers, nbytes, channels, orders, phases=(True, False), op="reduce_scatter")


def ring_all_gather(num_peers: int, nbytes: float, channels: int = 1,
                    orders: list[list[int]] | None = None) -> Plan:
    return ring_all_reduce(num_peers, nbytes, channels, orders, phases=(False, True), op="all_gather")


def ring_chain(op: str, num_peers: int, nbytes: float, root: int = 0, pieces: int | None = None,
               order: list[int] | None = None) -> Plan:
    """Pipelined chain: broadcast flows from the root down the ring, reduce flows up to the root."""
    p = num_peers
    order = order or list(range(p))
    start = order.index(root)
    chain = [order[(start + i) % p] for i in range(p)]  # chain[0] = root
    if op == "reduce":
        chain = chain[::-1]  # data flows toward the root, which ends the chain
    k = pieces if pieces is not None else pipeline_pieces(nbytes)
    transfers: list[Transfer] = []
    into: dict[tuple[int, int], int] = {}  # (chain position, piece) -> transfer that delivered it
    out: dict[tuple[int, int], int] = {}  # (chain position, piece) -> transfer that sent it on
    for piece in range(k):
        for i in range(p - 1):
            deps: list[int] = []
            if (i, piece) in into:
                deps.append(into[(i, piece)])  # the piece has arrived here
            if (i, piece - 1) in out:
                deps.append(out[(i, piece - 1)])  # a sender streams its pieces in order, one at a time
            transfers.append(Transfer(chain[i], chain[i + 1], nbytes / k, piece, op == "reduce", tuple(deps)))
            into[(i + 1, piece)] = out[(i, piece)] = len(transfers) - 1
    return Plan(op=op, algorithm="ring", num_peers=p, nbytes=nbytes, transfers=tuple(transfers), num_chunks=k,
                root=root)


def _build(req: Request) -> Plan:
    p, n = req.num_peers, req.nbytes
    if req.op in ("broadcast", "reduce"):
        order = req.group.ring_orders(1)[0]
        return ring_chain(req.op, p, n, req.root, order=order)
    channels = req.num_channels()
    orders = req.group.ring_orders(channels)
    if req.op == "reduce_scatter":
        return ring_all_reduce(p, n, channels, orders, phases=(True, False), op="reduce_scatter")
    if req.op == "all_gather":
        return ring_all_reduce(p, n, channels, orders, phases=(False, True), op="all_gather")
    return ring_all_reduce(p, n, channels, orders, op=req.op)  # all_reduce, barrier


def ring_fast(req: Request) -> Plan:
    """Fast fidelity of the ring phases: one flow per ring edge and channel carrying all its steps.

    Each flow moves steps x S/(P C) bytes; its extra latency makes every flow pay the latency of the
    slowest dependency chain (steps consecutive edges), as the detailed plan's critical path does.
    Uncontended and symmetric this equals the detailed plan's time; the flows share links exactly as
    the detailed steps' transfers do on average. Edge latencies come from the group's vectorised
    routes (`Group.paths`) and chain sums from prefix sums, so building costs O(P C).
    """
    p, group = req.num_peers, req.group
    if req.op in ("broadcast", "reduce"):
        return _build(req)
    channels = req.num_channels()
    src = np.array(group.ring_orders(channels), dtype=np.int64).reshape(channels, p)
    dst = np.roll(src, -1, axis=1)
    steps = {"reduce_scatter": p - 1, "all_gather": p - 1}.get(req.op, 2 * (p - 1))
    piece = req.nbytes / (p * channels)
    lat = group.paths(src.reshape(-1), dst.reshape(-1)).latency_s.reshape(channels, p)
    # the chain starting at position j crosses edges j, j+1, ..., j+steps-1 (mod P): whole laps plus
    # a window of r = steps mod P edges, summed from prefix sums of the edges twice around
    laps, r = divmod(steps, p)
    prefix = np.concatenate((np.zeros((channels, 1)), np.cumsum(np.concatenate((lat, lat), axis=1), axis=1)), axis=1)
    window = laps * prefix[:, p:p + 1] + (prefix[:, r:r + p] - prefix[:, :p])
    extra = window.max(axis=1, keepdims=True) - lat
    n = channels * p
    transfers = tuple(map(Transfer, src.reshape(-1).tolist(), dst.reshape(-1).tolist(), repeat(steps * piece, n),
                          repeat(-1, n), repeat(False, n), repeat((), n), extra.reshape(-1).tolist()))
    return Plan(op=req.op, algorithm="ring", num_peers=p, nbytes=req.nbytes, transfers=transfers,
                num_chunks=0, channels=channels, verifiable=False)


register(Algorithm(
    name="ring",
    ops=frozenset({"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier"}),
    build=_build,
    build_fast=ring_fast,
    summary="ring over all peers, one ring per channel (NCCL's default for large messages)",
))
