"""Direct (one-shot / pairwise) algorithms: every peer talks to its partners without forwarding.

NCCL runs all_to_all (and scatter, gather, send_recv) as a group of concurrent ncclSend/ncclRecv
calls, one per partner (NCCL docs, "Point-to-point communication": all-to-all = ncclGroupStart, a
send and a recv per peer, ncclGroupEnd). Here every such block is one transfer and they all start
together, each at its planned rate: its share of the busiest link of its route in proportion to its
bytes (simdist.collectives.pacing.proportional_rates), so the blocks on a link (a NIC shared by a rank's
inter-node blocks) drain together in the least time the link allows, and next to other traffic they
share links in the engine.
# Assumption: blocks of a step are paced to their proportional share, not left to take what other
# blocks leave: a step's last block lands when its busiest link drains, as with max-min sharing whenever
# a link's blocks start together and are held there (every even all_to_all); with uneven blocks the
# small ones land later than under max-min, the step's time is the same or shorter.

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
from typing import NamedTuple

import numpy as np

from simdist.collectives.direct_fast import all_pairs_fast
from simdist.collectives.group import Group
from simdist.collectives.ops import op_info
from simdist.collectives.pacing import proportional_rates
from simdist.collectives.plan import Plan, Transfer
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.errors import SimdistError

DIRECT_OPS = frozenset({"all_to_all", "scatter", "gather", "send_recv", "broadcast", "reduce", "all_gather",
                        "reduce_scatter", "all_reduce", "barrier"})

Matrix = tuple[tuple[float, ...], ...]

ALL_PAIRS_STEPS = {"all_to_all": 1, "all_gather": 1, "reduce_scatter": 1, "all_reduce": 2, "barrier": 2}
"""Ops whose steps move one equal block between every ordered pair of peers (all_to_all without a
matrix), and how many such steps (simdist.collectives.all_pairs prices them from the route structure)."""


class Step(NamedTuple):
    """Concurrent blocks of one direct step, as arrays: block i sends ``nbytes[i]`` of ``chunk[i]``
    from ``src[i]`` to ``dst[i]`` (``reduce``: combined into the receiver's copy)."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    chunk: np.ndarray
    reduce: bool = False

    def __len__(self) -> int:
        return len(self.src)


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


def _pairs(p: int) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair (i, j), i != j, row-major."""
    i, j = np.nonzero(~np.eye(p, dtype=bool))
    return i.astype(np.int64), j.astype(np.int64)


def direct_steps(op: str, num_peers: int, nbytes: float, root: int = 0, matrix: Matrix | None = None) -> list[Step]:
    """The direct algorithm as steps of concurrent blocks (shared by the plan and the closed form).

    Blocks of one step start together; a block of the second step (two-shot all_reduce) waits for
    the reductions into the segment it sends (see `direct_plan`).
    """
    p = num_peers
    if p < 2:
        return []
    others = np.array([j for j in range(p) if j != root], dtype=np.int64)
    at_root = np.full(p - 1, root, dtype=np.int64)
    if op == "all_to_all":
        i, j = _pairs(p)
        sizes = np.full(len(i), nbytes / p) if matrix is None else np.asarray(matrix, dtype=float)[i, j]
        return [Step(i, j, sizes, i * p + j)]
    if op == "scatter":
        return [Step(at_root, others, np.full(p - 1, nbytes / p), others)]
    if op == "gather":
        return [Step(others, at_root, np.full(p - 1, nbytes / p), others)]
    if op == "send_recv":
        return [Step(np.array([0]), np.array([1]), np.array([float(nbytes)]), np.array([0]))]
    if op == "broadcast":
        return [Step(at_root, others, np.full(p - 1, float(nbytes)), np.zeros(p - 1, dtype=np.int64))]
    if op == "reduce":
        return [Step(others, at_root, np.full(p - 1, float(nbytes)), np.zeros(p - 1, dtype=np.int64), True)]
    i, j = _pairs(p)
    block = np.full(len(i), nbytes / p)
    if op == "all_gather":
        return [Step(i, j, block, i)]
    if op == "reduce_scatter":
        return [Step(i, j, block, j, True)]
    if op in ("all_reduce", "barrier"):
        # two-shot: reduce-scatter, then every owner sends its reduced segment to all
        return [Step(i, j, block, j, True), Step(i, j, block, i)]
    raise ValueError(f"direct does not implement {op}")


def step_rates(group: Group | None, step: Step) -> np.ndarray:
    """Planned rates of a step's blocks: each its share of its busiest link in proportion to its bytes
    (simdist.collectives.pacing.proportional_rates), so a link's blocks drain together; inf without a
    group (a plan to verify, not to time)."""
    if group is None:
        return np.full(len(step), math.inf)
    return proportional_rates(group, step.src, step.dst, step.nbytes)


def _num_chunks(op: str, p: int) -> int:
    if op == "all_to_all":
        return p * p
    return 1 if op in ("broadcast", "reduce", "send_recv") else p


def direct_plan(op: str, num_peers: int, nbytes: float, root: int = 0, matrix: Matrix | None = None,
                group: Group | None = None) -> Plan:
    """Detailed plan: one transfer per block; a block depends on the blocks that wrote what it sends
    and on those that read or wrote what it overwrites (the verifier's race rules). With ``group`` the
    blocks carry their planned rates (`step_rates`)."""
    p = num_peers
    transfers: list[Transfer] = []
    writes: dict[tuple[int, int], list[int]] = {}  # (peer, chunk) -> transfers that wrote it
    reads: dict[tuple[int, int], list[int]] = {}  # (peer, chunk) -> transfers that read it
    for step in direct_steps(op, p, nbytes, root, matrix):
        new: list[tuple[int, int, int, int]] = []
        rates = step_rates(group, step).tolist()
        for src, dst, size, chunk, rate in zip(step.src.tolist(), step.dst.tolist(), step.nbytes.tolist(),
                                               step.chunk.tolist(), rates, strict=True):
            deps = {*writes.get((src, chunk), ()), *writes.get((dst, chunk), ()), *reads.get((dst, chunk), ())}
            transfers.append(Transfer(src, dst, size, chunk, step.reduce, tuple(sorted(deps)), max_rate_Bps=rate))
            new.append((src, dst, chunk, len(transfers) - 1))
        # recorded after the step: a step's blocks never read what another block of it writes, and
        # its concurrent writes into one buffer are all reductions (they commute)
        for src, dst, chunk, i in new:
            reads.setdefault((src, chunk), []).append(i)
            writes.setdefault((dst, chunk), []).append(i)
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
    return direct_plan(req.op, req.num_peers, req.nbytes, req.root, matrix, req.group)


def direct_fast(req: Request) -> Plan:
    """Fast fidelity: the all-pairs steps (all_to_all without a matrix, all_gather, reduce_scatter,
    all_reduce, barrier) as few paced flows (simdist.collectives.direct_fast); the others, whose
    detailed plans have a transfer per peer (rooted ops, send_recv) or per given block (uneven
    all_to_all), as their detailed plan; so are groups whose routes cross planes (PXN: `Group.crosses_planes`)."""
    steps = ALL_PAIRS_STEPS.get(req.op) if req.matrix is None else None
    if not steps or req.num_peers < 2 or req.group.crosses_planes():
        return _build(req)
    check_direct(req)
    return all_pairs_fast(req, steps, reduce_first=req.op in ("reduce_scatter", "all_reduce", "barrier"))


def detailed_size(req: Request) -> int:
    """Transfers of the detailed plan (one per block)."""
    p = req.num_peers
    steps = ALL_PAIRS_STEPS.get(req.op) if req.matrix is None else None
    if steps:
        return steps * p * (p - 1)
    return p * p if req.op == "all_to_all" else p


register(Algorithm(
    name="direct",
    ops=DIRECT_OPS,
    build=_build,
    check=check_direct,
    build_fast=direct_fast,
    detailed_size=detailed_size,
    summary="every peer sends straight to its partners, all at once (NCCL's all_to_all and p2p; "
            "two-shot all_reduce)",
))
