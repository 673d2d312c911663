"""Fast fidelity at scale: vectorised routes, the fluid solver (== the SimPy engine), fast ring and
fast all_to_all against their detailed plans. No timing assertions (see benchmarks/collectives.py)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import simpy

from simdist import api
from simdist.analytic.registry import closed_form
from simdist.collectives.direct import direct_fast, direct_plan
from simdist.collectives.group import Group
from simdist.collectives.plan import SWITCH, Plan, Transfer
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request
from simdist.collectives.ring import ring_fast
from simdist.engine.executor import Trace, run_plan
from simdist.engine.fluid import fluid_applicable, fluid_finish_times, run_fluid
from simdist.engine.links import SharedLinks
from simdist.engine.simulate import simulate
from simdist.hardware import load_topology
from simdist.hardware.batch import link_capacities, link_loads, routes
from tests.conftest import TOY_TOPOLOGY


def simpy_run(plan: Plan, group: Group) -> tuple[float, dict[int, float], Trace]:
    """The SimPy engine, as `simulate` runs it for several plans (never the fluid shortcut)."""
    topology = group.topology
    env = simpy.Environment()
    net = SharedLinks(env, lambda link: topology.link(link).effective_bandwidth_Bps)
    trace = Trace()
    proc = env.process(run_plan(env, net, plan, group.path, trace))
    env.run(until=proc)
    return proc.value, dict(net.load.bytes_by_link), trace


# ----------------------------------------------------------------------------- routes
CLUSTERS = [
    ("dgx-h100", 300, []),  # rail-optimized, 10 rail groups, 32 spines
    ("dgx-h100", 70, ["inter_node.fabric=fat_tree"]),
    ("dgx-a100", 40, ["inter_node.oversubscription=3"]),
    ("gb200-nvl72", 3, []),
    ("pcie-gen4-8gpu", 20, []),
    ("hgx-h200", 5, ["inter_node.kind=roce"]),
    ("dgx-b200", 1, []),
    ("llama3-24k", 40, ["inter_node.leaves_per_pod=4", "inter_node.switch_radix=8"]),  # 3 tiers: 5 pods at 1:7
]


@pytest.mark.parametrize(("preset", "nodes", "sets"), CLUSTERS)
def test_batch_routes_equal_topology_routes(preset, nodes, sets):
    t = load_topology(preset, num_nodes=nodes, assignments=sets)
    rng = random.Random(7)
    n = t.num_gpus
    pairs = [(rng.randrange(n), rng.randrange(n)) for _ in range(3000)]
    src, dst = (np.array(x) for x in zip(*pairs, strict=True))
    batch = routes(t, src, dst)
    assert [batch.route(i) for i in range(len(pairs))] == [t.route(s, d) for s, d in pairs]
    ids = np.unique(batch.links)
    assert link_capacities(t, ids).tolist() == [t.link(int(i)).effective_bandwidth_Bps for i in ids]
    weights = np.arange(len(pairs), dtype=float)
    loads = dict(zip(*(a.tolist() for a in link_loads(batch, weights)), strict=True))
    expected: dict[int, float] = {}
    for w, (s, d) in zip(weights.tolist(), pairs, strict=True):
        for link in t.route(s, d).links:
            expected[link] = expected.get(link, 0.0) + w
    assert loads == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("preset", "nodes", "sets", "failed"), [
    ("dgx-h100", 40, [], ()), ("dgx-a100", 12, ["inter_node.oversubscription=3"], ((0, 1), (1, 0))),
    ("gb200-nvl72", 3, [], ()), ("pcie-gen4-8gpu", 6, [], ())])
def test_batch_routes_from_a_topology_s_templates_equal_fresh_routes(preset, nodes, sets, failed, monkeypatch):
    # batch.routes keeps one template per class of pairs on its topology (Topology.route_templates): later batches
    # place the templates that earlier ones made, and a full table is emptied; every route stays the one a fresh
    # topology's Topology.route gives (failed leaf-spine links included: their topology keeps its own templates).
    from simdist.hardware import batch as batch_module

    warm = load_topology(preset, num_nodes=nodes, assignments=sets).with_failed_uplinks(failed)
    monkeypatch.setattr(batch_module, "ROUTE_TEMPLATES_MAX", 50)
    rng = random.Random(11)
    n = warm.num_gpus
    for _ in range(4):
        pairs = [(rng.randrange(n), rng.randrange(n)) for _ in range(500)]
        src, dst = (np.array(x) for x in zip(*pairs, strict=True))
        got = routes(warm, src, dst)
        fresh = load_topology(preset, num_nodes=nodes, assignments=sets).with_failed_uplinks(failed)
        assert [got.route(i) for i in range(len(pairs))] == [fresh.route(s, d) for s, d in pairs]
        assert got.kind_mask.tolist() == [
            sum({1 << k for k, kind in enumerate(batch_module.LINK_KINDS)
                 if kind in {fresh.link(x).kind for x in fresh.route(s, d).links}}) for s, d in pairs]
        assert 0 < len(warm.route_templates) <= 50


def test_group_paths_equal_group_path_with_protocol_latency_and_switch():
    t = load_topology("dgx-h100", num_nodes=4)
    group = Group(t, tuple(random.Random(1).sample(range(32), 20))).priced(
        {"nvlink": 0.4e-6, "pcie": 1.1e-6, "net": 2.5e-6})
    rng = random.Random(2)
    pairs = [(rng.choice([SWITCH, *range(20)]), rng.randrange(20)) for _ in range(400)]
    pairs += [(rng.randrange(20), SWITCH) for _ in range(50)]
    batch = group.paths(np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
    assert [batch.route(i) for i in range(len(pairs))] == [group.path(s, d) for s, d in pairs]


def test_out_of_range_ranks_raise_like_topology():
    t = load_topology("dgx-h100", num_nodes=2)
    with pytest.raises(Exception, match="outside this cluster"):
        routes(t, np.array([0, 99]), np.array([1, 2]))


# ----------------------------------------------------------------------------- fluid == SimPy
def _random_plan(rng: random.Random, num_peers: int, n: int, switch: bool) -> Plan:
    transfers = []
    for _ in range(n):
        src = rng.randrange(num_peers)
        dst = SWITCH if switch and rng.random() < 0.15 else rng.choice([p for p in range(num_peers) if p != src])
        nbytes = rng.choice([0.0, 4096.0, 1e6, 3e6, 2.5e7, rng.uniform(1e5, 5e7)])
        extra = rng.choice([0.0, 0.0, 1e-6, rng.uniform(0, 2e-5)])
        transfers.append(Transfer(src, dst, nbytes, -1, extra_latency_s=extra))
    return Plan(op="all_to_all", algorithm="test", num_peers=num_peers, nbytes=1.0, transfers=tuple(transfers),
                num_chunks=0, verifiable=False,
                per_transfer_latency_s=rng.choice([0.0, 2e-6]), base_latency_s=rng.choice([0.0, 5e-6]),
                rate_factor=rng.choice([1.0, 0.92, 0.5]))


@pytest.mark.parametrize("seed", range(8))
def test_fluid_solver_equals_simpy_engine_on_random_plans(seed):
    rng = random.Random(seed)
    preset, nodes, peers = rng.choice([("dgx-h100", 2, 16), ("dgx-h100", 3, 20), ("pcie-gen4-8gpu", 1, 8),
                                       ("dgx-a100", 4, 32)])
    t = load_topology(preset, num_nodes=nodes, assignments=["inter_node.oversubscription=2"] if nodes > 2 else [])
    group = Group(t, tuple(rng.sample(range(t.num_gpus), peers)))
    if rng.random() < 0.5:
        group = group.priced({"nvlink": 0.6e-6, "pcie": 1e-6, "net": 3e-6})
    plan = _random_plan(rng, peers, rng.randint(1, 120), switch=t.spec.scale_up is not None)
    assert fluid_applicable(plan)
    time_s, link_bytes, trace = simpy_run(plan, group)
    f_time, f_bytes, f_trace = run_fluid(plan, group)
    assert f_time == pytest.approx(time_s, rel=1e-9)
    assert f_trace.ends == pytest.approx(trace.ends, rel=1e-9)
    assert f_trace.starts == trace.starts
    assert list(f_bytes) == list(link_bytes) and f_bytes == link_bytes  # same sums, same order
    (run,) = simulate([(plan, group)])  # simulate takes the fluid path for one dependency-free plan
    assert run.time_s == f_time


def test_fluid_equals_simpy_on_detailed_all_to_all_and_fast_ring():
    t = load_topology("dgx-h100", num_nodes=4)
    group = Group.first(t, 32).priced({"nvlink": 0.5e-6, "net": 2e-6})
    for plan in (direct_plan("all_to_all", 32, 2**28), ring_fast(Request("all_reduce", group, 2**28)),
                 dataclasses.replace(ring_fast(Request("all_gather", group, 3e6)), rate_factor=0.5)):
        time_s, link_bytes, trace = simpy_run(plan, group)
        f_time, f_bytes, f_trace = run_fluid(plan, group)
        assert f_time == pytest.approx(time_s, rel=1e-9)
        assert f_trace.ends == pytest.approx(trace.ends, rel=1e-9)
        assert f_bytes == link_bytes


def test_fluid_solver_by_hand():
    # two links of 10 B/s; flow 0 on both, flow 1 on link 0, flow 2 on link 1 joining at t=1
    ends = fluid_finish_times(np.array([0.0, 0.0, 1.0]), np.array([10.0, 10.0, 5.0]),
                              np.array([0, 2, 3, 4]), np.array([0, 1, 0, 1]), np.array([10.0, 10.0]))
    # [0, 1): flows 0 and 1 share link 0 at 5 B/s (flow 0 alone on link 1). At 1: flow 2 joins link 1,
    # flows 0 and 2 split it (5 each), flow 1 keeps 5: flows 0 and 1 have 5 B left -> end at 2;
    # flow 2 has 0 B left at 2.
    assert ends.tolist() == pytest.approx([2.0, 2.0, 2.0])
    assert fluid_finish_times(np.array([3.0]), np.array([0.0]), np.array([0, 1]), np.array([0]),
                              np.array([1.0])).tolist() == [3.0]


def test_simulate_keeps_simpy_for_dependencies_and_several_plans():
    t = load_topology(TOY_TOPOLOGY, num_nodes=1)  # two 1 us hops, 100 GB/s per port at efficiency 1
    group = Group.first(t, 4)
    plan = Plan(op="x", algorithm="t", num_peers=4, nbytes=1.0, num_chunks=0, verifiable=False,
                transfers=(Transfer(0, 1, 1e6, -1), Transfer(1, 2, 1e6, -1, deps=(0,))))
    assert not fluid_applicable(plan)
    (run,) = simulate([(plan, group)])
    assert run.time_s == pytest.approx(2 * (2e-6 + 1e6 / 100e9), rel=1e-9)
    one = dataclasses.replace(plan, transfers=plan.transfers[:1])
    a, _ = simulate([(one, group), (one, group)])  # both on link 0 -> 1: each at half rate
    assert a.time_s == pytest.approx(2e-6 + 2e6 / 100e9, rel=1e-9)


def test_tiny_blocks_next_to_large_ones_finish():
    # 8-byte blocks next to 1e7-byte ones: the remaining fraction can fall below what the clock resolves
    t = load_topology("dgx-h100")
    group = Group.first(t, 4)
    plan = Plan(op="x", algorithm="t", num_peers=4, nbytes=1.0, num_chunks=0, verifiable=False,
                transfers=tuple(Transfer(s, d, b, -1) for s in range(4) for d in range(4) if s != d
                                for b in (8.0, 1e7 + s)))
    fast, slow = run_fluid(plan, group)[0], simpy_run(plan, group)[0]
    assert fast == pytest.approx(slow, rel=1e-9)


# ----------------------------------------------------------------------------- fast plans
def test_fast_ring_matches_detailed_on_one_node_exactly():
    for proto in ("LL", "LL128", "Simple"):
        for size in (2**20, 2**30):
            rows = [api.collective("dgx-h100", "all_reduce", 8, [size], algorithm="ring", protocol=proto,
                                   fidelity=f)[0] for f in ("detailed", "fast")]
            assert rows[1].time_s == pytest.approx(rows[0].time_s, rel=1e-9)


RING_OPS = ("all_reduce", "all_gather", "reduce_scatter")


@pytest.mark.parametrize("nodes", [2, 4])
def test_fast_ring_equals_detailed_on_several_nodes(nodes):
    # The issue asks for 1 %; uncontended the two fidelities and the closed form are one formula (max
    # chain latency + steps x the busiest link's step time, NCCL's lat + size / bw), so they agree to
    # rounding. Before the detailed plan's hops moved at their channel's bottleneck rate, in order on
    # their connection (simdist.collectives.ring.RingHop), they differed by -2.7 to +34 % on this grid.
    for op in RING_OPS:
        for proto in ("LL", "LL128", "Simple"):
            for size in (2**24, 2**30):
                detailed, fast = (api.collective("dgx-h100", op, 8 * nodes, [size], algorithm="ring", protocol=proto,
                                                 num_nodes=nodes, fidelity=f)[0] for f in ("detailed", "fast"))
                assert fast.fidelity == "fast" and detailed.fidelity == "detailed"
                assert fast.time_s == pytest.approx(detailed.time_s, rel=1e-9), (op, proto, size)
                assert detailed.closed_form_s == pytest.approx(detailed.time_s, rel=1e-9), (op, proto, size)


@pytest.mark.parametrize(("preset", "nodes", "sets"), [
    ("pcie-gen4-8gpu", 2, []),  # 4 NICs for 8 GPUs: two GPUs (and two channels) per NIC
    ("dgx-h100", 2, ["inter_node.nics_per_node=2"]),  # 8 channels through 2 NICs per node
    ("dgx-a100", 4, ["inter_node.oversubscription=3"]),  # channels meet on oversubscribed uplinks
])
def test_fast_ring_equals_detailed_where_channels_share_links(preset, nodes, sets):
    per_node = load_topology(preset).num_gpus
    for op, proto, size in (("all_reduce", "Simple", 2**24), ("all_reduce", "LL", 2**28),
                            ("all_gather", "LL128", 2**26)):
        detailed, fast = (api.collective(preset, op, per_node * nodes, [size], algorithm="ring", protocol=proto,
                                         num_nodes=nodes, assignments=sets, fidelity=f)[0]
                          for f in ("detailed", "fast"))
        assert fast.time_s == pytest.approx(detailed.time_s, rel=1e-9), (op, proto, size)


def _ring_runs(groups: list[Group], size: float, proto: str) -> tuple[list[float], list[float], list[float]]:
    """Fast and detailed times of a ring all_reduce on each group, all issued at once on one network, and
    each ring's chain latency (the closed form's latency term)."""
    from simdist.analytic.ring import ring_time_s
    from simdist.analytic.select import evaluate, priced_request
    from simdist.collectives.registry import algorithm_for

    runs: dict[str, list[tuple[Plan, Group]]] = {"fast": [], "detailed": []}
    chains = []
    for group in groups:
        request = Request("all_reduce", group, size)
        choice = evaluate(request, "ring", proto)
        priced = priced_request(request, choice.priced)
        cost = choice.priced.cost
        algo = algorithm_for("ring", request)
        for name, build in (("fast", algo.build_fast), ("detailed", algo.build)):
            plan = dataclasses.replace(build(priced), base_latency_s=cost.base_latency_s, rate_factor=cost.rate_factor)
            runs[name].append((plan, priced.group))
        orders = priced.group.ring_orders(request.num_channels())
        chains.append(ring_time_s(priced.group, 0.0, orders, 2 * (group.size - 1), cost.per_transfer_latency_s))
    fast, detailed = ([r.time_s for r in simulate(runs[name])] for name in ("fast", "detailed"))
    return fast, detailed, chains


def test_fast_and_detailed_ring_when_two_rings_compete():
    # Two rings issued together. The fast plan's flows keep the links busy from the end of their chain
    # latency on; the detailed steps of one ring move in the other's latency gaps. So the fast plan is
    # slower, by at most its chain latency (measured: 0.82-0.94 of it, i.e. 16 MiB Simple +12 % through
    # shared NICs, +21 % on the same GPUs; 1 GiB +0.01 to +1.2 %). Bandwidth-bound through shared NICs
    # (each ring's time doubles) they agree within 1 %.
    t = load_topology("dgx-h100", num_nodes=2, assignments=["inter_node.nics_per_node=2"])
    shared_nics = [Group(t, tuple(range(0, 16, 2))), Group(t, tuple(range(1, 16, 2)))]
    same_gpus = [Group.first(load_topology("dgx-h100", num_nodes=2), 16)] * 2
    for groups in (shared_nics, same_gpus):
        for proto in ("LL", "Simple"):
            for size in (2**24, 2**30):
                fast, detailed, chains = _ring_runs(groups, size, proto)
                for f, d, chain in zip(fast, detailed, chains, strict=True):
                    assert d * (1 - 1e-9) <= f <= d + chain, (proto, size)
                if groups is shared_nics and size == 2**30:
                    alone = _ring_runs(groups[:1], size, proto)[1][0]
                    assert all(d > 1.9 * alone for d in detailed)
                    assert fast == pytest.approx(detailed, rel=0.01)


def test_detailed_ring_hops_move_at_their_channel_bottleneck_rate_in_order():
    # Rate coupling: every hop of a channel is capped at the channel's share of its slowest link (here
    # the NIC, one channel each), and a connection sends its steps in order, so each ring edge carries one
    # step at a time and the latencies add. Uncoupled, the NVLink hops run ahead and the NIC edges carry
    # several steps at once: later steps' latency hides behind earlier bytes, which made the detailed
    # plan up to 25 % faster than the fast plan and the closed form.
    from simdist.collectives.registry import algorithm_for
    from simdist.collectives.ring import channel_rates, ring_all_reduce

    t = load_topology("dgx-h100", num_nodes=2)
    group = Group.first(t, 16)
    request = Request("all_reduce", group, 2**26)
    orders = group.ring_orders(request.num_channels())
    rates = channel_rates(group, orders)
    assert rates == pytest.approx(np.full(len(orders), t.fabric.nic_bandwidth_Bps * t.fabric.efficiency))
    coupled = algorithm_for("ring", request).build(request)
    assert all(x.max_rate_Bps == pytest.approx(rates[x.chunk // 16]) for x in coupled.transfers)
    previous: dict[tuple[int, int], int] = {}
    for i, x in enumerate(coupled.transfers):  # each hop follows the previous step of its connection
        assert x.after == previous.get((x.chunk // 16, x.src), -1)
        previous[(x.chunk // 16, x.src)] = i
    loose = ring_all_reduce(16, 2**26, len(orders), orders)
    (c_run,), (l_run,) = simulate([(coupled, group)]), simulate([(loose, group)])
    assert c_run.time_s == pytest.approx(simulate([(ring_fast(request), group)])[0].time_s, rel=1e-9)
    assert l_run.time_s < 0.95 * c_run.time_s
    # one step at a time per edge: a hop's bytes begin after the previous step's on that edge ended
    for run, overlapping in ((c_run, False), (l_run, True)):
        last_end: dict[tuple[int, int], float] = {}
        overlap = False
        for i, x in enumerate(coupled.transfers):
            begin = run.trace.starts[i] + group.path(x.src, x.dst).latency_s
            key = (x.chunk // 16, x.src)
            overlap |= begin < last_end.get(key, 0.0) - 1e-15
            last_end[key] = run.trace.ends[i]
        assert overlap == overlapping


def test_fast_ring_at_2048_ranks_completes():
    # the plan and the engine only (api.collective also evaluates the closed forms)
    group = Group.first(load_topology("dgx-h100", num_nodes=256), 2048)
    plan = ring_fast(Request("all_reduce", group, 2**30))
    assert plan.num_transfers == 8 * 2048 and fluid_applicable(plan)
    (run,) = simulate([(plan, group)])
    # bandwidth-bound: 2 (P-1)/P x 1 GiB / 8 channels through each channel's NIC edge, plus the chain latency
    nic = group.topology.fabric.nic_bandwidth_Bps * group.topology.fabric.efficiency
    bandwidth_s = 2 * 2047 / 2048 * 2**30 / 8 / nic
    assert bandwidth_s < run.time_s < bandwidth_s + 2 * 2047 * 5e-6
    assert run.trace.makespan_s == run.time_s and len(run.trace.ends) == plan.num_transfers


@pytest.fixture
def flow_budget(monkeypatch):
    """Set the fast all-pairs plan's flow budget (simdist.collectives.all_pairs.FAST_FLOWS), so that
    small groups take the aggregated path: one flow per (peer, block of nodes)."""
    import simdist.collectives.all_pairs as all_pairs_module
    import simdist.collectives.direct_fast as direct_fast_module

    def set_budget(flows: int) -> None:
        monkeypatch.setattr(all_pairs_module, "FAST_FLOWS", flows)
        monkeypatch.setattr(direct_fast_module, "FAST_FLOWS", flows)

    return set_budget


def _a2a_runs(group: Group, nbytes: float, op: str = "all_to_all"):
    request = Request(op, group, nbytes)
    fast, detailed = direct_fast(request), direct_plan(op, group.size, nbytes, group=group)
    return fast, detailed, simulate([(fast, group)])[0], simulate([(detailed, group)])[0]


def test_fast_all_to_all_preserves_nic_and_node_link_bytes(flow_budget):
    flow_budget(128)  # 32 peers x 3 other nodes = 96 flows fit, 992 blocks do not
    t = load_topology("dgx-h100", num_nodes=4)
    group = Group.first(t, 32)
    fast, detailed, fast_run, detailed_run = _a2a_runs(group, 2**28)
    assert fast.num_transfers == 4 * 3 * 8 + 4 * 8 * 7 and not fast.verifiable
    assert fast.bytes_sent() == pytest.approx(detailed.bytes_sent())
    assert fast.bytes_received() == pytest.approx(detailed.bytes_received())
    spine_links = t.layout.nic_links_end  # leaf <-> spine link ids start here
    for link in set(fast_run.link_bytes) | set(detailed_run.link_bytes):
        if link < spine_links:  # node links and NIC <-> leaf links
            assert fast_run.link_bytes.get(link, 0.0) == pytest.approx(detailed_run.link_bytes.get(link, 0.0))
    # leaf <-> spine links: the fast flows' bytes track the detailed plan's, within a couple of flows
    flow = 8 * 2**28 / 32
    fabric = {x for x in set(fast_run.link_bytes) | set(detailed_run.link_bytes) if x >= spine_links}
    assert all(abs(fast_run.link_bytes.get(x, 0.0) - detailed_run.link_bytes.get(x, 0.0)) <= 2 * flow for x in fabric)
    # the flows land when the detailed plan's last block does: the closed form's time
    closed = closed_form("direct")(Request("all_to_all", group, 2**28), ProtocolCost())
    assert fast_run.time_s == pytest.approx(detailed_run.time_s, rel=1e-9)
    assert detailed_run.time_s == pytest.approx(closed, rel=1e-9)


@pytest.mark.parametrize(("budget", "nodes_per_flow"), [(1920, 1), (960, 2)])
def test_fast_all_to_all_time_equals_detailed_at_16_nodes(flow_budget, budget, nodes_per_flow):
    # The busiest leaf-spine link sets the time (ECMP collisions); the flows are steered off links that
    # would outlast it, so they land with the detailed plan's last block. With a flow per 2 nodes the NIC
    # downlinks take whole flows too and keep within the same budget.
    flow_budget(budget)
    group = Group.first(load_topology("dgx-h100", num_nodes=16), 128)
    fast, _detailed, fast_run, detailed_run = _a2a_runs(group, 2**30)
    blocks = 16 // nodes_per_flow  # a flow from each peer to every block holding another node's peers
    assert fast.num_transfers == 128 * (15 if nodes_per_flow == 1 else blocks) + 16 * 8 * 7
    assert fast_run.time_s == pytest.approx(detailed_run.time_s, rel=1e-9)


def test_fast_all_pairs_ops_equal_detailed(flow_budget):
    flow_budget(128)
    t = load_topology("dgx-h100", num_nodes=4)
    group = Group.first(t, 32)
    for op in ("all_gather", "reduce_scatter", "barrier"):
        _, _, fast_run, detailed_run = _a2a_runs(group, 0.0 if op == "barrier" else 2**26, op)
        assert fast_run.time_s == pytest.approx(detailed_run.time_s, rel=1e-9), op
    # two-shot all_reduce: its second step's blocks meet first-step blocks on the NICs in the detailed
    # plan (contended by its own flows), so both plans are slower than the closed form; the fast plan's
    # flows of a step land together while the detailed blocks drift: close, not equal
    _fast, _detailed, fast_run, detailed_run = _a2a_runs(group, 2**26, "all_reduce")
    closed = closed_form("direct")(Request("all_reduce", group, 2**26), ProtocolCost())
    assert closed <= fast_run.time_s and closed <= detailed_run.time_s
    assert fast_run.time_s == pytest.approx(detailed_run.time_s, rel=0.02)


def test_fast_all_to_all_of_small_or_uneven_groups_is_one_flow_per_block():
    # 12 peers (8 + 4 per node): few blocks, so one flow per block, each landing with the last block
    t = load_topology("dgx-h100", num_nodes=2)
    group = Group.first(t, 12)
    fast, detailed, fast_run, detailed_run = _a2a_runs(group, 2**20)
    assert sorted((x.src, x.dst, x.nbytes) for x in fast.transfers) == \
        sorted((x.src, x.dst, x.nbytes) for x in detailed.transfers)
    assert fast_run.time_s == pytest.approx(detailed_run.time_s, rel=1e-9)
    assert fast_run.link_bytes == pytest.approx(detailed_run.link_bytes)
    other = Request("scatter", Group.first(t, 16), 2**20)  # a transfer per peer: the detailed plan
    assert direct_fast(other).transfers == direct_plan("scatter", 16, 2**20, group=other.group).transfers
