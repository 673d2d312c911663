"""Bisection bandwidth: the capacity (one direction, nominal) across the cut between two halves.

Definition used: the maximum flow from the first half of the GPUs (by rank) to the second half, which
by max-flow/min-cut equals the smallest total bandwidth of links that separate them. With whole nodes
on each side (num_nodes >= 2) the halves are nodes [0, N//2) and [N//2, N); for odd N they differ by
one node, and the figure is reported with the cut it used.

- One node: max flow on the node graph (small; networkx).
- Several nodes: closed form on the two-tier fabric. Per leaf l, with a_l NICs of the first half and
  b_l of the second, each NIC carrying at most c (its link, or the node's own injection limit / NICs):
      flow = sum_l min(a_l, b_l) c  +  min( sum_l min((a_l - b_l)+ c, U), sum_l min((b_l - a_l)+ c, U) )
  where U = num_spines x uplink bandwidth is a leaf's capacity to the spine layer. Same-leaf pairs
  meet inside the leaf; the rest climbs to spines, limited by each leaf's uplinks; the spine layer,
  fully connected to every leaf, splits flow evenly and is never the bottleneck beyond that.
  With 3 tiers the leaves' surpluses first meet inside their pod (its spines join all of its leaves), and what a
  pod still sends or receives crosses the core, at most V = spines x cores per group x core link bandwidth per pod:
      flow = sum_l min(a_l, b_l) c + sum_q min(u_q, d_q) + min( sum_q min((u_q - d_q)+, V), sum_q min((d_q - u_q)+, V) )
  with u_q, d_q the pod's sums of min((a_l - b_l)+ c, U) and min((b_l - a_l)+ c, U).
  With planes (simdist.hardware.fabric) the leaves' surpluses meet inside their plane only (each plane its own
  spines, no core), and a node feeds every plane through its NICs (PXN relays cross-plane pairs over NVLink):
      flow = sum_l min(a_l, b_l) c + sum_q min(u_q, d_q), q the planes.
  Tests check this against networkx max flow on the materialised graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simdist.hardware.topology import Topology


@dataclass(frozen=True, slots=True)
class Bisection:
    bandwidth_Bps: float
    cut: str


def _node_flow(topology: Topology, sources: list[str], sinks: list[str]) -> float:
    import networkx as nx  # here only: a run never needs it

    g = nx.DiGraph()
    for lk in topology.node.links:
        g.add_edge(lk.src, lk.dst, capacity=lk.bandwidth_Bps)
    for s in sources:
        g.add_edge("_source", s)  # no capacity attribute = unbounded
    for t in sinks:
        g.add_edge(t, "_sink")
    return float(nx.maximum_flow_value(g, "_source", "_sink"))


def bisection(topology: Topology) -> Bisection:
    """Bisection bandwidth of ``topology`` (see the module docstring for the definition)."""
    if topology.num_nodes == 1:
        gpus = topology.node.gpus
        half = len(gpus) // 2
        if half == 0:
            return Bisection(0.0, "a single GPU has no bisection")
        flow = _node_flow(topology, gpus[:half], gpus[half:])
        return Bisection(flow, f"GPUs 0-{half - 1} | {half}-{len(gpus) - 1} of one node")
    fabric = topology.fabric
    assert fabric is not None
    n_half = topology.num_nodes // 2
    per_nic = min(fabric.nic_bandwidth_Bps, topology.node_injection_Bps / fabric.nics_per_node)
    leaves = fabric.leaf_of_all()
    first = np.zeros(fabric.num_nics, dtype=bool)
    first[: n_half * fabric.nics_per_node] = True
    a = np.bincount(leaves[first], minlength=fabric.num_leaves).astype(float)
    b = np.bincount(leaves[~first], minlength=fabric.num_leaves).astype(float)
    direct = float(np.minimum(a, b).sum()) * per_nic
    uplink = fabric.num_spines * fabric.uplink_bandwidth_Bps
    up_l = np.minimum(np.clip(a - b, 0, None) * per_nic, uplink)
    down_l = np.minimum(np.clip(b - a, 0, None) * per_nic, uplink)
    if fabric.cores_per_group:  # 3 tiers: leaves' surpluses meet inside their pod, the rest crosses the core
        pod = fabric.pod_of(np.arange(fabric.num_leaves))
        up_q = np.bincount(pod, weights=up_l, minlength=fabric.num_pods)
        down_q = np.bincount(pod, weights=down_l, minlength=fabric.num_pods)
        core = fabric.num_spines * fabric.cores_per_group * fabric.core_bandwidth_Bps
        inside = float(np.minimum(up_q, down_q).sum())
        up = float(np.minimum(np.clip(up_q - down_q, 0, None), core).sum())
        down = float(np.minimum(np.clip(down_q - up_q, 0, None), core).sum())
        last = topology.num_nodes - 1
        return Bisection(direct + inside + min(up, down), f"nodes 0-{n_half - 1} | {n_half}-{last}")
    last = topology.num_nodes - 1
    if fabric.planes > 1:  # a leaf's surplus meets the others' inside its plane (no core; PXN feeds each plane)
        plane = fabric.pod_of(np.arange(fabric.num_leaves))
        up_q = np.bincount(plane, weights=up_l, minlength=fabric.planes)
        down_q = np.bincount(plane, weights=down_l, minlength=fabric.planes)
        return Bisection(direct + float(np.minimum(up_q, down_q).sum()), f"nodes 0-{n_half - 1} | {n_half}-{last}")
    up = float(up_l.sum())
    down = float(down_l.sum())
    return Bisection(direct + min(up, down), f"nodes 0-{n_half - 1} | {n_half}-{last}")
