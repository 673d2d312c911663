"""A pipeline schedule as a flat program for the closed form: every step of every stage in an order that evaluates
each step after the step on its stage before it and after the neighbouring stage's step it receives from.

The dependencies are simdist.plan.pipeline's (Narayanan et al. 2021 sec. 2.2): F of model part j needs F of part
j-1, B of part j needs B of part j+1; within a stage steps run in program order. Cached per (schedule, K, M, V).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simdist.errors import SpecError
from simdist.plan.schedule import model_part, schedule_order

__all__ = ["KIND_INDEX", "Program", "program", "recipe_code"]

KIND_INDEX = {"F": 0, "B": 1, "W": 2}


def recipe_code(chunk: int, kind: str, last: bool) -> int:
    """Dense index of a step recipe of a stage: (chunk, kind, whether it is the last micro-batch)."""
    return (chunk * 3 + KIND_INDEX[kind]) * 2 + int(last)


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
    """`recipe_code` of the step (chunk, kind, last micro-batch)."""

    def __len__(self) -> int:
        return len(self.stage)


def _neighbour(stage: int, kind: str, chunk: int, k: int, num_parts: int) -> tuple[int, int] | None:
    part = model_part(stage, chunk, k)
    if kind == "F" and part + 1 < num_parts:
        nxt = part + 1
    elif kind == "B" and part > 0:
        nxt = part - 1
    else:
        return None
    return nxt % k, nxt // k


@lru_cache(maxsize=512)
def program(schedule: str, num_stages: int, num_microbatches: int, vpp: int) -> Program:
    k, v = num_stages, vpp
    order = schedule_order(schedule, num_stages=k, num_microbatches=num_microbatches, vpp=v)
    num_parts = k * v
    position = [0] * k
    done: dict[tuple[int, str, int, int], int] = {}
    stage, kind, mb, chunk, upstream, down, code = [], [], [], [], [], [], []
    total = sum(len(o) for o in order)
    while len(stage) < total:
        progressed = False
        for s in range(k):
            steps = order[s]
            while position[s] < len(steps):
                st = steps[position[s]]
                up = -1
                if st.kind in ("F", "B"):
                    part = model_part(s, st.chunk, k)
                    src = part - 1 if st.kind == "F" else part + 1
                    if 0 <= src < num_parts:
                        key = (src % k, st.kind, st.microbatch, src // k)
                        if key not in done:
                            break
                        up = done[key]
                done[(s, st.kind, st.microbatch, st.chunk)] = len(stage)
                nb = _neighbour(s, st.kind, st.chunk, k, num_parts)
                stage.append(s)
                kind.append(st.kind)
                mb.append(st.microbatch)
                chunk.append(st.chunk)
                upstream.append(up)
                down.append(nb[0] if nb is not None and nb[0] != s else -1)
                code.append(recipe_code(st.chunk, st.kind, st.microbatch == num_microbatches - 1))
                position[s] += 1
                progressed = True
        if not progressed:  # pragma: no cover - the bundled schedules never deadlock
            raise SpecError(f"schedule {schedule} deadlocks on {k} stages and {num_microbatches} micro-batches",
                            field="schedule", fix="use one of the bundled schedules")
    return Program(tuple(stage), tuple(kind), tuple(mb), tuple(chunk), tuple(upstream), tuple(down), tuple(code))
