"""PAT, Parallel Aggregated Trees: NCCL's logarithmic all_gather and reduce_scatter at scale (NCCL 2.23+).

Source: S. Jeaugey, "PAT: a new algorithm for all-gather and reduce-scatter operations at scale"
(arXiv:2506.20252, 2025); NVIDIA/nccl src/include/collectives.h (PatAGAlgorithm, PatRSAlgorithm: the
step generator the kernels of src/device/prims_simple.h, patCopy / patReduce, follow) and
src/graph/tuning.cc (ncclTopoTuneModel; ncclPatEnable: PAT only with one GPU per node, nNodes == nRanks,
and the Simple protocol).

PAT is the Bruck all-gather with its dimensions reversed: every rank's block travels a binomial tree,
each hop crossing one "dimension" (a distance of 2^d ranks, modulo P), and the trees of all ranks are
aggregated so that a step sends one message per rank. Reversed, the far dimensions go first, so the last
step, which carries the most data, goes to the nearest ranks (on a fat tree: under the same leaf).
With m = ceil(log2 P), and blocks (chunks) c = 0 .. P-1, block c belonging to peer c:

- all_gather, d = m-1, ..., 1, 0: peer x sends to x - 2^d the blocks x + t (mod P) it holds, t a
  multiple of 2^(d+1) with t + 2^d < P: after the step x - 2^d holds x - 2^d + t' for every t' < P
  whose bits below d are clear; after d = 0, every block;
- reduce_scatter, the time-reverse, d = 0, 1, ..., m-1: peer x sends to x + 2^d its partial sums of
  blocks x + 2^d + u (mod P), u a multiple of 2^(d+1) below P - 2^d, and the receiver adds them to its
  own: contributions to block q climb the tree of q, combined at every hop.

Step d moves n_d = ceil((P - 2^d) / 2^(d+1)) blocks per peer (sum over d: P - 1, the ring's volume) in
one message: P = 2^m gives the textbook log2(P) alpha + (P-1)/P S/B (Thakur, Rabenseifner & Gropp 2005
sec. 4.1 for recursive doubling; Bruck et al. 1997), any P works without folding.

# Assumption: fully aggregated, as PAT runs when its buffer holds a step's blocks (small and medium sizes;
# aggFactor reaches nranks/2 in PatAGAlgorithm). With large buffers NCCL aggregates fewer ranks per message
# (more, smaller messages, the same bytes); that cost is NCCL's "nRanks x 2.8 us" linear latency term, which
# simdist.collectives.nccl_model adds to PAT's start-up, with NCCL's 0.75 PAT bandwidth factor as its rate.
# Assumption: steps run one after another (each exchange once both its peers finished the previous step,
# simdist.collectives.exchange_steps), not pipelined over buffer chunks.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from simdist.collectives.exchange_steps import Exchange, Step, steps_fast, steps_plan
from simdist.collectives.group import Group
from simdist.collectives.plan import Plan
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.errors import SimdistError

PAT_OPS = frozenset({"all_gather", "reduce_scatter"})


def dimensions(op: str, num_peers: int) -> list[int]:
    """The dimensions d (distance 2^d) in step order: far first for all_gather, near first for reduce_scatter."""
    m = (num_peers - 1).bit_length()  # ceil(log2 P) for P >= 2; 0 for one peer
    dims = list(range(m))
    return dims[::-1] if op == "all_gather" else dims


def offsets(num_peers: int, d: int) -> np.ndarray:
    """The multiples t of 2^(d+1) with t + 2^d < P: the blocks (relative offsets) a peer sends across d."""
    return np.arange(0, num_peers - (1 << d), 1 << (d + 1), dtype=np.int64)


def blocks_per_step(num_peers: int, d: int) -> int:
    """n_d = ceil((P - 2^d) / 2^(d+1)): blocks every peer sends across dimension d."""
    return len(offsets(num_peers, d))


def schedule(op: str, num_peers: int) -> list[list[Exchange]]:
    """The steps of ``op`` (see the module docstring), every exchange with its chunks."""
    if op not in PAT_OPS:
        raise ValueError(f"pat does not implement {op}")
    p = num_peers
    out = []
    for d in dimensions(op, p):
        t = offsets(p, d)
        step = []
        for x in range(p):
            if op == "all_gather":
                step.append(Exchange(x, (x - (1 << d)) % p, tuple(int(c) for c in (x + t) % p), False))
            else:
                step.append(Exchange(x, (x + (1 << d)) % p, tuple(int(c) for c in (x + (1 << d) + t) % p), True))
        out.append(step)
    return out


@lru_cache(maxsize=256)
def step_arrays(op: str, num_peers: int) -> list[Step]:
    """The same steps as arrays (O(P log P)), each exchange with its chunk count (cached by op and size: shared
    lists and arrays, read only)."""
    p = num_peers
    x = np.arange(p, dtype=np.int64)
    out = []
    for d in dimensions(op, p):
        dst = (x - (1 << d)) % p if op == "all_gather" else (x + (1 << d)) % p
        out.append(Step(x, dst, np.full(p, blocks_per_step(p, d), dtype=np.int64), op == "reduce_scatter"))
    return out


def pat_plan(op: str, num_peers: int, nbytes: float, group: Group | None = None) -> Plan:
    """The detailed PAT plan of ``op`` over ``num_peers`` peers: one transfer per block of every exchange,
    blocks of S/P (nccl-tests sizes, simdist.collectives.ops); with ``group``, at their planned rates."""
    return steps_plan(op, "pat", num_peers, schedule(op, num_peers), num_peers, tuple(range(num_peers)), nbytes,
                      group)


def check_pat(req: Request) -> None:
    """PAT runs where NCCL enables it: one GPU per node (src/graph/tuning.cc, ncclPatEnable: nNodes == nRanks)."""
    nodes = req.group.by_node()
    crowded = max(len(peers) for peers in nodes.values())
    if crowded > 1:
        raise SimdistError(
            f"pat runs with one GPU per node (NCCL's ncclPatEnable: nNodes == nRanks), but the group has "
            f"{crowded} ranks on one node ({len(nodes)} nodes, {req.num_peers} ranks)",
            field="--algorithm", fix="use --algorithm ring or auto, or one rank per node (a data-parallel group)")


def _build(req: Request) -> Plan:
    check_pat(req)
    return pat_plan(req.op, req.num_peers, req.nbytes, req.group)


def pat_fast(req: Request) -> Plan:
    """Fast fidelity: one flow per exchange (simdist.collectives.exchange_steps.steps_fast)."""
    check_pat(req)
    return steps_fast(req, "pat", step_arrays(req.op, req.num_peers), req.nbytes / req.num_peers)


def detailed_size(req: Request) -> int:
    """Transfers of the detailed plan: P - 1 blocks per peer."""
    return req.num_peers * (req.num_peers - 1)


register(Algorithm(
    name="pat",
    ops=PAT_OPS,
    build=_build,
    check=check_pat,
    build_fast=pat_fast,
    detailed_size=detailed_size,
    summary="NCCL's PAT: reversed-Bruck aggregated trees, ceil(log2 P) steps (one GPU per node)",
))
