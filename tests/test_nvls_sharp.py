"""NVLS-SHARP (simdist.collectives.nvls_sharp): NCCL's NVLS across nodes, the plans compute all_reduce, hand-timed
stories on the toy NVSwitch nodes, the engine and the fast plan reproduce the closed form, NCCL's NVLS constants
across nodes, where it may run, and what auto picks."""

import dataclasses

import pytest

from simdist.analytic.registry import closed_form
from simdist.analytic.select import priced_request, rank_choices
from simdist.collectives.group import Group
from simdist.collectives.nccl_model import nvls_sharp_chunk_bytes, protocol_cost, supports
from simdist.collectives.nvls_sharp import nvls_sharp_connections, nvls_sharp_pieces, nvls_sharp_plan, nvls_sharp_rate
from simdist.collectives.plan import FABRIC
from simdist.collectives.protocols import SIMPLE
from simdist.collectives.registry import algorithm_for, candidates
from simdist.collectives.request import Request
from simdist.collectives.verify import PlanError, verify
from simdist.errors import SimdistError
from simdist.hardware import load_topology
from tests.conftest import TOY_TOPOLOGY
from tests.plan_timing import engine_and_fast

# tests/fixtures/toy-nvswitch.yaml with NVLS on and switches that reduce: 4 GPUs per node on an NVSwitch of NVLink
# generation 4 (100 GB/s per port, 1 us), one 25 GB/s NIC per GPU (GPU -> PCIe switch -> NIC -> leaf: 3 links of
# 1 us, so a head reaches the fabric's reduction at the leaf in 3 us); every efficiency 1.
ON = ["scale_up.nvls=true", "inter_node.sharp=true"]
SHARP = load_topology(TOY_TOPOLOGY, num_nodes=3, assignments=ON)
TWO_NICS = load_topology(TOY_TOPOLOGY, num_nodes=2, assignments=[*ON, "inter_node.nics_per_node=2"])


def _engine(req, proto=SIMPLE):
    return engine_and_fast("nvls_sharp", req, proto)


@pytest.mark.parametrize("ranks", [tuple(range(8)), tuple(range(12)), (0, 1, 4, 5), (1, 2, 5, 6, 9, 10),
                                   (4, 5, 6, 7, 0, 1, 2, 3), (0, 5, 10, 1, 6, 11)])
@pytest.mark.parametrize("nbytes", [0.0, 1e6, 3e6])
def test_plans_compute_all_reduce_and_the_engine_equals_the_closed_form(ranks, nbytes):
    req = Request("all_reduce", Group(SHARP, ranks), nbytes)
    verify(nvls_sharp_plan(req, paced=False))
    verify(nvls_sharp_plan(req))
    closed = closed_form("nvls_sharp")(req, SIMPLE)
    engine, fast = _engine(req)
    assert engine == pytest.approx(closed, rel=1e-9, abs=1e-15)
    assert fast == pytest.approx(closed, rel=1e-9, abs=1e-15)


def test_the_verifier_sees_a_missing_multicast():
    req = Request("all_reduce", Group(SHARP, tuple(range(8))), 1e6)
    plan = nvls_sharp_plan(req, paced=False)
    cut = dataclasses.replace(plan, transfers=plan.transfers[:-1])  # the last E: one peer misses one segment
    with pytest.raises(PlanError):
        verify(cut)


def test_hand_timed_two_nodes_of_four_one_nic_each():
    # 2 nodes x 4 GPUs, a NIC per GPU: 4 heads per node, segments of S / 4. Rates: a GPU's uplink carries A for its 4
    # segments and D for the one it heads: 100 GB/s / 5; its downlink B 1 and E 3: 100 / 4; times nvlsEfficiency
    # 0.85 (NVLink 4: Hopper) -> 17 GB/s; a NIC carries one U up and one V down: 25 GB/s. So r = 17 GB/s, the
    # algorithm bandwidth 4 x 17 = 68 GB/s < 150: NCCL's 32 KiB chunk, and 1 MB < 2 x (16 channels x 4 heads) x
    # 32 KiB: 16 KiB. 250 kB per segment -> 16 pieces of 15.625 kB, d = 15.625e3 / 17e9 = 0.919 us. The chain
    # A (1 us) -> B (1) -> U (3) -> V (3) -> D (1) -> E (1) = 10 us + 6 d, the 15 pieces behind 15 d more: 29.30 us.
    group = Group(SHARP, tuple(range(8)))
    conns = nvls_sharp_connections(group)
    assert conns.heads.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert nvls_sharp_rate(group) == pytest.approx(17e9)
    req = Request("all_reduce", group, 1e6)
    assert nvls_sharp_pieces(req) == 16
    expected = 10e-6 + 21 * 15.625e3 / 17e9
    assert closed_form("nvls_sharp")(req, SIMPLE) == pytest.approx(expected, rel=1e-12)
    engine, fast = _engine(req)
    assert engine == pytest.approx(expected, rel=1e-9) and fast == pytest.approx(expected, rel=1e-9)
    assert group.path(0, FABRIC).latency_s == pytest.approx(3e-6)


