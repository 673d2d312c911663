"""Direct (one-shot / pairwise) algorithms: every peer talks to its partners without forwarding.

NCCL runs all_to_all (and scatter, gather, send_recv) as a group of concurrent ncclSend/ncclRecv
calls, one per partner (NCCL docs, "Point-to-point communication": all-to-all = ncclGroupStart, a
send and a recv per peer, ncclGroupEnd). Here every such block is one transfer and they all start
together, sharing links max-min fairly in the engine, so contention (a NIC shared by a rank's
inter-node blocks) shows up as it happens.

Sizes follow nccl-tests (simdist.collectives.ops): all_to_all ``nbytes`` = what each rank sends,
``nbytes / P`` per destination, the self block staying local; uneven all_to_all takes
``matrix[i][j]`` = bytes peer i sends to peer j (the diagonal stays local).

Reductions. A reduce transfer adds its block into the receiver's copy; several reductions into one
buffer may run at once (the verifier lets reductions commute, as NCCL receives each peer's block
into its own buffer and combines them), so reduce and reduce_scatter are one step too. all_reduce is
not literally one-shot: a peer would send its buffer while other peers' contributions are being added
into it (a read racing with writes in the verifier, which has one buffer per peer, no separate input
and output), so it is the "two-shot" form: reduce_scatter-direct, then all_gather-direct (each owner
sends its reduced segment to every peer), two steps. # Assumption: the one-shot's single latency at
small sizes is therefore not modelled; two-shot pays two.
"""

from __future__ import annotations

import math
from itertools import repeat
from typing import NamedTuple

import numpy as np

from simdist.collectives.ops import op_info
from simdist.collectives.plan import Plan, Transfer
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.errors import SimdistError
from simdist.hardware import batch

DIRECT_OPS = frozenset({"all_to_all", "scatter", "gather", "send_recv", "broadcast", "reduce", "all_gather",
                        "reduce_scatter", "all_reduce", "barrier"})

Matrix = tuple[tuple[float, ...], ...]


class Move(NamedTuple):
    """One block of a direct step: ``src`` sends ``nbytes`` of ``chunk`` to ``dst``."""

    src: int
    dst: int
    nbytes: float
    chunk: int
    reduce: bool = False


def validate_matrix(matrix, num_peers: int) -> Matrix:
    """The all_to_all split matrix as floats; SimdistError unless it is P x P, finite and >= 0."""
    fix = (f"give {num_peers} rows of {num_peers} non-negative byte counts "
           f"(row i = bytes rank i sends to each rank; the diagonal stays local)")
    try:
        rows = [list(row) for row in matrix]
    except TypeError:
        raise SimdistError("the all_to_all matrix must be a list of rows", field="--matrix", fix=fix) from None
    if len(rows) != num_peers or any(len(row) != num_peers for row in rows):
        shape = f"{len(rows)} rows of lengths {sorted({len(r) for r in rows})}"
        raise SimdistError(f"all_to_all matrix has {shape} but the group has {num_peers} ranks",
                           field="--matrix", fix=fix)
    out: list[tuple[float, ...]] = []
    for i, row in enumerate(rows):
        try:
            values = tuple(float(v) for v in row)
        except (TypeError, ValueError):
            raise SimdistError(f"all_to_all matrix row {i} holds a non-number", field="--matrix", fix=fix) from None
        bad = [j for j, v in enumerate(values) if not (math.isfinite(v) and v >= 0.0)]
        if bad:
            raise SimdistError(f"all_to_all matrix entry [{i}][{bad[0]}] = {values[bad[0]]} is not a finite "
                               f"non-negative byte count", field="--matrix", fix=fix)
        out.append(values)
    return tuple(out)


def direct_steps(op: str, num_peers: int, nbytes: float, root: int = 0,
                 matrix: Matrix | None = None) -> list[list[Move]]:
    """The direct algorithm as steps of concurrent blocks (shared by the plan and the closed form).

    Blocks of one step start together; a block of the second step (two-shot all_reduce) waits for
    the reductions into the segment it sends (see `direct_plan`).
    """
    p = num_peers
    if p < 2:
        return []
    if op == "all_to_all":
        if matrix is None:
            return [[Move(i, j, nbytes / p, i * p + j) for i in range(p) for j in range(p) if i != j]]
        return [[Move(i, j, matrix[i][j], i * p + j) for i in range(p) for j in range(p) if i != j]]
    if op == "scatter":
        return [[Move(root, j, nbytes / p, j) for j in range(p) if j != root]]
    if op == "gather":
        return [[Move(i, root, nbytes / p, i) for i in range(p) if i != root]]
    if op == "send_recv":
        return [[Move(0, 1, nbytes, 0)]]
    if op == "broadcast":
        return [[Move(root, j, nbytes, 0) for j in range(p) if j != root]]
    if op == "reduce":
        return [[Move(i, root, nbytes, 0, True) for i in range(p) if i != root]]
    if op == "all_gather":
        return [[Move(i, j, nbytes / p, i) for i in range(p) for j in range(p) if i != j]]
    if op == "reduce_scatter":
        return [[Move(i, j, nbytes / p, j, True) for i in range(p) for j in range(p) if i != j]]
    if op in ("all_reduce", "barrier"):
        # two-shot: reduce-scatter, then every owner sends its reduced segment to all
        return [*direct_steps("reduce_scatter", p, nbytes), direct_steps("all_gather", p, nbytes)[0]]
    raise ValueError(f"direct does not implement {op}")


