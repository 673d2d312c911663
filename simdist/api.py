"""The public API and composition root: what the CLI, notebooks and tests call.

Each function takes what a user writes (preset names, file paths, ``key=value`` overrides) and returns
plain values; every input problem raises a `simdist.errors.SimdistError` with a one-line message.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simdist.errors import LayoutError, SimdistError, SpecError
from simdist.hardware import Topology, describe, load_topology, preset_names
from simdist.hardware.gpus import GPU_PRESETS
from simdist.hardware.presets import bundled_dir, topology_document
from simdist.spec import ScenarioSpec, TopologySpec
from simdist.spec.load import Document, read_yaml
from simdist.spec.load import validate as validate_spec  # `validate` is the API's (simdist validate)

__all__ = [
    "CollectiveRow",
    "RunOutput",
    "Scenario",
    "assumptions",
    "bundled_scenarios",
    "collective",
    "gpu_presets",
    "load_scenario",
    "load_topology",
    "run",
    "schema",
    "topology_presets",
    "topology_summary",
]


def topology_presets() -> list[dict[str, Any]]:
    """Name, description and size of every bundled topology preset."""
    out = []
    for name in preset_names():
        data = topology_document(name).data
        out.append({
            "name": name,
            "description": data.get("description", ""),
            "gpu": data.get("gpu") if isinstance(data.get("gpu"), str) else "inline",
            "gpus_per_node": data.get("gpus_per_node"),
        })
    return out


def gpu_presets() -> dict[str, dict[str, Any]]:
    """Every GPU preset as JSON-ready SI values."""
    return {name: spec.model_dump() for name, spec in GPU_PRESETS.items()}


def topology_summary(name_or_path: str, *, num_nodes: int | None = None,
                     assignments: list[str] | None = None) -> tuple[Topology, dict[str, Any]]:
    """Build a topology and describe it (counts, bandwidth per tier, bisection, example routes)."""
    topology = load_topology(name_or_path, num_nodes=num_nodes, assignments=assignments)
    return topology, describe(topology)


def schema(kind: str) -> dict[str, Any]:
    """JSON schema of an input file kind: ``topology``, ``scenario`` or ``calibration``."""
    from simdist.spec.calibration import CalibrationSpec

    models = {"topology": TopologySpec, "scenario": ScenarioSpec, "calibration": CalibrationSpec}
    if kind not in models:
        raise SpecError(f"unknown schema '{kind}'", fix=f"use one of: {', '.join(models)}")
    return models[kind].model_json_schema(mode="validation")


def bundled_scenarios() -> list[Path]:
    return sorted(bundled_dir("scenarios").glob("*.yaml"))


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario with its cluster built."""

    spec: ScenarioSpec
    topology: Topology
    source: str


def load_scenario(path: str | Path, assignments: list[str] | None = None) -> Scenario:
    """Read, override, validate a scenario and build its cluster; check the layout fits the cluster."""
    doc = read_yaml(path)
    if assignments:
        doc = doc.with_assignments(assignments)
    spec = validate_spec(ScenarioSpec, doc)
    cluster = doc.sub("cluster")
    overrides = Document(
        data={k: v for k, v in cluster.data.items() if k not in ("preset", "file")},
        source=cluster.source,
        lines=cluster.lines,
    )
    if spec.cluster.file is not None:
        target: str | Path = spec.cluster.file
        if not Path(target).is_absolute():
            target = Path(path).parent / target
    elif spec.cluster.preset is not None:
        target = spec.cluster.preset
    else:
        raise SpecError("no cluster given", field="cluster", source=doc.where(("cluster",)),
                        fix="add 'preset: dgx-h100' (see `simdist topo list`) or 'file: my-topology.yaml'")
    try:
        topology = load_topology(target, overrides=overrides)
    except SpecError as err:  # located in the scenario or the topology file; name the scenario field
        raise err.located(field_prefix="cluster") from None
    except SimdistError as err:  # unknown preset, disconnected cluster: name the scenario's field
        field = f"cluster.{err.field}" if err.field else "cluster.preset"
        where = doc.where(tuple(field.split(".")))
        raise type(err)(err.problem, field=field, source=where, fix=err.fix) from None
    _check_layout(spec, topology, doc)
    return Scenario(spec=spec, topology=topology, source=str(path))


def _check_layout(spec: ScenarioSpec, topology: Topology, doc: Document) -> None:
    p = spec.parallel
    if p.world_size != topology.num_gpus:
        others = p.tp * p.pp * p.cp
        hint = (f"set parallel.dp to {topology.num_gpus // others}" if topology.num_gpus % others == 0
                else f"make tp x pp x dp x cp equal {topology.num_gpus}, or change cluster.num_nodes")
        raise LayoutError(
            f"tp x pp x dp x cp = {p.tp} x {p.pp} x {p.dp} x {p.cp} = {p.world_size} GPUs, "
            f"but the cluster has {topology.num_gpus} ({topology.num_nodes} nodes x {topology.gpus_per_node})",
            field="parallel", source=doc.where(("parallel",)), fix=hint,
        )


@dataclass
class RunOutput:
    """A predicted step: the JSON result and the files written (empty without ``out_dir``)."""

    result: dict[str, Any]
    files: dict[str, Path]
    text: str
    num_ops: int = 0
    """Ops in the simulated op graph (its size drives the simulation's cost)."""


