"""The closed form's schedule recurrence, compiled: one program of steps timed over a stage's priced recipes as
arrays (numba; the README says why a JIT and not numpy).

Each step of a schedule's program depends on the one before it on its stage and on its upstream step: a
max-plus recurrence that numpy cannot vectorise (every step reads what the previous one wrote) and that costs
3-5 us per step in Python, or 12-20 ms for one configuration of a layout search. Compiled, a step costs tens of
nanoseconds. The rule is simdist.analytic.timeline's (the engine's execution rule with nothing contending), stated
once here for the steps whose core streams are free when they start (`simdist.analytic.timeline._fast`):

- a *simple* step (a recipe whose core pieces follow each other without a gap: `_Simple`) costs one addition:
  it starts when its stage's previous step, its compute stream and its input are done, after any parameter
  gathers issued ahead of it on the dp stream; its dp pieces behind queue on the dp stream;
- any other step (a chunk's first forward with its gathers) and each stage's tail run piece by piece, each
  piece when its stream is free and its dependencies are done;
- a step that feeds another stage sends on its pp stream after it ends (DualPipe(V)'s held sends after the later
  step that sends them).

`pack` lays a configuration's stages out as arrays once; `run_program` times a program over them (the compiled
loop: simdist.analytic.timeline_jit, loaded on first use) and returns every interval that the accounting
(simdist.plan.accounting_kernel) needs. tests/test_timeline_kernel.py checks
it against the step-by-step timeline (`simdist.analytic.timeline._timeline`), the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from simdist.plan.accounting import CATEGORIES

__all__ = ["GENERIC", "NONE", "SIMPLE", "Packed", "Unit", "pack", "pack_stage", "run_program"]

_CATEGORY = {c: i for i, c in enumerate(CATEGORIES)}
NONE, SIMPLE, GENERIC = 0, 1, 2


class Unit(NamedTuple):
    """One stage's priced recipes as arrays (C recipe codes), made once per distinct stage (`pack_stage`). A named
    tuple: `pack` reads one field of all the units it joins at once (``zip(*units)``).

    ``kind`` (C): NONE, SIMPLE or GENERIC (timed piece by piece: ``recipe`` (C) names its entry in the pieces
    table). Simple recipes: ``duration`` (C), ``frees`` (C, 4: when each core stream is free again, relative to
    the start; -1: not used), their dp pieces ahead and behind in CSR by code. The pieces table holds every recipe
    timed piece by piece and the stage's tail (``tail``): per recipe its pieces' range, the piece waiting for the
    input and its end piece; per piece its stream, duration, category, work flag and dependencies (CSR)."""

    kind: np.ndarray
    recipe: np.ndarray
    duration: np.ndarray
    frees: np.ndarray
    ahead_ptr: np.ndarray
    ahead: np.ndarray
    """(n, 3): duration, category, work."""
    behind_ptr: np.ndarray
    behind: np.ndarray
    """(n, 4): ready (relative to the start), duration, category, work."""
    recipe_ptr: np.ndarray
    recipe_needs: np.ndarray
    recipe_end: np.ndarray
    piece: np.ndarray
    """(n, 4): stream, duration, category, work."""
    dep_ptr: np.ndarray
    deps: np.ndarray
    tail: int
    simple_flops: np.ndarray
    """(C, 2): model and hardware FLOPs of each simple recipe."""
    parts: np.ndarray
    """(C, categories): each simple recipe's seconds per category (its block's parts)."""
    recipe_flops: np.ndarray
    """(R, 2): those of each piece-by-piece recipe and of the tail."""
    ahead_len: np.ndarray
    """(C): the rows of ``ahead`` of each code (np.diff(ahead_ptr)); likewise ``behind_len`` (C), ``recipe_len``
    (R: pieces per recipe) and ``dep_len`` (pieces: dependencies per piece). `pack` joins the units' pointers as
    one cumulative sum of their lengths."""
    behind_len: np.ndarray
    recipe_len: np.ndarray
    dep_len: np.ndarray


def pack_stage(recipes: list, simple: list, tail: object) -> Unit:
    """A stage's priced recipes (by recipe code), their simple forms (simdist.analytic.stages._Simple; None: timed
    piece by piece, or no such recipe) and its priced tail, as a `Unit`."""
    C = len(simple)
    kind = np.zeros(C, dtype=np.int8)
    recipe = np.full(C, -1, dtype=np.int64)
    duration = np.zeros(C)
    frees = np.full((C, 4), -1.0)
    simple_flops = np.zeros((C, 2))
    parts = np.zeros((C, len(CATEGORIES)))
    ahead_ptr = [0]
    ahead: list[tuple[float, float, float]] = []
    behind_ptr = [0]
    behind: list[tuple[float, float, float, float]] = []
    recipe_ptr = [0]
    needs: list[int] = []
    ends: list[int] = []
    pieces: list[tuple[float, float, float, float]] = []
    dep_ptr = [0]
    deps: list[int] = []
    flops: list[tuple[float, float]] = []

    def add(r) -> int:
        for stream, d, category, work, dd in zip(r.streams, r.durations, r.categories, r.work, r.deps, strict=True):
            pieces.append((stream, d, _CATEGORY[category], work))
            deps.extend(dd)
            dep_ptr.append(len(deps))
        recipe_ptr.append(len(pieces))
        needs.append(r.needs_input)
        ends.append(r.end)
        flops.append((r.model_flops, r.hardware_flops))
        return len(needs) - 1

    for code in range(C):
        sm = simple[code]
        r = recipes[code]
        if sm is not None:
            kind[code] = SIMPLE
            duration[code] = sm.duration_s
            frees[code] = sm.frees
            simple_flops[code] = (sm.model_flops, sm.hardware_flops)
            for category, seconds in sm.parts.items():
                parts[code, _CATEGORY[category]] = seconds
            ahead.extend((d, _CATEGORY[c], w) for d, c, w in sm.ahead)
            behind.extend((ready, d, _CATEGORY[c], w) for ready, d, c, w in sm.behind)
        elif r is not None:
            kind[code] = GENERIC
            recipe[code] = add(r)
        ahead_ptr.append(len(ahead))
        behind_ptr.append(len(behind))
    t = add(tail)
    ptrs = [np.array(x, dtype=np.int64) for x in (ahead_ptr, behind_ptr, recipe_ptr, dep_ptr)]
    return Unit(kind, recipe, duration, frees, ptrs[0], np.array(ahead, dtype=float).reshape(-1, 3), ptrs[1],
                np.array(behind, dtype=float).reshape(-1, 4), ptrs[2], np.array(needs, dtype=np.int64),
                np.array(ends, dtype=np.int64), np.array(pieces, dtype=float).reshape(-1, 4), ptrs[3],
                np.array(deps, dtype=np.int64), t, simple_flops, parts, np.array(flops, dtype=float).reshape(-1, 2),
                *(np.diff(x) for x in ptrs))


@dataclass(frozen=True, slots=True)
class Packed:
    """A configuration's stages as arrays: its distinct stages' `Unit`s laid end to end (U of them, C codes each:
    a unit with fewer codes is padded with NONE), ``slot`` (K): each stage's unit, ``sends`` (K, 3V): each
    send's seconds by chunk * 3 + kind index. The per-unit fields are `Unit`'s, indexed by unit (``kind``
    (U, C), CSR pointers by ``u * C + code``, recipe indices into the joined pieces table, ``tail`` (U))."""

    slot: np.ndarray
    sends: np.ndarray
    kind: np.ndarray
    recipe: np.ndarray
    duration: np.ndarray
    frees: np.ndarray
    ahead_ptr: np.ndarray
    ahead: np.ndarray
    behind_ptr: np.ndarray
    behind: np.ndarray
    recipe_ptr: np.ndarray
    recipe_needs: np.ndarray
    recipe_end: np.ndarray
    piece: np.ndarray
    dep_ptr: np.ndarray
    deps: np.ndarray
    tail: np.ndarray
    simple_flops: np.ndarray
    parts: np.ndarray
    recipe_flops: np.ndarray


def pack(units: list[Unit], sends: list[list[float]]) -> Packed:
    """The `Packed` of stages whose units are ``units`` (one per stage; alike stages share theirs, by identity) and
    whose sends are ``sends``."""
    K = len(units)
    index: dict[int, int] = {}
    distinct: list[Unit] = []
    slots = []
    for u in units:
        j = index.get(id(u))
        if j is None:
            j = index[id(u)] = len(distinct)
            distinct.append(u)
        slots.append(j)
    slot = np.array(slots, dtype=np.int64)
    U = len(distinct)
    if not U:
        raise ValueError("pack: a configuration has at least one stage")
    (kinds, recipes, durations, frees, _, aheads, _, behinds, _, needs, ends, pieces, _, deps, tails, simple_flops,
     parts, recipe_flops, ahead_lens, behind_lens, recipe_lens, dep_lens) = zip(*distinct, strict=True)
    sizes = [len(x) for x in kinds]
    C = max(sizes)
    even = min(sizes) == C

    def padded(rows: tuple[np.ndarray, ...], fill: float, dtype: type = float) -> np.ndarray:
        if even:
            return np.array(rows, dtype=dtype)
        out = np.full((U, C, *rows[0].shape[1:]), fill, dtype=dtype)
        for j, x in enumerate(rows):
            out[j, :len(x)] = x
        return out

    def starts(tables: tuple[np.ndarray, ...]) -> np.ndarray:
        """Each unit's first row in the joined ``tables``."""
        return np.fromiter(accumulate(map(len, tables[:-1]), initial=0), dtype=np.int64, count=U)

    def ptr(lengths: tuple[np.ndarray, ...], by_code: bool = False) -> np.ndarray:
        """CSR pointers of the joined units from each unit's rows per entry (a unit's pointers end at its table's
        length, so the joined ones are the running sum of every unit's lengths in turn). ``by_code``: entries by
        u * C + code, a unit with fewer codes given no rows for the codes it lacks."""
        if by_code and not even:
            return np.cumsum(np.concatenate(([0], padded(lengths, 0, np.int64).ravel())))
        return np.cumsum(np.concatenate(([0], *lengths)))  # each unit's rows per code (or per recipe, piece)

    first_recipe = starts(needs)
    recipe = padded(recipes, -1, np.int64)
    recipe = np.where(recipe >= 0, recipe + first_recipe[:, None], -1)
    V3 = max((len(x) for x in sends), default=0)
    if all(len(x) == V3 for x in sends):  # every stage's sends by the same chunks (one conversion, not K)
        send = np.array(sends, dtype=float).reshape(K, V3)
    else:
        send = np.zeros((K, V3))
        for s, x in enumerate(sends):
            send[s, :len(x)] = x
    return Packed(slot, send, padded(kinds, NONE, np.int8), recipe, padded(durations, 0.0), padded(frees, -1.0),
                  ptr(ahead_lens, by_code=True), np.concatenate(aheads),
                  ptr(behind_lens, by_code=True), np.concatenate(behinds), ptr(recipe_lens),
                  np.concatenate(needs), np.concatenate(ends),  # int64 as pack_stage makes them
                  np.concatenate(pieces), ptr(dep_lens), np.concatenate(deps),
                  np.array(tails, dtype=np.int64) + first_recipe, padded(simple_flops, 0.0), padded(parts, 0.0),
                  np.concatenate(recipe_flops))


