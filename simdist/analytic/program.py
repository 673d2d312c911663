"""A pipeline schedule as a flat program for the closed form: every step of every stage in an order that evaluates
each step after the step on its stage before it and after the neighbouring stage's step it receives from.

The dependencies are simdist.plan.pipeline's (Narayanan et al. 2021 sec. 2.2): F of model part j needs F of part
j-1, B of part j needs B of part j+1; within a stage steps run in program order. Cached per (schedule, K, M, V).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simdist.errors import SpecError
from simdist.plan.schedule import schedule_order

__all__ = ["KIND_INDEX", "Program", "program", "recipe_code"]

KIND_INDEX = {"F": 0, "B": 1, "W": 2}


def recipe_code(chunk: int, kind: str, edge: bool) -> int:
    """Dense index of a step recipe of a stage: (chunk, kind, whether it is the chunk's edge micro-batch: a
    forward's first, a backward's or W's last, simdist.plan.recipe.is_edge)."""
    return (chunk * 3 + KIND_INDEX[kind]) * 2 + int(edge)


@dataclass(frozen=True, slots=True)
class Program:
    stage: tuple[int, ...]
    kind: tuple[str, ...]
    microbatch: tuple[int, ...]
    chunk: tuple[int, ...]
    upstream: tuple[int, ...]
    """Index (in this program) of the step whose output this step receives; -1: none."""
    downstream_stage: tuple[int, ...]
    """Stage this step sends its output to (-1: none, or the same stage)."""
    code: tuple[int, ...]
    """`recipe_code` of the step (chunk, kind, edge micro-batch)."""

    def __len__(self) -> int:
        return len(self.stage)


@lru_cache(maxsize=512)
def program(schedule: str, num_stages: int, num_microbatches: int, vpp: int) -> Program:
    k, v, M = num_stages, vpp, num_microbatches
    order = schedule_order(schedule, num_stages=k, num_microbatches=M, vpp=v)
    num_parts = k * v
    kinds = {"F": 0, "B": 1, "W": 2}
    # each stage's steps as (kind index, micro-batch, chunk, upstream key or -1, downstream stage or -1, code)
    rows: list[list[tuple]] = []
    for s in range(k):
        row = []
        for st in order[s]:
            kind = kinds[st.kind]
            part = st.chunk * k + s  # simdist.plan.schedule.model_part
            up = down = -1
            if kind == 0:
                if part > 0:
                    up = ((((part - 1) % k) * 3) * M + st.microbatch) * v + (part - 1) // k
                if part + 1 < num_parts and (part + 1) % k != s:
                    down = (part + 1) % k
            elif kind == 1:
                if part + 1 < num_parts:
                    up = ((((part + 1) % k) * 3 + 1) * M + st.microbatch) * v + (part + 1) // k
                if part > 0 and (part - 1) % k != s:
                    down = (part - 1) % k
            code = (st.chunk * 3 + kind) * 2 + (st.microbatch == (0 if kind == 0 else M - 1))  # recipe_code, is_edge
            row.append((st.kind, st.microbatch, st.chunk, up, down, code, ((s * 3 + kind) * M + st.microbatch) * v
                         + st.chunk))
        rows.append(row)
    position = [0] * k
    done: dict[int, int] = {}
    stage, kind, mb, chunk, upstream, down, code = [], [], [], [], [], [], []
    total = sum(len(r) for r in rows)
    while len(stage) < total:
        progressed = False
        for s in range(k):
            row = rows[s]
            p = position[s]
            while p < len(row):
                kd, m, c, up_key, dn, cd, key = row[p]
                if up_key >= 0:
                    up = done.get(up_key, -2)
                    if up == -2:
                        break
                else:
                    up = -1
                done[key] = len(stage)
                stage.append(s)
                kind.append(kd)
                mb.append(m)
                chunk.append(c)
                upstream.append(up)
                down.append(dn)
                code.append(cd)
                p += 1
                progressed = True
            position[s] = p
        if not progressed:  # pragma: no cover - the bundled schedules never deadlock
            raise SpecError(f"schedule {schedule} deadlocks on {k} stages and {M} micro-batches",
                            field="schedule", fix="use one of the bundled schedules")
    return Program(tuple(stage), tuple(kind), tuple(mb), tuple(chunk), tuple(upstream), tuple(down), tuple(code))
