"""PAT (simdist.collectives.pat): its plans compute their collectives, a hand-timed story on the toy fabric,
the engine reproduces the closed form, NCCL's PAT constants, where it may run, and what auto picks."""

import dataclasses

import pytest

from simdist.analytic.registry import closed_form
from simdist.analytic.select import priced_request, rank_choices
from simdist.collectives.group import Group
from simdist.collectives.nccl_model import protocol_cost, supports
from simdist.collectives.pat import blocks_per_step, dimensions, pat_plan, schedule
from simdist.collectives.protocols import SIMPLE
from simdist.collectives.registry import algorithm_for
from simdist.collectives.request import Request
from simdist.collectives.verify import verify
from simdist.engine.simulate import simulate
from simdist.errors import SimdistError
from simdist.hardware import load_topology
from tests.conftest import TOY_TOPOLOGY
from tests.plan_timing import uncontended

# tests/fixtures/toy-nvswitch.yaml on 4 nodes: GPU 0 of every node is on NIC 0, rail 0, one leaf. A route
# between them: GPU -> PCIe switch -> NIC -> leaf -> NIC -> PCIe switch -> GPU, 6 links of 1 us, 25 GB/s
# at the NIC (200 Gb/s), every efficiency 1.
TOY = load_topology(TOY_TOPOLOGY, num_nodes=4)
ONE_PER_NODE = Group(TOY, (0, 4, 8, 12))


@pytest.mark.parametrize("peers", range(1, 21))
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_pat_plans_compute_their_collectives(op, peers):
    verify(pat_plan(op, peers, 1e6))


@pytest.mark.parametrize("peers", range(2, 40))
def test_every_peer_sends_p_minus_1_blocks_in_ceil_log2_p_steps(peers):
    dims = dimensions("all_gather", peers)
    assert len(dims) == (peers - 1).bit_length()
    assert sum(blocks_per_step(peers, d) for d in dims) == peers - 1


def test_all_gather_goes_far_first_and_reduce_scatter_near_first():
    # P = 8: all_gather crosses distance 4 (1 block), 2 (2 blocks), 1 (4 blocks): the most data to the nearest
    ag = schedule("all_gather", 8)
    assert [(ag[s][0].dst, len(ag[s][0].chunks)) for s in range(3)] == [(4, 1), (6, 2), (7, 4)]
    rs = schedule("reduce_scatter", 8)
    assert [(rs[s][0].dst, len(rs[s][0].chunks)) for s in range(3)] == [(1, 4), (2, 2), (4, 1)]


def test_hand_timed_all_gather_on_four_nodes():
    # S = 4 MB over P = 4: blocks of 1 MB. Step d = 1 (distance 2): 1 block, 6 us + 1e6 / 25e9 = 46 us;
    # step d = 0 (distance 1): 2 blocks, 6 us + 80 us = 86 us. No two messages of a step share a link
    # (one leaf; each NIC sends one message and receives one): 132 us.
    req = Request("all_gather", ONE_PER_NODE, 4e6)
    assert closed_form("pat")(req, SIMPLE) == pytest.approx(132e-6, rel=1e-12)
    plan = algorithm_for("pat", req).build(req)
    run = simulate([(plan, ONE_PER_NODE)])[0]
    assert uncontended(plan, ONE_PER_NODE, run)
    assert run.time_s == pytest.approx(132e-6, rel=1e-9)
    fast = algorithm_for("pat", req).build_fast(req)
    assert simulate([(fast, ONE_PER_NODE)])[0].time_s == pytest.approx(132e-6, rel=1e-9)


def test_hand_timed_reduce_scatter_on_three_nodes_priced_as_nccl():
    # P = 3: two steps of one block (S/3 = 1 MB) each. NCCL's PAT constants (tuning.cc): start-up
    # baseLat 8 us + 3 ranks x 2.8 us = 16.4 us; a network step pays the Tree's Simple hwLat / 3.5 = 4 us,
    # of which the wire's 2.7 us (Ring LL) is already the route's: 1.3 us more; bandwidth x 0.75.
    # 16.4 + 2 x (6 + 1.3) + 2e6 / (0.75 x 25e9) = 16.4 + 14.6 + 106.667 us = 137.667 us.
    group = Group(TOY, (0, 4, 8))
    assert supports("pat", "Simple") and not supports("pat", "LL") and not supports("pat", "LL128")
    priced = protocol_cost("pat", "Simple", group)
    assert priced.cost.base_latency_s == pytest.approx(16.4e-6)
    assert priced.cost.rate_factor == pytest.approx(0.75)
    assert priced.latency_by_class_s["net"] == pytest.approx(1.3e-6)
    req = priced_request(Request("reduce_scatter", group, 3e6), priced)
    expected = 16.4e-6 + 14.6e-6 + 2e6 / (0.75 * 25e9)
    assert closed_form("pat")(req, priced.cost) == pytest.approx(expected, rel=1e-12)
    plan = dataclasses.replace(algorithm_for("pat", req).build(req), base_latency_s=priced.cost.base_latency_s,
                               per_transfer_latency_s=0.0, rate_factor=priced.cost.rate_factor)
    assert simulate([(plan, req.group)])[0].time_s == pytest.approx(expected, rel=1e-9)


def test_pat_refuses_several_ranks_per_node():
    req = Request("all_gather", Group(TOY, (0, 1, 4, 5)), 1e6)
    with pytest.raises(SimdistError) as err:
        algorithm_for("pat", req)
    assert err.value.field == "--algorithm" and "one GPU per node" in str(err.value)
    with pytest.raises(SimdistError, match="does not implement all_reduce"):
        algorithm_for("pat", Request("all_reduce", ONE_PER_NODE, 1e6))


def test_auto_takes_pat_at_scale_for_small_sizes_and_the_ring_for_large_ones():
    # 64 DGX H100 nodes, one GPU each (a data-parallel group): PAT's log2(64) = 6 steps beat the ring's 63
    # priced at the Tree's network latency (NCCL: "with ppn=1 latencies are fully exposed"); at 100 MB
    # PAT's 0.75 bandwidth factor loses to the ring.
    t = load_topology("dgx-h100", num_nodes=64)
    group = Group(t, tuple(range(0, 512, 8)))
    for op in ("all_gather", "reduce_scatter"):
        assert rank_choices(Request(op, group, 1e5))[0].algorithm == "pat"
        assert rank_choices(Request(op, group, 1e8))[0].algorithm == "ring"
    # several GPUs per node: PAT is never a candidate
    assert all(c.algorithm != "pat" for c in rank_choices(Request("all_gather", Group.first(t, 16), 1e5)))
