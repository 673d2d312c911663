"""The engine's answer for one training step: its op graph priced and simulated, a long steady state fast-forwarded.

`engine_step` builds and prices the step's op graph (simdist.plan.step, simdist.predict.price), times it without
SimPy up to the first instant two transfers meet on a shared link (simdist.engine.contention) and with SimPy from
there (simdist.engine.graph), and, where the step repeats a steady state, simulates three micro-batch counts a
period apart and extends them (simdist.plan.fastforward). The two smaller samples are simulated in a child process
beside the largest where the machine has a CPU to spare (simdist.predict.beside: the middle one on its own, the
smallest resumed from it), else after it, resumed from the state it recorded (simdist.engine.prefix); a sample slid
on by a cycle (samples not yet collinear) resumes from the state the previous largest recorded (`Recorded`).
`simdist.predict.step.predict_step` turns its observables into the JSON.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from simdist.analytic.step import CommPricer, analytic_observables, fast_forward_plan
from simdist.collector import collector_paused
from simdist.engine.contention import Alone, departs, engine_alone, first_divergence
from simdist.engine.graph import GraphTrace, run_graph
from simdist.engine.prefix import Prefix, resumed_trace, shared_prefix
from simdist.engine.uncontended import uncontended, uncontended_pair
from simdist.hardware import batch
from simdist.hardware.topology import Topology
from simdist.plan.fastforward import JITTER_SAMPLES, SAVING, FastForward, extrapolate, extrapolate_mean
from simdist.plan.step import StepConfig, StepPlan, build_step
from simdist.predict.beside import Beside, can_fork
from simdist.predict.faults import scaled_capacities
from simdist.predict.link_loads import capacity_of
from simdist.predict.price import Adjust, PricedComm, price_graph
from simdist.report.step_metrics import observables

__all__ = ["FAST_FORWARD_MIN_OPS", "EngineStep", "alone_and_cut", "capacities", "collector_paused",
           "engine_step", "engine_trace", "first_replica", "priced_plan"]

FAST_FORWARD_MIN_OPS = 20_000
"""A step whose whole op graph would hold fewer ops than this is simulated whole (a fraction of a second)."""


def priced_plan(cfg: StepConfig, topology: Topology, adjust: Adjust | None, full: bool,
                 num_microbatches: int | None, known: dict[tuple, PricedComm] | None = None
                 ) -> tuple[StepPlan, dict[tuple, PricedComm]]:
    """The step's op graph on ``num_microbatches`` (None: all), priced; ``known``: the prices of another sample of
    the same step, reused (simdist.predict.price.price_graph)."""
    with collector_paused():
        plan = build_step(cfg, full=full, num_microbatches=num_microbatches)
        priced = price_graph(plan.graph, topology, mesh=cfg.mesh, reduced_axes=plan.reduced_axes, adjust=adjust,
                             known=known)
    return plan, priced


def capacities(topology: Topology, degraded: dict[int, float] | None) -> tuple[Any, Any]:
    """(capacity of one link, capacities of many) for the engine; ``degraded``: link id -> fraction of its
    capacity left (scenario ``faults.degraded_links``)."""
    if degraded:
        return scaled_capacities(topology, degraded)
    return capacity_of(topology), lambda links: batch.link_capacities(topology, links)


def alone_and_cut(plan: StepPlan, topology: Topology, degraded: dict[int, float] | None, cut: bool = True
                   ) -> tuple[GraphTrace, GraphTrace, float, Alone]:
    """The op graph's uncontended trace (every op its priced duration), its timeline with the engine's times of
    each op alone (simdist.engine.contention.alone_durations: the same trace where they are the priced ones), the
    time up to which that is the engine's timeline (simdist.engine.contention.first_divergence: inf where no two
    transfers meet on a shared link; NaN if not ``cut``: not looked for), and what the engine does with each op
    alone."""
    one, many = capacities(topology, degraded)
    with collector_paused():
        engine = engine_alone(plan.graph, one, many)
        durations: list[float] | None = engine.durations
        if departs(plan.graph.ops, engine.durations).any():
            alone, timeline = uncontended_pair(plan.graph, engine.durations)
        else:
            alone = uncontended(plan.graph)
            timeline, durations = alone, None
        if not cut:
            return alone, timeline, math.nan, engine
        return alone, timeline, first_divergence(plan.graph, timeline, one, many, durations, engine), engine


def engine_trace(plan: StepPlan, topology: Topology, degraded: dict[int, float] | None,
                  alone: tuple[GraphTrace, GraphTrace, float, Alone]) -> GraphTrace:
    """The engine's trace, simulated from the first divergence on (`alone_and_cut`: before it the engine's timeline
    is the alone one, so only what follows costs SimPy events; none where no transfers meet)."""
    one, many = capacities(topology, degraded)
    _, timeline, cut, engine = alone
    with collector_paused():
        return run_graph(plan.graph, capacity_of=one, capacities=many, checked=True, resume=(timeline, cut),
                         private=engine.private)


@dataclass(slots=True)
class EngineStep:
    plan: StepPlan
    priced: dict[tuple, PricedComm]
    trace: GraphTrace
    observables: dict[str, float]
    uncontended_step_s: float
    micro_batches: str
    """"all", or how the steady state was fast-forwarded."""
    simulated_microbatches: int
    fast_forward: tuple[int, int, int, int] | None = None
    """The closed form's fast-forward plan for the engine (simdist.analytic.step.fast_forward_plan), if looked for."""
    engine_from_s: float = math.inf
    """Up to this time the shown timeline is each op's engine time alone, no two transfers on a shared link at once
    (simdist.engine.contention.first_divergence); SimPy simulated it from there (inf: nowhere)."""


