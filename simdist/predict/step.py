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
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simdist.analytic.step import CommPricer, analytic_observables
from simdist.engine.graph import GraphTrace
from simdist.engine.sharing import unique_inverse
from simdist.engine.uncontended import uncontended
from simdist.errors import LayoutError
from simdist.hardware import batch
from simdist.hardware.compute import ComputeEfficiency
from simdist.hardware.topology import Topology
from simdist.hardware.variability import variability_report
from simdist.limits import check_step_work
from simdist.plan.layer_cost import model_flops_per_sequence
from simdist.plan.layer_split import layout_string
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.stage_pace import stage_pace
from simdist.plan.step import StepPlan, build_step, collective_runs
from simdist.plan.step_config import StepConfig
from simdist.plan.step_memory import step_memory
from simdist.predict.band_ranges import CalibratedRanges
from simdist.predict.bands import BandWork, band_ratios
from simdist.predict.engine_step import EngineStep, collector_paused, engine_step, first_replica
from simdist.predict.faults import degraded_links, faults_report
from simdist.predict.goodput import goodput
from simdist.predict.price import Adjust, PricedComm, class_symmetric, price_graph, price_runs
from simdist.report.step_metrics import metrics as step_metrics_from
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
    """The busiest links: the ``top`` links whose capacity the step's collectives (``runs``:
    simdist.plan.step.collective_runs) use most, their bytes over the link's capacity and the step time (a NIC
    or PCIe link that is nearly full ranks above an NVLink port that carries more bytes at a small share of its
    bandwidth); ties in order of first use."""
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
    drain_s = load / batch.link_capacities(topology, links)  # seconds each link is busy carrying its bytes
    busiest = seen[np.argsort(-drain_s[seen], kind="stable")[:top]]  # fullest first; ties in order of first use
    rows = []
    for link_id, b, busy_s in zip(links[busiest].tolist(), load[busiest].tolist(), drain_s[busiest].tolist(),
                                  strict=True):
        link = topology.link(link_id)
        rows.append({"link": link_id, "kind": link.kind, "src": link.src, "dst": link.dst, "bytes": b,
                     "utilization": busy_s / step_s if step_s > 0 else 0.0})
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
        pc = prediction.priced[(c.op, c.ranks, c.nbytes, c.axis, c.imbalance, c.kernel)]
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
    """The step's collectives, one row per (axis, op, size, group size, algorithm, kernel); ``kernel``: what runs it
    (nccl, or the flex dispatcher's deepep / hybridep: simdist.collectives.ep_kernels)."""
    rows: dict[tuple, dict[str, Any]] = {}
    for key, count in runs.items():
        pc = priced[key]
        kernel = key[5]
        row_key = (pc.axis, pc.op, pc.nbytes, pc.num_ranks, pc.algorithm, pc.protocol, kernel, round(pc.time_s, 15))
        row = rows.setdefault(row_key, {"axis": pc.axis, "op": pc.op, "nbytes": pc.nbytes, "num_ranks": pc.num_ranks,
                                        "algorithm": pc.algorithm, "protocol": pc.protocol, "kernel": kernel,
                                        "time_s": pc.time_s, "count": 0})
        row["count"] += count
    order = {"tp": 0, "cp": 1, "pp": 2, "dp": 3}
    return sorted(rows.values(), key=lambda r: (order.get(r["axis"], 9), r["op"], -r["nbytes"], r["time_s"]))


SIMULATE = ("auto", "representatives", "full")
FIDELITIES = ("engine", "closed_form")
FULL_AUTO_MAX_OPS = 100_000
"""`simulate="auto"` falls back to every rank where the reduction would not be exact, if the full graph would
hold at most this many ops (about a second or two of simulation)."""


