"""A step's recipes instantiated as ops: `StepEmitter` (a simdist.plan.pipeline.PipelineEmitter) adds each
scheduled step's recipe (simdist.plan.recipe: the one step model, which the closed form reads too) to the op graph on
the streams of one data-parallel replica's representative ranks, one per pipeline stage, and its stages' tails;
`RowLog` lists the rows of the ops the emitters of one graph add (simdist.plan.opgraph.OpRows). The op graph's
assembly is simdist.plan.step.

What each step emits is simdist.plan.recipe's module docstring; this module wires it: a piece depending on
``PREV`` waits for the op that ended the stage's previous step; the piece that ``needs_input`` waits for the
neighbouring stage's send (simdist.plan.pipeline); a stage's tail waits for its last backwards and its last
data-parallel op.
"""

from __future__ import annotations

import math

import numpy as np

from simdist.plan.comm_overlap import a2a_overlapped, unpaired_steps
from simdist.plan.interference import tax_terms
from simdist.plan.opgraph import Comm, Op, OpGraph, OpRows
from simdist.plan.pieces import SLOWED_KINDS
from simdist.plan.recipe import (
    DP_DONE,
    LAST_BACKWARDS,
    PREV,
    Piece,
    Recipe,
    StageTail,
    send,
)
from simdist.plan.schedule import SPLIT_BACKWARD, Step, chunk_microbatches
from simdist.plan.step_config import StepConfig

__all__ = ["RowLog", "StepEmitter"]


_Row = tuple[str, Comm | None, int, bool, float, float]
"""(kind, Comm, rank, in a micro-batch, model FLOPs, hardware FLOPs) of ops (`OpRows`)."""


class RowLog:
    """The `OpRows` of a graph as its emitters add ops: the distinct rows, and per block of consecutive ops (a
    step's pieces, a send, a tail piece), in op order, which block of rows it repeats. An emitter registers a block
    right before it adds the block's first ops (rows in order of their first op, as OpRows says)."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.block_first: list[int] = []  # per distinct block: its first row
        self.block_size: list[int] = []
        self.blocks: list[int] = []  # per block of ops, in op order: its distinct block

    def block(self, rows: list[_Row]) -> int:
        """Register a block of rows; its id."""
        self.block_first.append(len(self.rows))
        self.block_size.append(len(rows))
        self.rows.extend(rows)
        return len(self.block_first) - 1

    def table(self, num_ops: int) -> OpRows | None:
        """The graph's `OpRows` (None unless the blocks account for its ``num_ops`` ops)."""
        seq = np.asarray(self.blocks, dtype=np.int64)
        size = np.asarray(self.block_size, dtype=np.int64)[seq]
        if int(size.sum()) != num_ops or not self.rows:
            return None
        first_op = np.cumsum(size) - size  # each block's first op
        row = np.repeat(np.asarray(self.block_first, dtype=np.int64)[seq] - first_op, size) + np.arange(num_ops)
        kind, comm, rank, per_microbatch, model, hardware = zip(*self.rows, strict=True)
        return OpRows(row, kind, comm, tuple(None if c is None else c.axis for c in comm),
                      np.asarray(rank, dtype=np.int64), np.asarray(per_microbatch, dtype=bool),
                      np.asarray(model, dtype=float), np.asarray(hardware, dtype=float))


