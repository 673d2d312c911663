"""Recursive halving and doubling (Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005, sec. 4.1).

all_reduce = reduce-scatter by recursive halving, then all-gather by recursive doubling. Over P' = 2^m
peers, halving step d = 1, 2, ..., P'/2 pairs peer i with i XOR d: each sends its partner the half of
what it holds that the partner keeps (S/2, S/4, ... bytes) and reduces the half it keeps, so after
log2(P') steps peer i owns block i; doubling replays the steps in reverse (d = P'/2, ..., 1), each
peer sending all it holds. Each direction moves S (P'-1) / P' bytes per peer in log2(P') messages.
# Assumption: the nearest partner first, with the largest message, as MPICH implements Rabenseifner's
# all_reduce (allreduce_intra_reduce_scatter_allgather, mask = 1, 2, ...): on node-major ranks the
# big messages stay inside a node and only the S/P'-sized ones cross the network. Peer i's half at
# step d is the blocks b = i (mod 2d), so blocks interleave in the buffer and peer i ends owning block i.

Other peer counts (Thakur et al. 2005 sec. 4.1): with r = P - P', the first 2r peers pair up
(2i, 2i+1); 2i sends its data to 2i+1 (reduced there) before the power-of-two part and receives
the result after it. Survivor (new rank) i is peer 2i+1 for i < r and peer i + r otherwise.

Blocks: all_reduce and barrier cut the buffer into P' blocks of S/P' (new rank i owns block i).
reduce_scatter and all_gather need one segment per peer (nccl-tests sizes, simdist.collectives.ops):
the buffer is cut into P segments of S/P, segment c belonging to peer c; new rank i < r stands for
segments 2i and 2i+1, the others for one, so its blocks are uneven when P is not a power of two.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from simdist.collectives.exchange_steps import Exchange, Step, steps_fast, steps_plan, steps_schedule
from simdist.collectives.group import Group
from simdist.collectives.plan import Plan
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request


def fold(num_peers: int) -> tuple[int, int, list[int]]:
    """(P', r, survivors): the largest power of two <= P, the P - P' folded pairs, and the peer
    standing for each new rank."""
    p2 = 1 << (num_peers.bit_length() - 1)
    r = num_peers - p2
    return p2, r, [2 * i + 1 for i in range(r)] + list(range(2 * r, num_peers))


def schedule(op: str, num_peers: int) -> tuple[list[list[Exchange]], int, tuple[int, ...]]:
    """(steps, num_chunks, chunk_segment) of ``op``; every step's exchanges run concurrently."""
    p = num_peers
    p2, r, peer_of = fold(p)
    segmented = op in ("reduce_scatter", "all_gather")
    if segmented:
        blocks = [[2 * i, 2 * i + 1] if i < r else [i + r] for i in range(p2)]
        num_chunks, segment = p, tuple(range(p))
    else:
        blocks = [[i] for i in range(p2)]
        num_chunks = p2
        segment = tuple(peer_of[i] for i in range(p2))

    def congruent(rank: int, modulus: int) -> tuple[int, ...]:
        """Chunks of the new ranks congruent to ``rank`` modulo ``modulus``."""
        return tuple(c for i in range(rank % modulus, p2, modulus) for c in blocks[i])

    everything = tuple(range(num_chunks))
    reduces = op != "all_gather"
    steps: list[list[Exchange]] = []
    if r and reduces:  # fold the extra peers in: 2i hands its whole buffer to 2i+1
        steps.append([Exchange(2 * i, 2 * i + 1, everything, True) for i in range(r)])
    if r and op == "all_gather":  # 2i hands its own segment to 2i+1
        steps.append([Exchange(2 * i, 2 * i + 1, (2 * i,), False) for i in range(r)])
    if op != "all_gather":
        # recursive halving, nearest partner first: before step d new rank i holds the blocks b = i
        # (mod d); it keeps b = i (mod 2d) and sends its partner i ^ d the rest, to be reduced there
        d = 1
        while d < p2:
            steps.append([Exchange(peer_of[i], peer_of[i ^ d], congruent(i ^ d, 2 * d), True) for i in range(p2)])
            d *= 2
    if op != "reduce_scatter":  # recursive doubling, the same steps in reverse: send all you hold
        d = p2 // 2
        while d >= 1:
            steps.append([Exchange(peer_of[i], peer_of[i ^ d], congruent(i, 2 * d), False) for i in range(p2)])
            d //= 2
    if r and op == "reduce_scatter":  # 2i+1 returns segment 2i, reduced
        steps.append([Exchange(2 * i + 1, 2 * i, (2 * i,), False) for i in range(r)])
    elif r:  # 2i+1 returns the result (all_gather: everything but 2i's own segment)
        steps.append([Exchange(2 * i + 1, 2 * i, tuple(c for c in everything if not (segmented and c == 2 * i)),
                               False) for i in range(r)])
    return steps, num_chunks, segment


@lru_cache(maxsize=256)
def step_arrays(op: str, num_peers: int) -> tuple[list[Step], int]:
    """(steps, num_chunks) of ``op`` as `schedule` lays them out, without listing chunks: the same
    exchanges, each with its chunk count (O(P log P) for any P); cached by op and size: shared lists and arrays,
    read only."""
    p = num_peers
    p2, r, _ = fold(p)
    peer_of = np.concatenate((2 * np.arange(r) + 1, np.arange(2 * r, p))).astype(np.int64)
    segmented = op in ("reduce_scatter", "all_gather")
    block = np.where(np.arange(p2) < r, 2, 1) if segmented else np.ones(p2, dtype=np.int64)
    num_chunks = p if segmented else p2
    ranks = np.arange(p2)

    def congruent(rank: np.ndarray, modulus: int) -> np.ndarray:
        """Chunks of the new ranks congruent to each ``rank`` modulo ``modulus``."""
        per_class = np.bincount(ranks % modulus, weights=block, minlength=modulus)
        return per_class[rank % modulus].astype(np.int64)

    folded = 2 * np.arange(r)
    steps: list[Step] = []
    if r and op != "all_gather":
        steps.append(Step(folded, folded + 1, np.full(r, num_chunks), True))
    if r and op == "all_gather":
        steps.append(Step(folded, folded + 1, np.ones(r, dtype=np.int64), False))
    if op != "all_gather":
        d = 1
        while d < p2:
            steps.append(Step(peer_of, peer_of[ranks ^ d], congruent(ranks ^ d, 2 * d), True))
            d *= 2
    if op != "reduce_scatter":
        d = p2 // 2
        while d >= 1:
            steps.append(Step(peer_of, peer_of[ranks ^ d], congruent(ranks, 2 * d), False))
            d //= 2
    if r and op == "reduce_scatter":
        steps.append(Step(folded + 1, folded, np.ones(r, dtype=np.int64), False))
    elif r:
        steps.append(Step(folded + 1, folded, np.full(r, num_chunks - (1 if segmented else 0)), False))
    return steps, num_chunks


def halving_doubling_schedule(req: Request) -> list[tuple[Step, np.ndarray, np.ndarray, np.ndarray]]:
    """Per step, uncontended: (the step, when each exchange starts, its latency, its transfers' rate)
    (simdist.collectives.exchange_steps.steps_schedule)."""
    steps, num_chunks = step_arrays(req.op, req.group.size)
    return steps_schedule(req.group, req.protocol, steps, req.nbytes / num_chunks)


def halving_doubling_fast(req: Request) -> Plan:
    """Fast fidelity: one flow per exchange (simdist.collectives.exchange_steps.steps_fast). O(P log P) flows."""
    steps, num_chunks = step_arrays(req.op, req.num_peers)
    return steps_fast(req, "halving_doubling", steps, req.nbytes / num_chunks)


def detailed_size(req: Request) -> int:
    """Transfers of the detailed plan (one per chunk of every exchange)."""
    return int(sum(step.chunks.sum() for step in step_arrays(req.op, req.num_peers)[0]))


def halving_doubling_plan(op: str, num_peers: int, nbytes: float, group: Group | None = None) -> Plan:
    """The plan of ``op`` (all_reduce, barrier, reduce_scatter, all_gather) over ``num_peers`` peers
    (simdist.collectives.exchange_steps.steps_plan: an exchange starts once both its peers have finished
    their previous step, as MPI's blocking sendrecv does). With ``group`` every transfer carries its
    planned rate."""
    steps, num_chunks, segment = schedule(op, num_peers)
    return steps_plan(op, "halving_doubling", num_peers, steps, num_chunks, segment, nbytes, group)


def _build(req: Request) -> Plan:
    return halving_doubling_plan(req.op, req.num_peers, req.nbytes, req.group)


register(Algorithm(
    name="halving_doubling",
    ops=frozenset({"all_reduce", "reduce_scatter", "all_gather", "barrier"}),
    build=_build,
    build_fast=halving_doubling_fast,
    detailed_size=detailed_size,
    summary="Rabenseifner: recursive-halving reduce-scatter, recursive-doubling all-gather (log2 P steps)",
))
