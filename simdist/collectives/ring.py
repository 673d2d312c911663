"""Ring algorithms (Patarasuk & Yuan 2009; NCCL's ring): all_reduce, reduce_scatter, all_gather,
pipelined broadcast and reduce, and barrier.

With P peers in ring order and C channels (independent rings, each with 1/C of the data, as NCCL
runs them), all_reduce is a reduce-scatter (P-1 steps) then an all-gather (P-1 steps), each step
moving S/(P C) bytes per peer per channel. Uncontended it takes 2(P-1)(alpha + S/(P B))
(Thakur, Rabenseifner & Gropp 2005, eq. for the ring; NCCL docs "ring algorithm"), B the slowest
ring edge's bandwidth and alpha its latency.

Where a ring's edges differ (NVLink inside nodes, the network between them), every hop of a
channel moves at the channel's bottleneck rate (rate coupling: `channel_rates`, `Transfer.max_rate_Bps`), each
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

Without the coupling the fast hops ran ahead, a network edge carried several steps at once, and later steps'
latency hid behind earlier steps' bytes; the multi-node measurements side with NCCL's model (the figures:
docs/validation-history.md).

Broadcast and reduce run as a pipelined chain from (to) the root: the buffer is cut into k pieces
that stream down the chain, taking (P - 1 + k - 1)(alpha + S/(k B)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat

import numpy as np

from simdist.collectives.group import Group
from simdist.collectives.pacing import edge_shares
from simdist.collectives.plan import Plan, Transfer
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.collector import collector_paused

# NCCL's Simple protocol moves a connection's buffer in NCCL_STEPS = 8 slots of DEFAULT_BUFFSIZE / 8:
# 4 MiB / 8 = 512 KiB per pipeline step (src/include/device.h, src/init.cc;
# validation/reference/nccl_topology_link_constants.csv).
PIPELINE_CHUNK_BYTES = 4 * 2**20 / 8


def channel_rates(group: Group, orders: list[list[int]]) -> np.ndarray:
    """Each channel's bottleneck rate (wire bytes/s): over the links of its ring edges, the least of
    capacity / (ring edges of all channels crossing the link), i.e. a step's fair share there
    (simdist.collectives.pacing.edge_shares).

    Rate coupling: NCCL's ring primitives forward a step slice by slice as it arrives
    (recvReduceSend, src/device/prims_simple.h) through connection buffers of NCCL_STEPS slots, so no
    hop of a channel runs ahead of the hop feeding it, and NCCL prices every hop of a ring channel at
    one bandwidth, its graph's bottleneck (src/graph/search.cc bwIntra/bwInter; tuning.cc busBw =
    nChannels x bw). In order: a connection is one FIFO of those slots, sent in order by the GPU (or
    its network proxy), so a step does not share the wire with the connection's previous one
    (`Transfer.after`); its latency (posting, flags, the wire) overlaps the previous step's bytes.
    # Assumption: the whole step's piece moves at that rate, store-and-forward per step (a hop starts
    # once its data has arrived), not cut through slice by slice; with the coupling this is what makes
    # the step latencies add up as NCCL's model does (see the module docstring).
    # Assumption: the share is taken with every channel's edges present, as in the detailed plan's
    # steps uncontended (channels of one ring progress together); traffic of other collectives
    # slows the flows further through link sharing but does not lower this cap.
    """
    channels, p = len(orders), len(orders[0])
    src = np.array(orders, dtype=np.int64).reshape(channels, p)
    key = ("channel_rates", src.tobytes(), src.shape)
    hit = group.memo.get(key)  # rates depend on the placement alone: shared by every protocol and size
    if hit is None:
        shares = edge_shares(group, src.reshape(-1), np.roll(src, -1, axis=1).reshape(-1))
        hit = group.memo[key] = shares.reshape(channels, p).min(axis=1)
    return hit


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
    forward per step). ``rates``: per channel, the rate its transfers move at most (`channel_rates`),
    each also sent in order on its connection (`Transfer.after`). None: plain transfers, as fast as
    their links allow and free to share them with the connection's other steps (a plan to verify).
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
        out = Transfer(src, dst, piece, chunk, reduce, deps, max_rate_Bps=rate, after=sent[i])
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
        return ring_chain(req.op, p, n, req.root, order=req.group.ring_orders(1)[0])
    channels = req.num_channels()
    orders = req.group.ring_orders(channels)
    rates = channel_rates(req.group, orders)
    if req.op == "reduce_scatter":
        return ring_all_reduce(p, n, channels, orders, phases=(True, False), op="reduce_scatter", rates=rates)
    if req.op == "all_gather":
        return ring_all_reduce(p, n, channels, orders, phases=(False, True), op="all_gather", rates=rates)
    return ring_all_reduce(p, n, channels, orders, op=req.op, rates=rates)  # all_reduce, barrier


def chain_latency_s(lat: np.ndarray, steps: int) -> np.ndarray:
    """Per channel (row of ``lat``, its ring edges' latencies in ring order), the longest latency of
    ``steps`` consecutive edges: a chunk's dependency chain crosses edges j, j+1, ..., j+steps-1 (mod P),
    whole laps plus a window of r = steps mod P edges, summed from prefix sums twice around (O(P))."""
    channels, p = lat.shape
    laps, r = divmod(steps, p)
    prefix = np.concatenate((np.zeros((channels, 1)), np.cumsum(np.concatenate((lat, lat), axis=1), axis=1)), axis=1)
    return (laps * prefix[:, p:p + 1] + (prefix[:, r:r + p] - prefix[:, :p])).max(axis=1)


def ring_steps(op: str, num_peers: int) -> int:
    """Ring steps of the ring phases: 2(P-1) for all_reduce (and barrier), P-1 for either half."""
    return num_peers - 1 if op in ("reduce_scatter", "all_gather") else 2 * (num_peers - 1)


def ring_fast(req: Request) -> Plan:
    """Fast fidelity of the ring phases: one flow per ring edge and channel carrying all its steps.

    Each flow moves steps x S/(P C) bytes at its channel's rate (`channel_rates`, as the detailed hops);
    its extra latency makes it pay the latency of the slowest dependency chain of its channel (steps
    consecutive edges, `chain_latency_s`), as the detailed plan's critical path does: there every hop
    moves at the channel's bottleneck rate, in order on its connection, so the chain's latencies add to
    steps x the bottleneck's step time (NCCL's lat + size / bw). Uncontended this equals the detailed
    plan's time per channel, hence overall (tests: to 1e-9 on 2-4 DGX H100 nodes, PCIe boxes sharing
    NICs, oversubscribed fabrics, channels of different rates); the flows share links as the detailed
    steps' transfers do. Edge latencies come from the group's vectorised routes (`Group.paths`), so
    building costs O(P C). Broadcast and reduce: `chain_fast`.
    """
    p, group = req.num_peers, req.group
    if req.op in ("broadcast", "reduce"):
        return chain_fast(req)
    channels = req.num_channels()
    orders = group.ring_orders(channels)
    src = np.array(orders, dtype=np.int64).reshape(channels, p)
    dst = np.roll(src, -1, axis=1)
    steps = ring_steps(req.op, p)
    piece = req.nbytes / (p * channels)
    # a hop's latency, the protocol's per-transfer latency included: paid at every step of the chain
    lat = group.paths(src.reshape(-1), dst.reshape(-1)).latency_s.reshape(channels, p) + \
        req.protocol.per_transfer_latency_s
    extra = chain_latency_s(lat, steps)[:, None] - lat
    rates = np.repeat(channel_rates(group, orders), p)
    n = channels * p
    with collector_paused():
        transfers = tuple(map(Transfer, src.reshape(-1).tolist(), dst.reshape(-1).tolist(), repeat(steps * piece, n),
                              repeat(-1, n), repeat(False, n), repeat((), n), extra.reshape(-1).tolist(),
                              rates.tolist()))
    return Plan(op=req.op, algorithm="ring", num_peers=p, nbytes=req.nbytes, transfers=transfers,
                num_chunks=0, channels=channels, verifiable=False)


def chain_order(req: Request) -> list[int]:
    """The pipelined chain of broadcast (from the root) or reduce (to the root) over the ring order."""
    p = req.num_peers
    order = req.group.ring_orders(1)[0]
    start = order.index(req.root)
    chain = [order[(start + i) % p] for i in range(p)]
    return chain[::-1] if req.op == "reduce" else chain


def chain_hop_ends_s(hop_s: np.ndarray, pieces: int) -> np.ndarray:
    """When hop i of a pipelined chain delivers its last piece, each hop taking ``hop_s[i]`` per piece and
    waiting for the piece to arrive and for its own previous piece: the sum of the hop times up to i plus
    (pieces - 1) x the slowest of them (a tandem of constant-time stages; Hockney model of a pipelined
    chain, Thakur, Rabenseifner & Gropp 2005 sec. 4.2)."""
    return np.cumsum(hop_s) + (pieces - 1) * np.maximum.accumulate(hop_s)


def chain_fast(req: Request) -> Plan:
    """Fast fidelity of the pipelined chain (broadcast, reduce): one flow per hop carrying all pieces.

    A hop's flow moves from the end of its latency at a steady rate that lands it when the chain's last
    piece does in the detailed plan (`chain_hop_ends_s`, with the request's protocol): its bytes over
    (that end - its latency), below its route's bottleneck, so alone every flow holds its rate and the
    plan takes the detailed plan's time; next to other traffic the flow shares links as the pieces do,
    spread over the whole collective, without holding up the hops after it. (Without bytes a flow
    waits out the chain's time as extra latency.)
    """
    chain = chain_order(req)
    k = pipeline_pieces(req.nbytes)
    proto = req.protocol
    src, dst = np.asarray(chain[:-1], dtype=np.int64), np.asarray(chain[1:], dtype=np.int64)
    routes = req.group.paths(src, dst)
    latency = routes.latency_s + proto.per_transfer_latency_s
    wire = req.nbytes / proto.rate_factor
    end = float(chain_hop_ends_s(latency + wire / k / routes.effective_bandwidth_Bps, k)[-1])
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where((wire > 0) & (end > latency), wire / (end - latency), math.inf)
    extra = np.zeros(len(src)) if wire > 0 else np.maximum(end - latency, 0.0)
    n = len(src)
    transfers = tuple(map(Transfer, src.tolist(), dst.tolist(), repeat(req.nbytes, n), repeat(-1, n),
                          repeat(req.op == "reduce", n), repeat((), n), extra.tolist(), rate.tolist()))
    return Plan(op=req.op, algorithm="ring", num_peers=req.num_peers, nbytes=req.nbytes, transfers=transfers,
                num_chunks=0, root=req.root, verifiable=False)


def detailed_size(req: Request) -> int:
    """Transfers of the detailed plan: channels x P x steps (the chain: P - 1 hops x pieces)."""
    if req.op in ("broadcast", "reduce"):
        return (req.num_peers - 1) * pipeline_pieces(req.nbytes)
    return req.num_channels() * req.num_peers * ring_steps(req.op, req.num_peers)


register(Algorithm(
    name="ring",
    ops=frozenset({"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier"}),
    build=_build,
    build_fast=ring_fast,
    detailed_size=detailed_size,
    summary="ring over all peers, one ring per channel (NCCL's default for large messages)",
))
