"""Pick the algorithm and protocol with the least predicted time, the way NCCL's tuner does.

NCCL evaluates its cost model for every (algorithm, protocol) it may use and takes the minimum
(src/graph/tuning.cc, src/enqueue.cc getAlgoInfo). simdist does the same with the closed forms of
simdist.analytic, priced with NCCL's protocol constants (simdist.collectives.nccl_model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simdist.analytic.registry import closed_form
from simdist.collectives.nccl_model import PROTOCOLS, PricedProtocol, nccl_algorithms, protocol_cost, supports
from simdist.collectives.registry import candidates
from simdist.collectives.request import Request


@dataclass(frozen=True, slots=True)
class Choice:
    algorithm: str
    protocol: str
    predicted_s: float
    priced: PricedProtocol


def priced_request(request: Request, priced: PricedProtocol) -> Request:
    """The request with its group's paths carrying the protocol's extra latency, and the protocol; the priced group
    kept in the group's memo (it depends on the extra latencies alone, and keeps its resolved paths for every size)."""
    key = ("priced group", tuple(sorted(priced.latency_by_class_s.items())))
    group = request.group.memo.get(key)
    if group is None:
        group = request.group.memo[key] = request.group.priced(priced.latency_by_class_s)
    return dataclasses.replace(request, group=group, protocol=priced.cost)


def evaluate(request: Request, algorithm: str, protocol: str) -> Choice:
    # what the protocol adds depends on the group, op and kernel, not the size: kept in the group's memo
    key = ("protocol cost", algorithm, protocol, request.op, request.kernel)
    priced = request.group.memo.get(key)
    if priced is None:
        priced = request.group.memo[key] = protocol_cost(algorithm, protocol, request.group, request.op,
                                                         request.kernel)
    t = closed_form(algorithm)(priced_request(request, priced), priced.cost)
    return Choice(algorithm, protocol, t, priced)


def rank_choices(request: Request, algorithms: list[str] | None = None,
                 protocols: tuple[str, ...] = PROTOCOLS) -> list[Choice]:
    """Every usable (algorithm, protocol) for ``request``, fastest first (closed forms).

    By default the candidates are those NCCL itself would choose among for the op
    (simdist.collectives.nccl_model.NCCL_RUNS), as its tuner does; where none of them can run on the
    group (or NCCL has no such op), every algorithm that can.
    """
    if algorithms is not None:
        names = algorithms
    else:
        # NCCL's own first (their checks alone): the others are checked only where none of NCCL's can run
        nccl = nccl_algorithms(request.op)
        names = ([a.name for a in candidates(request, nccl)] if nccl is not None else []) or [
            a.name for a in candidates(request)]
    out = [evaluate(request, a, p) for a in names for p in protocols if supports(a, p)]
    return sorted(out, key=lambda c: (c.predicted_s, c.algorithm, c.protocol))
