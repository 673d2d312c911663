"""Tree, halving/doubling and hierarchical plans: they compute their collectives, and the engine
reproduces the closed forms alone on the network (their planned rates hold)."""

import dataclasses
import math

import numpy as np
import pytest

from simdist.analytic.halving_doubling import halving_doubling_time_s
from simdist.analytic.registry import closed_form
from simdist.analytic.ring import ring_time_s
from simdist.collectives.group import Group
from simdist.collectives.halving_doubling import halving_doubling_plan
from simdist.collectives.hierarchical import hierarchical_plan, node_groups, ring_half_lands
from simdist.collectives.protocols import SIMPLE, ProtocolCost
from simdist.collectives.registry import algorithm_for
from simdist.collectives.request import Request
from simdist.collectives.tree import detailed_size, tree_parents_for, tree_pieces, tree_plan
from simdist.collectives.tree_shape import children_of, dtree_parents, peer_tree, subtree_heights
from simdist.collectives.verify import verify
from simdist.engine.simulate import simulate
from simdist.errors import SimdistError
from simdist.hardware import load_topology
from tests.plan_timing import uncontended

ALPHA, BW = 0.6e-6, 450e9 * 0.82  # dgx-h100 / gb200 NVSwitch hop: latency, effective bandwidth per port
H100 = {n: load_topology("dgx-h100", num_nodes=n) for n in (1, 2, 3, 4)}
NVL72 = load_topology("gb200-nvl72")


def _engine(req: Request, algorithm: str):
    plan = algorithm_for(algorithm, req).build(req)
    return plan, simulate([(plan, req.group)])[0]


def _closed(req: Request, algorithm: str, proto: ProtocolCost = SIMPLE) -> float:
    return closed_form(algorithm)(req, proto)


def _busiest_link_bound(run, topology) -> float:
    return max((b / topology.link(link).effective_bandwidth_Bps for link, b in run.link_bytes.items()), default=0.0)


def _hosts(n: int, local: int) -> Group:
    """``local`` peers on each of ``n`` dgx-h100 nodes (local GPUs 0..local-1)."""
    return Group(H100[n], tuple(node * 8 + g for node in range(n) for g in range(local)))


# ----------------------------------------------------------------------------- tree


def test_nccl_binary_trees():
    # ncclGetBtree over 8 ranks: 0 -> 4 -> {2, 6}, 2 -> {1, 3}, 6 -> {5, 7}
    assert dtree_parents(8, 0) == [-1, 2, 4, 2, 0, 6, 4, 6]
    assert dtree_parents(8, 1) == [1, 3, 1, 7, 5, 3, 5, -1]  # the mirror r -> 7 - r: 7 -> 3 -> {1, 5}
    for n in range(2, 18):
        interior = [{r for r, kids in enumerate(children_of(dtree_parents(n, w))) if kids} for w in (0, 1)]
        for w in (0, 1):
            parent = dtree_parents(n, w)
            assert parent.count(-1) == 1 and max(len(k) for k in children_of(parent)) <= 2
            assert max(subtree_heights(parent)) == math.ceil(math.log2(n))  # depth of the binary tree
        # two-tree property: a rank is interior in at most one tree (odd n: rank 0, the root of
        # tree 0 with a single child, is the one exception of NCCL's shifted second tree)
        assert interior[0] & interior[1] == (set() if n % 2 == 0 else {0})


def test_multi_node_tree_is_a_tree_over_nodes_with_a_chain_inside():
    groups = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    parent = peer_tree(groups, 0)
    assert parent[:4] == [-1, 0, 1, 2] and parent[5:8] == [4, 5, 6]  # chains from each node's head
    assert parent[4] == 8 and parent[8] == 0  # node tree 0 -> 2 -> 1 joins the heads
    # tree 1 of channel 1: node tree shifted by one (1 -> 0 -> 2), chains [0, 3, 2, 1] reversed from local 1
    mirror = peer_tree(groups, 1, channel=1)
    assert [mirror[g[0]] for g in groups] == [4, -1, 0] and mirror[3] == 0 and mirror[1] == 2


