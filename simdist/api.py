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
from simdist.spec.load import Document, read_yaml, validate

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
    """JSON schema of an input file kind: ``topology`` or ``scenario``."""
    models = {"topology": TopologySpec, "scenario": ScenarioSpec}
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
    spec = validate(ScenarioSpec, doc)
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
        strict: bool = False) -> RunOutput:
    """Predict one training step of a scenario file (``simdist run``).

    Writes ``report.json``, ``trace.json`` (Chrome/Perfetto) and ``report.html`` into ``out_dir`` when
    given; every file is rendered in memory first, so a failure writes nothing. ``strict``: a layout that
    does not fit in memory is an error (exit 2) rather than a reported ``fits_in_memory: false``.
    """
    from simdist.predict.step import link_counters, predict_step
    from simdist.report.step_html import step_report_html
    from simdist.report.step_table import render_text
    from simdist.report.step_trace import chrome_trace

    scenario = load_scenario(path, assignments)
    prediction = predict_step(scenario.spec, scenario.topology, source=str(path), base_dir=Path(path).parent)
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
) -> list[CollectiveRow]:
    """Simulate ``op`` over the first ``num_ranks`` GPUs of a cluster for every size.

    ``algorithm='auto'`` (and ``protocol='auto'``) take, per size, the pair with the least predicted
    time, as NCCL's tuner does; the chosen plan then runs in the engine.
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
    topology = load_topology(cluster, num_nodes=num_nodes, assignments=assignments)
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
        run = simulate([(plan, priced.group)])[0]
        sent, received = plan.bytes_sent(), plan.bytes_received()
        busiest = sorted(run.link_bytes.items(), key=lambda kv: -kv[1])[:5]
        rows.append(CollectiveRow(
            op=op, nbytes=nbytes, num_ranks=num_ranks, algorithm=choice.algorithm, protocol=choice.protocol,
            fidelity="fast" if builder is algo.build_fast else "detailed", time_s=run.time_s,
            closed_form_s=choice.predicted_s,
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