def first_replica(plan: StepPlan) -> list[int]:
    d0 = min(d for _, d in plan.stage_ranks)
    return sorted(r for (_, d), r in plan.stage_ranks.items() if d == d0)


RECORD_POINTS = 128
"""States a sample's run records (`_grid`), evenly spaced from where SimPy starts it to its uncontended end."""


def _grid(start: float, end: float) -> list[float]:
    """Times after ``start`` at which a run records its state (`RECORD_POINTS` of them, the last at ``end``), so that a
    sample that shares its ops up to some cut in between is resumed at most (end - start) / RECORD_POINTS before
    that cut (simdist.engine.prefix: any time up to the cut serves)."""
    if not (math.isfinite(start) and math.isfinite(end) and end > start):
        return []
    width = (end - start) / RECORD_POINTS
    return [t for t in (start + k * width for k in range(1, RECORD_POINTS + 1)) if t > start]


@dataclass(slots=True)
class Recorded:
    """A simulated sample and its state at some times (`run_graph`'s ``record``, at `_grid`), from which another
    sample, simulated later, is resumed where the two run the same ops (simdist.engine.prefix: the premise holds at
    any time up to their cut, whichever of the two ran first)."""

    plan: StepPlan
    timeline: GraphTrace
    engine: Alone
    trace: GraphTrace
    states: dict[float, dict[int, float]]
    """Per time recorded, per op under way on the shared links then, its bytes left."""


Smaller = list[tuple[StepPlan, dict[tuple, PricedComm], tuple[GraphTrace, GraphTrace, float, Alone], Prefix]]
"""Per smaller sample: its plan, prices, `alone_and_cut`, and what it shares with the largest (`shared_prefix`)."""


def _prepare_smaller(cfg: StepConfig, topology: Topology, adjust: Adjust | None, full: bool,
                     degraded: dict[int, float] | None, counts: tuple[int, ...], big_plan: StepPlan,
                     big_priced: dict[tuple, PricedComm], big_alone: tuple[GraphTrace, GraphTrace, float, Alone]
                     ) -> Smaller:
    """The smaller samples' priced op graphs, their times alone and the prefix each shares with the largest. Their
    first divergences matter only where the largest has none (simdist.engine.prefix: before the cut their
    engine-alone timelines are the same ops', so where the largest's is earlier than the cut it is theirs too)."""
    out = []
    with collector_paused():
        for m in counts:
            plan, priced = priced_plan(cfg, topology, adjust, full, m, big_priced)
            alone = alone_and_cut(plan, topology, degraded, big_alone[2] == math.inf)
            pre = shared_prefix(plan.graph, alone[1], alone[3], big_plan.graph, big_alone[1], big_alone[3])
            out.append((plan, priced, alone, pre))
    return out


