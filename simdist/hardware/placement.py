"""A job that uses part of a cluster: the first ``gpus_per_node`` GPUs (whole hosts) of the first ``num_nodes``
nodes, the rest idle (a scenario's ``cluster.placement``; e.g. 64 GPUs of one GB300 NVL72 rack, or 256 GPUs as 4
racks x 64).

The job runs on the sub-cluster those GPUs form: the same node anatomy with only the hosts it uses (their GPUs,
PCIe switches and NICs), the same scale-up domain and the same fabric shape over the nodes it uses. Rank r of the
job lives on used node r // gpus_per_node, as on a full cluster.

# Assumption: idle GPUs and NICs carry no traffic, and the job's routes are those of the sub-cluster: inside a node
# exactly the full cluster's (GPUs meet on the NVSwitch crossbar or on their own hosts' PCIe trees); between nodes
# the job's NICs sit on leaves and spines sized by the fabric's own rule (simdist.hardware.fabric) for the NICs the
# job uses. On a rail-optimized fabric a NIC keeps its rail switch; on a fat tree NICs are cabled in order, so two
# used nodes may share a leaf they would not share in the full cluster (a shorter path at the same NIC bandwidth on
# a non-blocking tree; ECMP then spreads over the spines a fabric of the job's size has).
# A node given as a graph (simdist.spec.node_graph) keeps its first ``gpus_per_node`` GPUs, every other vertex and
# the links between them.
"""

from __future__ import annotations

from simdist.errors import TopologyError
from simdist.hardware.topology import Topology
from simdist.spec.base import FieldProblem

__all__ = ["job_topology"]


def job_topology(cluster: Topology, *, num_nodes: int | None, gpus_per_node: int | None) -> Topology:
    """The sub-cluster of ``cluster`` a partial job runs on (see the module docstring); ``None``: all of them."""
    spec = cluster.spec
    nodes = spec.num_nodes if num_nodes is None else num_nodes
    per_node = spec.gpus_per_node if gpus_per_node is None else gpus_per_node
    if nodes > spec.num_nodes:
        raise TopologyError(f"placement asks for {nodes} nodes, but the cluster has {spec.num_nodes}",
                            field="placement.num_nodes", fix=f"use at most {spec.num_nodes} nodes, or add nodes")
    if per_node > spec.gpus_per_node:
        raise TopologyError(f"placement asks for {per_node} GPUs per node, but a node has {spec.gpus_per_node}",
                            field="placement.gpus_per_node", fix=f"use at most {spec.gpus_per_node} GPUs per node")
    if spec.node is not None:  # a node given as a graph: its first per_node GPUs and every other vertex
        idle = {f"gpu{i}" for i in range(per_node, spec.gpus_per_node)}
        links = [lk for lk in spec.node.links if not idle & set(lk.ends)]
        nics = spec.inter_node.nics_per_node if spec.inter_node is not None else 0
        try:
            spec.node.model_copy(update={"links": links}).check(per_node, nics, nodes)
        except FieldProblem as problem:
            raise TopologyError(f"the job's first {per_node} GPUs of each node: {problem}",
                                field="placement.gpus_per_node", fix="place the job on GPUs that reach each other "
                                                                     "and their NICs") from None
        update = {"num_nodes": nodes, "gpus_per_node": per_node,
                  "node": spec.node.model_copy(update={"links": links})}
        return Topology(spec.model_copy(update=update), cluster_num_gpus=spec.num_gpus)
    per_host = spec.gpus_per_host
    if per_node % per_host:
        raise TopologyError(f"placement uses {per_node} GPUs per node, not whole hosts of {per_host} GPUs",
                            field="placement.gpus_per_node",
                            fix=f"use a multiple of {per_host} GPUs per node (a job gets whole servers or trays)")
    hosts = per_node // per_host
    update: dict = {"num_nodes": nodes, "gpus_per_node": per_node, "hosts_per_node": hosts}
    if spec.inter_node is not None:
        nics_per_host = spec.inter_node.nics_per_node // spec.hosts_per_node
        update["inter_node"] = spec.inter_node.model_copy(update={"nics_per_node": nics_per_host * hosts})
    return Topology(spec.model_copy(update=update), cluster_num_gpus=spec.num_gpus)
