"""Predict one training step of a scenario: plan it, price its communication, simulate it, measure it.

One path from a scenario to a number: `predict_step` takes a validated `ScenarioSpec` and its cluster, builds the
step's configuration with simdist.plan.layout.step_config_of (its one validity check), and answers with either
fidelity in one JSON: the engine (collectives share links; a long steady state fast-forwarded) or the closed form
(simdist.analytic.step, the same step without contention). The engine's JSON says how much contention added
(``contention_s``: the step minus the same op graph with every collective alone) and how it was simulated
(``simulation``).
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simdist.analytic.step import CommPricer, analytic_observables, fast_forward_plan
from simdist.engine.contention import REL, Alone, engine_alone, first_divergence
from simdist.engine.graph import GraphTrace, run_graph
from simdist.engine.links import unique_inverse
from simdist.engine.prefix import Prefix, resumed_trace, shared_prefix
from simdist.engine.uncontended import uncontended
from simdist.errors import LayoutError
from simdist.hardware import batch
from simdist.hardware.compute import ComputeEfficiency
from simdist.hardware.topology import Topology
from simdist.limits import check_step_work
from simdist.plan.fastforward import SAVING, FastForward, extrapolate
from simdist.plan.layer_cost import model_flops_per_sequence
from simdist.plan.layer_split import layout_string
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.step import StepConfig, StepPlan, build_step, collective_runs, step_memory
from simdist.predict.band_ranges import CalibratedRanges
from simdist.predict.bands import band_of
from simdist.predict.faults import degraded_links, faults_report, scaled_capacities
from simdist.predict.goodput import goodput
from simdist.predict.price import Adjust, PricedComm, capacity_of, class_symmetric, price_graph, price_runs
from simdist.report.step_metrics import metrics as step_metrics_from
from simdist.report.step_metrics import observables
from simdist.spec.scenario import ScenarioSpec


@dataclass(slots=True)
class StepPrediction:
    result: dict[str, Any]
    plan: StepPlan | None
    """The simulated op graph (None for the closed form)."""
    trace: GraphTrace | None
    priced: dict[tuple, PricedComm]
    topology: Topology


def _links(runs: dict[tuple, int], priced: dict[tuple, PricedComm], topology: Topology, step_s: float,
           top: int = 12) -> list[dict[str, Any]]:
    """The busiest links: bytes the step's collectives (``runs``: simdist.plan.step.collective_runs) put on each."""
    if not runs:
        return []
    # bytes per link, summed collective by collective in order (numpy: the same sums in the same order)
    ids = np.concatenate([np.fromiter(priced[key].link_bytes.keys(), dtype=np.int64,
                                      count=len(priced[key].link_bytes)) for key in runs])
    each = np.concatenate([np.fromiter(priced[key].link_bytes.values(), dtype=float,
                                       count=len(priced[key].link_bytes)) * count for key, count in runs.items()])
    if not len(ids):
        return []
    links, inverse = unique_inverse(ids)
    load = np.bincount(inverse, weights=each, minlength=len(links))
    first = np.full(len(links), len(ids), dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(len(ids), dtype=np.int64))
    seen = np.argsort(first, kind="stable")  # links in order of first use
    busiest = seen[np.argsort(-load[seen], kind="stable")[:top]]  # most bytes first; ties in order of first use
    rows = []
    for link_id, b in zip(links[busiest].tolist(), load[busiest].tolist(), strict=True):
        link = topology.link(link_id)
        rows.append({"link": link_id, "kind": link.kind, "src": link.src, "dst": link.dst, "bytes": b,
                     "utilization": b / (link.effective_bandwidth_Bps * step_s) if step_s > 0 else 0.0})
    return rows


