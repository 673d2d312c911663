"""Topology files (``topologies/*.yaml``): what a cluster is made of.

A cluster is ``num_nodes`` identical *nodes* joined by an inter-node fabric. A node is the unit that
Megatron-LM and DESIGN.md count with ``num_nodes``: one server for DGX/HGX/PCIe boxes, one rack
(an NVLink domain of 72 GPUs in 18 compute trays) for ``gb200-nvl72``. A node holds
``hosts_per_node`` hosts (servers or trays); each host has CPU sockets, PCIe switches under them,
GPUs and NICs under the PCIe switches. GPUs of a node may also share a scale-up NVLink/NVSwitch domain.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from simdist.spec.base import Bandwidth, Count, Duration, Fraction, NonNegativeCount, Spec
from simdist.spec.gpu import GpuSpec

LinkKind = Literal["nvlink", "pcie", "infiniband", "roce", "ethernet", "cpu_interconnect"]
FabricKind = Literal["infiniband", "roce", "ethernet"]
FabricShape = Literal["fat_tree", "rail_optimized"]


class PcieSpec(Spec):
    """PCIe links between GPUs/NICs, PCIe switches and CPU root complexes (per direction)."""

    generation: Literal[3, 4, 5, 6]
    lanes: Literal[1, 2, 4, 8, 16] = 16
    bandwidth: Bandwidth | None = Field(default=None, description="default: from generation and lanes")
    latency: Duration | None = Field(default=None, description="per link; default in hardware/link_defaults")
    efficiency: Fraction | None = None


class CpuInterconnectSpec(Spec):
    """The link between CPU sockets (UPI, xGMI, ...), crossed by GPU traffic between sockets."""

    bandwidth: Bandwidth
    latency: Duration | None = None
    efficiency: Fraction | None = None


class HostSpec(Spec):
    """One server (or compute tray): sockets, PCIe switches per socket; GPUs and NICs spread evenly."""

    cpu_sockets: Count = 2
    pcie_switches_per_socket: NonNegativeCount = Field(
        default=2, description="0: GPUs and NICs attach straight to the CPU root complex"
    )
    pcie: PcieSpec
    cpu_interconnect: CpuInterconnectSpec | None = Field(
        default=None, description="required with more than one socket"
    )

    @model_validator(mode="after")
    def _sockets_need_interconnect(self) -> HostSpec:
        if self.cpu_sockets > 1 and self.cpu_interconnect is None:
            raise ValueError(
                "a host with several CPU sockets needs cpu_interconnect: {bandwidth: ...} "
                "(GPU traffic between sockets crosses it)"
            )
        return self


class ScaleUpSpec(Spec):
    """The NVLink domain of a node: every GPU to every other through NVSwitch (non-blocking crossbar)."""

    kind: Literal["nvswitch"] = "nvswitch"
    nvlink_generation: Literal[3, 4, 5]
    bandwidth: Bandwidth = Field(description="per GPU per direction, e.g. '450 GB/s' for NVLink4")
    num_switches: Count = Field(description="NVSwitch chips; traffic is striped across all of them")
    latency: Duration | None = None
    efficiency: Fraction | None = None
    nvls: bool = Field(default=False, description="NVLink SHARP in-switch reduction (NVSwitch gen3+)")


class InterNodeSpec(Spec):
    """The scale-out fabric: NICs per node, their speed, and the switch fabric that joins them."""

    kind: FabricKind = "infiniband"
    nics_per_node: NonNegativeCount
    nic_bandwidth: Bandwidth = Field(description="per NIC per direction, e.g. '400 Gb/s'")
    fabric: FabricShape = "rail_optimized"
    oversubscription: float = Field(
        default=1.0, ge=1.0, description="leaf downlink / uplink capacity; 1 = non-blocking"
    )
    switch_radix: Count = Field(default=64, ge=2, description="ports per leaf switch (64 for NDR Quantum-2)")
    latency: Duration | None = Field(default=None, description="per fabric link; default by kind")
    efficiency: Fraction | None = Field(default=None, description="achieved/nominal; default by kind")


class TopologySpec(Spec):
    """A cluster: GPU model, node anatomy, and how nodes are joined."""

    name: str
    description: str = ""
    gpu: str | GpuSpec = Field(description="a GPU preset name (see `simdist topo gpus`) or an inline GPU")
    num_nodes: Count = 1
    gpus_per_node: Count
    hosts_per_node: Count = 1
    host: HostSpec
    scale_up: ScaleUpSpec | None = Field(default=None, description="absent: no NVLink (PCIe-only boxes)")
    inter_node: InterNodeSpec | None = Field(default=None, description="absent: a single node")

    @model_validator(mode="after")
    def _shape_divides(self) -> TopologySpec:
        if self.gpus_per_node % self.hosts_per_node:
            raise ValueError(
                f"gpus_per_node ({self.gpus_per_node}) must be a multiple of hosts_per_node ({self.hosts_per_node})"
            )
        gpus_per_host = self.gpus_per_node // self.hosts_per_node
        attach_points = self.host.cpu_sockets * max(1, self.host.pcie_switches_per_socket)
        if gpus_per_host % attach_points:
            raise ValueError(
                f"{gpus_per_host} GPUs per host cannot be spread evenly over {attach_points} PCIe attach points "
                "(host.cpu_sockets x host.pcie_switches_per_socket)"
            )
        if self.inter_node is not None and self.inter_node.nics_per_node % self.hosts_per_node:
            raise ValueError(
                f"inter_node.nics_per_node ({self.inter_node.nics_per_node}) must be a multiple of "
                f"hosts_per_node ({self.hosts_per_node})"
            )
        return self

    @property
    def gpus_per_host(self) -> int:
        return self.gpus_per_node // self.hosts_per_node

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node
