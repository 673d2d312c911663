"""Closed form of the PAT plans (simdist.collectives.pat).

Step d of PAT moves n_d = ceil((P - 2^d) / 2^(d+1)) blocks of S/P per peer in one message, steps one after
another: alone, with every message at its planned rate (its share of the busiest link of its route among
the step's messages, simdist.collectives.exchange_steps), the time is the recurrence
simdist.collectives.exchange_steps.steps_schedule evaluates, which on symmetric routes (every message of a
step with the same latency alpha and rate B) is

    sum over d of (alpha + n_d S / (P B)) = ceil(log2 P) alpha + (P - 1)/P S/B,

NCCL's model of PAT in src/graph/tuning.cc (ncclTopoTuneModel): a logarithmic latency
(log2i(nNodes) x interLat / 3.5, and a linear nRanks x 2.8 us) plus bytes over 0.75 x the bus bandwidth;
simdist.collectives.nccl_model prices those constants as the PAT protocol's start-up, per-step latency and
rate factor. Exact (engine = this form) alone on the network.
"""

from __future__ import annotations

from simdist.analytic.registry import register_closed_form
from simdist.collectives.exchange_steps import steps_time_s
from simdist.collectives.pat import step_arrays
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request


def pat_closed_form(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.pat builds for ``req``."""
    if req.num_peers < 2:
        return proto.base_latency_s
    return proto.base_latency_s + steps_time_s(req.group, proto, step_arrays(req.op, req.num_peers),
                                               req.nbytes / req.num_peers)


register_closed_form("pat", pat_closed_form)
