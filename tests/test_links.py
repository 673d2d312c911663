"""The engine's one link-sharing mechanism (simdist.engine.links, simdist.engine.sharing): links shared max-min
fairly in bandwidth per flow, by collectives (run_plan) and by a step's collectives (run_graph) alike.

Stories with finish times computed by hand, then properties: the solver's allocation is feasible and max-min
fair (and equals a textbook progressive filling, tests/sharing_oracle.py), and the fluid fast path
(simdist.engine.fluid) finishes every flow when the SimPy resource does.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.collectives.group import Group
from simdist.collectives.plan import SWITCH, Plan, Transfer
from simdist.engine.executor import Trace, run_plan
from simdist.engine.fluid import fluid_applicable, run_fluid
from simdist.engine.graph import run_graph
from simdist.engine.links import SharedLinks
from simdist.engine.sharing import job_flows, max_min_rates, max_min_rates_small
from simdist.hardware import load_topology
from simdist.hardware.link import Route
from simdist.plan.opgraph import Comm, Job, Op, OpGraph
from simdist.predict.price import price_graph
from tests.sharing_oracle import progressive_filling

GB, MB = 1e9, 1e6
LINK_Bps = 100 * GB


def finish_times(transfers: list[tuple[float, tuple[int, ...], float, float, tuple[float, ...] | None]],
                 capacity: dict[int, float]) -> list[float]:
    """End times of (start, links, size, cap, weights) transfers on SharedLinks of ``capacity``."""
    env = simpy.Environment()
    net = SharedLinks(env, capacity.__getitem__)
    ends = [math.nan] * len(transfers)

    def one(i, start, links, size, cap, weights):
        yield env.timeout(start)
        yield net.transfer(links, size, cap, weights)
        ends[i] = env.now

    for i, t in enumerate(transfers):
        env.process(one(i, *t))
    env.run()
    return ends


# ----------------------------------------------------------------------------- stories by hand
def test_small_flow_next_to_a_large_one_gets_half_the_link():
    # A plan of two transfers from peer 0 to peer 1 over one 100 GB/s link of 2 us latency: 10 MB and 4 GB.
    # Both pay the latency, then share the link per flow: 50 GB/s each, so the 10 MB flow ends at
    # 2 us + 10e6 / 50e9 = 2 us + 0.2 ms. The 4 GB flow has then moved 10 MB; its 3.99 GB left take 39.9 ms at
    # the full 100 GB/s: it ends at 2 us + 0.2 + 39.9 = 2 us + 40.1 ms. (Fair in progress, the old rule, the
    # 10 MB flow got 10/4010 of the link and ended at 2 us + 40.1 ms too.)
    route = Route(0, 1, (0,), LINK_Bps, LINK_Bps, 2e-6)
    plan = Plan(op="send_recv", algorithm="test", num_peers=2, nbytes=1.0, num_chunks=0, verifiable=False,
                transfers=(Transfer(0, 1, 10 * MB, -1), Transfer(0, 1, 4 * GB, -1)))
    env = simpy.Environment()
    trace = Trace()
    env.process(run_plan(env, SharedLinks(env, {0: LINK_Bps}.__getitem__), plan, lambda src, dst: route, trace))
    env.run()
    assert trace.ends == pytest.approx([2e-6 + 0.2e-3, 2e-6 + 40.1e-3], rel=1e-12)
    # the resource alone, without latency: the same split
    small, large = finish_times([(0.0, (0,), 10 * MB, math.inf, None), (0.0, (0,), 4 * GB, math.inf, None)],
                                {0: LINK_Bps})
    assert (small, large) == pytest.approx((0.2e-3, 40.1e-3), rel=1e-12)


def test_eight_channels_against_two_split_the_link_80_20():
    # Rates: one link of 100 GB/s, a transfer with 8 flows on it and one with 2: 10 shares of 10 GB/s.
    rates = max_min_rates(np.array([0, 0]), np.array([1, 1]), np.array([LINK_Bps]), weights=np.array([8.0, 2.0]))
    assert (rates * [8, 2]).tolist() == pytest.approx([80 * GB, 20 * GB], rel=1e-12)
    # Jobs of a step: A drives 8 channels of 1 GB each over the link (8 GB; alone 80 ms), B 2 channels of
    # 0.5 GB (1 GB; alone 10 ms). Together A gets 80 GB/s and B 20 GB/s: B ends at 1 GB / 20 GB/s = 50 ms,
    # when A has moved 4 GB; A's other 4 GB take 40 ms at its alone speed of 100 GB/s: it ends at 90 ms.
    # (Fair in progress, both would have ended together at 9 GB / 100 GB/s = 90 ms.)
    g = OpGraph()
    a = g.add(Op("eight", 0, "dp", "comm", job=Job(0.0, 0.08, ((0, 8 * GB, 8),))))
    b = g.add(Op("two", 1, "dp", "comm", job=Job(0.0, 0.01, ((0, 1 * GB, 2),))))
    trace = run_graph(g, capacity_of={0: LINK_Bps}.__getitem__)
    assert trace.end_s[b] == pytest.approx(0.050, rel=1e-12)
    assert trace.end_s[a] == pytest.approx(0.090, rel=1e-12)


def test_step_send_next_to_a_large_transfer_takes_twice_its_alone_time():
    # A step's 10 MB pipeline send and a 4 GB transfer leave GPU 0 of one DGX H100 for GPU 8 of the other at
    # the same instant (two tracks), through the same NIC: both are priced (direct send_recv, one flow each),
    # with the same latency, so their bytes join the link together and each gets half of it.
    topology = load_topology("dgx-h100", num_nodes=2)

    def graph(sizes: list[float]) -> OpGraph:
        g = OpGraph()
        for stream, nbytes in zip(("pp", "dp"), sizes, strict=False):
            g.add(Op(f"send {nbytes:g}", 0, stream, "comm", comm=Comm("send_recv", (0, 8), nbytes, stream)))
        price_graph(g, topology)
        return g

    def run(g: OpGraph):
        return run_graph(g, capacity_of=lambda link: topology.link(link).effective_bandwidth_Bps)

    alone = graph([10 * MB])
    job = alone.ops[0].job
    assert job is not None and all(flows == 1 for _, _, flows in job.demand)
    assert run(alone).end_s[0] == pytest.approx(job.latency_s + job.bandwidth_s, rel=1e-12)
    shared = graph([10 * MB, 4 * GB])
    send_s = run(shared).end_s[0]  # simulated seconds
    assert send_s == pytest.approx(job.latency_s + 2 * job.bandwidth_s, rel=1e-9)
    assert 1.8 < send_s / (job.latency_s + job.bandwidth_s) < 2.0  # about twice: the latency is not shared


def test_job_flows_weights_are_flows_where_they_carry_equal_bytes():
    # A ring's flows carry equal bytes: weights = flows. A flow carrying half as much moves at half the
    # rate (coupled), so it counts half.
    for nbytes, flows, size, weights in (([8.0, 2.0], [4, 1], 2.0, [4.0, 1.0]), ([8.0, 1.0], [4, 1], 2.0, [4.0, 0.5]),
                                         ([0.0, 3.0], [2, 1], 3.0, [0.0, 1.0]), ([0.0], [2], 0.0, [0.0])):
        got_size, got_weights = job_flows(np.array(nbytes), np.array(flows))
        assert (got_size, got_weights.tolist()) == (size, weights)


def test_capped_flows_leave_the_rest_to_the_others():
    # Link 0 (capacity 10) carries A (weight 4) and B (weight 1); B also crosses link 1 (capacity 1) and is
    # held there at 1: A gets (10 - 1) / 4 per flow. A cap below the fair share frees capacity the same way.
    rates = max_min_rates(np.array([0, 0, 1]), np.array([1, 2]), np.array([10.0, 1.0]),
                          weights=np.array([4.0, 1.0, 1.0]))
    assert rates.tolist() == pytest.approx([9 / 4, 1.0], rel=1e-15)
    rates = max_min_rates(np.array([0, 0]), np.array([1, 1]), np.array([8.0]), np.array([1.0, 10.0]))
    assert rates.tolist() == [1.0, 7.0]
    # no link: the cap (inf for none); weight 0: neither uses nor bounds the link
    rates = max_min_rates(np.array([0, 0]), np.array([0, 1, 1]), np.array([1.0]), np.array([3.0, 5.0, 5.0]),
                          weights=np.array([0.0, 1.0]))
    assert rates.tolist() == [3.0, 5.0, 1.0]


# ----------------------------------------------------------------------------- the solver's properties
@st.composite
def sharing_problems(draw):
    num_links = draw(st.integers(1, 8))
    n = draw(st.integers(1, 12))
    capacity = draw(st.lists(st.sampled_from([1.0, 2.5, 10.0, 100e9]) | st.floats(0.1, 50.0),
                             min_size=num_links, max_size=num_links))
    links, weights = [], []
    for _ in range(n):
        mine = draw(st.lists(st.integers(0, num_links - 1), unique=True, max_size=min(num_links, 4)))
        links.append(mine)
        weights.append([draw(st.sampled_from([1.0, 2.0, 8.0, 0.0]) | st.floats(0.01, 10.0)) for _ in mine])
    caps = draw(st.lists(st.sampled_from([math.inf, math.inf, 0.7]) | st.floats(0.05, 20.0), min_size=n, max_size=n))
    return links, weights, capacity, caps


@settings(max_examples=300, deadline=None)
@given(sharing_problems())
def test_solver_is_feasible_max_min_fair_and_equals_progressive_filling(problem):
    links, weights, capacity, caps = problem
    entries = np.array([x for mine in links for x in mine], dtype=np.int64)
    w = np.array([x for mine in weights for x in mine], dtype=float)
    rates = max_min_rates(entries, np.array([len(m) for m in links]), np.array(capacity), np.array(caps), w)
    # feasible: no link over capacity, no transfer over its cap
    load = np.zeros(len(capacity))
    for mine, ws, r in zip(links, weights, rates, strict=True):
        for link, x in zip(mine, ws, strict=True):
            if x > 0:  # weight 0 uses nothing (a transfer crossing no weighted link moves at its cap, maybe inf)
                load[link] += x * r
    assert (load <= np.array(capacity) * (1 + 1e-9)).all()
    assert (rates <= np.array(caps) * (1 + 1e-12)).all()
    # max-min fair (Bertsekas & Gallager sec. 6.5.2, bottleneck characterisation): every transfer is at its
    # cap or crosses a saturated link where no transfer goes faster per flow than it. Hence Pareto efficient:
    # none can go faster without slowing another that is no faster.
    for t, (mine, ws, r) in enumerate(zip(links, weights, rates, strict=True)):
        if r >= caps[t] * (1 - 1e-9):
            continue
        assert any(load[x] >= capacity[x] * (1 - 1e-9)
                   and all(r >= rates[u] * (1 - 1e-9) for u in range(len(links))
                           if any(y == x and v > 0 for y, v in zip(links[u], weights[u], strict=True)))
                   for x, wx in zip(mine, ws, strict=True) if wx > 0), t
    assert rates.tolist() == pytest.approx(progressive_filling(links, weights, capacity, caps), rel=1e-9)


@settings(max_examples=400, deadline=None)
@given(sharing_problems(), st.booleans())
def test_small_solver_gives_the_solvers_rates_bit_for_bit(problem, unweighted):
    # The plain-Python solver SharedLinks re-shares few transfers with is the same algorithm, not an
    # approximation: identical rates (==, not approx), weighted or not, on links given by id (sparse ids here).
    links, weights, capacity, caps = problem
    if unweighted:
        weights = [[1.0] * len(mine) for mine in links]
    entries = np.array([x for mine in links for x in mine], dtype=np.int64)
    w = np.array([x for mine in weights for x in mine], dtype=float)
    rates = max_min_rates(entries, np.array([len(m) for m in links]), np.array(capacity), np.array(caps),
                          None if unweighted else w)
    ids = {x: 1000 + 7 * x for x in range(len(capacity))}
    small = max_min_rates_small([tuple(ids[x] for x in mine) for mine in links],
                                [None if unweighted else tuple(ws) for ws in weights], list(caps),
                                {ids[x]: c for x, c in enumerate(capacity)})
    assert small == rates.tolist()


# ----------------------------------------------------------------------------- fluid == SimPy
@cache
def _topology(preset: str, nodes: int):
    return load_topology(preset, num_nodes=nodes, assignments=["inter_node.oversubscription=2"] if nodes > 2 else [])


def simpy_run(plan: Plan, group: Group) -> tuple[float, dict[int, float], Trace]:
    """The SimPy engine on ``plan`` alone (never the fluid shortcut `simulate` takes)."""
    topology = group.topology
    env = simpy.Environment()
    net = SharedLinks(env, lambda link: topology.link(link).effective_bandwidth_Bps)
    trace = Trace()
    proc = env.process(run_plan(env, net, plan, group.path, trace))
    env.run(until=proc)
    return proc.value, dict(net.load.bytes_by_link), trace


@st.composite
def dependency_free_plans(draw):
    preset, nodes, peers = draw(st.sampled_from([("dgx-h100", 2, 16), ("dgx-h100", 3, 12), ("pcie-gen4-8gpu", 1, 8),
                                                 ("dgx-a100", 4, 20)]))
    topology = _topology(preset, nodes)
    ranks = draw(st.lists(st.integers(0, topology.num_gpus - 1), unique=True, min_size=peers, max_size=peers))
    group = Group(topology, tuple(ranks))
    if draw(st.booleans()):
        group = group.priced({"nvlink": 0.6e-6, "pcie": 1e-6, "net": 3e-6})
    transfers = []
    for _ in range(draw(st.integers(1, 40))):
        src = draw(st.integers(0, peers - 1))
        switch = topology.spec.scale_up is not None and draw(st.integers(0, 6)) == 0
        dst = SWITCH if switch else draw(st.integers(0, peers - 1).filter(lambda d, s=src: d != s))
        nbytes = draw(st.sampled_from([0.0, 4096.0, 1e6, 2.5e7]) | st.floats(1e5, 5e7))
        extra = draw(st.sampled_from([0.0, 0.0, 1e-6]) | st.floats(0.0, 2e-5))
        transfers.append(Transfer(src, dst, nbytes, -1, extra_latency_s=extra))
    plan = Plan(op="all_to_all", algorithm="test", num_peers=peers, nbytes=1.0, transfers=tuple(transfers),
                num_chunks=0, verifiable=False, per_transfer_latency_s=draw(st.sampled_from([0.0, 2e-6])),
                base_latency_s=draw(st.sampled_from([0.0, 5e-6])), rate_factor=draw(st.sampled_from([1.0, 0.92, 0.5])))
    return plan, group


@settings(max_examples=40, deadline=None)
@given(dependency_free_plans())
def test_fluid_fast_path_equals_the_simpy_resource(case):
    plan, group = case
    assert fluid_applicable(plan)
    time_s, link_bytes, trace = simpy_run(plan, group)
    f_time, f_bytes, f_trace = run_fluid(plan, group)
    assert f_time == pytest.approx(time_s, rel=1e-9)
    assert f_trace.ends == pytest.approx(trace.ends, rel=1e-9)
    assert f_trace.starts == trace.starts
    assert list(f_bytes) == list(link_bytes) and f_bytes == link_bytes  # same sums, same order


# ----------------------------------------------------------------------------- joins at a finish, repeated groups
def chained_finish_times(transfers: list[tuple[int, float, tuple[int, ...], float, float, tuple[float, ...] | None]],
                         capacity: dict[int, float]) -> list[float]:
    """End times of (after, start, links, size, cap, weights) transfers on SharedLinks: each starts ``start`` after
    transfer ``after`` ends (after < its own index; -1: after time 0)."""
    env = simpy.Environment()
    net = SharedLinks(env, capacity.__getitem__)
    ends = [math.nan] * len(transfers)
    done = [env.event() for _ in transfers]

    def one(i, after, start, links, size, cap, weights):
        if after >= 0:
            yield done[after]
        if start > 0:
            yield env.timeout(start)
        yield net.transfer(links, size, cap, weights)
        ends[i] = env.now
        done[i].succeed()

    for i, t in enumerate(transfers):
        env.process(one(i, *t))
    env.run()
    return ends


def oracle_finish_times(transfers, capacity: dict[int, float]) -> list[float]:
    """The same from first principles: at every event, every active transfer's rate by progressive filling
    (tests/sharing_oracle.py) over all of them, bytes moved at those rates until the next start or finish."""
    ids = sorted(capacity)
    index = {link: k for k, link in enumerate(ids)}
    n = len(transfers)
    begin = [math.nan] * n
    ends = [math.nan] * n
    left = [t[3] for t in transfers]
    for i, (after, start, *_rest) in enumerate(transfers):
        if after < 0:
            begin[i] = start
    now = 0.0
    while any(math.isnan(e) for e in ends):
        active = [i for i in range(n) if begin[i] <= now and math.isnan(ends[i])]
        for i in active:
            if transfers[i][3] <= 0:
                ends[i] = now
        active = [i for i in active if math.isnan(ends[i])]
        rates = progressive_filling([[index[x] for x in transfers[i][2]] for i in active],
                                    [list(transfers[i][5] or [1.0] * len(transfers[i][2])) for i in active],
                                    [capacity[x] for x in ids], [transfers[i][4] for i in active])
        upcoming = [b for i, b in enumerate(begin) if b > now and math.isnan(ends[i])]
        step = min([*upcoming, *(now + left[i] / r for i, r in zip(active, rates, strict=True) if r > 0)])
        for i, r in zip(active, rates, strict=True):
            left[i] -= r * (step - now)
            if left[i] <= 1e-9 * transfers[i][3]:
                ends[i] = step
                for j, t in enumerate(transfers):
                    if t[0] == i:
                        begin[j] = step + t[1]
        now = step
    return ends


def test_a_transfer_joining_as_another_finishes_shares_from_that_instant():
    # 100 GB/s: A (10 GB) and B (20 GB) share it at 50 GB/s; A ends at 0.2 s and C (10 GB) starts at that very
    # instant: B (10 GB left) and C share 50/50 and both end at 0.4 s.
    cap = {0: LINK_Bps}
    ends = chained_finish_times([(-1, 0.0, (0,), 10 * GB, math.inf, None), (-1, 0.0, (0,), 20 * GB, math.inf, None),
                                 (0, 0.0, (0,), 10 * GB, math.inf, None)], cap)
    assert ends == pytest.approx([0.2, 0.4, 0.4], rel=1e-12)


def test_a_repeated_group_is_re_shared_from_memory_with_the_same_rates(monkeypatch):
    # The same two-transfer group (weights 1 and 3 on a 100 GB/s link: 25 and 75 GB/s of link, i.e. each at
    # 25 GB/s per flow) three times in a row, each copy after the last: every copy lasts 0.4 s (10 GB per flow),
    # and the solver runs once for the group, the two later copies are looked up.
    import simdist.engine.links as links_module

    calls = []
    real = links_module.max_min_rates_small
    monkeypatch.setattr(links_module, "max_min_rates_small", lambda *a: calls.append(a) or real(*a))
    cap = {0: LINK_Bps}
    pattern = []
    for k in range(3):
        prev = 2 * k - 1
        pattern += [(prev, 0.0, (0,), 10 * GB, math.inf, None), (prev, 0.0, (0,), 10 * GB, math.inf, (3.0,))]
    ends = chained_finish_times(pattern, cap)
    assert ends == pytest.approx([0.4, 0.4, 0.8, 0.8, 1.2, 1.2], rel=1e-12)
    assert len(calls) == 1


def _links(draw, *, spacing: int, first: int) -> tuple[int, dict[int, float], list[int]]:
    """1-4 links (ids ``first``, ``first + spacing``, ...: not consecutive) of drawn capacities (bytes/s)."""
    num_links = draw(st.integers(1, 4))
    capacity = {spacing * k + first: draw(st.sampled_from([1.0, 2.0, 5.0]) | st.floats(0.5, 10.0))
                for k in range(num_links)}
    return num_links, capacity, sorted(capacity)


@st.composite
def chained_transfers(draw):
    num_links, capacity, ids = _links(draw, spacing=10, first=1)
    out = []
    for i in range(draw(st.integers(1, 10))):
        after = draw(st.integers(-1, i - 1))
        start = draw(st.sampled_from([0.0, 0.0, 0.5]) | st.floats(0.0, 3.0))
        links = tuple(draw(st.lists(st.sampled_from(ids), unique=True, min_size=1, max_size=num_links)))
        weights = draw(st.none() | st.just(tuple(draw(st.sampled_from([1.0, 2.0, 0.5])) for _ in links)))
        size = draw(st.sampled_from([1.0, 2.0, 4.0]) | st.floats(0.1, 8.0))
        cap = draw(st.sampled_from([math.inf, math.inf, 1.5]))
        out.append((after, start, links, size, cap, weights))
    return out, capacity


@settings(max_examples=200, deadline=None)
@given(chained_transfers())
def test_shared_links_finish_when_first_principles_say(case):
    # joins at other transfers' finishes (the same instant), groups that recur (re-shares from memory), caps and
    # weights: every end time as the oracle recomputing every rate at every event finds it
    transfers, capacity = case
    assert chained_finish_times(transfers, capacity) == pytest.approx(oracle_finish_times(transfers, capacity),
                                                                      rel=1e-9, abs=1e-12)


# ----------------------------------------------------------------------------- lazy progress against eager
def eager_reference(transfers: list[tuple[float, tuple[int, ...], float, float, tuple[float, ...] | None]],
                    capacity: dict[int, float], probes: list[float]) -> tuple[list[float], list[dict[int, float]]]:
    """End times of (start, links, size, cap, weights) transfers, and the bytes left of those under way at each
    probe time, the straightforward way: at every event (a start or a finish) every transfer under way is
    re-rated by `max_min_rates` over all of them and every one advanced to the next event, the earliest start
    or projected finish. A transfer finishes at its projected finish, or with a residue of bytes left below
    1e-12 of its size."""
    ids = sorted(capacity)
    index = {link: k for k, link in enumerate(ids)}
    table = np.array([capacity[x] for x in ids])
    n = len(transfers)
    ends = [math.nan] * n
    left = [t[2] for t in transfers]
    seen: list[dict[int, float]] = [{} for _ in probes]
    now = 0.0
    while any(math.isnan(e) for e in ends):
        active = [i for i in range(n) if transfers[i][0] <= now and math.isnan(ends[i])]
        rates = []
        if active:
            entries = np.array([index[x] for i in active for x in transfers[i][1]])
            lengths = np.array([len(transfers[i][1]) for i in active])
            weights = np.array([w for i in active for w in (transfers[i][4] or [1.0] * len(transfers[i][1]))])
            rates = max_min_rates(entries, lengths, table, np.array([transfers[i][3] for i in active]),
                                  weights).tolist()
        finish = [now + left[i] / r if r > 0 else math.inf for i, r in zip(active, rates, strict=True)]
        step = min([t[0] for t in transfers if t[0] > now] + finish)
        for k, p in enumerate(probes):
            if now <= p < step:
                seen[k] = {i: left[i] - r * (p - now) for i, r in zip(active, rates, strict=True)}
        for i, r, f in zip(active, rates, finish, strict=True):
            left[i] -= r * (step - now)
            if f <= step or left[i] <= 1e-12 * transfers[i][2]:
                ends[i] = step
        now = step
    return ends, seen


@st.composite
def random_transfers(draw):
    num_links, capacity, ids = _links(draw, spacing=3, first=2)
    out = []
    for _ in range(draw(st.integers(1, 12))):
        start = draw(st.sampled_from([0.0, 0.0, 1.0, 2.5]) | st.floats(0.0, 4.0))
        links = tuple(draw(st.lists(st.sampled_from(ids), unique=True, min_size=1, max_size=num_links)))
        weights = draw(st.none() | st.just(tuple(draw(st.sampled_from([1.0, 2.0, 0.5, 3.0])) for _ in links)))
        size = draw(st.sampled_from([1.0, 2.0, 4.0]) | st.floats(0.05, 8.0))
        cap = draw(st.sampled_from([math.inf, math.inf, 1.5, 0.7]))
        out.append((start, links, size, cap, weights))
    probes = draw(st.lists(st.floats(0.0, 12.0), max_size=4))
    return out, capacity, probes


@settings(max_examples=300, deadline=None)
@given(random_transfers())
def test_lazy_progress_finishes_and_reports_bytes_left_as_an_eager_recomputation(case):
    # Random transfers (a few links, caps, weights, starts at the same and at other instants): SharedLinks, which
    # touches a transfer only when its rate changes and takes the next finish from a heap, ends every one when
    # re-rating and advancing every transfer at every event does (within rounding), and ``in_flight`` reports
    # each transfer under way at a probe time with the bytes it has left then.
    transfers, capacity, probes = case
    env = simpy.Environment()
    net = SharedLinks(env, capacity.__getitem__)
    ends = [math.nan] * len(transfers)
    owner: dict[int, int] = {}
    seen: list[dict[int, float]] = [{} for _ in probes]

    def one(i, start, links, size, cap, weights):
        yield env.timeout(start)
        done = net.transfer(links, size, cap, weights)
        owner[id(done)] = i
        yield done
        ends[i] = env.now

    def probe(k, at):
        yield env.timeout(at)
        seen[k] = {owner[id(ev)]: left for ev, left in net.in_flight()}

    for i, t in enumerate(transfers):
        env.process(one(i, *t))
    for k, at in enumerate(probes):
        env.process(probe(k, at))
    env.run()
    want_ends, want_seen = eager_reference(transfers, capacity, probes)
    assert ends == pytest.approx(want_ends, rel=1e-12, abs=1e-15)
    for at, got, want in zip(probes, seen, want_seen, strict=True):
        if any(abs(at - e) <= 1e-9 * max(e, 1.0) for e in [*want_ends, *(t[0] for t in transfers)]):
            continue  # at an event: which side of it the probe runs is an order of events at one instant
        assert got.keys() == want.keys()
        for i, left in got.items():
            assert left == pytest.approx(want[i], rel=1e-9, abs=1e-12 * transfers[i][2])


def _by_callbacks(transfers, capacity, caller_settles: bool, routed: bool = False) -> tuple[list[float], int]:
    """End times of (start, links, size, cap, weights) transfers started by timeout callbacks (as run_graph starts
    them), each of which on ending starts a follow-up of half its size on the same links (a join inside the network's
    own callback); and the number of SimPy events processed. ``routed``: each transfer and its follow-up started by
    `SharedLinks.start` over one route (as run_graph does), not by `SharedLinks.transfer`."""
    env = simpy.Environment()
    net = SharedLinks(env, capacity.__getitem__, caller_settles=caller_settles)
    ends = [math.nan] * (2 * len(transfers))
    routes = {}

    def start(i, links, size, cap, weights, follow):
        def then():
            ends[i] = env.now
            if follow:
                start(i + len(transfers), links, size / 2, cap, weights, False)
        if routed:
            key = i % len(transfers)
            if key not in routes:
                routes[key] = net.route(links, cap, weights)
            net.start(routes[key], size, then)
        else:
            net.transfer(links, size, cap, weights, then=then)

    def at_start(i):
        def callback(_ev):
            _, links, size, cap, weights = transfers[i]
            start(i, links, size, cap, weights, True)
            if caller_settles:
                net.settle()
        return callback

    for i, t in enumerate(transfers):
        env.timeout(t[0]).callbacks.append(at_start(i))
    events = 0
    while env.peek() < math.inf:
        env.step()
        events += 1
    return ends, events


def test_a_join_settled_by_its_caller_needs_no_wake_up_event():
    # 1 GB at 0 s and at 0.5 s on one 1 GB/s link, each then sending 0.5 GB more. The second's join, and the first
    # follow-up's (inside the network's own callback), have nothing else queued at their instant, so each re-shares
    # at its callback's end: no wake-up event, the same times. By hand: the first alone to 0.5 s (0.5 GB left), then
    # both at 0.5 GB/s: the first ends at 1.5 s; its follow-up and the second (0.5 GB left each) share to 2.5 s; the
    # second's follow-up alone at 1 GB/s: 3 s.
    transfers = [(0.0, (0,), 1.0, math.inf, None), (0.5, (0,), 1.0, math.inf, None)]
    plain, plain_events = _by_callbacks(transfers, {0: 1.0}, False)
    settled, settled_events = _by_callbacks(transfers, {0: 1.0}, True)
    assert settled == plain == pytest.approx([1.5, 2.5, 2.5, 3.0], rel=1e-12)
    assert settled_events == plain_events - 2


@settings(max_examples=300, deadline=None)
@given(random_transfers())
def test_a_caller_settling_its_joins_gives_the_same_times_bit_for_bit(case):
    # Random transfers (joins at the same and at other instants, follow-ups started as others end): settling joins
    # at the end of the callback (run_graph's mode) changes no time, not even by rounding.
    transfers, capacity, _ = case
    plain, plain_events = _by_callbacks(transfers, capacity, False)
    settled, settled_events = _by_callbacks(transfers, capacity, True)
    assert settled == plain
    assert settled_events <= plain_events


@settings(max_examples=200, deadline=None)
@given(random_transfers())
def test_transfers_started_over_a_route_finish_as_plain_ones_bit_for_bit(case):
    # Random transfers and their follow-ups (a follow-up reuses its transfer's route), started by `SharedLinks.start`
    # over routes built once, end at the very times `SharedLinks.transfer` gives them, with the same events.
    transfers, capacity, _ = case
    plain, plain_events = _by_callbacks(transfers, capacity, True)
    routed, routed_events = _by_callbacks(transfers, capacity, True, routed=True)
    assert routed == plain
    assert routed_events == plain_events
    assert all(not math.isnan(e) for e in routed)
