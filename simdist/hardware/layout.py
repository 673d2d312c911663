"""Global link ids: where every directed link of a cluster sits in [0, num_links), in closed form.

The ids are dense and computed, never stored per link (N nodes of T local links each, L leaves, S spines):
  [0, N x T)                node links: node n, local link t -> n x T + t
  [N x T, + 2 x NICs)       NIC <-> leaf: NIC g up (to its leaf) 2g, down (to the NIC) 2g + 1
  [.., + 2 x L x S)         leaf <-> spine: leaf l, spine s up 2(l S + s), down 2(l S + s) + 1
  [.., + 2 x Q x S x C)     spine <-> core (3 tiers: Q pods, C cores per group): spine q S + s of pod q to core c of
                            group s up 2((q S + s) C + c), down 2((q S + s) C + c) + 1
(with 3 tiers, S is the spines of one pod, and a leaf's spine s is its pod's.)

`LinkLayout` is the one place this arithmetic is written: `Topology` (one route, one link) and
`simdist.hardware.batch` (many routes, many capacities) both call it. Its id functions take Python ints or
numpy integer arrays (elementwise) and return the same kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simdist.hardware.fabric import Fabric, IntOrArray
from simdist.hardware.node import NodeGraph

NODE, NIC, SPINE, CORE = 0, 1, 2, 3
"""Link classes, in id order: inside a node, NIC <-> leaf, leaf <-> spine, spine <-> core."""


@dataclass(frozen=True, slots=True, eq=False)
class LinkLayout:
    num_nodes: int
    links_per_node: int
    """T: links inside one node (`NodeGraph.links`), placed ``num_nodes`` times."""
    num_nics: int
    num_leaves: int
    num_spines: int
    node_links_end: int
    """Node links have ids below this."""
    nic_links_end: int
    """NIC <-> leaf links have ids in [node_links_end, nic_links_end); leaf <-> spine links from here on."""
    spine_links_end: int
    """Leaf <-> spine links have ids below this; spine <-> core links (3 tiers) from here on."""
    cores_per_group: int
    num_links: int
    local_capacity_Bps: tuple[float, ...]
    """Effective bandwidth (bandwidth x efficiency, as `Link.effective_bandwidth_Bps`) of local link t."""
    nic_capacity_Bps: float
    uplink_capacity_Bps: float
    core_capacity_Bps: float
    _local_capacity: np.ndarray

    @classmethod
    def of(cls, num_nodes: int, node: NodeGraph, fabric: Fabric | None) -> LinkLayout:
        t = node.num_links
        nics = fabric.num_nics if fabric is not None else 0
        spines = fabric.num_spines if fabric is not None else 0
        leaves = fabric.num_leaves if fabric is not None else 0
        node_end = num_nodes * t
        nic_end = node_end + 2 * nics
        local = tuple(lk.bandwidth_Bps * lk.efficiency for lk in node.links)
        array = np.array(local, dtype=float)
        array.setflags(write=False)
        spine_end = nic_end + 2 * leaves * spines
        cores = fabric.cores_per_group if fabric is not None else 0
        pods = fabric.num_pods if fabric is not None else 1
        return cls(
            num_nodes=num_nodes, links_per_node=t, num_nics=nics, num_leaves=leaves, num_spines=spines,
            node_links_end=node_end, nic_links_end=nic_end, spine_links_end=spine_end, cores_per_group=cores,
            num_links=spine_end + 2 * pods * spines * cores,
            local_capacity_Bps=local,
            nic_capacity_Bps=fabric.nic_bandwidth_Bps * fabric.efficiency if fabric is not None else 0.0,
            uplink_capacity_Bps=fabric.uplink_bandwidth_Bps * fabric.efficiency if fabric is not None else 0.0,
            core_capacity_Bps=fabric.core_bandwidth_Bps * fabric.efficiency if fabric is not None else 0.0,
            _local_capacity=array,
        )

    @property
    def num_nic_links(self) -> int:
        return self.nic_links_end - self.node_links_end

    @property
    def num_spine_links(self) -> int:
        return self.spine_links_end - self.nic_links_end

    @property
    def num_core_links(self) -> int:
        return self.num_links - self.spine_links_end

    # ----------------------------------------------------------------- ids (ints or arrays)
    def node_link(self, node: IntOrArray, local: IntOrArray) -> IntOrArray:
        """Id of local link ``local`` (an index into `NodeGraph.links`) of node ``node``."""
        return node * self.links_per_node + local

    def nic_up(self, nic: IntOrArray) -> IntOrArray:
        """Id of the link from global NIC ``nic`` to its leaf."""
        return self.node_links_end + 2 * nic

    def nic_down(self, nic: IntOrArray) -> IntOrArray:
        """Id of the link from its leaf to global NIC ``nic``."""
        return self.node_links_end + 2 * nic + 1

    def spine_up(self, leaf: IntOrArray, spine: IntOrArray) -> IntOrArray:
        """Id of the link from ``leaf`` to ``spine``."""
        return self.nic_links_end + 2 * (leaf * self.num_spines + spine)

    def spine_down(self, leaf: IntOrArray, spine: IntOrArray) -> IntOrArray:
        """Id of the link from ``spine`` to ``leaf``."""
        return self.nic_links_end + 2 * (leaf * self.num_spines + spine) + 1

    def core_up(self, spine: IntOrArray, core: IntOrArray) -> IntOrArray:
        """Id of the link from spine ``spine`` (pod x spines per pod + its index) to core ``core`` of its group."""
        return self.spine_links_end + 2 * (spine * self.cores_per_group + core)

    def core_down(self, spine: IntOrArray, core: IntOrArray) -> IntOrArray:
        """Id of the link from core ``core`` of spine ``spine``'s group down to that spine."""
        return self.spine_links_end + 2 * (spine * self.cores_per_group + core) + 1

    # ----------------------------------------------------------------- one id
    def check(self, link: int) -> None:
        if link < 0 or link >= self.num_links:
            raise IndexError(f"link id {link} out of range [0, {self.num_links})")

    def locate(self, link: int) -> tuple[int, int, int, int]:
        """(class, a, b, down) of link id ``link``: (NODE, node, local link, 0), (NIC, global NIC, 0, down),
        (SPINE, leaf, spine, down) or (CORE, spine, core, down), ``down`` 1 for the direction towards the NIC (NIC),
        the leaf (SPINE) or the spine (CORE)."""
        if link < 0 or link >= self.num_links:
            self.check(link)  # raises
        if link < self.node_links_end:
            node, local = divmod(link, self.links_per_node)
            return NODE, node, local, 0
        if link < self.nic_links_end:
            nic, down = divmod(link - self.node_links_end, 2)
            return NIC, nic, 0, down
        if link < self.spine_links_end:
            pair, down = divmod(link - self.nic_links_end, 2)
            leaf, spine = divmod(pair, self.num_spines)
            return SPINE, leaf, spine, down
        pair, down = divmod(link - self.spine_links_end, 2)
        spine, core = divmod(pair, self.cores_per_group)
        return CORE, spine, core, down

    def capacity_Bps(self, link: int) -> float:
        """Effective bytes/s of link id ``link``: ``Topology.link(link).effective_bandwidth_Bps`` without
        building the Link (every link of a class has its class's capacity). IndexError outside the ids."""
        if 0 <= link < self.node_links_end:
            return self.local_capacity_Bps[link % self.links_per_node]
        if self.node_links_end <= link < self.nic_links_end:
            return self.nic_capacity_Bps
        if self.nic_links_end <= link < self.spine_links_end:
            return self.uplink_capacity_Bps
        if self.spine_links_end <= link < self.num_links:
            return self.core_capacity_Bps
        raise IndexError(f"link id {link} out of range [0, {self.num_links})")

    # ----------------------------------------------------------------- many ids
    def link_classes(self, links: np.ndarray) -> np.ndarray:
        """NODE, NIC, SPINE or CORE for each id of ``links`` (ids are assumed in range; see `capacities_Bps`)."""
        ids = np.asarray(links, dtype=np.int64)
        return ((ids >= self.node_links_end).astype(np.int64) + (ids >= self.nic_links_end)
                + (ids >= self.spine_links_end))

    def capacities_Bps(self, links: np.ndarray) -> np.ndarray:
        """`capacity_Bps` of each id of ``links``, as a float array (the same floats). IndexError for the first
        id outside [0, num_links)."""
        ids = np.asarray(links, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.num_links):
            self.check(int(ids[(ids < 0) | (ids >= self.num_links)][0]))
        out = np.empty(len(ids))
        in_node = ids < self.node_links_end
        out[in_node] = self._local_capacity[ids[in_node] % self.links_per_node]
        out[~in_node & (ids < self.nic_links_end)] = self.nic_capacity_Bps
        out[(ids >= self.nic_links_end) & (ids < self.spine_links_end)] = self.uplink_capacity_Bps
        out[ids >= self.spine_links_end] = self.core_capacity_Bps
        return out
