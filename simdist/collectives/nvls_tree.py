"""NVLS-Tree: all_reduce over several NVSwitch nodes, NVLS inside each node and a tree between them (NCCL 2.18+).

Source: NVIDIA/nccl src/device/all_reduce.h, RunWorkColl<ncclFuncAllReduce, T, RedOp, NCCL_ALGO_NVLS_TREE,
NCCL_PROTO_SIMPLE>: per channel the buffer is cut into nHeads segments, one per head (the GPUs next to the node's
NICs, src/graph/connect.cc connectNvls: nvlsHeads); every GPU's scatter warps push each segment to the NVSwitch
(nvls->up[h]), the head's reduce warps read it reduced (multimem.ld_reduce, nvls->down) together with its tree
children's sums from the network (treeDown) and send the total up the tree (treeUp), or, at the root, back down;
its broadcast warps forward what comes down the tree to its children and store it to the switch, which multicasts
it to every GPU (multimem.st; the gather warps). The tree between the nodes is NCCL's double binary tree
(src/graph/connect.cc connectNvls: ncclGetDtree over the nodes, tree c % 2 on channel c, between the heads of one
index), simdist.collectives.tree_shape.dtree_parents: half of the buffer on each tree.

Here, for tree t (0, 1), segment h (the NICs the group's ranks use in a node: one head each,
simdist.collectives.collnet.heads_by_node) and pipeline piece j (NCCL's NVLSTree chunk, 32-128 KiB:
`nvls_tree_chunk_bytes`), with ``S_n`` node n's
NVSwitch (pseudo-peer ``node_switch(n)``, simdist.collectives.plan.NODE_SWITCH):

A. every peer of node n pushes its copy to S_n (reduce: the switch accumulates);
B. S_n hands the node's sum to head h of n (ld_reduce);
U. head h of n sends its subtree's sum to head h of its parent node (reduce; network), once it holds its node's
   sum and its children's; W. back down the tree (copy), from the root, which holds the total;
D. head h of n stores the total to S_n; E. S_n multicasts it to the node's other peers.
# Assumption: the head's own copy of the multicast (multimem.st writes every GPU, the head included) is left out:
# the head holds the total already, and its NVLink downlink carries the other heads' multicasts and its B.

Pipeline (as simdist.collectives.collnet): every hop moves at one rate r, each connection (stage, tree, segment,
pair: NCCL's separate scatter, reduce, tree and store connections) one piece at a time, a piece's latency
overlapping the previous one's bytes. r is the least of
- each NVLink port's capacity over the connections crossing it (GPU -> switch: A for every (t, h), D where it is
  a head; switch -> GPU: B where it is a head, E for the other segments: 2H each way), times NCCL's nvlsEfficiency
  (tuning.cc, ncclTopoTuneModel: "intraBw = bwIntra * nvlsEfficiency ...", Hopper 0.85, Blackwell 0.74);
- each tree connection's share of its busiest network link among the tree connections
  (simdist.collectives.pacing.edge_shares; with two nodes the two trees run opposite ways and a NIC carries one
  connection each way: NCCL's "Handle 2 node case of NVLSTree", interBw x 2);
- NCCL's cap on the bus bandwidth per head, perChMaxNVLSTreeBws (tuning.cc; Hopper 57.7 GB/s at 2 nodes, 45.5 at
  3+, Blackwell 96 and 80): the plan's algorithm bandwidth is 2 H r (every connection carries S / 2H), NCCL's
  busBw x nRanks / nsteps = H x cap x P / (2 (P - 1)), so r <= cap x P / (4 (P - 1)).
# Assumption: the tree's network routes (head GPU -> PCIe -> its NIC -> fabric) share no link with the NVLink
# ports (the heads are the GPUs next to their NICs), so the two kinds of connection are shared separately.
The time is the longest chain of hops (A -> B -> U ... U -> W ... W -> D -> E), each paying its latency and one
piece's wire time d, plus (k - 1) d (simdist.analytic.nvls_tree).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simdist.collectives.collnet import heads_by_node
from simdist.collectives.group import Group
from simdist.collectives.nccl_model import bandwidth_caps, nvls_tree_chunk_bytes
from simdist.collectives.nvls import nvls_port_rate
from simdist.collectives.pacing import edge_shares
from simdist.collectives.plan import Plan, Transfer, node_switch, steady_plan
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.collectives.ring import pipeline_pieces
from simdist.collectives.tree_shape import dtree_parents
from simdist.errors import SimdistError

NVLS_TREE_OPS = frozenset({"all_reduce"})
TREES = 2
"""NCCL's double binary tree: channel c runs tree c % 2 (connect.cc, connectNvls), half of the buffer each."""
NVLS_ARCH = {4: "Hopper", 5: "Blackwell"}
"""NCCL's architecture row of an NVLS-capable NVLink generation (NVSwitch gen3 with NVLink 4: Hopper; NVLink 5:
Blackwell), for perChMaxNVLSTreeBws (tuning.cc indexes it by compute capability, and NVLS needs sm90+)."""


