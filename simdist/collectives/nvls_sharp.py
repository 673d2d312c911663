"""NVLS-SHARP: all_reduce over several NVSwitch nodes, NVLS inside each node and the InfiniBand switches (SHARP)
between them: NCCL's NVLS algorithm with nNodes > 1 (NCCL 2.18+).

Sources (NVIDIA/nccl):
- src/device/all_reduce.h, RunWorkColl<ncclFuncAllReduce, T, RedOp, NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE>, the branch
  ``!work->oneNode``: per channel the buffer is cut into nHeads segments (loopSize = nChannels x nHeads x chunk);
  every GPU's scatter warps push each segment to the NVSwitch (nvls->up); head h's reduce warps read it reduced
  (multimem.ld_reduce, nvls->down) and send it to the network (nvls->out, the CollNet connection); its broadcast
  warps receive the fabric's result (nvls->out) and store it to the switch (nvls->down: multimem.st), which
  multicasts it to every GPU of the node (the gather warps read it, nvls->up);
- src/graph/connect.cc, connectNvls: "nvls.out = comm->nRanks" (the CollNet root) on the NVLS heads when CollNet is
  enabled; src/transport/coll_net.cc, ncclCollNetSetup: with NVLS the CollNet heads are the NVLS heads
  (comm->nvlsHeads), one SHARP communicator per head index across the nodes;
- src/graph/tuning.cc, ncclTopoTuneModel: "Disable ... Collnet+NVLS if collnet is not supported"
  (collnetEnable == 0 and NCCL_ALGO_NVLS with nNodes > 1); NVLS is Simple only, "needs at least 2 channels", and its
  bus bandwidth is min(bwIntra x nvlsEfficiency x (nChannels - 1) / nChannels x 2, bwInter) per channel; its latency
  "intraLat" then "+= interLat" when nNodes > 1 (simdist.collectives.nccl_model prices both); src/enqueue.cc,
  updateCollCostTable: "if (a == NCCL_ALGO_NVLS && collNetSupport != 1 && comm->nNodes > 1) continue", and the
  NCCL_ALGO_NVLS chunk rules (`nvls_sharp_chunk_bytes` in simdist.collectives.nccl_model).

Why a new algorithm and not `nvls` over several nodes: NCCL calls both NVLS, but the plans share nothing (one switch
owning P segments against per-node switches feeding one head per NIC and the fabric), neither do their costs (NCCL
adds interLat and the network bandwidth only with nNodes > 1), and `nvls` also runs reduce_scatter and all_gather,
which across nodes need the CollNet plugin's iallgather / ireducescatter and one NIC per GPU (tuning.cc): not
modelled. The shape is NVLS-Tree's (simdist.collectives.nvls_tree) with the fabric in place of the tree.

Here, for segment h (the NICs the group's ranks use in a node: one head each, simdist.collectives.collnet.
heads_by_node, as NCCL's nvlsHeads are the GPUs next to the NICs) and pipeline piece j, with ``S_n`` node n's
NVSwitch (pseudo-peer ``node_switch(n)``) and ``FABRIC`` the switches' reduction (simdist.collectives.plan):

A. every peer of node n pushes its copy to S_n (reduce: the switch accumulates);
B. S_n hands the node's sum to head h of n (ld_reduce);
U. head h of n pushes it to the fabric (GPU -> NIC -> leaf; reduce: SHARP adds the heads h of all nodes);
V. the fabric multicasts the total back to every node's head h (leaf -> NIC -> GPU);
D. head h of n stores the total to S_n; E. S_n multicasts it to the node's other peers.
# Assumption: the head's own copy of the multicast (multimem.st writes every GPU, the head included) is left out, as
# in simdist.collectives.nvls_tree: the head holds the total already.
# Assumption: as for collnet, the switch tree's own links above the leaves carry one reduced stream per SHARP tree and
# never limit it; the reduction is placed at the leaf, so U and V cross the head's route to its NIC and the NIC link.

Pipeline (as simdist.collectives.nvls_tree): every hop moves at one rate r, each connection (stage, segment, pair)
one piece at a time, a piece's latency overlapping the previous one's bytes. r is the least of
- each NVLink port's capacity over the connections crossing it (GPU -> switch: A for every segment, D where it is a
  head; switch -> GPU: B where it is a head, E for the other segments: H each way), times NCCL's nvlsEfficiency
  (tuning.cc: "intraBw = bwIntra * nvlsEfficiency ...", Hopper 0.85, Blackwell 0.74);
- each network connection's (U, V) share of its busiest link among them (simdist.collectives.pacing.edge_shares).
# Assumption: NCCL's (nChannels - 1) / nChannels on the NVLink bandwidth (one channel's share lost to the
# pipeline's fill) is not applied: the plan's own fill is timed, as for nvls_tree.
# Assumption: the network routes (head GPU -> PCIe -> its NIC) share no link with the NVLink ports.
The time is the longest chain of hops A -> B -> U -> V -> D -> E, each paying its latency and one piece's wire
time d, plus (k - 1) d (simdist.analytic.nvls_sharp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simdist.collectives.collnet import heads_by_node
from simdist.collectives.group import Group
from simdist.collectives.nccl_model import nvls_sharp_chunk_bytes
from simdist.collectives.nvls import nvls_port_rate
from simdist.collectives.nvls_tree import check_nvls_nodes
from simdist.collectives.pacing import edge_shares
from simdist.collectives.plan import FABRIC, Plan, Transfer, node_switch, steady_plan
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.collectives.ring import pipeline_pieces
from simdist.errors import SimdistError

NVLS_SHARP_OPS = frozenset({"all_reduce"})
STAGES = ("A", "B", "U", "V", "D", "E")
REDUCING = frozenset({"A", "U"})
"""The stages whose receiver combines what it gets (the switches: S_n in A, the fabric in U)."""


@dataclass(frozen=True, slots=True)
class Connections:
    """Every connection of a group's plan, by stage (src, dst arrays), each with its (node, segment) key n H + h:
    A and E by (segment, peer); B, U, V, D by (node, segment)."""

    heads: np.ndarray
    """[N, H] the head peer of each node and segment."""
    node_of: np.ndarray
    """[P] each peer's node index (Group.by_node order)."""
    stages: dict[str, tuple[np.ndarray, np.ndarray]]
    a_key: np.ndarray
    e_key: np.ndarray

    @property
    def num_nodes(self) -> int:
        return self.heads.shape[0]

    @property
    def num_heads(self) -> int:
        return self.heads.shape[1]


