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
from simdist.spec.load import Document, read_yaml, validate

__all__ = [
    "Scenario",
    "assumptions",
    "bundled_scenarios",
    "gpu_presets",
    "load_scenario",
    "load_topology",
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