@dataclass(frozen=True, slots=True)
class Shape:
    """A group's NVLS-Tree connections: ``heads[n, h]`` the head peer of segment h in node n; ``node_of[p]`` the
    node index of peer p; ``parents[t, n]`` node n's parent node in tree t (-1 at the root)."""

    heads: np.ndarray
    node_of: np.ndarray
    parents: np.ndarray
    levels: tuple[tuple[np.ndarray, ...], ...]
    """Per tree, the non-root nodes by depth (depth 1 first)."""

    @property
    def num_nodes(self) -> int:
        return self.heads.shape[0]

    @property
    def num_heads(self) -> int:
        return self.heads.shape[1]


def _levels(parents: list[int]) -> tuple[np.ndarray, ...]:
    depth = [-1] * len(parents)
    for n in range(len(parents)):
        chain, m = [], n
        while depth[m] < 0 and parents[m] >= 0:
            chain.append(m)
            m = parents[m]
        base = max(depth[m], 0)
        for i, node in enumerate(reversed(chain)):
            depth[node] = base + i + 1
        if parents[n] < 0:
            depth[n] = 0
    top = max(depth)
    return tuple(np.flatnonzero(np.asarray(depth) == level) for level in range(1, top + 1))


def nvls_tree_shape(group: Group) -> Shape:
    """The shape of the plan on ``group`` (memoised with the group's placement)."""
    hit = group.memo.get("nvls_tree_shape")
    if hit is not None:
        return hit
    node_of = np.empty(group.size, dtype=np.int64)
    for i, peers in enumerate(group.by_node().values()):
        node_of[peers] = i
    heads = np.asarray(heads_by_node(group), dtype=np.int64)
    n = len(heads)
    parents = [dtree_parents(n, t) for t in range(TREES)]
    shape = Shape(heads, node_of, np.asarray(parents, dtype=np.int64), tuple(_levels(p) for p in parents))
    group.memo["nvls_tree_shape"] = shape
    return shape


@dataclass(frozen=True, slots=True)
class Connections:
    """Every connection of the plan, by stage: src, dst arrays; A, E by (tree, segment, peer); B, D by (tree, node,
    segment); U, W by (tree, node, segment) for the non-root nodes (node the child)."""

    stages: dict[str, tuple[np.ndarray, np.ndarray]]
    a_key: np.ndarray
    """[T, H, P] flattened: (tree, node, segment) key t N H + n H + h of each A connection."""
    e_key: np.ndarray
    u_key: np.ndarray
    """(tree, node, segment) key of each U (and W) connection, the child's node."""


def connections(shape: Shape) -> Connections:
    n_nodes, h = shape.num_nodes, shape.num_heads
    p = len(shape.node_of)
    switch = node_switch(0) - np.arange(n_nodes)  # node_switch(n) for every n
    t_, h_, peer = np.meshgrid(np.arange(TREES), np.arange(h), np.arange(p), indexing="ij")
    a_key = ((t_ * n_nodes + shape.node_of[peer]) * h + h_).reshape(-1)
    a = (peer.reshape(-1), switch[shape.node_of[peer]].reshape(-1))
    heads = np.broadcast_to(shape.heads, (TREES, n_nodes, h)).reshape(-1)
    node_sw = np.broadcast_to(switch[None, :, None], (TREES, n_nodes, h)).reshape(-1)
    child_t, child_n = np.nonzero(shape.parents >= 0)
    u_key = ((child_t[:, None] * n_nodes + child_n[:, None]) * h + np.arange(h)[None, :]).reshape(-1)
    up_src = shape.heads[child_n].reshape(-1)
    up_dst = shape.heads[shape.parents[child_t, child_n]].reshape(-1)
    e_peer = peer.reshape(-1)
    e_key = a_key
    keep = e_peer != heads[e_key]
    e_peer, e_key = e_peer[keep], e_key[keep]
    stages = {"A": a, "B": (node_sw, heads), "U": (up_src, up_dst), "W": (up_dst, up_src), "D": (heads, node_sw),
              "E": (switch[shape.node_of[e_peer]], e_peer)}
    return Connections(stages, a_key, e_key, u_key)


