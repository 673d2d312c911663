"""A collective as data: transfers between group-local peers, with dependencies.

An algorithm lowers (op, peers, size) to a `Plan`; the engine executes it over the topology's routes
(sharing link bandwidth), `simdist.analytic` costs the same algorithm in closed form, and
`simdist.collectives.verify` checks, without timing, that the plan computes its collective.

Data model used by the verifier: the collective's buffer is cut into ``num_chunks`` chunks. A
transfer moves one chunk from ``src`` to ``dst``; with ``reduce`` the receiver combines it into its
own copy, otherwise it stores it. ``SWITCH`` as a peer is the NVSwitch's in-network reduction and
multicast engine (NVLS): it accumulates what GPUs push to it and sends results back; ``FABRIC`` is the
same for the inter-node fabric's switches (SHARP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SWITCH = -1
"""Pseudo-peer: the NVSwitch (NVLS). Transfers to or from it use the GPU's NVLink port."""
FABRIC = -2
"""Pseudo-peer: the inter-node fabric's in-network reduction (SHARP, simdist.collectives.collnet): it
accumulates what GPUs push to it and multicasts results back. Transfers to or from it use the GPU's path to
its NIC and the NIC's link to its leaf switch."""
NODE_SWITCH = -3
"""Pseudo-peers ``NODE_SWITCH - n``: the NVSwitch of the group's n-th node (in `Group.by_node` order), for plans
that run NVLS in several nodes at once (NVLS-Tree, simdist.collectives.nvls_tree): each node's switch reduces
only what its own GPUs push. Transfers to or from one use the GPU's NVLink port, as for ``SWITCH``."""


def node_switch(index: int) -> int:
    """The pseudo-peer of the NVSwitch of the group's ``index``-th node (see NODE_SWITCH)."""
    return NODE_SWITCH - index


@dataclass(frozen=True, slots=True)
class Transfer:
    src: int
    dst: int
    nbytes: float
    chunk: int
    reduce: bool = False
    deps: tuple[int, ...] = ()
    """Indices (into Plan.transfers) of transfers that must finish before this one starts."""
    extra_latency_s: float = 0.0
    """Latency paid on top of the route's (fast-fidelity flows that stand for several steps)."""
    max_rate_Bps: float = math.inf
    """The transfer's planned rate (wire bytes/s): its bytes move no faster, whatever its links allow.
    Plans set it to the transfer's share of the links it meets the plan's other transfers on
    (simdist.collectives.pacing), so that alone on the network every transfer moves at exactly this
    rate and the closed form of the same plan is exact; next to other traffic a transfer moves slower
    (link sharing), never faster. inf: as fast as its links allow."""
    after: int = -1
    """Index (into Plan.transfers) of the transfer before this one on the same connection: its bytes
    join the wire once that one's have landed (in-order delivery), its latency overlapping them; -1:
    none. The engine (simdist.engine.executor) enforces it and ``max_rate_Bps``."""


@dataclass(frozen=True, slots=True)
class Plan:
    """How one collective moves data. Transfers are listed in a dependency-respecting order."""

    op: str
    algorithm: str
    num_peers: int
    nbytes: float
    transfers: tuple[Transfer, ...]
    num_chunks: int
    root: int = 0
    chunk_segment: tuple[int, ...] = ()
    """For segmented ops (scatter/gather/all_gather/reduce_scatter): the peer each chunk belongs to.
    For all_to_all: chunk = src x num_peers + dst (one block per ordered pair)."""
    channels: int = 1
    per_transfer_latency_s: float = 0.0
    """Protocol overhead paid by every transfer on top of its route latency."""
    base_latency_s: float = 0.0
    """Fixed start-up cost of the collective (NCCL's baseLat)."""
    rate_factor: float = 1.0
    """Protocol payload efficiency (LL 0.5, LL128 0.92, Simple 1): a transfer of n bytes puts
    n / rate_factor bytes on the wire."""
    protocol: str = "simple"
    verifiable: bool = True
    """False for fast-fidelity plans whose transfers aggregate many chunks."""

    @property
    def num_transfers(self) -> int:
        return len(self.transfers)

    def bytes_sent(self) -> list[float]:
        """Bytes each peer sends (pushes to a switch count for the sender)."""
        out = [0.0] * self.num_peers
        for t in self.transfers:
            if t.src >= 0:
                out[t.src] += t.nbytes
        return out

    def bytes_received(self) -> list[float]:
        out = [0.0] * self.num_peers
        for t in self.transfers:
            if t.dst >= 0:
                out[t.dst] += t.nbytes
        return out


def steady_plan(op: str, algorithm: str, num_peers: int, nbytes: float, src, dst, reduce, latency_s, flow_bytes: float,
                rate_factor: float, end_s: float) -> Plan:
    """Fast fidelity for a pipelined plan whose connections all carry the same ``flow_bytes``: one flow per connection
    (``src``, ``dst``, ``reduce`` and its ``latency_s``: arrays, one entry per connection) at the steady rate that
    lands it at ``end_s``, when the detailed plan ends alone (below the plan's rate): next to other traffic every flow
    shares its links over the whole collective. Without bytes a flow waits out the time. (simdist.collectives.collnet,
    nvls_tree, nvls_sharp.)"""
    wire = flow_bytes / rate_factor
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where((wire > 0) & (end_s > latency_s), wire / (end_s - latency_s), math.inf)
    extra = np.zeros(len(src)) if wire > 0 else np.maximum(end_s - latency_s, 0.0)
    transfers = tuple(Transfer(int(a), int(b), flow_bytes, -1, bool(r), (), float(x), float(v))
                      for a, b, r, x, v in zip(src, dst, reduce, extra, rate, strict=True))
    return Plan(op=op, algorithm=algorithm, num_peers=num_peers, nbytes=nbytes, transfers=transfers, num_chunks=0,
                verifiable=False)
