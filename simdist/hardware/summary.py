"""What `simdist topo show` reports: counts, per-GPU bandwidth per tier, bisection, example routes.

All figures are SI (bytes/s, seconds); formatting with units happens in the CLI.
"""

from __future__ import annotations

from typing import Any

from simdist.hardware.bisection import bisection
from simdist.hardware.link import Route
from simdist.hardware.topology import Topology


def _links_by_kind(topology: Topology) -> dict[str, dict[str, Any]]:
    """Directed links per kind over the whole cluster, with the distinct bandwidths (arithmetic)."""
    out: dict[str, dict[str, Any]] = {}

    def add(kind: str, count: int, bandwidth: float) -> None:
        entry = out.setdefault(kind, {"count": 0, "bandwidths_Bps": set()})
        entry["count"] += count
        entry["bandwidths_Bps"].add(bandwidth)

    for lk in topology.node.links:
        add(lk.kind, topology.num_nodes, lk.bandwidth_Bps)
    fabric = topology.fabric
    if fabric is not None:
        add(fabric.kind, topology.layout.num_nic_links, fabric.nic_bandwidth_Bps)
        if topology.layout.num_spine_links:
            add(fabric.kind, topology.layout.num_spine_links, fabric.uplink_bandwidth_Bps)
        if topology.layout.num_core_links:
            add(fabric.kind, topology.layout.num_core_links, fabric.core_bandwidth_Bps)
    return {k: {"count": v["count"], "bandwidths_Bps": sorted(v["bandwidths_Bps"])} for k, v in sorted(out.items())}


def route_dict(topology: Topology, route: Route) -> dict[str, Any]:
    return {
        "src_rank": route.src,
        "dst_rank": route.dst,
        "vertices": topology.route_vertices(route),
        "hops": route.hops,
        "bandwidth_Bps": route.bandwidth_Bps,
        "effective_bandwidth_Bps": route.effective_bandwidth_Bps,
        "latency_s": route.latency_s,
    }


def injection_bandwidth(topology: Topology) -> dict[str, float]:
    """What one GPU can send per tier when every GPU sends at once (nominal, per direction).

    ``nvlink``: its NVLink port (the sum of its NVLink links on a node given as a graph); ``pcie``: its PCIe
    link; ``inter_node``: its route to its NIC, and
    its share of the node's NICs (nics_per_node x nic_bandwidth / gpus_per_node), whichever is less.
    """
    node = topology.node
    gpu0 = node.gpus[0]
    out: dict[str, float] = {}
    for lk in node.links:
        if lk.src == gpu0:
            out[lk.kind] = out.get(lk.kind, 0.0) + lk.bandwidth_Bps
    spec = topology.spec.inter_node
    if spec is not None and spec.nics_per_node and node.nic_of_gpu[0] is not None:
        to_nic = node.path(gpu0, node.nics[node.nic_of_gpu[0]]).bandwidth_Bps
        share = spec.nics_per_node * spec.nic_bandwidth / topology.gpus_per_node
        out["inter_node"] = min(to_nic, spec.nic_bandwidth, share)
    return out


def _listed_nvlink(topology: Topology) -> dict[str, Any] | None:
    """The NVLink entry of a node given as a graph: the first GPU's NVLink links, the node's NVSwitches."""
    node = topology.node
    out = [lk for lk in node.links if lk.src == node.gpus[0] and lk.kind == "nvlink"]
    if not out:
        return None
    return {
        "generation": None,
        "bandwidth_per_gpu_Bps": sum(lk.bandwidth_Bps for lk in out),
        "links_per_gpu": len(out),
        "num_switches_per_node": sum(1 for v in node.vertices.values() if v["kind"] == "nvswitch"),
        "efficiency": out[0].efficiency,
        "nvls": False,
    }


def describe(topology: Topology) -> dict[str, Any]:
    """A JSON-ready description of a topology (the `simdist topo show --json` document)."""
    spec = topology.spec
    gpu = topology.gpu
    inter = spec.inter_node
    fabric = topology.fabric
    g = topology.gpus_per_node
    routes: dict[str, Any] = {}
    if g > 1:
        # The farthest pair inside a node: crosses sockets on PCIe boxes, trays on NVL72.
        routes["intra_node"] = route_dict(topology, topology.route(0, g - 1))
    if topology.num_nodes > 1:
        routes["inter_node"] = route_dict(topology, topology.route(0, g))
        if g > 1:
            routes["inter_node_other_gpu"] = route_dict(topology, topology.route(0, 2 * g - 1))
    cut = bisection(topology)
    return {
        "name": spec.name,
        "description": spec.description,
        "gpu": {
            "name": gpu.name,
            "peak_flops": gpu.peak.model_dump(),
            "hbm_capacity_bytes": gpu.hbm_capacity,
            "hbm_bandwidth_Bps": gpu.hbm_bandwidth,
        },
        "num_nodes": topology.num_nodes,
        "gpus_per_node": g,
        "hosts_per_node": spec.hosts_per_node,
        "num_gpus": topology.num_gpus,
        "nvlink_domain_size": topology.nvlink_domain_size,
        "node_graph": spec.node is not None,
        "nvlink": _listed_nvlink(topology) if spec.node is not None else None if spec.scale_up is None else {
            "generation": spec.scale_up.nvlink_generation,
            "bandwidth_per_gpu_Bps": spec.scale_up.bandwidth,
            "num_switches_per_node": spec.scale_up.num_switches,
            "efficiency": topology.node.links[topology.node.link_index(topology.node.gpus[0], "nvswitch")].efficiency,
            "nvls": spec.scale_up.nvls,
        },
        "nics": None if inter is None else {
            "kind": inter.kind,
            "per_node": inter.nics_per_node,
            "bandwidth_Bps": inter.nic_bandwidth,
        },
        "fabric": None if fabric is None else {
            "kind": fabric.kind,
            "shape": fabric.shape,
            "oversubscription": fabric.oversubscription,
            "num_leaves": fabric.num_leaves,
            "num_spines": fabric.physical_spines,
            "tiers": 3 if fabric.cores_per_group else (2 if fabric.num_spines else 1),
            "planes": fabric.planes,
            "leaves_per_plane": fabric.leaves_per_pod if fabric.planes > 1 else fabric.num_leaves,
            "spines_per_plane": fabric.num_spines * fabric.spines_merged,
            "num_pods": fabric.num_pods if fabric.planes == 1 else 1,
            "leaves_per_pod": fabric.leaves_per_pod if fabric.cores_per_group else fabric.num_leaves,
            "num_cores": fabric.physical_cores,
            "routing": fabric.routing,
            "core_bandwidth_Bps": fabric.core_bandwidth_Bps / fabric.cores_merged,
            "pod_oversubscription": fabric.pod_oversubscription,
            "nics_per_leaf": fabric.down_ports,
            "uplink_bandwidth_Bps": fabric.uplink_bandwidth_Bps / fabric.spines_merged,
            "latency_s": fabric.latency_s,
            "efficiency": fabric.efficiency,
        },
        "vertices_by_kind": topology.vertex_counts,
        "links_by_kind": _links_by_kind(topology),
        "num_links": topology.num_links,
        "injection_bandwidth_per_gpu_Bps": injection_bandwidth(topology),
        "bisection": {"bandwidth_Bps": cut.bandwidth_Bps, "cut": cut.cut},
        "routes": routes,
    }
