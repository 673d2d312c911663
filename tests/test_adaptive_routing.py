"""Adaptive routing (``inter_node.routing: adaptive``) against static ECMP, by hand: eight flows from one leaf to
another on a non-blocking fat tree of 8 spines. ECMP hashes them onto spines, and where two land on one uplink
both move at half speed; spraying spreads every flow over all eight."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from simdist.collectives.group import Group
from simdist.collectives.plan import Plan, Transfer
from simdist.engine.simulate import simulate
from simdist.hardware import bisection, load_topology
from simdist.hardware.fabric import fmix64

SETS = ["inter_node.fabric=fat_tree", "inter_node.switch_radix=16"]  # 8 NICs per leaf, 8 spines, 50 GB/s uplinks
NBYTES = 1e9


def _permutation(routing: str) -> tuple[float, object]:
    """GPU i of node 0 (leaf 0) sends 1 GB to GPU i of node 1 (leaf 1), all at once; the engine's time."""
    t = load_topology("dgx-h100", num_nodes=4, assignments=[*SETS, f"inter_node.routing={routing}"])
    group = Group(t, tuple(range(16)))
    plan = Plan(op="send_recv", algorithm="direct", num_peers=16, nbytes=NBYTES,
                transfers=tuple(Transfer(i, 8 + i, NBYTES, i) for i in range(8)), num_chunks=8, verifiable=False)
    return simulate([(plan, group)])[0].time_s, t


def test_ecmp_collisions_cost_what_the_hash_says_and_spraying_removes_them():
    t_ecmp, topo = _permutation("ecmp")
    t_adaptive, topo_a = _permutation("adaptive")
    f = topo.fabric
    assert (f.down_ports, f.num_spines) == (8, 8)
    # ECMP: NIC i (node 0) -> NIC 8 + i (node 1) on spine fmix64(i << 32 | 8 + i) mod 8; the busiest uplink carries
    # k flows, each then at 50 GB/s x 0.96 / k
    k = max(Counter(fmix64((i << 32) | (8 + i)) % 8 for i in range(8)).values())
    assert k >= 2  # this permutation collides (the fixed hash's values for these pairs)
    eff = 50e9 * 0.96
    latency = topo.route(0, 8).latency_s
    assert t_ecmp == pytest.approx(latency + k * NBYTES / eff, rel=1e-6)
    # adaptive: the eight flows spread over 8 x 50 GB/s of uplinks: each at its NIC's rate
    assert topo_a.fabric.num_spines == 1 and topo_a.fabric.uplink_bandwidth_Bps == 8 * 50e9
    assert t_adaptive == pytest.approx(topo_a.route(0, 8).latency_s + NBYTES / eff, rel=1e-6)
    assert t_adaptive < t_ecmp


def test_spraying_keeps_the_fabric_capacity():
    for sets in ([], ["inter_node.oversubscription=3"]):
        a = load_topology("dgx-h100", num_nodes=6, assignments=[*SETS, *sets])
        b = load_topology("dgx-h100", num_nodes=6, assignments=[*SETS, *sets, "inter_node.routing=adaptive"])
        assert bisection(a).bandwidth_Bps == pytest.approx(bisection(b).bandwidth_Bps)
    three = ["inter_node.tiers=3", "inter_node.leaves_per_pod=2", "inter_node.pod_oversubscription=2"]
    a = load_topology("dgx-h100", num_nodes=8, assignments=[*SETS, *three])
    b = load_topology("dgx-h100", num_nodes=8, assignments=[*SETS, *three, "inter_node.routing=adaptive"])
    assert bisection(a).bandwidth_Bps == pytest.approx(bisection(b).bandwidth_Bps)
    assert b.fabric.physical_cores == a.fabric.physical_cores and b.fabric.physical_spines == a.fabric.physical_spines
    assert np.isclose(b.fabric.core_bandwidth_Bps, a.fabric.core_bandwidth_Bps * a.fabric.num_cores)
