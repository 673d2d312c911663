"""The public API and composition root: what the CLI, notebooks and tests call.

Each function takes what a user writes (preset names, file paths, ``key=value`` overrides) and returns
plain values; every input problem raises a `simdist.errors.SimdistError` with a one-line message.
"""

from __future__ import annotations

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
    "DETAILED_MAX_PEERS",
    "FIDELITIES",
    "HOLDOUT_HELP",
    "CollectiveRow",
    "RunOutput",
    "Scenario",
    "SearchOutput",
    "assumptions",
    "bubble",
    "bubble_sweep",
    "bundled_scenarios",
    "calibrate",
    "cluster_of",
    "collective",
    "collective_curves",
    "compare",
    "compare_rows",
    "curves_for_report",
    "gpu_presets",
    "load_scenario",
    "load_topology",
    "microbatch_range",
    "predict",
    "read_measurement_files",
    "run",
    "run_document",
    "scenario_document",
    "scenario_of",
    "schedule_grid",
    "schema",
    "search",
    "topology_presets",
    "topology_summary",
    "validate",
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
    """Read, override, validate a scenario file and build its cluster; check the layout fits the cluster."""
    doc = read_yaml(path)
    if assignments:
        doc = doc.with_assignments(scenario_assignments(assignments))
    return scenario_of(doc, base_dir=Path(path).parent, source=str(path))


def scenario_document(data: Any, source: str = "") -> Document:
    """A scenario given as a Python dict, as a `Document` (no line numbers) for `scenario_of` and `run_document`."""
    if not isinstance(data, dict):
        raise SpecError(f"a scenario (a dict of its fields) is needed, got {type(data).__name__}", field="spec",
                        fix="pass a dict such as {'cluster': {...}, 'model': {...}, 'parallel': {...}, ...}")
    return Document(data=data, source=source or "scenario", lines={})


def scenario_of(doc: Document | dict[str, Any], assignments: list[str] | None = None, *,
                base_dir: str | Path | None = None, source: str = "") -> Scenario:
    """Validate a scenario given as data (a `Document` keeps the file's line numbers for errors; a plain dict
    is a scenario written in Python), build its cluster and check its layout: what `load_scenario` does after
    reading the file. ``base_dir``: where relative paths in it (cluster file, hf_config) start (default: here).
    """
    if not isinstance(doc, Document):
        doc = scenario_document(doc, source)
    if assignments:
        doc = doc.with_assignments(scenario_assignments(assignments))
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    spec, topology = scenario_cluster(doc, base)
    _check_layout(spec, topology, doc)
    from simdist.plan.layout import check_fp8, check_layout
    from simdist.plan.model_presets import resolve_model

    check_fp8(spec, topology)  # fp8 on a GPU without fp8, mxfp8 off Blackwell: `simdist check` refuses as `run`
    try:
        check_layout(spec, resolve_model(spec.model, base_dir=base))
    except LayoutError as err:  # the one validity check (simdist.plan.layout), located in the file
        where = doc.where(tuple((err.field or "parallel").split(".")))
        raise type(err)(err.problem, field=err.field, source=where, fix=err.fix) from None
    return Scenario(spec=spec, topology=topology, source=source)


def scenario_assignments(assignments: list[str]) -> list[str]:
    """``--set`` items of a scenario; a topology field without its ``cluster.`` prefix (``inter_node.kind=roce``,
    as `simdist topo show --set` writes it) is the cluster's: ``cluster.inter_node.kind=roce``."""
    from simdist.spec.load import parse_assignment

    scenario_fields = set(ScenarioSpec.model_fields)
    topology_fields = set(TopologySpec.model_fields) - {"name"}
    out = []
    for item in assignments:
        try:
            head = parse_assignment(item)[0][0]
        except SimdistError:
            head = ""  # with_assignments names the problem
        out.append(f"cluster.{item}" if head in topology_fields and head not in scenario_fields else item)
    return out


