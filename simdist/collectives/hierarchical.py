"""Hierarchical (2D) all_reduce: ring reduce-scatter inside each node, ring all_reduce across nodes
among the peers of the same local position, ring all-gather inside each node.

With N nodes of L peers, the intra-node reduce-scatter leaves local position l of every node owning
the same block of S/L bytes; the L cross-node rings (one per position, each on that GPU's own NIC
rail, all concurrent) all-reduce their block, and the intra-node all-gather spreads the result
(hierarchical all-reduce: Jia et al. 2018, "Highly scalable deep learning training system with
mixed-precision: training ImageNet in four minutes"; Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE; each
level a ring, Thakur, Rabenseifner & Gropp 2005 sec. 4.1). reduce_scatter is the first half
(intra-node reduce-scatter, cross-node reduce-scatter), all_gather the second (cross-node
all-gather, intra-node all-gather), and all_reduce is exactly reduce_scatter followed by all_gather:
its cross-node ring all-reduce is the ring's two halves.

Chunks: block c of a node's ring is cut into N sub-chunks (c, m), parent chunk c N + m, so that the
cross-node ring (which cuts its S/L bytes into N) and the intra-node rings speak of the same data; an
intra-node ring transfer of block c becomes N transfers of S/(L N), one per sub-chunk, travelling
together. Peer n x L + l's final segment for reduce_scatter/all_gather is one sub-chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from simdist.collectives.group import Group
from simdist.collectives.pacing import edge_shares
from simdist.collectives.plan import Plan, Transfer
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.collectives.ring import ring_all_reduce
from simdist.errors import SimdistError

PHASES = {
    "all_reduce": ("intra_rs", "cross_rs", "cross_ag", "intra_ag"),  # = reduce_scatter then all_gather
    "reduce_scatter": ("intra_rs", "cross_rs"),
    "all_gather": ("cross_ag", "intra_ag"),
}


def node_groups(group: Group) -> list[list[int]]:
    """Peers by node; raises SimdistError unless >= 2 nodes hold the same number of peers each."""
    groups = list(group.by_node().values())
    sizes = sorted({len(g) for g in groups})
    if len(groups) < 2 or len(sizes) > 1:
        shape = " + ".join(str(len(g)) for g in groups)
        raise SimdistError(
            f"hierarchical needs peers on at least 2 nodes with the same number on each; "
            f"this group has {shape} peer(s) on {len(groups)} node(s)",
            field="--algorithm",
            fix="use ring or tree for this group, or give every node the same number of ranks (e.g. whole nodes)",
        )
    return groups


class _Embedder:
    """Appends sub-plans (peers and chunks re-indexed) to one parent plan, race-free across phases."""

    def __init__(self) -> None:
        self.transfers: list[Transfer] = []
        self._last_write: dict[tuple[int, int], int] = {}
        self._readers: dict[tuple[int, int], list[int]] = {}
        self._phase_end: dict[int, list[int]] = {}  # peer -> its last transfers of the previous phase
        self._ending: dict[int, list[int]] = {}  # the same, for the phase being appended

    def end_phase(self) -> None:
        self._phase_end, self._ending = self._ending, {}

    def embed(self, sub: Plan, peers: list[int], chunks: list[list[int]]) -> None:
        """Append ``sub`` with its peer i mapped to ``peers[i]`` and its chunk q to the parent chunks
        ``chunks[q]`` (one copy of each transfer per parent chunk, bytes split evenly; copy j of a
        transfer depends on copy j of each of its dependencies)."""
        copies: list[list[int]] = []
        last_in: dict[int, list[int]] = {}
        last_out: dict[int, list[int]] = {}
        for t in sub.transfers:
            src, dst, targets = peers[t.src], peers[t.dst], chunks[t.chunk]
            mine: list[int] = []
            rate = t.max_rate_Bps / len(targets)  # the copies travel together, splitting the hop's rate
            for j, chunk in enumerate(targets):
                deps = {copies[d][j] for d in t.deps}
                if not t.deps:
                    # Assumption: a phase starts on a peer once the previous phase is done there
                    # (separate collectives, as Horovod/NCCL-based hierarchical all_reduce runs them).
                    deps.update(self._phase_end.get(src, ()))
                    deps.update(self._phase_end.get(dst, ()))
                # data dependencies across phases (implied within a phase by the sub-plan's own)
                deps.update(i for i in (self._last_write.get((src, chunk)), self._last_write.get((dst, chunk)))
                            if i is not None)
                deps.update(self._readers.get((dst, chunk), ()))
                i = len(self.transfers)
                self.transfers.append(Transfer(src, dst, t.nbytes / len(targets), chunk, t.reduce,
                                               tuple(sorted(deps)), max_rate_Bps=rate,
                                               after=copies[t.after][j] if t.after >= 0 else -1))
                self._readers.setdefault((src, chunk), []).append(i)
                self._last_write[(dst, chunk)] = i
                self._readers[(dst, chunk)] = []
                mine.append(i)
            copies.append(mine)
            last_out[src] = mine
            last_in[dst] = mine
        for peer in set(last_in) | set(last_out):
            self._ending[peer] = last_in.get(peer, []) + last_out.get(peer, [])


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase: concurrent rings (peer lists in ring order), each a ring half over ``nbytes``."""

    name: str
    rings: list[list[int]]
    nbytes: float
    halves: tuple[bool, bool]

    @property
    def steps(self) -> int:
        return len(self.rings[0]) - 1

    def piece_bytes(self) -> float:
        """Bytes a ring step moves per edge (a ring of m peers cuts its buffer into m)."""
        return self.nbytes / len(self.rings[0])