class StepEmitter:
    """Instantiates each scheduled step's recipe for one data-parallel replica (a PipelineEmitter)."""

    def __init__(self, cfg: StepConfig, recipes: dict[tuple, Recipe], ranks: dict[int, int],
                 num_microbatches: int, factors: dict[int, float] | None = None, log: RowLog | None = None) -> None:
        self.cfg, self.recipes, self.ranks = cfg, recipes, ranks
        self.log = log if log is not None else RowLog()
        """Where the emitted ops' rows go (shared by the emitters of one graph)."""
        self.factors = factors or {}
        """stage -> time factor of its compute pieces (a straggler)."""
        self.num_microbatches = num_microbatches
        self.last: dict[int, int] = {}          # stage -> the op that ended its previous step
        self.last_backward: dict[tuple[int, int], int] = {}  # (stage, chunk) -> end of its last backward / W
        self.dp_last: dict[int, int] = {}       # stage -> its last data-parallel op so far
        self._groups: dict[tuple[str, int], tuple[int, ...]] = {}
        self._templates: dict[tuple, tuple[tuple, int, int, int, int]] = {}
        self._send = send(cfg)
        # (src, dst stage) -> (src rank, name, Comm, its block of rows)
        self._sends: dict[tuple[int, int], tuple[int, str, Comm, int]] = {}
        self._tagged: Step | None = None
        self._tag_text = ""
        self._chunked = cfg.chunks > 1  # a step's tag names its chunk (Step.label)
        # a B ends its chunk's backward (a split backward, zb_h1 and the two-chunk schedules: its W does)
        self._b_ends_backward = cfg.schedule not in SPLIT_BACKWARD
        # each chunk's edge micro-batches (simdist.plan.recipe.is_edge): (first F, last B or W) by chunk
        self._edges = [chunk_microbatches(cfg.schedule, c, num_microbatches) for c in range(cfg.chunks)]
        # the steps the 1F1B A2A overlap runs alone (simdist.plan.comm_overlap.unpaired, as the closed form's program)
        self._alone = (unpaired_steps(cfg.schedule, cfg.mesh.pp, num_microbatches, cfg.vpp) if a2a_overlapped(cfg)
                       else frozenset())

    def _group(self, axis: str, stage: int) -> tuple[int, ...]:
        key = (axis, stage)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = self.cfg.mesh.group(axis, self.ranks[stage])
        return g

    def _add(self, graph: OpGraph, stage: int, piece: Piece, name: str, deps: list[int], microbatch: int,
             chunk: int) -> int:
        c = piece.comm
        comm = None if c is None else Comm(c.op, self._group(c.axis, stage), c.nbytes, c.axis, c.count, c.host_s,
                                           c.imbalance, c.kernel)
        duration = math.nan if c is not None else piece.duration_s
        if c is None and piece.kind in SLOWED_KINDS:
            duration *= self.factors.get(stage, 1.0)
        i = graph.add(Op(name=name, rank=self.ranks[stage], stream=piece.stream, kind=piece.kind,
                         duration_s=duration, deps=deps, stage=stage,
                         microbatch=-1 if piece.per_step else microbatch, chunk=chunk, comm=comm,
                         model_flops=piece.model_flops, hardware_flops=piece.hardware_flops))
        log = self.log
        log.blocks.append(log.block([(piece.kind, comm, self.ranks[stage],
                                      not piece.per_step and microbatch >= 0, piece.model_flops,
                                      piece.hardware_flops)]))
        if piece.stream == "dp":
            self.dp_last[stage] = i
        return i

    def _template(self, stage: int, key: tuple) -> tuple[tuple, int, int, int, int]:
        """A recipe instantiated on ``stage`` once (its ops differ by name, micro-batch and chunk only): per piece
        (its fixed name or None, what follows the step's tag in its name, stream, kind, duration, deps inside the
        recipe: the first, the second (-1: none) and all where more than two, waits for the previous step, runs
        once per step, Comm, model and hardware FLOPs), the index of the piece that ends the step, of the one that
        takes the input (0 where none does) and of the last on the dp stream (-1: none), and its block of rows in the
        `RowLog`; kept by ``key``."""
        got = self._templates.get(key)
        if got is None:
            recipe = self.recipes[key]
            factor = self.factors.get(stage, 1.0)
            rows = []
            taxes = []
            entry = last_dp = -1
            for j, p in enumerate(recipe.pieces):
                if p.tax_of:  # priced once its collectives are (OpGraph.apply_taxes)
                    taxes.append((j, p.tax_of, *tax_terms(p, factor)))
                c = p.comm
                comm = None if c is None else Comm(c.op, self._group(c.axis, stage), c.nbytes, c.axis, c.count,
                                                   c.host_s, c.imbalance, c.kernel)
                duration = math.nan if c is not None else p.duration_s
                if c is None and p.kind in SLOWED_KINDS:
                    duration *= factor
                # the name: the piece's label once per step; else the step's tag, then "/label", " label" or nothing
                fixed = p.label if p.per_step else None
                suffix = p.label if p.label.startswith("/") else f" {p.label}" if p.label else ""
                inner = tuple(d for d in p.deps if d >= 0)
                # deps inside the recipe as up to two indices (-1: none) or, past two, the whole tuple (`compute`)
                first_dep = inner[0] if inner else -1
                second_dep = inner[1] if len(inner) > 1 else -1
                rows.append((fixed, suffix, p.stream, p.kind, duration, first_dep, second_dep,
                             inner if len(inner) > 2 else None, PREV in p.deps, p.per_step, comm, p.model_flops,
                             p.hardware_flops))
                if p.needs_input and entry < 0:
                    entry = j
                if p.stream == "dp":
                    last_dp = j
            # a scheduled step's micro-batch is one of 0..M-1 (simdist.plan.schedule.schedule_order): its pieces that
            # do not run once per step have microbatch >= 0 (OpRows.per_microbatch)
            rank = self.ranks[stage]
            block = self.log.block([(kind, comm, rank, not per_step, model_flops, hardware_flops)
                                    for _, _, _, kind, _, _, _, _, _, per_step, comm, model_flops, hardware_flops
                                    in rows])
            got = self._templates[key] = (tuple(rows), recipe.end, max(entry, 0), last_dp, block, tuple(taxes))
        return got

    def _tag(self, step: Step) -> str:
        """``step.label(vpp)``, kept for the step's transfer (asked for right after its compute)."""
        if step is not self._tagged:
            self._tagged, self._tag_text = step, step.label(self.cfg.chunks)
        return self._tag_text

    # -- PipelineEmitter
    def compute(self, graph: OpGraph, stage: int, step: Step) -> tuple[int, int]:
        kind, microbatch, chunk = step.kind, step.microbatch, step.chunk
        # the template of (stage, chunk, kind, is_edge(kind, microbatch, num_microbatches, schedule, chunk), alone)
        alone = bool(self._alone) and (stage, kind, microbatch, chunk) in self._alone
        key = (stage, chunk, kind, microbatch == self._edges[chunk][kind != "F"], alone)
        got = self._templates.get(key)
        rows, end_piece, entry_piece, dp_piece, block, taxes = got if got is not None else self._template(stage, key)
        self.log.blocks.append(block)
        # the step's tag, step.label(vpp) in one f-string; kept for its transfer (asked for right after)
        tag = f"{kind}{microbatch}.{chunk}" if self._chunked else f"{kind}{microbatch}"
        self._tagged, self._tag_text = step, tag
        rank = self.ranks[stage]
        previous = self.last.get(stage)
        ops = graph.ops
        first = len(ops)  # the step's pieces become ops first, first + 1, ... in order (OpGraph.add's ids)
        new = []
        append = new.append
        for (fixed, suffix, stream, op_kind, duration, d0, d1, many, prev, per_step, comm, model_flops,
             hardware_flops) in rows:
            # [first + d for d in the piece's deps inside the recipe], without a comprehension for one or two
            if many is not None:
                deps = [first + d for d in many]
            elif d1 >= 0:
                deps = [first + d0, first + d1]
            elif d0 >= 0:
                deps = [first + d0]
            else:
                deps = []
            if prev and previous is not None:
                deps.insert(0, previous)
            # Op's fields in order (name, rank, stream, kind, duration_s, deps, stage, microbatch, chunk, comm,
            # model_flops, hardware_flops): positional arguments cost a third of keywords, once per op of the graph
            append(Op(tag + suffix if fixed is None else fixed, rank, stream, op_kind, duration, deps, stage,
                      -1 if per_step else microbatch, chunk, comm, model_flops, hardware_flops))
        graph.extend(new)
        for j, of, share, cap, pairing in taxes:
            graph.taxes.append((first + j, tuple(first + k for k in of), share, cap, pairing))
        if dp_piece >= 0:
            self.dp_last[stage] = first + dp_piece
        end = first + end_piece
        self.last[stage] = end
        if kind == "W" or (kind == "B" and self._b_ends_backward):
            self.last_backward[(stage, chunk)] = end
        return first + entry_piece, end

    def transfer(self, graph: OpGraph, src_stage: int, dst_stage: int, step: Step) -> int | None:
        if src_stage == dst_stage:
            return None
        pair = self._sends.get((src_stage, dst_stage))
        if pair is None:  # one Comm per (src, dst) stages, shared by its sends (it is frozen, as a recipe piece's)
            c = self._send
            src, dst = self.ranks[src_stage], self.ranks[dst_stage]
            comm = Comm(c.op, (src, dst), c.nbytes, c.axis, c.count)
            pair = self._sends[(src_stage, dst_stage)] = (src, f" send to stage {dst_stage}", comm,
                                                          self.log.block([("comm", comm, src, True, 0.0, 0.0)]))
        src, suffix, comm, block = pair
        self.log.blocks.append(block)  # a send's micro-batch is its step's, >= 0 (as in `_template`)
        tag = self._tag_text if step is self._tagged else self._tag(step)
        # positional: Op(name, rank, stream, kind, duration_s, deps, stage, microbatch, chunk, comm), see compute
        return graph.add(Op(tag + suffix, src, "pp", "comm", math.nan, [], src_stage, step.microbatch, step.chunk,
                            comm))

    def finish(self, graph: OpGraph, stage: int, stage_tail: StageTail) -> None:
        """The stage's tail (simdist.plan.data_parallel.tail): gradient reduction, optimizer, parameter all_gather."""
        backwards = [v for (s, _), v in self.last_backward.items() if s == stage]
        ids: list[int] = []
        for p in stage_tail.pieces:
            deps = [ids[d] for d in p.deps if d >= 0]
            if DP_DONE in p.deps and stage in self.dp_last:
                deps.append(self.dp_last[stage])
            if LAST_BACKWARDS in p.deps:
                deps += backwards
            ids.append(self._add(graph, stage, p, p.label, deps, -1, -1))
            if p.tax_of:
                graph.taxes.append((ids[-1], tuple(ids[k] for k in p.tax_of),
                                    *tax_terms(p, self.factors.get(stage, 1.0))))
