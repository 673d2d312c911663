"""Each hardware fact in one place: link-id layout, leaf formula, ECMP hash (ints and arrays alike), and the memo
tables a topology owns. Tiny hand-checkable topologies; hypothesis for the scalar == vector invariants."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.collectives.group import Group
from simdist.hardware import load_topology
from simdist.hardware.batch import fabric_hops, routes
from simdist.hardware.fabric import fmix64
from simdist.hardware.layout import NIC, NODE, SPINE
from simdist.hardware.memo import Memo, nbytes_of

# 3 nodes x 2 GPUs, one CPU socket, no PCIe switch, 2 NICs per node on a fat tree of 4-port leaves:
# per node the directed links are gpu0<->cpu (0, 1), gpu1<->cpu (2, 3), nic0<->cpu (4, 5), nic1<->cpu (6, 7);
# down_ports = floor(4 x 1 / 2) = 2 NICs per leaf -> 3 leaves, ceil(2 / 1) = 2 spines.
TINY = """
name: tiny
gpu: h100-sxm
num_nodes: 3
gpus_per_node: 2
host: {cpu_sockets: 1, pcie_switches_per_socket: 0, pcie: {generation: 4}}
inter_node: {kind: infiniband, nics_per_node: 2, nic_bandwidth: 100 Gb/s, fabric: FABRIC, switch_radix: 4}
"""


def tiny(tmp_path: Path, fabric: str = "fat_tree", num_nodes: int = 3):
    path = tmp_path / f"tiny-{fabric}.yaml"
    path.write_text(TINY.replace("FABRIC", fabric), encoding="utf-8")
    return load_topology(str(path), num_nodes=num_nodes)


# ----------------------------------------------------------------------------- the ECMP hash
def test_fmix64_reproduces_murmurhash3_and_the_values_it_gave_before():
    # MurmurHash3's fmix64 (0 is its fixed point); the others are what simdist's scalar hash returned before the
    # scalar and vector versions became one function: spines picked in saved results stay the same
    pinned = {0: 0x0, 1: 0xB456BCFC34C2CB2C, (3 << 32) | 17: 0x7A5F84BE5EB20859,
              (1 << 64) - 1: 0x64B5720B4B825F21, 0x0123456789ABCDEF: 0x87CBFBFE89022CEA}
    assert {k: fmix64(k) for k in pinned} == pinned
    keys = np.array(list(pinned), dtype=np.uint64)
    assert fmix64(keys).tolist() == list(pinned.values())
    assert keys.tolist() == list(pinned)  # the input array is not modified


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, (1 << 64) - 1), min_size=1, max_size=50))
def test_fmix64_on_an_array_equals_it_on_each_int(keys):
    out = fmix64(np.array(keys, dtype=np.uint64))
    assert out.dtype == np.uint64
    assert out.tolist() == [fmix64(k) for k in keys]
    assert [fmix64(np.uint64(k)) for k in keys] == out.tolist()  # numpy scalars as ints


def test_spine_for_and_leaf_of_pinned_on_dgx_h100_300_nodes():
    # rail-optimized: 32 nodes per rail group, 8 rails -> 80 leaves, 32 spines; values as before the refactor
    f = load_topology("dgx-h100", num_nodes=300).fabric
    pairs = [(0, 8), (8, 2392), (17, 1000), (2399, 3)]
    assert [f.spine_for(a, b) for a, b in pairs] == [7, 25, 20, 17]
    nics = [0, 8, 17, 1000, 2392, 2399]
    assert [f.leaf_of(n) for n in nics] == [0, 0, 1, 24, 72, 79]
    assert f.leaf_of(np.array(nics)).tolist() == [0, 0, 1, 24, 72, 79]


@settings(max_examples=60, deadline=None)
@given(shape=st.sampled_from(["fat_tree", "rail_optimized"]), nodes=st.integers(2, 400),
       radix=st.sampled_from([4, 8, 16, 64]), seed=st.integers(0, 2**32 - 1))
def test_leaf_and_spine_on_arrays_equal_them_on_ints(shape, nodes, radix, seed):
    t = load_topology("dgx-h100", num_nodes=nodes,
                      assignments=[f"inter_node.fabric={shape}", f"inter_node.switch_radix={radix}"])
    f = t.fabric
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, f.num_nics, 64), rng.integers(0, f.num_nics, 64)
    leaves = f.leaf_of(src)
    assert leaves.tolist() == [f.leaf_of(int(n)) for n in src]
    assert (leaves >= 0).all() and (leaves < f.num_leaves).all()
    assert f.leaf_of_all().tolist() == [f.leaf_of(n) for n in range(f.num_nics)]
    if f.num_spines:
        spines = f.spine_for(src, dst)
        assert spines.dtype == np.int64
        assert spines.tolist() == [f.spine_for(int(a), int(b)) for a, b in zip(src, dst, strict=True)]
        assert f.spine_for(int(src[0]), dst).tolist() == [f.spine_for(int(src[0]), int(b)) for b in dst]


# ----------------------------------------------------------------------------- the link-id layout
def test_tiny_fat_tree_layout_by_hand(tmp_path):
    t = tiny(tmp_path)
    f, lay = t.fabric, t.layout
    assert (t.node.num_links, f.down_ports, f.num_leaves, f.num_spines) == (8, 2, 3, 2)
    assert (lay.node_links_end, lay.nic_links_end, lay.num_links) == (24, 36, 48)
    assert t.num_links == 48 and t.num_node_links == 24
    assert lay.node_link(2, 5) == 21 and lay.nic_up(4) == 32 and lay.nic_down(4) == 33
    assert lay.spine_up(2, 1) == 36 + 2 * 5 and lay.spine_down(2, 1) == 36 + 2 * 5 + 1
    assert (t.link(21).src, t.link(21).dst) == ("n2/h0/cpu0", "n2/nic0")
    assert (t.link(32).src, t.link(32).dst) == ("n2/nic0", "leaf2")
    assert (t.link(33).src, t.link(33).dst) == ("leaf2", "n2/nic0")
    assert (t.link(46).src, t.link(46).dst) == ("leaf2", "spine1")
    assert (t.link(47).src, t.link(47).dst) == ("spine1", "leaf2")
    # GPU 0 (node 0, NIC 0, leaf 0) to GPU 5 (node 2, GPU 1, NIC 1 -> global NIC 5, leaf 2)
    spine = fmix64((0 << 32) | 5) % 2
    assert t.route(0, 5).links == (0, 5, 24, 36 + 2 * spine, 36 + 2 * (4 + spine) + 1, 35, 22, 19)
    # GPU 1 (node 0, NIC 1, leaf 0) to GPU 2 (node 1, NIC 0 -> global NIC 2, leaf 1)
    assert t.route(1, 2).links == (2, 7, 26, 36 + 2 * (0 * 2 + fmix64((1 << 32) | 2) % 2),
                                   36 + 2 * (1 * 2 + fmix64((1 << 32) | 2) % 2) + 1, 29, 12, 9)


@pytest.mark.parametrize("fabric", ["fat_tree", "rail_optimized"])
def test_every_link_id_round_trips_and_has_one_capacity(tmp_path, fabric):
    t = tiny(tmp_path, fabric, num_nodes=5)
    lay = t.layout
    ids = np.arange(lay.num_links)
    classes = lay.link_classes(ids)
    for link in range(lay.num_links):
        cls, a, b, down = lay.locate(link)
        assert cls == classes[link]
        if cls == NODE:
            assert lay.node_link(a, b) == link and down == 0
        elif cls == NIC:
            assert (lay.nic_down(a) if down else lay.nic_up(a)) == link
        else:
            assert cls == SPINE and (lay.spine_down(a, b) if down else lay.spine_up(a, b)) == link
    expected = [t.link(i).effective_bandwidth_Bps for i in range(lay.num_links)]
    assert [lay.capacity_Bps(i) for i in range(lay.num_links)] == expected
    assert lay.capacities_Bps(ids).tolist() == expected
    assert lay.num_nic_links == 2 * t.fabric.num_nics
    assert lay.num_spine_links == 2 * t.fabric.num_leaves * t.fabric.num_spines
    for bad in (-1, lay.num_links):
        with pytest.raises(IndexError):
            lay.capacity_Bps(bad)
        with pytest.raises(IndexError):
            lay.capacities_Bps(np.array([0, bad]))
        with pytest.raises(IndexError):
            t.link(bad)


@pytest.mark.parametrize("fabric", ["fat_tree", "rail_optimized"])
def test_fabric_hops_are_the_spine_links_of_the_routes(tmp_path, fabric):
    t = tiny(tmp_path, fabric, num_nodes=7)
    rng = np.random.default_rng(3)
    src, dst = rng.integers(0, t.num_gpus, 500), rng.integers(0, t.num_gpus, 500)
    up, down = fabric_hops(t, src, dst)
    batch = routes(t, src, dst)
    for i in range(len(src)):
        spine_links = [x for x in batch.route(i).links if x >= t.layout.nic_links_end]
        assert spine_links == ([] if up[i] < 0 else [up[i], down[i]])


# ----------------------------------------------------------------------------- memo tables
def test_memo_evicts_least_recently_used_past_either_bound():
    memo: Memo[int, bytes] = Memo("test", max_entries=3, max_bytes=10_000)
    for k in range(3):
        memo.put(k, b"x" * 1000)
    assert memo.get(0) == b"x" * 1000  # 0 is now the most recent: 1 leaves first
    memo.put(3, b"y")
    assert memo.get(1) is None and [memo.get(k) is not None for k in (0, 2, 3)] == [True] * 3
    assert len(memo) == 3
    # now 0, 2, 3 from least to most recent; a 4th entry passes the entry bound (0 leaves), and its 9,000 bytes
    # pass the byte bound (2 leaves too)
    memo.put(4, b"z" * 9000)
    assert memo.get(0) is None and memo.get(2) is None and memo.get(3) == b"y" and memo.get(4) is not None
    assert memo.nbytes <= 10_000
    big = b"w" * 20_000
    assert memo.put(5, big) is big and memo.get(5) is None  # larger than the bound alone: returned, not kept
    memo.put(4, b"v")  # replacing an entry re-charges it
    assert memo.nbytes == nbytes_of(3) + nbytes_of(b"y") + nbytes_of(4) + nbytes_of(b"v") and len(memo) == 2
    clone = pickle.loads(pickle.dumps(memo))
    assert (len(clone), clone.max_entries, clone.max_bytes) == (0, 3, 10_000)


def test_nbytes_of_counts_arrays_exactly_and_estimates_tuples():
    assert nbytes_of(np.zeros(1000)) == 8000
    assert nbytes_of(b"abc") == 3
    small = nbytes_of(tuple(range(10)))
    assert small > 10 * 8
    assert nbytes_of(tuple(range(10_000))) == pytest.approx(1000 * small, rel=0.2)


def test_collective_memos_belong_to_the_topology(tmp_path):
    a, b = tiny(tmp_path), tiny(tmp_path)  # same spec, two topologies: nothing is shared between them
    ranks = (0, 2, 4, 1, 3, 5)
    g1, g2 = Group(a, ranks), Group(a, ranks).priced({"net": 1e-6})
    assert g1.ring_orders(2) == g2.ring_orders(2) and len(a.ring_orders) == 1 and len(b.ring_orders) == 0
    assert g1.by_node() == {0: [0, 3], 1: [1, 4], 2: [2, 5]} and len(a.placements) == 1
    src, dst = np.array([0, 1, 2]), np.array([1, 2, 0])  # GPUs 0 -> 2 -> 4 -> 0: across nodes
    p1, p2 = g1.paths(src, dst), g2.paths(src, dst)
    assert len(a.route_batches) == 1 and p1.links is p2.links
    assert p2.latency_s.tolist() == (p1.latency_s + 1e-6).tolist()  # the protocol extra on the shared batch
    assert p1.link_index()[0] is p2.link_index()[0]  # distinct links found once per batch
    assert p1.distinct_capacities_Bps(a.layout).tolist() == [a.link(int(x)).effective_bandwidth_Bps
                                                             for x in p1.link_index()[0]]
    assert Group(b, ranks).paths(src, dst).links is not p1.links
    assert [p1.route(i) for i in range(3)] == [g1.path(int(s), int(d)) for s, d in zip(src, dst, strict=True)]