def _num_chunks(op: str, p: int) -> int:
    if op == "all_to_all":
        return p * p
    return 1 if op in ("broadcast", "reduce", "send_recv") else p


def direct_plan(op: str, num_peers: int, nbytes: float, root: int = 0, matrix: Matrix | None = None) -> Plan:
    """Detailed plan: one transfer per block; a block depends on the blocks that wrote what it sends
    and on those that read or wrote what it overwrites (the verifier's race rules)."""
    p = num_peers
    transfers: list[Transfer] = []
    writes: dict[tuple[int, int], list[int]] = {}  # (peer, chunk) -> transfers that wrote it
    reads: dict[tuple[int, int], list[int]] = {}  # (peer, chunk) -> transfers that read it
    for step in direct_steps(op, p, nbytes, root, matrix):
        new: list[tuple[Move, int]] = []
        for mv in step:
            src_key, dst_key = (mv.src, mv.chunk), (mv.dst, mv.chunk)
            deps = {*writes.get(src_key, ()), *writes.get(dst_key, ()), *reads.get(dst_key, ())}
            transfers.append(Transfer(mv.src, mv.dst, mv.nbytes, mv.chunk, mv.reduce, tuple(sorted(deps))))
            new.append((mv, len(transfers) - 1))
        # recorded after the step: a step's blocks never read what another block of it writes, and
        # its concurrent writes into one buffer are all reductions (they commute)
        for mv, i in new:
            reads.setdefault((mv.src, mv.chunk), []).append(i)
            writes.setdefault((mv.dst, mv.chunk), []).append(i)
    if matrix is not None:
        # Assumption: the plan's size is the mean bytes a rank sends, self block included (nccl-tests)
        nbytes = sum(map(sum, matrix)) / p
    chunks = _num_chunks(op, p)
    segment = tuple(range(p)) if chunks == p else ()
    return Plan(op=op, algorithm="direct", num_peers=p, nbytes=nbytes, transfers=tuple(transfers),
                num_chunks=chunks, root=root, chunk_segment=segment)


def check_direct(req: Request) -> None:
    """Refuse requests the direct plans cannot express (bad root, bad matrix)."""
    p = req.num_peers
    if req.op == "send_recv":
        if p < 2:
            raise SimdistError("send_recv needs 2 ranks or more", field="--ranks", fix="give --ranks 2")
        if req.root != 0:
            raise SimdistError(f"send_recv goes from rank 0 to rank 1; got --root {req.root}", field="--root",
                               fix="drop --root (send_recv is rank 0 -> rank 1)")
    elif op_info(req.op).rooted and not 0 <= req.root < p:
        raise SimdistError(f"root {req.root} is outside the group of {p} ranks", field="--root",
                           fix=f"use --root 0..{p - 1}")
    if req.op == "all_to_all" and req.matrix is not None:
        validate_matrix(req.matrix, p)


def _build(req: Request) -> Plan:
    check_direct(req)
    matrix = validate_matrix(req.matrix, req.num_peers) if req.op == "all_to_all" and req.matrix else None
    return direct_plan(req.op, req.num_peers, req.nbytes, req.root, matrix)