def _connections(group: Group) -> Connections:
    hit = group.memo.get("nvls_tree_connections")
    if hit is None:
        hit = group.memo["nvls_tree_connections"] = connections(nvls_tree_shape(group))
    return hit


def nvls_arch(group: Group) -> str:
    up = group.topology.spec.scale_up
    return NVLS_ARCH.get(up.nvlink_generation if up is not None else 0, "Blackwell")


def cap_rate_Bps(group: Group) -> float:
    """NCCL's perChMaxNVLSTreeBws as the plan's rate: cap x P / (4 (P - 1)) (see the module docstring)."""
    nodes = nvls_tree_shape(group).num_nodes
    cap = bandwidth_caps()[("perChMaxNVLSTreeBws", nvls_arch(group), "nNodes=2" if nodes <= 2 else "nNodes>=3")]
    p = group.size
    return cap * 1e9 * p / (4 * (p - 1))


def nvls_tree_rate(group: Group) -> float:
    """The rate every hop moves at (wire bytes/s): the least of the port shares, the tree shares and the cap."""
    hit = group.memo.get("nvls_tree_rate")
    if hit is not None:
        return hit
    shape = nvls_tree_shape(group)
    port = nvls_port_rate(group, shape.heads, TREES)  # A for every (t, h), D where a head; B or E down
    src, dst = _connections(group).stages["U"]
    tree = float(edge_shares(group, np.concatenate((src, dst)), np.concatenate((dst, src))).min())
    hit = group.memo["nvls_tree_rate"] = min(port, tree, cap_rate_Bps(group))
    return hit


def nvls_tree_pieces(req: Request) -> int:
    """Pipeline pieces of each (tree, segment) share: NCCL's NVLSTree chunks (`nvls_tree_chunk_bytes`)."""
    shape = nvls_tree_shape(req.group)
    up = req.group.topology.spec.scale_up
    chunk = nvls_tree_chunk_bytes(req.nbytes, shape.num_nodes, shape.num_heads, up.nvlink_generation if up else 4)
    return pipeline_pieces(req.nbytes / (TREES * shape.num_heads), chunk)


@dataclass(frozen=True, slots=True)
class Schedule:
    pieces: int
    piece_bytes: float
    piece_s: float
    """d: a piece's wire time at the plan's rate (protocol rate factor included)."""
    latency_s: dict[str, np.ndarray]
    """Per stage, each connection's latency (protocol's included), in `connections` order."""
    first_s: dict[str, np.ndarray]
    """Per stage, when each connection's first piece lands."""
    time_s: float
    """When the last piece lands (without the protocol's start-up)."""


def nvls_tree_schedule(req: Request) -> Schedule:
    """The uncontended schedule of the plan of ``req``: first pieces along the chain A -> B -> U (up the tree) ->
    W (down) -> D -> E, a hop starting once every hop feeding it delivered and paying its latency and d, then
    (k - 1) d for the pieces behind (the max-plus recurrence of simdist.analytic.tree with one rate)."""
    group = req.group
    shape = nvls_tree_shape(group)
    conns = _connections(group)
    n_nodes, h = shape.num_nodes, shape.num_heads
    k = nvls_tree_pieces(req)
    size = req.nbytes / (TREES * h * k)
    d = size / req.protocol.rate_factor / nvls_tree_rate(group) if size > 0 else 0.0
    extra = req.protocol.per_transfer_latency_s
    lat = {s: group.paths(*conns.stages[s]).latency_s + extra for s in conns.stages}
    first: dict[str, np.ndarray] = {"A": lat["A"] + d}
    into = np.full(TREES * n_nodes * h, -math.inf)
    np.maximum.at(into, conns.a_key, first["A"])
    first["B"] = into + lat["B"] + d
    b = first["B"].reshape(TREES, n_nodes, h)
    held = b.copy()  # when head h of node n holds its subtree's sum (first piece)
    lat_u = np.full((TREES, n_nodes, h), np.nan)
    lat_u.reshape(-1)[conns.u_key] = lat["U"]
    lat_w = np.full((TREES, n_nodes, h), np.nan)
    lat_w.reshape(-1)[conns.u_key] = lat["W"]
    u = np.full((TREES, n_nodes, h), np.nan)
    for t in range(TREES):
        par = shape.parents[t]
        for nodes in reversed(shape.levels[t]):
            u[t, nodes] = np.maximum(held[t, nodes], b[t, par[nodes]]) + lat_u[t, nodes] + d
            np.maximum.at(held[t], par[nodes], u[t, nodes])
    final = held.copy()  # when head h of node n holds the total: the root's sum, then down the tree
    w = np.full((TREES, n_nodes, h), np.nan)
    for t in range(TREES):
        par = shape.parents[t]
        for nodes in shape.levels[t]:
            w[t, nodes] = final[t, par[nodes]] + lat_w[t, nodes] + d
            final[t, nodes] = w[t, nodes]
    first["U"] = u.reshape(-1)[conns.u_key]
    first["W"] = w.reshape(-1)[conns.u_key]
    first["D"] = final.reshape(-1) + lat["D"] + d
    first["E"] = first["D"][conns.e_key] + lat["E"] + d
    last = max(float(first["D"].max()), float(first["E"].max()) if len(first["E"]) else 0.0)
    return Schedule(k, size, d, lat, first, last + (k - 1) * d)