@pytest.mark.parametrize("peers", range(2, 18))
def test_tree_plans_compute_their_collectives(peers):
    group = [list(range(peers))]
    verify(tree_plan("all_reduce", [peer_tree(group, 0), peer_tree(group, 1)], 3e6, 5))
    verify(tree_plan("barrier", [peer_tree(group, 0), peer_tree(group, 1)], 0.0, 1))
    for root in {0, peers // 2, peers - 1}:
        verify(tree_plan("broadcast", [peer_tree(group, 0, root)], 3e6, 4))
        verify(tree_plan("reduce", [peer_tree(group, 0, root)], 3e6, 4))


@pytest.mark.parametrize(("nodes", "local"), [(2, 2), (2, 4), (3, 4), (4, 8)])
def test_multi_node_tree_plans_compute_their_collectives(nodes, local):
    group = _hosts(nodes, local)
    for channels in (1, 2):
        verify(tree_plan("all_reduce", tree_parents_for("all_reduce", group, 0, channels), 1e6, 2))
    for root in (0, group.size - 1):
        for op in ("broadcast", "reduce"):
            verify(tree_plan(op, tree_parents_for(op, group, root, 2), 1e6, 2))


TREE_CASES = [
    (Group.first(NVL72, 2), 1), (Group.first(NVL72, 7), 1), (Group.first(NVL72, 16), 1), (Group.first(NVL72, 17), 2),
    (Group.first(H100[2], 16), None), (_hosts(3, 4), None), (Group(H100[4], (0, 3, 9, 10, 17, 25, 26, 31)), None),
    (Group.first(load_topology("pcie-gen4-8gpu"), 7), None),
]


@pytest.mark.parametrize(("group", "channels"), TREE_CASES)
def test_tree_engine_equals_closed_form(group, channels):
    # Every hop moves at its tree's rate, one piece at a time per connection: alone, the planned rates
    # hold and the engine runs the closed form's max-plus recurrence exactly, one piece or many.
    for op in ("all_reduce", "broadcast", "reduce", "barrier"):
        for size in ((0.0,) if op == "barrier" else (1e5, 3e6)):
            req = Request(op, group, size, root=group.size // 2, channels=channels)
            plan, run = _engine(req, "tree")
            assert plan.num_transfers == detailed_size(req)
            assert run.time_s == pytest.approx(_closed(req, "tree"), rel=1e-9), (op, size)
            assert run.time_s >= _busiest_link_bound(run, group.topology)


def test_tree_broadcast_textbook_pipeline_on_nvswitch():
    # 8 peers, root 0 -> 4 -> {2, 6} -> leaves: peer 4 (and 2, 6) feeds two children through its port, so
    # the tree moves at B/2; a piece crosses 3 hops, each adding alpha + d, then k - 1 pieces follow: d each.
    group = Group.first(H100[1], 8)
    size = 64e6
    k = tree_pieces(size, 1)
    assert k == math.ceil(size / 2**19)  # NCCL's 512 KiB pipeline steps
    d = size / k / (BW / 2)
    run = _engine(Request("broadcast", group, size), "tree")[1]
    assert run.time_s == pytest.approx(3 * ALPHA + (3 + k - 1) * d, rel=1e-9)


def test_tree_all_reduce_textbook_on_two_peers():
    # Double tree on 2 peers: tree 0 = 0 <- 1, tree 1 = 1 <- 0, each half the buffer. Up and down overlap
    # (NCCL's runTreeSplit), so each port carries two connections: the trees move at B/2. A chain climbs
    # one hop and descends one: 2 alpha + (2 + k - 1) d with d = (S / 2 k) / (B / 2).
    group = Group.first(H100[1], 2)
    size = 64e6
    k = tree_pieces(size, 2)
    run = _engine(Request("all_reduce", group, size), "tree")[1]
    assert run.time_s == pytest.approx(2 * ALPHA + (k + 1) * size / (k * BW), rel=1e-9)


def test_tree_all_reduce_on_one_node_is_about_twice_the_port_time():
    # two trees, each half the data, up and down at once: a port carries at most 2 S each way (the
    # busiest-link bound 2 S / B), plus the pipeline's fill
    group = Group.first(NVL72, 16)
    size = 1e9
    run = _engine(Request("all_reduce", group, size), "tree")[1]
    bw = group.path(0, 1).effective_bandwidth_Bps
    assert _busiest_link_bound(run, NVL72) == pytest.approx(2 * size / bw, rel=1e-9)
    assert 2 * size / bw <= run.time_s <= 1.05 * 2 * size / bw


@pytest.mark.parametrize(("algorithm", "group"), [
    ("tree", Group.first(H100[1], 8)),
    ("halving_doubling", Group.first(H100[1], 6)),
    ("hierarchical", Group.first(H100[2], 16)),
])
def test_protocol_costs_enter_the_closed_forms_as_the_engine_applies_them(algorithm, group):
    proto = ProtocolCost("ll128", base_latency_s=5e-6, per_transfer_latency_s=1e-6, rate_factor=0.92)
    req = Request("broadcast" if algorithm == "tree" else "all_reduce", group, 16e6)
    plan = dataclasses.replace(algorithm_for(algorithm, req).build(req), base_latency_s=5e-6,
                               per_transfer_latency_s=1e-6, rate_factor=0.92, protocol="ll128")
    engine = simulate([(plan, group)])[0].time_s
    assert engine == pytest.approx(_closed(req, algorithm, proto), rel=1e-9)
    assert engine > _closed(req, algorithm)


# ----------------------------------------------------------------------------- halving / doubling


@pytest.mark.parametrize("peers", range(1, 18))
def test_halving_doubling_plans_compute_their_collectives(peers):
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        plan = halving_doubling_plan(op, peers, 1e6)
        verify(plan)
        if op != "all_reduce":
            assert sorted(plan.chunk_segment) == list(range(peers))  # one segment per peer, peer c owns c
    verify(halving_doubling_plan("barrier", peers, 0.0))


@pytest.mark.parametrize("peers", [2, 4, 8, 16])
def test_halving_doubling_all_reduce_is_all_gather_after_reduce_scatter(peers):
    rs, ag, ar = (halving_doubling_plan(op, peers, 1e6) for op in ("reduce_scatter", "all_gather", "all_reduce"))
    assert [(t.src, t.dst, t.chunk) for t in ar.transfers] == [
        (t.src, t.dst, t.chunk) for t in rs.transfers + ag.transfers
    ]
    assert rs.chunk_segment == ag.chunk_segment == ar.chunk_segment


def test_halving_doubling_non_power_of_two_folds_pairs():
    plan = halving_doubling_plan("all_reduce", 6, 6e6)  # P' = 4, peers 0 and 2 fold into 1 and 3
    first = {(t.src, t.dst) for t in plan.transfers[:8]}
    assert first == {(0, 1), (2, 3)}
    assert {(t.src, t.dst) for t in plan.transfers[-8:]} == {(1, 0), (3, 2)}
    assert sum(t.nbytes for t in plan.transfers if t.src == 0) == pytest.approx(6e6)  # the whole buffer


@pytest.mark.parametrize("peers", range(2, 18))
def test_halving_doubling_equals_closed_form(peers):
    # Messages of a step start together and never share a port on an NVSwitch: exact, any count.
    group = Group.first(NVL72, peers)
    for op in ("all_reduce", "reduce_scatter", "all_gather", "barrier"):
        size = 0.0 if op == "barrier" else 64e6
        req = Request(op, group, size)
        assert _engine(req, "halving_doubling")[1].time_s == pytest.approx(_closed(req, "halving_doubling"),
                                                                           rel=1e-9)


def test_halving_doubling_textbook_formula():
    # Rabenseifner on P = 8 (Thakur et al. 2005): 2 log2 P alpha + 2 (P-1)/P S / B
    group = Group.first(H100[1], 8)
    size = 1e9
    run = _engine(Request("all_reduce", group, size), "halving_doubling")[1]
    assert run.time_s == pytest.approx(6 * ALPHA + 2 * 7 / 8 * size / BW, rel=1e-9)
    # 6 peers: fold (alpha + S/B), 2 halving + 2 doubling steps over P' = 4, unfold (alpha + S/B)
    run = _engine(Request("all_reduce", Group.first(H100[1], 6), size), "halving_doubling")[1]
    assert run.time_s == pytest.approx(6 * ALPHA + 2 * size / BW + 2 * 3 / 4 * size / BW, rel=1e-9)


def test_halving_doubling_across_nodes_and_pcie():
    # Messages move at their share of their busiest link in their step: exact wherever a step's messages
    # stay in their step. With 20 peers on 3 nodes the folded pairs fall behind the others, and messages
    # of consecutive steps meet on NICs: contended by its own flows, the engine is slower.
    cases = (Group.first(H100[2], 16), Group.first(H100[4], 32), Group.first(load_topology("pcie-gen5-8gpu"), 6),
             Group.first(H100[3], 20))
    contended = set()
    for group in cases:
        for op in ("all_reduce", "all_gather"):
            plan = halving_doubling_plan(op, group.size, 256e6, group)
            run = simulate([(plan, group)])[0]
            closed = halving_doubling_time_s(group, op, 256e6)
            if uncontended(plan, group, run):
                assert run.time_s == pytest.approx(closed, rel=1e-9)
            else:
                contended.add((group.size, op))
                assert closed < run.time_s < 1.05 * closed
            assert run.time_s >= _busiest_link_bound(run, group.topology)
    assert contended == {(20, "all_gather")}


# ----------------------------------------------------------------------------- hierarchical


@pytest.mark.parametrize(("nodes", "local"), [(2, 1), (2, 2), (2, 4), (3, 4), (4, 8), (3, 3)])
def test_hierarchical_plans_compute_their_collectives(nodes, local):
    group = _hosts(nodes, local)
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        req = Request(op, group, 1e6)
        plan = algorithm_for("hierarchical", req).build(req)
        verify(plan)
        if op != "all_reduce":
            assert sorted(plan.chunk_segment) == list(range(group.size))


@pytest.mark.parametrize(("nodes", "local"), [(2, 2), (3, 4), (4, 8)])
def test_hierarchical_all_reduce_is_all_gather_after_reduce_scatter(nodes, local):
    groups = node_groups(_hosts(nodes, local))
    rs, ag, ar = (hierarchical_plan(op, groups, 1e6) for op in ("reduce_scatter", "all_gather", "all_reduce"))
    assert [(t.src, t.dst, t.chunk) for t in ar.transfers] == [
        (t.src, t.dst, t.chunk) for t in rs.transfers + ag.transfers
    ]
    assert rs.chunk_segment == ag.chunk_segment == ar.chunk_segment


@pytest.mark.parametrize(("nodes", "local"), [(2, 2), (2, 4), (3, 4), (4, 8)])
def test_hierarchical_equals_closed_form_on_dgx_h100(nodes, local):
    group = _hosts(nodes, local)
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        for size in (1e6, 1e9):
            req = Request(op, group, size)
            run = _engine(req, "hierarchical")[1]
            assert run.time_s == pytest.approx(_closed(req, "hierarchical"), rel=1e-9)
            assert run.time_s >= _busiest_link_bound(run, group.topology)


def test_hierarchical_textbook_formula():
    # 2 nodes x 8: 2 (L-1)(alpha + S/(L B)) inside + 2 (N-1)(alpha_n + S/(L N B_n)) across
    group = Group.first(H100[2], 16)
    size = 1e9
    alpha_n, bw_n = 2.7e-6, 48e9  # same-rail route: GPU-PCIe-NIC-leaf-NIC-PCIe-GPU
    expected = 14 * (ALPHA + size / (8 * BW)) + 2 * (alpha_n + size / (16 * bw_n))
    req = Request("all_reduce", group, size)
    assert _engine(req, "hierarchical")[1].time_s == pytest.approx(expected, rel=1e-9)
    assert _closed(req, "hierarchical") == pytest.approx(expected, rel=1e-9)


def test_ring_half_with_staggered_starts_by_hand():
    # 3 peers, 2 steps, latency 1 per edge, wire 10 per step. Peer 2 is ready at 5, the others at 0.
    # Edge 0 (0 -> 1) starts at 0: f(0,0) = 11; edges 1 (1 -> 2) and 2 (2 -> 0) wait for peer 2: 16 each.
    # Step 2: f(0,1) = max(f(2,0) + 1, f(0,0)) + 10 = 27, f(1,1) = max(f(0,0) + 1, 16) + 10 = 26,
    # f(2,1) = max(f(1,0) + 1, 16) + 10 = 27.
    lands = ring_half_lands(np.array([[0.0, 0.0, 5.0]]), np.ones((1, 3)), np.array([10.0]))
    assert lands.tolist() == [[27.0, 26.0, 27.0]]


def test_hierarchical_cross_node_rings_contend_on_an_oversubscribed_fat_tree():
    # 12 NICs per leaf and 3 spines of one NIC's bandwidth each: the 8 concurrent cross-node rings of
    # 4 nodes hash onto shared spine uplinks. Each ring alone (its sub-group's ring closed form) would
    # be as fast as on the rail-optimized fabric; together they are well slower. The rings' rates are
    # their shares of the links they meet on, so the closed form sees the contention and is exact.
    fat = load_topology("dgx-h100", num_nodes=4, assignments=[
        "inter_node.fabric=fat_tree", "inter_node.switch_radix=16", "inter_node.oversubscription=4"])
    size = 1e9
    runs = {}
    for name, topology in (("fat", fat), ("rail", H100[4])):
        group = Group.first(topology, 32)
        req = Request("all_reduce", group, size)
        runs[name] = run = _engine(req, "hierarchical")[1]
        assert run.time_s == pytest.approx(_closed(req, "hierarchical"), rel=1e-9)
        assert run.time_s >= _busiest_link_bound(run, topology)
    assert runs["fat"].time_s > 1.5 * runs["rail"].time_s
    group = Group.first(fat, 32)
    alone = 2 * (7 * (ALPHA + size / (8 * BW)))  # intra-node phases
    alone_cross = 0.0
    for pos in range(8):  # each cross-node ring on its own, on the fat tree: as fast as on the rails
        sub = Group(fat, tuple(node * 8 + pos for node in range(4)))
        t = ring_time_s(sub, size / 8, [list(range(4))], 6)
        assert t == pytest.approx(ring_time_s(Group(H100[4], sub.ranks), size / 8, [list(range(4))], 6), rel=1e-3)
        alone_cross = max(alone_cross, t)
    assert runs["fat"].time_s > 1.5 * (alone + alone_cross)


def test_hierarchical_rejects_groups_it_cannot_split():
    one_node = Request("all_reduce", Group.first(H100[1], 8), 1e6)
    with pytest.raises(SimdistError, match="at least 2 nodes") as err:
        algorithm_for("hierarchical", one_node)
    assert "\n" not in str(err.value) and "fix:" in str(err.value)
    uneven = Request("all_reduce", Group(H100[2], (0, 1, 2, 8, 9)), 1e6)
    with pytest.raises(SimdistError, match="3 \\+ 2 peer"):
        algorithm_for("hierarchical", uneven)
    with pytest.raises(SimdistError, match="does not implement broadcast"):
        algorithm_for("hierarchical", Request("broadcast", Group.first(H100[2], 16), 1e6))