def run(path: str | Path, assignments: list[str] | None = None, *, out_dir: str | Path | None = None,
        strict: bool = False, calibration: str | Path | None = None, simulate: str = "auto") -> RunOutput:
    """Predict one training step of a scenario file (``simdist run``).

    Writes ``report.json``, ``trace.json`` (Chrome/Perfetto) and ``report.html`` into ``out_dir`` when
    given; every file is rendered in memory first, so a failure writes nothing. ``strict``: a layout that
    does not fit in memory is an error (exit 2) rather than a reported ``fits_in_memory: false``.
    ``calibration``: a calibration file (`calibrate`), else the scenario's ``calibration:`` field, if any.
    ``simulate``: auto | representatives | full (simdist.predict.step.predict_step).
    """
    from simdist.predict.step import link_counters, predict_step
    from simdist.report.step_table import render_text

    cal, cal_assignments = _scenario_calibration(path, assignments, calibration)
    scenario = load_scenario(path, [*cal_assignments, *(assignments or [])])
    prediction = predict_step(scenario.spec, scenario.topology, source=str(path), base_dir=Path(path).parent,
                              simulate=simulate,
                              **_calibration_hooks(cal, scenario.topology))
    result = prediction.result
    if strict and not result["fits_in_memory"]:
        worst = max(result["memory"], key=lambda m: m["total_bytes"])
        raise LayoutError(
            f"stage {worst['stage']} needs {worst['total_bytes'] / 2**30:.1f} GiB per GPU but the GPU has "
            f"{worst['capacity_bytes'] / 2**30:.1f} GiB",
            field="parallel", source=str(path),
            fix="raise tp or pp, enable recompute or sequence_parallel, or use a ZeRO stage")
    files: dict[str, Path] = {}
    if out_dir is not None:
        from simdist.report.step_html import step_report_html  # plotly: imported only when writing the report
        from simdist.report.step_trace import chrome_trace

        out = Path(out_dir)
        graph, trace = prediction.plan.graph, prediction.trace
        labels = {r: f"rank {r} (stage {s}, dp {d})" for (s, d), r in prediction.plan.stage_ranks.items()}
        rendered = {
            "report.json": json.dumps(result, indent=2, sort_keys=False) + "\n",
            "trace.json": json.dumps(chrome_trace(graph, trace, rank_labels=labels,
                                                  link_counters=link_counters(prediction))),
            "report.html": step_report_html(graph, trace, result),
        }
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SpecError(f"cannot create output directory {out}: {err.strerror}", field="--out",
                            fix="give a writable directory") from None
        for name, text in rendered.items():
            tmp = out / f".{name}.tmp"
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(out / name)
            files[name] = out / name
    return RunOutput(result=result, files=files, text=render_text(result), num_ops=len(prediction.plan.graph.ops))


def assumptions() -> list[dict[str, Any]]:
    """Every modelling assumption marked ``# Assumption:`` in the library and the bundled presets.

    A marked comment continues over the comment lines right below it.
    """
    import simdist

    tag = "# " + "Assumption:"  # split so that this line is not itself a match
    marker = re.compile(r"(?<![\"'`])" + re.escape(tag) + r"\s*(.*)")
    roots = [Path(simdist.__file__).parent, bundled_dir("topologies")]
    found: list[dict[str, Any]] = []
    for root in roots:
        for path in sorted([*root.rglob("*.py"), *root.rglob("*.yaml")]):
            if "_bundled" in path.relative_to(root).parts:
                continue  # the wheel's copy of the presets is listed once, from the presets folder
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines, start=1):
                m = marker.search(line)
                if not m:
                    continue
                text = [m.group(1).strip()]
                for follow in lines[number:]:
                    stripped = follow.strip()
                    if not stripped.startswith("#") or marker.search(follow) or stripped == "#":
                        break
                    text.append(stripped.lstrip("#").strip())
                found.append({"file": f"{root.name}/{path.relative_to(root)}", "line": number, "text": " ".join(text)})
    return found


# --------------------------------------------------------------------------- collectives
FIDELITIES = ("auto", "detailed", "fast")
# Assumption: above this many peers the detailed plan (one transfer per chunk per step) is replaced
# by the fast one where the algorithm has it; both agree where both run (tests).
DETAILED_MAX_PEERS = 64


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    """One simulated collective, reported as nccl-tests does (sizes and bandwidths)."""

    op: str
    nbytes: float
    num_ranks: int
    algorithm: str
    protocol: str
    fidelity: str
    time_s: float
    closed_form_s: float
    algbw_GBps: float
    busbw_GBps: float
    max_bytes_sent_per_rank: float
    max_bytes_received_per_rank: float
    busiest_links: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "bytes": self.nbytes, "num_ranks": self.num_ranks, "algorithm": self.algorithm,
            "protocol": self.protocol, "fidelity": self.fidelity, "time_s": self.time_s,
            "closed_form_s": self.closed_form_s, "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps,
            "max_bytes_sent_per_rank": self.max_bytes_sent_per_rank,
            "max_bytes_received_per_rank": self.max_bytes_received_per_rank,
            "busiest_links": list(self.busiest_links),
        }


