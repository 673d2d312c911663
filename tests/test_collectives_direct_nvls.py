"""Direct and NVLS plans: they compute their collectives, the engine reproduces the closed forms, and
bad requests fail with one-line SimdistErrors."""

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.analytic.direct import direct_time_s
from simdist.analytic.nvls import nvls_chain_length, nvls_time_s
from simdist.analytic.registry import closed_form
from simdist.collectives.direct import DIRECT_OPS, direct_plan, validate_matrix
from simdist.collectives.group import Group
from simdist.collectives.nvls import (
    NVLS_EFFICIENCY,
    nvls_link_efficiency,
    nvls_pieces,
    nvls_plan,
    nvls_rate_factor,
)
from simdist.collectives.ops import busbw_Bps
from simdist.collectives.plan import SWITCH, Transfer
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.registry import algorithm_for
from simdist.collectives.request import Request
from simdist.collectives.verify import PlanError, verify
from simdist.engine.simulate import simulate
from simdist.errors import SimdistError
from simdist.hardware import load_topology
from tests.conftest import TOY_TOPOLOGY
from tests.plan_timing import uncontended

# tests/fixtures/toy-nvswitch.yaml with 8 GPUs on its NVSwitch (round numbers for the closed forms)
TOY8 = load_topology(TOY_TOPOLOGY, num_nodes=1, assignments=["gpus_per_node=8", "inter_node.nics_per_node=8"])

NVLS_OPS = ("all_reduce", "reduce_scatter", "all_gather")


