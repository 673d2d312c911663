"""Routes on hand-checkable topologies: hop counts, bottlenecks, latencies, determinism."""

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.errors import TopologyError
from simdist.hardware import load_topology
from simdist.hardware.link_defaults import pcie_bandwidth_Bps

GEN4_X16 = pcie_bandwidth_Bps(4, 16)  # 31.5 GB/s


def kinds(t, route):
    return [t.link(i).kind for i in route.links]


def test_nvswitch_pair_is_two_nvlink_hops():
    t = load_topology("dgx-h100")
    r = t.route(0, 5)
    assert t.route_vertices(r) == ["n0/gpu0", "n0/nvswitch", "n0/gpu5"]
    assert r.bandwidth_Bps == 450e9
    assert r.effective_bandwidth_Bps == pytest.approx(450e9 * 0.82)
    assert r.latency_s == pytest.approx(0.6e-6)  # 2 x 0.3 us = NCCL hwLat[NVLINK][Ring][LL]


def test_pcie_same_switch():
    t = load_topology("pcie-gen4-8gpu")
    r = t.route(0, 1)
    assert t.route_vertices(r) == ["n0/gpu0", "n0/h0/pcie0", "n0/gpu1"]
    assert r.bandwidth_Bps == pytest.approx(GEN4_X16)
    assert r.latency_s == pytest.approx(1.0e-6)  # NCCL hwLat[PCI][Ring][LL]


def test_pcie_other_switch_same_socket_goes_through_root_complex():
    t = load_topology("pcie-gen4-8gpu")
    r = t.route(0, 2)
    assert t.route_vertices(r) == ["n0/gpu0", "n0/h0/pcie0", "n0/h0/cpu0", "n0/h0/pcie1", "n0/gpu2"]
    assert r.hops == 4 and r.bandwidth_Bps == pytest.approx(GEN4_X16)


def test_pcie_cross_socket_crosses_cpu_interconnect():
    t = load_topology("pcie-gen4-8gpu")
    r = t.route(1, 6)
    assert t.route_vertices(r) == [
        "n0/gpu1", "n0/h0/pcie0", "n0/h0/cpu0", "n0/h0/cpu1", "n0/h0/pcie3", "n0/gpu6",
    ]
    assert kinds(t, r) == ["pcie", "pcie", "cpu_interconnect", "pcie", "pcie"]
    assert r.bandwidth_Bps == 16e9  # xGMI as NCCL models it (AMD_BW)
    assert r.latency_s == pytest.approx(4 * 0.5e-6 + 0.5e-6)


def test_nvlink_preferred_over_pcie_even_at_equal_hops():
    # gpu0 and gpu1 share a PCIe switch (2 hops) and the NVSwitch (2 hops): NVLink wins, as in NCCL.
    t = load_topology("dgx-a100")
    assert kinds(t, t.route(0, 1)) == ["nvlink", "nvlink"]


def _fat_tree(radix, nodes=4, oversubscription=1):
    return load_topology(
        "dgx-h100",
        num_nodes=nodes,
        assignments=["inter_node.fabric=fat_tree", f"inter_node.switch_radix={radix}",
                     f"inter_node.oversubscription={oversubscription}"],
    )


def test_same_leaf_route():
    t = _fat_tree(radix=32)  # 16 NICs per leaf: nodes 0 and 1 share leaf 0
    r = t.route(0, 8)
    assert t.route_vertices(r) == ["n0/gpu0", "n0/h0/pcie0", "n0/nic0", "leaf0", "n1/nic0", "n1/h0/pcie0", "n1/gpu0"]
    assert r.bandwidth_Bps == 50e9
    assert r.latency_s == pytest.approx(2.7e-6)  # NCCL hwLat[NET][Ring][LL]


