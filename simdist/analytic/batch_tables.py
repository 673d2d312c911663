"""The band's copies of one step as arrays: per stage and recipe, each priced quantity as a vector over the copies.

simdist.analytic.step_batch times every copy in one pass over these (`_Batch`); copies whose recipes differ in
shape cannot share it (`_Mismatch`). `_Tables` lays the simple recipes' quantities out by (stage, recipe code) so
that a wave of steps on distinct stages is gathered at once.
"""

from __future__ import annotations

import numpy as np

from simdist.analytic.pricing import NUM_CORE
from simdist.analytic.stages import _Stage

__all__: list[str] = []


class _Batch:
    """The stages of every copy, as arrays over the copies (one per priced quantity)."""

    def __init__(self, copies: list[list[_Stage]]) -> None:
        first = copies[0]
        self.num_stages = len(first)
        self.num_copies = len(copies)
        self._tables: _Tables | None = None
        self.steps: list[list[tuple | None]] = []
        self.sends: list[list[np.ndarray]] = []
        self.tails: list[tuple] = []
        rows: dict[tuple, list[tuple | None]] = {}
        for s, st in enumerate(first):
            # alike stages share their priced recipes in every copy (simdist.analytic.stages._stages): one row for them
            key = tuple(id(c[s].simple) for c in copies) + tuple(id(c[s].recipes) for c in copies)
            row = rows.get(key)
            if row is None:
                row = rows[key] = _row(copies, s)
            self.steps.append(row)
            self.sends.append(list(np.array([c[s].sends for c in copies]).T.copy()))  # a vector per send
            tails = [c[s].tail for c in copies]
            t = st.tail
            if any(x.streams != t.streams or x.deps != t.deps for x in tails):
                raise _Mismatch
            self.tails.append((t.streams, t.deps, np.array([x.durations for x in tails]).T.copy()))

    def tables(self) -> _Tables:
        """The simple steps' quantities as arrays by (stage, recipe code) (made once)."""
        if self._tables is None:
            self._tables = _Tables(self)
        return self._tables


def _row(copies: list[list[_Stage]], s: int) -> list[tuple | None]:
    """`_Batch.steps` of stage ``s``: per recipe code, its pieces' shape and durations (one row per piece) where it
    runs piece by piece, else its simple form's quantities as vectors over the copies; None: no such recipe."""
    st = copies[0][s]
    row: list[tuple | None] = []
    for code, sm in enumerate(st.simple):
        if sm is None:
            r = st.recipes[code]
            if r is None:
                row.append(None)
                continue
            # a chunk's first forward run piece by piece (simdist.analytic.timeline._fast): its pieces' shape
            # is every copy's, their durations one row per piece
            rs = [c[s].recipes[code] for c in copies]
            if any(x is None or x.streams != r.streams or x.deps != r.deps or x.needs_input != r.needs_input
                   or x.end != r.end for x in rs):
                raise _Mismatch
            row.append((r.streams, r.deps, r.needs_input, r.end,
                        np.array([x.durations for x in rs]).T.copy(), None))  # type: ignore[union-attr]
            continue
        sms = [c[s].simple[code] for c in copies]
        if any(x is None or len(x.ahead) != len(sm.ahead) or len(x.behind) != len(sm.behind)
               or [f < 0 for f in x.frees] != [f < 0 for f in sm.frees] for x in sms):
            raise _Mismatch
        duration = np.array([x.duration_s for x in sms])  # type: ignore[union-attr]
        # (stream, when it is free again) of the core streams the recipe uses, in stream order, and apart
        # those free exactly at the step's end in every copy (t0 + free is then the end itself: no addition)
        frees_at = [(k, np.array([x.frees[k] for x in sms]))  # type: ignore[union-attr]
                    for k in range(NUM_CORE) if sm.frees[k] >= 0]
        at_end = tuple(k for k, v in frees_at if np.array_equal(v, duration))
        frees = tuple((k, v) for k, v in frees_at if k not in at_end)
        ahead = tuple(np.array([x.ahead[j][0] for x in sms]) for j in range(len(sm.ahead)))  # type: ignore
        behind = tuple((np.array([x.behind[j][0] for x in sms]), np.array([x.behind[j][1] for x in sms]))
                       for j in range(len(sm.behind)))  # type: ignore[union-attr]
        row.append((duration, frees, ahead, behind, at_end))
    return row


class _Tables:
    """`_Batch.steps` as arrays by stage and recipe code, for a wave's steps to be gathered at once: of each simple
    recipe without gathers issued ahead (``vector``), its duration (stage x code x copy), per core stream whether it
    sets it free (``used``) and when (``frees``), per dp piece behind (j-th) whether it has one, when it is ready and
    its duration; ``other``: the recipes timed step by step; ``sends``: stage x send index x copy."""

    def __init__(self, batch: _Batch) -> None:
        K, n = batch.num_stages, batch.num_copies
        num_codes = max((len(row) for row in batch.steps), default=0)
        num_behind = max((len(e[3]) for row in batch.steps for e in row if e is not None and len(e) == 5),
                         default=0)
        self.vector = np.zeros((K, num_codes), dtype=bool)
        self.other = np.zeros((K, num_codes), dtype=bool)
        self.duration = np.zeros((K, num_codes, n))
        self.used = np.zeros((NUM_CORE, K, num_codes), dtype=bool)
        self.frees = np.zeros((NUM_CORE, K, num_codes, n))
        self.has_behind = np.zeros((num_behind, K, num_codes), dtype=bool)
        self.ready = np.zeros((num_behind, K, num_codes, n))
        self.behind = np.zeros((num_behind, K, num_codes, n))
        for s, row in enumerate(batch.steps):
            for c, e in enumerate(row):
                if e is None:
                    continue
                if len(e) == 6 or e[2]:
                    self.other[s, c] = True
                    continue
                duration, frees, _, behind, at_end = e
                self.vector[s, c] = True
                self.duration[s, c] = duration
                for k in at_end:  # t0 + the duration: the step's end itself
                    self.used[k, s, c] = True
                    self.frees[k, s, c] = duration
                for k, free_at in frees:
                    self.used[k, s, c] = True
                    self.frees[k, s, c] = free_at
                for j, (ready, d) in enumerate(behind):
                    self.has_behind[j, s, c] = True
                    self.ready[j, s, c] = ready
                    self.behind[j, s, c] = d
        self.sends = np.array([np.array(x).reshape(len(x), n) for x in batch.sends]) if K else np.zeros((0, 0, n))


class _Mismatch(Exception):
    """The copies' recipes differ in shape: they cannot share one pass."""
