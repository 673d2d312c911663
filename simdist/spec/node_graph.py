"""An explicit node graph (a topology file's ``node:``): the vertices and links of one node, listed.

The template of `simdist.spec.topology.HostSpec` and `ScaleUpSpec` describes the boxes most clusters are built
from (an NVSwitch crossbar, a PCIe tree per socket). Boards that are not one of those (four-GPU HGX boards whose
GPUs are linked pairwise by NVLink, NVLink bridges between pairs of PCIe cards, a PCIe tree with an odd switch, a
link that runs at half its width) are described here instead, vertex by vertex and link by link; `simdist topo
import` writes this form from the machine's own description (simdist.hardware.topo_import).

GPUs and NICs are not listed: they are ``gpu0`` .. ``gpu{gpus_per_node - 1}`` and ``nic0`` .. ``nic{nics_per_node
- 1}``. The other vertices (CPU sockets, PCIe switches, NVSwitches) are listed with a kind. Each link joins two
vertices with one bandwidth per direction; a link whose two directions differ says why (``reason``).

Example (two GPUs bridged by NVLink, each under its own CPU socket, one NIC):

    node:
      vertices: [{name: cpu0, kind: cpu}, {name: cpu1, kind: cpu}]
      links:
        - {ends: [gpu0, gpu1], kind: nvlink, bandwidth: 56.25 GB/s}
        - {ends: [gpu0, cpu0], kind: pcie, bandwidth: 31.5 GB/s}
        - {ends: [gpu1, cpu1], kind: pcie, bandwidth: 31.5 GB/s}
        - {ends: [nic0, cpu0], kind: pcie, bandwidth: 31.5 GB/s}
        - {ends: [cpu0, cpu1], kind: cpu_interconnect, bandwidth: 22 GB/s}
"""

from __future__ import annotations

from collections import deque
from typing import Literal

from pydantic import Field, model_validator

from simdist.limits import NODE_COMPONENTS
from simdist.spec.base import Bandwidth, FieldProblem, Fraction, Latency, Spec

NodeVertexKind = Literal["cpu", "pcie_switch", "nvswitch"]
NodeLinkKind = Literal["nvlink", "pcie", "cpu_interconnect"]
ENDPOINTS = ("gpu", "nic")
"""Vertices that only send and receive (simdist.hardware.node.ENDPOINT_KINDS): routes never pass through them."""


