"""Closed forms of the direct plans (simdist.collectives.direct).

A direct step is a set of blocks that start together; each block moves at its planned rate, its share
of the busiest link of its route in proportion to its bytes (simdist.collectives.direct.step_rates), so
the blocks crossing a link drain together. A block then lands at

    (when its step starts for it) + route latency + protocol latency + wire time,

the wire time being its busiest link's wire bytes / effective capacity (wire bytes = payload / the
protocol's rate factor, as the engine puts them on the wire, simdist.engine.executor): the alpha-beta
(Hockney) model of concurrent messages, per link (a block on a lightly loaded link with a long latency
and a block on the busiest link with a short one each pay their own). Every op is one step except the
two-shot all_reduce (and barrier): reduce-scatter, then all-gather, where owner j's second-step blocks
start once every block reducing into its segment has landed. The time is the last landing plus the
protocol's start-up. E.g. on one NVSwitch node of P GPUs with port bandwidth B: all_to_all, all_gather,
reduce_scatter of S bytes: every port carries (P-1)/P S each way, alpha + (P-1) S / (P B); all_reduce
2 (alpha + (P-1) S / (P B)); broadcast and reduce: the root's port carries (P-1) S, alpha + (P-1) S / B.

Exact (engine = this form) whenever the planned rates hold, i.e. alone on the network except where the
second step's blocks meet first-step blocks still moving on a link (two-shot all_reduce with uneven
routes); the engine is never faster.
"""

from __future__ import annotations

import numpy as np

from simdist.analytic.registry import register_closed_form
from simdist.collectives.all_pairs import all_pairs, step_lands
from simdist.collectives.direct import ALL_PAIRS_STEPS, Matrix, direct_steps, step_rates, validate_matrix
from simdist.collectives.group import Group
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request

_SEND_LINE = "send_recv line"
"""The group-memo key (with the group's extra latencies) of a two-peer group's send: (route latency, rate) of its
one block."""


def direct_time_s(group: Group, op: str, nbytes: float, root: int = 0, matrix: Matrix | None = None,
                  per_transfer_latency_s: float = 0.0, rate_factor: float = 1.0, by_structure: bool = True) -> float:
    """When the direct plan's last block lands (without the protocol's start-up).

    Steps of equal blocks between every pair (`simdist.collectives.direct.ALL_PAIRS_STEPS`) are priced
    from the route structure (simdist.collectives.all_pairs) unless ``by_structure`` is False; the
    others, and those then, block by block over their routes (the same figures)."""
    if by_structure and op == "send_recv" and group.size == 2:
        # one block 0 -> 1: its route's latency and its busiest link's capacity (a lone block's proportional share
        # of each link is the whole link, whatever its bytes), read once per group; the loop below is the oracle
        # (a group's memo is shared by its protocols' priced copies, whose routes' latencies differ: keyed by them)
        key = (_SEND_LINE, tuple(sorted(group.extra_latency_by_class.items())))
        line = group.memo.get(key)
        if line is None:
            step = direct_steps(op, 2, 1.0)[0]
            line = group.memo[key] = (float(group.paths(step.src, step.dst).latency_s[0]),
                                      float(step_rates(group, step)[0]))
        latency_s, rate = line
        return latency_s + per_transfer_latency_s + (nbytes / rate_factor / rate if nbytes > 0 else 0.0)
    steps = ALL_PAIRS_STEPS.get(op) if matrix is None else None
    if by_structure and steps and group.size > 1 and not group.crosses_planes():
        pairs = all_pairs(group)
        block = nbytes / group.size
        if steps == 1:
            return step_lands(pairs, group, block, None, per_transfer_latency_s, rate_factor)[0]
        _, ready = step_lands(pairs, group, block, np.zeros(group.size), per_transfer_latency_s, rate_factor)
        return step_lands(pairs, group, block, ready, per_transfer_latency_s, rate_factor)[0]
    ready = np.zeros(group.size)  # when each peer's segment is complete (the second step's start)
    end = 0.0
    for k, step in enumerate(direct_steps(op, group.size, nbytes, root, matrix)):
        routes = group.paths(step.src, step.dst)  # vectorised (simdist.hardware.batch)
        with np.errstate(invalid="ignore"):
            wire_s = np.where(step.nbytes > 0, step.nbytes / rate_factor / step_rates(group, step), 0.0)
        start = ready[step.src] if k else 0.0
        lands = start + routes.latency_s + per_transfer_latency_s + wire_s
        end = max(end, float(lands.max()))
        ready = np.zeros(group.size)
        np.maximum.at(ready, step.dst, lands)
    return end


def direct_closed_form(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.direct builds for ``req``."""
    matrix = validate_matrix(req.matrix, req.num_peers) if req.op == "all_to_all" and req.matrix else None
    return proto.base_latency_s + direct_time_s(req.group, req.op, req.nbytes, req.root, matrix,
                                                proto.per_transfer_latency_s, proto.rate_factor)


register_closed_form("direct", direct_closed_form)
