"""Ring algorithms (Patarasuk & Yuan 2009; NCCL's ring): all_reduce, reduce_scatter, all_gather,
pipelined broadcast and reduce, and barrier.

With P peers in ring order and C channels (independent rings, each with 1/C of the data, as NCCL
runs them), all_reduce is a reduce-scatter (P-1 steps) then an all-gather (P-1 steps), each step
moving S/(P C) bytes per peer per channel. Uncontended it takes 2(P-1)(alpha + S/(P B))
(Thakur, Rabenseifner & Gropp 2005, eq. for the ring; NCCL docs "ring algorithm"), B the slowest
ring edge's bandwidth and alpha its latency.

Where a ring's edges differ (NVLink inside nodes, the network between them), every hop of a
channel moves at the channel's bottleneck rate (rate coupling: `RingHop`, `channel_rates`), each
step's piece store-and-forward, and a connection sends its steps in order. Each ring edge then
carries one step at a time (uncontended the coupling alone ensures it; the order keeps it so when
other traffic slows a hop below its cap), and the time is the longest chain's latencies (2(P-1)
consecutive edges for all_reduce) plus steps x the bottleneck's step time. That is NCCL's own cost
model, time = lat + nBytes / bw, lat summing the chain's intra- and inter-node hop latencies and
bw = nChannels x one bandwidth per ring graph (src/graph/tuning.cc: ncclTopoTuneModel,
ncclTopoGetAlgoTime). The fast plan (`ring_fast`) and the closed form (simdist.analytic.ring)
compute the same, so uncontended the three agree to rounding; next to other collectives on the same
links the fast plan is slower by at most its chain latency, since its flows cannot move in the
others' latency gaps (tests/test_fast_fidelity.py).

Without the coupling the fast hops ran ahead, a network edge carried several steps at once, and
later steps' latency hid behind earlier steps' bytes: on 2-4 DGX H100 nodes from 16 MiB to 1 GiB the
detailed plan took 25 % less to 2.8 % more time than NCCL's model (more where steps sharing a link
slowed the critical one). The multi-node measurements side with NCCL's model: 4 x 8 B200 with the
ring forced (validation/reference, mle_p6b200_4node, ring/Simple) measure slower than it (predicted
busbw +29 % at 64 MiB, +5.5 % at 512 MiB, +0.4 % at 1 GiB), and the overlapping accounting was
further off (+98 %, +15 %, +3.3 %).

Broadcast and reduce run as a pipelined chain from (to) the root: the buffer is cut into k pieces
that stream down the chain, taking (P - 1 + k - 1)(alpha + S/(k B)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from simdist.collectives.group import Group
from simdist.collectives.plan import Plan, Transfer
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.hardware.batch import link_capacities

# NCCL's Simple protocol moves a connection's buffer in NCCL_STEPS = 8 slots of DEFAULT_BUFFSIZE / 8:
# 4 MiB / 8 = 512 KiB per pipeline step (src/include/device.h, src/init.cc;
# ../shared/reference/nccl_topology_link_constants.csv).
PIPELINE_CHUNK_BYTES = 4 * 2**20 / 8


@dataclass(frozen=True, slots=True)
class RingHop(Transfer):
    """A ring step's transfer on its connection (ring edge of one channel): its bytes move no faster
    than ``max_rate_Bps`` (wire bytes/s), its channel's bottleneck rate, and go on the wire only after
    those of transfer ``after``, the connection's previous step; the engine (simdist.engine.executor)
    enforces both.

    Rate coupling: NCCL's ring primitives forward a step slice by slice as it arrives
    (recvReduceSend, src/device/prims_simple.h) through connection buffers of NCCL_STEPS slots, so no
    hop of a channel runs ahead of the hop feeding it, and NCCL prices every hop of a ring channel at
    one bandwidth, its graph's bottleneck (src/graph/search.cc bwIntra/bwInter; tuning.cc busBw =
    nChannels x bw). In order: a connection is one FIFO of those slots, sent in order by the GPU (or
    its network proxy), so a step does not share the wire with the connection's previous one; its
    latency (posting, flags, the wire) overlaps the previous step's bytes.
    # Assumption: the whole step's piece moves at that rate, store-and-forward per step (a hop starts
    # once its data has arrived), not cut through slice by slice; with the coupling this is what makes
    # the step latencies add up as NCCL's model does (see the module docstring).
    """

    max_rate_Bps: float = math.inf
    after: int = -1
    """Index (into Plan.transfers) of the connection's previous transfer; -1: the first."""


