"""Ring plans: they compute their collective, and the engine reproduces the closed forms."""

import dataclasses

import pytest

from simdist.analytic.ring import chain_time_s, ring_time_s
from simdist.collectives.group import Group
from simdist.collectives.ops import algbw_Bps, busbw_Bps
from simdist.collectives.ring import pipeline_pieces, ring_all_gather, ring_all_reduce, ring_chain, ring_reduce_scatter
from simdist.collectives.verify import PlanError, verify
from simdist.engine.simulate import simulate
from simdist.hardware import load_topology
from tests.conftest import TOY_TOPOLOGY


@pytest.mark.parametrize("peers", range(2, 18))
def test_ring_plans_compute_their_collectives(peers):
    for channels in (1, 2, 3):
        verify(ring_all_reduce(peers, 1e6, channels))
        verify(ring_reduce_scatter(peers, 1e6, channels))
        verify(ring_all_gather(peers, 1e6, channels))
    for root in {0, peers // 2, peers - 1}:
        verify(ring_chain("broadcast", peers, 3e6, root))
        verify(ring_chain("reduce", peers, 3e6, root))


def test_all_reduce_is_all_gather_after_reduce_scatter():
    rs, ag, ar = ring_reduce_scatter(5, 1e6), ring_all_gather(5, 1e6), ring_all_reduce(5, 1e6)
    assert [(t.src, t.dst, t.chunk) for t in ar.transfers] == [
        (t.src, t.dst, t.chunk) for t in rs.transfers + ag.transfers
    ]
    assert rs.chunk_segment == ag.chunk_segment == ar.chunk_segment


def test_verifier_catches_a_missing_step_and_a_double_count():
    plan = ring_all_reduce(4, 1e6)
    with pytest.raises(PlanError, match="expected"):
        verify(dataclasses.replace(plan, transfers=plan.transfers[:-1]))
    doubled = (*plan.transfers[:3], plan.transfers[0], *plan.transfers[3:])
    with pytest.raises(PlanError):
        verify(dataclasses.replace(plan, transfers=doubled))


def test_nccl_tests_conventions_worked_example():
    # The lecture's constructed example: P = 4, S = 400 MiB, t = 2 ms.
    size = 400 * 2**20
    assert algbw_Bps(size, 2e-3) / 1e9 == pytest.approx(209.7, abs=0.05)
    assert busbw_Bps("all_reduce", 4, size, 2e-3) / 1e9 == pytest.approx(314.6, abs=0.05)
    assert busbw_Bps("all_gather", 4, size, 2e-3) / 1e9 == pytest.approx(209.7 * 3 / 4, abs=0.05)
    assert busbw_Bps("broadcast", 4, size, 2e-3) == algbw_Bps(size, 2e-3)


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx-h100", "dgx-b200", "gb200-nvl72"])
@pytest.mark.parametrize("peers", [2, 4, 8])
def test_engine_equals_closed_form_on_one_node(preset, peers):
    group = Group.first(load_topology(preset), peers)
    size = 256e6
    for channels in (1, 2):
        plan = ring_all_reduce(peers, size, channels)
        engine = simulate([(plan, group)])[0].time_s
        closed = ring_time_s(group, size, [list(range(peers))] * channels, 2 * (peers - 1))
        assert engine == pytest.approx(closed, rel=1e-9)


def test_textbook_ring_formula_on_nvswitch():
    group = Group.first(load_topology(TOY_TOPOLOGY, num_nodes=1), 4)
    p, size = 4, 1e9
    alpha, bw = 2e-6, 100e9  # the toy NVSwitch: two 1 us hops, 100 GB/s per port at efficiency 1
    engine = simulate([(ring_all_reduce(p, size), group)])[0].time_s
    assert engine == pytest.approx(2 * (p - 1) * (alpha + size / (p * bw)), rel=1e-9)


def test_pipelined_broadcast_chain():
    group = Group.first(load_topology(TOY_TOPOLOGY, num_nodes=1), 4)
    size = 64e6
    k = pipeline_pieces(size)
    assert k == 123  # 64e6 / 512 KiB, rounded up
    engine = simulate([(ring_chain("broadcast", 4, size, 0), group)])[0].time_s
    assert engine == pytest.approx(chain_time_s(group, size, list(range(4)), k), rel=1e-9)
    alpha, bw = 2e-6, 100e9  # the toy NVSwitch
    assert engine == pytest.approx((4 - 2 + k) * (alpha + size / k / bw), rel=1e-9)


def test_two_all_reduces_through_one_nic_contend():
    # Two 2-GPU groups whose rings both cross node 0 -> node 1 on NIC 0 (fat tree, same leaf).
    t = load_topology("pcie-gen5-8gpu", num_nodes=2)
    a = Group(t, (0, 8))
    b = Group(t, (1, 9))  # GPU 1 shares GPU 0's PCIe switch and its NIC
    size = 512e6
    alone = simulate([(ring_all_reduce(2, size), a)])[0].time_s
    both = simulate([(ring_all_reduce(2, size), a), (ring_all_reduce(2, size), b)])
    assert both[0].time_s > 1.9 * alone and both[1].time_s > 1.9 * alone
    closed = ring_time_s(a, size, [[0, 1]], 2)
    assert alone == pytest.approx(closed, rel=1e-9)


def test_heterogeneous_pcie_ring_close_to_closed_form():
    # On a PCIe box the ring's edges differ (same switch, root complex, across sockets): the
    # step-synchronous closed form is then an approximation; it stays within a few percent, and the
    # engine can never beat the busiest link's total bytes / capacity.
    group = Group.first(load_topology("pcie-gen5-8gpu"), 8)
    size = 256e6
    engine_run = simulate([(ring_all_reduce(8, size), group)])[0]
    closed = ring_time_s(group, size, [list(range(8))], 14)
    assert engine_run.time_s == pytest.approx(closed, rel=0.03)
    t = group.topology
    bound = max(b / t.link(link).effective_bandwidth_Bps for link, b in engine_run.link_bytes.items())
    assert engine_run.time_s >= bound
    assert bound == pytest.approx(14 * size / 8 / 22e9)  # the UPI link carries 2 x 7 pieces of S/8


def test_verifier_lets_reductions_commute_but_not_copies():
    from simdist.collectives.plan import Plan, Transfer

    # peers 1 and 2 both add their chunk into peer 0 at once: fine, addition commutes
    ok = Plan("reduce", "test", 3, 1.0, (Transfer(1, 0, 1.0, 0, True), Transfer(2, 0, 1.0, 0, True)), num_chunks=1)
    verify(ok)
    # a copy into peer 0 racing with a reduction into the same chunk depends on timing
    racy = Plan("reduce", "test", 3, 1.0, (Transfer(1, 0, 1.0, 0, False), Transfer(2, 0, 1.0, 0, True)), num_chunks=1)
    with pytest.raises(PlanError, match="racing"):
        verify(racy)
