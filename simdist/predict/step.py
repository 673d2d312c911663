"""Predict one training step of a scenario: plan it, price its communication, simulate it, measure it."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simdist.engine.graph import GraphTrace, run_graph
from simdist.engine.links import unique_inverse
from simdist.errors import LayoutError
from simdist.hardware import batch
from simdist.hardware.compute import ComputeEfficiency
from simdist.hardware.topology import Topology
from simdist.plan.mesh import Mesh, parse_order
from simdist.plan.model import Model
from simdist.plan.model_presets import resolve_model
from simdist.plan.step import StepConfig, StepPlan, build_step, split_layers
from simdist.predict.price import Adjust, PricedComm, capacity_of, class_symmetric, price_graph
from simdist.report.step_metrics import step_metrics
from simdist.spec.scenario import ScenarioSpec


@dataclass(slots=True)
class StepPrediction:
    result: dict[str, Any]
    plan: StepPlan
    trace: GraphTrace
    priced: dict[tuple, PricedComm]
    topology: Topology


def check_layout(model: Model, spec: ScenarioSpec, topology: Topology) -> None:
    """Layout rules Megatron-LM enforces (megatron/training/arguments.py), one clear error each."""
    p = spec.parallel
    if model.kind == "decoder":
        if model.num_attention_heads % p.tp:
            raise LayoutError(
                f"{model.num_attention_heads} attention heads do not split over tp = {p.tp}",
                field="parallel.tp", fix=f"choose tp dividing {model.num_attention_heads}")
        if model.num_query_groups % p.tp and p.tp % model.num_query_groups:
            raise LayoutError(
                f"{model.num_query_groups} key/value heads do not split over tp = {p.tp}",
                field="parallel.tp", fix=f"choose tp dividing {model.num_query_groups}")
        if model.seq_length % (2 * p.cp if p.cp > 1 else 1):
            raise LayoutError(
                f"sequence length {model.seq_length} does not split into 2 x cp = {2 * p.cp} chunks",
                field="parallel.cp", fix="choose cp with seq_length divisible by 2 x cp (Megatron's load balancing)")
    elif p.tp > 1 and model.hidden_size % p.tp:
        raise LayoutError(f"width {model.hidden_size} does not split over tp = {p.tp}", field="parallel.tp",
                          fix=f"choose tp dividing {model.hidden_size}")
    if p.cp > 1 and model.kind == "mlp":
        raise LayoutError("context parallelism needs a sequence; the mlp model has none", field="parallel.cp",
                          fix="set parallel.cp: 1")


def step_config(spec: ScenarioSpec, topology: Topology, model: Model) -> StepConfig:
    p, t = spec.parallel, spec.training
    mesh = Mesh(tp=p.tp, cp=p.cp, dp=p.dp, pp=p.pp, order=parse_order(p.order))
    how: Any = tuple(p.layers_per_stage) if p.layers_per_stage is not None else p.pipeline_split
    layers = split_layers(model.num_layers, p.pp, how, p.vpp)
    return StepConfig(
        model=model, gpu=topology.gpu, mesh=mesh, schedule=spec.schedule, micro_batch_size=t.micro_batch_size,
        global_batch_size=t.global_batch_size, layers_per_stage=layers, vpp=p.vpp, recompute=t.recompute,
        precision=t.precision, sequence_parallel=p.sequence_parallel, zero_stage=p.zero_stage,
        tp_style=p.tp_style, attention=t.attention, grad_reduce=t.grad_reduce, grad_bucket_bytes=t.grad_bucket_size,
        zero3_fetch=t.zero3_fetch, scatter_gather=p.scatter_gather,
        dp_batch_split=tuple(t.dp_batch_split) if t.dp_batch_split is not None else None,
        capacity_bytes=topology.gpu.hbm_capacity,
    )


def _links(plan: StepPlan, priced: dict[tuple, PricedComm], topology: Topology, step_s: float,
           ranks: set[int], top: int = 12) -> list[dict[str, Any]]:
    runs: dict[tuple, int] = {}
    for op in plan.graph.ops:
        c = op.comm
        if c is not None and op.rank in ranks:
            key = (c.op, c.ranks, c.nbytes, c.axis)
            runs[key] = runs.get(key, 0) + c.count
    if not runs:
        return []
    # bytes per link, summed collective by collective in order (numpy: the same sums in the same order)
    ids = np.concatenate([np.fromiter(priced[key].link_bytes.keys(), dtype=np.int64,
                                      count=len(priced[key].link_bytes)) for key in runs])
    each = np.concatenate([np.fromiter(priced[key].link_bytes.values(), dtype=float,
                                       count=len(priced[key].link_bytes)) * count for key, count in runs.items()])
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
        pc = prediction.priced[(c.op, c.ranks, c.nbytes, c.axis)]
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


def _collectives(plan: StepPlan, priced: dict[tuple, PricedComm], ranks: set[int]) -> list[dict[str, Any]]:
    """The collectives of the simulated ranks, one row per (axis, op, size, group size, algorithm)."""
    rows: dict[tuple, dict[str, Any]] = {}
    for op in plan.graph.ops:
        c = op.comm
        if c is None or op.rank not in ranks:
            continue
        pc = priced[(c.op, c.ranks, c.nbytes, c.axis)]
        key = (pc.axis, pc.op, pc.nbytes, pc.num_ranks, pc.algorithm, pc.protocol, round(pc.time_s, 15))
        row = rows.setdefault(key, {"axis": pc.axis, "op": pc.op, "nbytes": pc.nbytes, "num_ranks": pc.num_ranks,
                                    "algorithm": pc.algorithm, "protocol": pc.protocol, "time_s": pc.time_s,
                                    "count": 0})
        row["count"] += c.count
    order = {"tp": 0, "cp": 1, "pp": 2, "dp": 3}
    return sorted(rows.values(), key=lambda r: (order.get(r["axis"], 9), r["op"], -r["nbytes"], r["time_s"]))


SIMULATE = ("auto", "representatives", "full")
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


def _simulate(cfg, topology: Topology, adjust: Adjust | None, full: bool):
    with _collector_paused():
        plan = build_step(cfg, full=full)
        priced = price_graph(plan.graph, topology, mesh=cfg.mesh, reduced_axes=plan.reduced_axes, adjust=adjust)
        trace = run_graph(plan.graph, capacity_of=capacity_of(topology),
                          capacities=lambda links: batch.link_capacities(topology, links))
    return plan, priced, trace


def predict_step(spec: ScenarioSpec, topology: Topology, *, source: str = "", base_dir: Path | None = None,
                 compute_efficiency: ComputeEfficiency | None = None, adjust: Adjust | None = None,
                 simulate: str = "auto") -> StepPrediction:
    """Predict one step; ``compute_efficiency`` and ``adjust`` apply a calibration (simdist calibrate).

    ``simulate``: ``representatives`` simulates one rank per pipeline stage (and per data-parallel replica
    where replicas differ), the others' traffic folded onto the shared links (simdist.predict.price);
    ``full`` every rank; ``auto`` representatives, switching to full (up to FULL_AUTO_MAX_OPS ops) where
    a collective's equivalent groups would not see the same bottleneck.
    """
    if simulate not in SIMULATE:
        raise LayoutError(f"unknown simulate mode '{simulate}'", field="--simulate",
                          fix=f"use one of: {', '.join(SIMULATE)}")
    model = resolve_model(spec.model, base_dir=base_dir)
    check_layout(model, spec, topology)
    cfg = step_config(spec, topology, model)
    if compute_efficiency is not None:
        cfg = dataclasses.replace(cfg, compute_efficiency=compute_efficiency)
    plan, priced, trace = _simulate(cfg, topology, adjust, full=simulate == "full")
    exact = class_symmetric(priced)
    full_ops = len(plan.graph.ops) * topology.num_gpus / max(1, len(plan.graph.ranks()))
    if simulate == "auto" and not exact and full_ops <= FULL_AUTO_MAX_OPS:
        plan, priced, trace = _simulate(cfg, topology, adjust, full=True)
        exact = True
    mode = "full" if plan.reduced_axes == () and topology.num_gpus > len(plan.representative_ranks) else "reduced"
    first_replica = sorted(r for (s, d), r in plan.stage_ranks.items() if d == min(d for _, d in plan.stage_ranks))
    tokens = spec.training.global_batch_size * (model.seq_length if model.kind == "decoder" else 1)
    metrics = step_metrics(plan.graph, trace, ranks=first_replica, tokens_per_step=tokens,
                           peak_flops=topology.gpu.peak_flops(spec.training.precision))
    memory = [{"stage": s, "rank": plan.stage_ranks[(s, min(d for _, d in plan.stage_ranks))], **m.as_dict()}
              for s, m in enumerate(plan.memory)]
    peak = max(m.total_bytes for m in plan.memory)
    p = spec.parallel
    reps = plan.representative_ranks
    simulated = len(plan.graph.ranks())
    if mode == "full":
        note = (f"simulated all {simulated} ranks; shown: the {len(first_replica)} rank(s) of data-parallel "
                "replica 0 with tensor/context-parallel coordinate 0")
    else:
        note = (f"simulated {simulated} representative rank(s) of {topology.num_gpus}: one per pipeline stage"
                + (" and data-parallel replica" if "dp" not in plan.reduced_axes and p.dp > 1 else "")
                + (f"; the other ranks along {'/'.join(plan.reduced_axes)} run the same ops at the same times and "
                   "their traffic shares the links with them" if plan.reduced_axes else ""))
        if not exact:
            note += ("; their equivalent groups do not all meet the same bottleneck (e.g. ECMP onto unequal "
                     "spines), so the reduction is approximate (simulate full to check)")
    result: dict[str, Any] = {
        "name": spec.name,
        "scenario": source,
        **metrics,
        "memory_per_gpu_bytes": peak,
        "fits_in_memory": all(m.fits for m in plan.memory),
        "memory": memory,
        "links": _links(plan, priced, topology, trace.makespan_s, set(first_replica)),
        "layout": {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "vpp": p.vpp, "num_gpus": topology.num_gpus,
                   "num_microbatches": cfg.microbatches(0), "schedule": spec.schedule,
                   "layers_per_stage": list(cfg.layers_per_stage), "order": "-".join(cfg.mesh.order),
                   "representative_ranks": reps, "simulated_ranks": simulated, "simulation": mode,
                   "reduction_exact": exact, "note": note},
        "model": {"name": model.name, "kind": model.kind, "num_params": model.num_params,
                  "num_layers": model.num_layers, "hidden_size": model.hidden_size},
        "collectives": _collectives(plan, priced, set(first_replica)),
    }
    return StepPrediction(result, plan, trace, priced, topology)