def nvls_sharp_connections(group: Group) -> Connections:
    """The connections of the plan on ``group`` (memoised with the group's placement)."""
    hit = group.memo.get("nvls_sharp_connections")
    if hit is not None:
        return hit
    node_of = np.empty(group.size, dtype=np.int64)
    for i, peers in enumerate(group.by_node().values()):
        node_of[peers] = i
    heads = np.asarray(heads_by_node(group), dtype=np.int64)
    n, h = heads.shape
    switch = node_switch(0) - np.arange(n)  # node_switch(m) for every m
    seg, peer = np.meshgrid(np.arange(h), np.arange(group.size), indexing="ij")
    a_key = (node_of[peer] * h + seg).reshape(-1)
    a = (peer.reshape(-1), switch[node_of[peer]].reshape(-1))
    flat = heads.reshape(-1)
    node_sw = np.repeat(switch, h)
    fabric = np.full(n * h, FABRIC, dtype=np.int64)
    keep = a[0] != flat[a_key]
    e_peer, e_key = a[0][keep], a_key[keep]
    stages = {"A": a, "B": (node_sw, flat), "U": (flat, fabric), "V": (fabric, flat), "D": (flat, node_sw),
              "E": (switch[node_of[e_peer]], e_peer)}
    hit = group.memo["nvls_sharp_connections"] = Connections(heads, node_of, stages, a_key, e_key)
    return hit


def nvls_sharp_rate(group: Group) -> float:
    """The rate every hop moves at (wire bytes/s): the least of the NVLink port shares (times nvlsEfficiency) and the
    network connections' shares (see the module docstring)."""
    hit = group.memo.get("nvls_sharp_rate")
    if hit is not None:
        return hit
    conns = nvls_sharp_connections(group)
    port = nvls_port_rate(group, conns.heads)  # A for every segment, D where a head; B or E down
    (u_src, u_dst), (v_src, v_dst) = conns.stages["U"], conns.stages["V"]
    net = float(edge_shares(group, np.concatenate((u_src, v_src)), np.concatenate((u_dst, v_dst))).min())
    hit = group.memo["nvls_sharp_rate"] = min(port, net)
    return hit


