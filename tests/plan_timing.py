"""What a plan's run says about contention: did every transfer move at its planned rate?

A collective alone on the network is *uncontended* when every transfer of its plan moves at its planned
rate (`Transfer.max_rate_Bps`, or its route's bottleneck where it has none) for its whole time on the
wire. Plans give their transfers rates whose sums fit every link among the transfers that may share it
(simdist.collectives.pacing), so alone this holds except where a plan's own transfers of different
steps or phases meet on a link (peers that drift apart: folded halving-doubling pairs, two-shot direct
blocks, hierarchical phases on shared PCIe links): then the run is contended by its own flows, and the
closed form, which prices every transfer at its planned rate, is a strict lower bound.
"""

from __future__ import annotations

import dataclasses

from simdist.collectives.group import Group
from simdist.collectives.plan import Plan
from simdist.collectives.protocols import SIMPLE
from simdist.collectives.registry import algorithm_for
from simdist.collectives.request import Request
from simdist.engine.simulate import simulate


def wire_intervals(plan: Plan, group: Group, run) -> list[tuple[float, float]]:
    """(when its bytes joined the wire, when they landed) per transfer, from the run's trace: after its
    latency (route + protocol + extra), and not before the previous transfer on its connection landed."""
    starts, ends = run.trace.starts, run.trace.ends
    out = []
    for i, t in enumerate(plan.transfers):
        begin = starts[i] + group.path(t.src, t.dst).latency_s + plan.per_transfer_latency_s + t.extra_latency_s
        if t.after >= 0:
            begin = max(begin, ends[t.after])
        out.append((begin, ends[i]))
    return out


def uncontended(plan: Plan, group: Group, run, rel: float = 1e-9) -> bool:
    """Whether every transfer of ``plan`` moved at its planned rate throughout (see the module docstring)."""
    for t, (begin, end) in zip(plan.transfers, wire_intervals(plan, group, run), strict=True):
        rate = min(t.max_rate_Bps, group.path(t.src, t.dst).effective_bandwidth_Bps)
        planned = t.nbytes / plan.rate_factor / rate if t.nbytes > 0 else 0.0
        if end - begin > planned * (1 + rel) + 1e-15 * max(1.0, end):
            return False
    return True


def engine_and_fast(algorithm: str, req: Request, proto=SIMPLE) -> tuple[float, float]:
    """(the engine's time of ``algorithm``'s detailed plan, of its fast plan) for ``req`` under protocol ``proto``;
    the detailed run is asserted uncontended, so it is comparable with the closed form."""
    algo = algorithm_for(algorithm, req)
    plan = dataclasses.replace(algo.build(req), base_latency_s=proto.base_latency_s, rate_factor=proto.rate_factor)
    run = simulate([(plan, req.group)])[0]
    assert uncontended(plan, req.group, run)
    fast = dataclasses.replace(algo.build_fast(req), base_latency_s=proto.base_latency_s,
                               rate_factor=proto.rate_factor)
    return run.time_s, simulate([(fast, req.group)])[0].time_s