def phases_of(op: str, groups: list[list[int]], nbytes: float) -> list[Phase]:
    """The phases of ``op`` over ``groups`` (peers by node, equal sizes): intra-node rings visit a
    node's peers in the listed order, cross-node rings the peers of one local position, node by node."""
    local = len(groups[0])
    out = []
    for name in PHASES[op]:
        halves = (True, False) if name.endswith("_rs") else (False, True)
        if name.startswith("intra"):
            out.append(Phase(name, [list(g) for g in groups], nbytes, halves))
        else:
            out.append(Phase(name, [[g[pos] for g in groups] for pos in range(local)], nbytes / local, halves))
    return out


def ring_rates(group: Group, rings: list[list[int]]) -> np.ndarray:
    """Each ring's rate (wire bytes/s): the least over its edges of their share of their links among
    all the phase's ring edges (simdist.collectives.pacing.edge_shares), as a ring channel's
    (simdist.collectives.ring.channel_rates)."""
    src = np.array(rings, dtype=np.int64)
    if src.shape[1] < 2:
        return np.full(len(rings), math.inf)
    key = ("hierarchical_rates", src.tobytes(), src.shape)
    hit = group.memo.get(key)
    if hit is None:
        shares = edge_shares(group, src.reshape(-1), np.roll(src, -1, axis=1).reshape(-1))
        hit = group.memo[key] = shares.reshape(src.shape).min(axis=1)
    return hit


def hierarchical_plan(op: str, groups: list[list[int]], nbytes: float, group: Group | None = None) -> Plan:
    """The plan of ``op`` (all_reduce, reduce_scatter, all_gather) over ``groups`` (peers by node,
    equal sizes). With ``group`` every ring's hops move at the ring's rate (`ring_rates`), in order on
    their connection, as a ring channel's (simdist.collectives.ring); without, plain transfers (to verify)."""
    n, local = len(groups), len(groups[0])
    owned = [(pos + 1) % local for pos in range(local)]  # ring position l ends its reduce-scatter owning block l+1
    out = _Embedder()
    for phase in phases_of(op, groups, nbytes):
        rates = ring_rates(group, phase.rings) if group is not None else [None] * len(phase.rings)
        size = len(phase.rings[0])
        for r, (ring, rate) in enumerate(zip(phase.rings, rates, strict=True)):
            sub = ring_all_reduce(size, phase.nbytes, phases=phase.halves,
                                  rates=None if rate is None else [float(rate)])
            if phase.name.startswith("intra"):
                out.embed(sub, ring, [[c * n + m for m in range(n)] for c in range(local)])
            else:
                out.embed(sub, ring, [[owned[r] * n + m] for m in range(n)])
        out.end_phase()
    # block c ends on ring position c - 1 of each node, its sub-chunk m on node m - 1
    segment = tuple(groups[(m - 1) % n][(c - 1) % local] for c in range(local) for m in range(n))
    return Plan(op=op, algorithm="hierarchical", num_peers=n * local, nbytes=nbytes,
                transfers=tuple(out.transfers), num_chunks=n * local, chunk_segment=segment)


@dataclass(frozen=True, slots=True)
class RingPhaseTimes:
    """One phase, uncontended: per ring (row) and ring position i, when edge i (position i to i + 1)
    delivers its last step, its latency and its step's wire time (one value per ring)."""

    phase: Phase
    lands: np.ndarray
    latency_s: np.ndarray
    step_s: np.ndarray
    rates_Bps: np.ndarray


def ring_half_lands(ready: np.ndarray, lat: np.ndarray, step_s: np.ndarray) -> np.ndarray:
    """When each edge of rings running one half (m - 1 steps) delivers its last step.

    ``ready[r, i]``: when ring r's position i may start (its previous phase done there); ``lat[r, i]``:
    latency of edge i (position i to i + 1); ``step_s[r]``: a step's wire time. Edge i's first step
    starts once both its ends are ready; a later step once the previous step's piece has arrived at i,
    its bytes after the connection's previous step (rate coupling, simdist.collectives.ring):
    f(i, s) = max(f(i - 1, s - 1) + lat_i, f(i, s - 1)) + d. Its last step lands at the longest path,
    (m - 1) d + max over starting edges j != i + 1 of (max(ready_j, ready_j+1) + lat_j + ... + lat_i),
    the latencies of the edges from j forward to i: prefix and suffix maxima over j (O(m) per ring).
    """
    rings, m = lat.shape
    start = np.maximum(ready, np.roll(ready, -1, axis=1))
    prefix = np.concatenate((np.zeros((rings, 1)), np.cumsum(lat, axis=1)), axis=1)  # prefix[:, i] = lat_0..i-1
    total = prefix[:, m:m + 1]
    value = start - prefix[:, :m]  # j's weight is value_j + prefix[i + 1] (+ total when j > i)
    before = np.maximum.accumulate(value, axis=1)  # max over j <= i
    after = np.full((rings, m + 2), -np.inf)
    after[:, :m] = np.maximum.accumulate(value[:, ::-1], axis=1)[:, ::-1]  # max over j >= i
    best = np.maximum(before, after[:, 2:m + 2] + total)  # j <= i, or j >= i + 2 (wrapping)
    best[:, m - 1] = value[:, 1:].max(axis=1) if m > 1 else value[:, 0]  # i = m - 1 excludes j = 0
    return (m - 1) * step_s[:, None] + prefix[:, 1:] + best