def _finish_smaller(smaller: Smaller, big: tuple[GraphTrace, float, dict[float, dict[int, float]]],
                    topology: Topology, degraded: dict[int, float] | None) -> list[dict[str, float]]:
    """The observables (with ``uncontended_s``) of each smaller sample's run, given the largest's (its trace, where
    SimPy began it, its recorded states): resumed from the latest state recorded at or before the cut where that is
    after the largest's own first divergence (then SimPy simulates the smaller one's tail only), else simulated from
    its own first divergence."""
    big_trace, big_cut, states = big
    out = []
    one, many = capacities(topology, degraded)
    for plan, priced, alone, pre in smaller:
        resume = None
        if big_cut < pre.cut_s < math.inf and not alone[2] >= pre.cut_s:
            times = [t for t in states if big_cut < t <= pre.cut_s]
            if times:
                at = max(times)
                resume = resumed_trace(Prefix(at, pre.to_big), big_trace, states[at])
        if resume is not None:
            with collector_paused():
                trace = run_graph(plan.graph, capacity_of=one, capacities=many, checked=True, resume=resume,
                                  private=alone[3].private)
        else:
            if math.isnan(alone[2]):
                a, timeline, _, engine = alone
                with collector_paused():
                    alone = (a, timeline, first_divergence(plan.graph, timeline, one, many,
                                                           None if timeline is a else engine.durations, engine), engine)
            trace = engine_trace(plan, topology, degraded, alone)
        out.append(_observed(plan, priced, trace, alone, math.nan)[3])
    return out


def _on_their_own(cfg: StepConfig, topology: Topology, adjust: Adjust | None, full: bool,
                  degraded: dict[int, float] | None, counts: tuple[int, ...]) -> list[dict[str, float]]:
    """The observables (with ``uncontended_s``) of each sample of ``counts`` micro-batches (ascending), simulated apart
    from the largest sample's run: what a child process computes beside it (simdist.predict.beside). The largest of
    ``counts`` is simulated on its own from its first divergence (as `engine_step` simulates a whole step), the
    others resumed from its recorded states (`_finish_smaller`). The same answers as when all are resumed from the
    largest sample's run, up to ties at the cut and re-share orders in the last bits (simdist.engine.prefix)."""
    *smaller_counts, m = counts
    plan, priced = priced_plan(cfg, topology, adjust, full, m)
    alone = alone_and_cut(plan, topology, degraded)
    run, recorded = _largest(plan, priced, topology, degraded, alone)
    if not smaller_counts:
        return [run[3]]
    obs = run[3]
    del run
    smaller = _prepare_smaller(cfg, topology, adjust, full, degraded, tuple(smaller_counts), plan, priced, alone)
    return [*_finish_smaller(smaller, (recorded.trace, alone[2], recorded.states), topology, degraded), obs]


def _largest(plan: StepPlan, priced: dict[tuple, PricedComm], topology: Topology, degraded: dict[int, float] | None,
             alone: tuple[GraphTrace, GraphTrace, float, Alone]
             ) -> tuple[tuple[StepPlan, dict[tuple, PricedComm], GraphTrace, dict[str, float], float], Recorded]:
    """The largest sample's run (`_observed`), recording its state at `_grid` for the samples resumed from it."""
    _, timeline, cut, engine = alone
    record: dict[float, dict[int, float]] = {t: {} for t in _grid(cut, alone[0].makespan_s)}
    one, many = capacities(topology, degraded)
    with collector_paused():
        trace = run_graph(plan.graph, capacity_of=one, capacities=many, checked=True, resume=(timeline, cut),
                          private=engine.private, record=record)
    return _observed(plan, priced, trace, alone, cut), Recorded(plan, timeline, engine, trace, record)


def _slid(plan: StepPlan, priced: dict[tuple, PricedComm], topology: Topology, degraded: dict[int, float] | None,
          before: Recorded | None
          ) -> tuple[tuple[StepPlan, dict[tuple, PricedComm], GraphTrace, dict[str, float], float], Recorded | None]:
    """The run (`_observed`) of a sample one cycle larger than ``before``'s (the samples slid on), resumed from
    ``before``'s state at the latest time it recorded at or before the two runs' cut (simdist.engine.prefix) where
    that is after the new sample's own first divergence; else simulated from there. Its own `Recorded` (its states
    at `_grid`, for the next slide) where it was resumed, else None."""
    alone = alone_and_cut(plan, topology, degraded)
    cut = alone[2]
    resume = None
    if before is not None and cut < math.inf:
        pre = shared_prefix(plan.graph, alone[1], alone[3], before.plan.graph, before.timeline, before.engine)
        times = [t for t in before.states if cut < t <= pre.cut_s]
        if times:
            at = max(times)
            resume = resumed_trace(Prefix(at, pre.to_big), before.trace, before.states[at])
    if resume is None:
        return _observed(plan, priced, engine_trace(plan, topology, degraded, alone), alone, cut), None
    one, many = capacities(topology, degraded)
    record: dict[float, dict[int, float]] = {t: {} for t in _grid(resume[1], alone[0].makespan_s)}
    with collector_paused():
        trace = run_graph(plan.graph, capacity_of=one, capacities=many, checked=True, resume=resume,
                          private=alone[3].private, record=record)
    return _observed(plan, priced, trace, alone, cut), Recorded(plan, alone[1], alone[3], trace, record)


