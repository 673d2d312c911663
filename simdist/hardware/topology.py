"""The cluster as a graph: one node graph placed ``num_nodes`` times, plus the fabric, plus routes.

Global link ids are dense and computed, never stored per link (`simdist.hardware.layout`, `Topology.layout`):
node links first, then NIC <-> leaf links, then leaf <-> spine links.
Vertex names: ``n{node}/{local}`` inside nodes (``n3/gpu5``, ``n3/h0/pcie1``, ``n3/nvswitch``),
``leaf{i}`` and ``spine{j}`` in the fabric. GPU ``rank`` r lives on node r // gpus_per_node.

A topology owns the memo tables of values derived from it alone (`simdist.hardware.memo`): routes here, route
batches, ring orders and peer placements for `simdist.collectives.group`. Each is bounded (see the constants).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from simdist.errors import TopologyError
from simdist.hardware.clock import capped
from simdist.hardware.fabric import Fabric, build_fabric
from simdist.hardware.gpus import gpu_preset
from simdist.hardware.layout import NIC, NODE, SPINE, LinkLayout
from simdist.hardware.link import Link, PathShape, Route, join
from simdist.hardware.memo import Memo
from simdist.hardware.node import NodeGraph, build_node, injection_flow_Bps, nvlink_reach
from simdist.spec.gpu import GpuSpec
from simdist.spec.topology import TopologySpec

if TYPE_CHECKING:
    import networkx as nx

    from simdist.hardware.batch import RouteBatch

ROUTE_CACHE_ENTRIES = 1 << 18
"""Routes kept per topology before the cache is emptied (~150 MiB at the limit: ~600 B a route,
benchmarks/topology.py). A plain dict, not a `Memo`: a cached route is the hot path (one dict lookup)."""
ROUTE_TEMPLATES_MAX = 1 << 16
"""Route templates (`simdist.hardware.batch`: one per class of GPU pairs, at most 4 x gpus_per_node^2) kept per
topology before they are emptied (a few hundred bytes each)."""
ROUTE_BATCH_MEMO = (1024, 2**30)
"""(entries, bytes) kept of `route_batches`: vectorised routes by (sources, destinations). A 16,384-rank ring's
8 channels charge 19 MiB, a 512-rank all_to_all's fast plan 80 MiB (`RouteBatch.nbytes`)."""
RING_ORDER_MEMO = (4096, 128 * 2**20)
"""(entries, bytes) kept of `ring_orders`: ring orders by (ranks, channels); 16,384 ranks x 8 channels charge 5 MiB."""
LINK_LAYOUT_MEMO = (64, 8 * 2**20)
"""(entries, bytes) kept of `link_layouts`: short, as its reuse is the same ring's next op (the contention estimate's
all-gather, reduce-scatter and all-reduce of one group); a layout of the README's search holds 32 KiB median."""
PLACEMENT_MEMO = (4096, 128 * 2**20)
"""(entries, bytes) kept of `placements`: peers by node and default channels by ranks; 16,384 ranks charge 1.4 MiB."""

GROUPS_MAX = 512
"""Groups (simdist.collectives.group.Group, by ranks) a topology keeps for its pricers; past it they are dropped."""


class _Groups(dict):
    """Groups by ranks, shared by every pricer of a topology (a group memoises its routes' structure, e.g. an
    all-to-all's all pairs, for every op and size); emptied when it would grow past GROUPS_MAX."""

    def __setitem__(self, key: tuple[int, ...], value: object) -> None:
        if len(self) >= GROUPS_MAX:
            self.clear()
        super().__setitem__(key, value)


