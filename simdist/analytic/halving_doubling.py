"""Closed form of recursive halving / doubling (the plans of simdist.collectives.halving_doubling).

Textbook form (Thakur, Rabenseifner & Gropp 2005, sec. 4.1, Rabenseifner's all_reduce): with
P' = 2^m peers, 2 log2(P') alpha + 2 (P'-1)/P' S/B, i.e. the sum over the log2(P') halving steps of
(alpha + S d / (P' B)) for d = P'/2 .. 1, and the same for doubling; P not a power of two adds the
fold and unfold steps, alpha + S/B each (the whole buffer between the paired peers).

Here each step's message of n bytes from a to b takes its route's latency (plus the protocol's) and
n at its planned rate, its share of the busiest link it crosses in that step in proportion to its bytes
(simdist.collectives.exchange_steps.exchange_rates): the step's bytes on that link over its capacity,
exactly alpha + n/B when no two messages of a step share a link, as on an NVSwitch. A message starts
when both its peers have finished their previous step (the plan's dependencies), so the time is that
recurrence's last finish: with equal messages in every step it is the sum over steps; with the uneven
blocks of reduce_scatter/all_gather on 2^m + r peers a peer with a light step may wait less.

Exact (engine = this form) whenever the planned rates hold: alone on the network, except where peers
that drift apart (folded pairs, routes of different latencies) run messages of different steps on one
link at once; the engine is never faster (what it was before the planned rates: docs/validation-history.md).
"""

from __future__ import annotations

from simdist.analytic.registry import register_closed_form
from simdist.collectives.exchange_steps import steps_time_s
from simdist.collectives.group import Group
from simdist.collectives.halving_doubling import step_arrays
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request


def halving_doubling_time_s(group: Group, op: str, nbytes: float, per_transfer_latency_s: float = 0.0,
                            rate_factor: float = 1.0) -> float:
    """Time of the halving/doubling plan of ``op`` over ``group`` (without the protocol's start-up)."""
    proto = ProtocolCost(per_transfer_latency_s=per_transfer_latency_s, rate_factor=rate_factor)
    steps, num_chunks = step_arrays(op, group.size)
    return steps_time_s(group, proto, steps, nbytes / num_chunks)


def halving_doubling_closed_form(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.halving_doubling builds for ``req``."""
    return proto.base_latency_s + halving_doubling_time_s(req.group, req.op, req.nbytes,
                                                          proto.per_transfer_latency_s, proto.rate_factor)


register_closed_form("halving_doubling", halving_doubling_closed_form)