def collective(
    cluster: str,
    op: str,
    num_ranks: int,
    sizes: list[float],
    *,
    algorithm: str = "auto",
    protocol: str = "auto",
    num_nodes: int | None = None,
    assignments: list[str] | None = None,
    fidelity: str = "auto",
    root: int = 0,
    calibration: str | Path | None = None,
) -> list[CollectiveRow]:
    """Simulate ``op`` over the first ``num_ranks`` GPUs of a cluster for every size.

    ``algorithm='auto'`` (and ``protocol='auto'``) take, per size, the pair with the least predicted
    time, as NCCL's tuner does; the chosen plan then runs in the engine. ``calibration``: a calibration
    file fitted for this cluster (`calibrate`): its overrides, latency and bandwidth corrections apply.
    """
    from simdist.analytic.select import evaluate, priced_request, rank_choices
    from simdist.collectives.group import Group
    from simdist.collectives.nccl_model import PROTOCOLS, supports
    from simdist.collectives.ops import busbw_Bps, op_info
    from simdist.collectives.registry import algorithm_for
    from simdist.collectives.request import Request
    from simdist.engine.simulate import simulate

    info = op_info(op)
    if fidelity not in FIDELITIES:
        raise SpecError(f"unknown fidelity '{fidelity}'", field="--fidelity",
                        fix=f"use one of: {', '.join(FIDELITIES)}")
    if protocol != "auto" and protocol not in PROTOCOLS:
        raise SpecError(f"unknown protocol '{protocol}'", field="--protocol",
                        fix=f"use auto or one of: {', '.join(PROTOCOLS)}")
    cal = _cluster_calibration(calibration, cluster)
    topology = load_topology(cluster, num_nodes=num_nodes, assignments=assignments,
                             overrides=cal.overrides_document() if cal is not None else None)
    group = Group.first(topology, num_ranks)
    if num_ranks < 2 and op != "barrier":
        raise SpecError(f"{op} needs at least 2 ranks", field="--ranks", fix="give --ranks 2 or more")
    if info.rooted and not 0 <= root < num_ranks:
        raise SpecError(f"root {root} is not one of the {num_ranks} ranks", field="--root",
                        fix=f"use a root in 0..{num_ranks - 1}")
    rows: list[CollectiveRow] = []
    for nbytes in sizes:
        if nbytes < 0 or (nbytes == 0 and op != "barrier"):
            raise SpecError(f"size {nbytes:g} must be positive", field="--bytes", fix="give sizes such as 8:8G:x2")
        request = Request(op, group, 0.0 if op == "barrier" else nbytes, root=root)
        protocols = PROTOCOLS if protocol == "auto" else (protocol,)
        if algorithm == "auto":
            choices = rank_choices(request, protocols=protocols)
            if not choices:
                raise SpecError(f"no algorithm implements {op} on this group", field="--op")
            choice = choices[0]
        else:
            algorithm_for(algorithm, request)  # validates op and applicability, with a clear message
            usable = [p for p in protocols if supports(algorithm, p)]
            if not usable:
                raise SpecError(f"algorithm '{algorithm}' does not run with protocol {protocol}", field="--protocol",
                                fix="use --protocol auto")
            choice = min((evaluate(request, algorithm, p) for p in usable), key=lambda c: c.predicted_s)
        algo = algorithm_for(choice.algorithm, request)
        priced = priced_request(request, choice.priced)
        use_fast = fidelity == "fast" or (fidelity == "auto" and group.size > DETAILED_MAX_PEERS)
        builder = algo.build_fast if use_fast and algo.build_fast is not None else algo.build
        plan = builder(priced)
        cost = choice.priced.cost
        plan = dataclasses.replace(plan, base_latency_s=plan.base_latency_s + cost.base_latency_s,
                                   rate_factor=cost.rate_factor, protocol=cost.name)
        correction = cal.correction(op) if cal is not None else None
        if correction is not None:  # t = latency + t_model / rate: simdist.calibrate.calibration.Correction
            plan = dataclasses.replace(plan, base_latency_s=plan.base_latency_s + correction.latency_s,
                                       rate_factor=plan.rate_factor * correction.rate(nbytes))
        run = simulate([(plan, priced.group)])[0]
        sent, received = plan.bytes_sent(), plan.bytes_received()
        busiest = sorted(run.link_bytes.items(), key=lambda kv: -kv[1])[:5]
        rows.append(CollectiveRow(
            op=op, nbytes=nbytes, num_ranks=num_ranks, algorithm=choice.algorithm, protocol=choice.protocol,
            fidelity="fast" if builder is algo.build_fast else "detailed", time_s=run.time_s,
            closed_form_s=correction.time_s(choice.predicted_s, nbytes) if correction else choice.predicted_s,
            algbw_GBps=(nbytes / run.time_s / 1e9) if run.time_s > 0 else 0.0,
            busbw_GBps=(busbw_Bps(op, num_ranks, nbytes, run.time_s) / 1e9) if run.time_s > 0 else 0.0,
            max_bytes_sent_per_rank=max(sent), max_bytes_received_per_rank=max(received),
            busiest_links=tuple(_link_load(topology, link, b, run.time_s) for link, b in busiest),
        ))
    return rows


def _link_load(topology: Topology, link_id: int, nbytes: float, time_s: float) -> dict[str, Any]:
    link = topology.link(link_id)
    return {"link": link_id, "src": link.src, "dst": link.dst, "kind": link.kind, "bytes": nbytes,
            "utilization": nbytes / (link.effective_bandwidth_Bps * time_s) if time_s > 0 else 0.0}


def collective_curves(cluster: str, op: str, num_ranks: int, sizes: list[float], *, skip: set[str],
                      **options: Any) -> dict[str, list[CollectiveRow]]:
    """A sweep per algorithm that can run ``op`` on this group (for charts), except those in ``skip``."""
    from simdist.collectives.group import Group
    from simdist.collectives.registry import candidates
    from simdist.collectives.request import Request

    topology = load_topology(cluster, num_nodes=options.get("num_nodes"), assignments=options.get("assignments"))
    request = Request(op, Group.first(topology, num_ranks), sizes[0], root=options.get("root", 0))
    out: dict[str, list[CollectiveRow]] = {}
    for algo in candidates(request):
        if algo.name not in skip:
            out[algo.name] = collective(cluster, op, num_ranks, sizes, algorithm=algo.name, **options)
    return out


def curves_for_report(series: dict[str, list[CollectiveRow]]) -> list[Any]:
    """Convert sweeps to the report's curve type (keeps report free of api types)."""
    from simdist.report.collective_html import Curve, CurvePoint

    return [Curve.of(name, [CurvePoint(r.nbytes, r.time_s, r.busbw_GBps * 1e9) for r in rows])
            for name, rows in series.items()]


def compare_rows(series: dict[str, list[CollectiveRow]], measured: list[Any]) -> list[dict[str, Any]]:
    """Predicted vs measured busbw at each measured size (the first series, nearest size)."""
    rows = next(iter(series.values()))
    out = []
    for m in measured:
        if not rows:
            break
        best = min(rows, key=lambda r: abs(r.nbytes - m.nbytes))
        if abs(best.nbytes - m.nbytes) > 0.01 * m.nbytes:
            continue
        out.append({
            "bytes": m.nbytes, "measured_busbw_GBps": m.busbw_Bps / 1e9, "predicted_busbw_GBps": best.busbw_GBps,
            "error_pct": 100.0 * (best.busbw_GBps - m.busbw_Bps / 1e9) / (m.busbw_Bps / 1e9) if m.busbw_Bps else 0.0,
        })
    return out


# --------------------------------------------------------------------------- pipeline bubble and schedules
# (issue 4: `simdist bubble`, `simdist schedule`; keep this section contiguous)
_BUBBLE_FLAGS = {"schedule": "--schedule", "parallel.pp": "--stages", "parallel.vpp": "--virtual",
                 "training.global_batch_size": "--microbatches"}


