"""The cluster as a graph: one node graph placed ``num_nodes`` times, plus the fabric, plus routes.

Global link ids are dense and computed, never stored per link:
  [0, N x T)                node links: node n, local link t -> n x T + t
  [N x T, + 2 x NICs)       NIC <-> leaf: NIC g up (to leaf) 2g, down (to NIC) 2g + 1
  [.., + 2 x L x S)         leaf <-> spine: leaf l, spine s up 2(l S + s), down 2(l S + s) + 1
Vertex names: ``n{node}/{local}`` inside nodes (``n3/gpu5``, ``n3/h0/pcie1``, ``n3/nvswitch``),
``leaf{i}`` and ``spine{j}`` in the fabric. GPU ``rank`` r lives on node r // gpus_per_node.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property

import networkx as nx

from simdist.errors import TopologyError
from simdist.hardware.fabric import Fabric, build_fabric
from simdist.hardware.gpus import gpu_preset
from simdist.hardware.link import Link, PathShape, Route, join
from simdist.hardware.node import NodeGraph, build_node
from simdist.spec.gpu import GpuSpec
from simdist.spec.topology import TopologySpec

ROUTE_CACHE_ENTRIES = 1 << 18
"""Routes kept per topology before the cache is emptied (~150 MiB at the limit)."""


class Topology:
    """A built cluster. Cheap to build at any size; routes are computed on demand and cached."""

    def __init__(self, spec: TopologySpec) -> None:
        self.spec = spec
        self.gpu: GpuSpec = gpu_preset(spec.gpu) if isinstance(spec.gpu, str) else spec.gpu
        self.num_nodes = spec.num_nodes
        self.gpus_per_node = spec.gpus_per_node
        self.num_gpus = spec.num_gpus
        self.node: NodeGraph = build_node(spec)
        self.fabric: Fabric | None = None
        if spec.num_nodes > 1:
            if spec.inter_node is None or spec.inter_node.nics_per_node == 0:
                raise TopologyError(
                    f"{spec.num_nodes} nodes but no inter-node fabric: GPUs on different nodes are not connected",
                    field="inter_node",
                    fix="add inter_node: {kind: infiniband, nics_per_node: 8, nic_bandwidth: 400 Gb/s} "
                    "or use num_nodes: 1",
                )
            self.fabric = build_fabric(spec.inter_node, spec.num_nodes)
        t = self.node.num_links
        self._node_links_end = self.num_nodes * t
        nics = self.fabric.num_nics if self.fabric else 0
        self._nic_links_end = self._node_links_end + 2 * nics
        fabric_pairs = self.fabric.num_leaves * self.fabric.num_spines if self.fabric else 0
        self.num_links = self._nic_links_end + 2 * fabric_pairs
        self._routes: dict[tuple[int, int], Route] = {}
        if self.fabric is not None:
            f = self.fabric
            self._nic_shape = PathShape((), f.nic_bandwidth_Bps, f.nic_bandwidth_Bps * f.efficiency, f.latency_s)
            self._uplink_shape = PathShape((), f.uplink_bandwidth_Bps, f.uplink_bandwidth_Bps * f.efficiency,
                                           f.latency_s)

    # ----------------------------------------------------------------- placement
    def locate(self, rank: int) -> tuple[int, int]:
        """(node, local GPU index) of GPU ``rank``."""
        if not 0 <= rank < self.num_gpus:
            raise TopologyError(
                f"GPU rank {rank} is outside this cluster of {self.num_gpus} GPUs",
                fix=f"use ranks 0..{self.num_gpus - 1} or add nodes",
            )
        return divmod(rank, self.gpus_per_node)

    @property
    def num_node_links(self) -> int:
        """Links inside the nodes have ids below this (NIC-to-leaf and fabric links come after)."""
        return self._node_links_end

    @property
    def nvlink_domain_size(self) -> int:
        """GPUs that reach each other over NVLink without leaving the node (1 without NVLink)."""
        return self.gpus_per_node if self.spec.scale_up is not None else 1

    # ----------------------------------------------------------------- links
    def link(self, link_id: int) -> Link:
        """The directed link with global id ``link_id``."""
        if link_id < 0 or link_id >= self.num_links:
            raise IndexError(f"link id {link_id} out of range [0, {self.num_links})")
        if link_id < self._node_links_end:
            node, t = divmod(link_id, self.node.num_links)
            lk = self.node.links[t]
            return Link(link_id, f"n{node}/{lk.src}", f"n{node}/{lk.dst}", lk.kind, lk.bandwidth_Bps,
                        lk.latency_s, lk.efficiency)
        fabric = self.fabric
        assert fabric is not None
        if link_id < self._nic_links_end:
            nic, down = divmod(link_id - self._node_links_end, 2)
            node, local = divmod(nic, fabric.nics_per_node)
            a, b = f"n{node}/nic{local}", f"leaf{fabric.leaf_of(nic)}"
            src, dst = (b, a) if down else (a, b)
            return Link(link_id, src, dst, fabric.kind, fabric.nic_bandwidth_Bps, fabric.latency_s, fabric.efficiency)
        pair, down = divmod(link_id - self._nic_links_end, 2)
        leaf, spine = divmod(pair, fabric.num_spines)
        a, b = f"leaf{leaf}", f"spine{spine}"
        src, dst = (b, a) if down else (a, b)
        return Link(link_id, src, dst, fabric.kind, fabric.uplink_bandwidth_Bps, fabric.latency_s, fabric.efficiency)

    def links(self) -> Iterator[Link]:
        """Every directed link (lazily; a 16,384-GPU cluster has a few hundred thousand)."""
        for link_id in range(self.num_links):
            yield self.link(link_id)

    # ----------------------------------------------------------------- routes
    def route(self, src: int, dst: int) -> Route:
        """Deterministic route from GPU ``src`` to GPU ``dst`` (cached).

        Inside a node: the widest, then shortest, path (NVLink before PCIe). Between nodes: the
        source GPU's nearest NIC, its leaf, a spine picked by a stable ECMP hash when the leaves
        differ, the destination's leaf, and the destination GPU's nearest NIC.
        """
        key = (src, dst)
        cached = self._routes.get(key)
        if cached is not None:
            return cached
        src_node, src_gpu = self.locate(src)
        dst_node, dst_gpu = self.locate(dst)
        node = self.node
        if src_node == dst_node:
            shape = node.path(node.gpus[src_gpu], node.gpus[dst_gpu])
            route = join(src, dst, [(shape.shifted(src_node * node.num_links), shape)])
        else:
            route = self._inter_node_route(src, dst, src_node, src_gpu, dst_node, dst_gpu)
        if len(self._routes) >= ROUTE_CACHE_ENTRIES:
            self._routes.clear()  # bounded memory: ~600 B a route (benchmarks/topology.py)
        self._routes[key] = route
        return route

    def _inter_node_route(self, src: int, dst: int, src_node: int, src_gpu: int, dst_node: int,
                          dst_gpu: int) -> Route:
        node, fabric = self.node, self.fabric
        assert fabric is not None
        src_nic_local = node.nic_of_gpu[src_gpu]
        dst_nic_local = node.nic_of_gpu[dst_gpu]
        if src_nic_local is None or dst_nic_local is None:
            gpu = src_gpu if src_nic_local is None else dst_gpu
            raise TopologyError(
                f"GPU {node.gpus[gpu]} of a node has no NIC it can reach",
                field="inter_node.nics_per_node",
                fix="give every host at least one NIC",
            )
        src_nic = src_node * fabric.nics_per_node + src_nic_local
        dst_nic = dst_node * fabric.nics_per_node + dst_nic_local
        t = node.num_links
        up = node.path(node.gpus[src_gpu], node.nics[src_nic_local])
        down = node.path(node.nics[dst_nic_local], node.gpus[dst_gpu])
        nic_link = self._nic_shape
        parts = [
            (up.shifted(src_node * t), up),
            ((self._node_links_end + 2 * src_nic,), nic_link),
        ]
        src_leaf, dst_leaf = fabric.leaf_of(src_nic), fabric.leaf_of(dst_nic)
        if src_leaf != dst_leaf:
            spine = fabric.spine_for(src_nic, dst_nic)
            uplink = self._uplink_shape
            base = self._nic_links_end
            parts.append(((base + 2 * (src_leaf * fabric.num_spines + spine),), uplink))
            parts.append(((base + 2 * (dst_leaf * fabric.num_spines + spine) + 1,), uplink))
        parts.append(((self._node_links_end + 2 * dst_nic + 1,), nic_link))
        parts.append((down.shifted(dst_node * t), down))
        return join(src, dst, parts)

    def nvswitch_ports(self, rank: int) -> tuple[int, int]:
        """Link ids (GPU -> NVSwitch, NVSwitch -> GPU) of GPU ``rank``: the path of NVLS traffic."""
        if self.spec.scale_up is None:
            raise TopologyError(f"{self.spec.name} has no NVSwitch", fix="use a preset with scale_up")
        node, gpu = self.locate(rank)
        base = node * self.node.num_links
        name = self.node.gpus[gpu]
        return base + self.node.link_index(name, "nvswitch"), base + self.node.link_index("nvswitch", name)

    def route_vertices(self, route: Route) -> list[str]:
        """Vertex names along a route, source GPU first."""
        if not route.links:
            node, gpu = self.locate(route.src)
            return [f"n{node}/{self.node.gpus[gpu]}"]
        links = [self.link(i) for i in route.links]
        return [links[0].src, *(lk.dst for lk in links)]

    # ----------------------------------------------------------------- whole graph
    @cached_property
    def vertex_counts(self) -> dict[str, int]:
        """Vertices per kind over the whole cluster (arithmetic, nothing materialised)."""
        counts: dict[str, int] = {}
        for _, kind in self.node.graph.nodes(data="kind"):
            counts[kind] = counts.get(kind, 0) + self.num_nodes
        if self.fabric is not None:
            counts["leaf_switch"] = self.fabric.num_leaves
            if self.fabric.num_spines:
                counts["spine_switch"] = self.fabric.num_spines
        return counts

    def to_networkx(self, max_vertices: int = 200_000) -> nx.DiGraph:
        """The whole cluster as one networkx DiGraph (edges carry ``link`` ids and link fields)."""
        per_node = self.node.graph.number_of_nodes()
        total = per_node * self.num_nodes + (
            self.fabric.num_leaves + self.fabric.num_spines if self.fabric else 0
        )
        if total > max_vertices:
            raise TopologyError(
                f"the cluster has {total} vertices, more than max_vertices={max_vertices}",
                fix="use routes and link ids (Topology.route, Topology.link) or raise max_vertices",
            )
        g = nx.DiGraph(name=self.spec.name)
        for n in range(self.num_nodes):
            for v, data in self.node.graph.nodes(data=True):
                g.add_node(f"n{n}/{v}", **{**data, "node": n})
        if self.fabric is not None:
            for leaf in range(self.fabric.num_leaves):
                g.add_node(f"leaf{leaf}", kind="leaf_switch")
            for spine in range(self.fabric.num_spines):
                g.add_node(f"spine{spine}", kind="spine_switch")
        for lk in self.links():
            g.add_edge(lk.src, lk.dst, link=lk.id, kind=lk.kind, bandwidth_Bps=lk.bandwidth_Bps,
                       latency_s=lk.latency_s, efficiency=lk.efficiency)
        return g

    def __repr__(self) -> str:
        return f"Topology({self.spec.name!r}, {self.num_nodes} nodes x {self.gpus_per_node} GPUs)"