def test_hand_timed_two_nodes_of_four_two_gpus_per_nic():
    # 2 NICs per node, each shared by 2 GPUs: the heads are GPUs 0 and 2 of each node (the first next to each NIC),
    # segments of S / 2. Ports: a head's uplink A 2 + D 1: 100 / 3 x 0.85 = 28.3 GB/s; downlinks 100 / 2 x 0.85 =
    # 42.5; each NIC one U and one V: 25 GB/s, so the network binds: r = 25 GB/s, algorithm bandwidth 50 GB/s < 150:
    # 32 KiB chunks (10 MB is not below 8 x 32 x 32 KiB = 8.4 MB). 5 MB per segment -> 153 pieces of 32.68 kB,
    # d = 5e6 / 153 / 25e9 = 1.307 us; 10 us + (6 + 152) d = 216.54 us. With no bytes, the chain's 10 us.
    group = Group(TWO_NICS, tuple(range(8)))
    assert nvls_sharp_connections(group).heads.tolist() == [[0, 2], [4, 6]]
    assert nvls_sharp_rate(group) == pytest.approx(25e9)
    req = Request("all_reduce", group, 1e7)
    assert nvls_sharp_pieces(req) == 153
    expected = 10e-6 + 158 * 5e6 / 153 / 25e9
    assert closed_form("nvls_sharp")(req, SIMPLE) == pytest.approx(expected, rel=1e-12)
    engine, fast = _engine(req)
    assert engine == pytest.approx(expected, rel=1e-9) and fast == pytest.approx(expected, rel=1e-9)
    empty = Request("all_reduce", group, 0.0)
    assert closed_form("nvls_sharp")(empty, SIMPLE) == pytest.approx(10e-6) == _engine(empty)[0]


def test_nccl_chunk_sizes():
    # src/enqueue.cc, NCCL_ALGO_NVLS: NCCL_NVLS_CHUNKSIZE's 128 KiB, 32 KiB across nodes below 150 GB/s; 64 KiB below
    # 64 chunks per concurrent operation (16 channels x heads on Hopper, 32 on Blackwell), 32 KiB below 8, 16 below 2
    kib, ops = 1024, 16 * 8
    assert nvls_sharp_chunk_bytes(1e10, 8, 200e9, 4) == 128 * kib
    assert nvls_sharp_chunk_bytes(1e10, 8, 149e9, 4) == 32 * kib
    assert nvls_sharp_chunk_bytes(64 * ops * 128 * kib - 1, 8, 200e9, 4) == 64 * kib
    assert nvls_sharp_chunk_bytes(8 * ops * 64 * kib - 1, 8, 200e9, 4) == 32 * kib
    assert nvls_sharp_chunk_bytes(2 * ops * 32 * kib - 1, 8, 200e9, 4) == 16 * kib
    assert nvls_sharp_chunk_bytes(2 * ops * 32 * kib, 8, 200e9, 5) == 16 * kib  # 32 channels on Blackwell


