"""What a report records to be reproduced: the resolved scenario, the simdist version, a hash of the inputs, and a
title that follows the overrides.

``scenario_resolved`` is the validated scenario after every ``--set`` (and a calibration's cluster overrides),
with its paths absolute: a scenario document by itself, so ``simdist run report.json`` runs it again
(`scenario_document_of_report`). ``inputs_sha256`` hashes that scenario with the resolved cluster (every topology
field, so an edited topology file shows as a different hash), the calibration file's bytes and the run options.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import simdist
from simdist.errors import SimdistError, SpecError
from simdist.files import read_bytes
from simdist.hardware import Topology
from simdist.spec import ScenarioSpec
from simdist.spec.load import Document

REPORT_KEY = "scenario_resolved"


def version() -> str:
    return simdist.__version__


def resolved_scenario(spec: ScenarioSpec, *, base_dir: Path, calibration: str | Path | None = None
                      ) -> dict[str, Any]:
    """``spec`` as a scenario document: every field set (defaults written out), paths absolute."""
    updates: dict[str, Any] = {}
    if spec.cluster.file is not None and not spec.cluster.file.is_absolute():
        updates["cluster"] = spec.cluster.model_copy(update={"file": (base_dir / spec.cluster.file).resolve()})
    if spec.model.hf_config is not None and not spec.model.hf_config.is_absolute():
        updates["model"] = spec.model.model_copy(update={"hf_config": (base_dir / spec.model.hf_config).resolve()})
    cal = Path(calibration) if calibration is not None else spec.calibration
    if cal is not None:
        updates["calibration"] = cal if cal.is_absolute() else (base_dir / cal).resolve()
    routing = spec.training.moe_routing_file
    if routing is not None and not routing.is_absolute():
        updates["training"] = spec.training.model_copy(update={"moe_routing_file": (base_dir / routing).resolve()})
    return spec.model_copy(update=updates).model_dump(mode="json", exclude_none=True)


def inputs_sha256(scenario: dict[str, Any], topology: Topology, options: dict[str, Any]) -> str:
    """sha256 of the resolved scenario, the resolved cluster, the calibration file's bytes and the run options."""
    doc = {"scenario": scenario, "cluster": topology.spec.model_dump(mode="json"), "options": options}
    files = {"calibration_sha256": scenario.get("calibration"),
             "moe_routing_file_sha256": (scenario.get("training") or {}).get("moe_routing_file")}
    for key, path in files.items():
        if not path:
            continue
        # a regular file's bytes only: a FIFO was read once already (reading it again would wait for a writer that
        # is gone), and its bytes cannot be read back
        try:
            regular = stat.S_ISREG(os.stat(path).st_mode)
            doc[key] = hashlib.sha256(read_bytes(path)).hexdigest() if regular else None
        except (OSError, SimdistError):
            doc[key] = None
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


REPORT_PATHS = (("cluster", "file"), ("cluster", "preset"), ("model", "hf_config"), ("calibration",),
                ("training", "moe_routing_file"))
"""Where a resolved scenario names a file (a cluster preset may be a topology file's path)."""


def check_report_paths(doc: Document, report: Path, *, trust: bool) -> None:
    """Refuse (unless ``trust``) a report whose scenario names a file outside the report's folder, and say which files
    a report reads: a report.json from elsewhere is input like any other, and must not make simdist read any file
    of this machine (its paths were absolute where it was written)."""
    for path in REPORT_PATHS:
        node: Any = doc.data
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, str) or (path[-1] == "preset" and Path(node).suffix not in (".yaml", ".yml")):
            continue
        confined_path(node, report, kind="report", field=".".join(path), trust=trust)


def confined_path(node: str, owner: Path, *, kind: str, field: str, trust: bool) -> Path:
    """The file ``node`` that the file ``owner`` (a report.json, a calibration) names in ``field``: resolved
    relative to ``owner``'s folder, refused outside that folder unless ``trust`` (``--trust-paths``: a file from
    elsewhere must not make simdist read any file of this machine), and reported (``note: OWNER reads FILE``)."""
    from simdist.errors import note

    folder = owner.resolve().parent
    target = Path(node) if Path(node).is_absolute() else folder / node
    if not target.resolve().is_relative_to(folder) and not trust:
        raise SpecError(f"{owner} names {node} ({field}), outside the {kind}'s folder: a {kind} from elsewhere "
                        "could make simdist read any file here", field="--trust-paths",
                        fix=f"copy that file next to the {kind}, or pass --trust-paths to read {node}")
    note(f"{owner} reads {target} ({field})")
    return target


def scenario_document_of_report(data: Any, source: str) -> Document | None:
    """The scenario a ``report.json`` of `simdist run` records (its ``scenario_resolved``), or None when ``data``
    is not such a report."""
    if not (isinstance(data, dict) and REPORT_KEY in data):
        return None
    scenario = data[REPORT_KEY]
    if not isinstance(scenario, dict):
        raise SpecError(f"{REPORT_KEY} is a {type(scenario).__name__}, not a scenario", field=REPORT_KEY,
                        source=source, fix="give a report.json written by simdist run --out")
    return Document(data=scenario, source=f"{source}:{REPORT_KEY}", lines={})


def _bandwidth(bps: float) -> str:
    gbit = bps * 8 / 1e9
    return f"{gbit:g} Gb/s" if gbit < 1000 else f"{gbit / 1000:g} Tb/s"


def cluster_title(topology: Topology) -> str:
    """The cluster as built (after overrides): nodes, GPUs, scale-up and scale-out fabric."""
    s = topology.spec
    gpu = s.gpu if isinstance(s.gpu, str) else s.gpu.name
    text = f"{topology.num_nodes} x {s.name} ({s.gpus_per_node}x {gpu})"
    net = s.inter_node
    if net is not None and topology.num_nodes > 1:
        kind = {"infiniband": "InfiniBand", "roce": "RoCE", "ethernet": "Ethernet"}.get(net.kind, net.kind)
        text += f", {net.nics_per_node}x {_bandwidth(net.nic_bandwidth)} {kind} {net.fabric.replace('_', '-')}"
        if net.oversubscription != 1:
            text += f" {net.oversubscription:g}:1"
    return text


def title_after_overrides(spec: ScenarioSpec, topology: Topology, model_name: str, assignments: list[str]) -> str:
    """The report's title when ``--set`` changed the scenario: built from the resolved values (the scenario's own
    name describes it before the overrides, e.g. its fabric), with the overrides listed."""
    p = spec.parallel
    layout = f"TP{p.tp} PP{p.pp} DP{p.dp}" + (f" CP{p.cp}" if p.cp > 1 else "") + (f" VPP{p.vpp}" if p.vpp > 1 else "")
    return f"{model_name}, {layout} on {cluster_title(topology)} (--set {', '.join(assignments)})"