def checked_step(spec: ScenarioSpec, topology: Topology, *, base_dir: Path | None = None
                 ) -> tuple[Any, StepConfig, dict[int, float]]:
    """(model, step configuration, degraded link factors) of a scenario on its cluster: every check a prediction
    makes before it simulates (the layout, the execution fields, the faults), the one owner of them (`simdist check`
    runs it too)."""
    model = resolve_model(spec.model, base_dir=base_dir)
    return model, step_config_of(spec, topology, model), degraded_links(spec.faults, topology)


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
    model, cfg, degraded = checked_step(spec, topology, base_dir=base_dir)
    if compute_efficiency is not None:
        cfg = dataclasses.replace(cfg, compute_efficiency=compute_efficiency)
    tokens = spec.training.global_batch_size * (model.seq_length if model.kind == "decoder" else 1)
    peak = topology.gpu.peak_flops(spec.training.precision)
    runs = collective_runs(cfg)
    pricer = CommPricer(topology, adjust)  # one memo of the closed form's prices for the step, its band and samples
    plan = trace = None
    engine = None
    band: BandWork | None = None
    if fidelity == "closed_form":
        obs, ff = analytic_observables(cfg, pricer)
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

        # the band's closed forms, in a child process beside the engine where the machine has a CPU to spare
        band = BandWork(cfg, pricer, band_ranges, fast_forward=simulate != "full")
        # one pause of the collector over every sample (their graphs, traces and prices are 10^5 objects: each
        # resumption would have it scan them all again); results are unchanged
        with collector_paused():
            found = engine_step(cfg, topology, adjust, simulate == "full", simulate != "full", check(simulate),
                                degraded, every_rank if simulate == "auto" else lambda plan, priced: False, pricer)
            exact = found is None or (class_symmetric(found.priced) and not degraded and not failed)
            if found is None:
                found = engine_step(cfg, topology, adjust, True, True, check("full"), degraded, pricer=pricer)
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
                   "pipeline_layout": layout_string(cfg.model_parts(), cfg.model.mtp_layers),
                   "order": "-".join(cfg.mesh.order),
                   **(_layout_simulation(plan, topology, simulation) if plan is not None else {})},
        "simulation": simulation,
        # num_params: every parameter (every expert); num_active_params: a token's (simdist.plan.model.Model)
        "model": {"name": model.name, "kind": model.kind, "num_params": model.num_params,
                  "num_active_params": model.num_active_params,
                  "num_layers": model.num_layers, "hidden_size": model.hidden_size},
        "collectives": _collectives(runs, priced),
    }
    band_plan = engine.fast_forward if engine is not None and engine.fast_forward is not None else False
    ratios = band.ratios(band_plan) if band is not None else band_ratios(cfg, pricer, band_plan, band_ranges)
    step_band = ratios.around(metrics["step_time_s"])
    result["step_time_band_s"], result["step_time_band_how"] = step_band.band, step_band.how
    result["step_time_band_sources"] = step_band.sources
    inter = topology.spec.inter_node
    result["goodput"] = goodput(num_gpus=topology.num_gpus, num_hosts=topology.num_nodes,
                                num_nics=(inter.nics_per_node if inter is not None else 0) * topology.num_nodes,
                                num_params=model.num_params, checkpoint=spec.faults.checkpoint)
    spread = variability_report(topology.gpu, cfg.gpu_speed_cv, cfg.mesh.num_ranks, stage_pace(cfg))
    if spread is not None:  # cluster.gpu_speed_cv: every compute piece x the factor (StepConfig.paced_variability)
        result["gpu_variability_factor"], result["gpu_variability"] = spread["factor"], spread
    faults = faults_report(cfg, spec.faults, topology, degraded, plan, trace, fidelity)
    if faults is not None:
        result["faults"] = faults
    return StepPrediction(result, plan, trace, engine.priced if engine is not None else priced, topology)


def _layout_simulation(plan: StepPlan, topology: Topology, simulation: dict[str, Any]) -> dict[str, Any]:
    """The layout's simulation fields of earlier releases (kept: reports and tests read them)."""
    mode = "full" if plan.reduced_axes == () and topology.num_gpus > len(plan.representative_ranks) else "reduced"
    return {"representative_ranks": plan.representative_ranks, "simulated_ranks": len(plan.graph.ranks()),
            "simulation": mode, "reduction_exact": simulation["exact"], "note": simulation["note"]}


def _simulation_note(plan: StepPlan, topology: Topology, spec: ScenarioSpec, exact: bool, engine: EngineStep
                     ) -> dict[str, Any]:
    """How the engine simulated the step, and why (the JSON's ``simulation``)."""
    first = first_replica(plan)
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