def nvls_tree_plan(req: Request, paced: bool = True) -> Plan:
    """The detailed plan (see the module docstring); ``paced``: every transfer at the plan's rate, in order on its
    connection (False: plain transfers, to verify)."""
    group = req.group
    shape = nvls_tree_shape(group)
    n_nodes, h = shape.num_nodes, shape.num_heads
    k = nvls_tree_pieces(req)
    size = req.nbytes / (TREES * h * k)
    rate = nvls_tree_rate(group) if paced else math.inf
    peers = [list(np.flatnonzero(shape.node_of == n)) for n in range(n_nodes)]
    heads = shape.heads.tolist()
    order = [[int(n) for level in shape.levels[t] for n in level] for t in range(TREES)]  # parents first
    transfers: list[Transfer] = []
    last: dict[tuple, int] = {}  # (stage, tree, segment, src, dst) -> the connection's last transfer

    def emit(stage: str, t: int, s: int, src: int, dst: int, chunk: int, reduce: bool, deps: list[int]) -> int:
        i = len(transfers)
        key = (stage, t, s, src, dst)
        after = last.get(key, -1) if paced else -1
        transfers.append(Transfer(src, dst, size, chunk, reduce, tuple(deps), max_rate_Bps=rate, after=after))
        last[key] = i
        return i

    for j in range(k):
        for t in range(TREES):
            par = shape.parents[t].tolist()
            root = par.index(-1)
            for s in range(h):
                chunk = (j * TREES + t) * h + s
                b = []
                for n in range(n_nodes):
                    sw = node_switch(n)
                    pushed = [emit("A", t, s, int(p), sw, chunk, True, []) for p in peers[n]]
                    b.append(emit("B", t, s, sw, heads[n][s], chunk, False, pushed))
                ups: list[list[int]] = [[] for _ in range(n_nodes)]
                for n in reversed(order[t]):  # children before parents
                    deps = [b[n], *ups[n], b[par[n]]]  # the parent's B copies into its head first
                    ups[par[n]].append(emit("U", t, s, heads[n][s], heads[par[n]][s], chunk, True, deps))
                final = {root: [b[root], *ups[root]]}
                for n in order[t]:
                    final[n] = [emit("W", t, s, heads[par[n]][s], heads[n][s], chunk, False, final[par[n]])]
                for n in range(n_nodes):
                    sw = node_switch(n)
                    stored = emit("D", t, s, heads[n][s], sw, chunk, False, final[n])
                    for p in peers[n]:
                        if p != heads[n][s]:
                            emit("E", t, s, sw, int(p), chunk, False, [stored])
    return Plan(op=req.op, algorithm="nvls_tree", num_peers=req.num_peers, nbytes=req.nbytes,
                transfers=tuple(transfers), num_chunks=TREES * h * k)


