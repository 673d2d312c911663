"""Topology presets: the YAML files under ``topologies/`` and how a cluster is resolved from them.

A preset is a topology file; a cluster is a preset (or a file) with overrides laid over it
(``num_nodes``, ``--set inter_node.kind=roce``, or a scenario's ``cluster:`` fields).
"""

from __future__ import annotations

from pathlib import Path

from simdist.errors import PresetError, SimdistError
from simdist.hardware.gpus import gpu_preset
from simdist.hardware.topology import Topology
from simdist.spec.load import Document, read_yaml, validate
from simdist.spec.preset_file import bundled_dir
from simdist.spec.topology import TopologySpec

__all__ = ["bundled_dir", "load_topology", "preset_names", "preset_path", "resolve_topology_spec",
           "topology_document"]


def preset_names() -> list[str]:
    return sorted(p.stem for p in bundled_dir("topologies").glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = bundled_dir("topologies") / f"{name}.yaml"
    if not path.is_file():
        raise PresetError(
            f"unknown topology preset '{name}'",
            fix=f"use one of: {', '.join(preset_names())}, or a path to a topology YAML file",
        )
    return path


def topology_document(name_or_path: str | Path) -> Document:
    """The raw document of a preset name or a topology file path."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or Path(text).is_file():
        return read_yaml(text)
    return read_yaml(preset_path(text))


def resolve_topology_spec(
    name_or_path: str | Path,
    *,
    num_nodes: int | None = None,
    assignments: list[str] | None = None,
    overrides: Document | None = None,
) -> TopologySpec:
    """Validate a preset or file with overrides applied: ``overrides`` (a document, e.g. a scenario's
    ``cluster`` section), then ``--set`` assignments, then ``num_nodes``."""
    doc = topology_document(name_or_path)
    if overrides is not None:
        doc = doc.overlay(overrides)
    if assignments:
        doc = doc.with_assignments(assignments)
    if num_nodes is not None:
        doc = doc.with_assignments([f"num_nodes={num_nodes}"], source="--num-nodes")
    spec = validate(TopologySpec, doc)
    if isinstance(spec.gpu, str):
        try:
            gpu_preset(spec.gpu)
        except PresetError as err:
            raise err.located(source=doc.where(("gpu",))) from None
    return spec


def load_topology(
    name_or_path: str | Path,
    *,
    num_nodes: int | None = None,
    assignments: list[str] | None = None,
    overrides: Document | None = None,
) -> Topology:
    """Build the Topology of a preset or file; any input problem is one located SimdistError."""
    spec = resolve_topology_spec(name_or_path, num_nodes=num_nodes, assignments=assignments, overrides=overrides)
    try:
        return Topology(spec)
    except SimdistError as err:
        raise err.located(source=err.source or str(name_or_path)) from None
