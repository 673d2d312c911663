"""CollNet: all_reduce reduced by the InfiniBand switches (SHARP), as NCCL's CollNetDirect runs it.

Sources: NVIDIA/nccl src/device/all_reduce.h (RunWorkColl<ncclFuncAllReduce, T, RedOp,
NCCL_ALGO_COLLNET_DIRECT, NCCL_PROTO_SIMPLE>: scatter to the heads, the heads' network send and receive, the
heads' broadcast back), src/graph/tuning.cc (ncclTopoTuneModel: CollNetDirect is Simple only, disabled
without collnet support and "if not on an NVSwitch system"; latency "2 * (min(1, ppn-1) * intraLat +
(ppn-1) * 0.4) + interLat"), src/graph/connect.cc (collNet heads: the GPUs next to the node's NICs);
NVIDIA SHARP (Scalable Hierarchical Aggregation and Reduction Protocol) in Quantum switches, reached by NCCL
through the CollNet plugin of Mellanox/nccl-rdma-sharp-plugins. The fabric must say it reduces:
``inter_node.sharp: true`` (simdist.spec.topology).

The buffer is cut into H segments, H the NICs the group's ranks use in a node (one head per NIC: the
first of the node's peers next to it; NIC rail h carries segment h of every node, one SHARP tree per rail),
and each segment into k pipeline pieces of NCCL's 512 KiB Simple step. For piece j of segment h:

A. every peer of a node sends its copy to the node's head h, which reduces it (NVLink, direct);
B. head h pushes the node's sum to the fabric (``FABRIC``: GPU -> NIC -> leaf switch), which reduces
   the heads h of all nodes;
C. the fabric multicasts the result back to every node's head h (leaf -> NIC -> GPU);
D. head h sends it to every other peer of its node.

# Assumption: the switch tree's own links (leaf to spine and up) carry one reduced stream per tree and never
# limit it; the reduction is placed at the leaf, so B and C cross the NIC links only. Its latency is NCCL's
# interLat, priced by simdist.collectives.nccl_model (half on each of B and C).

Pipeline (simdist.collectives.pacing): every hop moves at one rate, the least over all connections of their
share of their busiest link (edge_shares: a GPU's NVLink port carries its A connections to the other heads
and, at a head, its D connections), and a connection sends its pieces in order, each piece's latency
overlapping the previous one's bytes, as the tree does (simdist.collectives.tree). The time is then the
longest chain of hops, each paying its latency and one piece's wire time d, plus (k - 1) d
(simdist.analytic.collnet).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simdist.collectives.group import Group
from simdist.collectives.pacing import edge_shares
from simdist.collectives.plan import FABRIC, Plan, Transfer, steady_plan
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.collectives.ring import pipeline_pieces
from simdist.errors import SimdistError

COLLNET_OPS = frozenset({"all_reduce"})


@dataclass(frozen=True, slots=True)
class Shape:
    """The connections of a group's CollNet plan, each with its (node, segment) key n x H + h."""

    num_nodes: int
    num_heads: int
    heads: np.ndarray
    """[N, H] the head peer of each node and segment."""
    a_src: np.ndarray
    a_key: np.ndarray
    d_dst: np.ndarray
    d_key: np.ndarray

    @property
    def a_dst(self) -> np.ndarray:
        return self.heads.reshape(-1)[self.a_key]

    @property
    def d_src(self) -> np.ndarray:
        return self.heads.reshape(-1)[self.d_key]


def heads_by_node(group: Group) -> list[list[int]]:
    """Per node, the head peer of each NIC its peers use (the first peer next to it), by NIC index."""
    t = group.topology
    out = []
    for peers in group.by_node().values():
        first: dict[int, int] = {}
        for p in peers:
            nic = t.node.nic_of_gpu[t.locate(group.ranks[p])[1]]
            if nic is not None:
                first.setdefault(nic, p)
        out.append([first[nic] for nic in sorted(first)])
    return out


def collnet_shape(group: Group) -> Shape:
    """The connections of the plan on ``group`` (memoised with the group's placement)."""
    hit = group.memo.get("collnet_shape")
    if hit is not None:
        return hit
    nodes = list(group.by_node().values())
    heads = heads_by_node(group)
    n, h = len(nodes), len(heads[0])
    a_src, a_key, d_dst, d_key = [], [], [], []
    for i, peers in enumerate(nodes):
        for s, head in enumerate(heads[i]):
            others = [p for p in peers if p != head]
            a_src += others
            d_dst += others
            a_key += [i * h + s] * len(others)
            d_key += [i * h + s] * len(others)
    as_array = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    shape = Shape(n, h, as_array(heads), as_array(a_src), as_array(a_key), as_array(d_dst), as_array(d_key))
    group.memo["collnet_shape"] = shape
    return shape


