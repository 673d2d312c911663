"""The engine is never faster than the closed form, and equals it uncontended (docs/architecture.md).

Over random collectives (every op and every algorithm that can run it, 2-64 peers, random sizes, roots,
channels and protocols) on a few topologies (bundled presets with a few nodes, and tiny fixtures in
tests/data/topologies whose 4-port leaves make routes climb to thin spines, one of them a node given as a graph
whose GPUs are linked pairwise, one a 3-tier fat tree, one whose switches reduce (SHARP: collnet)):

- the detailed plan's engine time >= its closed form (1e-9 relative), always;
- equal (1e-9) when the run is uncontended: every transfer moved at its planned rate for its whole time
  on the wire (tests/plan_timing.py). A plan's planned rates fit every link among the transfers that may
  share it, so a collective alone is uncontended except where its own transfers of different steps or
  phases meet on a link (peers that drift apart); then its own flows contend, and the engine may be
  slower (where the meeting transfers are on the critical path);
- the fast plan, alone, takes the closed form's time whenever the detailed run is uncontended;
- two collectives at once on overlapping groups: each is no faster than its closed form alone.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from simdist.analytic.registry import closed_form
from simdist.analytic.select import priced_request
from simdist.collectives.group import Group
from simdist.collectives.nccl_model import PROTOCOLS, protocol_cost, supports
from simdist.collectives.ops import OPS, op_info
from simdist.collectives.protocols import SIMPLE, ProtocolCost
from simdist.collectives.registry import candidates
from simdist.collectives.request import Request
from simdist.engine.simulate import simulate
from simdist.errors import SimdistError
from simdist.hardware import load_topology
from tests.plan_timing import uncontended

FIXTURES = Path(__file__).resolve().parent / "data" / "topologies"
TOPOLOGIES = (
    ("dgx-h100", 1, ()),
    ("dgx-h100", 3, ()),
    ("dgx-a100", 2, ("inter_node.fabric=fat_tree", "inter_node.switch_radix=8", "inter_node.oversubscription=3")),
    ("pcie-gen4-8gpu", 2, ()),
    ("gb200-nvl72", 1, ()),
    (str(FIXTURES / "tiny-nvswitch-rails.yaml"), 5, ()),
    (str(FIXTURES / "tiny-pcie-fat-tree.yaml"), 3, ()),
    (str(FIXTURES / "tiny-graph-odd-link.yaml"), 2, ()),
    (str(FIXTURES / "tiny-three-tier.yaml"), 8, ()),
    (str(FIXTURES / "tiny-nvswitch-rails.yaml"), 4, ("inter_node.sharp=true",)),  # collnet: the switches reduce
)
MAX_TRANSFERS = 2500
"""Largest detailed plan an example runs (keeps the test to a few seconds per hundred examples)."""
CUSTOM = ProtocolCost("custom", base_latency_s=3e-6, per_transfer_latency_s=0.7e-6, rate_factor=0.5)


@cache
def topology(index: int):
    name, nodes, sets = TOPOLOGIES[index]
    return load_topology(name, num_nodes=nodes, assignments=list(sets))


@st.composite
def collectives(draw):
    """(algorithm, request priced with its protocol, protocol) of a random collective."""
    t = topology(draw(st.integers(0, len(TOPOLOGIES) - 1)))
    peers = draw(st.integers(2, min(64, t.num_gpus)))
    first = draw(st.booleans())  # the first GPUs, or any of them in any order
    ranks = tuple(range(peers)) if first else tuple(draw(st.permutations(range(t.num_gpus)))[:peers])
    group = Group(t, ranks)
    op = draw(st.sampled_from(sorted(OPS)))
    size = 0.0 if op == "barrier" else 10 ** draw(st.floats(3.0, 8.5))
    root = draw(st.integers(0, peers - 1)) if op_info(op).rooted else 0
    channels = draw(st.sampled_from([None, 1, 2, 3]))
    request = Request(op, group, size, root=root, channels=channels)
    able = [a for a in candidates(request)]
    assume(able)
    algo = draw(st.sampled_from(sorted(able, key=lambda a: a.name)))
    kind = draw(st.sampled_from(["simple", "custom", *PROTOCOLS]))
    if kind in PROTOCOLS:
        assume(supports(algo.name, kind))
        priced = protocol_cost(algo.name, kind, group)
        request, proto = priced_request(request, priced), priced.cost
    else:
        proto = SIMPLE if kind == "simple" else CUSTOM
        request = dataclasses.replace(request, protocol=proto)
    if algo.detailed_size is not None:
        assume(algo.detailed_size(request) <= MAX_TRANSFERS)
    else:
        assume(peers * peers <= MAX_TRANSFERS)
    return algo, request, proto


def _run(build, request: Request, proto: ProtocolCost):
    plan = dataclasses.replace(build(request), base_latency_s=proto.base_latency_s,
                               per_transfer_latency_s=proto.per_transfer_latency_s, rate_factor=proto.rate_factor)
    return plan, simulate([(plan, request.group)])[0]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(collectives())
def test_engine_never_faster_than_closed_form_and_equal_uncontended(case):
    algo, request, proto = case
    plan, run = _run(algo.build, request, proto)
    closed = closed_form(algo.name)(request, proto)
    assert run.time_s >= closed * (1 - 1e-9)
    alone = uncontended(plan, request.group, run)
    event(f"{algo.name}: {'uncontended' if alone else 'contended by its own flows'}")
    if alone:
        assert run.time_s == pytest.approx(closed, rel=1e-9)
        if algo.build_fast is not None:  # the fast plan, alone, takes the same time
            assert _run(algo.build_fast, request, proto)[1].time_s == pytest.approx(closed, rel=1e-9)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(collectives(), st.data())
def test_collectives_sharing_links_are_no_faster_than_alone(case, data):
    algo, request, proto = case
    group = request.group
    # a second collective on a shifted group of the same cluster: it shares NICs, ports or spines
    shift = data.draw(st.integers(0, group.topology.num_gpus - 1))
    ranks = tuple((r + shift) % group.topology.num_gpus for r in group.ranks)
    other = dataclasses.replace(request, group=Group(group.topology, ranks).priced(group.extra_latency_by_class))
    try:
        if algo.check is not None:
            algo.check(other)  # the shifted group may not suit the algorithm (nodes, NVSwitch)
    except SimdistError:
        assume(False)
    plans = []
    for req in (request, other):
        plan = dataclasses.replace(algo.build(req), base_latency_s=proto.base_latency_s,
                                   per_transfer_latency_s=proto.per_transfer_latency_s, rate_factor=proto.rate_factor)
        plans.append((plan, req.group))
    runs = simulate(plans)
    for req, run in zip((request, other), runs, strict=True):
        assert run.time_s >= closed_form(algo.name)(req, proto) * (1 - 1e-9)


@pytest.mark.parametrize("index", [0, 4, 5])
def test_every_op_and_algorithm_is_uncontended_on_nvswitch_peers(index):
    # Ports are the only links peers of one NVSwitch share, and every plan's rates fit them: alone,
    # every algorithm runs exactly its closed form (the hypothesis test must see uncontended cases).
    t = topology(index)
    group = Group.first(t, min(8, t.gpus_per_node))
    for op in sorted(OPS):
        for algo in candidates(Request(op, group, 1e6)):
            req = Request(op, group, 0.0 if op == "barrier" else 3e6, root=1 if op_info(op).rooted else 0)
            plan, run = _run(algo.build, req, SIMPLE)
            assert uncontended(plan, group, run), (algo.name, op)
            assert run.time_s == pytest.approx(closed_form(algo.name)(req, SIMPLE), rel=1e-9), (algo.name, op)


@pytest.mark.parametrize("index", [1, 2, 3, 5, 6, 8, 9])
@pytest.mark.parametrize("protocol", ["simple", "Simple"])
def test_pat_collnet_and_nvls_multi_node_are_no_faster_than_their_closed_forms(index, protocol):
    # The random collectives above rarely draw one GPU per node (PAT), the fabric that reduces (collnet) or whole
    # NVLS nodes (nvls_tree; nvls_sharp, whose switches reduce too): every fabric here, one rank per node for PAT (in
    # node order and shuffled), whole nodes for collnet, nvls_tree and nvls_sharp.
    t = topology(index)
    gpn, nodes = t.gpus_per_node, t.num_nodes
    one_per_node = [tuple(n * gpn for n in range(nodes)), tuple(n * gpn + n % gpn for n in reversed(range(nodes)))]
    cases = [(Request(op, Group(t, ranks), 3e6), "pat") for ranks in one_per_node
             for op in ("all_gather", "reduce_scatter")]
    cases += [(Request("all_reduce", Group.first(t, min(t.num_gpus, 2 * gpn)), size), "collnet")
              for size in (0.0, 1e5, 3e6)]
    cases += [(Request("all_reduce", Group.first(t, min(t.num_gpus, n * gpn)), size), name)
              for name in ("nvls_tree", "nvls_sharp") for n in (2, 3) for size in (0.0, 3e6)]
    # NVLS nodes (dgx-h100, tiny-nvswitch-rails), with switches that reduce for nvls_sharp
    ran = 0
    for request, name in cases:
        if name not in {a.name for a in candidates(request)}:
            continue
        algo = next(a for a in candidates(request) if a.name == name)
        if protocol == "simple":
            proto = SIMPLE
        else:
            priced = protocol_cost(name, protocol, request.group)
            request, proto = priced_request(request, priced), priced.cost
        plan, run = _run(algo.build, request, proto)
        closed = closed_form(name)(request, proto)
        assert run.time_s >= closed * (1 - 1e-9), (name, index)
        if uncontended(plan, request.group, run):
            assert run.time_s == pytest.approx(closed, rel=1e-9), (name, index)
            assert _run(algo.build_fast, request, proto)[1].time_s == pytest.approx(closed, rel=1e-9)
        ran += 1
    assert ran >= 2 or index != 9
