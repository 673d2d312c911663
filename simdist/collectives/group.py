"""A communicator: peers placed on GPUs of a topology, their routes and ring orders.

Peer ``i`` of a group is GPU ``ranks[i]``. Routes between peers are the topology's; the NVSwitch
pseudo-peer (``SWITCH``) is reached over the GPU's own NVLink port, the fabric's (``FABRIC``, SHARP) over
the GPU's path to its NIC and the NIC's link to its leaf switch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simdist.collectives.plan import FABRIC, NODE_SWITCH, SWITCH
from simdist.errors import SimdistError
from simdist.hardware import batch
from simdist.hardware.link import Route
from simdist.hardware.node_rings import node_rings
from simdist.hardware.topology import Topology


@dataclass(eq=False, slots=True)
class Group:
    topology: Topology
    ranks: tuple[int, ...]
    extra_latency_by_class: dict[str, float] = field(default_factory=dict)
    """Latency added to every path by its class (nvlink, pcie, net): a protocol's cost beyond the wire."""
    _paths: dict[tuple[int, int], Route] = field(default_factory=dict)
    memo: dict = field(default_factory=dict)
    """What algorithms derive from the peers' placement alone (tree shapes, planned rates), shared by
    the copies `priced` makes: the closed form of every protocol and size of one group reuses it."""

    def __post_init__(self) -> None:
        if len(set(self.ranks)) != len(self.ranks):
            raise SimdistError("a group lists the same GPU twice", field="--ranks", fix="give distinct ranks")
        n = self.topology.num_gpus
        for r in self.ranks:
            if not 0 <= r < n:
                self.topology.locate(r)  # raises the TopologyError

    @classmethod
    def first(cls, topology: Topology, num_peers: int) -> Group:
        """The first ``num_peers`` GPUs of the cluster (node-major), as nccl-tests runs on whole nodes."""
        if num_peers < 1:
            raise SimdistError(f"a group needs at least 1 rank, got {num_peers}", field="--ranks",
                               fix="give --ranks 2 or more")
        if num_peers > topology.num_gpus:
            raise SimdistError(
                f"{num_peers} ranks but the cluster has {topology.num_gpus} GPUs "
                f"({topology.num_nodes} nodes x {topology.gpus_per_node})",
                field="--ranks",
                fix=f"use --ranks {topology.num_gpus} or fewer, "
                f"or --num-nodes {-(-num_peers // topology.gpus_per_node)}",
            )
        return cls(topology, tuple(range(num_peers)))

    @property
    def size(self) -> int:
        return len(self.ranks)

    def priced(self, extra_latency_by_class: dict[str, float]) -> Group:
        """The same peers with a protocol's extra latency on every path (see collectives.nccl_model)."""
        return Group(self.topology, self.ranks, dict(extra_latency_by_class), memo=self.memo)

    def subgroup(self, peers: list[int]) -> Group:
        """The group of some of these peers (in the given order), keeping the protocol pricing."""
        return Group(self.topology, tuple(self.ranks[p] for p in peers), dict(self.extra_latency_by_class))

    def path(self, src: int, dst: int) -> Route:
        """Route from peer ``src`` to peer ``dst`` (either may be SWITCH, a node's NVSwitch or FABRIC), cached."""
        key = (src, dst)
        route = self._paths.get(key)
        if route is None:
            route = self._resolve(src, dst)
            extra = self.extra_latency_by_class.get(self.path_class(route), 0.0) if self.extra_latency_by_class else 0.0
            if extra:
                route = Route(route.src, route.dst, route.links, route.bandwidth_Bps,
                              route.effective_bandwidth_Bps, route.latency_s + extra)
            self._paths[key] = route
        return route

    def path_class(self, route: Route) -> str:
        """nvlink, pcie or net: the slowest kind of link a route crosses (NCCL's path classes)."""
        kinds = {self.topology.link(link).kind for link in route.links}
        if kinds & {"infiniband", "roce", "ethernet"}:
            return "net"
        if kinds & {"pcie", "cpu_interconnect"}:
            return "pcie"
        return "nvlink"

    def paths(self, src: np.ndarray, dst: np.ndarray) -> batch.RouteBatch:
        """Routes from peer ``src[i]`` to peer ``dst[i]`` for many pairs at once (numpy): the same
        links, bandwidths and latency (protocol extra included) as ``path(src[i], dst[i])``."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        switch = (src < 0) | (dst < 0)  # SWITCH or FABRIC: resolved one by one
        ranks = np.asarray(self.ranks, dtype=np.int64)
        plain = ~switch
        a, b = ranks[src[plain]], ranks[dst[plain]]
        # every protocol priced asks for the same edges: memoised by the topology (Topology.route_batches)
        key = (a.tobytes(), b.tobytes())
        out = self.topology.route_batches.get(key)
        if out is None:
            out = self.topology.route_batches.put(key, batch.routes(self.topology, a, b))
        if self.extra_latency_by_class:
            out = out.with_latency(out.latency_s + self.extra_latency(out.kind_mask))
        if not switch.any():
            return out
        routes = [self.path(int(s), int(d)) for s, d in zip(src[switch], dst[switch], strict=True)]
        masks = [int(np.bitwise_or.reduce([batch.KIND_BIT[self.topology.link(link).kind] for link in r.links]))
                 if r.links else 0 for r in routes]
        return batch.interleave(switch, out, batch.RouteBatch.from_routes(routes, np.asarray(masks)))

    def extra_latency(self, kind_mask: np.ndarray) -> np.ndarray:
        """The protocol latency added to routes of these kind masks (`batch.KIND_BIT`): by the slowest
        kind of link crossed, as `path_class` names it."""
        extra = self.extra_latency_by_class
        if not extra:
            return np.zeros(len(kind_mask))
        bits = batch.KIND_BIT
        net = bits["infiniband"] | bits["roce"] | bits["ethernet"]
        pcie = bits["pcie"] | bits["cpu_interconnect"]
        return np.where(kind_mask & net, extra.get("net", 0.0),
                        np.where(kind_mask & pcie, extra.get("pcie", 0.0), extra.get("nvlink", 0.0)))

    def _resolve(self, src: int, dst: int) -> Route:
        t = self.topology
        if src == FABRIC or dst == FABRIC:
            return t.fabric_port(self.ranks[dst if src == FABRIC else src], upward=dst == FABRIC)
        if SWITCH in (src, dst) or min(src, dst) <= NODE_SWITCH:
            downward = src < 0  # SWITCH or a node's NVSwitch (NODE_SWITCH - n) sends
            rank = self.ranks[dst if downward else src]
            up, down = t.nvswitch_ports(rank)
            link = t.link(down if downward else up)
            return Route(-1 if downward else rank, rank if downward else -1, (link.id,),
                         link.bandwidth_Bps, link.effective_bandwidth_Bps, link.latency_s)
        return t.route(self.ranks[src], self.ranks[dst])

    def crosses_planes(self) -> bool:
        """Whether routes between the peers cross from one plane of a multi-plane fabric to another (relayed over
        NVLink by NCCL's PXN, `Topology.send_nic`): a peer's inter-node routes then leave by several NICs, which the
        per-peer NIC structure of simdist.collectives.all_pairs does not describe."""
        hit = self.memo.get("crosses_planes")
        if hit is None:
            t = self.topology
            fabric = t.fabric
            hit = False
            if fabric is not None and fabric.planes > 1 and self.num_nodes > 1:
                nics = {t.node.nic_of_gpu[t.locate(r)[1]] for r in self.ranks}
                hit = len({fabric.plane_of_local(n) for n in nics if n is not None}) > 1
            self.memo["crosses_planes"] = hit
        return hit

    def nodes(self) -> list[int]:
        """Node of each peer."""
        gpn = self.topology.gpus_per_node  # the ranks are checked: GPU r is on node r // gpus_per_node
        return [r // gpn for r in self.ranks]

    def by_node(self) -> dict[int, list[int]]:
        """Peers grouped by node, in peer order."""
        return {node: list(peers) for node, peers in self._placement()[0]}

    @property
    def num_nodes(self) -> int:
        """How many nodes the group's peers sit on (`by_node`'s length, without building it)."""
        return len(self._placement()[0])

    def _placement(self) -> tuple[tuple[tuple[int, tuple[int, ...]], ...], int]:
        """((node, its peers) in order of first peer, default channels), memoised by the topology (by ranks):
        asked for by every algorithm and protocol priced."""
        key = tuple(self.ranks)
        hit = self.topology.placements.get(key)
        if hit is not None:
            return hit
        out: dict[int, list[int]] = {}
        for peer, node in enumerate(self.nodes()):
            out.setdefault(node, []).append(peer)
        placement = tuple((node, tuple(peers)) for node, peers in out.items())
        channels = self._default_channels(out)
        return self.topology.placements.put(key, (placement, channels))

    def ring_orders(self, channels: int) -> list[list[int]]:
        """One ring order per channel, NCCL-like: inside a node the ring visits the node's peers, and
        crossing between nodes it stays on one NIC rail where it can.

        Where a NIC serves several of a node's peers (PCIe boxes: one NIC per PCIe switch), channel c
        uses NIC c mod (NICs used): each node's ring starts at one peer next to that NIC and ends at
        another, so both inter-node hops of the node go through that NIC, as NCCL's rings enter and
        leave a node next to their NIC (src/graph/search.cc).
        Where every peer has a NIC of its own (DGX: GPU i on NIC i), channel c rotates each node's
        peer list to start at its c-th peer and alternate nodes run it backwards (a "snake"): the peer
        that leaves a node and the peer that enters the next have the same local position, hence the
        same NIC rail; channels leave through different peers, hence different NICs.
        # Assumption: NCCL's ring search finds rail-aligned rings on rail-optimized fabrics (it does
        # with PXN); the snake reproduces that without modelling PXN forwarding.
        """
        # groups are rebuilt for every protocol priced: memoised by the topology (by ranks and channels)
        key = (self.ranks, channels)
        cached = self.topology.ring_orders.get(key)
        if cached is not None:
            return [list(o) for o in cached]
        orders = self._ring_orders(channels)
        self.topology.ring_orders.put(key, tuple(tuple(o) for o in orders))
        return orders

    def _ring_orders(self, channels: int) -> list[list[int]]:
        groups = list(self.by_node().values())
        if len(groups) == 1:
            rings = self._node_rings()
            return [list(rings[c % len(rings)]) for c in range(channels)]
        if all(len(peers) == 1 for peers in groups):
            # one peer per node (a data-parallel group across nodes): every channel visits the nodes in order
            return [[peers[0] for peers in groups] for _ in range(channels)]
        nic_of = [self.topology.node.nic_of_gpu[self.topology.locate(r)[1]] for r in self.ranks]
        node_nics = [sorted({nic_of[p] for p in peers if nic_of[p] is not None}) for peers in groups]
        orders: list[list[int]] = []
        for c in range(channels):
            order: list[int] = []
            for n, peers in enumerate(groups):
                nics = node_nics[n]
                near = [p for p in peers if nics and nic_of[p] == nics[c % len(nics)]]
                if len(near) >= 2:
                    rest = [p for p in peers if p not in (near[0], near[1])]
                    order.extend([near[0], *rest, near[1]])
                    continue
                k = c % len(peers)
                rotated = peers[k:] + peers[:k]
                order.extend(rotated if n % 2 == 0 else rotated[::-1])
            orders.append(order)
        return orders

    def default_channels(self) -> int:
        """Channels NCCL would run: one per NIC a node's peers use when the group spans nodes.

        # Assumption: multi-node rings use one channel per NIC of the node (NCCL typically opens
        # 2 channels per NIC; the data split is what matters here and is the same).
        """
        return self._placement()[1]

    def _node_rings(self) -> tuple[tuple[int, ...], ...]:
        """A group inside one node: its rings, NCCL's search over a node given as a graph
        (simdist.hardware.node_rings); the peer order on a template node (NVSwitch crossbar or PCIe tree)."""
        t = self.topology
        if t.spec.node is None:
            return (tuple(range(self.size)),)
        return node_rings(t.node, tuple(t.locate(r)[1] for r in self.ranks))

    def _default_channels(self, groups: dict[int, list[int]]) -> int:
        if len(groups) <= 1:
            return len(self._node_rings())
        t = self.topology
        nics = {t.node.nic_of_gpu[t.locate(self.ranks[p])[1]] for p in next(iter(groups.values()))}
        return max(1, min(len(nics), min(len(v) for v in groups.values())))