def link_counters(prediction: StepPrediction, *, top: int = 8) -> list[dict[str, Any]]:
    """Utilization over time of the busiest links, for the trace's counter tracks.

    A collective's bytes on a link are spread evenly over its duration (its average rate), and concurrent
    collectives on the link add up. Only the simulated ranks' collectives are counted.
    """
    plan, trace, topology = prediction.plan, prediction.trace, prediction.topology
    wanted = {row["link"] for row in prediction.result["links"][:top]}
    events: dict[int, list[tuple[float, float]]] = {link: [] for link in wanted}
    for i, op in enumerate(plan.graph.ops):
        c = op.comm
        duration = trace.end_s[i] - trace.start_s[i]
        if c is None or duration <= 0:
            continue
        pc = prediction.priced[(c.op, c.ranks, c.nbytes, c.axis, c.imbalance)]
        for link, nbytes in pc.link_bytes.items():
            if link in events:
                rate = nbytes * c.count / duration
                events[link] += [(trace.start_s[i], rate), (trace.end_s[i], -rate)]
    out = []
    for link in sorted(wanted):
        cap = topology.link(link).effective_bandwidth_Bps
        points, level = [(0.0, 0.0)], 0.0
        for t, delta in sorted(events[link]):
            level += delta
            points.append((t, max(level, 0.0) / cap))
        lk = topology.link(link)
        out.append({"name": f"{lk.kind} {lk.src} -> {lk.dst}", "points": points})
    return out


def _collectives(runs: dict[tuple, int], priced: dict[tuple, PricedComm]) -> list[dict[str, Any]]:
    """The step's collectives, one row per (axis, op, size, group size, algorithm)."""
    rows: dict[tuple, dict[str, Any]] = {}
    for key, count in runs.items():
        pc = priced[key]
        row_key = (pc.axis, pc.op, pc.nbytes, pc.num_ranks, pc.algorithm, pc.protocol, round(pc.time_s, 15))
        row = rows.setdefault(row_key, {"axis": pc.axis, "op": pc.op, "nbytes": pc.nbytes, "num_ranks": pc.num_ranks,
                                        "algorithm": pc.algorithm, "protocol": pc.protocol, "time_s": pc.time_s,
                                        "count": 0})
        row["count"] += count
    order = {"tp": 0, "cp": 1, "pp": 2, "dp": 3}
    return sorted(rows.values(), key=lambda r: (order.get(r["axis"], 9), r["op"], -r["nbytes"], r["time_s"]))


