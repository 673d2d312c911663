"""A communicator: peers placed on GPUs of a topology, their routes and ring orders.

Peer ``i`` of a group is GPU ``ranks[i]``. Routes between peers are the topology's; the NVSwitch
pseudo-peer (``SWITCH``) is reached over the GPU's own NVLink port.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simdist.collectives.plan import SWITCH
from simdist.errors import SimdistError
from simdist.hardware.link import Route
from simdist.hardware.topology import Topology


@dataclass(eq=False, slots=True)
class Group:
    topology: Topology
    ranks: tuple[int, ...]
    _paths: dict[tuple[int, int], Route] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(set(self.ranks)) != len(self.ranks):
            raise SimdistError("a group lists the same GPU twice", field="--ranks", fix="give distinct ranks")
        for r in self.ranks:
            self.topology.locate(r)

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

    def path(self, src: int, dst: int) -> Route:
        """Route from peer ``src`` to peer ``dst`` (either may be SWITCH), cached."""
        key = (src, dst)
        route = self._paths.get(key)
        if route is None:
            route = self._paths[key] = self._resolve(src, dst)
        return route

    def _resolve(self, src: int, dst: int) -> Route:
        t = self.topology
        if src == SWITCH or dst == SWITCH:
            rank = self.ranks[dst if src == SWITCH else src]
            up, down = t.nvswitch_ports(rank)
            link = t.link(down if src == SWITCH else up)
            return Route(rank if dst == SWITCH else -1, rank if src == SWITCH else -1, (link.id,),
                         link.bandwidth_Bps, link.effective_bandwidth_Bps, link.latency_s)
        return t.route(self.ranks[src], self.ranks[dst])

    def nodes(self) -> list[int]:
        """Node of each peer."""
        return [self.topology.locate(r)[0] for r in self.ranks]

    def by_node(self) -> dict[int, list[int]]:
        """Peers grouped by node, in peer order."""
        out: dict[int, list[int]] = {}
        for peer, node in enumerate(self.nodes()):
            out.setdefault(node, []).append(peer)
        return out

    def ring_orders(self, channels: int) -> list[list[int]]:
        """One ring order per channel, NCCL-like: inside a node the ring visits the node's peers, and
        crossing between nodes it stays on one NIC rail where it can.

        Channel c rotates each node's peer list to start at its c-th peer; alternate nodes run their
        list backwards (a "snake"), so the peer that leaves a node and the peer that enters the next
        one have the same local position, hence the same NIC rail. Different channels leave through
        different peers, hence different NICs, as NCCL spreads channels over NICs.
        # Assumption: NCCL's ring search finds rail-aligned rings on rail-optimized fabrics (it does
        # with PXN); the snake reproduces that without modelling PXN forwarding.
        """
        groups = list(self.by_node().values())
        if len(groups) == 1:
            return [list(range(self.size)) for _ in range(channels)]
        orders: list[list[int]] = []
        for c in range(channels):
            order: list[int] = []
            for n, peers in enumerate(groups):
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
        groups = self.by_node()
        if len(groups) == 1:
            return 1
        t = self.topology
        nics = {t.node.nic_of_gpu[t.locate(self.ranks[p])[1]] for p in next(iter(groups.values()))}
        return max(1, min(len(nics), min(len(v) for v in groups.values())))
