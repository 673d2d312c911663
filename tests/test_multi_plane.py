"""Multi-plane fabrics (inter_node.planes, simdist.hardware.fabric): each plane its own leaves and spines, routes
that never cross planes in the fabric (PXN: the sending node relays over NVLink), hand-checked bisection and
collectives on tests/data/topologies/tiny-two-plane.yaml, and the errors."""

from pathlib import Path

import numpy as np
import pytest

from simdist.analytic.registry import closed_form
from simdist.collectives.group import Group
from simdist.collectives.protocols import SIMPLE
from simdist.collectives.registry import algorithm_for
from simdist.collectives.request import Request
from simdist.engine.simulate import simulate
from simdist.errors import SimdistError
from simdist.hardware import bisection, load_topology
from simdist.hardware.batch import routes
from tests.cli_harness import run_cli
from tests.plan_timing import uncontended
from tests.test_bisection import max_flow_between_halves

# 4 nodes x 2 GPUs, NIC i of a node on plane i; a plane: 4-port leaves with 2 nodes' NICs each and 2 spines at 1:1
# (25 GB/s links); GPU -> PCIe switch -> NIC, GPU -> NVSwitch -> GPU and every fabric link 1 us.
TWO_PLANE = str(Path(__file__).resolve().parent / "data" / "topologies" / "tiny-two-plane.yaml")
T = load_topology(TWO_PLANE)


def _names(t, route):
    return [t.link(link).dst for link in route.links]


def test_each_plane_is_its_own_two_tier_fabric():
    f = T.fabric
    assert (f.planes, f.leaves_per_pod, f.num_leaves, f.num_spines) == (2, 2, 4, 2)
    assert f.uplink_bandwidth_Bps == pytest.approx(25e9)
    # NIC 0 of nodes 0-1 on leaf 0, of nodes 2-3 on leaf 1 (plane 0); NIC 1 likewise on leaves 2 and 3 (plane 1)
    assert [int(f.leaf_of(nic)) for nic in range(8)] == [0, 2, 0, 2, 1, 3, 1, 3]
    assert T.vertex_counts["leaf_switch"] == 4 and T.vertex_counts["spine_switch"] == 4
    spines = {(T.link(i).src, T.link(i).dst) for i in range(T.num_links)
              if T.link(i).src.startswith("leaf") and T.link(i).dst.startswith("spine")}
    assert spines == {("leaf0", "spine0"), ("leaf0", "spine1"), ("leaf1", "spine0"), ("leaf1", "spine1"),
                      ("leaf2", "spine2"), ("leaf2", "spine3"), ("leaf3", "spine2"), ("leaf3", "spine3")}


def test_routes_stay_on_the_destinations_plane():
    # same plane: GPU 0 -> its NIC 0 -> leaf 0 -> node 1's NIC 0 -> GPU 0: 6 links, 6 us
    same = T.route(0, 2)
    assert _names(T, same) == ["n0/h0/pcie0", "n0/nic0", "leaf0", "n1/nic0", "n1/h0/pcie0", "n1/gpu0"]
    assert same.latency_s == pytest.approx(6e-6)
    # GPU 0 to node 1's GPU 1 (plane 1): over NVLink to GPU 1, out by NIC 1 (PXN): 8 links, 8 us
    pxn = T.route(0, 3)
    assert _names(T, pxn) == ["n0/nvswitch", "n0/gpu1", "n0/h0/pcie0", "n0/nic1", "leaf2", "n1/nic1", "n1/h0/pcie0",
                              "n1/gpu1"]
    assert pxn.latency_s == pytest.approx(8e-6) and pxn.effective_bandwidth_Bps == pytest.approx(25e9)
    # to node 3 (another leaf): up plane 1's spine layer, 10 links
    far = T.route(0, 7)
    assert [n for n in _names(T, far) if n.startswith(("leaf", "spine"))] in (
        ["leaf2", "spine2", "leaf3"], ["leaf2", "spine3", "leaf3"])
    assert far.latency_s == pytest.approx(10e-6)
    src, dst = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    keep = src != dst
    batch = routes(T, src[keep], dst[keep])
    for i, (a, b) in enumerate(zip(src[keep].tolist(), dst[keep].tolist(), strict=True)):
        assert batch.route(i) == T.route(a, b)