def run_program(p: Packed, steps: np.ndarray, counts: np.ndarray, backward: np.ndarray, record: bool,
                spans: bool, body: np.ndarray | None = None) -> tuple:
    """Time the program ``steps`` ((7, n): stage, recipe code, upstream step, downstream stage, held sends:
    `Program.steps`; ``counts``: its `Program.counts`)
    over ``p``; ``backward`` (per recipe code): the step counts as its stage's backward work; ``record``: return
    each step's start; ``spans``: return each simple step's span (start, end, stage).

    Returns (step end, intervals (n, 5: start, end, category, work, stage) of every piece run on its own or on
    the dp stream, in run order, first and last simple step per stage (K, 2; -1: none), spans (n, 3), starts
    (n), the number of steps run: fewer than the program's where the loop jumped); how often each stage ran each
    recipe is ``counts``. ``body``: the repeating body of ``steps``
    (simdist.analytic.steady.SteadyForm, whose steps they are), which the loop jumps over once its times repeat
    (not where it records starts or spans); None: every step is run."""
    from simdist.analytic.steady import NO_BODY, SHIFT_TOLERANCE
    from simdist.analytic.timeline_jit import run  # numba: loaded where a timeline is first compiled

    return run(p.slot, p.kind, p.recipe, p.duration, p.frees, p.ahead_ptr, p.ahead, p.behind_ptr, p.behind,
                p.recipe_ptr, p.recipe_needs, p.recipe_end, p.piece, p.dep_ptr, p.deps, p.tail, p.sends, steps,
                counts, backward, record, spans, NO_BODY if body is None else body, SHIFT_TOLERANCE)
