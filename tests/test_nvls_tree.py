"""NVLS-Tree (simdist.collectives.nvls_tree): the plans compute all_reduce, hand-timed stories on the toy NVSwitch
nodes, the engine and the fast plan reproduce the closed form, NCCL's NVLSTree constants, where it may run, and what
auto picks."""

import dataclasses

import pytest

from simdist.analytic.registry import closed_form
from simdist.analytic.select import priced_request, rank_choices
from simdist.collectives.group import Group
from simdist.collectives.nccl_model import nvls_tree_chunk_bytes, protocol_cost, supports
from simdist.collectives.nvls_tree import cap_rate_Bps, nvls_tree_plan, nvls_tree_rate, nvls_tree_shape
from simdist.collectives.plan import node_switch
from simdist.collectives.protocols import SIMPLE
from simdist.collectives.registry import algorithm_for, candidates
from simdist.collectives.request import Request
from simdist.collectives.verify import PlanError, verify
from simdist.errors import SimdistError
from simdist.hardware import load_topology
from tests.conftest import TOY_TOPOLOGY
from tests.plan_timing import engine_and_fast

# tests/fixtures/toy-nvswitch.yaml with NVLS on: 4 GPUs per node on an NVSwitch of NVLink generation 4 (100 GB/s per
# port, 1 us), one 25 GB/s NIC per GPU on a rail-optimized fabric (GPU -> PCIe switch -> NIC -> leaf: 3 links of
# 1 us, so a head reaches the head of its rail on another node in 6 us); every efficiency 1.
NVLS = load_topology(TOY_TOPOLOGY, num_nodes=3, assignments=["scale_up.nvls=true"])
PLAIN = load_topology(TOY_TOPOLOGY, num_nodes=3)


def _engine(req, proto=SIMPLE):
    return engine_and_fast("nvls_tree", req, proto)


@pytest.mark.parametrize("ranks", [tuple(range(8)), tuple(range(12)), (0, 1, 4, 5), (1, 2, 5, 6, 9, 10),
                                   (4, 5, 6, 7, 0, 1, 2, 3), (0, 5, 10, 1, 6, 11)])
@pytest.mark.parametrize("nbytes", [0.0, 1e6, 3e6])
def test_plans_compute_all_reduce_and_the_engine_equals_the_closed_form(ranks, nbytes):
    req = Request("all_reduce", Group(NVLS, ranks), nbytes)
    verify(nvls_tree_plan(req, paced=False))
    verify(nvls_tree_plan(req))
    closed = closed_form("nvls_tree")(req, SIMPLE)
    engine, fast = _engine(req)
    assert engine == pytest.approx(closed, rel=1e-9, abs=1e-15)
    assert fast == pytest.approx(closed, rel=1e-9, abs=1e-15)


def test_the_verifier_sees_a_missing_multicast():
    req = Request("all_reduce", Group(NVLS, tuple(range(8))), 1e6)
    plan = nvls_tree_plan(req, paced=False)
    cut = dataclasses.replace(plan, transfers=plan.transfers[:-1])  # the last E: one peer misses one segment
    with pytest.raises(PlanError):
        verify(cut)


def test_hand_timed_two_nodes_of_four():
    # 2 nodes x 4 GPUs, 4 heads per node (every GPU has its NIC), 2 trees: 1 MB / 8 = 125 kB per (tree, segment),
    # in NCCL's NVLSTree chunks: 128 KiB, 64 KiB below 4 x 16 channels x 4 heads x 128 KiB, 32 KiB below 64 x 64 KiB
    # (4.2 MB): 4 pieces of 31.25 kB. Rates: a GPU's uplink carries A for 2 x 4 (tree, segment) and D for its 2
    # trees: 100 GB/s / 10; its downlink B 2 and E 6: 100 / 8; times nvlsEfficiency 0.85 (NVLink 4: Hopper) -> 8.5
    # GB/s. Two nodes: tree 0 has node 0 at the root, tree 1 node 1, so a NIC carries one up and one down
    # connection: 25 / 2 = 12.5.
    # NCCL's cap 57.7 GB/s x 8 / (4 x 7) = 16.5. So r = 8.5 GB/s and d = 31.25e3 / 8.5e9 = 3.676 us.
    # The chain A (1 us) -> B (1) -> U (6) -> W (6) -> D (1) -> E (1) = 16 us + 6 d, the 3 pieces behind 3 d more:
    # 49.088 us.
    group = Group(NVLS, tuple(range(8)))
    shape = nvls_tree_shape(group)
    assert shape.heads.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert shape.parents.tolist() == [[-1, 0], [1, -1]]
    assert cap_rate_Bps(group) == pytest.approx(57.7e9 * 8 / 28)
    assert nvls_tree_rate(group) == pytest.approx(8.5e9)
    req = Request("all_reduce", group, 1e6)
    expected = 16e-6 + 9 * 31.25e3 / 8.5e9
    assert closed_form("nvls_tree")(req, SIMPLE) == pytest.approx(expected, rel=1e-12)
    engine, fast = _engine(req)
    assert engine == pytest.approx(expected, rel=1e-9) and fast == pytest.approx(expected, rel=1e-9)
    assert group.path(0, node_switch(0)).latency_s == pytest.approx(1e-6)
    assert group.path(node_switch(1), 5).links == (NVLS.nvswitch_ports(5)[1],)


