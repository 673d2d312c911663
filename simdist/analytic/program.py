"""A pipeline schedule as a flat program for the closed form: every step of every stage in an order that evaluates
each step after the step on its stage before it and after the neighbouring stage's step it receives from.

The dependencies are simdist.plan.pipeline's (Narayanan et al. 2021 sec. 2.2): F of model part j needs F of part
j-1, B of part j needs B of part j+1, wherever the schedule places the parts (Megatron's interleaving, the V of zb_v
and dualpipev, dualpipe's two directions); within a stage steps run in program order; DualPipe(V)'s held sends
leave when the step that sends them ends. Cached per (schedule, K, M, V).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from simdist.errors import SpecError
from simdist.plan.comm_overlap import unpaired
from simdist.plan.schedule import (
    STEP_KINDS,
    chunks_per_stage,
    model_part,
    num_model_parts,
    part_location,
    stage_steps,
)
from simdist.plan.schedule_v import late_sends

__all__ = ["KIND_INDEX", "Program", "program", "recipe_code", "step_groups"]

KIND_INDEX = {"F": 0, "B": 1, "W": 2}


def recipe_code(chunk: int, kind: str, edge: bool) -> int:
    """Dense index of a step recipe of a stage: (chunk, kind, whether it is the chunk's edge micro-batch: a
    forward's first, a backward's or W's last, simdist.plan.recipe.is_edge)."""
    return (chunk * 3 + KIND_INDEX[kind]) * 2 + int(edge)


class Program:
    """The steps of a schedule in program order: numpy arrays (``steps``, ``kinds``), and the same as tuples of
    Python values for the step-by-step timeline (`stage`, `kind`, ...), made on first use: a search times its
    thousands of steps compiled, from the arrays alone, and keeps hundreds of programs (`program`'s cache)."""

    __slots__ = ("_counts", "_tuples", "kinds", "steps")

    def __init__(self, steps: np.ndarray, kinds: np.ndarray) -> None:
        self.steps = steps
        """(7, len) int64: stage, `recipe_code`, upstream (index in this program of the step whose output this step
        receives; -1: none), downstream stage (the stage it sends its output to; -1: none, or the same stage), and
        DualPipe(V)'s held sends (simdist.plan.schedule_v.late_sends): late (1: the step's output waits for a later
        step of its stage), held first (the first late step whose output this step's end sends, after its own;
        -1: none) and held next (the next late step of the same sender; -1: the last)."""
        self.kinds = kinds
        """(3, len) int64: kind index (`KIND_INDEX`), micro-batch and chunk of each step."""
        self._tuples: tuple[tuple, ...] | None = None
        self._counts: np.ndarray | None = None

    @property
    def counts(self) -> np.ndarray:
        """(K, codes) int64: how many steps each stage runs of each `recipe_code` (made on first use): what the
        compiled timeline sizes its buffers by without a pass over the steps."""
        if self._counts is None:
            stage, code = self.steps[0], self.steps[1]
            num_codes = int(code.max()) + 1 if len(code) else 1
            num_stages = int(stage.max()) + 1 if len(stage) else 1
            counts = np.bincount(stage * num_codes + code, minlength=num_stages * num_codes)
            self._counts = counts.reshape(num_stages, num_codes).astype(np.int64)
            self._counts.flags.writeable = False
        return self._counts

    def _columns(self) -> tuple[tuple, ...]:
        if self._tuples is None:
            names = np.array(STEP_KINDS)
            self._tuples = (tuple(self.steps[0].tolist()), tuple(names[self.kinds[0]].tolist()),
                            tuple(self.kinds[1].tolist()), tuple(self.kinds[2].tolist()),
                            tuple(self.steps[2].tolist()), tuple(self.steps[3].tolist()),
                            tuple(self.steps[1].tolist()))
        return self._tuples

    stage = property(lambda self: self._columns()[0])
    kind = property(lambda self: self._columns()[1])
    microbatch = property(lambda self: self._columns()[2])
    chunk = property(lambda self: self._columns()[3])
    upstream = property(lambda self: self._columns()[4],
                        doc="Index (in this program) of the step whose output this step receives; -1: none.")
    downstream_stage = property(lambda self: self._columns()[5],
                                doc="Stage this step sends its output to (-1: none, or the same stage).")
    code = property(lambda self: self._columns()[6], doc="`recipe_code` of the step (chunk, kind, edge micro-batch).")

    def __len__(self) -> int:
        return self.steps.shape[1]


@lru_cache(maxsize=512)
def program(schedule: str, num_stages: int, num_microbatches: int, vpp: int, alone: bool = False) -> Program:
    """The schedule's steps in an order that evaluates each after its stage's previous step and its input's sender.
    ``alone``: the steps Megatron-Core's 1F1B A2A overlap runs without a partner (simdist.plan.comm_overlap
    .unpaired) take the recipe codes after the stage's others, ``6 V + recipe_code`` (the same kind, chunk and edge:
    ``code >> 1`` then names the chunk's sends a second time, and ``code % 6`` and ``(code >> 1) % 3`` read as
    before)."""
    k, M = num_stages, num_microbatches
    v = chunks_per_stage(schedule, vpp)
    rows = stage_steps(schedule, num_stages=k, num_microbatches=M, vpp=vpp)
    num_parts = num_model_parts(schedule, k, vpp)
    # every stage's steps, in program order, as arrays: kind index, micro-batch, chunk (from their numbers:
    # (kind index x M + micro-batch) x V + chunk)
    lengths = [len(row) for row in rows]
    steps = np.concatenate(rows)
    chunk, q = steps % v, steps // v
    mb, kind = q % M, q // M
    stage = np.repeat(np.arange(k, dtype=np.int64), lengths)
    # where the parts sit (simdist.plan.schedule.model_part, part_location; dualpipe's by the micro-batch's direction)
    part_of = np.array([[model_part(s, c, k, schedule) for c in range(v)] for s in range(k)], dtype=np.int64)
    where = np.array([[part_location(p, k, schedule, d) for p in range(num_parts)] for d in (0, 1)],
                     dtype=np.int64).reshape(2, num_parts, 2)
    direction = (mb >= M // 2).astype(np.int64) if schedule == "dualpipe" else np.zeros(len(steps), dtype=np.int64)
    part = part_of[stage, chunk]
    # a step's key: (stage, kind, micro-batch, chunk) as one number; its upstream's key (-1: none) and the stage it
    # sends to (-1: none, or itself): F of part j receives from F of part j - 1, B of part j from B of part j + 1
    key = ((stage * 3 + kind) * M + mb) * v + chunk
    fwd, bwd = kind == 0, kind == 1
    nxt, prv = np.minimum(part + 1, num_parts - 1), np.maximum(part - 1, 0)
    nxt_at, prv_at = where[direction, nxt], where[direction, prv]  # (stage, chunk) of the next and previous part
    up = np.full(len(steps), -1, dtype=np.int64)
    down = np.full(len(steps), -1, dtype=np.int64)
    sel = fwd & (part > 0)
    up[sel] = ((prv_at[sel, 0] * 3) * M + mb[sel]) * v + prv_at[sel, 1]
    sel = fwd & (part + 1 < num_parts) & (nxt_at[:, 0] != stage)
    down[sel] = nxt_at[sel, 0]
    sel = bwd & (part + 1 < num_parts)
    up[sel] = ((nxt_at[sel, 0] * 3 + 1) * M + mb[sel]) * v + nxt_at[sel, 1]
    sel = bwd & (part > 0) & (prv_at[:, 0] != stage)
    down[sel] = prv_at[sel, 0]
    first = np.where(direction == 1, M // 2, 0) if schedule == "dualpipe" else 0  # simdist.plan.recipe.is_edge
    last = np.where(direction == 1, M - 1, M // 2 - 1) if schedule == "dualpipe" else M - 1
    code = (chunk * 3 + kind) * 2 + (mb == np.where(fwd, first, last))  # recipe_code, with is_edge
    if alone:
        code = np.where(unpaired(kind, lengths), code + 6 * v, code)
    total = len(steps)
    position_of = np.full(k * 3 * M * v, total, dtype=np.int64)  # a step's position, by key
    position_of[key] = np.arange(total, dtype=np.int64)
    # DualPipe(V)'s sends held for a later step of the stage (simdist.plan.schedule_v.late_sends): the step whose end
    # sends each step's output, as a position (itself where the output leaves as the step ends)
    sender = np.arange(total, dtype=np.int64)
    for (s, kd, i, c), (kd2, i2, c2) in late_sends(schedule, k, M).items():
        sender[position_of[((s * 3 + KIND_INDEX[kd]) * M + i) * v + c]] = \
            position_of[((s * 3 + KIND_INDEX[kd2]) * M + i2) * v + c2]
    # Merge the stages into one order: sweep the stages in turn, each run as far as its next step's input is there
    # (sent: its upstream step's sender has run). Each step's upstream as a position in the stages' arrays (-1: none;
    # ``total``: a step no stage runs, which never enters the program); the sweep gives each step its index in the
    # program (-1: not yet in it), from which the order and the upstream indices follow in numpy.
    up_position = np.where(up >= 0, position_of[np.maximum(up, 0)], -1)
    gate = np.where(up_position >= 0, np.append(sender, total)[np.maximum(up_position, 0)], -1)
    up_positions = gate.tolist()
    firsts = np.cumsum([0, *lengths]).tolist()
    position = firsts[:-1]
    index = [-1] * (total + 1)  # per position: its index in the program
    n = 0
    while n < total:
        progressed = False
        for s in range(k):
            p = begin = position[s]
            stop = firsts[s + 1]
            while p < stop:
                u = up_positions[p]
                if u >= 0 and index[u] < 0:
                    break
                index[p] = n
                n += 1
                p += 1
            if p > begin:
                progressed = True
                position[s] = p
        if not progressed:  # pragma: no cover - the bundled schedules never deadlock
            raise SpecError(f"schedule {schedule} deadlocks on {k} stages and {M} micro-batches",
                            field="schedule", fix="use one of the bundled schedules")
    index_of = np.asarray(index[:total], dtype=np.int64)
    at = np.empty(total, dtype=np.int64)  # the program's steps, as positions in the stages' arrays
    at[index_of] = np.arange(total, dtype=np.int64)
    up_at = up_position[at]
    upstream = np.where(up_at >= 0, index_of[np.maximum(up_at, 0)], -1)
    # the held sends as program indices: a held step is late (it does not send as it ends); its sender sends, after
    # its own, the held ones in program order (first held, then each one's next: -1 ends the chain)
    late = np.zeros(total, dtype=np.int64)
    held_first = np.full(total, -1, dtype=np.int64)
    held_next = np.full(total, -1, dtype=np.int64)
    tail_of: dict[int, int] = {}
    for pos in np.flatnonzero(sender != np.arange(total)).tolist():  # positions in program order within a stage
        i, j = int(index_of[pos]), int(index_of[sender[pos]])
        late[i] = 1
        if j in tail_of:
            held_next[tail_of[j]] = i
        else:
            held_first[j] = i
        tail_of[j] = i
    steps = np.stack([stage[at], code[at], upstream, down[at], late, held_first, held_next])
    kinds = np.stack([kind[at], mb[at], chunk[at]])
    steps.flags.writeable = kinds.flags.writeable = False  # (cached: shared by every caller)
    return Program(steps, kinds)


@lru_cache(maxsize=64)
def step_groups(schedule: str, num_stages: int, num_microbatches: int, vpp: int
                ) -> tuple[tuple[tuple[int, str, int], np.ndarray], ...]:
    """The steps of `program` grouped by (stage, kind, chunk), in order of each group's first step: (the key, its
    steps' indices in the program, in program order, which is micro-batch order). A timeline that records every
    step's start by program index groups them so (simdist.analytic.timeline._compiled_timeline)."""
    prog = program(schedule, num_stages, num_microbatches, vpp)
    stage = prog.steps[0]
    kind_chunk = prog.steps[1] >> 1  # recipe_code // 2: chunk * 3 + kind index
    key = (stage * 3 + kind_chunk % 3) * chunks_per_stage(schedule, vpp) + kind_chunk // 3
    order = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    groups = np.split(order, bounds)
    groups.sort(key=lambda idx: int(idx[0]))
    return tuple(((int(stage[i]), STEP_KINDS[int(prog.kinds[0, i])], int(prog.kinds[2, i])), idx)
                 for idx in groups for i in (int(idx[0]),))