def scenario_cluster(doc: Document, base: Path) -> tuple[ScenarioSpec, Topology]:
    """A scenario document validated and its cluster built, its layout not checked (a search replaces it)."""
    spec = validate_spec(ScenarioSpec, doc)
    if spec.model.hf_config is not None:
        from simdist.spec.hf_config import check_hf_config

        hf = spec.model.hf_config if spec.model.hf_config.is_absolute() else base / spec.model.hf_config
        try:
            check_hf_config(hf)
        except SpecError as err:
            raise err.located(source=doc.where(("model", "hf_config"))) from None
    cluster = doc.sub("cluster")
    overrides = Document(
        data={k: v for k, v in cluster.data.items() if k not in ("preset", "file", "placement")},
        source=cluster.source,
        lines=cluster.lines,
    )
    if spec.cluster.file is not None:
        target: str | Path = spec.cluster.file
        if not Path(target).is_absolute():
            target = base / target
    elif spec.cluster.preset is not None:
        target = spec.cluster.preset
    else:
        raise SpecError("no cluster given", field="cluster", source=doc.where(("cluster",)),
                        fix="add 'preset: dgx-h100' (see `simdist topo list`) or 'file: my-topology.yaml'")
    try:
        topology = _placed(load_topology(target, overrides=overrides), spec)
    except SpecError as err:  # located in the scenario or the topology file; name the scenario field
        raise err.located(field_prefix="cluster") from None
    except SimdistError as err:  # unknown preset, disconnected cluster: name the scenario's field
        field = f"cluster.{err.field}" if err.field else "cluster.preset"
        where = doc.where(tuple(field.split(".")))
        raise type(err)(err.problem, field=field, source=where, fix=err.fix) from None
    return spec, topology


