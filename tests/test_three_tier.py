"""A 3-tier fat tree (``inter_node.tiers: 3``): pods of leaves and spines under a core layer, sized, routed and cut
by hand on tests/data/topologies/tiny-three-tier.yaml (8 nodes x 2 GPUs, one 25 GB/s NIC each, 4-port switches,
2:1 above the pods), and the Llama-3-style preset against its source's figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from simdist.analytic.direct import direct_time_s
from simdist.collectives.group import Group
from simdist.hardware import bisection, load_topology
from simdist.hardware.batch import routes
from simdist.hardware.fabric import fmix64
from simdist.hardware.layout import CORE, NIC, NODE, SPINE
from tests.test_bisection import max_flow_between_halves

FIXTURE = str(Path(__file__).resolve().parent / "data" / "topologies" / "tiny-three-tier.yaml")


@pytest.fixture(scope="module")
def tiny():
    return load_topology(FIXTURE)


def test_sizes_by_hand(tiny):
    f = tiny.fabric
    # 4-port leaves at 1:1: 2 NICs down, 2 up -> 8 NICs on 4 leaves, 2 spines per pod, uplinks 2 x 25 / 2 = 25 GB/s;
    # a spine at 2:1 has floor(4 x 2 / 3) = 2 leaves below -> 2 pods; ceil(2 / 2) = 1 core per spine group, its
    # link 2 x 25 / (2 x 1) = 25 GB/s: a spine's 50 GB/s down against 25 up
    assert (f.num_leaves, f.leaves_per_pod, f.num_pods, f.num_spines, f.cores_per_group) == (4, 2, 2, 2, 1)
    assert f.uplink_bandwidth_Bps == 25e9 and f.core_bandwidth_Bps == 25e9
    assert tiny.vertex_counts["spine_switch"] == 4 and tiny.vertex_counts["core_switch"] == 2


def test_a_route_between_pods_climbs_to_the_core(tiny):
    # GPU 0 (node 0, NIC 0, leaf 0, pod 0) to GPU 8 (node 4, NIC 4, leaf 2, pod 1): spine s of pod 0 by the ECMP
    # hash, core s (one per group), spine s of pod 1
    s = fmix64((0 << 32) | 4) % 2
    r = tiny.route(0, 8)
    assert tiny.route_vertices(r) == ["n0/gpu0", "n0/h0/pcie0", "n0/nic0", "leaf0", f"spine{s}", f"core{s}",
                                      f"spine{2 + s}", "leaf2", "n4/nic0", "n4/h0/pcie0", "n4/gpu0"]
    # 10 links: PCIe 1 us x 4, fabric 1 us x 6; the NICs and the core at 25 GB/s
    assert r.latency_s == pytest.approx(10e-6) and r.bandwidth_Bps == 25e9
    # inside a pod: leaf -> spine -> leaf, no core
    assert not any(v.startswith("core") for v in tiny.route_vertices(tiny.route(0, 4)))


def test_every_link_id_round_trips(tiny):
    lay = tiny.layout
    assert lay.num_core_links == 2 * 2 * 2 * 1  # both directions x pods x spines per pod x cores per group
    for link in range(lay.num_links):
        cls, a, b, down = lay.locate(link)
        if cls == CORE:
            assert (lay.core_down(a, b) if down else lay.core_up(a, b)) == link
        elif cls == SPINE:
            assert (lay.spine_down(a, b) if down else lay.spine_up(a, b)) == link
        else:
            assert cls in (NODE, NIC)
        assert lay.capacity_Bps(link) == tiny.link(link).effective_bandwidth_Bps
    assert lay.link_classes(np.arange(lay.num_links)).max() == CORE


def test_batch_routes_equal_topology_routes():
    t = load_topology(FIXTURE, num_nodes=7)  # an incomplete second pod
    src, dst = np.meshgrid(np.arange(t.num_gpus), np.arange(t.num_gpus), indexing="ij")
    src, dst = src.reshape(-1), dst.reshape(-1)
    batch = routes(t, src, dst)
    assert [batch.route(i) for i in range(len(src))] == [t.route(int(s), int(d)) for s, d in zip(src, dst,
                                                                                              strict=True)]


def test_bisection_by_hand_and_as_max_flow(tiny):
    # halves = the two pods: each leaf's 50 GB/s surplus meets nothing in its pod, and a pod reaches the core at
    # 2 spines x 1 core x 25 GB/s = 50 GB/s, half what its leaves could send (2:1)
    assert bisection(tiny).bandwidth_Bps == pytest.approx(50e9)
    assert bisection(tiny).bandwidth_Bps == pytest.approx(max_flow_between_halves(tiny), rel=1e-9)
    for nodes, assignments in [(6, []), (8, ["inter_node.pod_oversubscription=1"]),
                               (12, ["inter_node.leaves_per_pod=3"])]:
        t = load_topology(FIXTURE, num_nodes=nodes, assignments=assignments)
        assert bisection(t).bandwidth_Bps == pytest.approx(max_flow_between_halves(t), rel=1e-9)


@pytest.mark.parametrize("op", ["all_to_all", "all_gather", "reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("ranks", [tuple(range(0, 16, 2)), tuple(range(16)), (0, 1, 6, 8, 9, 15)])
def test_all_pairs_structure_prices_the_core_as_the_routes_do(tiny, op, ranks):
    # the direct plans priced from the route structure (simdist.collectives.all_pairs: per (spine, core) counts)
    # equal them priced block by block over their routes, at 2:1 above the pods where the core is the bottleneck
    group = Group(tiny, ranks)
    fast = direct_time_s(group, op, 2**24)
    assert fast == pytest.approx(direct_time_s(Group(tiny, ranks), op, 2**24, by_structure=False), rel=1e-12)


def test_groups_are_priced_at_their_place_in_the_pod(tiny):
    from simdist.analytic.pricing import CommPricer

    pricer = CommPricer(tiny)
    # nodes 2-5 straddle the pods, nodes 0-3 do not: different keys (the pattern repeats every pod of 8 GPUs)
    a = pricer.key("all_reduce", (0, 2, 4, 6), 1e6)
    b = pricer.key("all_reduce", (4, 6, 8, 10), 1e6)
    c = pricer.key("all_reduce", (8, 10, 12, 14), 1e6)
    assert a != b and a == c


def test_llama3_preset_matches_its_source():
    t = load_topology("llama3-24k")
    f = t.fabric
    # Dubey et al. 2024 (arXiv:2407.21783) sec. 3.3.1: 24K GPUs; 16 GPUs (2 servers) per ToR; 192 racks per pod of
    # 3,072 GPUs at full bisection; 8 pods joined at 1:7
    assert t.num_gpus == 24_576 and f.down_ports == 16 and f.leaves_per_pod == 192 and f.num_pods == 8
    assert f.pod_oversubscription == 7 and f.oversubscription == 1
    inside, across = bisection(load_topology("llama3-24k", num_nodes=384)), bisection(t)
    # a pod (384 servers) splits at full bisection: 192 servers x 8 NICs x 50 GB/s
    assert inside.bandwidth_Bps == pytest.approx(192 * 8 * 50e9)
    # the cluster's halves (4 pods each) meet through the core at 1/7 of what they could send
    assert across.bandwidth_Bps == pytest.approx(4 * 3072 * 50e9 / 7, rel=0.02)


@settings(max_examples=60, deadline=None)
@given(a=st.integers(0, 15), b=st.integers(0, 15), nbytes=st.sampled_from([0.0, 1.0, 4096.0, 2.0**24, 7.5e8]),
       latency=st.sampled_from([0.0, 1.9e-6]), rate_factor=st.sampled_from([1.0, 0.47]))
def test_a_send_is_its_routes_latency_and_busiest_link_as_the_block_loop_prices_it(a, b, nbytes, latency,
                                                                                   rate_factor):
    # the two-peer send's fast path (route latency and rate read once per group) against the block-by-block loop,
    # inside a node, across a leaf, across a spine and across the 2:1 core
    assume(a != b)
    tiny = load_topology(FIXTURE)
    group = Group(tiny, (a, b))
    fast = direct_time_s(group, "send_recv", nbytes, per_transfer_latency_s=latency, rate_factor=rate_factor)
    loop = direct_time_s(Group(tiny, (a, b)), "send_recv", nbytes, per_transfer_latency_s=latency,
                         rate_factor=rate_factor, by_structure=False)
    assert fast == pytest.approx(loop, rel=1e-12, abs=0.0)
    # a protocol's priced copy shares the group's memo but adds its latency to the routes
    extra = {"net": 5.0e-6, "nvlink": 1.0e-6, "pcie": 2.0e-6}
    priced = direct_time_s(group.priced(extra), "send_recv", nbytes, per_transfer_latency_s=latency,
                           rate_factor=rate_factor)
    loop = direct_time_s(Group(tiny, (a, b)).priced(extra), "send_recv", nbytes, per_transfer_latency_s=latency,
                         rate_factor=rate_factor, by_structure=False)
    assert priced == pytest.approx(loop, rel=1e-12, abs=0.0) and priced > fast