def hierarchical_schedule(req: Request) -> list[RingPhaseTimes]:
    """Every phase's ring edges' last landings, uncontended (`ring_half_lands`), phase after phase:
    a peer starts a phase once its own previous phase is done (its last step in and out landed)."""
    group, proto = req.group, req.protocol
    ready = np.zeros(group.size)
    out = []
    for phase in phases_of(req.op, node_groups(group), req.nbytes):
        rings = np.array(phase.rings, dtype=np.int64)
        if rings.shape[1] < 2:
            continue
        rates = ring_rates(group, phase.rings)
        lat = group.paths(rings.reshape(-1), np.roll(rings, -1, axis=1).reshape(-1)).latency_s.reshape(rings.shape)
        lat = lat + proto.per_transfer_latency_s
        size = phase.piece_bytes()
        step_s = np.where(size > 0, size / proto.rate_factor / rates, 0.0) if size > 0 else np.zeros(len(rates))
        lands = ring_half_lands(ready[rings], lat, step_s)
        ready = ready.copy()
        ready[rings] = np.maximum(lands, np.roll(lands, 1, axis=1))  # position i: its edge out and edge in
        out.append(RingPhaseTimes(phase, lands, lat, step_s, rates))
    return out


def hierarchical_fast(req: Request) -> Plan:
    """Fast fidelity: one flow per phase and ring edge carrying the edge's steps. It starts when its two
    peers are ready for the phase (`hierarchical_schedule`, with the request's protocol) and moves at a
    steady rate that lands it when its ring's last step lands in the detailed plan: below the ring's
    rate, so alone every flow holds its rate and the plan takes the detailed plan's time; next to other
    traffic the flows share links as the steps do, without holding up the phases after them. Building
    costs O(P) per phase (numpy).
    """
    node_groups(req.group)
    proto = req.protocol
    ready = np.zeros(req.num_peers)
    transfers: list[Transfer] = []
    for times in hierarchical_schedule(req):
        rings = np.array(times.phase.rings, dtype=np.int64)
        steps = times.phase.steps
        start = np.maximum(ready[rings], ready[np.roll(rings, -1, axis=1)])  # both ends ready
        begin = start + times.latency_s
        end = times.lands.max(axis=1, keepdims=True)  # the ring's last landing
        wire = steps * times.phase.piece_bytes() / proto.rate_factor
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where((wire > 0) & (end > begin), wire / (end - begin), math.inf).reshape(-1)
        extra = (start if wire > 0 else np.maximum(end - times.latency_s, start)).reshape(-1)
        n = rings.size
        transfers.extend(map(Transfer, rings.reshape(-1).tolist(), np.roll(rings, -1, axis=1).reshape(-1).tolist(),
                             repeat(steps * times.phase.piece_bytes(), n), repeat(-1, n),
                             repeat(times.phase.halves[0], n), repeat((), n), extra.tolist(), rate.tolist()))
        ready = ready.copy()
        ready[rings] = np.maximum(times.lands, np.roll(times.lands, 1, axis=1))
    return Plan(op=req.op, algorithm="hierarchical", num_peers=req.num_peers, nbytes=req.nbytes,
                transfers=tuple(transfers), num_chunks=0, verifiable=False)


def detailed_size(req: Request) -> int:
    """Transfers of the detailed plan: per phase, rings x edges x steps (x N sub-chunks inside nodes)."""
    groups = list(req.group.by_node().values())
    n, local = len(groups), len(groups[0])
    per = {"intra": n * local * (local - 1) * n, "cross": local * n * (n - 1)}
    return sum(per[name.split("_")[0]] for name in PHASES.get(req.op, ()))


def _check(req: Request) -> None:
    node_groups(req.group)


def _build(req: Request) -> Plan:
    return hierarchical_plan(req.op, node_groups(req.group), req.nbytes, req.group)


register(Algorithm(
    name="hierarchical",
    ops=frozenset(PHASES),
    build=_build,
    check=_check,
    build_fast=hierarchical_fast,
    detailed_size=detailed_size,
    summary="ring reduce-scatter in each node, ring all_reduce across nodes per local rank, ring all-gather",
))
