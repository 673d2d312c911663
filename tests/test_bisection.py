"""Bisection bandwidth: hand-computed figures, and the closed form against networkx max flow."""

import networkx as nx
import pytest

from simdist.hardware import bisection, load_topology


def _fabric(preset, nodes, shape, radix, oversubscription):
    return load_topology(
        preset,
        num_nodes=nodes,
        assignments=[f"inter_node.fabric={shape}", f"inter_node.switch_radix={radix}",
                     f"inter_node.oversubscription={oversubscription}"],
    )


def max_flow_between_halves(t):
    """Max flow from the GPUs of nodes [0, N/2) to those of [N/2, N) on the materialised graph.

    Hosts do not forward traffic between their NICs: first-half NICs only send into the fabric,
    second-half NICs only receive from it.
    """
    g = t.to_networkx()
    half = t.num_nodes // 2
    flow = nx.DiGraph()
    for u, v, data in g.edges(data=True):
        if u.startswith("leaf") and "/nic" in v and int(v[1:].split("/")[0]) < half:
            continue
        if v.startswith("leaf") and "/nic" in u and int(u[1:].split("/")[0]) >= half:
            continue
        flow.add_edge(u, v, capacity=data["bandwidth_Bps"])
    for rank in range(t.num_gpus):
        node, gpu = t.locate(rank)
        if node < half:
            flow.add_edge("_s", f"n{node}/gpu{gpu}")
        else:
            flow.add_edge(f"n{node}/gpu{gpu}", "_t")
    return nx.maximum_flow_value(flow, "_s", "_t")


def test_single_node_nvswitch():
    # 4 GPUs x 450 GB/s through the NVSwitch, plus the PCIe path across the sockets (22 GB/s UPI).
    assert bisection(load_topology("dgx-h100")).bandwidth_Bps == pytest.approx(4 * 450e9 + 22e9)


def test_single_node_pcie_box_is_limited_by_the_socket_link():
    assert bisection(load_topology("pcie-gen4-8gpu")).bandwidth_Bps == pytest.approx(16e9)


def test_nvl72_rack():
    # trays are joined only by the NVLink switches: 36 GPUs x 900 GB/s cross the cut
    assert bisection(load_topology("gb200-nvl72")).bandwidth_Bps == pytest.approx(36 * 900e9)


def test_nonblocking_fat_tree_is_half_the_injection():
    t = _fabric("dgx-h100", 8, "fat_tree", 16, 1)
    assert bisection(t).bandwidth_Bps == pytest.approx(4 * 8 * 50e9)


def test_oversubscribed_fat_tree_by_hand():
    # radix 16, o = 3: 12 NICs per leaf, 6 leaves for 64 NICs, 4 spines, 200 GB/s up per leaf.
    # leaves 0-1 hold first-half NICs only (up 200 each), leaf 2 holds 8 first-half and 4 second-half
    # NICs (4 x 50 direct, 4 x 50 up), leaves 3-5 second-half only (200 down each).
    t = _fabric("dgx-h100", 8, "fat_tree", 16, 3)
    assert (t.fabric.down_ports, t.fabric.num_leaves, t.fabric.num_spines) == (12, 6, 4)
    assert bisection(t).bandwidth_Bps == pytest.approx(200e9 + 600e9)
    assert bisection(t).bandwidth_Bps < bisection(_fabric("dgx-h100", 8, "fat_tree", 16, 1)).bandwidth_Bps


@pytest.mark.parametrize(
    ("preset", "nodes", "shape", "radix", "o"),
    [
        ("dgx-h100", 2, "rail_optimized", 64, 1),
        ("dgx-h100", 6, "fat_tree", 16, 1),
        ("dgx-h100", 5, "fat_tree", 16, 2),
        ("dgx-h100", 8, "fat_tree", 16, 3),
        ("dgx-h100", 6, "rail_optimized", 8, 1),
        ("dgx-h100", 7, "rail_optimized", 8, 3),
        ("dgx-a100", 4, "fat_tree", 12, 2.5),
        ("pcie-gen4-8gpu", 6, "fat_tree", 6, 2),
        ("pcie-gen5-8gpu", 4, "rail_optimized", 4, 1),
    ],
)
def test_closed_form_equals_max_flow(preset, nodes, shape, radix, o):
    t = _fabric(preset, nodes, shape, radix, o)
    assert bisection(t).bandwidth_Bps == pytest.approx(max_flow_between_halves(t), rel=1e-9)


def test_pcie_limited_nic_injection_counts():
    # 800 Gb/s NICs (100 GB/s) behind PCIe Gen4 x16 links (31.5 GB/s): the PCIe link limits injection.
    t = load_topology("pcie-gen4-8gpu", num_nodes=2, assignments=["inter_node.nic_bandwidth=800 Gb/s"])
    assert bisection(t).bandwidth_Bps == pytest.approx(max_flow_between_halves(t), rel=1e-9)
    assert bisection(t).bandwidth_Bps < 4 * 100e9
