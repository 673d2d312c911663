"""A pipeline schedule as a flat program for the closed form: every step of every stage in an order that evaluates
each step after the step on its stage before it and after the neighbouring stage's step it receives from.

The dependencies are simdist.plan.pipeline's (Narayanan et al. 2021 sec. 2.2): F of model part j needs F of part
j-1, B of part j needs B of part j+1; within a stage steps run in program order. Cached per (schedule, K, M, V).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from simdist.errors import SpecError
from simdist.plan.schedule import STEP_KINDS, stage_steps

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

    __slots__ = ("_tuples", "kinds", "steps")

    def __init__(self, steps: np.ndarray, kinds: np.ndarray) -> None:
        self.steps = steps
        """(4, len) int64: stage, `recipe_code`, upstream (index in this program of the step whose output this step
        receives; -1: none) and downstream stage (the stage it sends its output to; -1: none, or the same stage)."""
        self.kinds = kinds
        """(3, len) int64: kind index (`KIND_INDEX`), micro-batch and chunk of each step."""
        self._tuples: tuple[tuple, ...] | None = None

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
def program(schedule: str, num_stages: int, num_microbatches: int, vpp: int) -> Program:
    k, v, M = num_stages, vpp, num_microbatches
    rows = stage_steps(schedule, num_stages=k, num_microbatches=M, vpp=v)
    num_parts = k * v
    # every stage's steps, in program order, as arrays: kind index, micro-batch, chunk (from their numbers:
    # (kind index x M + micro-batch) x V + chunk)
    lengths = [len(row) for row in rows]
    steps = np.concatenate(rows)
    chunk, q = steps % v, steps // v
    mb, kind = q % M, q // M
    stage = np.repeat(np.arange(k, dtype=np.int64), lengths)
    part = chunk * k + stage  # simdist.plan.schedule.model_part
    # a step's key: (stage, kind, micro-batch, chunk) as one number; its upstream's key (-1: none) and the stage it
    # sends to (-1: none, or itself): F of part j receives from F of part j - 1, B of part j from B of part j + 1
    key = ((stage * 3 + kind) * M + mb) * v + chunk
    fwd, bwd = kind == 0, kind == 1
    nxt, prv = part + 1, part - 1
    up = np.full(len(steps), -1, dtype=np.int64)
    down = np.full(len(steps), -1, dtype=np.int64)
    sel = fwd & (part > 0)
    up[sel] = (((prv[sel] % k) * 3) * M + mb[sel]) * v + prv[sel] // k
    sel = fwd & (nxt < num_parts) & (nxt % k != stage)
    down[sel] = nxt[sel] % k
    sel = bwd & (nxt < num_parts)
    up[sel] = (((nxt[sel] % k) * 3 + 1) * M + mb[sel]) * v + nxt[sel] // k
    sel = bwd & (part > 0) & (prv % k != stage)
    down[sel] = prv[sel] % k
    code = (chunk * 3 + kind) * 2 + (mb == np.where(fwd, 0, M - 1))  # recipe_code, with is_edge
    # Merge the stages into one order: sweep the stages in turn, each run as far as its next step's input is there.
    # Each step's upstream as a position in the stages' arrays (-1: none; ``total``: a step no stage runs, which
    # never enters the program); the sweep gives each step its index in the program (-1: not yet in it), from which
    # the order and the upstream indices follow in numpy.
    total = len(steps)
    position_of = np.full(k * 3 * M * v, total, dtype=np.int64)  # a step's position, by key
    position_of[key] = np.arange(total, dtype=np.int64)
    up_position = np.where(up >= 0, position_of[np.maximum(up, 0)], -1)
    up_positions = up_position.tolist()
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
    steps = np.stack([stage[at], code[at], upstream, down[at]])
    kinds = np.stack([kind[at], mb[at], chunk[at]])
    steps.flags.writeable = kinds.flags.writeable = False  # (cached: shared by every caller)
    return Program(steps, kinds)


@lru_cache(maxsize=64)
def step_groups(schedule: str, num_stages: int, num_microbatches: int, vpp: int
                ) -> tuple[tuple[tuple[int, str, int], np.ndarray], ...]:
    """The steps of `program` grouped by (stage, kind, chunk), in order of each group's first step: (the key, its
    steps' indices in the program, in program order, which is micro-batch order). A timeline that records every
    step's start by program index groups them so (simdist.analytic.step._timeline_fast)."""
    prog = program(schedule, num_stages, num_microbatches, vpp)
    stage = prog.steps[0]
    kind_chunk = prog.steps[1] >> 1  # recipe_code // 2: chunk * 3 + kind index
    key = (stage * 3 + kind_chunk % 3) * vpp + kind_chunk // 3
    order = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    groups = np.split(order, bounds)
    groups.sort(key=lambda idx: int(idx[0]))
    return tuple(((int(stage[i]), STEP_KINDS[int(prog.kinds[0, i])], int(prog.kinds[2, i])), idx)
                 for idx in groups for i in (int(idx[0]),))