def _observed(plan: StepPlan, priced: dict[tuple, PricedComm], trace: GraphTrace,
              alone: tuple[GraphTrace, GraphTrace, float, Alone], shown_from: float
              ) -> tuple[StepPlan, dict[tuple, PricedComm], GraphTrace, dict[str, float], float]:
    obs = observables(plan.graph, trace, first_replica(plan))
    obs["uncontended_s"] = alone[0].makespan_s
    return plan, priced, trace, obs, shown_from


def engine_step(cfg: StepConfig, topology: Topology, adjust: Adjust | None, full: bool, fast_forward: bool,
            check: Callable[[int], None] = lambda m: None, degraded: dict[int, float] | None = None,
            rather: Callable[[StepPlan, dict[tuple, PricedComm]], bool] = lambda plan, priced: False,
            pricer: CommPricer | None = None) -> EngineStep | None:
    """The engine's step; a large micro-batch count is fast-forwarded (simdist.plan.fastforward) along the cycle
    the closed form's timeline shows, when three engine samples are collinear; else every micro-batch is run.
    ``check(m)`` runs before the engine simulates ``m`` micro-batches (bounded work: simdist.limits).
    ``rather(plan, priced)`` is asked, before the engine runs, of the priced op graph whose plan and prices the
    answer would carry: True returns None at once (the caller simulates otherwise: `predict_step` every rank
    where the representatives would not be exact), so no engine run is spent on an answer thrown away.
    ``pricer``: the closed form's prices of ``topology`` and ``adjust`` (simdist.analytic.pricing.CommPricer, a
    memo), shared with the caller's other closed-form uses of the step; None: a new one."""
    M = cfg.microbatches(0)
    pricer = pricer if pricer is not None else CommPricer(topology, adjust)
    found = fast_forward_plan(cfg, pricer, for_engine=True, beside=can_fork()) if fast_forward else None
    if found is not None:
        counts = found[1:]
        check(max(counts))
        # Where the machine has a CPU to spare, the smaller samples are built, priced and simulated in a child process
        # beside this one's largest sample (simdist.predict.beside: the middle one from its own first divergence, the
        # smallest resumed from it); else after it, resumed from its recorded states (simdist.engine.prefix: SimPy
        # simulates their tails only).
        own = Beside(partial(_on_their_own, cfg, topology, adjust, full, degraded, counts[:-1])) \
            if can_fork() else None
        try:
            found_step = _fast_forward(cfg, topology, adjust, full, degraded, check, rather, pricer, found, own)
        finally:
            if own is not None:
                own.close()
        if found_step is not None:
            return found_step or None
    # unequal local batches (dp_batch_split): the busiest replica's micro-batches bound the work, not replica 0's
    check(max(cfg.microbatches(d) for d in range(cfg.mesh.dp)) if cfg.dp_batch_split is not None else M)
    plan, priced = priced_plan(cfg, topology, adjust, full, None)
    if rather(plan, priced):
        return None
    alone = alone_and_cut(plan, topology, degraded)
    trace = engine_trace(plan, topology, degraded, alone)
    return EngineStep(plan, priced, trace, observables(plan.graph, trace, first_replica(plan)), alone[0].makespan_s,
                   "all", M, found, alone[2])


