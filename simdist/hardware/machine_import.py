"""`simdist topo import`: a topology file from the machine's own description.

Two descriptions are read, told apart by their content:
- an NCCL topology dump (``NCCL_TOPO_DUMP_FILE=...``: XML of CPUs, the PCIe tree with link speeds and widths,
  GPUs with their NVLinks, NICs with their speeds), parsed by simdist.hardware.nccl_topo_xml;
- ``nvidia-smi topo -m`` text (the GPU/NIC matrix: NV# = a bonded set of # NVLinks, PIX/PXB = through one or
  several PCIe switches, PHB/NODE = through a host bridge, SYS = across sockets, the NUMA affinity column), parsed
  here: it gives no speeds, so the PCIe generation and the NIC speed come from options (defaults by GPU
  generation, each stated in the written file).

Both become a `MachineDraft` (the node's vertices and links), written as a topology file whose node is given as a
graph (simdist.spec.node_graph). The document is validated as a `TopologySpec` before it is returned, so an import
never writes a file `simdist` would refuse. What the description did not say and the import assumed is written at
the top of the file as ``# Assumption:`` lines.

NVLink counts become bandwidth by GPU generation (hardware/data/nvlink_links.csv: nominal per link, NCCL's
per-link figure as the efficiency). Where one GPU's NVLink count over its peers exceeds the links a GPU has (every
pair NV18 on an 8-GPU H100 board), the links go through NVSwitches: one ``nvswitch`` vertex, each GPU linked to it
with its links' bandwidth (NCCL, too, merges a node's NVSwitches into one, src/graph/topo.cc ncclTopoAddNvLinks).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from simdist.errors import SpecError
from simdist.hardware.link_defaults import pcie_bandwidth_Bps
from simdist.units import ascii_int

__all__ = ["MachineDraft", "NvlinkGeneration", "import_machine", "nvlink_generation"]

DEFAULT_NIC_BANDWIDTH_BPS = 400e9 / 8
"""# Assumption: 400 Gb/s NICs (NDR InfiniBand / 400GbE) where the description gives no speed (nvidia-smi)."""
DEFAULT_PCIE_GENERATION = {"pascal": 3, "volta": 3, "ampere": 4, "ampere_ga10x": 4, "hopper": 5, "blackwell": 5,
                           "blackwell_ultra": 6}
"""# Assumption: the host's PCIe generation is the GPU's (A100 Gen4, H100/H200/B200 Gen5, B300 Gen6) where the
description gives no link speed (nvidia-smi)."""


@dataclass(frozen=True, slots=True)
class NvlinkGeneration:
    sm: int
    architecture: str
    links_per_gpu: int
    nominal_Bps: float
    efficiency: float


@cache
def _generations() -> tuple[NvlinkGeneration, ...]:
    text = (resources.files("simdist.hardware") / "data" / "nvlink_links.csv").read_text(encoding="utf-8")
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    return tuple(NvlinkGeneration(int(r["sm"]), r["architecture"], int(r["links_per_gpu"]),
                                  float(r["nominal_GBps"]) * 1e9, float(r["nccl_GBps"]) / float(r["nominal_GBps"]))
                 for r in rows)


def nvlink_generation(*, sm: int | None = None, architecture: str | None = None) -> NvlinkGeneration:
    """The NVLink row of a compute capability (the newest row at or below it) or of an architecture name."""
    rows = _generations()
    if sm is not None:
        below = [r for r in rows if r.sm <= sm]
        return below[-1] if below else rows[0]
    arch = {"blackwell_ultra": "blackwell"}.get(architecture or "hopper", architecture or "hopper")
    return next((r for r in rows if r.architecture == arch), rows[-2])


