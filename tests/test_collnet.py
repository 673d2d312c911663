"""CollNet / SHARP (simdist.collectives.collnet): the fabric flag, the plans compute all_reduce, hand-timed
stories on the toy fabric, the engine reproduces the closed form, NCCL's CollNetDirect constants, the errors,
and what auto picks."""

import pytest

from simdist.analytic.registry import closed_form
from simdist.analytic.select import priced_request, rank_choices
from simdist.collectives.collnet import collnet_plan, collnet_rate, heads_by_node
from simdist.collectives.group import Group
from simdist.collectives.nccl_model import protocol_cost, supports
from simdist.collectives.plan import FABRIC
from simdist.collectives.protocols import SIMPLE
from simdist.collectives.registry import algorithm_for, candidates
from simdist.collectives.request import Request
from simdist.collectives.verify import verify
from simdist.errors import SimdistError
from simdist.hardware import load_topology
from tests.conftest import TOY_TOPOLOGY
from tests.plan_timing import engine_and_fast

# tests/fixtures/toy-nvswitch.yaml: 4 GPUs per node on an NVSwitch (100 GB/s per port, 1 us a link), one NIC per
# GPU (25 GB/s), GPU -> PCIe switch -> NIC -> leaf: 3 links of 1 us; every efficiency 1. Its switches reduce.
SHARP = load_topology(TOY_TOPOLOGY, num_nodes=3, assignments=["inter_node.sharp=true"])
PLAIN = load_topology(TOY_TOPOLOGY, num_nodes=3)


def _engine(req, proto=SIMPLE):
    return engine_and_fast("collnet", req, proto)


@pytest.mark.parametrize("ranks", [(0, 4), (0, 4, 8), tuple(range(8)), tuple(range(12)), (1, 2, 5, 6, 9, 10),
                                   (0, 5, 10, 1, 6, 11)])
@pytest.mark.parametrize("nbytes", [0.0, 1e6, 3e6])
def test_collnet_plans_compute_all_reduce_and_the_engine_equals_the_closed_form(ranks, nbytes):
    req = Request("all_reduce", Group(SHARP, ranks), nbytes)
    verify(collnet_plan(req, paced=False))
    verify(collnet_plan(req))
    closed = closed_form("collnet")(req, SIMPLE)
    engine, fast = _engine(req)
    assert engine == pytest.approx(closed, rel=1e-9, abs=1e-15)
    assert fast == pytest.approx(closed, rel=1e-9, abs=1e-15)


def test_hand_timed_two_nodes_of_four():
    # 8 ranks on 2 nodes, every GPU next to its own NIC: 4 heads per node, segments of S/4 = 1 MB cut into
    # k = 2 pieces of 0.5 MB (512 KiB steps). A GPU's NVLink uplink carries 3 connections into the other heads
    # (A) and 3 out of its own head role (D): 100 GB/s / 6 = 16.667 GB/s, below the NIC's 25 GB/s (B, C), so
    # every hop moves at 16.667 GB/s: d = 0.5e6 / 16.667e9 = 30 us. The chain A (NVLink, 2 us) -> B (GPU ->
    # PCIe switch -> NIC -> leaf, 3 us) -> C (3 us) -> D (2 us) takes 10 us + 4 d, the second piece d more:
    # 10 + 5 x 30 = 160 us.
    group = Group(SHARP, tuple(range(8)))
    assert heads_by_node(group) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert collnet_rate(group) == pytest.approx(100e9 / 6)
    req = Request("all_reduce", group, 4e6)
    assert closed_form("collnet")(req, SIMPLE) == pytest.approx(160e-6, rel=1e-12)
    engine, fast = _engine(req)
    assert engine == pytest.approx(160e-6, rel=1e-9) and fast == pytest.approx(160e-6, rel=1e-9)
    route = group.path(0, FABRIC)
    assert route.latency_s == pytest.approx(3e-6) and route.effective_bandwidth_Bps == pytest.approx(25e9)


def test_hand_timed_one_gpu_per_node_is_the_switch_tree_alone():
    # One rank per node: no A or D hop; the head pushes its whole buffer (k = 2 pieces of 0.5 MB) to the switch
    # and gets the sum back, 25 GB/s at the NIC: d = 20 us; 3 us + 3 us + 2 d + d = 66 us, for any node count.
    for ranks in [(0, 4), (0, 4, 8)]:
        req = Request("all_reduce", Group(SHARP, ranks), 1e6)
        assert closed_form("collnet")(req, SIMPLE) == pytest.approx(66e-6, rel=1e-12)


