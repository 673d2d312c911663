"""The cluster a scenario runs on: its preset or topology file with the scenario's overrides, the part a job uses
(``cluster.placement``) and the links it says have failed (``faults.failed_links``). One owner for `simdist run`,
`check` and `search` alike (a search over a scenario ranks on the same cluster the scenario runs on)."""

from __future__ import annotations

from pathlib import Path

from simdist.errors import SimdistError, SpecError
from simdist.hardware import Topology, load_topology
from simdist.spec import ScenarioSpec
from simdist.spec.load import Document

__all__ = ["cluster_of", "cluster_target", "placed", "with_failed_links"]


def cluster_target(spec: ScenarioSpec, base: Path | None, *, source: str | None = None) -> str | Path:
    """The preset name or the topology file (relative to ``base``, if given) that ``spec.cluster`` names."""
    c = spec.cluster
    if c.file is not None:
        return c.file if Path(c.file).is_absolute() or base is None else base / c.file
    if c.preset is not None:
        return c.preset
    raise SpecError("no cluster given", field="cluster", source=source,
                    fix="add 'preset: dgx-h100' (see `simdist topo list`) or 'file: my-topology.yaml'")

def cluster_of(spec: ScenarioSpec, *, base_dir: str | Path | None = None) -> Topology:
    """The cluster a validated scenario names: its preset or file, with the scenario's overrides."""
    c = spec.cluster
    overrides = {k: v for k, v in c.model_dump(exclude_none=True).items() if k not in ("preset", "file", "placement")}
    target = cluster_target(spec, Path(base_dir) if base_dir is not None else None)
    try:
        topology = placed(load_topology(target, overrides=Document(data=overrides, source="scenario", lines={})),
                           spec)
    except SimdistError as err:
        raise err.located(field_prefix="cluster") from None
    return with_failed_links(topology, spec)

def placed(topology: Topology, spec: ScenarioSpec) -> Topology:
    """The part of the cluster the scenario's job uses (``cluster.placement``), or the whole cluster."""
    placement = spec.cluster.placement
    if placement is None:
        return topology
    from simdist.hardware.placement import job_topology

    return job_topology(topology, num_nodes=placement.num_nodes, gpus_per_node=placement.gpus_per_node)

def with_failed_links(topology: Topology, spec: ScenarioSpec) -> Topology:
    """The cluster with the leaf-spine links of ``faults.failed_links`` down (ECMP routes around them)."""
    if not spec.faults.failed_links:
        return topology
    from simdist.predict.faults import failed_uplinks

    return topology.with_failed_uplinks(failed_uplinks(spec.faults, topology))