class Topology:
    """A built cluster. Cheap to build at any size; routes are computed on demand and cached."""

    def __init__(self, spec: TopologySpec, *, cluster_num_gpus: int | None = None,
                 failed_uplinks: Iterable[tuple[int, int]] = ()) -> None:
        self.spec = spec
        self.cluster_num_gpus = spec.num_gpus if cluster_num_gpus is None else cluster_num_gpus
        """GPUs of the whole cluster; more than num_gpus for a job on part of it (simdist.hardware.placement)."""
        self.gpu: GpuSpec = gpu_preset(spec.gpu) if isinstance(spec.gpu, str) else spec.gpu
        if spec.gpu_power_limit_w is not None:
            self.gpu = capped(self.gpu, spec.gpu_power_limit_w)
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
            failed = frozenset((int(a), int(b)) for a, b in failed_uplinks)
            if failed and self.fabric.routing == "adaptive":
                raise TopologyError("failed leaf-spine links under adaptive routing are not modelled (its spines are "
                                    "one pipe)", field="faults.failed_links",
                                    fix="drop faults.failed_links, or use inter_node.routing: ecmp")
            if failed and self.fabric.planes > 1:
                raise TopologyError("failed leaf-spine links of a multi-plane fabric are not modelled",
                                    field="faults.failed_links", fix="drop faults.failed_links, or use "
                                                                     "inter_node.planes: 1")
            if failed and self.fabric.cores_per_group:
                raise TopologyError("failed leaf-spine links of a 3-tier fabric are not modelled",
                                    field="faults.failed_links", fix="drop faults.failed_links, or use "
                                                                     "inter_node.tiers: 2")
            if failed:
                self.fabric = dataclasses.replace(self.fabric, failed_uplinks=failed)
                cut = self.fabric.unreachable_pairs()
                if cut:
                    a, b = cut[0]
                    raise TopologyError(
                        f"the failed leaf-spine links leave leaf{a} with no spine at all" if a == b else
                        f"the failed leaf-spine links leave leaf{a} and leaf{b} without a spine both reach",
                        field="faults.failed_links", fix="fail fewer uplinks: every pair of leaves needs one spine "
                                                         "they both still reach")
        elif tuple(failed_uplinks):
            raise TopologyError("failed leaf-spine links in a cluster of one node", field="faults.failed_links",
                                fix="drop faults.failed_links: one node has no fabric")
        self.layout = LinkLayout.of(self.num_nodes, self.node, self.fabric)
        """Where every link sits among the global ids, and its capacity by id."""
        self.num_links = self.layout.num_links
        self._routes: dict[tuple[int, int], Route] = {}
        self.route_templates: dict[int, object] = {}
        """`simdist.hardware.batch.routes`' templates by class of GPU pairs (source and destination GPU inside their
        nodes, inter-node, crossing the spines): one `route` call per class for every batch of this topology."""
        # Memo tables that simdist.collectives.group fills: values derived from this topology alone, keyed by ranks
        # (never by an object's id), freed with the topology.
        self.route_batches: Memo[tuple[bytes, bytes], RouteBatch] = Memo("route_batches", *ROUTE_BATCH_MEMO)
        """Vectorised routes (`simdist.hardware.batch.routes`) by (sources, destinations) as int64 bytes."""
        self.link_layouts: Memo[tuple, object] = Memo("link_layouts", *LINK_LAYOUT_MEMO)
        """Where a plan's transfers land for its translates (`simdist.predict.link_loads._layout`), by their ranks."""
        self.ring_orders: Memo[tuple[tuple[int, ...], int], tuple[tuple[int, ...], ...]] = Memo(
            "ring_orders", *RING_ORDER_MEMO)
        """Ring orders by (group ranks, channels) (`simdist.collectives.group.Group.ring_orders`)."""
        self.placements: Memo[tuple[int, ...], tuple[tuple[tuple[int, tuple[int, ...]], ...], int]] = Memo(
            "placements", *PLACEMENT_MEMO)
        """(node, its peers) in order and default channels by group ranks (`Group.by_node`)."""
        self.groups: dict[tuple[int, ...], object] = _Groups()
        """Groups by ranks for the closed form's and the engine's pricing alike (simdist.analytic.pricing,
        simdist.predict.price): each computes a group's routes once."""
        if self.fabric is not None:
            f = self.fabric
            self._nic_shape = PathShape((), f.nic_bandwidth_Bps, self.layout.nic_capacity_Bps, f.latency_s)
            self._uplink_shape = PathShape((), f.uplink_bandwidth_Bps, self.layout.uplink_capacity_Bps, f.latency_s)
            self._core_shape = PathShape((), f.core_bandwidth_Bps, self.layout.core_capacity_Bps, f.latency_s)

    def with_failed_uplinks(self, failed: Iterable[tuple[int, int]]) -> Topology:
        """This cluster with the (leaf, spine) links in ``failed`` down: a new Topology (its routes and caches are
        its own), ECMP routing around them (`simdist.hardware.fabric.Fabric.spine_for`)."""
        failed = tuple(failed)
        if not failed:
            return self
        prior = self.fabric.failed_uplinks if self.fabric is not None else frozenset()
        return Topology(self.spec, cluster_num_gpus=self.cluster_num_gpus, failed_uplinks=prior | set(failed))

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
        return self.layout.node_links_end

    @property
    def nvlink_domain_size(self) -> int:
        """GPUs that reach each other over NVLink without leaving the node (1 without NVLink); for a node given as
        a graph, those gpu0 reaches over NVLink links alone."""
        if self.spec.node is None:
            return self.gpus_per_node if self.spec.scale_up is not None else 1
        return nvlink_reach(self.node)

    # ----------------------------------------------------------------- links
    def link(self, link_id: int) -> Link:
        """The directed link with global id ``link_id``."""
        link_class, a_index, b_index, down = self.layout.locate(link_id)  # IndexError outside the ids
        if link_class == NODE:
            node, lk = a_index, self.node.links[b_index]
            return Link(link_id, f"n{node}/{lk.src}", f"n{node}/{lk.dst}", lk.kind, lk.bandwidth_Bps,
                        lk.latency_s, lk.efficiency)
        fabric = self.fabric
        assert fabric is not None
        if link_class == NIC:
            node, local = fabric.nic_location(a_index)
            a, b = f"n{node}/nic{local}", f"leaf{fabric.leaf_of(a_index)}"
            src, dst = (b, a) if down else (a, b)
            return Link(link_id, src, dst, fabric.kind, fabric.nic_bandwidth_Bps, fabric.latency_s, fabric.efficiency)
        if link_class == SPINE:  # a leaf's spine b_index is its pod's
            a, b = f"leaf{a_index}", f"spine{fabric.pod_of(a_index) * fabric.num_spines + b_index}"
            src, dst = (b, a) if down else (a, b)
            return Link(link_id, src, dst, fabric.kind, fabric.uplink_bandwidth_Bps, fabric.latency_s,
                        fabric.efficiency)
        a, b = f"spine{a_index}", f"core{(a_index % fabric.num_spines) * fabric.cores_per_group + b_index}"
        src, dst = (b, a) if down else (a, b)
        return Link(link_id, src, dst, fabric.kind, fabric.core_bandwidth_Bps, fabric.latency_s, fabric.efficiency)

    def links(self) -> Iterator[Link]:
        """Every directed link (lazily; a 16,384-GPU cluster has a few hundred thousand)."""
        for link_id in range(self.num_links):
            yield self.link(link_id)

    # ----------------------------------------------------------------- routes
    def route(self, src: int, dst: int) -> Route:
        """Deterministic route from GPU ``src`` to GPU ``dst`` (cached).

        Inside a node: the widest, then shortest, path (NVLink before PCIe). Between nodes: the
        source GPU's nearest NIC, its leaf, a spine picked by a stable ECMP hash when the leaves
        differ (and, 3 tiers, a core of that spine's group by a second hash when the pods differ, then the
        same spine index in the destination's pod), the destination's leaf, and the destination GPU's
        nearest NIC.
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
            route = join(src, dst, [(shape.shifted(self.layout.node_link(src_node, 0)), shape)])
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
        src_nic_local = self.send_nic(src_gpu, dst_gpu)
        dst_nic_local = node.nic_of_gpu[dst_gpu]
        if src_nic_local is None or dst_nic_local is None:
            gpu = src_gpu if src_nic_local is None else dst_gpu
            raise TopologyError(
                f"GPU {node.gpus[gpu]} of a node has no NIC it can reach",
                field="inter_node.nics_per_node",
                fix="give every host at least one NIC",
            )
        src_nic = fabric.nic_id(src_node, src_nic_local)
        dst_nic = fabric.nic_id(dst_node, dst_nic_local)
        layout = self.layout
        down = node.path(node.nics[dst_nic_local], node.gpus[dst_gpu])
        nic_link = self._nic_shape
        offset = layout.node_link(src_node, 0)
        parts = [(up.shifted(offset), up) for up in self.send_path(src_gpu, dst_gpu)]
        parts.append(((layout.nic_up(src_nic),), nic_link))
        src_leaf, dst_leaf = fabric.leaf_of(src_nic), fabric.leaf_of(dst_nic)
        if src_leaf != dst_leaf:
            spine = fabric.spine_for(src_nic, dst_nic)
            uplink = self._uplink_shape
            parts.append(((layout.spine_up(src_leaf, spine),), uplink))
            src_pod, dst_pod = fabric.pod_of(src_leaf), fabric.pod_of(dst_leaf)
            # 3 tiers: spine -> core -> the same spine index of the destination's pod (planes: never, PXN)
            if src_pod != dst_pod and fabric.cores_per_group:
                core = fabric.core_for(src_nic, dst_nic)
                s = fabric.num_spines
                parts.append(((layout.core_up(src_pod * s + spine, core),), self._core_shape))
                parts.append(((layout.core_down(dst_pod * s + spine, core),), self._core_shape))
            parts.append(((layout.spine_down(dst_leaf, spine),), uplink))
        parts.append(((layout.nic_down(dst_nic),), nic_link))
        parts.append((down.shifted(layout.node_link(dst_node, 0)), down))
        return join(src, dst, parts)

    def nvswitch_ports(self, rank: int) -> tuple[int, int]:
        """Link ids (GPU -> NVSwitch, NVSwitch -> GPU) of GPU ``rank``: the path of NVLS traffic."""
        if self.spec.scale_up is None:
            raise TopologyError(f"{self.spec.name} has no NVSwitch", fix="use a preset with scale_up")
        node, gpu = self.locate(rank)
        name = self.node.gpus[gpu]
        return (self.layout.node_link(node, self.node.link_index(name, "nvswitch")),
                self.layout.node_link(node, self.node.link_index("nvswitch", name)))

    def fabric_port(self, rank: int, upward: bool) -> Route:
        """GPU ``rank`` up to its leaf switch (its path to its nearest NIC, then the NIC's link to the leaf), or
        back down: the path of in-network reduction traffic (SHARP, simdist.collectives.collnet); the other end
        is -1 (the fabric)."""
        if self.fabric is None:
            raise TopologyError(f"{self.spec.name} has one node and no fabric", fix="use num_nodes >= 2")
        node_index, gpu = self.locate(rank)
        node, layout = self.node, self.layout
        local = node.nic_of_gpu[gpu]
        if local is None:
            raise TopologyError(f"GPU {node.gpus[gpu]} of a node has no NIC it can reach",
                                field="inter_node.nics_per_node", fix="give every host at least one NIC")
        nic = self.fabric.nic_id(node_index, local)
        if upward:
            up = node.path(node.gpus[gpu], node.nics[local])
            return join(rank, -1, [(up.shifted(layout.node_link(node_index, 0)), up),
                                   ((layout.nic_up(nic),), self._nic_shape)])
        down = node.path(node.nics[local], node.gpus[gpu])
        return join(-1, rank, [((layout.nic_down(nic),), self._nic_shape),
                               (down.shifted(layout.node_link(node_index, 0)), down)])

    def route_vertices(self, route: Route) -> list[str]:
        """Vertex names along a route, source GPU first."""
        if not route.links:
            node, gpu = self.locate(route.src)
            return [f"n{node}/{self.node.gpus[gpu]}"]
        links = [self.link(i) for i in route.links]
        return [links[0].src, *(lk.dst for lk in links)]

    @cached_property
    def node_injection_Bps(self) -> float:
        """How much one node can push out of all its NICs at once (max flow GPUs -> NICs -> fabric), nominal."""
        if self.fabric is None:
            raise TopologyError(f"{self.spec.name} has one node and no fabric", fix="use num_nodes >= 2")
        return injection_flow_Bps(self.node, self.fabric.nic_bandwidth_Bps)

    def send_nic(self, src_gpu: int, dst_gpu: int) -> int | None:
        """The local NIC a route from local GPU ``src_gpu`` to local GPU ``dst_gpu`` of another node leaves by: the
        source GPU's nearest NIC, or, where the fabric has planes and that NIC is on another plane than the
        destination's, the NIC of the destination's plane beside it (the same host's group of ``planes`` NICs):
        NCCL's PXN (PCI x NVLink, NCCL 2.12: the data crosses over NVLink to the GPU next to the NIC the peer is
        reached by, whose proxy sends it; NVIDIA/nccl src/graph/paths.cc, ncclTopoGetIntermediateRank and
        ncclTopoGetPxnRanks, on unless NCCL_PXN_DISABLE). None: the GPU reaches no NIC."""
        node, fabric = self.node, self.fabric
        own = node.nic_of_gpu[src_gpu]
        dst = node.nic_of_gpu[dst_gpu]
        if fabric is None or fabric.planes == 1 or own is None or dst is None:
            return own
        planes = fabric.planes
        return own - own % planes + dst % planes

    @cached_property
    def send_nic_table(self) -> np.ndarray:
        """[g, g] `send_nic` of every pair of local GPUs (-1: none), for `simdist.hardware.batch`."""
        g = self.gpus_per_node
        return np.array([[-1 if (x := self.send_nic(a, b)) is None else x for b in range(g)] for a in range(g)],
                        dtype=np.int64)

    def send_path(self, src_gpu: int, dst_gpu: int) -> list:
        """The node-local path shapes (`NodeGraph.path`) from local GPU ``src_gpu`` to the NIC `send_nic` picks:
        its own path to its nearest NIC, or (PXN) the path to the GPU next to the NIC of the destination's plane and
        on from that GPU to its NIC (the GPU through which the route reaches the NIC directly where none is)."""
        node = self.node
        nic = self.send_nic(src_gpu, dst_gpu)
        if nic == node.nic_of_gpu[src_gpu]:
            return [node.path(node.gpus[src_gpu], node.nics[nic])]
        relay = next((g for g, n in enumerate(node.nic_of_gpu) if n == nic), None)
        if relay is None or relay == src_gpu:
            return [node.path(node.gpus[src_gpu], node.nics[nic])]
        return [node.path(node.gpus[src_gpu], node.gpus[relay]), node.path(node.gpus[relay], node.nics[nic])]

    # ----------------------------------------------------------------- whole graph
    @cached_property
    def vertex_counts(self) -> dict[str, int]:
        """Vertices per kind over the whole cluster (arithmetic, nothing materialised)."""
        counts: dict[str, int] = {}
        for attrs in self.node.vertices.values():
            kind = attrs["kind"]
            counts[kind] = counts.get(kind, 0) + self.num_nodes
        if self.fabric is not None:
            counts["leaf_switch"] = self.fabric.num_leaves
            if self.fabric.num_spines:
                counts["spine_switch"] = self.fabric.num_spines * self.fabric.num_pods
            if self.fabric.cores_per_group:
                counts["core_switch"] = self.fabric.num_cores
        return counts

    def to_networkx(self, max_vertices: int = 200_000) -> nx.DiGraph:
        """The whole cluster as one networkx DiGraph (edges carry ``link`` ids and link fields)."""
        import networkx as nx

        per_node = len(self.node.vertices)
        total = per_node * self.num_nodes + (
            self.fabric.num_leaves + self.fabric.num_spines * self.fabric.num_pods + self.fabric.num_cores
            if self.fabric else 0
        )
        if total > max_vertices:
            raise TopologyError(
                f"the cluster has {total} vertices, more than max_vertices={max_vertices}",
                fix="use routes and link ids (Topology.route, Topology.link) or raise max_vertices",
            )
        g = nx.DiGraph(name=self.spec.name)
        for n in range(self.num_nodes):
            for v, data in self.node.vertices.items():
                g.add_node(f"n{n}/{v}", **{**data, "node": n})
        if self.fabric is not None:
            for leaf in range(self.fabric.num_leaves):
                g.add_node(f"leaf{leaf}", kind="leaf_switch")
            for spine in range(self.fabric.num_spines * self.fabric.num_pods):
                g.add_node(f"spine{spine}", kind="spine_switch")
            for core in range(self.fabric.num_cores):
                g.add_node(f"core{core}", kind="core_switch")
        for lk in self.links():
            g.add_edge(lk.src, lk.dst, link=lk.id, kind=lk.kind, bandwidth_Bps=lk.bandwidth_Bps,
                       latency_s=lk.latency_s, efficiency=lk.efficiency)
        return g

    def __repr__(self) -> str:
        return f"Topology({self.spec.name!r}, {self.num_nodes} nodes x {self.gpus_per_node} GPUs)"