def channel_rates(group: Group, orders: list[list[int]]) -> np.ndarray:
    """Each channel's bottleneck rate (wire bytes/s): over the links of its ring edges, the least of
    capacity / (ring edges of all channels crossing the link), i.e. a step's fair share there.

    # Assumption: the share is taken with every channel's edges present, as in the detailed plan's
    # steps uncontended (channels of one ring progress together); traffic of other collectives
    # slows the flows further through link sharing but does not lower this cap.
    """
    channels, p = len(orders), len(orders[0])
    src = np.array(orders, dtype=np.int64).reshape(channels, p)
    routes = group.paths(src.reshape(-1), np.roll(src, -1, axis=1).reshape(-1))
    ids, compact = np.unique(routes.links, return_inverse=True)
    compact = compact.reshape(-1)
    if not len(ids):
        return np.full(channels, math.inf)
    share = link_capacities(group.topology, ids) / np.bincount(compact, minlength=len(ids))
    per_entry = share[compact]
    hops = routes.hops
    edge = np.full(len(hops), math.inf)
    nonempty = hops > 0
    edge[nonempty] = np.minimum.reduceat(per_entry, routes.indptr[:-1][nonempty])
    return edge.reshape(channels, p).min(axis=1)


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
                    phases: tuple[bool, bool] = (True, True), op: str = "all_reduce",
                    rates: Sequence[float] | None = None) -> Plan:
    """Ring reduce-scatter then all-gather; ``phases`` selects either half (reduce_scatter, all_gather).

    Each step's transfer on a ring edge waits for the transfer that delivered its data (store and
    forward per step). ``rates``: per channel, the rate its transfers move at most (`channel_rates`);
    the transfers are then `RingHop`s, also sent in order on their connection. None: plain transfers,
    as fast as their links allow and free to share them with the connection's other steps.
    """
    p = num_peers
    rings = _orders(p, channels, orders)
    piece = nbytes / (p * channels)
    transfers: list[Transfer] = []
    segment = [0] * (p * channels)

    def hop(order: list[int], rate: float | None, sent: list[int], i: int, chunk: int, reduce: bool,
            deps: tuple[int, ...]) -> Transfer:
        """Ring position i's step transfer; ``sent[i]``: the last one it sent on this channel."""
        src, dst = order[i], order[(i + 1) % p]
        if rate is None:
            return Transfer(src, dst, piece, chunk, reduce, deps)
        out = RingHop(src, dst, piece, chunk, reduce, deps, max_rate_Bps=rate, after=sent[i])
        sent[i] = len(transfers)
        return out

    for ch, order in enumerate(rings):
        base = ch * p
        rate = None if rates is None else float(rates[ch])
        sent = [-1] * p
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
                    transfers.append(hop(order, rate, sent, i, base + chunk, True, deps))
                    new_arrived[(i + 1) % p] = len(transfers) - 1
                arrived = new_arrived
        if phases[1]:
            for step in range(p - 1):
                new_arrived = [None] * p
                for i in range(p):
                    chunk = (i + 1 - step) % p
                    deps = () if arrived[i] is None else (arrived[i],)
                    transfers.append(hop(order, rate, sent, i, base + chunk, False, deps))
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
    # A single step (reduce_scatter / all_gather of 2 peers) forwards nothing: no coupling, and the
    # plan, free of dependencies, runs in the fluid solver (simdist.engine.fluid), which takes no bounds.
    rates = channel_rates(req.group, orders) if p > 2 or req.op not in ("reduce_scatter", "all_gather") else None
    if req.op == "reduce_scatter":
        return ring_all_reduce(p, n, channels, orders, phases=(True, False), op="reduce_scatter", rates=rates)
    if req.op == "all_gather":
        return ring_all_reduce(p, n, channels, orders, phases=(False, True), op="all_gather", rates=rates)
    return ring_all_reduce(p, n, channels, orders, op=req.op, rates=rates)  # all_reduce, barrier


def ring_fast(req: Request) -> Plan:
    """Fast fidelity of the ring phases: one flow per ring edge and channel carrying all its steps.

    Each flow moves steps x S/(P C) bytes; its extra latency makes every flow pay the latency of the
    slowest dependency chain of its channel (steps consecutive edges), as the detailed plan's critical
    path does: there every hop moves at the channel's bottleneck rate, in order on its connection, so
    the chain's latencies add to steps x the bottleneck's step time (NCCL's lat + size / bw).
    Uncontended and with channels alike this equals the detailed plan's time (tests: to 1e-9 on 2-4
    DGX H100 nodes, PCIe boxes sharing NICs, oversubscribed fabrics); the flows share links as the
    detailed steps' transfers do. Edge latencies come from the group's vectorised routes
    (`Group.paths`) and chain sums from prefix sums, so building costs O(P C).
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
