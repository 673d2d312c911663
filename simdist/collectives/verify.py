"""Does a plan compute its collective? A symbolic execution, no timing.

Each peer holds, per chunk, the set of peers whose contribution it has combined (reductions) or the
peer the data came from (copies). Transfers run in a dependency-respecting order; a reducing
transfer must not combine a contribution twice (that would double-count), and a transfer must not
read or write data that a transfer it is not ordered against (by its dependencies) also writes:
such a race would make the result depend on timing. At the end every peer must hold what the
operation promises (e.g. all_reduce: every chunk, combined over all peers).
"""

from __future__ import annotations

from collections import defaultdict

from simdist.collectives.ops import op_info
from simdist.collectives.plan import Plan


class PlanError(AssertionError):
    """A plan that does not compute its collective (a bug in an algorithm, never user input)."""


def _initial(plan: Plan) -> dict[int, dict[int, frozenset[int]]]:
    p, c = plan.num_peers, plan.num_chunks
    state: dict[int, dict[int, frozenset[int]]] = defaultdict(dict)  # pseudo-peers (switches, fabric) start empty
    state.update({peer: {} for peer in range(p)})
    op = plan.op
    seg = plan.chunk_segment
    for peer in range(p):
        for chunk in range(c):
            if op in ("all_reduce", "reduce", "reduce_scatter", "barrier"):
                state[peer][chunk] = frozenset({peer})
            elif op in ("broadcast", "scatter", "send_recv"):
                if peer == plan.root:
                    state[peer][chunk] = frozenset({peer})
            elif op in ("all_gather", "gather"):
                if seg[chunk] == peer:
                    state[peer][chunk] = frozenset({peer})
            elif op == "all_to_all":
                if chunk // p == peer:
                    state[peer][chunk] = frozenset({peer})
            else:  # pragma: no cover - op names are validated upstream
                raise PlanError(f"no verifier semantics for {op}")
    return state


def _expected(plan: Plan) -> dict[int, dict[int, frozenset[int]]]:
    """Chunks each peer must hold at the end, and with which contributions (others unconstrained)."""
    p, c = plan.num_peers, plan.num_chunks
    everyone = frozenset(range(p))
    seg = plan.chunk_segment
    op = plan.op
    want: dict[int, dict[int, frozenset[int]]] = defaultdict(dict)
    for chunk in range(c):
        if op in ("all_reduce", "barrier"):
            for peer in range(p):
                want[peer][chunk] = everyone
        elif op == "reduce":
            want[plan.root][chunk] = everyone
        elif op == "reduce_scatter":
            want[seg[chunk]][chunk] = everyone
        elif op == "broadcast":
            for peer in range(p):
                want[peer][chunk] = frozenset({plan.root})
        elif op == "scatter":
            want[seg[chunk]][chunk] = frozenset({plan.root})
        elif op == "all_gather":
            for peer in range(p):
                want[peer][chunk] = frozenset({seg[chunk]})
        elif op == "gather":
            want[plan.root][chunk] = frozenset({seg[chunk]})
        elif op == "all_to_all":
            want[chunk % p][chunk] = frozenset({chunk // p})
        elif op == "send_recv":
            want[1][chunk] = frozenset({plan.root})
    return want


def _happens_before(plan: Plan) -> list[int]:
    """Bitsets: bit j of result[i] is set when transfer j must finish before transfer i starts."""
    before: list[int] = []
    for i, t in enumerate(plan.transfers):
        bits = 0
        for d in t.deps:
            if not 0 <= d < i:
                raise PlanError(f"transfer {i} depends on {d}, which is not an earlier transfer")
            bits |= before[d] | (1 << d)
        before.append(bits)
    return before


def verify(plan: Plan) -> None:
    """Raise PlanError unless ``plan`` computes ``plan.op`` (see the module docstring)."""
    info = op_info(plan.op)
    if info.segmented and plan.op != "all_to_all" and len(plan.chunk_segment) != plan.num_chunks:
        raise PlanError("a segmented op needs chunk_segment for every chunk")
    before = _happens_before(plan)
    state = _initial(plan)
    # writers[(peer, chunk)] = transfers that wrote it; readers likewise, to detect races.
    # Two reducing writes into the same chunk commute (NCCL receives each into its own buffer and
    # combines), so only a copy racing with any other write, or any write racing with a read, is a race.
    writers: dict[tuple[int, int], list[int]] = defaultdict(list)
    readers: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, t in enumerate(plan.transfers):
        if t.src == t.dst:
            raise PlanError(f"transfer {i} sends peer {t.src} to itself")
        src_key, dst_key = (t.src, t.chunk), (t.dst, t.chunk)
        for j in writers[src_key]:
            if not before[i] >> j & 1:
                raise PlanError(f"transfer {i} reads chunk {t.chunk} of peer {t.src} racing with write {j}")
        for j in writers[dst_key]:
            if not before[i] >> j & 1 and not (t.reduce and plan.transfers[j].reduce):
                raise PlanError(f"transfer {i} writes chunk {t.chunk} of peer {t.dst} racing with write {j}")
        for j in readers[dst_key]:
            if not before[i] >> j & 1:
                raise PlanError(f"transfer {i} writes chunk {t.chunk} of peer {t.dst} racing with read {j}")
        data = state[t.src].get(t.chunk)
        if data is None:
            raise PlanError(f"transfer {i}: peer {t.src} sends chunk {t.chunk} it does not hold")
        if t.reduce:
            held = state[t.dst].get(t.chunk, frozenset())
            if held & data:
                twice = sorted(held & data)
                raise PlanError(f"transfer {i}: peer {t.dst} would count {twice} twice in chunk {t.chunk}")
            state[t.dst][t.chunk] = held | data
        else:
            state[t.dst][t.chunk] = data
        readers[src_key].append(i)
        writers[dst_key].append(i)
    for peer, chunks in _expected(plan).items():
        for chunk, value in chunks.items():
            got = state[peer].get(chunk)
            if got != value:
                raise PlanError(
                    f"{plan.algorithm} {plan.op} on {plan.num_peers} peers: peer {peer} ends with chunk {chunk} = "
                    f"{sorted(got) if got is not None else None}, expected {sorted(value)}"
                )