def _connections(shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) of every connection: A, then B (head -> FABRIC), C (FABRIC -> head), D, B and C by key."""
    heads = shape.heads.reshape(-1)
    fabric = np.full(len(heads), FABRIC, dtype=np.int64)
    return (np.concatenate((shape.a_src, heads, fabric, shape.d_src)),
            np.concatenate((shape.a_dst, fabric, heads, shape.d_dst)))


def collnet_rate(group: Group) -> float:
    """The rate every hop moves at (wire bytes/s): the least share of any connection (see the docstring)."""
    hit = group.memo.get("collnet_rate")
    if hit is None:
        src, dst = _connections(collnet_shape(group))
        hit = group.memo["collnet_rate"] = float(edge_shares(group, src, dst).min())
    return hit


def collnet_pieces(req: Request) -> int:
    return pipeline_pieces(req.nbytes / collnet_shape(req.group).num_heads)


@dataclass(frozen=True, slots=True)
class CollnetSchedule:
    pieces: int
    piece_bytes: float
    piece_s: float
    """d: a piece's wire time at the plan's rate (protocol rate factor included)."""
    latency_s: np.ndarray
    """Per connection (in `_connections` order), its latency (protocol's included)."""
    time_s: float
    """When the last piece lands (without the protocol's start-up)."""


def collnet_schedule(req: Request) -> CollnetSchedule:
    """The uncontended schedule of the plan of ``req``: first pieces along the chain A -> B -> C -> D
    (a hop starts once every hop feeding it delivered, pays its latency and d), then (k - 1) d."""
    shape = collnet_shape(req.group)
    n, h = shape.num_nodes, shape.num_heads
    k = collnet_pieces(req)
    size = req.nbytes / (k * h)
    rate = collnet_rate(req.group)
    d = size / req.protocol.rate_factor / rate if size > 0 else 0.0
    src, dst = _connections(shape)
    lat = req.group.paths(src, dst).latency_s + req.protocol.per_transfer_latency_s
    na, nh = len(shape.a_src), n * h
    lat_a, lat_b, lat_c, lat_d = lat[:na], lat[na:na + nh], lat[na + nh:na + 2 * nh], lat[na + 2 * nh:]
    into_head = np.zeros(nh)
    np.maximum.at(into_head, shape.a_key, lat_a + d)
    pushed = into_head + lat_b + d
    back = pushed.reshape(n, h).max(axis=0)[None, :].repeat(n, axis=0).reshape(-1) + lat_c + d
    done = back.copy()
    np.maximum.at(done, shape.d_key, back[shape.d_key] + lat_d + d)
    return CollnetSchedule(k, size, d, lat, float(done.max()) + (k - 1) * d)


def collnet_plan(req: Request, paced: bool = True) -> Plan:
    """The detailed plan (see the module docstring); ``paced``: every transfer at the plan's rate, in order
    on its connection (False: plain transfers, to verify)."""
    shape = collnet_shape(req.group)
    n, h = shape.num_nodes, shape.num_heads
    k = collnet_pieces(req)
    size = req.nbytes / (k * h)
    rate = collnet_rate(req.group) if paced else math.inf
    heads = shape.heads.reshape(-1).tolist()
    a_by_key: list[list[int]] = [[] for _ in range(n * h)]
    d_by_key: list[list[int]] = [[] for _ in range(n * h)]
    for src, key in zip(shape.a_src.tolist(), shape.a_key.tolist(), strict=True):
        a_by_key[key].append(src)
    for dst, key in zip(shape.d_dst.tolist(), shape.d_key.tolist(), strict=True):
        d_by_key[key].append(dst)
    transfers: list[Transfer] = []
    last: dict[tuple[int, int, str], int] = {}  # (src, dst, stage) -> the connection's last transfer

    def emit(src: int, dst: int, chunk: int, reduce: bool, deps: list[int], stage: str) -> int:
        # A (into a head) and D (out of it) between the same two peers are two connections, as edge_shares counts
        i = len(transfers)
        after = last.get((src, dst, stage), -1) if paced else -1
        transfers.append(Transfer(src, dst, size, chunk, reduce, tuple(deps), max_rate_Bps=rate, after=after))
        last[(src, dst, stage)] = i
        return i

    for j in range(k):
        for s in range(h):
            chunk = j * h + s
            pushes = []
            for node in range(n):
                key = node * h + s
                arrived = [emit(p, heads[key], chunk, True, [], "A") for p in a_by_key[key]]
                pushes.append(emit(heads[key], FABRIC, chunk, True, arrived, "B"))
            for node in range(n):
                key = node * h + s
                back = emit(FABRIC, heads[key], chunk, False, pushes, "C")
                for p in d_by_key[key]:
                    emit(heads[key], p, chunk, False, [back], "D")
    return Plan(op=req.op, algorithm="collnet", num_peers=req.num_peers, nbytes=req.nbytes,
                transfers=tuple(transfers), num_chunks=k * h)


def collnet_fast(req: Request) -> Plan:
    """Fast fidelity: one flow per connection carrying its k pieces at the steady rate that lands it when the
    detailed plan ends (`collnet_schedule`, with the request's protocol), below the plan's rate (a connection's
    pieces take k d of the plan's time): alone the plan takes the detailed plan's time; next to other traffic
    every flow shares its links spread over the whole collective. (Without bytes a flow waits out the time.)"""
    check_collnet(req)
    sched = collnet_schedule(req)
    shape = collnet_shape(req.group)
    src, dst = _connections(shape)
    nh = shape.num_nodes * shape.num_heads
    reduce = np.arange(len(src)) < len(shape.a_src) + nh  # A and B reduce; C and D copy
    return steady_plan(req.op, "collnet", req.num_peers, req.nbytes, src, dst, reduce, sched.latency_s,
                       sched.pieces * sched.piece_bytes, req.protocol.rate_factor, sched.time_s)


def detailed_size(req: Request) -> int:
    """Transfers of the detailed plan: per piece and segment, 2 P (A and D: P - N; B and C: N)."""
    return 2 * req.num_peers * collnet_shape(req.group).num_heads * collnet_pieces(req)


def check_collnet(req: Request) -> None:
    """CollNet needs a fabric whose switches reduce (inter_node.sharp), a group over 2+ nodes, NVSwitch nodes
    (NCCL disables CollNetDirect elsewhere) and the same number of NICs in use on every node."""
    t = req.group.topology
    fabric = t.spec.inter_node
    if fabric is None or not fabric.sharp:
        raise SimdistError(
            f"collnet reduces in the InfiniBand switches (SHARP), but {t.spec.name}'s fabric does not "
            f"(inter_node.sharp is false or there is no fabric)",
            field="--algorithm", fix="use --algorithm ring, tree or auto, or set inter_node.sharp: true where the "
                                     "switches run SHARP (--set inter_node.sharp=true)")
    nodes = req.group.by_node()
    if len(nodes) < 2:
        raise SimdistError("collnet reduces across nodes in the fabric, but the group is inside one node",
                           field="--algorithm", fix="use --algorithm ring, nvls or auto, or ranks on 2+ nodes")
    if t.spec.scale_up is None:
        raise SimdistError(
            "collnet follows NCCL's CollNetDirect, which runs on NVSwitch nodes only (tuning.cc disables it "
            f"elsewhere); {t.spec.name} has no NVSwitch (CollNetChain is not modelled)",
            field="--algorithm", fix="use --algorithm ring, tree or auto")
    counts = sorted({len(h) for h in heads_by_node(req.group)})
    if len(counts) > 1 or counts[0] == 0:
        raise SimdistError(
            f"collnet runs one SHARP tree per NIC rail, but the group's nodes use {counts} NICs (one head per NIC)",
            field="--ranks", fix="use the same GPUs on every node, or --algorithm ring, tree or auto")


def _build(req: Request) -> Plan:
    check_collnet(req)
    return collnet_plan(req)


register(Algorithm(
    name="collnet",
    ops=COLLNET_OPS,
    build=_build,
    check=check_collnet,
    build_fast=collnet_fast,
    detailed_size=detailed_size,
    summary="NCCL's CollNetDirect: the InfiniBand switches reduce (SHARP; needs inter_node.sharp)",
))