def _fast_forward(cfg: StepConfig, topology: Topology, adjust: Adjust | None, full: bool,
                  degraded: dict[int, float] | None, check: Callable[[int], None],
                  rather: Callable[[StepPlan, dict[tuple, PricedComm]], bool], pricer: CommPricer,
                  found: tuple[int, int, int, int],
                  own: Beside[list[dict[str, float]], list[dict[str, float]]] | None) -> EngineStep | bool | None:
    """`engine_step` fast-forwarded on ``found``'s samples: its answer, False where ``rather`` declined it, None where
    every micro-batch is to be simulated instead (too small a step, or samples never collinear). ``own``: the smaller
    samples' observables computed beside (`_on_their_own`), if a child process does that."""
    M = cfg.microbatches(0)
    counts = found[1:]
    big_plan, big_priced = priced_plan(cfg, topology, adjust, full, counts[-1])
    if len(big_plan.graph.ops) * M / counts[-1] < FAST_FORWARD_MIN_OPS:
        return None
    big_alone = alone_and_cut(big_plan, topology, degraded)
    recorded: Recorded | None
    if own is not None and big_alone[2] < math.inf:
        if rather(big_plan, big_priced):  # the answer carries the last sample's plan and prices
            return False
        big_run, recorded = _largest(big_plan, big_priced, topology, degraded, big_alone)
        smaller_obs = own.result(None)
    else:
        if own is not None:
            own.close()  # (no contention in the largest sample: the smaller ones may need none of their engine runs)
        smaller = _prepare_smaller(cfg, topology, adjust, full, degraded, counts[:-1], big_plan, big_priced,
                                   big_alone)
        alones = [*(a for _, _, a, _ in smaller), big_alone]
        if all(cut == math.inf and timeline is a for a, timeline, cut, _ in alones):
            plan, priced = smaller[0][0], smaller[0][1]
            if rather(plan, priced):
                return False
            # No collective of any of the three samples ever meets another on a shared link (and each runs alone
            # in its uncontended time): the engine's timeline of each is its uncontended timeline
            # (simdist.engine.contention). The whole step inserts more periods of the same steady state
            # (simdist.plan.fastforward: the premise the three engine samples would test); the periods the larger
            # samples insert meet their neighbours no more than these do, so neither do the step's, and the
            # engine's answer is the uncontended step's: the closed form's, which equals it exactly
            # (tests/test_analytic_step.py), with its own fast-forward.
            obs, ff = analytic_observables(cfg, pricer)
            how = ((ff.describe("timed") if ff is not None else "every micro-batch timed")
                   + " by the closed form: no contention (the engine's timelines of "
                   f"{counts[0]}, {counts[1]} and {counts[2]} micro-batches are the uncontended ones: no two "
                   "collectives on a shared link at once)")
            return EngineStep(plan, priced, alones[0][0], obs, obs["step_s"], how, counts[0], found)
        if rather(big_plan, big_priced):
            return False
        big_run, recorded = _largest(big_plan, big_priced, topology, degraded, big_alone)
        smaller_obs = _finish_smaller(smaller, (recorded.trace, big_alone[2], recorded.states), topology, degraded)
        del smaller, alones
    del big_alone
    runs = [big_run]
    counts = list(counts)
    samples = [*zip(counts[:-1], smaller_obs, strict=True), (counts[-1], big_run[3])]  # every one taken
    ext = extrapolate(samples, M)
    jitter: float | None = None
    # Not collinear: the engine's steady state begins later than the closed form's (contention can lengthen
    # the transient). Slide the samples on by a cycle while they still cost less than M / SAVING; from the fifth
    # sample on, a steady state whose increments only jitter (contention: simdist.plan.fastforward.extrapolate_mean)
    # is extended by their mean.
    cycle = found[0]
    while ext is None and SAVING * (sum(counts) + counts[-1] + cycle) <= M:
        m = counts[-1] + cycle
        check(m)
        plan, priced = priced_plan(cfg, topology, adjust, full, m, runs[-1][1])
        if rather(plan, priced):
            return False
        run, recorded = _slid(plan, priced, topology, degraded, recorded)
        runs = [run]
        counts.append(m)
        samples.append((m, run[3]))
        ext = extrapolate(samples[-3:], M)
        if ext is None and len(samples) >= JITTER_SAMPLES:
            mean = extrapolate_mean(samples[-JITTER_SAMPLES:], M)
            if mean is not None:
                ext, jitter = mean
    if ext is not None:
        plan, priced, trace, _, engine_from_s = runs[-1]
        last = (counts[-3], counts[-2], counts[-1])
        how = FastForward(cycle, last, M).describe()
        if jitter is not None:
            read = counts[-JITTER_SAMPLES:]
            how += (f" by the mean increment of {', '.join(map(str, read))} (contention jitters the steady state: "
                    f"their increments per period within {jitter:.2%} of the step's)")
            if len(counts) > JITTER_SAMPLES:
                how += f" (after {', '.join(map(str, counts[:-JITTER_SAMPLES]))})"
        elif len(counts) > 3:
            how += f" (after {', '.join(map(str, counts[:-3]))}, not yet in the steady state)"
        return EngineStep(plan, priced, trace, ext, ext.pop("uncontended_s"), how, counts[-1], found,
                       engine_from_s)
    return None