def nvls_sharp_pieces(req: Request) -> int:
    """Pipeline pieces of each segment: NCCL's NVLS chunks (`nvls_sharp_chunk_bytes`), against the plan's algorithm
    bandwidth H r (each segment's S / H bytes cross every hop at r)."""
    group = req.group
    h = nvls_sharp_connections(group).num_heads
    up = group.topology.spec.scale_up
    chunk = nvls_sharp_chunk_bytes(req.nbytes, h, h * nvls_sharp_rate(group), up.nvlink_generation if up else 4)
    return pipeline_pieces(req.nbytes / h, chunk)


@dataclass(frozen=True, slots=True)
class Schedule:
    pieces: int
    piece_bytes: float
    piece_s: float
    """d: a piece's wire time at the plan's rate (protocol rate factor included)."""
    latency_s: dict[str, np.ndarray]
    """Per stage, each connection's latency (protocol's included), in `nvls_sharp_connections` order."""
    time_s: float
    """When the last piece lands (without the protocol's start-up)."""


def nvls_sharp_schedule(req: Request) -> Schedule:
    """The uncontended schedule of the plan of ``req``: first pieces along the chain A -> B -> U -> V -> D -> E, a
    hop starting once every hop feeding it delivered (V once every node's U of its segment) and paying its latency
    and d, then (k - 1) d for the pieces behind (the max-plus recurrence of simdist.analytic.tree with one rate)."""
    group = req.group
    conns = nvls_sharp_connections(group)
    n, h = conns.num_nodes, conns.num_heads
    k = nvls_sharp_pieces(req)
    size = req.nbytes / (h * k)
    d = size / req.protocol.rate_factor / nvls_sharp_rate(group) if size > 0 else 0.0
    extra = req.protocol.per_transfer_latency_s
    lat = {s: group.paths(*conns.stages[s]).latency_s + extra for s in STAGES}
    into = np.full(n * h, -math.inf)
    np.maximum.at(into, conns.a_key, lat["A"] + d)
    pushed = into + lat["B"] + d + lat["U"] + d  # [N H]: head h of n's sum reaches the fabric
    reduced = pushed.reshape(n, h).max(axis=0)  # [H]: the fabric holds segment h's total
    stored = np.tile(reduced, n) + lat["V"] + d + lat["D"] + d  # [N H]: S_n holds the total
    multicast = stored[conns.e_key] + lat["E"] + d
    last = max(float(stored.max()), float(multicast.max()) if len(multicast) else 0.0)
    return Schedule(k, size, d, lat, last + (k - 1) * d)


def nvls_sharp_plan(req: Request, paced: bool = True) -> Plan:
    """The detailed plan (see the module docstring); ``paced``: every transfer at the plan's rate, in order on its
    connection (False: plain transfers, to verify)."""
    group = req.group
    conns = nvls_sharp_connections(group)
    n_nodes, h = conns.num_nodes, conns.num_heads
    k = nvls_sharp_pieces(req)
    size = req.nbytes / (h * k)
    rate = nvls_sharp_rate(group) if paced else math.inf
    peers = [np.flatnonzero(conns.node_of == n).tolist() for n in range(n_nodes)]
    heads = conns.heads.tolist()
    transfers: list[Transfer] = []
    last: dict[tuple, int] = {}  # (stage, segment, src, dst) -> the connection's last transfer

    def emit(stage: str, s: int, src: int, dst: int, chunk: int, deps: list[int]) -> int:
        i = len(transfers)
        key = (stage, s, src, dst)
        after = last.get(key, -1) if paced else -1
        transfers.append(Transfer(src, dst, size, chunk, stage in REDUCING, tuple(deps), max_rate_Bps=rate,
                                  after=after))
        last[key] = i
        return i

    for j in range(k):
        for s in range(h):
            chunk = j * h + s
            ups = []
            for n in range(n_nodes):
                sw = node_switch(n)
                pushed = [emit("A", s, p, sw, chunk, []) for p in peers[n]]
                b = emit("B", s, sw, heads[n][s], chunk, pushed)
                ups.append(emit("U", s, heads[n][s], FABRIC, chunk, [b]))
            for n in range(n_nodes):
                sw = node_switch(n)
                back = emit("V", s, FABRIC, heads[n][s], chunk, ups)
                stored = emit("D", s, heads[n][s], sw, chunk, [back])
                for p in peers[n]:
                    if p != heads[n][s]:
                        emit("E", s, sw, p, chunk, [stored])
    return Plan(op=req.op, algorithm="nvls_sharp", num_peers=req.num_peers, nbytes=req.nbytes,
                transfers=tuple(transfers), num_chunks=h * k)