def direct_fast(req: Request) -> Plan:
    """Fast fidelity of the even all_to_all: one flow per (source peer, destination node).

    With G peers on every node, the a-th peer of node n sends its G blocks for node m as one flow of
    G S/P bytes to the ((a + k) mod G)-th peer of m; blocks between peers of one node stay one flow
    each. The shift k of each node pair is chosen greedily (node pairs taken by distance m - n, in
    small batches) so that the bytes on every leaf -> spine and spine -> leaf link track what the
    detailed plan puts there, computed exactly from the per-pair routes (`batch.fabric_hops`): a
    flow follows the route of one of the blocks it stands for, and picking which one steers it.
    # Assumption: aggregated blocks share one route. Preserved exactly (every node holding G peers):
    # bytes on every link inside nodes and on every NIC up- and down-link (each peer sends N-1
    # flows and, the shift being a bijection, receives one from every other node) and route
    # latencies. Approximated: bytes per leaf-spine link, within one or two flows (G blocks each) of
    # the detailed plan's, so the busiest one comes out a little busier (simulated time against the
    # detailed plan: +1.4 % at 512 ranks, +8.5 % at 256, +11 % at 128, and +1.9 % at 1,024 ranks by
    # the busiest link's drain; below 128 ranks a link carries fewer blocks than a flow, and
    # ``--fidelity auto`` runs the detailed plan up to 64 ranks), and sharing among N-1 flows per NIC
    # instead of (N-1) G.
    Other ops, uneven matrices, single nodes and groups whose nodes hold different numbers of peers
    get the detailed plan.
    """
    nodes = list(req.group.by_node().values())
    g = len(nodes[0])
    if req.op != "all_to_all" or req.matrix is not None or len(nodes) < 2 or any(len(v) != g for v in nodes):
        return _build(req)
    check_direct(req)
    p, num_nodes = req.num_peers, len(nodes)
    block = req.nbytes / p
    flow = g * block
    peers = np.array(nodes, dtype=np.int64)  # [node, local position] -> peer
    ranks = np.asarray(req.group.ranks, dtype=np.int64)
    n_idx, m_idx = np.nonzero(~np.eye(num_nodes, dtype=bool))  # node pairs n -> m
    a = np.arange(g)
    # candidate flow (pair, a, k): peer (n, a) -> peer (m, (a + k) mod G), i.e. every inter-node block
    cand_src = np.broadcast_to(peers[n_idx][:, :, None], (len(n_idx), g, g))
    cand_dst = peers[m_idx][:, (a[:, None] + a[None, :]) % g]
    up, down = (x.reshape(len(n_idx), g, g) for x in
                batch.fabric_hops(req.group.topology, ranks[cand_src.reshape(-1)], ranks[cand_dst.reshape(-1)]))
    hops = np.concatenate((up[up >= 0], down[down >= 0]))
    top = int(hops.max()) + 1 if hops.size else 1
    target = np.bincount(hops, minlength=top) * block  # the detailed plan's bytes per fabric link
    placed = np.zeros(top)
    shift = np.zeros(len(n_idx), dtype=np.int64)
    distance = (m_idx - n_idx) % num_nodes
    batches = min(4, num_nodes)
    for d in range(1, num_nodes):
        for r in range(batches):
            idx = np.flatnonzero((distance == d) & (n_idx % batches == r))
            if not idx.size:
                continue
            u, v = up[idx], down[idx]
            # change of sum((placed - target)^2) if the flows of shift k land: flow (2 (placed - target) + flow)
            score = sum(np.where(x >= 0, 2 * (placed[np.maximum(x, 0)] - target[np.maximum(x, 0)]) + flow, 0.0)
                        .sum(axis=1) for x in (u, v))
            k = score.argmin(axis=1)
            shift[idx] = k
            rows = np.arange(len(idx))
            chosen = np.concatenate((u[rows, :, k].reshape(-1), v[rows, :, k].reshape(-1)))
            placed += np.bincount(chosen[chosen >= 0], minlength=top) * flow
    src = peers[n_idx][:, a]
    dst = peers[m_idx[:, None], (a[None, :] + shift[:, None]) % g]
    # intra-node: every ordered pair of one node's peers
    i_idx, j_idx = np.nonzero(~np.eye(g, dtype=bool))
    src = np.concatenate((src.reshape(-1), peers[:, i_idx].reshape(-1)))
    dst = np.concatenate((dst.reshape(-1), peers[:, j_idx].reshape(-1)))
    inter = num_nodes * (num_nodes - 1) * g
    nbytes = [flow] * inter + [block] * (len(src) - inter)
    n = len(src)
    transfers = tuple(map(Transfer, src.tolist(), dst.tolist(), nbytes, repeat(-1, n)))
    return Plan(op="all_to_all", algorithm="direct", num_peers=p, nbytes=req.nbytes, transfers=transfers,
                num_chunks=0, verifiable=False)


register(Algorithm(
    name="direct",
    ops=DIRECT_OPS,
    build=_build,
    check=check_direct,
    build_fast=direct_fast,
    summary="every peer sends straight to its partners, all at once (NCCL's all_to_all and p2p; "
            "two-shot all_reduce)",
))
