"""The flows a priced collective drives across each link (simdist.predict.link_loads), which weigh its share of a
link in the engine (simdist.engine.links): the most of its plan's transfers on the link in one dependency level,
for the group and for its translates together."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from simdist.collectives.group import Group
from simdist.collectives.plan import Transfer
from simdist.collectives.request import Request
from simdist.collectives.ring import pipeline_pieces, ring_fast
from simdist.hardware import load_topology
from simdist.plan.mesh import Mesh
from simdist.plan.opgraph import Comm
from simdist.predict import link_loads
from simdist.predict.price import job_of, price_comm


def test_levels_follow_dependencies_and_connection_order():
    transfers = [Transfer(0, 1, 1.0, 0), Transfer(1, 2, 1.0, 0, deps=(0,)), Transfer(2, 3, 1.0, 0, deps=(1,)),
                 Transfer(3, 0, 1.0, 0, deps=(0,)), Transfer(0, 1, 1.0, 0, after=2)]
    assert link_loads._levels(transfers).tolist() == [0, 1, 2, 1, 3]
    assert link_loads._levels([transfers[0], Transfer(2, 3, 1.0, 0)]) is None  # nothing waits: all level 0


def test_a_pipelined_chain_is_one_flow_per_link():
    # broadcast streams its pieces down the chain 0 -> 1 -> 2 -> 3: each edge carries 32 pieces, one after the
    # other, so one flow (its successive levels); the bytes are all 32 pieces'.
    t = load_topology("dgx-a100")
    nbytes = 2**24
    priced = price_comm(t, Comm("broadcast", (0, 1, 2, 3), nbytes, "dp"))
    assert priced.algorithm == "ring" and pipeline_pieces(nbytes) == 32
    assert set(priced.link_flows.values()) == {1} and len(priced.link_flows) == 6  # 3 edges x (up, down) ports


def test_fast_ring_flows_are_its_transfers_on_each_link():
    # The fast ring: one transfer per channel and ring edge, none waiting: each is a flow on its route. (4 nodes:
    # on 2 NCCL's tuner takes NVLS-Tree for 1 GiB, as simdist's auto does; on 4 the ring)
    t = load_topology("dgx-h100", num_nodes=4)
    group = Group(t, tuple(range(32)))
    priced = price_comm(t, Comm("all_reduce", group.ranks, 2**30, "dp"))
    assert priced.algorithm == "ring"
    plan = ring_fast(Request("all_reduce", group, 2**30))
    want = Counter(link for x in plan.transfers for link in group.path(x.src, x.dst).links)
    assert priced.link_flows == dict(want) and priced.class_flows == priced.link_flows
    assert max(want.values()) > 1  # channels meet on NVLink ports
    assert list(priced.link_flows) == list(priced.link_bytes)


def test_translates_add_their_flows_on_shared_nics():
    # pcie-gen4-8gpu: two GPUs per NIC, so the data-parallel rings of tp peers 0 and 1 cross every NIC link
    # together: the class drives twice the group's flows (and bytes) there.
    t = load_topology("pcie-gen4-8gpu", num_nodes=8)
    mesh = Mesh(tp=2, pp=4, dp=8)
    group = mesh.group("dp", 0)
    priced = price_comm(t, Comm("all_reduce", group, 2**28, "dp"), translates=mesh.translates(group, ("tp",)))
    assert priced.num_translates == 2 and priced.symmetric
    nics = [link for link in priced.link_flows if t.link(link).kind == "roce"]
    assert nics
    for link in nics:
        assert priced.class_flows[link] == 2 * priced.link_flows[link]
        assert priced.class_bytes[link] == pytest.approx(2 * priced.link_bytes[link], rel=1e-12)
    assert list(priced.class_flows) == list(priced.class_bytes) and list(priced.link_flows) == list(priced.link_bytes)
    job = job_of(t, priced, count=3)
    assert [(link, flows) for link, _, flows in job.demand] == sorted(priced.class_flows.items())


def test_batched_class_loads_equal_one_group_at_a_time_with_levels():
    # The numpy batch of every translate's routes (used by price_graph) against the per-group sums, on a plan
    # with dependency levels (a pipelined chain) and on one without (the fast ring).
    t = load_topology("dgx-h100", num_nodes=4, assignments=["inter_node.nics_per_node=2"])
    mesh = Mesh(tp=4, dp=8)
    group = mesh.group("dp", 0)
    groups = np.asarray(mesh.translates(group, ("tp",)), dtype=np.int64)
    req = Request("broadcast", Group(t, group), 2**22)
    for transfers, levels in (
            (lambda plan: ([(x.src, x.dst, x.nbytes) for x in plan.transfers], link_loads._levels(plan.transfers)))(p)
            for p in (ring_fast(req), ring_fast(Request("all_reduce", Group(t, group), 2**26)))):
        one = link_loads._class_loads(t, list(map(tuple, groups.tolist())), transfers, levels)
        batched = link_loads._class_loads_batched(t, groups, transfers, levels)
        assert one[2] == batched[2]
        for a, b in zip(one[:2] + one[3:], batched[:2] + batched[3:], strict=True):
            assert sorted(a) == sorted(b)
            assert [a[k] for k in sorted(a)] == pytest.approx([b[k] for k in sorted(b)], rel=1e-12)
        assert any(one[4][k] > one[3][k] for k in one[3])  # the translates share links


def test_collectives_on_the_same_ring_pairs_share_one_kept_layout_and_price_as_a_fresh_topology_does():
    # A search's contention estimate prices the all-gather and reduce-scatter of one data-parallel group beside its
    # translates: the same ring pairs on the same groups, so the routes are resolved once (Topology.link_layouts),
    # and the loads are those a topology that never saw the first collective computes.
    def priced(t, op):
        mesh = Mesh(tp=2, pp=4, dp=8)
        group = mesh.group("dp", 0)
        return price_comm(t, Comm(op, group, 2**28, "dp"), translates=mesh.translates(group, ("tp",)))

    t = load_topology("pcie-gen4-8gpu", num_nodes=8)
    gather = priced(t, "all_gather")
    kept = len(t.link_layouts)
    scatter = priced(t, "reduce_scatter")
    assert gather.algorithm == scatter.algorithm == "ring" and kept >= 1
    assert len(t.link_layouts) == kept  # the reduce-scatter found the all-gather's layout
    fresh = priced(load_topology("pcie-gen4-8gpu", num_nodes=8), "reduce_scatter")
    assert (scatter.link_bytes, scatter.class_bytes, scatter.link_flows, scatter.class_flows, scatter.symmetric) == (
        fresh.link_bytes, fresh.class_bytes, fresh.link_flows, fresh.class_flows, fresh.symmetric)