def test_cross_leaf_route_climbs_to_a_spine():
    t = _fat_tree(radix=16)  # 8 NICs per leaf: one node per leaf
    r = t.route(0, 8)
    v = t.route_vertices(r)
    assert v[:4] == ["n0/gpu0", "n0/h0/pcie0", "n0/nic0", "leaf0"]
    assert v[4].startswith("spine") and v[5] == "leaf1"
    assert v[6:] == ["n1/nic0", "n1/h0/pcie0", "n1/gpu0"]
    assert r.hops == 8
    assert r.latency_s == pytest.approx(2.7e-6 + 2 * 0.35e-6)


def test_rail_optimized_same_rail_and_cross_rail():
    t = load_topology("dgx-h100", num_nodes=4)
    same = t.route(3, 8 + 3)  # GPU 3 of node 0 to GPU 3 of node 1: rail 3, one switch
    assert t.route_vertices(same)[3] == "leaf3" and same.hops == 6
    cross = t.route(3, 8 + 4)  # rail 3 to rail 4: via a spine
    v = t.route_vertices(cross)
    assert v[3] == "leaf3" and v[4].startswith("spine") and v[5] == "leaf4" and cross.hops == 8


def test_oversubscribed_uplinks_are_the_bottleneck():
    t = _fat_tree(radix=16, oversubscription=2)  # 10 down ports, 5 spines, uplinks 10 x 50 / (2 x 5) = 50 GB/s
    assert t.fabric.down_ports == 10 and t.fabric.num_spines == 5
    assert t.fabric.uplink_bandwidth_Bps == pytest.approx(50e9)
    t4 = _fat_tree(radix=16, oversubscription=4)  # 12 down, 3 spines of 12 x 50 / 12 = 50 GB/s
    assert t4.fabric.num_spines * t4.fabric.uplink_bandwidth_Bps == pytest.approx(12 * 50e9 / 4)


def test_ecmp_is_stable_and_spreads():
    t = load_topology("dgx-h100", num_nodes=64)
    spines = {t.route_vertices(t.route(0, 8 * n + 1))[4] for n in range(1, 64)}
    assert len(spines) > 16  # flows from one GPU spread over many of the 32 spines
    assert t.route(0, 9) is t.route(0, 9)  # cached
    fresh = load_topology("dgx-h100", num_nodes=64)
    assert fresh.route(0, 100).links == t.route(0, 100).links  # same choice in a new process/object


def test_rank_out_of_range_is_a_clear_error():
    t = load_topology("dgx-h100")
    with pytest.raises(TopologyError, match="outside this cluster of 8 GPUs"):
        t.route(0, 8)


def test_self_route_is_empty():
    r = load_topology("dgx-h100").route(3, 3)
    assert r.links == () and r.latency_s == 0.0


PRESETS = ["dgx-a100", "dgx-h100", "dgx-b200", "gb200-nvl72", "pcie-gen4-8gpu", "pcie-gen5-8gpu"]
_TOPOLOGIES = {}


def _topology(name, nodes):
    key = (name, nodes)
    if key not in _TOPOLOGIES:
        _TOPOLOGIES[key] = load_topology(name, num_nodes=nodes)
    return _TOPOLOGIES[key]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(PRESETS), st.integers(1, 40), st.data())
def test_route_invariants(name, nodes, data):
    t = _topology(name, nodes)
    src = data.draw(st.integers(0, t.num_gpus - 1))
    dst = data.draw(st.integers(0, t.num_gpus - 1).filter(lambda d: d != src))
    r = t.route(src, dst)
    links = [t.link(i) for i in r.links]
    # a connected chain from the source GPU to the destination GPU
    sn, sg = t.locate(src)
    dn, dg = t.locate(dst)
    assert links[0].src == f"n{sn}/gpu{sg}" and links[-1].dst == f"n{dn}/gpu{dg}"
    assert all(a.dst == b.src for a, b in itertools.pairwise(links))
    # no GPU in the middle; NICs only right next to the fabric
    middle = [lk.dst for lk in links[:-1]]
    assert not any("/gpu" in v for v in middle)
    assert len(set(r.links)) == len(r.links)
    # aggregate figures are what the links say
    assert r.bandwidth_Bps == min(lk.bandwidth_Bps for lk in links)
    assert r.effective_bandwidth_Bps == pytest.approx(min(lk.effective_bandwidth_Bps for lk in links))
    assert r.latency_s == pytest.approx(sum(lk.latency_s for lk in links))
    # symmetric in length; inside a node never leaves it
    assert t.route(dst, src).hops == r.hops
    if sn == dn:
        assert all(lk.src.startswith(f"n{sn}/") for lk in links)