def nvls_sharp_fast(req: Request) -> Plan:
    """Fast fidelity: one flow per connection carrying its k pieces at the steady rate that lands it when the
    detailed plan ends (`nvls_sharp_schedule`, with the request's protocol), below the plan's rate: alone the plan
    takes the detailed plan's time; next to other traffic every flow shares its links over the whole collective.
    (Without bytes a flow waits out the time.)"""
    check_nvls_sharp(req)
    sched = nvls_sharp_schedule(req)
    stages = nvls_sharp_connections(req.group).stages
    src = np.concatenate([stages[s][0] for s in STAGES])
    dst = np.concatenate([stages[s][1] for s in STAGES])
    lat = np.concatenate([sched.latency_s[s] for s in STAGES])
    reduce = np.concatenate([np.full(len(stages[s][0]), s in REDUCING) for s in STAGES])
    return steady_plan(req.op, "nvls_sharp", req.num_peers, req.nbytes, src, dst, reduce, lat,
                       sched.pieces * sched.piece_bytes, req.protocol.rate_factor, sched.time_s)


def detailed_size(req: Request) -> int:
    """Transfers of the detailed plan: per piece and segment, A P, B U V D N each, E P - N."""
    conns = nvls_sharp_connections(req.group)
    return nvls_sharp_pieces(req) * conns.num_heads * (2 * req.num_peers + 3 * conns.num_nodes)


def check_nvls_sharp(req: Request) -> None:
    """Where NCCL runs NVLS across nodes (tuning.cc, ncclTopoTuneModel; src/enqueue.cc, updateCollCostTable;
    src/transport/nvls.cc, ncclNvlsInit): NVLS support (an NVSwitch with NVLink SHARP, 2+ GPUs of the communicator
    in a node), CollNet support (switches that reduce: inter_node.sharp), 2+ nodes (on one node NVLS is `nvls`),
    2+ NVLS channels (one head per NIC: "NVLS/NVLStree needs at least 2 channels"), and here the same number of NICs
    in use on every node (one SHARP tree per head index, as ncclCollNetSetup builds one communicator per head)."""
    check_nvls_nodes(req, "nvls_sharp", joins="through the fabric", per_head="SHARP tree",
                     others="collnet, ring, tree or auto", fabric=_check_sharp)


def _check_sharp(req: Request) -> None:
    t = req.group.topology
    fabric = t.spec.inter_node
    if fabric is None or not fabric.sharp:
        raise SimdistError(
            f"nvls_sharp reduces between the nodes in the InfiniBand switches (SHARP; NCCL runs NVLS across nodes "
            f"only with CollNet), but {t.spec.name}'s fabric does not (inter_node.sharp is false or there is no "
            f"fabric)", field="--algorithm",
            fix="use --algorithm nvls_tree, ring or auto, or set inter_node.sharp: true where the switches run SHARP "
                "(--set inter_node.sharp=true)")


def _build(req: Request) -> Plan:
    check_nvls_sharp(req)
    return nvls_sharp_plan(req)


register(Algorithm(
    name="nvls_sharp",
    ops=NVLS_SHARP_OPS,
    build=_build,
    check=check_nvls_sharp,
    build_fast=nvls_sharp_fast,
    detailed_size=detailed_size,
    summary="NCCL's NVLS across nodes: NVLS inside each NVSwitch node, SHARP between the nodes' heads "
            "(needs inter_node.sharp)",
))