@dataclass(slots=True)
class MachineDraft:
    """One node as read from a description: vertices other than GPUs and NICs, and links by vertex name (GPUs are
    ``gpu0``.., NICs ``nic0``.. in the description's order)."""

    source: str
    """What was read (format and file), for the written file's header."""
    num_gpus: int = 0
    nic_speeds_Bps: list[float | None] = field(default_factory=list)
    vertices: dict[str, str] = field(default_factory=dict)
    links: dict[frozenset[str], dict[str, Any]] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    sm: int | None = None
    nvlink_efficiency: float | None = None

    def link(self, a: str, b: str, kind: str, bandwidth_Bps: float) -> None:
        """Add the link a - b (or, where it is listed again, keep the wider: a description lists a link from both
        ends)."""
        key = frozenset((a, b))
        old = self.links.get(key)
        if old is None or old["bandwidth"] < bandwidth_Bps:
            self.links[key] = {"ends": [a, b], "kind": kind, "bandwidth": bandwidth_Bps}

    def document(self, *, name: str, gpu: str, nic_kind: str, nic_bandwidth_Bps: float | None) -> dict[str, Any]:
        """The topology file's content (units as strings)."""
        nics = len(self.nic_speeds_Bps)
        known = [s for s in self.nic_speeds_Bps if s]
        nic_bw = nic_bandwidth_Bps or (max(set(known), key=known.count) if known else None)
        if nics and nic_bw is None:
            nic_bw = DEFAULT_NIC_BANDWIDTH_BPS
            self.assumptions.append(f"{nics} NICs at {_gbps_bits(nic_bw)} each (the description gives no speed; "
                                    "--nic-bandwidth sets it)")
        if nics and len(set(known)) > 1:
            self.assumptions.append(f"NIC speeds differ ({', '.join(sorted({_gbps_bits(s) for s in known}))}); "
                                    f"every NIC taken at {_gbps_bits(nic_bw or 0)}")
        doc: dict[str, Any] = {
            "name": name,
            "description": f"imported from {self.source}: {self.num_gpus} GPUs, {nics} NICs",
            "gpu": gpu,
            "num_nodes": 1,
            "gpus_per_node": self.num_gpus,
            "node": {
                "vertices": [{"name": v, "kind": k} for v, k in self.vertices.items()],
                **({"efficiency": {"nvlink": round(self.nvlink_efficiency, 4)}} if self.nvlink_efficiency else {}),
                "links": [{"ends": lk["ends"], "kind": lk["kind"], "bandwidth": _gbps(lk["bandwidth"])}
                          for lk in self.links.values()],
            },
        }
        if nics:
            doc["inter_node"] = {"kind": nic_kind, "nics_per_node": nics, "nic_bandwidth": _gbps_bits(nic_bw or 0),
                                 "fabric": "rail_optimized"}
        return doc


def _gbps(bps: float) -> str:
    return f"{bps / 1e9:.6g} GB/s"


def _gbps_bits(bps: float) -> str:
    return f"{bps * 8 / 1e9:.6g} Gb/s"


def pcie_Bps(gt_per_s: float, lanes: int) -> float:
    """Nominal PCIe bandwidth per direction of a link at ``gt_per_s`` GT/s x ``lanes`` (8b/10b below Gen3)."""
    gen = {8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}.get(gt_per_s)
    if gen is not None:
        return pcie_bandwidth_Bps(gen, lanes) if lanes in (1, 2, 4, 8, 16) else pcie_bandwidth_Bps(gen, 1) * lanes
    return gt_per_s * 1e9 * lanes * (0.8 if gt_per_s < 8 else 128 / 130) / 8


