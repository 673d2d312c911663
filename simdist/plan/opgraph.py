"""The per-rank op graph: what each simulated rank runs, on which stream, after what.

A graph is a list of ops. Each op runs on one (rank, stream) track; a track executes its ops one at a
time *in the order they were added* (program order, as a CUDA stream does), and an op starts when its
track is free and every op in ``deps`` has finished. Compute ops carry their duration; communication
ops carry a ``Comm`` (what moves, over which global ranks) and get their duration from a pricing step
above this layer (simdist.predict), so the same graph can be priced in closed form or by the engine.

The engine (simdist.engine.graph) knows durations and dependencies only, nothing about transformers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simdist.plan.interference import taxed_s

STREAMS = ("compute", "tp", "cp", "pp", "dp", "ep")


@dataclass(frozen=True, slots=True)
class Comm:
    """A collective (or a point-to-point send) an op performs."""

    op: str
    """A simdist.collectives op name: all_reduce, all_gather, reduce_scatter, all_to_all, send_recv, ..."""
    ranks: tuple[int, ...]
    """Global ranks of the group, in peer order (for send_recv: (src, dst))."""
    nbytes: float
    """The nccl-tests size of the op (the full buffer; see simdist.collectives.ops)."""
    axis: str
    """The parallel axis it serves: tp, cp, pp, dp, or ep, etp, edp (the expert groups, simdist.plan.mesh)."""
    count: int = 1
    """How many times the op runs back to back (e.g. 2 all_reduces per layer x the chunk's layers)."""
    host_s: float = 0.0
    """Host time each run adds on top of the collective (list collectives' per-rank copies; simdist.plan.step)."""
    imbalance: float = 1.0
    """all_to_all: the busiest peer receives this many times the mean (simdist.collectives.uneven; 1.0: even)."""
    kernel: str = "nccl"
    """all_to_all: what moves it (nccl, or the flex dispatcher's deepep / hybridep: simdist.collectives.ep_kernels)."""


@dataclass(frozen=True, slots=True)
class Job:
    """A priced collective as the engine runs it: a fixed latency, then a fluid transfer.

    Alone, the op takes ``latency_s + bandwidth_s`` (its closed-form time). ``demand`` lists, for each directed
    link the op loads, (link id, bytes it puts there, flows it drives across it): the flows of its plan (one
    per channel and route for a ring) that cross the link at once. When concurrent ops share a link, they
    share its bandwidth max-min fairly per flow (simdist.engine.links), so contention stretches the transfer
    part only.
    """

    latency_s: float
    bandwidth_s: float
    demand: tuple[tuple[int, float, int], ...] = ()


@dataclass(slots=True)
class Op:
    name: str
    rank: int
    """The global rank whose track this op is on (a representative of its class in a reduced graph)."""
    stream: str
    kind: str
    """forward | backward | weight_grad | recompute | optimizer | comm (free text for traces)."""
    duration_s: float = math.nan
    """Seconds; NaN for a comm op until priced."""
    deps: list[int] = field(default_factory=list)
    stage: int = -1
    microbatch: int = -1
    chunk: int = -1
    comm: Comm | None = None
    model_flops: float = 0.0
    """FLOPs the model needs (no recompute); hardware FLOPs = model_flops + recompute ops' flops."""
    hardware_flops: float = 0.0
    job: Job | None = None
    """Set by pricing: the engine then times the op on the shared links instead of using duration_s."""
    sync: int = -1
    """Ops with the same sync id (>= 0) on different ranks are one collective: it starts when every one of
    them is ready and they all end together."""


@dataclass(frozen=True, slots=True, eq=False)
class OpRows:
    """Some fields of a graph's ops, known without reading each op: a builder that emits its ops from templates
    (simdist.plan.step_emitter) lists the distinct rows (kind, Comm, rank, whether the op belongs to a micro-batch
    (``microbatch >= 0``), model and hardware FLOPs) and per op the index of its row. Rows are in order of their
    first op (a row's first op comes after the first op of every row before it)."""

    row: np.ndarray
    """Per op, the index of its row (int64)."""
    kind: tuple[str, ...]
    comm: tuple[Comm | None, ...]
    """The op's Comm object itself (ops of one row share it)."""
    axis: tuple[str | None, ...]
    """The axis of the op's Comm (None: no Comm)."""
    rank: np.ndarray
    per_microbatch: np.ndarray
    """bool: the row's ops have ``microbatch >= 0``."""
    model_flops: np.ndarray
    hardware_flops: np.ndarray


@dataclass(slots=True)
class OpGraph:
    ops: list[Op] = field(default_factory=list)
    _tracks: dict[tuple[int, str], list[int]] | None = field(default=None, repr=False, compare=False)
    """`tracks`, once found (``add`` forgets it)."""
    rows: OpRows | None = field(default=None, repr=False, compare=False)
    """Set by the graph's builder once it is whole; read it through `op_rows`."""
    taxes: list[tuple[int, tuple[int, ...], float, float, tuple[float, ...]]] = field(default_factory=list,
                                                                                    repr=False, compare=False)
    """(op, the comm ops it stands beside, share, cap, pairing) of each compute op whose duration is the slowdown of
    the compute those collectives overlap (simdist.plan.interference): set once the comm ops are priced
    (`apply_taxes`)."""

    def apply_taxes(self) -> None:
        """Give each tax op its duration from its comm ops' priced durations (simdist.plan.interference.taxed_s)."""
        ops = self.ops
        for i, of, share, cap, pairing in self.taxes:
            ops[i].duration_s = taxed_s(share, sum(ops[k].duration_s for k in of), cap, pairing)

    def add(self, op: Op) -> int:
        """Append ``op`` (after everything already on its track) and return its id."""
        self.ops.append(op)
        self._tracks = None
        return len(self.ops) - 1

    def extend(self, ops: list[Op]) -> None:
        """``add`` each of ``ops`` in order (their ids: the graph's length before, + 0, 1, ...)."""
        self.ops.extend(ops)
        self._tracks = None

    def depend(self, op_id: int, *on: int) -> None:
        """Make ``op_id`` wait for each op in ``on`` (ids may refer to ops added later)."""
        deps = self.ops[op_id].deps
        for d in on:
            if d not in deps:
                deps.append(d)

    def tracks(self) -> dict[tuple[int, str], list[int]]:
        """(rank, stream) -> op ids in program order. Found once and shared by every caller (the engine, its
        uncontended timeline and the fast-forward's prefixes each read it): read it, do not change it."""
        out = self._tracks
        if out is None or sum(map(len, out.values())) != len(self.ops):
            out = {}
            for i, op in enumerate(self.ops):
                out.setdefault((op.rank, op.stream), []).append(i)
            self._tracks = out
        return out

    def op_rows(self) -> OpRows | None:
        """`rows` while they describe every op (None once ops were added after them, or without them). Ops' kind,
        comm, rank, micro-batch and FLOPs are not changed after building (pricing sets durations and jobs only)."""
        rows = self.rows
        return rows if rows is not None and len(rows.row) == len(self.ops) else None

    def ranks(self) -> list[int]:
        return sorted({op.rank for op in self.ops})

    def unpriced(self) -> list[int]:
        return [i for i, op in enumerate(self.ops) if math.isnan(op.duration_s)]