def test_bisection_by_hand_and_by_max_flow():
    # nodes 0-1 | 2-3: on each plane the first half's leaf sends its 2 NICs' 50 GB/s up its two 25 GB/s uplinks and
    # the other leaf takes it down: 50 GB/s per plane, 100 GB/s in all
    cut = bisection(T)
    assert cut.bandwidth_Bps == pytest.approx(100e9)
    assert cut.bandwidth_Bps == pytest.approx(max_flow_between_halves(T), rel=1e-9)
    thin = load_topology(TWO_PLANE, assignments=["inter_node.oversubscription=3"])  # 3 NICs down, 1 spine of 25
    assert thin.fabric.num_leaves == 4 and thin.fabric.num_spines == 1
    assert bisection(thin).bandwidth_Bps == pytest.approx(max_flow_between_halves(thin), rel=1e-9)


def _timed(name, ranks, nbytes):
    group = Group(T, ranks)
    req = Request("all_reduce", group, nbytes)
    algo = algorithm_for(name, req)
    plan = algo.build(req)
    run = simulate([(plan, group)])[0]
    assert uncontended(plan, group, run)
    fast = simulate([(algo.build_fast(req), group)])[0].time_s
    return closed_form(name)(req, SIMPLE), run.time_s, fast


def test_routed_all_reduce_across_planes_by_hand():
    # GPU 0 of node 0 and GPU 1 of node 1 (different planes): direct two-shot all_reduce of 1 MB, two steps of
    # 500 kB each way over the 8 us PXN route at 25 GB/s: 2 x (8 + 20) = 56 us
    assert Group(T, (0, 3)).crosses_planes() and not Group(T, (0, 2)).crosses_planes()
    for timed in _timed("direct", (0, 3), 1e6):
        assert timed == pytest.approx(56e-6, rel=1e-9)
    # all 8 GPUs: each step sends 125 kB from every GPU to each of the 6 GPUs off its node; NIC i of a node carries
    # its own GPU's 3 blocks to the GPUs i of the other nodes and the 3 its neighbour relays there (PXN): 750 kB,
    # 30 us, after the longest route (PXN across plane i's spine: 10 us): 2 x 40 = 80 us
    for timed in _timed("direct", tuple(range(8)), 1e6):
        assert timed == pytest.approx(80e-6, rel=1e-9)
    closed, engine, fast = _timed("ring", tuple(range(8)), 1e6)
    assert engine == pytest.approx(closed, rel=1e-9) and fast == pytest.approx(closed, rel=1e-9)


def test_bad_planes_are_one_error_naming_the_field():
    with pytest.raises(SimdistError, match="planes") as err:
        load_topology(TWO_PLANE, assignments=["inter_node.planes=3"])
    assert "planes <= nics_per_node" in str(err.value)
    with pytest.raises(SimdistError, match="do not divide") as err:
        load_topology("dgx-h100", num_nodes=2, assignments=["inter_node.planes=3"])
    assert "inter_node.planes" in str(err.value)
    with pytest.raises(SimdistError, match="3 tiers"):
        load_topology(TWO_PLANE, assignments=["inter_node.tiers=3"])
    r = run_cli(["topo", "show", TWO_PLANE, "--set", "inter_node.planes=0"])
    assert r.one_line_error() and "planes" in r.err
    with pytest.raises(SimdistError, match="multi-plane"):
        T.with_failed_uplinks([(0, 0)])


def test_topo_show_prints_the_planes():
    r = run_cli(["topo", "show", TWO_PLANE])
    assert r.code == 0
    assert "2 planes of 2 leaves and 2 spines" in r.out and "100 GB/s per direction" in r.out
    r = run_cli(["topo", "show", TWO_PLANE, "--json"])
    assert '"planes": 2' in r.out


def test_the_100k_multi_plane_preset():
    # topologies/mpft-100k.yaml: 12,500 servers x 8 H100, NIC i on plane i; a plane's 12,500 NICs on 256-port leaves
    # (128 down, 128 up): 98 leaves and 128 spines per plane; non-blocking: half the NICs x 50 GB/s = 2,500 TB/s
    t = load_topology("mpft-100k")
    f = t.fabric
    assert t.num_gpus == 100_000 and f.planes == 8 and f.down_ports == 128
    assert (f.leaves_per_pod, f.num_spines, f.num_leaves) == (98, 128, 784)
    assert t.vertex_counts["spine_switch"] == 1024
    assert bisection(t).bandwidth_Bps == pytest.approx(50_000 * 50e9)
    # GPU 0 of server 0 to GPU 7 of server 9,999: over NVLink to GPU 7, out by NIC 7 on plane 7
    kinds = [t.link(i).kind for i in t.route(0, 9_999 * 8 + 7).links]
    assert kinds[:2] == ["nvlink", "nvlink"] and kinds.count("infiniband") == 4
