"""One node's graph: GPUs, NVSwitch, PCIe switches, CPU sockets and NICs, built once per topology.

All nodes of a cluster are identical, so the topology keeps a single node graph (vertices with local names such
as ``gpu3``, ``nic3``, ``h0/pcie1``, ``h0/cpu0``, ``nvswitch``, and the directed links between them, as plain
dicts; `NodeGraph.graph` is the same graph as a networkx DiGraph, built when first asked for: routing never
imports networkx) and places it ``num_nodes`` times by arithmetic on link ids. Routes inside the node are
computed once per (source, destination) pair on this small graph and cached.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simdist.errors import TopologyError
from simdist.hardware.link import PathShape
from simdist.hardware.link_defaults import LINK_DEFAULTS, pcie_bandwidth_Bps
from simdist.spec.topology import LinkKind, TopologySpec

if TYPE_CHECKING:
    import networkx as nx

# Vertices that only send and receive: a message never passes *through* a GPU or a NIC.
# Assumption: no PXN-style forwarding through a peer GPU (NCCL's NCCL_PXN_DISABLE=1 behaviour).
ENDPOINT_KINDS = frozenset({"gpu", "nic"})


@dataclass(frozen=True, slots=True)
class LocalLink:
    src: str
    dst: str
    kind: LinkKind
    bandwidth_Bps: float
    latency_s: float
    efficiency: float


@dataclass(eq=False, slots=True)
class NodeGraph:
    """The graph of one node and its route cache."""

    vertices: dict[str, dict[str, Any]]
    """Every vertex's attributes (``kind``, ``host``, ...), in the order the vertices were added."""
    succ: dict[str, dict[str, int]]
    """The links out of every vertex: successor -> index into ``links``, in the order the links were added."""
    links: list[LocalLink]
    gpus: list[str]
    nics: list[str]
    nic_of_gpu: list[int | None]
    _index: dict[tuple[str, str], int] = field(default_factory=dict)
    _paths: dict[tuple[str, str], PathShape] = field(default_factory=dict)
    _trees: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    """Per source: its breadth-first trees (predecessor of every vertex reached), one per bandwidth threshold
    from the widest down, as far as `path` has needed them."""
    _widths: tuple[float, ...] = ()
    """The link bandwidths, widest first (`tree`'s thresholds; set once the node is built and searched)."""
    _graph: Any = None
    _rings: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    """Ring channels by group (local GPU indices), for a node given as a graph (simdist.hardware.node_rings)."""

    @property
    def graph(self) -> nx.DiGraph:
        """The node as a networkx DiGraph (vertices with their attributes, edges with ``link``, ``kind`` and
        ``bandwidth_Bps``, both in the order they were added), built on first use (drawings, max flows)."""
        if self._graph is None:
            import networkx as nx

            g = nx.DiGraph()
            for v, attrs in self.vertices.items():
                g.add_node(v, **attrs)
            for index, lk in enumerate(self.links):
                g.add_edge(lk.src, lk.dst, link=index, kind=lk.kind, bandwidth_Bps=lk.bandwidth_Bps)
            self._graph = g
        return self._graph

    @property
    def num_links(self) -> int:
        return len(self.links)

    def link_index(self, src: str, dst: str) -> int:
        return self._index[(src, dst)]

    def path(self, src: str, dst: str) -> PathShape:
        """Widest, then shortest, path from ``src`` to ``dst`` (cached)."""
        key = (src, dst)
        shape = self._paths.get(key)
        if shape is None:
            shape = self._paths[key] = _widest_shortest_path(self, src, dst)
        return shape

    def tree(self, src: str, level: int) -> dict[str, str] | None:
        """The breadth-first tree from ``src`` over links at least as wide as the ``level``-th widest bandwidth
        (predecessor of every vertex reached, not passing through GPUs or NICs), None past the narrowest; each
        computed once."""
        thresholds = self._widths or _thresholds(self)
        self._widths = thresholds
        if level >= len(thresholds):
            return None
        trees = self._trees.setdefault(src, [])
        while len(trees) <= level:
            trees.append(_bfs(self, src, thresholds[len(trees)]))
        return trees[level]