def test_priced_as_nccl_collnet_direct():
    # NCCL's CollNetDirect, Simple only (tuning.cc): intraLat 3.7 us per NVLink hop (0.6 us of it the wire's),
    # interLat 31 us over the two network hops (15.5 each, 2.7 of it the wire's), 2 x (ppn - 1) x 0.4 us of
    # arity serialization; the toy GPU is no Hopper (no 0.85). 8 ranks, 1 MB: one piece of 250 kB per segment,
    # d = 15 us; A 2 + 3.1, B 3 + 12.8, C 3 + 12.8, D 2 + 3.1 = 41.8 us, + 2.4 us + 4 d = 104.2 us.
    group = Group(SHARP, tuple(range(8)))
    assert supports("collnet", "Simple") and not supports("collnet", "LL")
    priced = protocol_cost("collnet", "Simple", group)
    assert priced.cost.base_latency_s == pytest.approx(2.4e-6)
    assert priced.latency_by_class_s["nvlink"] == pytest.approx(3.1e-6)
    assert priced.latency_by_class_s["net"] == pytest.approx(12.8e-6)
    assert priced.cost.rate_factor == 1.0
    req = priced_request(Request("all_reduce", group, 1e6), priced)
    assert closed_form("collnet")(req, priced.cost) == pytest.approx(104.2e-6, rel=1e-12)
    assert _engine(req, priced.cost)[0] == pytest.approx(104.2e-6, rel=1e-9)
    h100 = load_topology("dgx-h100", num_nodes=2, assignments=["inter_node.sharp=true"])
    assert protocol_cost("collnet", "Simple", Group.first(h100, 16)).cost.rate_factor == pytest.approx(0.85)


def test_collnet_is_refused_where_it_cannot_run():
    with pytest.raises(SimdistError, match=r"inter_node\.sharp") as err:
        algorithm_for("collnet", Request("all_reduce", Group(PLAIN, (0, 4)), 1e6))
    assert err.value.field == "--algorithm" and "sharp" in err.value.fix
    with pytest.raises(SimdistError, match="inside one node"):
        algorithm_for("collnet", Request("all_reduce", Group(SHARP, (0, 1)), 1e6))
    with pytest.raises(SimdistError, match="one SHARP tree per NIC rail"):
        algorithm_for("collnet", Request("all_reduce", Group(SHARP, (0, 1, 4)), 1e6))
    with pytest.raises(SimdistError, match="does not implement all_gather"):
        algorithm_for("collnet", Request("all_gather", Group(SHARP, (0, 4)), 1e6))
    pcie = load_topology("pcie-gen4-8gpu", num_nodes=2, assignments=["inter_node.kind=infiniband",
                                                                       "inter_node.sharp=true"])
    with pytest.raises(SimdistError, match="NVSwitch"):
        algorithm_for("collnet", Request("all_reduce", Group.first(pcie, 16), 1e6))


def test_sharp_needs_infiniband():
    with pytest.raises(SimdistError, match="sharp") as err:
        load_topology(TOY_TOPOLOGY, num_nodes=2, assignments=["inter_node.kind=roce", "inter_node.sharp=true"])
    assert "infiniband" in str(err.value)


def test_auto_takes_collnet_only_where_the_switches_reduce():
    # 16 nodes: SHARP's time does not grow with the nodes, the ring's and the tree's do. On DGX A100 (no NVLS)
    # CollNetDirect takes every size; on DGX H100 NVLS across nodes (simdist.collectives.nvls_sharp, SHARP too) takes
    # the large ones, as in NCCL's model (its NVLS bandwidth is not CollNetDirect's 0.85 x), collnet the small ones.
    a100 = load_topology("dgx-a100", num_nodes=16, assignments=["inter_node.sharp=true"])
    plain = load_topology("dgx-h100", num_nodes=16)
    sharp = load_topology("dgx-h100", num_nodes=16, assignments=["inter_node.sharp=true"])
    for nbytes, on_h100 in ((1e5, "collnet"), (1e7, "nvls_sharp"), (1e9, "nvls_sharp")):
        assert rank_choices(Request("all_reduce", Group.first(a100, 128), nbytes))[0].algorithm == "collnet"
        assert rank_choices(Request("all_reduce", Group.first(sharp, 128), nbytes))[0].algorithm == on_h100
        without = rank_choices(Request("all_reduce", Group.first(plain, 128), nbytes))
        assert all(c.algorithm not in ("collnet", "nvls_sharp") for c in without)
    assert "collnet" not in {a.name for a in candidates(Request("all_reduce", Group.first(sharp, 8), 1e6))}
