"""The interactive topology drawing: full view vertex/link counts, summary view at scale, HTML output."""

from __future__ import annotations

import re
from collections import Counter
from itertools import pairwise

import pytest

from simdist.hardware import Topology, load_topology
from simdist.report.topology_html import topology_figure, topology_figure_html


def _traces(fig, role):
    return [t for t in fig.data if t.meta and t.meta["role"] == role]


def _vertex_counts(fig) -> dict[str, int]:
    return {t.meta["kind"]: len(t.x) for t in _traces(fig, "vertex")}


def _link_counts(fig) -> Counter:
    """Undirected links drawn per kind (one hover marker per link)."""
    counts: Counter = Counter()
    for t in _traces(fig, "link_hover"):
        counts[t.meta["kind"]] += len(t.x)
    return counts


def _positions(fig) -> dict[str, list[tuple[float, float]]]:
    return {t.meta["kind"]: list(zip(t.x, t.y, strict=True)) for t in _traces(fig, "vertex")}


def _legend(fig) -> set[str]:
    return {t.name for t in fig.data if t.showlegend is not False}


@pytest.fixture(scope="module")
def dgx2() -> Topology:
    return load_topology("dgx-h100", num_nodes=2)


def test_full_view_has_one_marker_per_vertex(dgx2):
    fig = topology_figure(dgx2)
    expected = Counter(kind for _, kind in dgx2.to_networkx().nodes(data="kind"))
    counts = _vertex_counts(fig)
    assert counts == dict(expected)
    assert counts["gpu"] == 16 and counts["nic"] == 16 and counts["nvswitch"] == 2
    assert counts["leaf_switch"] == dgx2.fabric.num_leaves
    assert counts["spine_switch"] == dgx2.fabric.num_spines


def test_full_view_links_and_legend(dgx2):
    fig = topology_figure(dgx2)
    assert {"nvlink", "pcie", "infiniband", "cpu_interconnect"} <= _legend(fig)
    fabric = dgx2.fabric
    # each undirected link once: 8 NVLinks, 8 GPU + 8 NIC + 4 switch PCIe links, 1 UPI per node
    assert _link_counts(fig) == {
        "nvlink": 16, "pcie": 40, "cpu_interconnect": 2,
        "infiniband": fabric.num_nics + fabric.num_leaves * fabric.num_spines,
    }
    assert sum(_link_counts(fig).values()) == dgx2.to_networkx().number_of_edges() // 2
    nvlink_hover = next(t for t in _traces(fig, "link_hover") if t.meta["kind"] == "nvlink")
    assert all("450 GB/s per direction" in text for text in nvlink_hover.hovertext)
    gpus = next(t for t in _traces(fig, "vertex") if t.meta["kind"] == "gpu")
    assert "n1/gpu7" in gpus.hovertext[-1] and "H100-SXM5-80GB" in gpus.hovertext[-1]


def test_full_view_title(dgx2):
    title = topology_figure(dgx2).layout.title.text
    for part in ("dgx-h100", "16 GPUs = 2 nodes x 8 H100-SXM5-80GB", "NVLink 450 GB/s", "8 x 50 GB/s"):
        assert part in title
    assert "summary" not in title


def test_full_view_layout_separates_vertices_and_nodes(dgx2):
    pos = _positions(topology_figure(dgx2))
    every = [p for points in pos.values() for p in points]
    assert len(set(every)) == len(every)  # no two vertices on the same spot
    gpu_x = [x for x, _ in pos["gpu"]]  # n0/gpu0..7, then n1/gpu0..7
    assert max(gpu_x[:8]) < min(gpu_x[8:])  # nodes side by side
    layers = {kind: {y for _, y in points} for kind, points in pos.items()}
    assert all(len(v) == 1 for v in layers.values())  # one layer per kind
    ys = {kind: layer.pop() for kind, layer in layers.items()}
    assert ys["spine_switch"] > ys["leaf_switch"] > ys["nic"] > ys["cpu"] > ys["gpu"] > ys["nvswitch"]


def test_layout_is_deterministic(dgx2):
    assert _positions(topology_figure(dgx2)) == _positions(topology_figure(load_topology("dgx-h100", num_nodes=2)))


def test_html_is_standalone(dgx2):
    html = topology_figure_html(dgx2)
    assert "<html" in html[:200]
    assert "16 GPUs = 2 nodes x 8 H100-SXM5-80GB" in html
    assert len(html) > 1_000_000 and "plotly" in html.lower()  # the plotly.js bundle is inlined
    assert not re.search(r"<script[^>]*\bsrc=", html)  # nothing fetched from a CDN


def test_pcie_box_has_no_nvlink():
    topo = load_topology("pcie-gen4-8gpu")
    fig = topology_figure(topo)
    kinds = {t.meta["kind"] for t in fig.data}
    assert "nvlink" not in kinds and "nvswitch" not in kinds
    assert _vertex_counts(fig) == topo.vertex_counts
    assert _vertex_counts(fig)["gpu"] == 8 and _vertex_counts(fig)["pcie_switch"] == 4
    assert _legend(fig) >= {"pcie", "cpu_interconnect"}
    assert "no NVLink" in fig.layout.title.text


def test_gb200_rack_draws_all_gpus_grouped_by_host():
    topo = load_topology("gb200-nvl72")
    fig = topology_figure(topo)
    assert _vertex_counts(fig) == {"gpu": 72, "nic": 72, "cpu": 36, "nvswitch": 1}
    gpus = next(t for t in _traces(fig, "vertex") if t.meta["kind"] == "gpu")
    xs = list(gpus.x)
    assert len(set(xs)) == 72
    # GPUs of host h (4 per tray) are contiguous and left of host h + 1's
    by_host = [xs[4 * h: 4 * h + 4] for h in range(18)]
    assert all(max(a) < min(b) for a, b in pairwise(by_host))
    host_frames = [s for s in fig.layout.shapes if s.line.dash == "dot"]
    assert len(host_frames) == 18


def test_summary_view_at_16k_gpus_does_not_materialise(monkeypatch):
    topo = load_topology("dgx-h100", num_nodes=2048)

    def forbidden(*args, **kwargs):
        raise AssertionError("the summary view must not materialise the cluster")

    monkeypatch.setattr(Topology, "to_networkx", forbidden)
    monkeypatch.setattr(Topology, "links", forbidden)
    fig = topology_figure(topo)
    title = fig.layout.title.text
    assert "summary view" in title and "16,384 GPUs" in title and "2,048 nodes" in title
    counts = _vertex_counts(fig)
    assert counts["gpu"] == 8 and counts["nic"] == 8  # node 0 in detail
    assert counts["leaf_switch"] == counts["spine_switch"] == counts["nodes"] == 1  # aggregate blocks
    labels = {text for t in _traces(fig, "vertex") for text in t.text if text}
    assert {"512 leaf switches", "32 spine switches", "2,047 more nodes<br>like node 0"} <= labels
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert "512 x 32 = 16,384 links x 50 GB/s" in notes and "16,376 NIC links x 50 GB/s" in notes
    assert "summary view" in topology_figure_html(topo)


def test_max_drawn_gpus_switches_views(dgx2):
    assert "summary view" in topology_figure(dgx2, max_drawn_gpus=8).layout.title.text
    assert _vertex_counts(topology_figure(dgx2, max_drawn_gpus=16))["gpu"] == 16
    # a single node is always drawn in full: it is its own representative
    single = topology_figure(load_topology("gb200-nvl72"), max_drawn_gpus=8)
    assert _vertex_counts(single)["gpu"] == 72 and "summary" not in single.layout.title.text
