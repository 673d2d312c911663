"""Scenarios: read, override, validate a scenario (a file or data) and build its cluster (`simdist.api`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simdist.errors import LayoutError, SimdistError, SpecError
from simdist.hardware import Topology, load_topology
from simdist.predict.cluster import cluster_of, cluster_target, placed, with_failed_links
from simdist.spec import ScenarioSpec, TopologySpec
from simdist.spec.load import Document, read_yaml
from simdist.spec.load import validate as validate_spec

__all__ = ["Scenario", "cluster_of", "load_scenario", "scenario_assignments", "scenario_cluster",
           "scenario_document", "scenario_of"]


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
    from simdist.plan.layout import check_layout
    from simdist.plan.model_presets import resolve_model
    from simdist.plan.training_checks import check_fp8

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
    spec = _routing_file_read(spec, base, doc)
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
    target = cluster_target(spec, base, source=doc.where(("cluster",)))
    try:
        topology = placed(load_topology(target, overrides=overrides), spec)
    except SpecError as err:  # located in the scenario or the topology file; name the scenario field
        raise err.located(field_prefix="cluster") from None
    except SimdistError as err:  # unknown preset, disconnected cluster: name the scenario's field
        field = f"cluster.{err.field}" if err.field else "cluster.preset"
        where = doc.where(tuple(field.split(".")))
        raise type(err)(err.problem, field=field, source=where, fix=err.fix) from None
    try:
        topology = with_failed_links(topology, spec)
    except SimdistError as err:
        raise type(err)(err.problem, field=err.field, source=doc.where(tuple((err.field or "faults").split("."))),
                        fix=err.fix) from None
    return spec, topology


def _routing_file_read(spec: ScenarioSpec, base: Path, doc: Document) -> ScenarioSpec:
    """``spec`` with training.moe_routing_file made absolute (relative to the scenario's folder) once the file has
    been read and found well formed (simdist.spec.routing_histogram): a problem is one error located at the field."""
    path = spec.training.moe_routing_file
    if path is None:
        return spec
    from simdist.spec.routing_histogram import read_routing_histogram

    full = path if path.is_absolute() else (base / path)
    try:
        read_routing_histogram(full)
    except SpecError as err:
        raise err.located(source=doc.where(("training", "moe_routing_file"))) from None
    training = spec.training.model_copy(update={"moe_routing_file": full.resolve()})
    return spec.model_copy(update={"training": training})


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