def _pipeline_costs(num_stages: int, forward_s: float, backward_s: float, stage_times: list[float] | None,
                    p2p_s: float) -> Any:
    """Uniform costs, or per-stage forward times (each stage's backward keeps the backward/forward ratio)."""
    import math

    from simdist.plan.pipeline import UniformCosts

    for flag, value in (("--forward-time", forward_s), ("--backward-time", backward_s)):
        if not (math.isfinite(value) and value > 0):
            raise SpecError(f"time {value:g} must be a positive number of seconds", field=flag, fix="e.g. 1")
    if not (math.isfinite(p2p_s) and p2p_s >= 0):
        raise SpecError(f"p2p time {p2p_s:g} must be >= 0", field="--p2p-time", fix="give 0 or more seconds")
    if stage_times is None:
        return UniformCosts.uniform(num_stages, forward_s, backward_s, p2p_s=p2p_s)
    if len(stage_times) != num_stages or not all(math.isfinite(t) and t > 0 for t in stage_times):
        raise SpecError(f"{len(stage_times)} stage times for {num_stages} stages", field="--stage-times",
                        fix=f"give {num_stages} positive forward times, e.g. {','.join(['1'] * num_stages)}")
    ratio = backward_s / forward_s
    return UniformCosts(tuple(stage_times), tuple(t * ratio for t in stage_times), p2p_s=p2p_s)


def _check_pipeline(schedule: str, num_stages: int, num_microbatches: int, vpp: int) -> None:
    """simdist.plan.schedule's checks, with the CLI flags as field names."""
    from simdist.plan.schedule import check_schedule

    try:
        check_schedule(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp)
    except SpecError as err:
        raise SpecError(err.problem, field=_BUBBLE_FLAGS.get(err.field or "", err.field), fix=err.fix) from None


def _pipeline_run(schedule: str, *, num_stages: int, num_microbatches: int, vpp: int, forward_s: float,
                  backward_s: float, stage_times: list[float] | None, p2p_s: float) -> tuple[Any, Any, Any]:
    from simdist.engine.graph import run_graph
    from simdist.plan.pipeline import pipeline_graph

    _check_pipeline(schedule, num_stages, num_microbatches, vpp)
    costs = _pipeline_costs(num_stages, forward_s, backward_s, stage_times, p2p_s)
    graph = pipeline_graph(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp, costs=costs)
    return costs, graph, run_graph(graph)


def bubble(schedule: str, *, num_stages: int, num_microbatches: int, vpp: int = 1, forward_s: float = 1.0,
           backward_s: float = 2.0, stage_times: list[float] | None = None, p2p_s: float = 0.0) -> dict[str, Any]:
    """Simulate one pipeline step of ``schedule`` and compare its bubble with the closed form.

    ``forward_s``/``backward_s`` are a whole stage's times per micro-batch (a chunk takes 1/vpp of them);
    ``stage_times`` replaces the forward time per stage (backward scales with it); ``p2p_s`` is one send.
    """
    from simdist.plan.schedule import bubble_formula, bubble_formula_text
    from simdist.report.bubble import simulated_bubble

    costs, graph, trace = _pipeline_run(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp,
                                        forward_s=forward_s, backward_s=backward_s, stage_times=stage_times,
                                        p2p_s=p2p_s)
    fraction = simulated_bubble(graph, trace)
    # Assumption: with uneven stages the formula is evaluated at the mean stage times (it assumes uniform ones).
    mean_f = sum(costs.forward_s) / num_stages
    mean_b = sum(costs.backward_s) / num_stages
    return {
        "schedule": schedule, "stages": num_stages, "microbatches": num_microbatches, "virtual": vpp,
        "bubble_fraction": fraction,
        "formula": bubble_formula(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp,
                                  forward_s=mean_f, backward_s=mean_b,
                                  weight_grad_share=costs.weight_grad_share),
        "formula_text": bubble_formula_text(schedule),
        "utilization": 1.0 - fraction,
        "makespan_s": trace.makespan_s,
        "forward_s": list(costs.forward_s), "backward_s": list(costs.backward_s), "p2p_s": p2p_s,
    }