def _one_pair_search(node, src, dst):
    """The widest-then-shortest path by its definition, one pair at a time: breadth-first from ``src`` over the
    widest links that reach ``dst`` (not through GPUs or NICs), stopping as soon as ``dst`` is reached."""
    from collections import deque

    from simdist.hardware.node import ENDPOINT_KINDS

    g = node.graph
    for threshold in sorted({lk.bandwidth_Bps for lk in node.links}, reverse=True):
        prev, queue = {src: src}, deque([src])
        while queue and dst not in prev:
            v = queue.popleft()
            if v != src and g.nodes[v]["kind"] in ENDPOINT_KINDS:
                continue
            for w, data in g[v].items():
                if w not in prev and data["bandwidth_Bps"] >= threshold:
                    prev[w] = v
                    queue.append(w)
        if dst in prev:
            hops, v = [], dst
            while v != src:
                hops.append(node.link_index(prev[v], v))
                v = prev[v]
            return tuple(reversed(hops))
    return None


@pytest.mark.parametrize("name", ["pcie-gen4-8gpu", "dgx-h100", "dgx-a100", "gb200-nvl72", "hgx-h200"])
def test_paths_from_shared_searches_equal_one_pair_searches(name):
    # NodeGraph.path answers every destination of a source from the same breadth-first trees (one per bandwidth
    # threshold); each path, its bottlenecks and latency, equals the search for that pair alone, asked in any order.
    t = load_topology(name)
    node = t.node
    ends = node.gpus + node.nics
    pairs = [(a, b) for a in ends for b in ends if a != b]
    pairs = random.Random(3).sample(pairs, min(len(pairs), 600))  # in a random order: the trees are shared
    for a, b in pairs:
        if _one_pair_search(node, a, b) is None:  # e.g. NICs of two trays of a rack: no path, as alone
            with pytest.raises(TopologyError, match=f"no path from {a} to {b}"):
                node.path(a, b)
            continue
        shape = node.path(a, b)
        assert shape.links == _one_pair_search(node, a, b), (a, b)
        links = [node.links[i] for i in shape.links]
        assert shape.bandwidth_Bps == min(lk.bandwidth_Bps for lk in links)
        assert shape.latency_s == sum(lk.latency_s for lk in links)


@pytest.mark.parametrize("name", ["pcie-gen4-8gpu", "dgx-a100", "gb200-nvl72"])
def test_the_networkx_view_of_a_node_is_its_graph(name):
    # Routing reads the node as plain dicts (NodeGraph.vertices, succ); NodeGraph.graph, built on demand for drawings
    # and max flows, has the same vertices, attributes and links in the same order, and the same components.
    import networkx as nx

    from simdist.hardware.node import _components

    node = load_topology(name).node
    g = node.graph
    assert list(g.nodes(data=True)) == list(node.vertices.items())
    assert [(a, b, d["link"]) for a, b, d in g.edges(data=True)] == [
        (a, b, i) for a, out in node.succ.items() for b, i in out.items()]
    assert [g[a][b]["bandwidth_Bps"] for a, b in g.edges()] == [
        node.links[g[a][b]["link"]].bandwidth_Bps for a, b in g.edges()]
    assert sorted(map(sorted, _components(node))) == sorted(map(sorted, nx.weakly_connected_components(g)))
    assert len(_components(node)) == 1
