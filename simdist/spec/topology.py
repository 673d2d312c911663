"""Topology files (``topologies/*.yaml``): what a cluster is made of.

A cluster is ``num_nodes`` identical *nodes* joined by an inter-node fabric. A node is the unit that
Megatron-LM and docs/architecture.md count with ``num_nodes``: one server for DGX/HGX/PCIe boxes, one rack
(an NVLink domain of 72 GPUs in 18 compute trays) for ``gb200-nvl72``. A node holds
``hosts_per_node`` hosts (servers or trays); each host has CPU sockets, PCIe switches under them,
GPUs and NICs under the PCIe switches. GPUs of a node may also share a scale-up NVLink/NVSwitch domain.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, WithJsonSchema, model_validator

from simdist.limits import (
    CPU_SOCKETS,
    GPUS,
    GPUS_PER_NODE,
    HOSTS_PER_NODE,
    NICS_PER_NODE,
    NODE_COMPONENTS,
    NODE_ROUTE_WORK,
    NUM_NODES,
    NVSWITCHES,
    OVERSUBSCRIPTION,
    PCIE_SWITCHES,
    SWITCH_RADIX,
    TDP_MAX,
)
from simdist.spec.base import Bandwidth, FieldProblem, Fraction, Latency, Spec, count
from simdist.spec.gpu import GpuSpec
from simdist.spec.node_graph import NodeGraphSpec

LinkKind = Literal["nvlink", "pcie", "infiniband", "roce", "ethernet", "cpu_interconnect"]
FabricKind = Literal["infiniband", "roce", "ethernet"]
FabricShape = Literal["fat_tree", "rail_optimized"]

_EFFICIENCY = "achieved / nominal bandwidth in (0, 1]; default by link kind (simdist/hardware/link_defaults.py)"

GPU_SPEED_CV_MAX = 0.2
"""The largest ``gpu_speed_cv`` taken: about four times the spread Sinha et al. 2022 (arXiv:2208.11035v3) measured
across whole clusters (22 % between a cluster's GPUs at most: cv 0.055; the SC22 abstract's 72 %: 0.18;
simdist.hardware.variability), and the limit of a normal model of a speed, which at 0.2 already puts one GPU in
10,000 near a quarter of the median's speed."""


def _speed_cv(value: float) -> float:
    if value < 0.0:
        raise ValueError(f"{value:g} is negative: a spread of speeds is at least 0 (fix: write 0 for identical GPUs, "
                         "or a fraction such as 0.02 for a 2 % spread)")
    if value > GPU_SPEED_CV_MAX:
        raise ValueError(f"{value:g} is above {GPU_SPEED_CV_MAX:g}, outside the normal model's range (measured "
                         "clusters spread by 0.015-0.055) (fix: write a fraction, e.g. 0.02 for a 2 % spread; a "
                         "few much slower GPUs are faults.stragglers)")
    return value


SpeedCv = Annotated[float, AfterValidator(_speed_cv),
                    WithJsonSchema({"type": "number", "minimum": 0.0, "maximum": GPU_SPEED_CV_MAX})]


class PcieSpec(Spec):
    """PCIe links between GPUs/NICs, PCIe switches and CPU root complexes (per direction)."""

    generation: Literal[3, 4, 5, 6] = Field(description="PCIe generation (3-6): sets the per-lane rate")
    lanes: Literal[1, 2, 4, 8, 16] = Field(default=16, description="lanes per link (x16 for GPUs and NICs)")
    bandwidth: Bandwidth | None = Field(default=None, description="per link per direction; default: from "
                                                                  "generation and lanes")
    latency: Latency | None = Field(default=None, description="per link; default in hardware/link_defaults")
    efficiency: Fraction | None = Field(default=None, description=_EFFICIENCY)


class CpuInterconnectSpec(Spec):
    """The link between CPU sockets (UPI, xGMI, ...), crossed by GPU traffic between sockets."""

    bandwidth: Bandwidth = Field(description="per direction between two sockets, e.g. '22 GB/s' for UPI")
    latency: Latency | None = Field(default=None, description="per crossing; default in hardware/link_defaults")
    efficiency: Fraction | None = Field(default=None, description=_EFFICIENCY)