def microbatch_range(text: str) -> list[int]:
    """``1:64`` (inclusive), ``4:64:4`` (with a step) or ``1,2,4,8`` as a list of micro-batch counts."""
    where = {"field": "--sweep-microbatches", "fix": "write e.g. 1:64, 4:64:4 or 1,2,4,8"}
    try:
        if ":" in text:
            parts = [int(p) for p in text.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            step = parts[2] if len(parts) == 3 else 1
            values = list(range(parts[0], parts[1] + 1, step)) if step > 0 else []
        else:
            values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise SpecError(f"cannot read micro-batch counts '{text}'", **where) from None
    if not values or min(values) < 1:
        raise SpecError(f"'{text}' gives no micro-batch counts >= 1", **where)
    return values


def bubble_sweep(schedule: str, *, num_stages: int, microbatches: list[int], vpp: int = 1,
                 **costs: Any) -> list[dict[str, Any]]:
    """`bubble` for each micro-batch count (interleaved_1f1b keeps the multiples of the stage count)."""
    counts = list(microbatches)
    _check_pipeline(schedule, num_stages, num_stages, vpp)
    if schedule == "interleaved_1f1b":
        counts = [m for m in counts if m % num_stages == 0]
        if not counts:
            raise SpecError(f"no micro-batch count in the sweep is a multiple of the {num_stages} stages",
                            field="--sweep-microbatches", fix=f"sweep e.g. {num_stages}:{num_stages * 16}")
    return [bubble(schedule, num_stages=num_stages, num_microbatches=m, vpp=vpp, **costs) for m in counts]


def schedule_grid(schedule: str, *, num_stages: int, num_microbatches: int, vpp: int = 1, forward_s: float = 1.0,
                  backward_s: float = 2.0, stage_times: list[float] | None = None, p2p_s: float = 0.0) -> str:
    """The simulated timeline of ``schedule`` as a stage x time-slot text grid (see simdist.report.schedule_text)."""
    from simdist.report.schedule_text import schedule_grid_text

    _, graph, trace = _pipeline_run(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp,
                                    forward_s=forward_s, backward_s=backward_s, stage_times=stage_times,
                                    p2p_s=p2p_s)
    return schedule_grid_text(graph, trace)


# --------------------------------------------------------------------------- notebook helpers
# (issue 8: what the teaching notebooks under notebooks/ call; keep this section contiguous)
def run_collective_on_data(op: str, inputs: list[list[float]], algorithm: str = "ring", *, cluster: str = "dgx-h100",
                           num_nodes: int | None = None, assignments: list[str] | None = None,
                           root: int = 0) -> list[list[float]]:
    """Run ``algorithm``'s plan of ``op`` on real numbers: ``inputs[r]`` is rank r's send buffer; returns
    each rank's receive buffer (sums for the reducing ops; layouts in `simdist.collectives.numeric`).

    The plan is the one the simulator times, built on the first ``len(inputs)`` GPUs of ``cluster``
    (``num_nodes`` defaults to as many nodes as the ranks need), so this shows what that plan computes.
    """
    import math

    import numpy as np

    from simdist.collectives.group import Group
    from simdist.collectives.numeric import run_plan
    from simdist.collectives.ops import op_info
    from simdist.collectives.registry import algorithm_for
    from simdist.collectives.request import Request

    op_info(op)
    if op == "barrier":
        raise SpecError("a barrier moves no data", field="op", fix="use a data-moving op, e.g. all_reduce")
    p = len(inputs)
    if p < 2:
        raise SpecError(f"{p} rank(s) given", field="inputs", fix="give one list of values per rank, 2 ranks or more")
    try:
        arrays = [np.asarray(x, dtype=float) for x in inputs]
    except (TypeError, ValueError):
        raise SpecError("inputs must be lists of numbers", field="inputs", fix="e.g. [[0, 1], [1, 2]]") from None
    n = len(arrays[0])
    if any(a.ndim != 1 or len(a) != n for a in arrays) or n == 0:
        raise SpecError("every rank needs the same number of values (at least one)", field="inputs",
                        fix="give equally long flat lists, one per rank")
    if not all(np.isfinite(a).all() for a in arrays):
        raise SpecError("inputs hold a non-finite value", field="inputs", fix="give finite numbers")
    if op in ("reduce_scatter", "scatter", "all_to_all") and n % p:
        raise SpecError(f"{op} cuts each buffer into {p} equal blocks, but it holds {n} values", field="inputs",
                        fix=f"give a multiple of {p} values per rank")
    topology = load_topology(cluster, assignments=assignments)
    if num_nodes is None and p > topology.num_gpus:
        num_nodes = math.ceil(p / topology.gpus_per_node)
    if num_nodes is not None:
        topology = load_topology(cluster, num_nodes=num_nodes, assignments=assignments)
    full = n * p if op in ("all_gather", "gather") else n
    # Assumption: float32 values size the plan (pieces and chunk counts); the numbers do not depend on it.
    request = Request(op, Group.first(topology, p), 4.0 * full, root=root)
    plan = algorithm_for(algorithm, request).build(request)
    return [out.tolist() for out in run_plan(plan, arrays)]


def lecture_mlp_spec(*, tp: int = 1, dp: int = 1, pp: int = 1, batch: int = 128, hidden: int = 1024,
                     layers: int = 4, microbatches: int = 1, schedule: str = "1f1b",
                     precision: str = "fp32") -> dict[str, Any]:
    """A scenario (as a dict, for `run_spec`) of the lecture's MLP cut over tp x dp x pp GPUs of one DGX H100
    node cut down to that many GPUs (one CPU socket, one PCIe switch, one NIC per GPU), column-parallel TP.

    ``batch`` is the global batch; each data-parallel rank runs ``microbatches`` micro-batches of
    batch / (dp x microbatches) rows.
    """
    rows, left = divmod(batch, dp * microbatches)
    if left or rows < 1:
        raise SpecError(f"batch {batch} does not split into {dp} ranks x {microbatches} micro-batches",
                        field="batch", fix=f"give a batch that is a multiple of {dp * microbatches}")
    gpus = tp * dp * pp
    model: dict[str, Any] = ({"preset": "cs336-mlp"} if (hidden, layers) == (1024, 4)
                             else {"kind": "mlp", "num_layers": layers, "hidden_size": hidden})
    return {
        "name": f"lecture MLP tp{tp} dp{dp} pp{pp}",
        "cluster": {"preset": "dgx-h100", "gpus_per_node": gpus,
                    "host": {"cpu_sockets": 1, "pcie_switches_per_socket": 1},
                    "inter_node": {"nics_per_node": gpus}},
        "model": model,
        "parallel": {"tp": tp, "dp": dp, "pp": pp, "tp_style": "column"},
        "training": {"micro_batch_size": rows, "global_batch_size": batch, "precision": precision},
        "schedule": schedule,
    }


def run_spec(spec: dict[str, Any], assignments: list[str] | None = None, *, out_dir: str | Path | None = None,
             strict: bool = False) -> RunOutput:
    """`run` on a scenario given as a dict (written to a temporary YAML file, then read like any file)."""
    import tempfile

    import yaml

    if not isinstance(spec, dict):
        raise SpecError(f"a scenario dict is needed, got {type(spec).__name__}", field="spec",
                        fix="pass a dict such as lecture_mlp_spec(tp=4)")
    with tempfile.TemporaryDirectory(prefix="simdist-spec-") as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
        return run(path, assignments, out_dir=out_dir, strict=strict)


def collective_chart(series: dict[str, list[CollectiveRow]], title: str = "Collective cost vs size") -> Any:
    """The busbw and time vs size figure (plotly) of `collective_curves`' sweeps, regions marked."""
    from simdist.report.collective_html import collective_figure

    return collective_figure(curves_for_report(series), title=title)


def bubble_chart(rows: list[dict[str, Any]], title: str = "Pipeline bubble vs micro-batches") -> Any:
    """Simulated bubble and its formula against micro-batches (plotly), from `bubble_sweep`'s rows."""
    from simdist.report.bubble_html import bubble_figure

    return bubble_figure(rows, title)


def pipeline_timeline(schedule: str, *, num_stages: int, num_microbatches: int, vpp: int = 1,
                      forward_s: float = 1.0, backward_s: float = 2.0, stage_times: list[float] | None = None,
                      p2p_s: float = 0.0, title: str | None = None) -> Any:
    """The simulated pipeline (the one `bubble` measures) as a plotly Gantt chart, one row per stage."""
    from simdist.report.step_html import timeline_figure

    _, graph, trace = _pipeline_run(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp,
                                    forward_s=forward_s, backward_s=backward_s, stage_times=stage_times,
                                    p2p_s=p2p_s)
    return timeline_figure(graph, trace, title=title or f"{schedule}: {num_stages} stages, {num_microbatches} "
                                                        f"micro-batches")


def rank_values_chart(stages: dict[str, list[list[float]]], title: str = "what each rank holds") -> Any:
    """Heatmaps (rank x element, values written in) of each named stage of a worked example."""
    from simdist.report.notebook_figures import rank_values_figure

    return rank_values_figure(stages, title)


def line_chart(x: list[float], series: dict[str, list[float]], *, title: str, x_title: str, y_title: str,
               log_x: bool = False, log_y: bool = False, y_format: str | None = None,
               dashed: list[str] | tuple[str, ...] = ()) -> Any:
    """A plotly line chart of sweeps (``dashed``: series drawn as dashed lines, e.g. a formula)."""
    from simdist.report.notebook_figures import line_figure

    return line_figure(x, series, title=title, x_title=x_title, y_title=y_title, log_x=log_x, log_y=log_y,
                       y_format=y_format, dashed=dashed)


def bar_chart(categories: list[str], series: dict[str, list[float]], *, title: str, y_title: str,
              stacked: bool = False, y_format: str | None = None) -> Any:
    """A plotly grouped (or stacked) bar chart."""
    from simdist.report.notebook_figures import bar_figure

    return bar_figure(categories, series, title=title, y_title=y_title, stacked=stacked, y_format=y_format)


MEASUREMENT_DIRS = ("validation/reference", "tests/data")  # relative to the source checkout


def measurement_file(name: str) -> Path:
    """The path of a committed measurement file, by name: ``validation/reference/NAME`` (measured reference
    data) or ``tests/data/NAME`` (nccl-tests samples), whatever the working directory: from the installed
    wheel (which bundles both folders) or else the source checkout."""
    from importlib import resources

    bundled = Path(str(resources.files("simdist"))) / "_bundled" / "measurements"
    root = bundled if bundled.is_dir() else Path(__file__).resolve().parents[1]
    for folder in MEASUREMENT_DIRS:
        path = root / folder / name
        if path.is_file():
            return path
    known = sorted(p.name for folder in MEASUREMENT_DIRS if (root / folder).is_dir()
                   for p in (root / folder).iterdir() if p.suffix in (".csv", ".txt", ".json"))
    raise SpecError(f"no measurement file '{name}' in {' or '.join(MEASUREMENT_DIRS)}", field="name",
                    fix=f"use one of: {', '.join(known)}" if known else "run from a source checkout of simdist")


def read_step_measurements(path: str | Path) -> list[dict[str, Any]]:
    """The rows of an MLP step CSV (``python -m validation.mlp``'s output) as dicts: ``cut``, ``world_size``,
    ``time_s`` (median of the per-step maximum over ranks), ... (schema: simdist.calibrate.steps)."""
    from simdist.calibrate.steps import read_step_measurements as read_steps

    return [dataclasses.asdict(m) for m in read_steps(path)]


def search_heatmap(out: SearchOutput) -> Any:
    """The search report's tp x pp heatmap (plotly) of the best closed-form tokens/s of a `search`."""
    from simdist.report.search_html import heatmap_figure

    return heatmap_figure(out.doc["ranked"])


def search_pareto(out: SearchOutput) -> Any:
    """The search report's memory per GPU vs tokens/s scatter with its Pareto front (plotly), of a `search`."""
    from simdist.report.search_html import pareto_figure

    return pareto_figure(out.doc["ranked"])


def compare_chart(result: dict[str, Any], title: str | None = None) -> Any:
    """Days, cost and energy to train per cluster (plotly bars), from `compare`'s result."""
    from simdist.report.notebook_figures import compare_figure

    return compare_figure(result["rows"], title or f"{result['model']} on {result['gpus']} GPUs: "
                                                   f"{result['tokens']:.3g} tokens, best layout per cluster")


def validation_chart(result: dict[str, Any], title: str | None = None) -> Any:
    """Measured vs calibrated and uncalibrated predictions, with their errors (plotly), from `validate`'s result."""
    from simdist.report.notebook_figures import prediction_figure

    mape, uncal = result["mape_pct"]["all"], result["uncalibrated_mape_pct"]["all"]
    return prediction_figure(result["rows"], title or (
        f"{result['topology']}, holdout {result['holdout']}: MAPE {mape:.1f} % calibrated, {uncal:.1f} % uncalibrated"))


# --------------------------------------------------------------------------- calibration and validation
# (issue 5 parts 3-4: `simdist calibrate`, `simdist validate`, `--calibration`; keep this section contiguous)
HOLDOUT_HELP = "sizes (every other size of each sweep), large (the largest third), ranks (the largest rank count), none"


def _cluster_calibration(calibration: str | Path | None, cluster: str | Path, *, field: str = "--cluster") -> Any:
    """The calibration file loaded and checked against the cluster's topology name (None: no calibration)."""
    if calibration is None:
        return None
    from simdist.calibrate.calibration import load_calibration

    cal = load_calibration(calibration)
    name = topology_document(cluster).data.get("name", str(cluster))
    cal.check_topology(str(name), field=field)
    return cal


def _scenario_calibration(path: str | Path, assignments: list[str] | None,
                          calibration: str | Path | None) -> tuple[Any, list[str]]:
    """(calibration, its overrides as ``cluster.*`` assignments) of a scenario: ``calibration`` if given, else the
    scenario's ``calibration:`` field (relative to the scenario file). The scenario's own cluster fields win."""
    doc = read_yaml(path)
    if assignments:
        doc = doc.with_assignments(assignments)
    data = doc.data
    if calibration is None and data.get("calibration"):
        calibration = Path(str(data["calibration"]))
        if not calibration.is_absolute():
            calibration = Path(path).parent / calibration
    if calibration is None:
        return None, []
    cluster = data.get("cluster") if isinstance(data.get("cluster"), dict) else {}
    target: str | Path | None = cluster.get("preset")
    if cluster.get("file"):
        target = Path(str(cluster["file"]))
        target = target if target.is_absolute() else Path(path).parent / target
    if target is None:
        return None, []  # load_scenario reports the missing cluster
    cal = _cluster_calibration(calibration, target, field="cluster.preset")
    return cal, cal.assignments("cluster", keep=cluster)


def _calibration_hooks(cal: Any, topology: Topology) -> dict[str, Any]:
    """predict_step's keyword arguments that apply a calibration."""
    if cal is None:
        return {}
    return {"compute_efficiency": cal.compute_efficiency(topology.gpu), "adjust": cal.adjust()}


def read_measurement_files(paths: list[str | Path]) -> tuple[list[Any], list[Any]]:
    """(collective measurements, MLP step measurements) of the files, each format detected."""
    import csv

    from simdist.calibrate.measurements import read_measurements
    from simdist.calibrate.steps import STEP_CSV_COLUMNS, read_step_measurements

    if not paths:
        raise SpecError("no measurement files given", field="MEASUREMENTS",
                        fix="pass our CSV, nccl-tests output (text or -J JSON) or an MLP step CSV")
    collectives: list[Any] = []
    steps: list[Any] = []
    for path in paths:
        p = Path(path)
        first = ""
        if p.is_file():
            lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
            first = next((ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")), "")
        header = {h.strip() for h in next(csv.reader([first]))} if first else set()
        if {"cut", "world_size"} <= header and set(STEP_CSV_COLUMNS) & header:
            steps += read_step_measurements(p)
        else:
            collectives += read_measurements(p)
    return collectives, steps


def calibrate(paths: list[str | Path], topology: str, *, num_nodes: int | None = None, out: str | Path | None = None,
              holdout: str = "none", seed: int = 0) -> dict[str, Any]:
    """Fit a calibration of ``topology`` to measurement files (`simdist calibrate`); write it to ``out`` (YAML).

    Returns ``{"calibration": the file's content as JSON, "yaml": its text, "out": the path or None}``.
    """
    from simdist.calibrate.calibration import fit_calibration, to_yaml

    topology_document(topology)  # an unknown preset: one clear error before reading anything
    measurements, steps = read_measurement_files(paths)
    spec = fit_calibration(measurements, topology, num_nodes=num_nodes, steps=steps, holdout=holdout, seed=seed,
                           sources=[str(p) for p in paths])
    text = to_yaml(spec)
    if out is not None:
        _write_text(Path(out), text, field="--out")
    return {"calibration": spec.model_dump(mode="json", exclude_none=True), "yaml": text,
            "out": str(out) if out is not None else None}


def _write_text(path: Path, text: str, *, field: str) -> None:
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise SpecError(f"folder {directory} does not exist", field=field, fix="create it or pick another path")
    tmp = directory / f".{path.name}.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _mapes(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    from simdist.calibrate.fit import mape_pct

    ops = sorted({r["op"] for r in rows})
    return {"all": mape_pct([r[key] for r in rows], [r["measured_s"] for r in rows]) if rows else None,
            "per_op": {op: mape_pct([r[key] for r in rows if r["op"] == op],
                                    [r["measured_s"] for r in rows if r["op"] == op]) for op in ops}}


def validate(paths: list[str | Path], calibration: str | Path, *, holdout: str = "sizes",
             html: str | Path | None = None) -> dict[str, Any]:
    """Fit on part of the measurements, predict the rest (`simdist validate`).

    The topology is the calibration file's. ``holdout`` (see `HOLDOUT_HELP`) selects the points to predict;
    they are predicted by a calibration fitted on the others (``predicted_s``), by the preset uncalibrated
    (``uncalibrated_s``) and by the given file (``file_s``). With ``none`` every point is predicted by the file.
    """
    import math

    from simdist.calibrate import calibration as cb
    from simdist.calibrate.fit import mape_pct

    cal = cb.load_calibration(calibration)
    measurements, _ = read_measurement_files(paths)
    if not measurements:
        raise SpecError("no collective measurements to validate", field="MEASUREMENTS",
                        fix="pass our CSV or nccl-tests output")
    name = cal.spec.topology
    points = cb.aggregate(measurements)
    train, test = cb.split_holdout(points, holdout)
    if holdout == "none":
        fitted, test = cal, points
    else:
        fitted = cb.Calibration.of(cb.fit_calibration(measurements, name, holdout=holdout))
    base = cb.build_cluster(name, points)
    tuned = cb.build_cluster(name, points, overrides=fitted.spec.overrides)
    as_file = cb.build_cluster(name, points, overrides=cal.spec.overrides)
    predicted = cb.calibrated_times(fitted, tuned, test)
    uncal = cb.predict_points(base, test)
    by_file = cb.calibrated_times(cal, as_file, test)
    rows = []
    for p, t, u, f in zip(test, predicted, uncal, by_file, strict=True):
        rows.append({"op": p.op, "num_ranks": p.num_ranks, "num_nodes": p.num_nodes, "nbytes": p.nbytes,
                     "measured_s": p.time_s, "predicted_s": float(t), "uncalibrated_s": float(u), "file_s": float(f),
                     "error_pct": 100.0 * (t - p.time_s) / p.time_s,
                     "uncalibrated_error_pct": 100.0 * (u - p.time_s) / p.time_s})
    result: dict[str, Any] = {
        "topology": name, "calibration": str(calibration), "holdout": holdout,
        "fit_points": len(train) if holdout != "none" else 0, "predicted_points": len(rows), "rows": rows,
        "mape_pct": _mapes(rows, "predicted_s"), "uncalibrated_mape_pct": _mapes(rows, "uncalibrated_s"),
        "calibration_file_mape_pct": _mapes(rows, "file_s"),
    }
    if html is not None:
        from simdist.report.validate_html import ValidateSeries, validate_figure_html

        series = []
        for key in sorted({p.series for p in points}, key=str):
            pts = sorted((p for p in points if p.series == key), key=lambda p: p.nbytes)
            lo, hi = math.log2(pts[0].nbytes), math.log2(pts[-1].nbytes)
            grid = [cb.Point(key[0], key[1], key[2], 2.0 ** (lo + (hi - lo) * i / 24), 1.0, key[3], "grid")
                    for i in range(25)]
            model = cb.predict_points(tuned, grid)
            corr, info = fitted.correction(key[0]), fitted.spec.fit.collectives.get(key[0])
            curve = cb.calibrated_times(fitted, tuned, grid)
            band_lo, band_hi = curve, curve
            if corr is not None and info is not None:
                fast = cb.Correction(info.latency_ci[0], info.bandwidth_factor_ci[1], corr.knots_log2, corr.values)
                slow = cb.Correction(info.latency_ci[1], info.bandwidth_factor_ci[0], corr.knots_log2, corr.values)
                band_lo = [fast.time_s(float(m), g.nbytes) for m, g in zip(model, grid, strict=True)]
                band_hi = [slow.time_s(float(m), g.nbytes) for m, g in zip(model, grid, strict=True)]
            held = {id(p) for p in test} if holdout != "none" else set()
            sizes = [g.nbytes for g in grid]
            series.append(ValidateSeries(
                label=f"{key[0]}, {key[1]} ranks" + (f" on {key[2]} nodes" if key[2] else ""),
                fitted=tuple((p.nbytes, p.time_s) for p in pts if id(p) not in held),
                heldout=tuple((p.nbytes, p.time_s) for p in pts if id(p) in held),
                curve=tuple(zip(sizes, map(float, curve), strict=True)),
                band_low=tuple(zip(sizes, map(float, band_lo), strict=True)),
                band_high=tuple(zip(sizes, map(float, band_hi), strict=True)),
                uncalibrated=tuple(zip(sizes, map(float, cb.predict_points(base, grid)), strict=True))))
        mape = result["mape_pct"]["all"]
        title = (f"{name}: measured vs calibrated prediction (holdout {holdout}; MAPE {mape:.1f} %, "
                 f"uncalibrated {mape_pct(uncal, [p.time_s for p in test]):.1f} %)")
        _write_text(Path(html), validate_figure_html(series, title=title), field="--html")
        result["html"] = str(html)
    return result


# --------------------------------------------------------------------------- layout search and hardware comparison
# (issue 7: `simdist search`, `simdist compare`; keep this section contiguous)
@dataclass
class SearchOutput:
    """A layout search: the JSON document, its text table, and the files written."""

    doc: dict[str, Any]
    text: str
    files: dict[str, Path]
    interrupted: bool


def search(model: str, cluster: str, gpus: int, global_batch_size: int, *, seq_length: int | None = None,
           precision: str = "bf16", max_tp: int | None = None, max_pp: int = 64, max_cp: int = 2, max_vpp: int = 4,
           max_micro_batch: int = 8, schedules: tuple[str, ...] = ("1f1b", "interleaved_1f1b"), top_k: int = 3,
           workers: int = 1, dask: Any = None, results_file: str | Path | None = None,
           html: str | Path | None = None, explain_pruned: bool = False, rows: int = 10,
           on_total: Any = None, on_progress: Any = None) -> SearchOutput:
    """Rank every feasible layout of ``model`` on ``gpus`` GPUs of ``cluster`` (``simdist search``).

    The closed form (simdist.analytic.step) ranks them; the engine re-simulates the ``top_k``. ``dask``: a
    scheduler address (or a distributed.Client) to evaluate on; ``results_file``: JSON lines written as results
    arrive and read back to resume.
    """
    from simdist.report.search_html import search_report_html
    from simdist.report.search_table import search_text
    from simdist.search.compare import size_cluster
    from simdist.search.executors import make_executor
    from simdist.search.rank import run_search
    from simdist.search.space import SearchProblem

    if gpus < 1:
        raise SpecError(f"--gpus {gpus} must be at least 1", field="--gpus", fix="give e.g. 1024")
    if top_k < 0:
        raise SpecError(f"--top {top_k} must be >= 0", field="--top", fix="give e.g. 3")
    size = size_cluster(cluster, gpus) if cluster in _preset_set() else None
    if size is None:
        raise SpecError(f"unknown cluster '{cluster}'", field="--cluster",
                        fix=f"use a preset from: {', '.join(preset_names())}")
    if size.note:
        raise LayoutError(f"{gpus} GPUs do not fill whole nodes of {cluster} ({size.gpus_per_node} GPUs per node)",
                          field="--gpus", fix=f"use a multiple of {size.gpus_per_node}, e.g. {size.num_gpus}")
    problem = SearchProblem(model=model, cluster=cluster, num_nodes=size.num_nodes,
                            global_batch_size=global_batch_size, seq_length=seq_length, precision=precision,
                            max_tp=max_tp, max_pp=max_pp, max_cp=max_cp, max_vpp=max_vpp,
                            max_micro_batch=max_micro_batch, schedules=tuple(schedules))
    with make_executor(workers=workers, dask=dask) as executor:
        outcome = run_search(problem, executor, top_k=top_k,
                             results_file=Path(results_file) if results_file is not None else None,
                             on_total=on_total, on_progress=on_progress)
    doc = outcome.to_dict(explain_pruned=explain_pruned)
    text = search_text(doc, top=rows, explain_pruned=explain_pruned)
    files: dict[str, Path] = {}
    if html is not None:
        w = outcome.winner
        page = search_report_html(doc, winner_graph=w.plan.graph if w else None, winner_trace=w.trace if w else None,
                                  winner_result=w.result if w else None, table_text=text)
        target = Path(html)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(page, encoding="utf-8")
            tmp.replace(target)
        except OSError as err:
            raise SpecError(f"cannot write {target}: {err.strerror}", field="--html",
                            fix="give a writable path") from None
        files["html"] = target
    return SearchOutput(doc, text, files, outcome.interrupted)


def _preset_set() -> set[str]:
    return set(preset_names())


def compare(model: str, clusters: list[str], gpus: int, tokens: float, *, global_batch_size: int = 1536,
            prices: list[str] | None = None, pue: float = 1.0, seq_length: int | None = None, precision: str = "bf16",
            workers: int = 1, dask: Any = None) -> dict[str, Any]:
    """Best layout per cluster, time, cost and energy to train ``tokens`` tokens (``simdist compare``)."""
    from simdist.search.compare import compare_clusters, parse_prices
    from simdist.search.executors import make_executor

    names = [c.strip() for c in clusters if c.strip()]
    if not names:
        raise SpecError("no cluster given", field="--clusters", fix="give e.g. dgx-a100,dgx-h100,gb200-nvl72")
    price_map = parse_prices(prices or [], names)
    with make_executor(workers=workers, dask=dask) as executor:
        rows = compare_clusters(model, names, gpus=gpus, tokens=tokens, global_batch_size=global_batch_size,
                                prices=price_map, executor=executor, pue=pue, seq_length=seq_length,
                                precision=precision)
    return {"model": model, "gpus": gpus, "tokens": tokens, "global_batch_size": global_batch_size, "pue": pue,
            "energy_assumption": "every GPU at its TDP for the whole run, times the PUE (1.0: GPUs only)",
            "rows": rows}