def _check_layout(spec: ScenarioSpec, topology: Topology, doc: Document) -> None:
    p = spec.parallel
    if p.world_size != topology.num_gpus:
        others = p.tp * p.pp * p.cp
        hint = (f"set parallel.dp to {topology.num_gpus // others}" if topology.num_gpus % others == 0
                else f"make tp x pp x dp x cp equal {topology.num_gpus}, or change cluster.num_nodes")
        if p.world_size < topology.num_gpus:
            hint += ", or run on part of the cluster with cluster.placement: {num_nodes: N, gpus_per_node: G}"
        raise LayoutError(
            f"tp x pp x dp x cp = {p.tp} x {p.pp} x {p.dp} x {p.cp} = {p.world_size} GPUs, "
            + (f"but cluster.placement uses {topology.num_gpus} ({topology.num_nodes} nodes x {topology.gpus_per_node})"
               if topology.cluster_num_gpus > topology.num_gpus else
               f"but the cluster has {topology.num_gpus} ({topology.num_nodes} nodes x {topology.gpus_per_node})"),
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


def predict(spec: ScenarioSpec, topology: Topology | None = None, *, fidelity: str = "engine",
            simulate: str = "auto", base_dir: str | Path | None = None, source: str = "",
            calibration: Any = None, timeline: bool = False) -> Any:
    """One step of a validated scenario (`simdist.spec.ScenarioSpec`): the one path from a scenario to a number.

    ``topology``: its cluster, built from ``spec.cluster`` when not given (a search builds it once for all its
    candidates, each a ``spec.model_copy(update=...)``). ``fidelity``: ``engine`` or ``closed_form``.
    ``calibration``: a loaded calibration (`calibrate`) to apply. Returns a `simdist.predict.step.StepPrediction`.
    """
    from simdist.api.calibration import _calibration_hooks
    from simdist.predict.step import predict_step

    if topology is None:
        topology = cluster_of(spec, base_dir=base_dir)
    return predict_step(spec, topology, source=source, base_dir=Path(base_dir) if base_dir is not None else None,
                        simulate=simulate, fidelity=fidelity, timeline=timeline,
                        **_calibration_hooks(calibration, topology))


def cluster_of(spec: ScenarioSpec, *, base_dir: str | Path | None = None) -> Topology:
    """The cluster a validated scenario names: its preset or file, with the scenario's overrides."""
    c = spec.cluster
    overrides = {k: v for k, v in c.model_dump(exclude_none=True).items() if k not in ("preset", "file", "placement")}
    if c.file is not None:
        target: str | Path = c.file if Path(c.file).is_absolute() or base_dir is None else Path(base_dir) / c.file
    elif c.preset is not None:
        target = c.preset
    else:
        raise SpecError("no cluster given", field="cluster",
                        fix="add 'preset: dgx-h100' (see `simdist topo list`) or 'file: my-topology.yaml'")
    try:
        return _placed(load_topology(target, overrides=Document(data=overrides, source="scenario", lines={})), spec)
    except SimdistError as err:
        raise err.located(field_prefix="cluster") from None


def _placed(topology: Topology, spec: ScenarioSpec) -> Topology:
    """The part of the cluster the scenario's job uses (``cluster.placement``), or the whole cluster."""
    placement = spec.cluster.placement
    if placement is None:
        return topology
    from simdist.hardware.placement import job_topology

    return job_topology(topology, num_nodes=placement.num_nodes, gpus_per_node=placement.gpus_per_node)


def run(path: str | Path, assignments: list[str] | None = None, *, out_dir: str | Path | None = None,
        strict: bool = False, calibration: str | Path | None = None, simulate: str | None = None,
        fidelity: str | None = None) -> RunOutput:
    """Predict one training step of a scenario file (``simdist run``).

    Writes ``report.json``, ``trace.json`` (Chrome/Perfetto) and ``report.html`` into ``out_dir`` when
    given; every file is rendered in memory first, so a failure writes nothing. ``strict``: a layout that
    does not fit in memory is an error (exit 2) rather than a reported ``fits_in_memory: false``.
    ``calibration``: a calibration file (`calibrate`), else the scenario's ``calibration:`` field, if any.
    ``simulate``: auto | representatives | full (simdist.predict.step.predict_step); ``fidelity``: engine or
    closed_form (the same JSON); None: auto and engine.

    ``path`` may also be a ``report.json`` that `run` wrote: its ``scenario_resolved`` runs again, with the
    simulate and fidelity it recorded unless given (simdist.api.provenance), so the numbers are the same.
    """
    from simdist.api.provenance import scenario_document_of_report
    from simdist.files import check_target

    if out_dir is not None:  # refuse an unwritable target before reading anything
        for name in RUN_FILES:
            check_target(Path(out_dir) / name, field="--out")
    doc, options = None, {}
    if Path(path).suffix == ".json":
        report = _read_json(path)
        doc = scenario_document_of_report(report, str(path))
        if doc is None:
            raise SpecError(f"{path} is JSON but not a report of simdist run (no 'scenario_resolved')",
                            field="SCENARIO", fix="give a scenario YAML file or a report.json of simdist run --out")
        options = report.get("run_options") if isinstance(report.get("run_options"), dict) else {}
    if doc is None:
        doc = read_yaml(path)
    return run_document(doc, assignments, base_dir=Path(path).parent, source=str(path),
                        out_dir=out_dir, strict=strict, calibration=calibration,
                        simulate=simulate or options.get("simulate") or "auto",
                        fidelity=fidelity or options.get("fidelity") or "engine")


def _read_json(path: str | Path) -> Any:
    import json

    from simdist.files import read_text

    text = read_text(Path(path), field="SCENARIO")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise SpecError(f"{path} is not JSON: {err}", field="SCENARIO",
                        fix="give a report.json of simdist run") from None


RUN_FILES = ("report.json", "trace.json", "report.html")


def run_document(doc: Document | dict[str, Any], assignments: list[str] | None = None, *,
                 base_dir: str | Path | None = None, source: str = "", out_dir: str | Path | None = None,
                 strict: bool = False, calibration: str | Path | None = None, simulate: str = "auto",
                 fidelity: str = "engine") -> RunOutput:
    """`run` of a scenario given as data (a `Document` read from a file, or a plain dict): no file is written
    but the reports in ``out_dir``. ``base_dir``: where the scenario's relative paths start (default: here)."""
    from simdist.api.calibration import _scenario_calibration
    from simdist.files import check_target, json_text, write_files
    from simdist.predict.step import link_counters
    from simdist.report.step_table import render_text

    names = RUN_FILES
    if out_dir is not None:  # refuse an unwritable target now, not after the simulation
        for name in names:
            check_target(Path(out_dir) / name, field="--out")
    if not isinstance(doc, Document):
        doc = scenario_document(doc, source)
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    assignments = scenario_assignments(assignments or [])
    cal, cal_assignments = _scenario_calibration(doc.with_assignments(assignments) if assignments else doc, base,
                                                 calibration)
    every = [*cal_assignments, *assignments]
    scenario = scenario_of(doc.with_assignments(every) if every else doc, base_dir=base, source=source)
    prediction = predict(scenario.spec, scenario.topology, fidelity=fidelity, simulate=simulate,
                         base_dir=base, source=source, calibration=cal, timeline=out_dir is not None)
    result = _with_provenance(prediction.result, scenario, assignments, base=base, calibration=calibration,
                              options={"simulate": simulate, "fidelity": fidelity})
    if strict and not result["fits_in_memory"]:
        worst = max(result["memory"], key=lambda m: m["total_bytes"])
        raise LayoutError(
            f"stage {worst['stage']} needs {worst['total_bytes'] / 2**30:.1f} GiB per GPU but the GPU has "
            f"{worst['capacity_bytes'] / 2**30:.1f} GiB",
            field="parallel", source=source or None,
            fix="raise tp or pp, enable recompute or sequence_parallel, or use a ZeRO stage")
    files: dict[str, Path] = {}
    if out_dir is not None:
        from simdist.report.step_html import step_report_html  # plotly: imported only when writing the report
        from simdist.report.step_trace import chrome_trace

        out = Path(out_dir)
        graph, trace = prediction.plan.graph, prediction.trace
        labels = {r: f"rank {r} (stage {s}, dp {d})" for (s, d), r in prediction.plan.stage_ranks.items()}
        rendered = {
            "report.json": json_text(result),
            "trace.json": json_text(chrome_trace(graph, trace, rank_labels=labels,
                                                 link_counters=link_counters(prediction)), compact=True),
            "report.html": step_report_html(graph, trace, result),
        }
        write_files({out / name: rendered[name] for name in names}, field="--out")
        files = {name: out / name for name in names}
    num_ops = len(prediction.plan.graph.ops) if prediction.plan is not None else 0
    return RunOutput(result=result, files=files, text=render_text(result), num_ops=num_ops)


def _with_provenance(result: dict[str, Any], scenario: Scenario, assignments: list[str], *, base: Path,
                     calibration: str | Path | None, options: dict[str, Any]) -> dict[str, Any]:
    """``result`` with what reproduces it (simdist.api.provenance), its title following the overrides."""
    from simdist.api.provenance import inputs_sha256, resolved_scenario, title_after_overrides, version

    resolved = resolved_scenario(scenario.spec, base_dir=base, calibration=calibration)
    out = dict(result)
    named = any(a.split("=", 1)[0].strip() == "name" for a in assignments)
    if assignments and not named:
        out["scenario_name"] = result.get("name", "")
        m = result["model"]
        model = m["name"] if m["name"] != "inline" else f"{m['num_params'] / 1e9:.0f}B-parameter model"
        out["name"] = title_after_overrides(scenario.spec, scenario.topology, model, assignments)
        resolved["name"] = out["name"]
    out["overrides"] = list(assignments)
    out["run_options"] = options
    out["simdist_version"] = version()
    out["inputs_sha256"] = inputs_sha256({k: v for k, v in resolved.items() if k != "name"}, scenario.topology,
                                         options)
    out["scenario_resolved"] = resolved
    return out


def assumptions() -> list[dict[str, Any]]:
    """Every modelling assumption marked ``# Assumption:`` in the library and the bundled presets.

    A marked comment continues over the comment lines right below it.
    """
    import simdist

    tag = "# " + "Assumption:"  # split so that this line is not itself a match
    marker = re.compile(r"(?<![\"'`])" + re.escape(tag) + r"\s*(.*)")
    roots = [Path(simdist.__file__).parent, *(bundled_dir(kind) for kind in ("topologies", "gpus", "models"))]
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


# The API's other sections, one module each, re-exported so that `from simdist import api` sees one namespace.
# Imported last: they build on the core above (load_scenario, run, ...).
from simdist.api.bubble import bubble, bubble_sweep, microbatch_range, schedule_grid  # noqa: E402
from simdist.api.calibration import HOLDOUT_HELP, calibrate, read_measurement_files, validate  # noqa: E402
from simdist.api.collectives import (  # noqa: E402
    DETAILED_MAX_PEERS,
    FIDELITIES,
    CollectiveRow,
    collective,
    collective_curves,
    compare_rows,
    curves_for_report,
)
from simdist.api.compare import compare  # noqa: E402
from simdist.api.search import SearchOutput, search  # noqa: E402