def test_hand_timed_three_nodes_of_four():
    # 3 nodes: NCCL's double binary tree over 3 is 1 -> 2 -> 0 (tree 0) and 2 -> 0 -> 1 (tree 1): depth 2, so the
    # chain crosses the network 4 times: A, B, U, U, W, W, D, E = 1 + 1 + 6 + 6 + 6 + 6 + 1 + 1 = 28 us + 8 d.
    # Node 0's NIC of each rail sends W to node 2 in tree 0 and U to node 1 and W to node 2 in tree 1: 25 / 3 GB/s,
    # below the ports' 8.5. 1 MB: 4 pieces of 31.25 kB (32 KiB chunks, as above), d = 3.75 us: 28 us + (8 + 3) d =
    # 69.25 us. 10 MB: 1.25 MB per (tree, segment) in 64 KiB chunks (10 MB < 4 x 64 x 128 KiB): 20 pieces of 62.5 kB,
    # d = 7.5 us: 28 us + (8 + 19) d = 230.5 us.
    group = Group(NVLS, tuple(range(12)))
    assert nvls_tree_shape(group).parents.tolist() == [[-1, 2, 0], [1, -1, 0]]
    assert nvls_tree_rate(group) == pytest.approx(25e9 / 3)
    for nbytes, expected in ((0.0, 28e-6), (1e6, 69.25e-6), (1e7, 230.5e-6)):
        req = Request("all_reduce", group, nbytes)
        assert closed_form("nvls_tree")(req, SIMPLE) == pytest.approx(expected, rel=1e-12, abs=1e-15)
        assert _engine(req)[0] == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_nccl_chunk_sizes():
    # src/transport/nvls.cc and src/enqueue.cc: 128 KiB under 4 nodes, 64 KiB from 4 on; 64 KiB below 4 chunks per
    # concurrent operation (16 channels x heads on Hopper, 32 on Blackwell), 32 KiB below 1
    kib = 1024
    assert nvls_tree_chunk_bytes(1e9, 2, 8, 4) == 128 * kib and nvls_tree_chunk_bytes(1e9, 4, 8, 4) == 64 * kib
    assert nvls_tree_chunk_bytes(4 * 128 * 128 * kib - 1, 2, 8, 4) == 64 * kib
    assert nvls_tree_chunk_bytes(128 * 64 * kib - 1, 2, 8, 4) == 32 * kib
    assert nvls_tree_chunk_bytes(128 * 64 * kib, 2, 8, 4) == 64 * kib
    assert nvls_tree_chunk_bytes(128 * 64 * kib, 2, 8, 5) == 32 * kib  # 32 channels x 8 heads on Blackwell


def test_nccl_cap_binds_on_fast_nics():
    # 2 nodes of 4 with 1.6 Tb/s NICs (200 GB/s: a NIC's share 100 GB/s) and 1 TB/s NVLink ports (85 GB/s per
    # connection): the rate is NCCL's perChMaxNVLSTreeBws, 57.7 GB/s x P / (4 (P - 1)) = 16.49 GB/s per hop.
    fast = load_topology(TOY_TOPOLOGY, num_nodes=2, assignments=[
        "scale_up.nvls=true", "inter_node.nic_bandwidth=1600 Gb/s", "scale_up.bandwidth=1 TB/s"])
    group = Group(fast, tuple(range(8)))
    assert nvls_tree_rate(group) == pytest.approx(57.7e9 * 8 / 28)
    b200 = load_topology("dgx-b200", num_nodes=4)
    assert cap_rate_Bps(Group.first(b200, 32)) == pytest.approx(80e9 * 32 / 124)


