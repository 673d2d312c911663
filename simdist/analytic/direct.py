"""Closed forms of the direct plans (simdist.collectives.direct).

A direct step is a set of blocks that start together and share links max-min fairly. When every
block on the most loaded link is held there (every op on one NVSwitch node: the ports are the only
shared links and each step loads them symmetrically, or, for rooted ops, the root's port carries
all blocks), the step takes
    max over blocks of (route latency + protocol latency) + drain
with drain = the most loaded link's wire bytes / effective capacity (simdist.analytic.loads), wire
bytes = payload / the protocol's rate factor, as the engine puts them on the wire
(simdist.engine.executor): the alpha-beta (Hockney) model of concurrent flows. Every op is one step
except the two-shot all_reduce (and barrier): reduce-scatter then all-gather, whose second step
waits for the first, so the time is the sum over steps, plus the protocol's start-up. E.g. on one
NVSwitch node of P GPUs with port bandwidth B: all_to_all, all_gather, reduce_scatter of S bytes:
every port carries (P-1)/P S each way, alpha + (P-1) S / (P B); all_reduce 2 (alpha + (P-1) S / (P B));
broadcast and reduce: the root's port carries (P-1) S, alpha + (P-1) S / B.

Approximate where blocks of one step have different latencies (intra- and inter-node routes) or are
held at different links (uneven matrices, PCIe trees): then the engine can finish sooner or later.
"""

from __future__ import annotations

import numpy as np

from simdist.analytic.loads import batch_drain_time_s
from simdist.analytic.registry import register_closed_form
from simdist.collectives.direct import Matrix, Move, direct_steps, validate_matrix
from simdist.collectives.group import Group
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request


def step_time_s(group: Group, step: list[Move], per_transfer_latency_s: float = 0.0,
                rate_factor: float = 1.0) -> float:
    """One step of concurrent blocks (see the module docstring)."""
    if not step:
        return 0.0
    src = np.fromiter((mv.src for mv in step), dtype=np.int64, count=len(step))
    dst = np.fromiter((mv.dst for mv in step), dtype=np.int64, count=len(step))
    nbytes = np.fromiter((mv.nbytes for mv in step), dtype=float, count=len(step))
    routes = group.paths(src, dst)  # vectorised (simdist.hardware.batch)
    latency = float(routes.latency_s.max()) + per_transfer_latency_s
    return latency + batch_drain_time_s(group, routes, nbytes, rate_factor)


def direct_time_s(group: Group, op: str, nbytes: float, root: int = 0, matrix: Matrix | None = None,
                  per_transfer_latency_s: float = 0.0, rate_factor: float = 1.0) -> float:
    """Sum over the direct plan's steps."""
    steps = direct_steps(op, group.size, nbytes, root, matrix)
    return sum(step_time_s(group, step, per_transfer_latency_s, rate_factor) for step in steps)


def direct_closed_form(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.direct builds for ``req``."""
    matrix = validate_matrix(req.matrix, req.num_peers) if req.op == "all_to_all" and req.matrix else None
    return proto.base_latency_s + direct_time_s(req.group, req.op, req.nbytes, req.root, matrix,
                                                proto.per_transfer_latency_s, proto.rate_factor)


register_closed_form("direct", direct_closed_form)