class HostSpec(Spec):
    """One server (or compute tray): sockets, PCIe switches per socket; GPUs and NICs spread evenly."""

    cpu_sockets: count(CPU_SOCKETS) = Field(default=2, description="CPU sockets (root complexes) per host")
    pcie_switches_per_socket: count(PCIE_SWITCHES, minimum=0) = Field(
        default=2, description="PCIe switches under each socket; 0: GPUs and NICs attach straight to the CPU root "
                               "complex"
    )
    pcie: PcieSpec = Field(description="the PCIe links of the host")
    cpu_interconnect: CpuInterconnectSpec | None = Field(
        default=None, description="the link between sockets; required with more than one socket"
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

    kind: Literal["nvswitch"] = Field(default="nvswitch", description="the scale-up fabric (NVSwitch crossbar)")
    nvlink_generation: Literal[3, 4, 5] = Field(description="NVLink generation (3: A100, 4: H100/H200, 5: B200)")
    bandwidth: Bandwidth = Field(description="per GPU per direction, e.g. '450 GB/s' for NVLink4")
    num_switches: count(NVSWITCHES) = Field(description="NVSwitch chips; traffic is striped across all of them")
    latency: Latency | None = Field(default=None, description="per NVLink hop; default in hardware/link_defaults")
    efficiency: Fraction | None = Field(default=None, description=_EFFICIENCY)
    nvls: bool = Field(default=False, description="NVLink SHARP in-switch reduction (NVSwitch gen3+)")

    @model_validator(mode="after")
    def _nvls_needs_nvswitch_gen3(self) -> ScaleUpSpec:
        # NVLink SHARP came with the third-generation NVSwitch of NVLink 4 (H100) systems; NCCL's nvlsEfficiency is
        # 0 for Volta and Ampere (src/graph/tuning.cc), which would make every NVLS transfer a division by zero.
        if self.nvls and self.nvlink_generation < 4:
            raise FieldProblem(("nvls",), f"nvls needs NVLink 4 or later (NVSwitch gen3, H100 and newer), but "
                                          f"nvlink_generation is {self.nvlink_generation} (fix: set nvls: false)")
        return self


class InterNodeSpec(Spec):
    """The scale-out fabric: NICs per node, their speed, and the switch fabric that joins them."""

    kind: FabricKind = Field(default="infiniband", description="infiniband, roce or ethernet")
    nics_per_node: count(NICS_PER_NODE, minimum=0) = Field(description="NICs per node (spread evenly over its "
                                                                       "hosts and PCIe switches)")
    nic_bandwidth: Bandwidth = Field(description="per NIC per direction, e.g. '400 Gb/s'")
    fabric: FabricShape = Field(default="rail_optimized", description="rail_optimized (NIC i of every node on "
                                                                      "leaf i) or fat_tree")
    oversubscription: float = Field(
        default=1.0, ge=1.0, le=OVERSUBSCRIPTION.value, description="leaf downlink / uplink capacity; 1 = "
                                                                    "non-blocking"
    )
    switch_radix: count(SWITCH_RADIX, minimum=2) = Field(default=64, description="ports per leaf switch (64 for NDR "
                                                                               "Quantum-2); at least 2")
    tiers: Literal[2, 3] = Field(
        default=2, description="switch tiers: 2 (leaves and a spine layer) or 3 (leaves and spines in pods, a core "
                               "layer above the pods: simdist.hardware.fabric); a 3-tier fabric whose leaves fit one "
                               "pod is a 2-tier one")
    pod_oversubscription: float = Field(
        default=1.0, ge=1.0, le=OVERSUBSCRIPTION.value,
        description="with tiers: 3, a spine's downlink (to its pod's leaves) / uplink (to the core) capacity; 1 = "
                    "non-blocking, 7 for the 1:7 above Llama 3's 3,072-GPU pods")
    routing: Literal["ecmp", "adaptive"] = Field(
        default="ecmp", description="how a flow that climbs above its leaf picks its path: ecmp (a static hash per "
                                    "flow: two flows may share an uplink while another idles) or adaptive (packets "
                                    "sprayed over every spine and core: InfiniBand adaptive routing, Spectrum-X; no "
                                    "collisions); simdist.hardware.fabric")
    leaves_per_pod: count(SWITCH_RADIX) | None = Field(
        default=None, description="with tiers: 3, leaves in a pod; default: a spine's down ports, "
                                  "floor(switch_radix x pod_oversubscription / (1 + pod_oversubscription))")
    planes: count(NICS_PER_NODE) = Field(
        default=1, description="independent network planes (multi-plane fabric: DeepSeek's multi-plane two-layer fat "
                               "tree, 8-plane Ethernet clusters): NIC i of every host sits on plane i mod planes, each "
                               "plane its own leaves and spines, laid out as `fabric` says over its NICs; a flow "
                               "between NICs of different planes crosses the sending host over NVLink to the GPU whose "
                               "NIC is on the destination's plane (NCCL's PXN); must divide the NICs per host; "
                               "simdist.hardware.fabric")
    latency: Latency | None = Field(default=None, description="per fabric link; default by kind")
    efficiency: Fraction | None = Field(default=None, description="achieved/nominal; default by kind")
    sharp: bool = Field(
        default=False, description="the InfiniBand switches reduce in the network (NVIDIA SHARP on Quantum switches, "
                                   "NCCL's CollNet through the nccl-rdma-sharp-plugins): enables the all_reduce "
                                   "algorithms collnet (simdist.collectives.collnet) and, on NVLS nodes, nvls_sharp "
                                   "(simdist.collectives.nvls_sharp); infiniband only")

    @model_validator(mode="after")
    def _sharp_needs_infiniband(self) -> InterNodeSpec:
        # SHARP aggregation runs in NVIDIA's InfiniBand (Quantum) switches; NCCL reaches it through the CollNet
        # plugin of nccl-rdma-sharp-plugins (Mellanox/nccl-rdma-sharp-plugins), an InfiniBand verbs plugin.
        if self.planes > 1 and self.tiers == 3:
            raise FieldProblem(("planes",), f"a multi-plane fabric ({self.planes} planes) of 3 tiers is not modelled "
                                            "(each plane is a two-tier fat tree) (fix: set tiers: 2, or planes: 1)")
        if self.nics_per_node and self.planes > self.nics_per_node:
            raise FieldProblem(("planes",), f"{self.planes} planes but {self.nics_per_node} NICs per node: every plane "
                                            "needs a NIC of every host (fix: planes <= nics_per_node, one NIC per "
                                            "plane per host)")
        if self.sharp and self.kind != "infiniband":
            raise FieldProblem(("sharp",), f"sharp (in-network reduction) needs InfiniBand switches, but kind is "
                                           f"{self.kind} (fix: set sharp: false, or kind: infiniband)")
        return self


class TopologySpec(Spec):
    """A cluster: GPU model, node anatomy, and how nodes are joined."""

    name: str = Field(description="the topology's name (a preset's file name)")
    description: str = Field(default="", description="one line shown by `simdist topo list`")
    gpu: str | GpuSpec = Field(description="a GPU preset name (see `simdist topo gpus`) or an inline GPU")
    gpu_power_limit_w: float | None = Field(
        default=None, gt=0, le=TDP_MAX.value,
        description="the GPUs' power cap in watts when set below the preset's tdp_w (nvidia-smi -pl), e.g. 500 for "
                    "power-capped H100 SXM: compute-bound kernels run at the clock the cap sustains "
                    "(simdist.hardware.clock)")
    gpu_speed_cv: SpeedCv = Field(
        default=0.02,
        description="coefficient of variation (standard deviation / mean) of the sustained compute speed of the "
                    "cluster's GPUs, 0 to 0.2; default 0.02: the average spread Sinha et al. 2022 (SC22, "
                    "arXiv:2208.11035) measured between the GPUs of one model across whole clusters (8 %, at most "
                    "22 %: cv 0.055, read as the range of 4 standard deviations); 0: identical GPUs. A synchronous "
                    "step waits for the slowest of the job's N GPUs, so every compute kernel takes 1 + cv x z(N) as "
                    "long, z(N) the expected largest of N standard normals (2.3 for 64 GPUs, 4.0 for 16,384; over "
                    "1 + cv x z(8) on the A100, whose constants were fitted on 8 GPUs; simdist.hardware.variability); "
                    "a pipeline of unequal stages is paced by its heaviest stage's GPUs instead "
                    "(simdist.plan.stage_pace)")
    num_nodes: count(NUM_NODES) = Field(default=1, description="nodes in the cluster (a node is a server, or a rack "
                                                          "for gb200-nvl72)")
    gpus_per_node: count(GPUS_PER_NODE) = Field(description="GPUs per node")
    hosts_per_node: count(HOSTS_PER_NODE) = Field(default=1, description="servers or compute trays per node")
    host: HostSpec | None = Field(default=None, description="the anatomy of each host (a template: sockets, PCIe "
                                                            "switches, GPUs and NICs spread evenly); required "
                                                            "unless `node` lists the node's graph")
    scale_up: ScaleUpSpec | None = Field(default=None, description="absent: no NVLink (PCIe-only boxes)")
    node: NodeGraphSpec | None = Field(
        default=None, description="the node as an explicit graph (vertices and links, simdist.spec.node_graph), "
                                  "instead of `host` and `scale_up`: boards no template describes (pairwise NVLink, "
                                  "NVLink bridges, an odd link); `simdist topo import` writes it")
    inter_node: InterNodeSpec | None = Field(default=None, description="absent: a single node")

    @model_validator(mode="after")
    def _shape_divides(self) -> TopologySpec:
        nics = self.inter_node.nics_per_node if self.inter_node is not None else 0
        if self.node is not None:
            for name in ("host", "scale_up"):
                if getattr(self, name) is not None:
                    raise FieldProblem((name,), f"{name} and node both describe the node (fix: drop {name}: the "
                                                "node graph lists every vertex and link, NVLink included)")
            if self.hosts_per_node != 1:
                raise FieldProblem(("hosts_per_node",), "a node given as a graph is one host (fix: drop "
                                                        "hosts_per_node, or describe the hosts with `host`)")
            try:
                self.node.check(self.gpus_per_node, nics, self.num_nodes)
            except FieldProblem as problem:
                raise FieldProblem(("node", *problem.path), str(problem)) from None
            self._check_planes(nics)
            self._check_size()
            return self
        if self.host is None:
            raise FieldProblem(("host",), "the node is not described (fix: add host: {pcie: {generation: 5}, ...} "
                                          "or node: {vertices: [...], links: [...]}; see `simdist schema topology`)")
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
        self._check_planes(self.inter_node.nics_per_node // self.hosts_per_node if self.inter_node else 0)
        self._check_size()
        return self

    def _check_planes(self, nics_per_host: int) -> None:
        """Each host has one NIC (or the same number of NICs) on every plane: planes divide its NICs."""
        planes = self.inter_node.planes if self.inter_node is not None else 1
        if planes > 1 and nics_per_host % planes:
            raise FieldProblem(("inter_node", "planes"), (
                f"{planes} planes do not divide the {nics_per_host} NICs of a host (NIC i sits on plane i mod "
                f"{planes}, and every host needs the same NICs on every plane) (fix: planes a divisor of "
                f"{nics_per_host}, e.g. {nics_per_host} for one NIC per plane per host)"))

    def _check_size(self) -> None:
        """Bounded work (simdist.limits): the cluster's GPUs, and the components routing searches in a node."""
        nics = self.inter_node.nics_per_node if self.inter_node is not None else 0
        if self.num_gpus > GPUS.value:
            table_gib = 8 * self.num_nodes * (self.gpus_per_node + nics) // 2**30
            memory = f": its per-GPU and per-NIC tables alone would need ~{table_gib:,} GiB" if table_gib else ""
            raise FieldProblem(("num_nodes",), (
                f"{self.num_nodes:,} nodes x {self.gpus_per_node} GPUs = {self.num_gpus:,} GPUs, above the limit of "
                f"{GPUS.text()}{memory} "
                f"(fix: use at most {int(GPUS.value) // self.gpus_per_node:,} nodes)"))
        h = self.host
        if h is None:  # an explicit node graph
            assert self.node is not None
            components = self.gpus_per_node + nics + len(self.node.vertices)
            work = self.gpus_per_node * (components + len(self.node.links))
            if components > NODE_COMPONENTS.value or work > NODE_ROUTE_WORK.value:
                raise FieldProblem(("node", "links"), (
                    f"a node graph of {components:,} vertices and {len(self.node.links):,} links needs {work:,} "
                    f"route-search visits; the limits are {NODE_COMPONENTS.text()} and {NODE_ROUTE_WORK.text()} "
                    "(fix: describe a smaller node)"))
            return
        components = (self.gpus_per_node + nics + self.hosts_per_node * h.cpu_sockets
                      * (1 + h.pcie_switches_per_socket) + (self.scale_up.num_switches if self.scale_up else 0))
        work = self.gpus_per_node * components
        if components > NODE_COMPONENTS.value or work > NODE_ROUTE_WORK.value:
            parts = {("gpus_per_node",): self.gpus_per_node, ("inter_node", "nics_per_node"): nics,
                     ("host", "pcie_switches_per_socket"): self.hosts_per_node * h.cpu_sockets
                     * h.pcie_switches_per_socket, ("hosts_per_node",): self.hosts_per_node * h.cpu_sockets}
            raise FieldProblem(max(parts, key=parts.get), (
                f"a node of {self.gpus_per_node} GPUs and {components:,} components in all (GPUs, NICs, PCIe "
                f"switches, sockets, NVSwitches) needs {work:,} route-search visits; the limits are "
                f"{NODE_COMPONENTS.text()} and {NODE_ROUTE_WORK.text()} ({NODE_ROUTE_WORK.reason}) "
                "(fix: describe a smaller node: fewer GPUs, NICs or PCIe switches per node)"))

    @property
    def gpus_per_host(self) -> int:
        return self.gpus_per_node // self.hosts_per_node

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node