SIMULATE = ("auto", "representatives", "full")
FIDELITIES = ("engine", "closed_form")
FAST_FORWARD_MIN_OPS = 20_000
"""A step whose whole op graph would hold fewer ops than this is simulated whole (a fraction of a second)."""
FULL_AUTO_MAX_OPS = 100_000
"""`simulate="auto"` falls back to every rank where the reduction would not be exact, if the full graph would
hold at most this many ops (about a second or two of simulation)."""


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector while a step is simulated; it resumes as it was afterwards.

    The simulation allocates 10^4-10^5 small objects that reference counting frees (ops, the engine's jobs
    with one (link, bytes) pair per link, events; a run leaves a few dozen objects in cycles): the collector
    would scan the young ones every 700 allocations and, every 100th time, everything the process holds, for
    next to nothing to free (up to a tenth of a 16,384-GPU step's in-process time). Results are
    unchanged: only when garbage is collected changes.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _priced_plan(cfg: StepConfig, topology: Topology, adjust: Adjust | None, full: bool,
                 num_microbatches: int | None, known: dict[tuple, PricedComm] | None = None
                 ) -> tuple[StepPlan, dict[tuple, PricedComm]]:
    """The step's op graph on ``num_microbatches`` (None: all), priced; ``known``: the prices of another sample of
    the same step, reused (simdist.predict.price.price_graph)."""
    with _collector_paused():
        plan = build_step(cfg, full=full, num_microbatches=num_microbatches)
        priced = price_graph(plan.graph, topology, mesh=cfg.mesh, reduced_axes=plan.reduced_axes, adjust=adjust,
                             known=known)
    return plan, priced


def _capacities(topology: Topology, degraded: dict[int, float] | None) -> tuple[Any, Any]:
    """(capacity of one link, capacities of many) for the engine; ``degraded``: link id -> fraction of its
    capacity left (scenario ``faults.degraded_links``)."""
    if degraded:
        return scaled_capacities(topology, degraded)
    return capacity_of(topology), lambda links: batch.link_capacities(topology, links)


def _alone_and_cut(plan: StepPlan, topology: Topology, degraded: dict[int, float] | None, cut: bool = True
                   ) -> tuple[GraphTrace, GraphTrace, float, Alone]:
    """The op graph's uncontended trace (every op its priced duration), its timeline with the engine's times of
    each op alone (simdist.engine.contention.alone_durations: the same trace where they are the priced ones), the
    time up to which that is the engine's timeline (simdist.engine.contention.first_divergence: inf where no two
    transfers meet on a shared link; NaN if not ``cut``: not looked for), and what the engine does with each op
    alone."""
    one, many = _capacities(topology, degraded)
    with _collector_paused():
        alone = uncontended(plan.graph)
        engine = engine_alone(plan.graph, one, many)
        durations: list[float] | None = engine.durations
        if any(abs(d - op.duration_s) > REL * max(abs(op.duration_s), 1e-300)
               for d, op in zip(engine.durations, plan.graph.ops, strict=True)):
            timeline = uncontended(plan.graph, checked=True, durations=durations)
        else:
            timeline, durations = alone, None
        if not cut:
            return alone, timeline, math.nan, engine
        return alone, timeline, first_divergence(plan.graph, timeline, one, many, durations, engine), engine


def _engine_trace(plan: StepPlan, topology: Topology, degraded: dict[int, float] | None,
                  alone: tuple[GraphTrace, GraphTrace, float, Alone]) -> GraphTrace:
    """The engine's trace, simulated from the first divergence on (`_alone_and_cut`: before it the engine's timeline
    is the alone one, so only what follows costs SimPy events; none where no transfers meet)."""
    one, many = _capacities(topology, degraded)
    _, timeline, cut, engine = alone
    with _collector_paused():
        return run_graph(plan.graph, capacity_of=one, capacities=many, checked=True, resume=(timeline, cut),
                         private=engine.private)


@dataclass(slots=True)
class _Engine:
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


def _first_replica(plan: StepPlan) -> list[int]:
    d0 = min(d for _, d in plan.stage_ranks)
    return sorted(r for (_, d), r in plan.stage_ranks.items() if d == d0)


def _sample(plan: StepPlan, priced: dict[tuple, PricedComm], topology: Topology, degraded: dict[int, float] | None,
            alone: tuple[GraphTrace, GraphTrace, float, Alone] | None
            ) -> tuple[StepPlan, dict[tuple, PricedComm], GraphTrace, dict[str, float], float]:
    """(plan, prices, engine trace, observables with ``uncontended_s``, first divergence) of one fast-forward
    sample; ``alone``: its
    uncontended trace and first divergence (`_alone_and_cut`) if already found."""
    alone = alone if alone is not None else _alone_and_cut(plan, topology, degraded)
    return _observed(plan, priced, _engine_trace(plan, topology, degraded, alone), alone, alone[2])


def _samples(priced_plans: list[tuple[StepPlan, dict[tuple, PricedComm]]], topology: Topology,
             degraded: dict[int, float] | None, alones: list[tuple[GraphTrace, GraphTrace, float, Alone]]
             ) -> list[tuple[StepPlan, dict[tuple, PricedComm], GraphTrace, dict[str, float], float]]:
    """`_sample` of each fast-forward sample (fewest micro-batches first). The largest is simulated; a smaller one
    runs what it runs until its own cool-down departs from it (simdist.engine.prefix), so where that is later than
    its own first divergence it is resumed from the largest run's state there, and SimPy simulates its tail only.
    A smaller sample's first divergence may be NaN (not looked for): before the cut their engine-alone timelines are
    the same (the same ops), so where the largest's is earlier than the cut it is the smaller's too."""
    big_plan, _ = priced_plans[-1]
    _, big_timeline, big_cut, big_engine = alones[-1]
    prefixes: list[Prefix | None] = []
    record: dict[float, dict[int, float]] = {}
    for (plan, _), (_, timeline, cut, engine) in zip(priced_plans[:-1], alones[:-1], strict=True):
        pre = shared_prefix(plan.graph, timeline, engine, big_plan.graph, big_timeline, big_engine)
        useful = big_cut < pre.cut_s < math.inf and not cut >= pre.cut_s
        prefixes.append(pre if useful else None)
        if useful:
            record[pre.cut_s] = {}
    one, many = _capacities(topology, degraded)
    with _collector_paused():
        big_trace = run_graph(big_plan.graph, capacity_of=one, capacities=many, checked=True,
                              resume=(big_timeline, big_cut), private=big_engine.private, record=record)
    runs = []
    for (plan, priced), alone, pre in zip(priced_plans, alones, [*prefixes, None], strict=True):
        resume = resumed_trace(pre, big_trace, record[pre.cut_s]) if pre is not None else None
        if plan is big_plan:
            trace, shown_from = big_trace, big_cut
        elif resume is not None:
            with _collector_paused():
                trace = run_graph(plan.graph, capacity_of=one, capacities=many, checked=True, resume=resume,
                                  private=alone[3].private)
            shown_from = big_cut  # = its own first divergence, which is before the cut
        else:
            if math.isnan(alone[2]):
                a, timeline, _, engine = alone
                with _collector_paused():
                    alone = (a, timeline, first_divergence(plan.graph, timeline, one, many,
                                                           None if timeline is a else engine.durations, engine), engine)
            trace, shown_from = _engine_trace(plan, topology, degraded, alone), alone[2]
        runs.append(_observed(plan, priced, trace, alone, shown_from))
    return runs


def _observed(plan: StepPlan, priced: dict[tuple, PricedComm], trace: GraphTrace,
              alone: tuple[GraphTrace, GraphTrace, float, Alone], shown_from: float
              ) -> tuple[StepPlan, dict[tuple, PricedComm], GraphTrace, dict[str, float], float]:
    obs = observables(plan.graph, trace, _first_replica(plan))
    obs["uncontended_s"] = alone[0].makespan_s
    return plan, priced, trace, obs, shown_from


def _engine(cfg: StepConfig, topology: Topology, adjust: Adjust | None, full: bool, fast_forward: bool,
            check: Callable[[int], None] = lambda m: None, degraded: dict[int, float] | None = None,
            rather: Callable[[StepPlan, dict[tuple, PricedComm]], bool] = lambda plan, priced: False
            ) -> _Engine | None:
    """The engine's step; a large micro-batch count is fast-forwarded (simdist.plan.fastforward) along the cycle
    the closed form's timeline shows, when three engine samples are collinear; else every micro-batch is run.
    ``check(m)`` runs before the engine simulates ``m`` micro-batches (bounded work: simdist.limits).
    ``rather(plan, priced)`` is asked, before the engine runs, of the priced op graph whose plan and prices the
    answer would carry: True returns None at once (the caller simulates otherwise: `predict_step` every rank
    where the representatives would not be exact), so no engine run is spent on an answer thrown away."""
    M = cfg.microbatches(0)
    pricer = CommPricer(topology, adjust)
    found = fast_forward_plan(cfg, pricer, for_engine=True) if fast_forward else None
    if found is not None:
        counts = found[1:]
        check(max(counts))
        plan, priced = _priced_plan(cfg, topology, adjust, full, counts[0])
        if len(plan.graph.ops) * M / counts[0] >= FAST_FORWARD_MIN_OPS:
            priced_plans = [(plan, priced), *(_priced_plan(cfg, topology, adjust, full, m, priced)
                                              for m in counts[1:])]
            # the smaller samples' first divergences matter only where the largest has none (simdist.engine.prefix)
            big_alone = _alone_and_cut(priced_plans[-1][0], topology, degraded)
            alones = [*(_alone_and_cut(p, topology, degraded, big_alone[2] == math.inf) for p, _ in priced_plans[:-1]),
                      big_alone]
            if all(cut == math.inf and timeline is a for a, timeline, cut, _ in alones):
                if rather(plan, priced):
                    return None
                # No collective of any of the three samples ever meets another on a shared link (and each runs
                # alone in its uncontended time): the engine's timeline of each is its uncontended timeline
                # (simdist.engine.contention). The whole step inserts more periods of the same steady state
                # (simdist.plan.fastforward: the premise the three engine samples would test); the periods the
                # larger samples insert meet their neighbours no more than these do, so neither do the step's,
                # and the engine's answer is the uncontended step's: the closed form's, which equals it exactly
                # (tests/test_analytic_step.py), with its own fast-forward.
                obs, ff = analytic_observables(cfg, pricer)
                how = ((ff.describe("timed") if ff is not None else "every micro-batch timed")
                       + " by the closed form: no contention (the engine's timelines of "
                       f"{counts[0]}, {counts[1]} and {counts[2]} micro-batches are the uncontended ones: no two "
                       "collectives on a shared link at once)")
                return _Engine(plan, priced, alones[0][0], obs, obs["step_s"], how, counts[0], found)
            # the answer carries the last sample's plan and prices
            if rather(*priced_plans[-1]):
                return None
            runs = _samples(priced_plans, topology, degraded, alones)
            del priced_plans, alones
            counts = list(counts)
            samples = [(m, run[3]) for m, run in zip(counts, runs, strict=True)]
            ext = extrapolate(samples, M)
            # Not collinear: the engine's steady state begins later than the closed form's (contention can lengthen
            # the transient). Slide the samples on by a cycle while they still cost less than M / SAVING.
            cycle = found[0]
            while ext is None and SAVING * (sum(counts) + counts[-1] + cycle) <= M:
                m = counts[-1] + cycle
                check(m)
                plan, priced = _priced_plan(cfg, topology, adjust, full, m, runs[-1][1])
                if rather(plan, priced):
                    return None
                runs = [*runs[-2:], _sample(plan, priced, topology, degraded, None)]
                counts.append(m)
                samples = [*samples[-2:], (m, runs[-1][3])]
                ext = extrapolate(samples, M)
            if ext is not None:
                plan, priced, trace, _, engine_from_s = runs[-1]
                last = (counts[-3], counts[-2], counts[-1])
                how = FastForward(cycle, last, M).describe()
                if len(counts) > 3:
                    how += f" (after {', '.join(map(str, counts[:-3]))}, not yet in the steady state)"
                return _Engine(plan, priced, trace, ext, ext.pop("uncontended_s"), how, counts[-1], found,
                               engine_from_s)
    check(M)
    plan, priced = _priced_plan(cfg, topology, adjust, full, None)
    if rather(plan, priced):
        return None
    alone = _alone_and_cut(plan, topology, degraded)
    trace = _engine_trace(plan, topology, degraded, alone)
    return _Engine(plan, priced, trace, observables(plan.graph, trace, _first_replica(plan)), alone[0].makespan_s,
                   "all", M, found, alone[2])


def predict_step(spec: ScenarioSpec, topology: Topology, *, source: str = "", base_dir: Path | None = None,
                 compute_efficiency: ComputeEfficiency | None = None, adjust: Adjust | None = None,
                 band_ranges: CalibratedRanges | None = None, simulate: str = "auto", fidelity: str = "engine",
                 timeline: bool = False) -> StepPrediction:
    """Predict one step; ``compute_efficiency`` and ``adjust`` apply a calibration (simdist calibrate), whose
    confidence intervals (``band_ranges``: simdist.predict.band_ranges) the prediction band samples.

    ``fidelity``: ``engine`` (the SimPy engine: collectives share links) or ``closed_form`` (simdist.analytic.step:
    the same step without contention), reported in the same JSON. ``simulate`` (engine): ``representatives``
    simulates one rank per pipeline stage (and per data-parallel replica where replicas differ), the others' traffic
    folded onto the shared links (simdist.predict.price), and fast-forwards a long steady state; ``full`` every rank
    and every micro-batch; ``auto`` representatives, switching to every rank (up to FULL_AUTO_MAX_OPS ops) where a
    collective's equivalent groups would not see the same bottleneck. ``timeline`` (closed form): also build the
    op graph and its uncontended timeline (simdist.engine.uncontended: equal to the closed form's, tests) for the
    trace and HTML report.
    """
    if simulate not in SIMULATE:
        raise LayoutError(f"unknown simulate mode '{simulate}'", field="--simulate",
                          fix=f"use one of: {', '.join(SIMULATE)}")
    if fidelity not in FIDELITIES:
        raise LayoutError(f"unknown fidelity '{fidelity}'", field="--fidelity",
                          fix=f"use one of: {', '.join(FIDELITIES)}")
    model = resolve_model(spec.model, base_dir=base_dir)
    cfg = step_config_of(spec, topology, model)
    degraded = degraded_links(spec.faults, topology)
    if compute_efficiency is not None:
        cfg = dataclasses.replace(cfg, compute_efficiency=compute_efficiency)
    tokens = spec.training.global_batch_size * (model.seq_length if model.kind == "decoder" else 1)
    peak = topology.gpu.peak_flops(spec.training.precision)
    runs = collective_runs(cfg)
    plan = trace = None
    engine = None
    if fidelity == "closed_form":
        obs, ff = analytic_observables(cfg, CommPricer(topology, adjust))
        how = ff.describe("timed") if ff is not None else "all"
        priced = price_runs(runs, topology, adjust=adjust)
        simulation: dict[str, Any] = {"fidelity": "closed_form", "ranks": "one per stage (by group shape)",
                                      "micro_batches": how, "exact": True,
                                      "note": "no contention: every collective alone on its links"}
        contention = None
        if timeline:
            plan = build_step(cfg, num_microbatches=ff.counts[-1] if ff is not None else None)
            price_graph(plan.graph, topology, with_links=False, adjust=adjust)
            trace = uncontended(plan.graph)
    else:
        def check(mode: str) -> Callable[[int], None]:
            return lambda m: check_step_work(spec, topology.num_gpus, simulate=mode, num_params=model.num_params,
                                             num_microbatches=m, source=source or None)

        # a degraded or failed link breaks the symmetry of the translates that cross it (their traffic is folded onto
        # the simulated group's links only where they share them): simulate every rank where that is affordable,
        # decided from the representatives' priced op graph before the engine runs it (one engine run, not two)
        failed = topology.fabric is not None and bool(topology.fabric.failed_uplinks)

        def every_rank(plan: StepPlan, priced: dict[tuple, PricedComm]) -> bool:
            full_ops = len(plan.graph.ops) * topology.num_gpus / max(1, len(plan.graph.ranks()))
            return not (class_symmetric(priced) and not degraded and not failed) and full_ops <= FULL_AUTO_MAX_OPS

        # one pause of the collector over every sample (their graphs, traces and prices are 10^5 objects: each
        # resumption would have it scan them all again); results are unchanged
        with _collector_paused():
            found = _engine(cfg, topology, adjust, simulate == "full", simulate != "full", check(simulate), degraded,
                            every_rank if simulate == "auto" else lambda plan, priced: False)
            exact = found is None or (class_symmetric(found.priced) and not degraded and not failed)
            if found is None:
                found = _engine(cfg, topology, adjust, True, True, check("full"), degraded)
        engine = found
        assert engine is not None
        plan, trace, obs = engine.plan, engine.trace, engine.observables
        priced = {**engine.priced, **price_runs({k: v for k, v in runs.items() if k not in engine.priced}, topology,
                                                adjust=adjust)}
        contention = obs["step_s"] - engine.uncontended_step_s
        simulation = _simulation_note(plan, topology, spec, exact, engine)
    metrics = step_metrics_from(obs, tokens_per_step=tokens, peak_flops=peak)
    # FLOP conventions: model FLOPs (model_tflops_per_gpu, mfu) count the causal half of the attention scores under
    # a causal mask (Megatron-LM today); mfu_full_attention counts every score (Narayanan et al. 2021 eq. (3), PaLM,
    # torchtitan). Both are against the dense peak of training.precision; hfu counts what the kernels execute.
    causal = spec.training.attention_mask == "causal" and model.kind == "decoder"
    full_ratio = (model_flops_per_sequence(model, "full") / model_flops_per_sequence(model, "causal")
                  if causal else 1.0)
    metrics["mfu_full_attention"] = metrics["mfu"] * full_ratio
    metrics["flop_convention"] = ("model FLOPs with the causal half of the attention scores (mfu); every score "
                                  "(mfu_full_attention)" if causal else "model FLOPs, every attention score")
    if model.is_moe:
        # simdist.plan.moe_cost: model FLOPs count each token's topk routed experts at the balanced share (the active
        # parameters, Model.num_active_params); the busiest rank's extra tokens (moe_imbalance) are time, not FLOPs.
        metrics["flop_convention"] += ("; MoE layers: a token's moe_router_topk routed experts and the shared experts "
                                       "(the active parameters), routing imbalance and dropped tokens not counted")
    memory_parts = step_memory(cfg)
    stage_rank = {s: cfg.mesh.rank(pp=s) for s in range(cfg.mesh.pp)}
    memory = [{"stage": s, "rank": stage_rank[s], **m.as_dict()} for s, m in enumerate(memory_parts)]
    p = spec.parallel
    result: dict[str, Any] = {
        "name": spec.name,
        "scenario": source,
        **metrics,
        "contention_s": contention,
        "memory_per_gpu_bytes": max(m.total_bytes for m in memory_parts),
        "fits_in_memory": all(m.fits for m in memory_parts),
        "memory": memory,
        "links": _links(runs, priced, topology, metrics["step_time_s"]),
        "layout": {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "vpp": p.vpp, "num_gpus": topology.num_gpus,
                   "cluster_gpus": topology.cluster_num_gpus,
                   "idle_gpus": topology.cluster_num_gpus - topology.num_gpus,
                   "placement": {"num_nodes": topology.num_nodes, "gpus_per_node": topology.gpus_per_node},
                   "num_microbatches": cfg.microbatches(0), "schedule": spec.schedule,
                   "layers_per_stage": list(cfg.layers_per_stage),
                   "layers_per_chunk": [list(cfg.stage_chunks(s)) for s in range(cfg.mesh.pp)],
                   "pipeline_split": cfg.split_method,
                   "pipeline_layout": layout_string(cfg.model_parts()),
                   "order": "-".join(cfg.mesh.order),
                   **(_layout_simulation(plan, topology, simulation) if plan is not None else {})},
        "simulation": simulation,
        # num_params: every parameter (every expert); num_active_params: a token's (simdist.plan.model.Model)
        "model": {"name": model.name, "kind": model.kind, "num_params": model.num_params,
                  "num_active_params": model.num_active_params,
                  "num_layers": model.num_layers, "hidden_size": model.hidden_size},
        "collectives": _collectives(runs, priced),
    }
    band = band_of(cfg, CommPricer(topology, adjust), metrics["step_time_s"],
                   engine.fast_forward if engine is not None and engine.fast_forward is not None else False,
                   band_ranges)
    result["step_time_band_s"], result["step_time_band_how"] = band.band, band.how
    result["step_time_band_sources"] = band.sources
    inter = topology.spec.inter_node
    result["goodput"] = goodput(num_gpus=topology.num_gpus, num_hosts=topology.num_nodes,
                                num_nics=(inter.nics_per_node if inter is not None else 0) * topology.num_nodes,
                                num_params=model.num_params, checkpoint=spec.faults.checkpoint)
    faults = faults_report(cfg, spec.faults, topology, degraded, plan, trace, fidelity)
    if faults is not None:
        result["faults"] = faults
    return StepPrediction(result, plan, trace, engine.priced if engine is not None else priced, topology)


def _layout_simulation(plan: StepPlan, topology: Topology, simulation: dict[str, Any]) -> dict[str, Any]:
    """The layout's simulation fields of earlier releases (kept: reports and tests read them)."""
    mode = "full" if plan.reduced_axes == () and topology.num_gpus > len(plan.representative_ranks) else "reduced"
    return {"representative_ranks": plan.representative_ranks, "simulated_ranks": len(plan.graph.ranks()),
            "simulation": mode, "reduction_exact": simulation["exact"], "note": simulation["note"]}


def _simulation_note(plan: StepPlan, topology: Topology, spec: ScenarioSpec, exact: bool, engine: _Engine
                     ) -> dict[str, Any]:
    """How the engine simulated the step, and why (the JSON's ``simulation``)."""
    first = _first_replica(plan)
    simulated = len(plan.graph.ranks())
    full = plan.reduced_axes == () and topology.num_gpus > len(plan.representative_ranks)
    if full:
        note = (f"simulated all {simulated} ranks; shown: the {len(first)} rank(s) of data-parallel "
                "replica 0 with tensor/context-parallel coordinate 0")
    else:
        note = (f"simulated {simulated} representative rank(s) of {topology.num_gpus}: one per pipeline stage"
                + (" and data-parallel replica" if "dp" not in plan.reduced_axes and spec.parallel.dp > 1 else "")
                + (f"; the other ranks along {'/'.join(plan.reduced_axes)} run the same ops at the same times and "
                   "their traffic shares the links with them" if plan.reduced_axes else ""))
        if not exact:
            note += ("; their equivalent groups do not all meet the same bottleneck (e.g. ECMP onto unequal "
                     "spines), so the reduction is approximate (simulate full to check)")
    if engine.micro_batches != "all":
        note += f"; micro-batches: {engine.micro_batches} (the timeline shows {engine.simulated_microbatches})"
    shown = engine.engine_from_s
    if shown == math.inf:
        note += ("; no two transfers meet on a shared link: every op takes its engine time alone, timed without "
                 "SimPy (simdist.engine.contention)")
    elif shown > 0:
        note += (f"; up to {shown:.6g} s no two transfers meet on a shared link: that part is timed without SimPy, "
                 "which simulates from there on (simdist.engine.contention)")
    return {"fidelity": "engine", "ranks": "full" if full else "representatives",
            "micro_batches": engine.micro_batches, "exact": exact, "note": note,
            "uncontended_step_time_s": engine.uncontended_step_s,
            "engine_from_s": None if shown == math.inf else shown}