def _add_link(node: NodeGraph, src: str, dst: str, kind: LinkKind, bw: float, lat: float, eff: float) -> None:
    for a, b in ((src, dst), (dst, src)):
        index = len(node.links)
        node.links.append(LocalLink(a, b, kind, bw, lat, eff))
        node._index[(a, b)] = index
        node.succ.setdefault(a, {})[b] = index
        node.succ.setdefault(b, {})


def build_node(spec: TopologySpec) -> NodeGraph:
    """Build the graph of one node of ``spec`` (see the module docstring for vertex names)."""
    if spec.node is not None:
        return _listed_node(spec)
    node = NodeGraph(vertices={}, succ={}, links=[], gpus=[], nics=[], nic_of_gpu=[])
    g = node.vertices
    host = spec.host
    assert host is not None  # TopologySpec: host or node
    pcie = host.pcie
    pcie_bw = pcie.bandwidth if pcie.bandwidth is not None else pcie_bandwidth_Bps(pcie.generation, pcie.lanes)
    pcie_lat = pcie.latency if pcie.latency is not None else LINK_DEFAULTS["pcie"].latency_s
    pcie_eff = pcie.efficiency if pcie.efficiency is not None else LINK_DEFAULTS["pcie"].efficiency
    gpus_per_host = spec.gpus_per_host
    nics_per_host = (spec.inter_node.nics_per_node if spec.inter_node else 0) // spec.hosts_per_node

    for h in range(spec.hosts_per_node):
        cpus = [f"h{h}/cpu{c}" for c in range(host.cpu_sockets)]
        for c, name in enumerate(cpus):
            g[name] = {"kind": "cpu", "host": h, "socket": c}
        if len(cpus) > 1:
            link = host.cpu_interconnect
            assert link is not None  # HostSpec guarantees it
            lat = link.latency if link.latency is not None else LINK_DEFAULTS["cpu_interconnect"].latency_s
            eff = link.efficiency if link.efficiency is not None else LINK_DEFAULTS["cpu_interconnect"].efficiency
            for i in range(len(cpus)):
                for j in range(i + 1, len(cpus)):
                    # Assumption: sockets are fully connected (2-socket UPI/xGMI; 4-socket all-to-all).
                    _add_link(node, cpus[i], cpus[j], "cpu_interconnect", link.bandwidth, lat, eff)
        attach: list[str] = []
        if host.pcie_switches_per_socket:
            for c, cpu in enumerate(cpus):
                for s in range(host.pcie_switches_per_socket):
                    name = f"h{h}/pcie{c * host.pcie_switches_per_socket + s}"
                    g[name] = {"kind": "pcie_switch", "host": h, "socket": c}
                    # Assumption: the switch's upstream port is as wide as its downstream ports (x16).
                    _add_link(node, name, cpu, "pcie", pcie_bw, pcie_lat, pcie_eff)
                    attach.append(name)
        else:
            attach = cpus
        per_attach = gpus_per_host // len(attach)
        for k in range(gpus_per_host):
            gpu = f"gpu{h * gpus_per_host + k}"
            g[gpu] = {"kind": "gpu", "host": h, "index": len(node.gpus)}
            node.gpus.append(gpu)
            _add_link(node, gpu, attach[k // per_attach], "pcie", pcie_bw, pcie_lat, pcie_eff)
        for i in range(nics_per_host):
            nic = f"nic{h * nics_per_host + i}"
            g[nic] = {"kind": "nic", "host": h, "index": len(node.nics)}
            node.nics.append(nic)
            # NICs spread evenly over the attach points (i * points // nics).
            _add_link(node, nic, attach[i * len(attach) // nics_per_host], "pcie", pcie_bw, pcie_lat, pcie_eff)

    if spec.scale_up is not None:
        up = spec.scale_up
        g["nvswitch"] = {"kind": "nvswitch", "num_switches": up.num_switches, "nvls": up.nvls}
        lat = up.latency if up.latency is not None else LINK_DEFAULTS["nvlink"].latency_s
        eff = up.efficiency if up.efficiency is not None else LINK_DEFAULTS["nvlink"].efficiency
        # Assumption: a GPU's NVLinks are striped over all NVSwitch chips, so the chips act as one
        # non-blocking crossbar and a GPU's port to it carries its full NVLink bandwidth.
        for gpu in node.gpus:
            _add_link(node, gpu, "nvswitch", "nvlink", up.bandwidth, lat, eff)

    parts = _components(node)
    if len(parts) > 1:
        parts = sorted(parts, key=len)
        lone = sorted(v for v in parts[0] if g[v]["kind"] == "gpu")
        raise TopologyError(
            f"the GPUs of a node are not all connected ({', '.join(lone) or 'a component'} cannot reach the rest)",
            field="scale_up",
            fix="add scale_up (NVSwitch) to join the hosts of a node, or use hosts_per_node: 1",
        )
    node.nic_of_gpu = _nearest_nics(node)
    return node


def _listed_node(spec: TopologySpec) -> NodeGraph:
    """The node a topology file lists vertex by vertex and link by link (simdist.spec.node_graph), which
    `NodeGraphSpec.check` has already found connected."""
    listed = spec.node
    assert listed is not None
    node = NodeGraph(vertices={}, succ={}, links=[], gpus=[], nics=[], nic_of_gpu=[])
    num_nics = spec.inter_node.nics_per_node if spec.inter_node is not None else 0
    for name, kind in listed.kinds(spec.gpus_per_node, num_nics).items():
        attrs: dict[str, Any] = {"kind": kind, "host": 0}
        if kind == "gpu":
            attrs["index"] = len(node.gpus)
            node.gpus.append(name)
        elif kind == "nic":
            attrs["index"] = len(node.nics)
            node.nics.append(name)
        node.vertices[name] = attrs
        node.succ[name] = {}
    for link in listed.links:
        defaults = LINK_DEFAULTS[link.kind]
        lat = link.latency if link.latency is not None else defaults.latency_s
        eff = link.efficiency or listed.efficiency.get(link.kind) or defaults.efficiency
        back = link.reverse_bandwidth if link.reverse_bandwidth is not None else link.bandwidth
        a, b = link.ends
        for src, dst, bw in ((a, b, link.bandwidth), (b, a, back)):
            index = len(node.links)
            node.links.append(LocalLink(src, dst, link.kind, bw, lat, eff))
            node._index[(src, dst)] = index
            node.succ[src][dst] = index
    node.nic_of_gpu = _nearest_nics(node)
    return node


def _components(node: NodeGraph) -> list[set[str]]:
    """The node's connected components, each found breadth-first from its first vertex, in vertex order (every
    link is added with its reverse, so these are the weakly connected components)."""
    seen: set[str] = set()
    parts = []
    for start in node.vertices:
        if start in seen:
            continue
        part, queue = {start}, deque([start])
        while queue:
            for w in node.succ.get(queue.popleft(), {}):
                if w not in part:
                    part.add(w)
                    queue.append(w)
        seen |= part
        parts.append(part)
    return parts


def _hops_from(node: NodeGraph, src: str) -> dict[str, int]:
    """BFS hop counts from ``src`` without passing through endpoints."""
    vertices, succ = node.vertices, node.succ
    dist = {src: 0}
    queue = deque([src])
    while queue:
        v = queue.popleft()
        if v != src and vertices[v]["kind"] in ENDPOINT_KINDS:
            continue
        for w in succ.get(v, {}):
            if w not in dist:
                dist[w] = dist[v] + 1
                queue.append(w)
    return dist


def _nearest_nics(node: NodeGraph) -> list[int | None]:
    """Each GPU's NIC: the nearest by hops; GPUs sharing the same nearest set take them in turn.

    This matches NCCL's choice of the NIC closest to a GPU on the PCIe tree (DGX: GPU i uses NIC i).
    """
    if not node.nics:
        return [None] * len(node.gpus)
    groups: dict[tuple[int, ...], list[int]] = {}
    for g_index, gpu in enumerate(node.gpus):
        dist = _hops_from(node, gpu)
        best = min(dist.get(nic, 1 << 30) for nic in node.nics)
        nearest = tuple(i for i, nic in enumerate(node.nics) if dist.get(nic) == best)
        groups.setdefault(nearest, []).append(g_index)
    out: list[int | None] = [None] * len(node.gpus)
    for nearest, members in groups.items():
        for position, g_index in enumerate(members):
            if not nearest:  # no NIC reachable (a single-node cluster may have GPUs without one)
                continue
            out[g_index] = nearest[position * len(nearest) // max(len(members), len(nearest))]
    return out


def _thresholds(node: NodeGraph) -> tuple[float, ...]:
    """The link bandwidths of the node, widest first."""
    return tuple(sorted({link.bandwidth_Bps for link in node.links}, reverse=True))


def _bfs(node: NodeGraph, src: str, threshold: float) -> dict[str, str]:
    """Predecessor of every vertex reached from ``src`` breadth-first over links of at least ``threshold``
    bytes/s, not passing through endpoints (the predecessor of a vertex is fixed when it is first reached, so a
    search from ``src`` that stops once it reaches one vertex finds the same predecessors on its way)."""
    vertices, succ, links = node.vertices, node.succ, node.links
    prev: dict[str, str] = {src: src}
    queue = deque([src])
    while queue:
        v = queue.popleft()
        if v != src and vertices[v]["kind"] in ENDPOINT_KINDS:
            continue
        for w, index in succ.get(v, {}).items():
            if w not in prev and links[index].bandwidth_Bps >= threshold:
                prev[w] = v
                queue.append(w)
    return prev


def _widest_shortest_path(node: NodeGraph, src: str, dst: str) -> PathShape:
    """Among paths that avoid passing through GPUs/NICs: the widest, and of those the fewest hops (the first
    path breadth-first over the widest links that reach ``dst``; the searches from ``src`` are shared by every
    destination, `NodeGraph.tree`).

    NCCL likewise prefers NVLink paths over PCIe ones before counting hops (src/graph/paths.cc path
    types NVL < PIX < PXB < PHB < SYS).
    """
    if src == dst:
        return PathShape((), float("inf"), float("inf"), 0.0)
    level = 0
    while (prev := node.tree(src, level)) is not None:
        if dst in prev:
            hops = []
            v = dst
            while v != src:
                hops.append(node.link_index(prev[v], v))
                v = prev[v]
            hops.reverse()
            links = [node.links[i] for i in hops]
            return PathShape(
                tuple(hops),
                min(lk.bandwidth_Bps for lk in links),
                min(lk.bandwidth_Bps * lk.efficiency for lk in links),
                sum(lk.latency_s for lk in links),
            )
        level += 1
    raise TopologyError(f"no path from {src} to {dst} inside a node", fix="check the topology's host and scale_up")


def nvlink_reach(node: NodeGraph) -> int:
    """GPUs the node's first GPU reaches over NVLink links alone (itself included; through NVSwitches, never
    through another GPU)."""
    first = node.gpus[0]
    seen, queue = {first}, deque([first])
    while queue:
        v = queue.popleft()
        if v != first and node.vertices[v]["kind"] in ENDPOINT_KINDS:
            continue
        for w, index in node.succ.get(v, {}).items():
            if w not in seen and node.links[index].kind == "nvlink":
                seen.add(w)
                queue.append(w)
    return sum(1 for v in seen if node.vertices[v]["kind"] == "gpu")


def injection_flow_Bps(node: NodeGraph, nic_bandwidth_Bps: float) -> float:
    """How much the node can push out of all its NICs at once: max flow from every GPU through the node's links
    to its NICs, each NIC carrying at most ``nic_bandwidth_Bps`` (nominal bandwidths)."""
    import networkx as nx

    g = nx.DiGraph()
    for lk in node.links:
        g.add_edge(lk.src, lk.dst, capacity=lk.bandwidth_Bps)
    for gpu in node.gpus:
        g.add_edge("_source", gpu)  # no capacity attribute = unbounded
    for nic in node.nics:
        g.add_edge(nic, "_sink", capacity=nic_bandwidth_Bps)
    return float(nx.maximum_flow_value(g, "_source", "_sink"))