def _roots(op, peers):
    return [0] if op == "send_recv" else sorted({0, peers // 2, peers - 1})


def _matrix(rng, peers):
    return tuple(tuple(rng.choice([0.0, 1e6, rng.random() * 1e7]) for _ in range(peers)) for _ in range(peers))


@pytest.mark.parametrize("peers", range(2, 18))
def test_direct_plans_compute_their_collectives(peers):
    for op in sorted(DIRECT_OPS):
        for root in _roots(op, peers):
            verify(direct_plan(op, peers, 1e6, root))
    rng = random.Random(peers)
    verify(direct_plan("all_to_all", peers, 0, matrix=_matrix(rng, peers)))


@pytest.mark.parametrize("peers", range(2, 18))
def test_nvls_plans_compute_their_collectives(peers):
    for op in NVLS_OPS:
        for pieces in (1, 2, 3):
            verify(nvls_plan(op, peers, 1e6, pieces))


def test_one_shot_all_reduce_races_hence_two_shot():
    # A literal one-shot all_reduce (every peer adds its whole buffer into every other's) reads a
    # buffer while others add into it: the verifier has no separate input buffer, so it is a race.
    p = 4
    one_shot = tuple(Transfer(i, j, 1e6, 0, True) for i in range(p) for j in range(p) if i != j)
    plan = dataclasses.replace(direct_plan("all_reduce", p, 1e6), transfers=one_shot, num_chunks=1,
                               chunk_segment=(0,))
    with pytest.raises(PlanError, match="racing"):
        verify(plan)
    two_shot = direct_plan("all_reduce", p, 1e6)
    assert len(two_shot.transfers) == 2 * p * (p - 1)
    assert all(t.deps for t in two_shot.transfers[p * (p - 1):])  # the gather waits for its reductions


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100", "dgx-b200", "gb200-nvl72"])
@pytest.mark.parametrize("peers", [2, 5, 8])
def test_direct_engine_equals_closed_form_on_one_node(preset, peers):
    group = Group.first(load_topology(preset), peers)
    for op in sorted(DIRECT_OPS):
        for root in _roots(op, peers):
            engine = simulate([(direct_plan(op, peers, 256e6, root, group=group), group)])[0].time_s
            assert engine == pytest.approx(direct_time_s(group, op, 256e6, root), rel=1e-9), (op, root)


def test_direct_all_to_all_textbook_on_nvswitch():
    # Every GPU port carries (P-1)/P S each way: time = alpha + (P-1) S / (P B).
    group = Group.first(TOY8, 8)
    size = 2**30
    run = simulate([(direct_plan("all_to_all", 8, size, group=group), group)])[0]
    alpha, bw = 2e-6, 100e9  # the toy NVSwitch: two 1 us hops, 100 GB/s per port at efficiency 1
    assert run.time_s == pytest.approx(alpha + 7 * size / (8 * bw), rel=1e-9)
    up, down = group.topology.nvswitch_ports(0)
    assert run.link_bytes[up] == pytest.approx(7 * size / 8)
    assert run.link_bytes[down] == pytest.approx(7 * size / 8)
    assert busbw_Bps("all_to_all", 8, size, run.time_s) == pytest.approx(bw, rel=1e-3)  # the port, less alpha


def test_direct_two_shot_all_reduce_closed_form():
    # Two steps, each moving (P-1) S/P through every port each way: 2 (alpha + (P-1) S / (P B)).
    group = Group.first(TOY8, 8)
    p, size, alpha, bw = 8, 1e9, 2e-6, 100e9  # the toy NVSwitch
    engine = simulate([(direct_plan("all_reduce", p, size, group=group), group)])[0].time_s
    assert engine == pytest.approx(2 * (alpha + (p - 1) * size / (p * bw)), rel=1e-9)
    barrier = simulate([(direct_plan("barrier", p, 0, group=group), group)])[0].time_s
    assert barrier == pytest.approx(2 * alpha, rel=1e-9)
    reduce = simulate([(direct_plan("reduce", p, size, root=3, group=group), group)])[0].time_s
    assert reduce == pytest.approx(alpha + (p - 1) * size / bw, rel=1e-9)  # the root's port takes it all


def test_closed_forms_apply_the_protocol_like_the_engine():
    group = Group.first(load_topology("dgx-h100"), 8)
    priced = group.priced({"nvlink": 0.7e-6})  # a protocol's extra latency per NVLink path
    for factor in (0.5, 1.04):
        proto = ProtocolCost("ll128", base_latency_s=5e-6, per_transfer_latency_s=1e-6, rate_factor=factor)
        extra = {"base_latency_s": 5e-6, "per_transfer_latency_s": 1e-6, "rate_factor": factor}
        for op in ("all_to_all", "broadcast", "all_reduce", "send_recv"):
            plan = dataclasses.replace(direct_plan(op, 8, 64e6, group=priced), **extra)
            engine = simulate([(plan, priced)])[0].time_s
            assert engine == pytest.approx(closed_form("direct")(Request(op, priced, 64e6), proto), rel=1e-9), op
        for op in NVLS_OPS:
            plan = dataclasses.replace(nvls_plan(op, 8, 64e6), **extra)
            engine = simulate([(plan, priced)])[0].time_s
            assert engine == pytest.approx(closed_form("nvls")(Request(op, priced, 64e6), proto), rel=1e-9), op


# Block sizes >= 4 KiB: a block of a few bytes next to 10^7-byte ones makes the engine spin (its
# completion threshold, 1e-12 x size, falls below rate x the clock's resolution; see the report).
@settings(max_examples=25, deadline=None)
@given(st.integers(2, 6).flatmap(lambda p: st.lists(
    st.lists(st.sampled_from([0.0, 4096.0, 1e6, 3.3e6, 2e7]), min_size=p, max_size=p), min_size=p, max_size=p)))
def test_uneven_all_to_all(rows):
    p = len(rows)
    matrix = validate_matrix(rows, p)
    verify(direct_plan("all_to_all", p, 0, matrix=matrix))
    group = Group.first(load_topology("dgx-h100"), p)
    plan = direct_plan("all_to_all", p, 0, matrix=matrix, group=group)
    assert sum(plan.bytes_sent()) == pytest.approx(sum(rows[i][j] for i in range(p) for j in range(p) if i != j))
    engine = simulate([(plan, group)])[0].time_s
    # every block moves at its share of its busiest port in proportion to its bytes: a port's blocks
    # drain together, in (the port's bytes) / capacity, the least the port allows
    assert engine == pytest.approx(direct_time_s(group, "all_to_all", 0, matrix=matrix), rel=1e-9)


def test_uneven_all_to_all_blocks_of_a_port_land_together():
    # Peer 0 sends 1 MB to peer 1 and 10 MB to peer 2; peer 1 sends 10 MB to peer 2. Peer 0's up port
    # carries 11 MB, peer 2's down port 20 MB: 0 -> 2 and 1 -> 2 land at alpha + 20 MB / B, and 0 -> 1
    # (held at peer 0's port, 1/11 of it) at alpha + 11 MB / B.
    group = Group.first(load_topology("dgx-h100"), 3)
    matrix = ((0.0, 1e6, 1e7), (0.0, 0.0, 1e7), (0.0, 0.0, 0.0))
    plan = direct_plan("all_to_all", 3, 0, matrix=matrix, group=group)
    run = simulate([(plan, group)])[0]
    alpha, bw = 0.6e-6, 450e9 * 0.82
    lands = {(t.src, t.dst): end for t, end in zip(plan.transfers, run.trace.ends, strict=True) if t.nbytes}
    assert lands == pytest.approx({(0, 1): alpha + 11e6 / bw, (0, 2): alpha + 2e7 / bw, (1, 2): alpha + 2e7 / bw},
                                  rel=1e-9)


def test_direct_on_pcie():
    # Routes of different latencies and bottlenecks: each block pays its own route's latency and its
    # busiest link's drain (before, the closed form added the longest latency to the busiest link's
    # drain, and the engine was up to 18 % faster). The two-shot all_reduce's second step starts per
    # owner once its segment is reduced; here it never meets first-step blocks on a link.
    group = Group.first(load_topology("pcie-gen5-8gpu"), 8)
    t = group.topology
    for op in ("all_to_all", "all_gather", "reduce_scatter", "all_reduce"):
        plan = direct_plan(op, 8, 256e6, group=group)
        run = simulate([(plan, group)])[0]
        bound = max(b / t.link(link).effective_bandwidth_Bps for link, b in run.link_bytes.items())
        assert run.time_s >= bound
        assert uncontended(plan, group, run)
        assert run.time_s == pytest.approx(direct_time_s(group, op, 256e6), rel=1e-9), op


@pytest.mark.parametrize("nodes", [2, 4])
def test_all_to_all_across_nodes_is_nic_bound(nodes):
    # NCCL's all-to-all cannot aggregate several NICs per GPU (nccl-tests#267): each rank's inter-node
    # blocks leave through its own NIC, so its inter-node throughput stays below one NIC's speed;
    # GTC25 (S72583 slide 13) measured ~48 GB/s all-to-all busbw on 32 DGX H100 GPUs.
    t = load_topology("dgx-h100", num_nodes=nodes)
    p, size = 8 * nodes, 2**30
    group = Group.first(t, p)
    run = simulate([(direct_plan("all_to_all", p, size, group=group), group)])[0]
    inter_node_bytes = size / p * (p - 8)
    nic = t.spec.inter_node.nic_bandwidth
    assert inter_node_bytes / run.time_s <= nic
    intra = simulate([(direct_plan("all_to_all", 8, size, group=Group.first(t, 8)), Group.first(t, 8))])[0]
    assert run.time_s > 5 * intra.time_s  # NIC-bound, not NVLink-bound
    if nodes == 4:
        assert busbw_Bps("all_to_all", p, size, run.time_s) / 1e9 == pytest.approx(48, rel=0.1)
    assert run.time_s == pytest.approx(direct_time_s(group, "all_to_all", size), rel=1e-9)


@pytest.mark.parametrize("preset,peers", [("dgx-h100", 2), ("dgx-h100", 5), ("dgx-h100", 8), ("hgx-h200", 8),
                                          ("dgx-b200", 8), ("gb200-nvl72", 17)])
def test_nvls_engine_equals_closed_form(preset, peers):
    group = Group.first(load_topology(preset), peers)
    for op in NVLS_OPS:
        for pieces in (1, 2, 3):
            engine = simulate([(nvls_plan(op, peers, 64e6, pieces), group)])[0].time_s
            assert engine == pytest.approx(nvls_time_s(group, op, 64e6, pieces), rel=1e-9), (op, pieces)


def test_nvls_all_reduce_port_loads_and_busbw():
    group = Group.first(load_topology("dgx-h100"), 8)
    p, size = 8, 8 * 2**30
    k = nvls_pieces("all_reduce", p, size)
    assert k == 64
    run = simulate([(nvls_plan("all_reduce", p, size), group)])[0]
    up, down = group.topology.nvswitch_ports(3)
    assert run.link_bytes[up] == pytest.approx(size * (1 + 1 / p))
    assert run.link_bytes[down] == pytest.approx(size * (1 + 1 / p))
    assert run.time_s == pytest.approx(nvls_chain_length("all_reduce", p, k) * (0.3e-6 + size / (k * p) / 369e9),
                                       rel=1e-9)
    busbw = busbw_Bps("all_reduce", p, size, run.time_s) / 1e9
    # With the ring-calibrated NVLink efficiency 0.82 the plan gives ~556 GB/s; measured NVLS is
    # ~470-480 GB/s (mle_h200_node_all_reduce_bench; nccl-tests#212): a 0.864 rate factor reproduces it.
    assert busbw == pytest.approx(556, rel=0.01)
    slowed = simulate([(dataclasses.replace(nvls_plan("all_reduce", p, size), rate_factor=0.864), group)])[0]
    assert busbw_Bps("all_reduce", p, size, slowed.time_s) / 1e9 == pytest.approx(480, rel=0.01)
    # NCCL's nvlsEfficiency 0.85 instead of the ring's 0.82 (nvls_rate_factor) would give ~576 GB/s.
    factor = nvls_rate_factor(group.topology)
    assert factor == pytest.approx(0.85 / 0.82)
    nccl_eff = simulate([(dataclasses.replace(nvls_plan("all_reduce", p, size), rate_factor=factor), group)])[0]
    assert busbw_Bps("all_reduce", p, size, nccl_eff.time_s) / 1e9 == pytest.approx(576, rel=0.01)
    ring_busbw = 369  # ring busbw = the link's effective bandwidth (test_collectives_ring)
    assert busbw > ring_busbw


def test_nvls_pieces_are_capped():
    assert nvls_pieces("all_reduce", 8, 1e3) == 1
    assert nvls_pieces("all_reduce", 72, 1e12) * 72 * 146 <= 2**15
    assert len(nvls_plan("all_gather", 8, 1e12).transfers) <= 2**15
    assert nvls_link_efficiency(load_topology("dgx-h100")) == NVLS_EFFICIENCY[4] == 0.85
    assert nvls_link_efficiency(load_topology("gb200-nvl72")) == 0.74
    assert nvls_link_efficiency(load_topology("dgx-a100")) is None


def test_nvls_uses_only_switch_ports():
    plan = nvls_plan("all_reduce", 4, 1e6, 2)
    assert all(SWITCH in (t.src, t.dst) for t in plan.transfers)


@pytest.mark.parametrize("preset", ["dgx-a100", "pcie-gen4-8gpu"])
def test_nvls_refused_without_nvlink_sharp(preset):
    req = Request("all_reduce", Group.first(load_topology(preset), 8), 1e9)
    with pytest.raises(SimdistError, match="NVLink SHARP") as err:
        algorithm_for("nvls", req)
    assert "\n" not in str(err.value) and "--algorithm ring or auto" in str(err.value)


def test_nvls_refused_across_nodes_and_allowed_in_one():
    t = load_topology("dgx-h100", num_nodes=2)
    with pytest.raises(SimdistError, match="spans 2 nodes"):
        algorithm_for("nvls", Request("all_reduce", Group.first(t, 16), 1e9))
    algo = algorithm_for("nvls", Request("reduce_scatter", Group(t, tuple(range(8, 16))), 1e9))
    plan = algo.build(Request("reduce_scatter", Group(t, tuple(range(8, 16))), 1e9))
    verify(plan)
    with pytest.raises(SimdistError, match="does not implement broadcast"):
        algorithm_for("nvls", Request("broadcast", Group.first(t, 8), 1e9))


@pytest.mark.parametrize("matrix,match", [
    (((1.0, 2.0), (3.0, 4.0)), "has 2 rows"),
    (((0.0, 1.0, 2.0),) * 2 + ((0.0, 1.0),), "lengths"),
    (((0.0, -1.0, 0.0),) * 3, "not a finite non-negative"),
    (((0.0, float("nan"), 0.0),) * 3, "not a finite non-negative"),
    (((0.0, "x", 0.0),) * 3, "non-number"),
])
def test_bad_all_to_all_matrix(matrix, match):
    req = Request("all_to_all", Group.first(load_topology("dgx-h100"), 3), 0, matrix=matrix)
    with pytest.raises(SimdistError, match=match) as err:
        algorithm_for("direct", req)
    assert str(err.value).startswith("--matrix:") and "\n" not in str(err.value)


def test_direct_registration_and_bad_roots():
    group = Group.first(load_topology("dgx-h100"), 4)
    req = Request("all_to_all", group, 0, matrix=((0, 1e6, 2e6, 0),) * 4)
    algo = algorithm_for("direct", req)
    plan = algo.build(req)
    verify(plan)
    assert plan.nbytes == pytest.approx(3e6)
    engine = simulate([(plan, group)])[0].time_s
    assert engine == pytest.approx(closed_form("direct")(req, ProtocolCost()), rel=1e-9)
    with pytest.raises(SimdistError, match="--root"):
        algorithm_for("direct", Request("send_recv", group, 1e6, root=1))
    with pytest.raises(SimdistError, match="outside the group"):
        algorithm_for("direct", Request("scatter", group, 1e6, root=4))
    with pytest.raises(SimdistError, match="2 ranks"):
        algorithm_for("direct", Request("send_recv", Group.first(load_topology("dgx-h100"), 1), 1e6))