def test_priced_as_nccl_nvls_across_nodes():
    # NCCL's NVLS with nNodes > 1, Simple only (tuning.cc): latency intraLat 25 us (hwLat[NVLINK][NVLS]) + interLat
    # 18 us (hwLat[NET][NVLS]): 25 us in the start-up, 9 us on each of the two network hops (2.7 of it the wire's:
    # 6.3 us more), no rate factor (nvlsEfficiency is in the plan's port rate). 1 MB on 2 nodes of 4:
    # 29.30 us + 25 us + 2 x 6.3 us = 66.90 us.
    group = Group(SHARP, tuple(range(8)))
    assert supports("nvls_sharp", "Simple") and not supports("nvls_sharp", "LL")
    priced = protocol_cost("nvls_sharp", "Simple", group)
    assert priced.cost.base_latency_s == pytest.approx(25e-6)
    assert priced.latency_by_class_s == pytest.approx({"nvlink": 0.0, "pcie": 0.0, "net": 6.3e-6})
    assert priced.cost.rate_factor == 1.0
    req = priced_request(Request("all_reduce", group, 1e6), priced)
    expected = 10e-6 + 21 * 15.625e3 / 17e9 + 25e-6 + 2 * 6.3e-6
    assert closed_form("nvls_sharp")(req, priced.cost) == pytest.approx(expected, rel=1e-12)
    assert _engine(req, priced.cost)[0] == pytest.approx(expected, rel=1e-9)


def test_refused_where_nccl_does_not_run_it():
    plain = load_topology(TOY_TOPOLOGY, num_nodes=2, assignments=["inter_node.sharp=true"])
    with pytest.raises(SimdistError, match="NVLink SHARP") as err:
        algorithm_for("nvls_sharp", Request("all_reduce", Group(plain, tuple(range(8))), 1e6))
    assert err.value.field == "--algorithm"
    no_sharp = load_topology(TOY_TOPOLOGY, num_nodes=2, assignments=["scale_up.nvls=true"])
    with pytest.raises(SimdistError, match=r"inter_node\.sharp") as err:
        algorithm_for("nvls_sharp", Request("all_reduce", Group(no_sharp, tuple(range(8))), 1e6))
    assert "sharp=true" in err.value.fix
    with pytest.raises(SimdistError, match="inside one node"):
        algorithm_for("nvls_sharp", Request("all_reduce", Group(SHARP, (0, 1, 2)), 1e6))
    with pytest.raises(SimdistError, match="2\\+ GPUs of the group in every node"):
        algorithm_for("nvls_sharp", Request("all_reduce", Group(SHARP, (0, 4)), 1e6))
    with pytest.raises(SimdistError, match="one SHARP tree per NIC head"):
        algorithm_for("nvls_sharp", Request("all_reduce", Group(SHARP, (0, 1, 4, 5, 6)), 1e6))
    with pytest.raises(SimdistError, match="2\\+ NVLS channels"):
        algorithm_for("nvls_sharp", Request("all_reduce", Group(TWO_NICS, (0, 1, 4, 5)), 1e6))
    with pytest.raises(SimdistError, match="does not implement all_gather"):
        algorithm_for("nvls_sharp", Request("all_gather", Group(SHARP, tuple(range(8))), 1e6))
    a100 = load_topology("dgx-a100", num_nodes=2, assignments=["inter_node.sharp=true"])  # NVSwitch gen2: no NVLS
    assert "nvls_sharp" not in {a.name for a in candidates(Request("all_reduce", Group.first(a100, 16), 1e6))}


def test_auto_takes_nvls_sharp_where_the_switches_reduce_on_nvls_nodes():
    # NCCL's tuner prices NVLS across nodes at 25 + 18 us and min(2 x intraBw x nvlsEfficiency, bwInter) per
    # channel: on DGX H100 nodes with SHARP it beats CollNetDirect (44 us, 0.85 x its bandwidth) and the ring from
    # ~1 MB up; the tiny sizes stay with the tree's and the ring's LL, whose start-up is shorter. Without SHARP NCCL
    # never runs it (tuning.cc: "Disable ... Collnet+NVLS if collnet is not supported").
    sharp = load_topology("dgx-h100", num_nodes=4, assignments=["inter_node.sharp=true"])
    plain = load_topology("dgx-h100", num_nodes=4)
    for nbytes in (1e6, 1e8, 8 * 2**30):
        assert rank_choices(Request("all_reduce", Group.first(sharp, 32), nbytes))[0].algorithm == "nvls_sharp"
    assert rank_choices(Request("all_reduce", Group.first(sharp, 32), 1e3))[0].algorithm != "nvls_sharp"
    assert "nvls_sharp" not in {c.algorithm for c in rank_choices(Request("all_reduce", Group.first(plain, 32), 1e9))}
    assert "nvls_sharp" not in {c.algorithm for c in rank_choices(Request("all_reduce", Group.first(sharp, 8), 1e9))}
