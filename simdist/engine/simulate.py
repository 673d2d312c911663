"""Run plans on a topology: one collective alone, or several at once competing for links."""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from simdist.collectives.group import Group
from simdist.collectives.plan import Plan
from simdist.engine.executor import Trace, run_plan
from simdist.engine.fluid import fluid_applicable, run_fluid
from simdist.engine.links import SharedLinks


@dataclass(frozen=True, slots=True)
class CollectiveRun:
    time_s: float
    link_bytes: dict[int, float]
    trace: Trace


def simulate(runs: list[tuple[Plan, Group]]) -> list[CollectiveRun]:
    """Issue every (plan, group) at time 0 on one shared network; each one's completion time."""
    if not runs:
        return []
    if len(runs) == 1 and fluid_applicable(runs[0][0]):
        # Alone and without dependencies: the vectorised fluid solver, same model and times.
        time_s, link_bytes, trace = run_fluid(*runs[0])
        return [CollectiveRun(time_s, link_bytes, trace)]
    topology = runs[0][1].topology
    env = simpy.Environment()
    net = SharedLinks(env, lambda link: topology.link(link).effective_bandwidth_Bps)
    traces = [Trace() for _ in runs]
    procs = [env.process(run_plan(env, net, plan, group.path, trace))
             for (plan, group), trace in zip(runs, traces, strict=True)]
    env.run(until=simpy.AllOf(env, procs))
    loads = dict(net.load.bytes_by_link)
    return [CollectiveRun(p.value, loads, tr) for p, tr in zip(procs, traces, strict=True)]
