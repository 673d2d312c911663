"""The public API and composition root: what the CLI, notebooks and tests call.

Each function takes what a user writes (preset names, file paths, ``key=value`` overrides) and returns
plain values; every input problem raises a `simdist.errors.SimdistError` with a one-line message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from simdist.api.scenario import (
    Scenario,
    cluster_of,
    load_scenario,
    scenario_assignments,
    scenario_cluster,
    scenario_document,
    scenario_of,
)
from simdist.errors import LayoutError, SpecError
from simdist.hardware import Topology, describe, load_topology, preset_names
from simdist.hardware.gpus import GPU_PRESETS
from simdist.hardware.presets import bundled_dir, topology_document
from simdist.spec import ScenarioSpec, TopologySpec
from simdist.spec.load import Document, read_yaml

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
    "check_document",
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
    "scenario_assignments",
    "scenario_cluster",
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


@dataclass
class RunOutput:
    """A predicted step: the JSON result and the files written (empty without ``out_dir``)."""

    result: dict[str, Any]
    files: dict[str, Path]
    num_ops: int = 0
    """Ops in the simulated op graph (its size drives the simulation's cost)."""
    prediction: Any = None
    """The `simdist.predict.step.StepPrediction` (its op graph and timeline with ``timeline=True``)."""
    calibration: Any = None
    """The calibration applied (a loaded `simdist.calibrate.calibration.Calibration`), None without one."""

    @cached_property
    def text(self) -> str:
        """The result as the text table of ``simdist run``, rendered when first read (``--json`` never reads it)."""
        from simdist.report.step_table import render_text

        return render_text(self.result)


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


def run(path: str | Path, assignments: list[str] | None = None, *, out_dir: str | Path | None = None,
        strict: bool = False, calibration: str | Path | None = None, simulate: str | None = None,
        fidelity: str | None = None, timeline: bool = False, trust_paths: bool = False) -> RunOutput:
    """Predict one training step of a scenario file (``simdist run``).

    Writes ``report.json``, ``trace.json`` (Chrome/Perfetto), ``report.html`` and, where the step was simulated,
    ``rank<r>.pt.trace.json`` per simulated rank (PyTorch profiler traces: simdist.report.kineto_trace) into
    ``out_dir`` when given; every file is rendered in memory first, so a failure writes nothing. ``strict``: a
    layout that does not fit in memory is an error (exit 2) rather than a reported ``fits_in_memory: false``.
    ``calibration``: a calibration file (`calibrate`), else the scenario's ``calibration:`` field, if any.
    ``simulate``: auto | representatives | full (simdist.predict.step.predict_step); ``fidelity``: engine or
    closed_form (the same JSON); None: auto and engine. ``timeline``: keep the simulated timeline in
    ``prediction`` (as ``out_dir`` does).

    ``path`` may also be a ``report.json`` that `run` wrote: its ``scenario_resolved`` runs again, with the
    simulate and fidelity it recorded unless given (simdist.api.provenance), so the numbers are the same. The files
    such a report names (cluster file, hf_config, calibration, moe_routing_file) are read only inside the report's
    folder unless ``trust_paths`` (a report from elsewhere must not make simdist read any file here); each is
    reported. So is the topology file a calibration names, inside the calibration's folder (simdist.api.calibration).
    """
    from simdist.api.provenance import check_report_paths, scenario_document_of_report
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
        check_report_paths(doc, Path(path), trust=trust_paths)
    if doc is None:
        doc = read_yaml(path)
    return run_document(doc, assignments, base_dir=Path(path).parent, source=str(path),
                        out_dir=out_dir, strict=strict, calibration=calibration,
                        simulate=simulate or options.get("simulate") or "auto",
                        fidelity=fidelity or options.get("fidelity") or "engine", timeline=timeline,
                        trust_paths=trust_paths)


def _read_json(path: str | Path) -> Any:
    from simdist.files import loads_json, read_text

    text = read_text(Path(path), field="SCENARIO")
    try:
        return loads_json(text)
    except ValueError as err:
        raise SpecError(f"{path} is not JSON: {err}", field="SCENARIO",
                        fix="give a report.json of simdist run") from None


RUN_FILES = ("report.json", "trace.json", "report.html")


def _calibrated_scenario(doc: Document | dict[str, Any], assignments: list[str] | None, *,
                         base_dir: str | Path | None, source: str, calibration: str | Path | None,
                         trust_paths: bool = False) -> tuple[Scenario, Any, Path, list[str]]:
    """(scenario after its calibration's and the caller's assignments, the loaded calibration, the base folder, the
    caller's assignments normalised): what `check_document` and `run_document` both start from."""
    from simdist.api.calibration import _scenario_calibration

    if not isinstance(doc, Document):
        doc = scenario_document(doc, source)
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    items = scenario_assignments(assignments or [])
    cal, cal_assignments = _scenario_calibration(doc.with_assignments(items) if items else doc, base, calibration,
                                                 trust=trust_paths)
    every = [*cal_assignments, *items]
    scenario = scenario_of(doc.with_assignments(every) if every else doc, base_dir=base, source=source)
    return scenario, cal, base, items


def check_document(doc: Document | dict[str, Any], assignments: list[str] | None = None, *,
                   base_dir: str | Path | None = None, source: str = "", calibration: str | Path | None = None,
                   trust_paths: bool = False) -> Scenario:
    """Everything `run_document` checks before it simulates, on the same path: the scenario and its cluster, the
    calibration it names (or ``calibration``) applied to them, the model, the layout, the execution fields and the
    faults (simdist.predict.step.checked_step). ``simdist check`` says ok exactly where ``simdist run`` would
    start simulating."""
    from simdist.api.calibration import _calibration_hooks
    from simdist.predict.step import checked_step

    scenario, cal, base, _ = _calibrated_scenario(doc, assignments, base_dir=base_dir, source=source,
                                                  calibration=calibration, trust_paths=trust_paths)
    _calibration_hooks(cal, scenario.topology)
    checked_step(scenario.spec, scenario.topology, base_dir=base)
    return scenario


def run_document(doc: Document | dict[str, Any], assignments: list[str] | None = None, *,
                 base_dir: str | Path | None = None, source: str = "", out_dir: str | Path | None = None,
                 strict: bool = False, calibration: str | Path | None = None, simulate: str = "auto",
                 fidelity: str = "engine", timeline: bool = False, trust_paths: bool = False) -> RunOutput:
    """`run` of a scenario given as data (a `Document` read from a file, or a plain dict): no file is written
    but the reports in ``out_dir``. ``base_dir``: where the scenario's relative paths start (default: here)."""
    from simdist.files import check_target, json_text, write_files
    from simdist.predict.step import link_counters
    names = RUN_FILES
    if out_dir is not None:  # refuse an unwritable target now, not after the simulation
        for name in names:
            check_target(Path(out_dir) / name, field="--out")
    scenario, cal, base, assignments = _calibrated_scenario(doc, assignments, base_dir=base_dir, source=source,
                                                            calibration=calibration, trust_paths=trust_paths)
    prediction = predict(scenario.spec, scenario.topology, fidelity=fidelity, simulate=simulate,
                         base_dir=base, source=source, calibration=cal, timeline=timeline or out_dir is not None)
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
        if graph is not None and trace is not None:  # the closed form has no timeline
            from simdist.report.kineto_trace import kineto_traces

            kineto = kineto_traces(graph, trace, device_name=prediction.topology.gpu.name,
                                   world_size=scenario.spec.parallel.world_size)
            rendered.update({f"rank{r}.pt.trace.json": json_text(doc, compact=True) for r, doc in kineto.items()})
        write_files({out / name: text for name, text in rendered.items()}, field="--out")
        files = {name: out / name for name in rendered}
    num_ops = len(prediction.plan.graph.ops) if prediction.plan is not None else 0
    return RunOutput(result=result, files=files, num_ops=num_ops, prediction=prediction, calibration=cal)


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
        active = m.get("num_active_params", m["num_params"])
        size = f"{m['num_params'] / 1e9:.0f}B-parameter"
        if active != m["num_params"]:  # a mixture of experts: also what a token uses
            size += f" ({active / 1e9:.0f}B active)"
        model = m["name"] if m["name"] != "inline" else f"{size} model"
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
