"""Run a collective's plan on actual numbers: every transfer moves (or adds) real values between peers.

The symbolic verifier (`simdist.collectives.verify`) proves a plan computes its op by tracking which
contributions each peer holds per chunk; this module executes the same plan on numpy arrays, so a
notebook can show the lecture's four-rank example with the numbers themselves. Semantics follow
`simdist.collectives.plan`: a transfer sends chunk ``chunk`` of ``src`` to ``dst``; with ``reduce``
the receiver adds it into its own copy (a sum; it stores it when it holds no copy yet, as the NVSwitch
pseudo-peer does), otherwise it overwrites its copy. Transfers run in list order, which respects the
dependencies; the verifier's race rules make that order's result the only possible one.

Buffers, as NCCL's API lays them out (NCCL docs, "Collective operations"): ``inputs[r]`` is rank r's
send buffer and the result is each rank's receive buffer:
- all_reduce: n values in, their sum out on every rank; reduce: the sum on the root only;
- broadcast: the root's n values everywhere; send_recv: rank 0's values on rank 1;
- reduce_scatter: n = P m values in, rank r gets the sum of block r (m values);
- all_gather: m values in, every rank gets the P blocks concatenated in rank order;
- scatter: the root's P blocks, block r to rank r; gather: the reverse, on the root;
- all_to_all: P blocks in; rank r gets block r of every rank, in source-rank order.
Ranks that receive nothing (non-roots of reduce and gather, ranks other than 1 of send_recv) get an
empty array.

How chunks map to values: a plan cuts the buffer into ``num_chunks`` chunks, and for the segmented
ops ``chunk_segment`` names the peer each chunk belongs to. Here the values of peer q's block are
split (in chunk order) over the chunks of segment q; unsegmented ops split the whole buffer over all
chunks. Any such split is faithful, because every operation is elementwise across ranks. A plan may
have more chunks than values; the spare chunks carry empty arrays.
"""

from __future__ import annotations

import numpy as np

from simdist.collectives.plan import Plan

__all__ = ["chunk_indices", "execute", "run_plan"]

_ROOTED_OUT = {"reduce", "gather"}  # only the root receives


def _blocks(op: str) -> bool:
    """Does the op cut the buffer into one block per peer?"""
    return op in ("reduce_scatter", "all_gather", "scatter", "gather", "all_to_all")


def chunk_indices(plan: Plan, full_len: int) -> list[np.ndarray]:
    """Indices into the full buffer (length ``full_len``; P blocks for the block ops) of each chunk.

    all_to_all: chunk s P + d is block d of peer s's buffer (indices into that peer's buffer).
    """
    p, c = plan.num_peers, plan.num_chunks
    if plan.op == "all_to_all":
        m = full_len // p
        return [np.arange((ch % p) * m, (ch % p + 1) * m) for ch in range(c)]
    if not _blocks(plan.op):
        return list(np.array_split(np.arange(full_len), c))
    m = full_len // p
    by_peer: dict[int, list[int]] = {}
    for ch in range(c):
        by_peer.setdefault(plan.chunk_segment[ch], []).append(ch)
    out: list[np.ndarray] = [np.arange(0)] * c
    for peer, chunks in by_peer.items():
        for ch, idx in zip(chunks, np.array_split(np.arange(peer * m, (peer + 1) * m), len(chunks)), strict=True):
            out[ch] = idx
    return out


def _initial(plan: Plan, inputs: list[np.ndarray], idx: list[np.ndarray]) -> dict[int, dict[int, np.ndarray]]:
    """What each peer holds per chunk before the first transfer (the verifier's `_initial`, with values)."""
    p, op = plan.num_peers, plan.op
    state: dict[int, dict[int, np.ndarray]] = {}
    for peer in range(p):
        held: dict[int, np.ndarray] = {}
        for ch in range(plan.num_chunks):
            if op in ("all_reduce", "reduce", "reduce_scatter"):
                held[ch] = inputs[peer][idx[ch]]
            elif op in ("broadcast", "scatter", "send_recv"):
                if peer == plan.root:
                    held[ch] = inputs[peer][idx[ch]]
            elif op in ("all_gather", "gather"):
                if plan.chunk_segment[ch] == peer:
                    held[ch] = inputs[peer][idx[ch] - peer * len(inputs[peer])]
            elif op == "all_to_all" and ch // p == peer:
                held[ch] = inputs[peer][idx[ch]]
        state[peer] = held
    return state


def execute(plan: Plan, state: dict[int, dict[int, np.ndarray]]) -> dict[int, dict[int, np.ndarray]]:
    """Run every transfer of ``plan`` in order on ``state`` (peer -> chunk -> values), in place."""
    for i, t in enumerate(plan.transfers):
        data = state.setdefault(t.src, {}).get(t.chunk)
        if data is None:
            raise AssertionError(f"{plan.algorithm} {plan.op}: transfer {i}: peer {t.src} sends chunk {t.chunk} "
                                 f"it does not hold")
        held = state.setdefault(t.dst, {})
        if t.reduce and t.chunk in held:
            held[t.chunk] = held[t.chunk] + data  # the reduction is a sum (ncclSum)
        else:
            held[t.chunk] = data.copy()
    return state


def run_plan(plan: Plan, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Each peer's receive buffer after running ``plan`` on the send buffers ``inputs`` (see the module doc).

    ``inputs`` must have ``plan.num_peers`` arrays of equal length (a multiple of the peer count for
    reduce_scatter, scatter and all_to_all); the caller checks that.
    """
    p, op = plan.num_peers, plan.op
    n = len(inputs[0])
    full = n * p if op in ("all_gather", "gather") else n
    idx = chunk_indices(plan, full)
    state = execute(plan, _initial(plan, [np.asarray(x, dtype=float) for x in inputs], idx))
    outputs: list[np.ndarray] = []
    for peer in range(p):
        held = state[peer]
        if op == "all_to_all":
            m = n // p
            out = np.empty(n)
            for src in range(p):
                out[src * m:(src + 1) * m] = held[src * p + peer]
        elif (op in _ROOTED_OUT and peer != plan.root) or (op == "send_recv" and peer != 1):
            out = np.empty(0)
        else:
            out = np.empty(full)
            mine = range(plan.num_chunks)
            if op in ("reduce_scatter", "scatter"):
                mine = [ch for ch in mine if plan.chunk_segment[ch] == peer]
            for ch in mine:
                out[idx[ch]] = held[ch]
            if op in ("reduce_scatter", "scatter"):
                m = full // p
                out = out[peer * m:(peer + 1) * m]
        outputs.append(out)
    return outputs