class NodeVertexSpec(Spec):
    """A vertex of the node other than its GPUs and NICs."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$",
                      description="a name of letters, digits, '_', '.', '-' (gpu<i> and nic<i> are the GPUs' and "
                                  "NICs' own names)")
    kind: NodeVertexKind = Field(description="cpu (a socket's root complex), pcie_switch or nvswitch")


class NodeLinkSpec(Spec):
    """A link between two vertices, both directions (bandwidth per direction)."""

    ends: tuple[str, str] = Field(description="the two vertices it joins, e.g. [gpu0, gpu1]")
    kind: NodeLinkKind = Field(description="nvlink, pcie or cpu_interconnect (UPI/xGMI between sockets)")
    bandwidth: Bandwidth = Field(description="nominal bandwidth from the first end to the second (and back, unless "
                                             "reverse_bandwidth says otherwise), e.g. '150 GB/s' for 6 NVLink4 links")
    reverse_bandwidth: Bandwidth | None = Field(
        default=None, description="from the second end to the first, where it differs (then `reason` is required)")
    reason: str = Field(default="", max_length=200, description="why the two directions differ (required with a "
                                                               "reverse_bandwidth other than bandwidth)")
    latency: Latency | None = Field(default=None, description="one-way latency; default by kind "
                                                              "(simdist/hardware/link_defaults.py)")
    efficiency: Fraction | None = Field(default=None, description="achieved / nominal bandwidth in (0, 1]; default: "
                                                                  "the node's efficiency for the kind, else by kind")

    @model_validator(mode="after")
    def _asymmetry_has_reason(self) -> NodeLinkSpec:
        if self.reverse_bandwidth is not None and self.reverse_bandwidth != self.bandwidth and not self.reason:
            raise FieldProblem(("reverse_bandwidth",), (
                f"the link {self.ends[0]} - {self.ends[1]} runs at {self.bandwidth / 1e9:g} GB/s one way and "
                f"{self.reverse_bandwidth / 1e9:g} GB/s back without a reason (fix: add reason: '...' saying why, "
                "or drop reverse_bandwidth)"))
        if self.ends[0] == self.ends[1]:
            raise FieldProblem(("ends",), f"the link joins {self.ends[0]} to itself (fix: name two vertices)")
        return self


class NodeGraphSpec(Spec):
    """One node as an explicit graph (replaces ``host`` and ``scale_up``)."""

    vertices: list[NodeVertexSpec] = Field(default_factory=list, max_length=int(NODE_COMPONENTS.value),
                                           description="CPU sockets, PCIe switches and NVSwitches (GPUs and NICs "
                                                       "are implicit: gpu0.., nic0..)")
    links: list[NodeLinkSpec] = Field(min_length=1, max_length=16 * int(NODE_COMPONENTS.value),
                                      description="every link of the node")
    efficiency: dict[NodeLinkKind, Fraction] = Field(
        default_factory=dict, description="achieved / nominal bandwidth per link kind for links that do not set "
                                          "their own (a calibration writes here), e.g. {nvlink: 0.8}")

    def kinds(self, num_gpus: int, num_nics: int) -> dict[str, str]:
        """Every vertex name -> its kind (GPUs first, then NICs, then the listed vertices)."""
        out = {f"gpu{i}": "gpu" for i in range(num_gpus)}
        out.update({f"nic{i}": "nic" for i in range(num_nics)})
        out.update({v.name: v.kind for v in self.vertices})
        return out

    def check(self, num_gpus: int, num_nics: int, num_nodes: int) -> None:
        """Every problem of the graph against the node's GPU and NIC counts, as a `FieldProblem` at its line:
        a name listed twice or unknown, a link listed twice, a GPU or NIC with no link, GPUs that cannot reach
        each other, a GPU with no NIC it can reach where the job spans nodes."""
        implicit = {f"gpu{i}" for i in range(num_gpus)} | {f"nic{i}" for i in range(num_nics)}
        seen: set[str] = set()
        for i, v in enumerate(self.vertices):
            if v.name in implicit or v.name in seen or (v.name.startswith(ENDPOINTS) and v.name[3:].isdecimal()):
                why = "listed twice" if v.name in seen else "a GPU's or NIC's own name (gpu<i>, nic<i> are implicit)"
                raise FieldProblem(("vertices", i, "name"), f"vertex {v.name!r} is {why} (fix: rename it)")
            seen.add(v.name)
        kinds = self.kinds(num_gpus, num_nics)
        pairs: dict[frozenset[str], int] = {}
        for i, link in enumerate(self.links):
            for end in link.ends:
                if end not in kinds:
                    raise FieldProblem(("links", i, "ends"), (
                        f"link {i} names {end!r}, which is not a vertex of the node: the GPUs are gpu0..gpu"
                        f"{num_gpus - 1}, the NICs {'nic0..nic' + str(num_nics - 1) if num_nics else '(none)'}, and "
                        f"the listed vertices {', '.join(sorted(seen)) or '(none)'} (fix: list it under vertices, or "
                        "correct the name)"))
            a, b = link.ends
            if kinds[a] in ENDPOINTS and kinds[b] in ENDPOINTS and "nic" in (kinds[a], kinds[b]):
                raise FieldProblem(("links", i, "ends"), (
                    f"link {i} joins {a} and {b} directly: a NIC hangs off a PCIe switch or a CPU (fix: attach "
                    "it to the PCIe switch or socket it sits under)"))
            pair = frozenset(link.ends)
            if pair in pairs:
                raise FieldProblem(("links", i, "ends"), (
                    f"link {i} joins {a} and {b}, as link {pairs[pair]} does (fix: give one link the combined "
                    "bandwidth, e.g. 6 NVLinks x 25 GB/s = 150 GB/s)"))
            pairs[pair] = i
        succ: dict[str, set[str]] = {v: set() for v in kinds}
        for a, b in (link.ends for link in self.links):
            succ[a].add(b)
            succ[b].add(a)
        for name, kind in kinds.items():
            if not succ[name] and kind in ENDPOINTS:
                raise FieldProblem(("links",), f"{name} has no link (fix: add a link from {name} to the switch, "
                                               "socket or GPU it is attached to)")

        def reach(src: str) -> set[str]:
            """Vertices reached from ``src`` without passing through a GPU or a NIC."""
            seen_here, queue = {src}, deque([src])
            while queue:
                v = queue.popleft()
                if v != src and kinds[v] in ENDPOINTS:
                    continue
                for w in succ[v]:
                    if w not in seen_here:
                        seen_here.add(w)
                        queue.append(w)
            return seen_here

        gpus = [f"gpu{i}" for i in range(num_gpus)]
        first = reach(gpus[0])
        lost = [g for g in gpus[1:] if g not in first]
        if lost:
            raise FieldProblem(("links",), (
                f"{', '.join(lost)} cannot reach gpu0 inside the node (a route never passes through a GPU or a "
                "NIC) (fix: link them to a switch or socket gpu0 reaches, or to gpu0 itself)"))
        if num_nodes > 1:
            nics = {f"nic{i}" for i in range(num_nics)}
            for g in gpus:
                if not reach(g) & nics:
                    raise FieldProblem(("links",), (
                        f"{g} reaches no NIC, but the cluster has {num_nodes} nodes (fix: attach a NIC to a switch "
                        f"or socket {g} reaches, or use num_nodes: 1)"))
