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

`pack_stage` lays a distinct stage's recipes out as arrays once (a `Unit`), and `pack` lays each unit into one
arena the first time a configuration uses it, so that a configuration is its stages' places in the arena and its
sends: a search's thousands of configurations, whose stages are priced and kept already, join no arrays of their
own. `run_program` times a program over them (the compiled
loop: simdist.analytic.timeline_jit, loaded on first use) and returns every interval that the accounting
(simdist.plan.accounting_kernel) needs. tests/test_timeline_kernel.py checks
it against the step-by-step timeline (`simdist.analytic.timeline._timeline`), the oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from threading import Lock
from typing import NamedTuple

import numpy as np

from simdist.plan.accounting import CATEGORIES

__all__ = ["GENERIC", "NONE", "SIMPLE", "Packed", "Unit", "pack", "pack_boxed", "pack_stage", "run_program"]

_CATEGORY = {c: i for i, c in enumerate(CATEGORIES)}
NONE, SIMPLE, GENERIC = 0, 1, 2


class Unit(NamedTuple):
    """One stage's priced recipes as arrays (C recipe codes), made once per distinct stage (`pack_stage`) and laid
    into the arena once (`pack`).

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
                np.array(deps, dtype=np.int64), t, simple_flops, parts, np.array(flops, dtype=float).reshape(-1, 2))


@dataclass(frozen=True, slots=True)
class Packed:
    """A configuration's stages as arrays: ``slot`` (K): each stage's unit in the arena the units are laid into
    once (`pack`), ``sends`` (K, 3V): each send's seconds by chunk * 3 + kind index; the rest is the arena's.

    Code entries (one per unit and recipe code, a unit's from ``code_base[u]``, ``num_codes[u]`` of them; entry 0 is
    no recipe, what a stage asks of a code its unit lacks): ``kind``, ``recipe`` (into the recipes), ``duration``,
    ``frees``, ``plain`` (a simple recipe with no dp piece ahead or behind), ``simple_flops``, ``parts``, and the
    CSR pointers of the dp pieces ahead and behind; recipes (``recipe_ptr`` into the pieces, ``recipe_needs``,
    ``recipe_end``, ``recipe_flops``), pieces (``piece``, ``dep_ptr`` into ``deps``) and per unit its ``tail``."""

    slot: np.ndarray
    sends: np.ndarray
    code_base: np.ndarray
    num_codes: np.ndarray
    kind: np.ndarray
    recipe: np.ndarray
    duration: np.ndarray
    frees: np.ndarray
    plain: np.ndarray
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


class _Table:
    """Arrays that grow together (by half their capacity), ``n`` rows used and one spare: a CSR pointer column holds
    each row's start, and the spare row the end of the last (the next rows' first start)."""

    __slots__ = ("arrays", "n")

    def __init__(self, n: int, **columns: tuple[tuple[int, ...], type]) -> None:
        self.arrays = {name: np.zeros((max(n + 1, 64), *shape), dtype=dtype)
                       for name, (shape, dtype) in columns.items()}
        self.n = n

    def reserve(self, extra: int) -> int:
        """Room for ``extra`` more rows (and the spare); returns the first of them (the arrays may be new ones)."""
        first = self.n
        need = first + extra + 1
        arrays = self.arrays
        capacity = len(next(iter(arrays.values())))
        if need > capacity:
            capacity = max(need, capacity + capacity // 2)  # 1.5x: a third of the rows at most unused
            for name, a in arrays.items():
                grown = np.zeros((capacity, *a.shape[1:]), dtype=a.dtype)
                grown[:first + 1] = a[:first + 1]
                arrays[name] = grown
        self.n = first + extra
        return first


ARENA_ROWS = 1 << 20
"""Rows of any arena table (code entries, pieces, ...) past which `pack` starts a new arena: a search keeps
thousands of units, a few hundred rows each at most; a Packed made before keeps the arrays it was given."""


class _Arena:
    """Every unit `pack` was given, laid end to end once: a configuration's `Packed` is its stages' places in it and
    its sends, not a copy of its units (alike stages share one unit; a search's configurations share the arena)."""

    def __init__(self, generation: int = 0) -> None:
        self.generation = generation
        """Which arena of the process this is (`pack_boxed`'s boxes name the arena their unit was laid into)."""
        cats = len(CATEGORIES)
        # code entry 0: no recipe (kind NONE, no dp pieces), for the codes a unit lacks
        self.codes = _Table(1, kind=((), np.int8), recipe=((), np.int64), duration=((), float), frees=((4,), float),
                            plain=((), np.bool_), simple_flops=((2,), float), parts=((cats,), float),
                            ahead_ptr=((), np.int64), behind_ptr=((), np.int64))
        self.codes.arrays["recipe"][0] = -1
        self.codes.arrays["frees"][0] = -1.0
        self.aheads = _Table(0, ahead=((3,), float))
        self.behinds = _Table(0, behind=((4,), float))
        self.recipes = _Table(0, recipe_ptr=((), np.int64), recipe_needs=((), np.int64), recipe_end=((), np.int64),
                              recipe_flops=((2,), float))
        self.pieces = _Table(0, piece=((4,), float), dep_ptr=((), np.int64))
        self.deps = _Table(0, deps=((), np.int64))
        self.units = _Table(0, code_base=((), np.int64), num_codes=((), np.int64), tail=((), np.int64))
        self.tables = (self.codes, self.aheads, self.behinds, self.recipes, self.pieces, self.deps, self.units)
        self.index: dict[int, tuple[Unit, int]] = {}
        self.rows = 1  # the most rows of any table
        self._arrays: tuple | None = None

    def full(self) -> bool:
        return self.rows >= ARENA_ROWS

    def place(self, unit: Unit, keep: bool = True) -> int:
        """``unit``'s index in the arena, laid in on its first call (``keep``: found again by its identity, the unit
        kept; else the caller remembers the index, and the unit's own arrays may go)."""
        hit = self.index.get(id(unit)) if keep else None
        if hit is not None and hit[0] is unit:
            return hit[1]
        C, R, P = len(unit.kind), len(unit.recipe_needs), len(unit.piece)
        g = self.codes.reserve(C)
        a0 = self.aheads.reserve(len(unit.ahead))
        b0 = self.behinds.reserve(len(unit.behind))
        r0 = self.recipes.reserve(R)
        p0 = self.pieces.reserve(P)
        d0 = self.deps.reserve(len(unit.deps))
        u = self.units.reserve(1)
        c = self.codes.arrays
        c["kind"][g:g + C] = unit.kind
        c["recipe"][g:g + C] = np.where(unit.recipe >= 0, unit.recipe + r0, -1)
        c["duration"][g:g + C] = unit.duration
        c["frees"][g:g + C] = unit.frees
        c["simple_flops"][g:g + C] = unit.simple_flops
        c["parts"][g:g + C] = unit.parts
        c["plain"][g:g + C] = (unit.kind == SIMPLE) & (np.diff(unit.ahead_ptr) == 0) & (np.diff(unit.behind_ptr) == 0)
        # CSR pointers: the unit's own shifted by the rows before it (their first is the end of the rows before)
        c["ahead_ptr"][g:g + C + 1] = unit.ahead_ptr + a0
        c["behind_ptr"][g:g + C + 1] = unit.behind_ptr + b0
        self.aheads.arrays["ahead"][a0:a0 + len(unit.ahead)] = unit.ahead
        self.behinds.arrays["behind"][b0:b0 + len(unit.behind)] = unit.behind
        r = self.recipes.arrays
        r["recipe_ptr"][r0:r0 + R + 1] = unit.recipe_ptr + p0
        r["recipe_needs"][r0:r0 + R] = unit.recipe_needs  # piece numbers within their recipe, as the deps
        r["recipe_end"][r0:r0 + R] = unit.recipe_end
        r["recipe_flops"][r0:r0 + R] = unit.recipe_flops
        self.pieces.arrays["piece"][p0:p0 + P] = unit.piece
        self.pieces.arrays["dep_ptr"][p0:p0 + P + 1] = unit.dep_ptr + d0
        self.deps.arrays["deps"][d0:d0 + len(unit.deps)] = unit.deps
        x = self.units.arrays
        x["code_base"][u], x["num_codes"][u], x["tail"][u] = g, C, unit.tail + r0
        if keep:
            self.index[id(unit)] = (unit, u)
        self.rows = max(t.n for t in self.tables)
        self._arrays = None  # (a table may have grown into new arrays)
        return u

    def arrays(self) -> tuple:
        """`Packed`'s fields after ``sends``, the arena's arrays as they stand (whole: rows past the used ones are
        never indexed)."""
        if self._arrays is None:
            c, r, x = self.codes.arrays, self.recipes.arrays, self.units.arrays
            self._arrays = (x["code_base"], x["num_codes"], c["kind"], c["recipe"], c["duration"], c["frees"],
                            c["plain"], c["ahead_ptr"], self.aheads.arrays["ahead"], c["behind_ptr"],
                            self.behinds.arrays["behind"], r["recipe_ptr"], r["recipe_needs"], r["recipe_end"],
                            self.pieces.arrays["piece"], self.pieces.arrays["dep_ptr"], self.deps.arrays["deps"],
                            x["tail"], c["simple_flops"], c["parts"], r["recipe_flops"])
        return self._arrays


_ARENA = _Arena()
_ARENA_LOCK = Lock()


def pack(units: list[Unit], sends: list[list[float]] | np.ndarray) -> Packed:
    """The `Packed` of stages whose units are ``units`` (one per stage; alike stages share theirs, by identity) and
    whose sends are ``sends`` (per stage, or as a (K, 3V) array): each unit laid into the arena on its first use,
    then only its place looked up."""
    if not units:
        raise ValueError("pack: a configuration has at least one stage")
    with _ARENA_LOCK:  # a Dask worker may run several evaluations in threads
        arena = _arena()
        slot = np.array([arena.place(u) for u in units], dtype=np.int64)
        arrays = arena.arrays()
    return _packed(slot, arrays, sends)


def pack_boxed(boxes: list[list], make: Callable[[int], Unit], unit_of: np.ndarray,
               sends: list[list[float]] | np.ndarray) -> Packed:
    """`pack` of stages given as their distinct stages' boxes and each stage's index among them (``unit_of``, K): a
    box's [0] holds its unit's place (the arena's generation and the unit's index in it, or None), and the unit is
    made by ``make(i)`` (`pack_stage`) only where the current arena lacks it: a unit laid in keeps no arrays of its
    own."""
    with _ARENA_LOCK:
        arena = _arena()
        ids = []
        for i, box in enumerate(boxes):
            hit = box[0]
            if hit is None or hit[0] != arena.generation:
                hit = box[0] = (arena.generation, arena.place(make(i), keep=False))
            ids.append(hit[1])
        slot = np.array(ids, dtype=np.int64)[unit_of]
        arrays = arena.arrays()
    return _packed(slot, arrays, sends)


def _arena() -> _Arena:
    """The process's arena (the caller holds `_ARENA_LOCK`), a new one once it is full."""
    global _ARENA
    if _ARENA.full():
        _ARENA = _Arena(_ARENA.generation + 1)
    return _ARENA


def _packed(slot: np.ndarray, arrays: tuple, sends: list[list[float]] | np.ndarray) -> Packed:
    K = len(slot)
    if isinstance(sends, np.ndarray):  # already (K, 3V)
        return Packed(slot, sends, *arrays)
    V3 = max((len(x) for x in sends), default=0)
    if all(len(x) == V3 for x in sends):  # every stage's sends by the same chunks (one conversion, not K)
        send = np.array(sends, dtype=float).reshape(K, V3)
    else:
        send = np.zeros((K, V3))
        for s, x in enumerate(sends):
            send[s, :len(x)] = x
    return Packed(slot, send, *arrays)


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

    return run(p.slot, p.code_base, p.num_codes, p.kind, p.recipe, p.duration, p.frees, p.plain, p.ahead_ptr,
               p.ahead, p.behind_ptr, p.behind, p.recipe_ptr, p.recipe_needs, p.recipe_end, p.piece, p.dep_ptr,
               p.deps, p.tail, p.sends, steps, counts, backward, record, spans, NO_BODY if body is None else body,
               SHIFT_TOLERANCE)