# --------------------------------------------------------------------------- nvidia-smi topo -m
_SMI_RELATIONS = {"X", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC"}
_NV = re.compile(r"^NV(\d+)$")


def parse_smi(text: str, source: str, *, architecture: str, pcie_generation: int | None) -> MachineDraft:
    """A `MachineDraft` from ``nvidia-smi topo -m`` output (see the module docstring)."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    header_at = next((i for i, ln in enumerate(lines) if (t := ln.split()) and t[0] == "GPU0"
                      and (len(t) == 1 or not (t[1] in _SMI_RELATIONS or _NV.match(t[1])))), None)
    if header_at is None:
        raise SpecError("no GPU0 column header found", source=source, fix="pass the output of `nvidia-smi topo -m`")
    header = lines[header_at].split()
    columns = []
    for token in header:
        if token in ("CPU", "NUMA", "GPU", "Affinity", "ID"):
            break
        columns.append(token)
    rows: dict[str, list[str]] = {}
    numa: dict[str, str] = {}
    for ln in lines[header_at + 1:]:
        tokens = ln.split()
        if not tokens or tokens[0] not in columns:
            if rows:
                break
            continue
        cells = tokens[1:1 + len(columns)]
        if len(cells) < len(columns):
            raise SpecError(f"row {tokens[0]} has {len(cells)} cells for {len(columns)} columns",
                            source=source, fix="pass the unedited output of `nvidia-smi topo -m`")
        odd = next(((col, c) for col, c in zip(columns, cells, strict=True)
                    if not (c in _SMI_RELATIONS or _NV.match(c))), None)
        if odd is not None:
            raise SpecError(f"row {tokens[0]}, column {odd[0]}: {odd[1]!r} is not a connection nvidia-smi writes "
                            f"({', '.join(sorted(_SMI_RELATIONS))} or NV<links>)", source=source,
                            fix="pass the unedited output of `nvidia-smi topo -m`")
        rows[tokens[0]] = cells
        rest = tokens[1 + len(columns):]
        if rest:  # CPU affinity, NUMA affinity (newer drivers): the NUMA node, else the CPU list, names the socket
            numa[tokens[0]] = rest[1] if len(rest) >= 2 else rest[0]
    gpus = [c for c in columns if re.fullmatch(r"GPU\d+", c)]
    nics = [c for c in columns if c not in gpus]
    if not gpus or any(g not in rows for g in gpus):
        raise SpecError("the GPU rows of the matrix are missing", source=source,
                        fix="pass the whole output of `nvidia-smi topo -m`")
    draft = MachineDraft(source=f"nvidia-smi topo -m ({source})", num_gpus=len(gpus),
                         nic_speeds_Bps=[None] * len(nics))
    local = {g: f"gpu{i}" for i, g in enumerate(gpus)} | {n: f"nic{i}" for i, n in enumerate(nics)}
    position = {c: i for i, c in enumerate(columns)}

    def rel(a: str, b: str) -> str:
        return (rows.get(a) or rows[b])[position[b] if a in rows else position[a]]

    # NVLink: NV# between GPUs; more links than a GPU has means NVSwitches in between
    gen = nvlink_generation(architecture=architecture)
    counts = {(a, b): int(m.group(1)) for a in gpus for b in gpus if a != b and (m := _NV.match(rel(a, b)))}
    if counts:
        draft.nvlink_efficiency = gen.efficiency
        switched = any(sum(c for (x, _), c in counts.items() if x == g) > gen.links_per_gpu for g in gpus)
        if switched:
            draft.vertices["nvswitch"] = "nvswitch"
            for g in gpus:
                links = max((c for (x, _), c in counts.items() if x == g), default=0)
                if links:
                    draft.link(local[g], "nvswitch", "nvlink", links * gen.nominal_Bps)
        else:
            for (a, b), c in counts.items():
                draft.link(local[a], local[b], "nvlink", c * gen.nominal_Bps)
    # sockets from the NUMA affinity column; a NIC on the socket of a GPU it reaches without crossing sockets
    socket_of: dict[str, int] = {}
    numa_ids = sorted({numa.get(g, "0") for g in gpus}, key=lambda s: (ascii_int(s) is None, ascii_int(s) or 0, s))
    for g in gpus:
        socket_of[g] = numa_ids.index(numa.get(g, "0"))
    if any(numa.get(g) in (None, "N/A") for g in gpus):
        draft.assumptions.append("GPUs without a NUMA affinity are placed on the first socket")
    for n in nics:
        near = [g for g in gpus if rel(n, g) in ("PIX", "PXB", "PHB", "NODE")]
        socket_of[n] = socket_of[near[0]] if near else 0
    cpus = [f"cpu{i}" for i in range(len(numa_ids))]
    for c in cpus:
        draft.vertices[c] = "cpu"
    # PCIe switches: devices one or several bridges apart (PIX, PXB) share one; the others hang off their socket
    devices = gpus + nics
    parent = {d: d for d in devices}

    def find(d: str) -> str:
        while parent[d] != d:
            parent[d] = parent[parent[d]]
            d = parent[d]
        return d

    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            r = rel(a, b)
            if r in ("PIX", "PXB"):
                parent[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for d in devices:
        groups.setdefault(find(d), []).append(d)
    generation = pcie_generation or DEFAULT_PCIE_GENERATION.get(architecture, 5)
    if pcie_generation is None:
        draft.assumptions.append(f"PCIe Gen{generation} x16 links (the matrix gives no speeds; --pcie-generation sets "
                                 "it)")
    pcie = pcie_bandwidth_Bps(generation, 16)
    switches = 0
    for members in groups.values():
        cpu = cpus[socket_of[members[0]]]
        if len(members) == 1:
            draft.link(local[members[0]], cpu, "pcie", pcie)
            continue
        name = f"pcie{switches}"
        switches += 1
        draft.vertices[name] = "pcie_switch"
        for d in members:
            draft.link(local[d], name, "pcie", pcie)
        draft.link(name, cpu, "pcie", pcie)
    if any(r == "PXB" for a in devices for b in devices if a != b and (r := rel(a, b))):
        draft.assumptions.append("devices several PCIe bridges apart (PXB) are drawn under one switch")
    _join_sockets(draft, cpus, 22e9, "# Assumption: sockets joined at NCCL's Sapphire Rapids UPI figure, 22 GB/s "
                                     "(nccl src/graph/topo.h SRP_QPI_BW; the matrix does not name the CPU)")
    return draft


def _join_sockets(draft: MachineDraft, cpus: list[str], bandwidth_Bps: float, note: str) -> None:
    if len(cpus) < 2:
        return
    for i, a in enumerate(cpus):
        for b in cpus[i + 1:]:
            draft.link(a, b, "cpu_interconnect", bandwidth_Bps)
    draft.assumptions.append(note.removeprefix("# Assumption: "))


# --------------------------------------------------------------------------- entry point
def import_machine(text: str, source: str, *, name: str, gpu: str | None, architecture_of: Any,
                   nic_kind: str = "infiniband", nic_bandwidth_Bps: float | None = None,
                   pcie_generation: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """(topology document, assumptions) from a description's ``text`` (see the module docstring).
    ``architecture_of(preset)``: the architecture name of a GPU preset; ``gpu``: the preset, else guessed from an
    NCCL dump's compute capability."""
    from simdist.hardware.nccl_topo_xml import GPU_OF_SM, parse_nccl_xml

    head = text.lstrip()[:4096]
    if head.startswith("<") and "<system" in text[:65536]:
        draft = parse_nccl_xml(text, source)
        if gpu is None:
            gpu = GPU_OF_SM.get(draft.sm or 0)
            if gpu is None:
                raise SpecError(f"the dump's GPUs are sm {draft.sm}, which names no GPU preset", source=source,
                                fix="pass --gpu PRESET (see `simdist topo gpus`)")
            draft.assumptions.append(f"GPU preset {gpu} from the dump's compute capability sm {draft.sm} (--gpu sets "
                                     "it)")
    elif re.search(r"\bGPU0\b", head):
        if gpu is None:
            raise SpecError("nvidia-smi topo -m does not name the GPU", source=source,
                            fix="pass --gpu PRESET (see `simdist topo gpus`)")
        draft = parse_smi(text, source, architecture=architecture_of(gpu), pcie_generation=pcie_generation)
    else:
        raise SpecError("neither an NCCL topology dump (XML with <system>) nor `nvidia-smi topo -m` output",
                        source=source, fix="pass the file NCCL_TOPO_DUMP_FILE wrote, or `nvidia-smi topo -m` output")
    if draft.num_gpus == 0:
        raise SpecError("the description lists no GPU", source=source, fix="dump the topology on a GPU machine")
    doc = draft.document(name=name, gpu=gpu, nic_kind=nic_kind, nic_bandwidth_Bps=nic_bandwidth_Bps)
    return doc, list(draft.assumptions)
