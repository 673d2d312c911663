"""Interactive plotly drawing of a topology (`topology_figure`, `topology_figure_html`).

Two views:
- full (``num_gpus <= max_drawn_gpus`` or a single node): every vertex and link of
  ``Topology.to_networkx()`` in a layered layout. Top to bottom: spine switches, leaf switches, then
  per node NICs, CPUs, PCIe switches, GPUs and the NVSwitch (one wide box under the node's GPUs).
  Nodes sit side by side; inside a node, vertices are grouped by host (GPUs and NICs under the PCIe
  switch or CPU they hang off), hosts framed when a node has several (GB200 NVL72 trays).
- summary (larger clusters): node 0 in detail, and the other nodes, the leaf and the spine switches as
  one block each, joined by aggregate links labelled "count x bandwidth". Nothing per node or per
  NIC is materialised, so 16,384 GPUs draw in milliseconds.

The layout is arithmetic on sorted vertex names, hence deterministic.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import networkx as nx
import plotly.graph_objects as go

from simdist.hardware.topology import Topology
from simdist.units import format_bandwidth

LAYER_Y = {"core_switch": 8.7, "spine_switch": 7.2, "leaf_switch": 5.7, "nic": 4.0, "cpu": 3.0, "pcie_switch": 2.0,
           "gpu": 1.0, "nvswitch": 0.0, "nodes": 2.5}
# kind -> (legend label, marker symbol, colour, size)
VERTEX_STYLE = {
    "core_switch": ("core switch", "star", "#450a0a", 16),
    "spine_switch": ("spine switch", "pentagon", "#7f1d1d", 16),
    "leaf_switch": ("leaf switch", "triangle-down", "#d62728", 15),
    "nic": ("NIC", "diamond", "#ff7f0e", 12),
    "cpu": ("CPU", "hexagon", "#9467bd", 15),
    "pcie_switch": ("PCIe switch", "triangle-up", "#1f77b4", 13),
    "gpu": ("GPU", "square", "#2ca02c", 14),
    "nvswitch": ("NVSwitch", "square", "#3b5e1b", 12),
    "nodes": ("other nodes", "square", "#7f7f7f", 40),
}
TEXT_POSITION = {"core_switch": "middle right",
                 "spine_switch": "middle right", "leaf_switch": "middle right", "nvswitch": "middle right"}
LINK_COLOR = {"nvlink": "#76b900", "pcie": "#1f77b4", "cpu_interconnect": "#9467bd",
              "infiniband": "#d62728", "roce": "#ff7f0e", "ethernet": "#8c564b"}
HOST_GAP, NODE_GAP = 0.8, 2.0  # in GPU slots
# Drawing only: the plot area is about PLOT_PX pixels wide (a 1600 px window less the legend); used only
# to size markers and drop text labels that would overlap (LABEL_PX apart at least).
PLOT_PX, LABEL_PX, RIGHT_MARGIN_PX = 1250.0, 45.0, 110.0


def _natural(name: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


@dataclass(frozen=True, slots=True)
class _NodeLayout:
    pos: dict[str, tuple[float, float]]  # local vertex name -> (x, y)
    width: float  # in GPU slots; slot centres are 0, 1, ...
    hosts: list[tuple[int, float, float]]  # (host, left x, right x)


def _node_layout(g: nx.DiGraph) -> _NodeLayout:
    """Lay out one node graph: each host gets max(GPUs, NICs, attach points) slots, split evenly
    between its attach points (PCIe switches, else CPUs); GPUs and NICs spread under theirs."""
    kind = dict(g.nodes(data="kind"))
    pos: dict[str, tuple[float, float]] = {}
    hosts: list[tuple[int, float, float]] = []
    left = -0.5
    for h in sorted({d["host"] for _, d in g.nodes(data=True) if "host" in d}):
        members = sorted((v for v, d in g.nodes(data=True) if d.get("host") == h), key=_natural)
        cpus = [v for v in members if kind[v] == "cpu"]
        attach = [v for v in members if kind[v] == "pcie_switch"] or cpus
        under = {a: {k: [w for w in sorted(g.successors(a), key=_natural) if kind[w] == k]
                     for k in ("gpu", "nic")} for a in attach}
        width = max(len(attach), *(sum(len(u[k]) for u in under.values()) for k in ("gpu", "nic")))
        span = width / len(attach)
        for i, a in enumerate(attach):
            a_left = left + i * span
            pos[a] = (a_left + span / 2, LAYER_Y[kind[a]])
            for k, items in under[a].items():
                for j, v in enumerate(items):
                    pos[v] = (a_left + (j + 0.5) * span / len(items), LAYER_Y[k])
        for c in cpus:
            if c not in pos:  # a CPU above PCIe switches sits over the middle of its switches
                xs = [pos[s][0] for s in attach if g.has_edge(s, c)] or [left + width / 2]
                pos[c] = (sum(xs) / len(xs), LAYER_Y["cpu"])
        hosts.append((h, left, left + width))
        left += width + HOST_GAP
    width = left - HOST_GAP + 0.5
    for v in sorted(g, key=_natural):  # host-less vertices (the NVSwitch) sit under the node's middle
        pos.setdefault(v, (width / 2 - 0.5, LAYER_Y.get(kind[v], 0.0)))
    return _NodeLayout(pos, width, hosts)


def _spread(count: int, width: float) -> list[float]:
    """``count`` x positions evenly over the slot range [-0.5, width - 0.5]."""
    return [(i + 0.5) * width / count - 0.5 for i in range(count)]


def _headline(topology: Topology) -> str:
    spec, n = topology.spec, topology.num_nodes
    text = (f"{topology.num_gpus:,} GPUs = {n:,} node{'s' if n > 1 else ''} x {spec.gpus_per_node} "
            f"{topology.gpu.name}")
    text += f", NVLink {format_bandwidth(spec.scale_up.bandwidth)}" if spec.scale_up else ", no NVLink"
    inter = spec.inter_node
    if inter is not None and inter.nics_per_node:
        nic = format_bandwidth(inter.nic_bandwidth)
        text += f", {inter.nics_per_node} x {nic} {inter.kind} NICs per node"
    return text


def _vertex_hover(topology: Topology, name: str, data: dict) -> str:
    kind = data["kind"]
    lines = [f"<b>{name}</b>", f"kind: {kind}"]
    if kind == "gpu":
        lines.append(f"model: {topology.gpu.name}")
    if "host" in data:
        lines.append(f"host {data['host']}" + (f", socket {data['socket']}" if "socket" in data else ""))
    if kind == "nvswitch":
        nvls = "yes" if data.get("nvls") else "no"
        lines.append(f"{data.get('num_switches', '?')} NVSwitch chips, NVLS {nvls}")
    if "count" in data:
        lines.append(data["note"])
    return "<br>".join(lines)


# What a view draws: graph, vertex positions, the node layout, drawing width in slots.
_Drawn = tuple[nx.DiGraph, dict[str, tuple[float, float]], _NodeLayout, float]


def _full_graph(topology: Topology) -> _Drawn:
    g = topology.to_networkx()
    local = _node_layout(topology.node.graph)
    pitch = local.width + NODE_GAP
    pos: dict[str, tuple[float, float]] = {}
    for v, node in g.nodes(data="node"):
        if node is not None:
            x, y = local.pos[v.split("/", 1)[1]]
            pos[v] = (x + node * pitch, y)
    width = topology.num_nodes * pitch - NODE_GAP
    fabric = topology.fabric
    if fabric is not None:
        for prefix, count in (("leaf", fabric.num_leaves), ("spine", fabric.num_spines * fabric.num_pods),
                              ("core", fabric.num_cores)):
            for i, x in enumerate(_spread(count, width)):
                pos[f"{prefix}{i}"] = (x, LAYER_Y[f"{prefix}_switch"])
    return g, pos, local, width


def _summary_graph(topology: Topology) -> _Drawn:
    """Node 0 in detail plus aggregate blocks; O(one node), whatever the cluster size."""
    fabric = topology.fabric
    assert fabric is not None
    local = _node_layout(topology.node.graph)
    g = nx.DiGraph()
    pos: dict[str, tuple[float, float]] = {}
    for v, data in topology.node.graph.nodes(data=True):
        g.add_node(f"n0/{v}", node=0, **data)
        pos[f"n0/{v}"] = local.pos[v]
    for a, b, data in topology.node.graph.edges(data=True):
        g.add_edge(f"n0/{a}", f"n0/{b}", **data)
    rest, nic_bw, up_bw = topology.num_nodes - 1, fabric.nic_bandwidth_Bps, fabric.uplink_bandwidth_Bps
    x_rest = local.width + NODE_GAP + 2
    x_fab = (local.width - 1 + x_rest) / 2
    g.add_node("nodes", kind="nodes", count=rest, label=f"{rest:,} more node{'s' * (rest > 1)}<br>like node 0",
               note=f"nodes 1-{rest}, each as node 0")
    g.add_node("leaves", kind="leaf_switch", count=fabric.num_leaves,
               label=f"{fabric.num_leaves:,} leaf switches",
               note=f"{fabric.shape}, {fabric.down_ports} NIC ports per leaf")
    pos["nodes"], pos["leaves"] = (x_rest, LAYER_Y["nodes"]), (x_fab, LAYER_Y["leaf_switch"])
    for i, nic in enumerate(topology.node.nics):
        g.add_edge(f"n0/{nic}", "leaves", kind=fabric.kind, bandwidth_Bps=nic_bw,
                   note=f"to leaf{fabric.leaf_of(i)}")
    n_links = rest * fabric.nics_per_node
    g.add_edge("nodes", "leaves", kind=fabric.kind, bandwidth_Bps=nic_bw, count=n_links,
               note=f"{n_links:,} NIC links x {format_bandwidth(nic_bw)}")
    if fabric.num_spines:
        pods = fabric.num_pods
        unit = "plane" if fabric.planes > 1 else "pod"  # a plane is a pod without a core (simdist.hardware.fabric)
        g.add_node("spines", kind="spine_switch", count=fabric.num_spines * pods,
                   label=f"{fabric.num_spines * pods:,} spine switches" + (f" in {pods:,} {unit}s" if pods > 1 else ""),
                   note="every leaf has one link to every spine" + (f" of its {unit}" if pods > 1 else ""))
        pos["spines"] = (x_fab, LAYER_Y["spine_switch"])
        n_up = fabric.num_leaves * fabric.num_spines
        g.add_edge("leaves", "spines", kind=fabric.kind, bandwidth_Bps=up_bw, count=n_up,
                   note=f"{fabric.num_leaves:,} x {fabric.num_spines:,} = {n_up:,} links "
                        f"x {format_bandwidth(up_bw)}")
    if fabric.cores_per_group:
        core_bw, n_core = fabric.core_bandwidth_Bps, fabric.num_pods * fabric.num_spines * fabric.cores_per_group
        g.add_node("cores", kind="core_switch", count=fabric.num_cores, label=f"{fabric.num_cores:,} core switches",
                   note=f"spine s of every pod to the {fabric.cores_per_group:,} cores of group s")
        pos["cores"] = (x_fab, LAYER_Y["core_switch"])
        g.add_edge("spines", "cores", kind=fabric.kind, bandwidth_Bps=core_bw, count=n_core,
                   note=f"{n_core:,} links x {format_bandwidth(core_bw)}")
    return g, pos, local, x_rest + 1


def _add_edges(fig: go.Figure, g: nx.DiGraph, pos: dict[str, tuple[float, float]], notes: list[dict]) -> None:
    """One line trace per link kind (legend entry) plus invisible-ish midpoint markers for hover;
    aggregate links (``count``) get a thick trace and a text annotation."""
    groups: dict[tuple[str, bool], tuple[list, list, list, list, list]] = {}
    for u, v, data in g.edges(data=True):
        if g.has_edge(v, u) and (v, u) < (u, v):
            continue  # each undirected pair once
        (x0, y0), (x1, y1) = pos[u], pos[v]
        if g.nodes[u]["kind"] == "nvswitch":
            x0 = x1  # NVLinks drop straight down onto the NVSwitch box
        if g.nodes[v]["kind"] == "nvswitch":
            x1 = x0
        bw, back = data["bandwidth_Bps"], g.edges[v, u]["bandwidth_Bps"] if g.has_edge(v, u) else None
        rate = format_bandwidth(bw) + (f" / {format_bandwidth(back)} back" if back not in (None, bw) else "")
        hover = f"<b>{data['kind']}</b><br>{u} ↔ {v}<br>{rate} per direction"
        if "note" in data:
            hover += f"<br>{data['note']}"
        xs, ys, mx, my, text = groups.setdefault((data["kind"], "count" in data), ([], [], [], [], []))
        xs += [x0, x1, None]
        ys += [y0, y1, None]
        mx.append((x0 + x1) / 2)
        my.append((y0 + y1) / 2)
        text.append(hover)
        if "count" in data:
            notes.append({"x": (x0 + x1) / 2, "y": (y0 + y1) / 2, "text": data["note"], "showarrow": False,
                          "bgcolor": "rgba(255,255,255,0.85)", "font": {"size": 11}})
    shown: set[str] = set()
    for (kind, aggregate), (xs, ys, mx, my, text) in sorted(groups.items()):
        color = LINK_COLOR.get(kind, "#555555")
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", name=kind, legendgroup=kind, showlegend=kind not in shown,
            line={"color": color, "width": 6 if aggregate else 1.3}, opacity=0.8 if aggregate else 0.55,
            hoverinfo="skip", meta={"role": "link", "kind": kind}))
        fig.add_trace(go.Scatter(
            x=mx, y=my, mode="markers", name=f"{kind} (hover)", legendgroup=kind, showlegend=False,
            marker={"color": color, "size": 6, "opacity": 0.25}, hovertext=text, hoverinfo="text",
            meta={"role": "link_hover", "kind": kind}))
        shown.add(kind)


def _add_vertices(fig: go.Figure, topology: Topology, g: nx.DiGraph, pos: dict[str, tuple[float, float]],
                  px: float) -> None:
    """One marker trace per vertex kind. ``px`` (screen pixels per GPU slot, approximate) shrinks
    markers that would overlap and drops text labels that would collide; hover always works."""
    by_kind: dict[str, list[str]] = {}
    for v in sorted(g, key=_natural):
        by_kind.setdefault(g.nodes[v]["kind"], []).append(v)
    for kind in sorted(by_kind, key=lambda k: -LAYER_Y.get(k, 0.0)):
        names = by_kind[kind]
        label, symbol, color, size = VERTEX_STYLE.get(kind, (kind, "circle", "#555555", 12))
        xs = [pos[v][0] for v in names]
        gap_px = px * (max(xs) - min(xs)) / (len(names) - 1) if len(names) > 1 else float("inf")
        texts = [g.nodes[v].get("label", "") for v in names]  # aggregate blocks carry their own
        if kind == "nvswitch" and gap_px >= 110:
            texts = [f"NVSwitch x{g.nodes[v].get('num_switches', 1)}" for v in names]
        elif not any(texts) and gap_px >= LABEL_PX:
            texts = [v.rsplit("/", 1)[-1] for v in names]
        if not any("count" in g.nodes[v] for v in names):
            size = max(5.0, min(size, 0.8 * gap_px))
        fig.add_trace(go.Scatter(
            x=xs, y=[pos[v][1] for v in names], mode="markers+text", text=texts,
            name=f"{label} ({topology.gpu.name})" if kind == "gpu" else label,
            textposition=TEXT_POSITION.get(kind, "bottom center"), textfont={"size": 10},
            hovertext=[_vertex_hover(topology, v, g.nodes[v]) for v in names], hoverinfo="text",
            marker={"symbol": symbol, "color": color, "size": size, "line": {"color": "white", "width": 1}},
            meta={"role": "vertex", "kind": kind}))


def _frames(topology: Topology, local: _NodeLayout, nodes: int, px: float) -> tuple[list[dict], list[dict]]:
    """Shapes and annotations: node frames and labels, NVSwitch boxes, host frames (several hosts)."""
    pitch, shapes, notes = local.width + NODE_GAP, [], []
    nvswitch_line = {"color": VERTEX_STYLE["nvswitch"][2]}
    every = math.ceil(30 / (pitch * px))  # label every node when there is room, else every k-th
    for n in range(nodes):
        x0 = n * pitch - 0.5
        shapes.append({"type": "rect", "x0": x0 - 0.3, "x1": x0 + local.width + 0.3, "y0": -0.55, "y1": 4.55,
                       "layer": "below", "line": {"color": "#bbbbbb", "width": 1},
                       "fillcolor": "rgba(0,0,0,0.02)"})
        if n % every == 0:
            text = f"<b>node {n}</b>" if pitch * px >= 60 else f"n{n}"
            notes.append({"x": x0 + local.width / 2, "y": -0.75, "text": text, "showarrow": False})
        if "nvswitch" in topology.node.graph:
            shapes.append({"type": "rect", "x0": x0, "x1": x0 + local.width, "y0": -0.18, "y1": 0.18,
                           "layer": "below", "line": nvswitch_line, "fillcolor": "rgba(118,185,0,0.25)"})
        for h, left, right in local.hosts if len(local.hosts) > 1 else ():
            shapes.append({"type": "rect", "x0": n * pitch + left - 0.1, "x1": n * pitch + right + 0.1,
                           "y0": 0.45, "y1": 4.45, "layer": "below",
                           "line": {"color": "#c8c8dc", "width": 1, "dash": "dot"}})
            host_px = (right - left) * px
            if host_px >= 18:
                notes.append({"x": n * pitch + (left + right) / 2, "y": 4.45, "showarrow": False,
                              "text": f"host {h}" if host_px >= 40 else f"h{h}", "yanchor": "bottom",
                              "font": {"size": 9, "color": "#666666"}})
    return shapes, notes


def topology_figure(topology: Topology, max_drawn_gpus: int = 256) -> go.Figure:
    """A plotly figure of ``topology``: every vertex and link when it has at most ``max_drawn_gpus``
    GPUs (or one node), else a summary view (node 0 in detail, the rest as aggregate blocks)."""
    full = topology.num_gpus <= max_drawn_gpus or topology.fabric is None
    g, pos, local, width = _full_graph(topology) if full else _summary_graph(topology)
    x_lo, x_hi = -1.2, width + 0.2
    px = (PLOT_PX - RIGHT_MARGIN_PX) / (x_hi - x_lo)
    top = max(y for _, y in pos.values()) + 0.8
    fig = go.Figure()
    shapes, notes = _frames(topology, local, topology.num_nodes if full else 1, px)
    _add_edges(fig, g, pos, notes)
    _add_vertices(fig, topology, g, pos, px)
    name, subtitle = topology.spec.name, topology.spec.description
    if not full:
        subtitle = (f"<b>summary view</b>: {topology.num_gpus:,} GPUs is more than max_drawn_gpus="
                    f"{max_drawn_gpus}, so node 0 is drawn in detail and the other "
                    f"{topology.num_nodes - 1:,} nodes and the switches as aggregate blocks")
    fig.update_layout(
        template="plotly_white", height=int(140 + 75 * (top + 1)), hovermode="closest",
        margin={"l": 20, "r": 20, "t": 90, "b": 20}, legend={"itemsizing": "constant"},
        title={"text": f"<b>{name}</b>: {_headline(topology)}<br><sup>{subtitle}</sup>", "x": 0.01},
        xaxis={"visible": False, "range": [x_lo, x_hi + RIGHT_MARGIN_PX / px]},
        yaxis={"visible": False, "range": [-1.0, top]}, shapes=shapes, annotations=notes,
    )
    return fig


def topology_figure_html(topology: Topology, max_drawn_gpus: int = 256) -> str:
    """``topology_figure`` as a standalone HTML page with plotly.js inlined (works offline)."""
    return topology_figure(topology, max_drawn_gpus).to_html(include_plotlyjs=True, full_html=True)