def test_priced_as_nccl_nvls_tree():
    # NCCL's NVLSTree, Simple only (tuning.cc): baseLat 0, intraLat 25 us once (hwLat[NVLINK][NVLSTree]), interLat
    # 20.9 us per network hop (2.7 of it the wire's: 18.2 us more), no rate factor. 2 nodes of 4, 1 MB:
    # 49.088 us + 25 us + 2 x 18.2 us = 110.488 us.
    group = Group(NVLS, tuple(range(8)))
    assert supports("nvls_tree", "Simple") and not supports("nvls_tree", "LL128")
    priced = protocol_cost("nvls_tree", "Simple", group)
    assert priced.cost.base_latency_s == pytest.approx(25e-6)
    assert priced.latency_by_class_s == pytest.approx({"nvlink": 0.0, "pcie": 0.0, "net": 18.2e-6})
    assert priced.cost.rate_factor == 1.0
    req = priced_request(Request("all_reduce", group, 1e6), priced)
    expected = 16e-6 + 9 * 31.25e3 / 8.5e9 + 25e-6 + 2 * 18.2e-6
    assert closed_form("nvls_tree")(req, priced.cost) == pytest.approx(expected, rel=1e-12)
    assert _engine(req, priced.cost)[0] == pytest.approx(expected, rel=1e-9)


def test_refused_where_nccl_does_not_run_it():
    with pytest.raises(SimdistError, match="NVLink SHARP") as err:
        algorithm_for("nvls_tree", Request("all_reduce", Group(PLAIN, tuple(range(8))), 1e6))
    assert err.value.field == "--algorithm"
    with pytest.raises(SimdistError, match="inside one node"):
        algorithm_for("nvls_tree", Request("all_reduce", Group(NVLS, (0, 1, 2)), 1e6))
    with pytest.raises(SimdistError, match="2\\+ GPUs of the group in every node"):
        algorithm_for("nvls_tree", Request("all_reduce", Group(NVLS, (0, 4)), 1e6))
    with pytest.raises(SimdistError, match="one tree per NIC head"):
        algorithm_for("nvls_tree", Request("all_reduce", Group(NVLS, (0, 1, 4, 5, 6)), 1e6))
    with pytest.raises(SimdistError, match="does not implement all_gather"):
        algorithm_for("nvls_tree", Request("all_gather", Group(NVLS, tuple(range(8))), 1e6))
    pcie = load_topology("pcie-gen5-8gpu", num_nodes=2)
    assert "nvls_tree" not in {a.name for a in candidates(Request("all_reduce", Group.first(pcie, 16), 1e6))}
    a100 = load_topology("dgx-a100", num_nodes=2)  # NVSwitch gen2: no NVLS
    assert "nvls_tree" not in {a.name for a in candidates(Request("all_reduce", Group.first(a100, 16), 1e6))}


def test_auto_takes_nvls_tree_for_large_all_reduce_across_a_few_nvls_nodes():
    # NCCL's tuner (tuning.cc) prices NVLSTree at 25 us + 2 log2(nNodes) x 20.9 us, so small all-reduces go to the
    # ring or the tree; at 2 nodes its bandwidth is min(intraBw, 2 x bwInter, 57.7 GB/s) per head, twice a ring's
    # network share, and all-reduces from ~10 MB up take it (busbw ~450 GB/s at 1 GB on 2 DGX H100 against the ring's
    # ~370; NCCL's own model prices 32 MB at ~200 us for NVLSTree and ~250 us for the LL128 ring).
    h100 = load_topology("dgx-h100", num_nodes=2)
    group = Group.first(h100, 16)
    for nbytes in (3.2e7, 1e9):
        assert rank_choices(Request("all_reduce", group, nbytes))[0].algorithm == "nvls_tree"
    for nbytes in (1e4, 1e6):
        ranked = rank_choices(Request("all_reduce", group, nbytes))
        assert ranked[0].algorithm != "nvls_tree" and "nvls_tree" in {c.algorithm for c in ranked}
    assert "nvls_tree" not in {c.algorithm for c in rank_choices(Request("all_reduce", Group.first(h100, 8), 1e9))}
