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

from simdist.collectives.group import Group
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
                                               tuple(sorted(deps))))
                self._readers.setdefault((src, chunk), []).append(i)
                self._last_write[(dst, chunk)] = i
                self._readers[(dst, chunk)] = []
                mine.append(i)
            copies.append(mine)
            last_out[src] = mine
            last_in[dst] = mine
        for peer in set(last_in) | set(last_out):
            self._ending[peer] = last_in.get(peer, []) + last_out.get(peer, [])


def hierarchical_plan(op: str, groups: list[list[int]], nbytes: float) -> Plan:
    """The plan of ``op`` (all_reduce, reduce_scatter, all_gather) over ``groups`` (peers by node,
    equal sizes); intra-node rings visit a node's peers in the listed order."""
    n, local = len(groups), len(groups[0])
    owned = [(pos + 1) % local for pos in range(local)]  # ring position l ends its reduce-scatter owning block l+1
    out = _Embedder()
    for phase in PHASES[op]:
        if phase.startswith("intra"):
            halves = (True, False) if phase == "intra_rs" else (False, True)
            sub = ring_all_reduce(local, nbytes, phases=halves)
            for peers in groups:
                out.embed(sub, peers, [[c * n + m for m in range(n)] for c in range(local)])
        else:
            halves = (True, False) if phase == "cross_rs" else (False, True)
            sub = ring_all_reduce(n, nbytes / local, phases=halves)
            for pos in range(local):
                out.embed(sub, [g[pos] for g in groups], [[owned[pos] * n + m] for m in range(n)])
        out.end_phase()
    # block c ends on ring position c - 1 of each node, its sub-chunk m on node m - 1
    segment = tuple(groups[(m - 1) % n][(c - 1) % local] for c in range(local) for m in range(n))
    return Plan(op=op, algorithm="hierarchical", num_peers=n * local, nbytes=nbytes,
                transfers=tuple(out.transfers), num_chunks=n * local, chunk_segment=segment)


def _check(req: Request) -> None:
    node_groups(req.group)


def _build(req: Request) -> Plan:
    return hierarchical_plan(req.op, node_groups(req.group), req.nbytes)


register(Algorithm(
    name="hierarchical",
    ops=frozenset(PHASES),
    build=_build,
    check=_check,
    summary="ring reduce-scatter in each node, ring all_reduce across nodes per local rank, ring all-gather",
))
