"""The inter-node fabric: NICs on leaf switches, leaves joined by a spine layer, in closed form.

Nothing here is materialised per NIC: a 16,384-NIC fabric is a handful of integers, and the id of a NIC,
its leaf and the spine an ECMP hash picks are arithmetic, written once for ints and numpy arrays alike (the
ids of the fabric's links: `simdist.hardware.layout`).

Two shapes (``inter_node.fabric``, docs/architecture.md):
- ``fat_tree``: NICs are cabled to leaves in order (node-major), ``down_ports`` per leaf.
- ``rail_optimized``: NIC i of every node in a group of ``down_ports`` nodes sits on rail switch i of
  that group, so same-rail traffic stays one switch away and cross-rail traffic climbs to a spine.

Leaves have ``switch_radix`` ports split into ``down_ports`` (to NICs) and uplinks so that
downlink capacity / uplink capacity = ``oversubscription``: down_ports = floor(radix x o / (1 + o)).
With m NICs on the fullest leaf (down_ports once the cluster fills a leaf), there are ceil(m / o)
spines and each leaf has one link to every spine of bandwidth m x nic_bw / (o x num_spines), so the
ratio holds exactly whatever the rounding (with o = 1: one NIC-speed port per spine).
With ``tiers: 3`` the leaves form pods of ``leaves_per_pod`` (default: a spine's down ports,
floor(radix x p / (1 + p)) for the pod oversubscription p), each pod with its own ``num_spines`` spines
(every leaf of the pod linked to each), and a core layer above the pods: spine s of every pod is linked to
the ``cores_per_group`` cores of group s (the k-ary fat tree's wiring, Al-Fares et al., SIGCOMM 2008, sec.
3.2), ceil(P / p) of them, each link of bandwidth P x leaf uplink / (p x cores_per_group) so that a spine's
downlink / uplink capacity is p exactly (P the leaves of a full pod). A pair on leaves of different pods
climbs leaf -> spine s (the ECMP hash of `spine_for`) -> core (a second hash, `core_for`) -> spine s of the
destination's pod -> leaf. A fabric whose leaves fit one pod is the 2-tier one.

``routing: adaptive`` (InfiniBand adaptive routing, NVIDIA Spectrum-X's per-packet spraying: each packet takes the
least loaded uplink, so no two flows pile on one link while another idles) is modelled as the perfectly spread
limit: a pod's spines act as one spine whose link to each leaf carries the sum of the leaf's uplinks, and the core
likewise (``spines_merged``, ``cores_merged`` physical switches stand behind each modelled one). A flow then
loads every uplink in proportion, which is what spraying achieves over a step's many packets.
``planes`` > 1 (a multi-plane fabric: DeepSeek-V3's "multi-plane two-layer fat-tree", arXiv:2505.09343 sec. 5.1,
each of a node's 8 NICs on its own plane; the 8-plane Ethernet clusters of 2024-25): NIC i of a node sits on plane
i mod planes (hosts have the same NICs per plane: `TopologySpec` checks it), and each plane is its own two-tier
fabric, laid out as ``fabric`` says over the plane's NICs (rail_optimized: the plane's j-th NIC of every group of
``down_ports`` nodes on one leaf; fat_tree: the plane's NICs in node order), with its own ``num_spines`` spines. The
leaves are numbered plane by plane, and a plane is a pod without a core: `pod_of` gives a leaf's plane, and spine s
of a leaf is spine s of its plane. No route crosses planes in the fabric: a flow towards a NIC of another plane
leaves its node by the NIC of the destination's plane (`Topology.send_nic`: NCCL's PXN, the data crossing the node
over NVLink first).
# Assumption: spraying balances a leaf's uplinks perfectly (no reordering cost, no imbalance from packet sizes).
# Assumption: without tiers: 3 the spine layer is non-blocking above the leaves (a folded Clos whose upper
# tiers are collapsed into one spine tier).
# Assumption: every tier's switches have ``switch_radix`` ports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

import numpy as np

from simdist.hardware.link_defaults import LINK_DEFAULTS
from simdist.spec.topology import FabricKind, FabricShape, InterNodeSpec

IntOrArray = TypeVar("IntOrArray", int, np.ndarray)
"""A Python int or a numpy integer array: the fabric's and the link layout's arithmetic is written once for both."""


@dataclass(frozen=True, slots=True)
class Fabric:
    kind: FabricKind
    shape: FabricShape
    num_nodes: int
    nics_per_node: int
    nic_bandwidth_Bps: float
    latency_s: float
    efficiency: float
    oversubscription: float
    down_ports: int
    num_leaves: int
    num_spines: int
    uplink_bandwidth_Bps: float
    leaves_per_pod: int = 0
    """Leaves per pod (3 tiers); 0: one pod of every leaf."""
    num_pods: int = 1
    cores_per_group: int = 0
    """Cores above spine s of every pod (3 tiers; 0: no core layer)."""
    core_bandwidth_Bps: float = 0.0
    """Each spine <-> core link's bandwidth per direction."""
    pod_oversubscription: float = 1.0
    routing: str = "ecmp"
    spines_merged: int = 1
    """Physical spines behind each modelled one (adaptive routing: a pod's spines as one)."""
    cores_merged: int = 1
    """Physical cores behind each modelled one (adaptive routing)."""
    planes: int = 1
    """Independent planes (multi-plane fabric): NIC i of a node on plane i mod planes; a plane is a pod of
    ``leaves_per_pod`` leaves without a core layer."""
    failed_uplinks: frozenset[tuple[int, int]] = frozenset()
    """(leaf, spine) pairs whose link is down, both directions (scenario ``faults.failed_links``): ECMP routes
    around them (`spine_for`)."""

    @property
    def num_nics(self) -> int:
        return self.num_nodes * self.nics_per_node

    # Each method below takes Python ints or numpy integer arrays (elementwise) and returns the same kind:
    # the one formula of each fact, for `Topology.route` and for `simdist.hardware.batch` alike.
    def nic_id(self, node: IntOrArray, local: IntOrArray) -> IntOrArray:
        """Global NIC id of local NIC ``local`` of node ``node``: NICs are numbered node-major."""
        return node * self.nics_per_node + local

    def nic_location(self, nic: IntOrArray) -> tuple[IntOrArray, IntOrArray]:
        """(node, local NIC) of global NIC ``nic`` (the inverse of `nic_id`)."""
        return divmod(nic, self.nics_per_node)

    def leaf_of(self, nic: IntOrArray) -> IntOrArray:
        """Leaf switch of global NIC ``nic`` (see the module docstring for the two shapes)."""
        if self.planes > 1:
            return self._plane_leaf(nic)
        if self.shape == "rail_optimized":
            node, local = divmod(nic, self.nics_per_node)  # nic_location, inline: Topology.route's hot path
            return (node // self.down_ports) * self.nics_per_node + local
        return nic // self.down_ports

    def plane_of_local(self, local: IntOrArray) -> IntOrArray:
        """Plane of a node's local NIC ``local`` (0 with one plane)."""
        return local % self.planes

    def _plane_leaf(self, nic: IntOrArray) -> IntOrArray:
        node, local = divmod(nic, self.nics_per_node)
        plane, j = local % self.planes, local // self.planes
        m = self.nics_per_node // self.planes  # a node's NICs on one plane
        if self.shape == "rail_optimized":
            inside = (node // self.down_ports) * m + j
        else:
            inside = (node * m + j) // self.down_ports
        return plane * self.leaves_per_pod + inside

    @property
    def num_cores(self) -> int:
        return self.num_spines * self.cores_per_group

    @property
    def physical_spines(self) -> int:
        """Spine switches of the whole fabric (every pod's)."""
        return self.num_spines * self.spines_merged * self.num_pods

    @property
    def physical_cores(self) -> int:
        return self.num_cores * self.cores_merged

    @property
    def nodes_per_pod(self) -> int:
        """Nodes whose NICs all sit in one pod, every pod alike (3 tiers), 0 where pods split nodes unevenly."""
        if not self.cores_per_group:
            return self.num_nodes
        if self.shape == "rail_optimized":
            groups, rest = divmod(self.leaves_per_pod, self.nics_per_node)
            return groups * self.down_ports if not rest else 0
        nodes, rest = divmod(self.leaves_per_pod * self.down_ports, self.nics_per_node)
        return nodes if not rest else 0

    def pod_of(self, leaf: IntOrArray) -> IntOrArray:
        """Pod of ``leaf`` (0 without a core layer); with planes, the leaf's plane."""
        return leaf // self.leaves_per_pod if self.cores_per_group or self.planes > 1 else leaf * 0

    def core_for(self, src_nic: IntOrArray, dst_nic: IntOrArray) -> IntOrArray:
        """ECMP at the spine: a stable core of spine s's group for a NIC pair (a second fixed hash, independent of
        `spine_for`'s)."""
        # Assumption: static per-flow ECMP hashing at the spines too.
        h = fmix64(fmix64((_uint64(src_nic) << 32) | _uint64(dst_nic)) ^ _CORE_SALT)
        core = h % self.cores_per_group
        return core if type(core) is int else core.astype(np.int64)

    def leaf_of_all(self) -> np.ndarray:
        """Leaf of every NIC, as an array (for bisection and load summaries)."""
        return self.leaf_of(np.arange(self.num_nics, dtype=np.int64))

    def spine_for(self, src_nic: IntOrArray, dst_nic: IntOrArray) -> IntOrArray:
        """ECMP: a stable spine for a NIC pair (a fixed integer hash, not Python's salted hash).

        With failed uplinks, a pair whose source or destination leaf lost one hashes over the spines both leaves
        still reach, in spine order: the routing protocol withdraws the routes through a dead link, the leaf's ECMP
        group shrinks and its flows are rehashed (pairs of untouched leaves keep their spine)."""
        # Assumption: static per-flow ECMP hashing; adaptive routing would spread a flow's packets.
        # Assumption: rehashing over the remaining spines is modulo the group's new size (no resilient hashing:
        # flows of an affected leaf may move even when their spine still works).
        h = fmix64((_uint64(src_nic) << 32) | _uint64(dst_nic))
        if self.failed_uplinks:
            return self._rerouted(src_nic, dst_nic, h)
        spine = h % self.num_spines
        return spine if type(spine) is int else spine.astype(np.int64)

    def _rerouted(self, src_nic: IntOrArray, dst_nic: IntOrArray, h: IntOrArray) -> IntOrArray:
        bad, hit = _failure_tables(self.num_leaves, self.num_spines, self.failed_uplinks)
        S = self.num_spines
        if type(h) is int:
            ls, ld = int(self.leaf_of(int(src_nic))), int(self.leaf_of(int(dst_nic)))
            if not (hit[ls] or hit[ld]):
                return h % S
            valid = np.flatnonzero(~(bad[ls] | bad[ld]))
            return int(valid[h % len(valid)])
        src, dst = np.broadcast_arrays(np.asarray(src_nic, dtype=np.int64), np.asarray(dst_nic, dtype=np.int64))
        h = np.broadcast_to(h, src.shape)
        out = (h % np.uint64(S)).astype(np.int64)
        ls, ld = self.leaf_of(src), self.leaf_of(dst)
        moved = hit[ls] | hit[ld]
        if moved.any():
            ok = ~(bad[ls[moved]] | bad[ld[moved]])  # (moved pairs, spines): the spines both leaves reach
            k = ok.sum(axis=1).astype(np.uint64)
            idx = (h[moved] % k).astype(np.int64)
            out[moved] = np.argmax(np.cumsum(ok, axis=1) > idx[:, None], axis=1)
        return out

    def unreachable_pairs(self) -> list[tuple[int, int]]:
        """Leaf pairs (a <= b) with no spine both still reach: failed uplinks that disconnect the fabric."""
        bad, hit = _failure_tables(self.num_leaves, self.num_spines, self.failed_uplinks)
        touched = np.flatnonzero(hit).tolist()
        out = []
        for i, a in enumerate(touched):
            if bad[a].all():
                out.append((a, a))
                continue
            out += [(a, b) for b in touched[i + 1:] if (bad[a] | bad[b]).all()]
        return out


@lru_cache(maxsize=16)
def _failure_tables(num_leaves: int, num_spines: int, failed: frozenset[tuple[int, int]]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(bad[leaf, spine]: the uplink is down, hit[leaf]: the leaf lost one)."""
    bad = np.zeros((num_leaves, num_spines), dtype=bool)
    for leaf, spine in failed:
        bad[leaf, spine] = True
    return bad, bad.any(axis=1)


_CORE_SALT = 0x9E3779B97F4A7C15
_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB9FE1A85EC53
_MASK64 = (1 << 64) - 1
_SCALARS = (int, np.integer)


def _uint64(x: IntOrArray) -> IntOrArray:
    """A Python int for a scalar (exact at any width), a fresh uint64 array for an array (wraps modulo 2^64)."""
    if type(x) is int:  # Topology.route's hot path: no conversion
        return x
    if isinstance(x, _SCALARS):
        return int(x)
    return np.asarray(x).astype(np.uint64)


def fmix64(key: IntOrArray) -> IntOrArray:
    """MurmurHash3's 64-bit finaliser (Appleby, MurmurHash3.cpp ``fmix64``): every input bit affects every
    output bit. ``key``: a Python int in [0, 2^64) or a uint64 array (not modified); the same steps for both:
    a Python int is masked to 64 bits after each product, a uint64 array wraps there by itself."""
    if type(key) is not int:
        # a copy of an array (the steps below work in place on arrays), a numpy scalar as an int
        key = key.astype(np.uint64) if isinstance(key, np.ndarray) else int(key)
    key ^= key >> 33
    key *= _C1
    key &= _MASK64
    key ^= key >> 33
    key *= _C2
    key &= _MASK64
    key ^= key >> 33
    return key


def _plane_fabric(spec: InterNodeSpec, num_nodes: int) -> tuple[int, int, int, float]:
    """(down ports, leaves per plane, spines per plane, uplink bandwidth) of one plane of a multi-plane fabric:
    the two-tier sizing of `build_fabric` over the plane's NICs (a node's nics_per_node / planes on each)."""
    o, radix = spec.oversubscription, spec.switch_radix
    m = spec.nics_per_node // spec.planes
    nics = num_nodes * m
    if spec.fabric == "fat_tree" and nics <= radix:
        return nics, 1, 0, 0.0
    down = max(1, math.floor(radix * o / (1.0 + o)))
    leaves = math.ceil(num_nodes / down) * m if spec.fabric == "rail_optimized" else math.ceil(nics / down)
    if leaves == 1:
        return down, 1, 0, 0.0
    attached = min(down, num_nodes if spec.fabric == "rail_optimized" else nics)
    spines = max(1, math.ceil(attached / o))
    return down, leaves, spines, attached * spec.nic_bandwidth / (o * spines)


def build_fabric(spec: InterNodeSpec, num_nodes: int) -> Fabric:
    kind_defaults = LINK_DEFAULTS[spec.kind]
    num_nics = num_nodes * spec.nics_per_node
    o = spec.oversubscription
    radix = spec.switch_radix
    if spec.fabric == "fat_tree" and num_nics <= radix:
        # Everything fits on one switch: no spine, no oversubscription.
        down, leaves, spines, uplink = num_nics, 1, 0, 0.0
    else:
        down = max(1, math.floor(radix * o / (1.0 + o)))
        if spec.fabric == "rail_optimized":
            leaves = math.ceil(num_nodes / down) * spec.nics_per_node
        else:
            leaves = math.ceil(num_nics / down)
        if leaves == 1:
            spines, uplink = 0, 0.0
        else:
            # Spines are sized for the NICs actually cabled to the fullest leaf, so a 2-node cluster
            # does not get the 32 spines a full 64-port leaf tier would need.
            attached = min(down, num_nodes if spec.fabric == "rail_optimized" else num_nics)
            spines = max(1, math.ceil(attached / o))
            uplink = attached * spec.nic_bandwidth / (o * spines)
    per_pod, pods, cores, core_bw = leaves, 1, 0, 0.0
    if spec.planes > 1:
        down, per_pod, spines, uplink = _plane_fabric(spec, num_nodes)
        pods = spec.planes
        leaves = per_pod * pods
    p = spec.pod_oversubscription
    if spec.tiers == 3 and spines:
        full = spec.leaves_per_pod or max(1, math.floor(radix * p / (1.0 + p)))
        if leaves > full:
            per_pod, pods = full, math.ceil(leaves / full)
            cores = max(1, math.ceil(full / p))
            core_bw = full * uplink / (p * cores)
    spines_merged = cores_merged = 1
    if spec.routing == "adaptive" and spines > 1:
        spines_merged, spines, uplink = spines, 1, spines * uplink
        if cores:
            cores_merged, core_bw, cores = spines_merged * cores, spines_merged * cores * core_bw, 1
    return Fabric(
        kind=spec.kind,
        shape=spec.fabric,
        num_nodes=num_nodes,
        nics_per_node=spec.nics_per_node,
        nic_bandwidth_Bps=spec.nic_bandwidth,
        latency_s=spec.latency if spec.latency is not None else kind_defaults.latency_s,
        efficiency=spec.efficiency if spec.efficiency is not None else kind_defaults.efficiency,
        oversubscription=o,
        down_ports=down,
        num_leaves=leaves,
        num_spines=spines,
        uplink_bandwidth_Bps=uplink,
        leaves_per_pod=per_pod,
        num_pods=pods,
        cores_per_group=cores,
        core_bandwidth_Bps=core_bw,
        pod_oversubscription=p,
        routing=spec.routing,
        spines_merged=spines_merged,
        cores_merged=cores_merged,
        planes=spec.planes,
    )
