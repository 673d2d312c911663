"""`simdist topo import`: a topology file (YAML text) from an NCCL topology dump or `nvidia-smi topo -m` output (the
node), or from `ibnetdiscover` output (the fabric, laid over a node given by ``--node``)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import yaml

from simdist.errors import SpecError
from simdist.files import read_text
from simdist.hardware.gemm import architecture
from simdist.hardware.gpus import gpu_preset
from simdist.hardware.ibnet_import import parse_ibnetdiscover
from simdist.hardware.machine_import import import_machine
from simdist.hardware.presets import topology_document
from simdist.hardware.topology import Topology
from simdist.spec.load import parse_yaml, validate
from simdist.spec.topology import TopologySpec
from simdist.units import parse_bandwidth

__all__ = ["import_topology"]


_IBNET = re.compile(r'^\s*(Switch|Ca)\s+\d+\s+"[SH]-', re.MULTILINE)


def import_topology(path: str | Path, *, name: str | None = None, gpu: str | None = None,
                    nic_kind: str = "infiniband", nic_bandwidth: str | None = None,
                    pcie_generation: int | None = None, node: str | None = None) -> tuple[str, Topology, list[str]]:
    """(the topology file's text, the topology it builds, the assumptions the import made) for the machine
    description at ``path`` (simdist.hardware.machine_import), or for ``ibnetdiscover`` output laid over the node
    of the preset or topology file ``node`` (simdist.hardware.ibnet_import)."""
    source = str(path)
    text = read_text(path, field="FILE")
    if _IBNET.search(text[:1 << 20]):
        return _import_fabric(text, source, name=name, node=node)
    if node is not None:
        raise SpecError("--node goes with ibnetdiscover output (a fabric), not with a node's description",
                        field="--node", fix="drop --node")
    if gpu is not None:
        gpu_preset(gpu)  # an unknown preset: one error naming the valid ones
    if nic_kind not in ("infiniband", "roce", "ethernet"):
        raise SpecError(f"unknown NIC kind {nic_kind!r}", field="--nic-kind", fix="use infiniband, roce or ethernet")
    nic_Bps = parse_bandwidth(nic_bandwidth) if nic_bandwidth is not None else None
    if pcie_generation is not None and pcie_generation not in (3, 4, 5, 6):
        raise SpecError(f"PCIe generation {pcie_generation} is not one of 3-6", field="--pcie-generation",
                        fix="use 3, 4, 5 or 6")
    topo_name = name or Path(source).stem.replace("_", "-").replace(".", "-")[:64] or "imported"
    doc, assumptions = import_machine(text, source, name=topo_name, gpu=gpu,
                                      architecture_of=lambda preset: architecture(gpu_preset(preset)).name,
                                      nic_kind=nic_kind, nic_bandwidth_Bps=nic_Bps, pcie_generation=pcie_generation)
    out = render(doc, assumptions, source)
    parsed = parse_yaml(out, f"the topology imported from {source}")
    spec = validate(TopologySpec, parsed)
    return out, Topology(spec), assumptions


def _import_fabric(text: str, source: str, *, name: str | None, node: str | None
                   ) -> tuple[str, Topology, list[str]]:
    if node is None:
        raise SpecError("ibnetdiscover describes the fabric, not the servers on it", field="--node",
                        fix="pass --node PRESET_OR_FILE (e.g. --node dgx-h100, or a file `simdist topo import` wrote "
                            "from an NCCL dump)")
    draft = parse_ibnetdiscover(text, source)
    base = dict(topology_document(node).data)
    inter = dict(base.get("inter_node") or {})
    inter = {k: v for k, v in inter.items() if k in ("latency", "efficiency")} | draft.inter_node
    base.update(name=name or Path(source).stem.replace("_", "-").replace(".", "-")[:64] or "imported",
                description=f"{base.get('description', node)}; fabric imported from ibnetdiscover ({source})",
                num_nodes=draft.num_nodes, inter_node=inter)
    notes = [*draft.notes, f"the servers' inside is {node}'s"]
    out = render(base, notes, source)
    spec = validate(TopologySpec, parse_yaml(out, f"the topology imported from {source}"))
    return out, Topology(spec), notes


def render(doc: dict[str, Any], assumptions: list[str], source: str) -> str:
    """The topology file: a header (where it came from, what was assumed), then the fields, one link per line."""
    head = [f"# Imported by `simdist topo import` from {source} on {dt.date.today().isoformat()}."]
    if "node" in doc:
        head.append("# The node is given as a graph (simdist/spec/node_graph.py); edit links or add an inter_node "
                    "fabric as needed.")
    head += [f"# Assumption: {a}" for a in assumptions]
    top = {k: v for k, v in doc.items() if k not in ("node", "inter_node")}
    lines = [*head, yaml.safe_dump(top, sort_keys=False, width=120).rstrip()]
    if "node" in doc:
        lines += ["node:", *_node_lines(doc["node"])]
    if "inter_node" in doc:
        lines.append(yaml.safe_dump({"inter_node": doc["inter_node"]}, sort_keys=False, width=120).rstrip())
    return "\n".join(lines) + "\n"


def _node_lines(node: dict[str, Any]) -> list[str]:
    """A node graph's section, one vertex and one link per line."""
    lines: list[str] = []
    flow = _flow
    if node.get("vertices"):
        lines.append("  vertices:")
        lines += [f"    - {flow(v)}" for v in node["vertices"]]
    if "efficiency" in node:
        lines.append(f"  efficiency: {flow(node['efficiency'])}   # NCCL's bandwidth per NVLink / nominal "
                     "(hardware/data/nvlink_links.csv)")
    lines.append("  links:")
    lines += [f"    - {flow(lk)}" for lk in node["links"]]
    return lines


def _flow(value: dict[str, Any]) -> str:
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1000).strip()
