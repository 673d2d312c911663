"""Routing imbalance as an uneven all_to_all: the split matrix of an expert-parallel token exchange.

A mixture-of-experts layer's dispatch all_to_all sends each rank's routed tokens to the ranks holding their
experts (Lepikhin et al. 2020, GShard, sec 2.2; Megatron-Core megatron/core/transformer/moe/token_dispatcher.py,
MoEAlltoAllTokenDispatcher: an ``all_to_all`` with per-peer ``input_splits`` / ``output_splits``). Every rank
routes the same number of tokens (it sends its nccl-tests ``nbytes``), but when routing is unbalanced one rank's
experts receive more than the mean: with imbalance x (busiest rank's tokens / the mean) that rank receives
x * nbytes, the others the rest in equal parts, so the total (P * nbytes) is kept. The combine all_to_all is the
transpose (the busiest rank sends its experts' outputs back), and so is each one's backward (its adjoint).
"""

from __future__ import annotations

from simdist.collectives.direct import Matrix
from simdist.errors import SimdistError

__all__ = ["BUSIEST_PEER", "imbalanced_matrix"]

BUSIEST_PEER = 0
"""The peer of the group that receives the extra tokens.
# Assumption: the busiest expert-parallel rank is the group's first peer; on groups whose peers are placed alike
# (the bundled topologies: every GPU of a node and every node built the same) which one it is does not change the
# time."""


def imbalanced_matrix(num_peers: int, nbytes: float, imbalance: float, *, transpose: bool = False) -> Matrix:
    """``matrix[i][j]`` = bytes peer i sends to peer j when every peer sends ``nbytes`` (its balanced send buffer,
    ``nbytes / P`` per peer, self block included) and peer `BUSIEST_PEER` receives ``imbalance`` x the mean:
    column b holds x * nbytes / P per row, every other column (P - x) / (P - 1) * nbytes / P, so each row sums to
    ``nbytes`` and column b to x * nbytes. ``transpose``: the busiest peer sends instead (combine, or the adjoint
    of dispatch). imbalance 1 is the even all_to_all; it cannot exceed P (every token on one peer)."""
    p = num_peers
    if not 1.0 <= imbalance <= p:
        raise SimdistError(f"all_to_all imbalance {imbalance} outside 1..{p} (the group's size)",
                           field="training.moe_imbalance", fix=f"use a value between 1 and ep = {p}")
    block = nbytes / p
    hot = imbalance * block
    cold = (p - imbalance) / (p - 1) * block if p > 1 else block
    rows = tuple(tuple(hot if j == BUSIEST_PEER else cold for j in range(p)) for _ in range(p))
    if transpose:
        rows = tuple(tuple(rows[j][i] for j in range(p)) for i in range(p))
    return rows