def nvls_tree_fast(req: Request) -> Plan:
    """Fast fidelity: one flow per connection carrying its k pieces at the steady rate that lands it when the
    detailed plan ends (`nvls_tree_schedule`, with the request's protocol), below the plan's rate: alone the plan
    takes the detailed plan's time; next to other traffic every flow shares its links over the whole collective.
    (Without bytes a flow waits out the time.)"""
    check_nvls_tree(req)
    sched = nvls_tree_schedule(req)
    stages = _connections(req.group).stages
    src = np.concatenate([stages[s][0] for s in stages])
    dst = np.concatenate([stages[s][1] for s in stages])
    lat = np.concatenate([sched.latency_s[s] for s in stages])
    reduce = np.concatenate([np.full(len(stages[s][0]), s in ("A", "U")) for s in stages])
    return steady_plan(req.op, "nvls_tree", req.num_peers, req.nbytes, src, dst, reduce, lat,
                       sched.pieces * sched.piece_bytes, req.protocol.rate_factor, sched.time_s)


def detailed_size(req: Request) -> int:
    """Transfers of the detailed plan: per piece, tree and segment, A P, B N, U and W N - 1 each, D N, E P - N."""
    shape = nvls_tree_shape(req.group)
    p, n = req.num_peers, shape.num_nodes
    return nvls_tree_pieces(req) * TREES * shape.num_heads * (2 * p + 3 * n - 2)


def check_nvls_tree(req: Request) -> None:
    """Where NCCL runs NVLSTree (tuning.cc, ncclTopoTuneModel; src/transport/nvls.cc ncclNvlsInit): NVLS support
    (an NVSwitch with NVLink SHARP, 2+ GPUs of the communicator in a node), 2+ nodes ("Disable NVLS Tree on a single
    node"), 2+ NVLS channels (one head per NIC: "NVLS/NVLStree needs at least 2 channels"), and here the same NICs in
    use on every node (one tree per head index)."""
    check_nvls_nodes(req, "nvls_tree", joins="by a tree (NCCL disables it on one node)", per_head="tree",
                     others="ring, tree or auto")


def check_nvls_nodes(req: Request, name: str, *, joins: str, per_head: str, others: str,
                     fabric: Callable[[Request], None] | None = None) -> None:
    """What every multi-node NVLS plan needs (NVLS-Tree here, NVLS with SHARP in simdist.collectives.nvls_sharp):
    NVLS hardware, then ``fabric``'s own check of the network, 2+ nodes, 2+ GPUs of the group in every node, and the
    same 2+ NIC heads on every node; one error each naming ``name``, what it ``joins`` the nodes by, the ``per_head``
    plan each NIC head runs, and the ``others`` to use instead."""
    t = req.group.topology
    up = t.spec.scale_up
    if up is None or not up.nvls:
        have = "no NVSwitch" if up is None else f"an NVSwitch (NVLink {up.nvlink_generation}) without NVLS"
        raise SimdistError(
            f"{name} reduces inside each node with NVLink SHARP (H100/H200/B200/GB200); {t.spec.name} has {have}",
            field="--algorithm", fix=f"use --algorithm {others}")
    if fabric is not None:
        fabric(req)
    nodes = req.group.by_node()
    if len(nodes) < 2:
        raise SimdistError(f"{name} joins several nodes {joins}, but the group is inside one node",
                           field="--algorithm", fix="use --algorithm nvls or auto")
    if min(len(peers) for peers in nodes.values()) < 2:
        raise SimdistError(f"{name} needs 2+ GPUs of the group in every node (NVLS multicast is off for one GPU)",
                           field="--ranks", fix=f"use several GPUs per node, or --algorithm {others}")
    counts = sorted({len(h) for h in heads_by_node(req.group)})
    if len(counts) > 1:
        raise SimdistError(
            f"{name} runs one {per_head} per NIC head, but the group's nodes use {counts} NICs",
            field="--ranks", fix=f"use the same GPUs on every node, or --algorithm {others}")
    if counts[0] < 2:
        raise SimdistError(
            f"{name} needs 2+ NVLS channels, one head per NIC (tuning.cc), but the group's GPUs reach one NIC per "
            "node", field="--ranks", fix=f"use GPUs on 2+ NIC rails, or --algorithm {others}")


def _build(req: Request) -> Plan:
    check_nvls_tree(req)
    return nvls_tree_plan(req)


register(Algorithm(
    name="nvls_tree",
    ops=NVLS_TREE_OPS,
    build=_build,
    check=check_nvls_tree,
    build_fast=nvls_tree_fast,
    detailed_size=detailed_size,
    summary="NCCL's NVLSTree: NVLS inside each NVSwitch node, a double binary tree between the nodes' heads",
))
