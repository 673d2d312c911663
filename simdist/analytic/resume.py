"""The fast-forward plan's closed-form timelines, each resumed from a shorter one where their schedules agree.

simdist.plan.fastforward.plan times the same step on several micro-batch counts (a detection timeline, then
M1 .. M1 + 3c). A stage's steps in program order are the same for m and a larger count up to where m's cool-down
begins (schedule_order: its warm-up and steady state do not depend on the count), and a step's start and end
depend only on its stage's earlier steps and on the step it receives from (simdist.analytic.step._timeline_fast).
So the steps of such a common prefix that receive only from steps of common prefixes (`_cut`) run at the same
times, by the same additions and maxima, in both timelines: the larger one starts from the state the shorter one
had there and times the rest. Every step time and start is `_timeline_fast`'s, bit for bit (tests).

The steps are evaluated stage by stage, each stage run as far as its inputs are there (program.program's sweep),
with its streams held in locals; the evaluation order of a timeline does not change any of its numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simdist.analytic.program import KIND_INDEX
from simdist.analytic.step import _run_pieces, _run_tail, _Stage
from simdist.errors import SpecError
from simdist.plan.fastforward import group_of
from simdist.plan.schedule import STEP_KINDS, stage_steps
from simdist.plan.step_config import StepConfig

__all__ = ["ResumedTimelines"]


class _Layout:
    """The steps of ``m`` micro-batches stage after stage (stage s at ``offsets[s]:offsets[s + 1]``), each with
    its identity (kind, micro-batch, chunk, stage: the same number whatever m), `recipe_code`, the position of the
    step it receives from (-1: none) and whether it sends to another stage."""

    def __init__(self, schedule: str, K: int, m: int, V: int) -> None:
        rows = stage_steps(schedule, num_stages=K, num_microbatches=m, vpp=V)
        lengths = [len(r) for r in rows]
        idx = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        n = len(idx)
        chunk, q = idx % V, idx // V
        mb, kind = q % m, q // m
        stage = np.repeat(np.arange(K, dtype=np.int64), lengths)
        part, num_parts = chunk * K + stage, K * V  # simdist.plan.schedule.model_part
        self.ident = ((mb * 3 + kind) * V + chunk) * K + stage
        # as simdist.analytic.program.program: F of part j receives from F of part j - 1, B of part j from B of
        # part j + 1; a step sends where that neighbour is on another stage
        fwd, bwd = kind == 0, kind == 1
        nxt, prv = part + 1, part - 1
        up_ident = np.full(n, -1, dtype=np.int64)
        sel = fwd & (part > 0)
        up_ident[sel] = ((mb[sel] * 3) * V + prv[sel] // K) * K + prv[sel] % K
        sel = bwd & (nxt < num_parts)
        up_ident[sel] = ((mb[sel] * 3 + 1) * V + nxt[sel] // K) * K + nxt[sel] % K
        down = (fwd & (nxt < num_parts) & (nxt % K != stage)) | (bwd & (part > 0) & (prv % K != stage))
        self.code = (chunk * 3 + kind) * 2 + (mb == np.where(fwd, 0, m - 1))  # recipe_code, with is_edge
        position = np.full(m * 3 * V * K, -1, dtype=np.int64)
        position[self.ident] = np.arange(n)
        self.up = np.full(n, -1, dtype=np.int64)
        sel = up_ident >= 0
        self.up[sel] = position[up_ident[sel]]
        if (self.up[sel] < 0).any():  # pragma: no cover - the bundled schedules run every step they receive from
            raise SpecError(f"schedule {schedule} deadlocks on {K} stages and {m} micro-batches",
                            field="schedule", fix="use one of the bundled schedules")
        self.offsets = np.cumsum([0, *lengths]).tolist()
        self.stage, self.kind, self.chunk, self.vpp = stage, kind, chunk, V
        self.rows = (self.code.tolist(), self.up.tolist(), down.tolist())
        self.n = n

    def cut(self, longer: _Layout) -> list[int]:
        """Per stage, how many of its first steps run at the same times in ``longer``'s timeline: the common prefix
        of the two stages' steps, shortened until every step in it receives from a step in a prefix."""
        K = len(self.offsets) - 1
        cut = []
        for s in range(K):
            a = slice(self.offsets[s], self.offsets[s + 1])
            b = slice(longer.offsets[s], longer.offsets[s + 1])
            n = min(a.stop - a.start, b.stop - b.start)
            differ = np.flatnonzero((self.ident[a][:n] != longer.ident[b][:n])
                                    | (self.code[a][:n] != longer.code[b][:n]))
            cut.append(int(differ[0]) if len(differ) else n)
        offsets = np.asarray(self.offsets[:-1], dtype=np.int64)
        at = np.arange(self.n) - offsets[self.stage]  # each step's position in its stage
        has = np.flatnonzero(self.up >= 0)
        up_stage, up_at = self.stage[self.up[has]], at[self.up[has]]
        cuts = np.asarray(cut, dtype=np.int64)
        while True:  # a step in a prefix receiving from one past its stage's prefix ends the prefix there
            bad = (at[has] < cuts[self.stage[has]]) & (up_at >= cuts[up_stage])
            if not bad.any():
                return cuts.tolist()
            np.minimum.at(cuts, self.stage[has][bad], at[has][bad])

    def groups(self) -> list[tuple[tuple[int, str, int], np.ndarray]]:
        """The steps by (stage, kind, chunk), each group in stage order (micro-batch order): their positions."""
        key = (self.stage * 3 + self.kind) * self.vpp + self.chunk
        order = np.argsort(key, kind="stable")
        bounds = np.flatnonzero(np.diff(key[order])) + 1
        return [((int(self.stage[g[0]]), STEP_KINDS[int(self.kind[g[0]])], int(self.chunk[g[0]])), g)
                for g in np.split(order, bounds) if len(g)]


@dataclass(slots=True)
class _Snapshot:
    """A timeline's numbers to resume a longer one from: each step's output arrival and start, by position, and per
    stage its state (previous step's end, the six streams, last backward's end) after its first ``cut`` steps."""

    layout: _Layout
    cut: list[int]
    out: list[float]
    starts: list[float]
    states: list[tuple[float, ...] | None]


class ResumedTimelines:
    """`simdist.analytic.step._timeline_fast`'s step time and starts of ``cfg`` on ``stages`` (which `_fast`
    holds for) for any number of micro-batches, each resumed from the longest shorter one timed before that agrees
    with it (module doc)."""

    def __init__(self, cfg: StepConfig, stages: list[_Stage]) -> None:
        self._schedule, self._K, self._V = cfg.schedule, cfg.mesh.pp, cfg.vpp
        self._stages = stages
        self._layouts: dict[int, _Layout] = {}
        self._snapshots: dict[int, _Snapshot] = {}
        zb = cfg.schedule == "zb_h1"
        # per stage, by recipe_code: a simple recipe's (duration, frees, dp pieces ahead, behind, backward work)
        # (backward: its last one ends the stage's pipeline work), or None (run piece by piece)
        self._entries = []
        for st in stages:
            row: list[tuple | None] = []
            for code, sm in enumerate(st.simple):
                kind = (code >> 1) % 3
                bw = kind == KIND_INDEX["W"] or (kind == KIND_INDEX["B"] and not zb)
                row.append(None if sm is None else
                           (sm.duration_s, *sm.frees, tuple(d for d, _, _ in sm.ahead),
                            tuple((ready, d) for ready, d, _, _ in sm.behind), bw))
            self._entries.append(row)
        self._backward = [[(c >> 1) % 3 == KIND_INDEX["W"] or ((c >> 1) % 3 == KIND_INDEX["B"] and not zb)
                           for c in range(len(st.simple))] for st in stages]

    def _layout(self, m: int) -> _Layout:
        hit = self._layouts.get(m)
        if hit is None:
            hit = self._layouts[m] = _Layout(self._schedule, self._K, m, self._V)
        return hit

    def _resume_from(self, layout: _Layout, m: int) -> _Snapshot | None:
        """The snapshot of the longest shorter timeline whose prefixes ``layout`` shares, if any."""
        for m1 in sorted((k for k in self._snapshots if k < m), reverse=True):
            snap = self._snapshots[m1]
            if any(st is None for st in snap.states):
                continue
            a, b = snap.layout, layout
            ok = True
            for s, c in enumerate(snap.cut):
                x, y = a.offsets[s], b.offsets[s]
                if (c > b.offsets[s + 1] - y or not np.array_equal(a.ident[x:x + c], b.ident[y:y + c])
                        or not np.array_equal(a.code[x:x + c], b.code[y:y + c])):
                    ok = False
                    break
            if ok:
                return snap
        return None

    def run(self, m: int, with_starts: bool) -> tuple[dict[tuple, list[float]] | None, float]:
        """(each step's start by (stage, kind, chunk) in micro-batch order, or None where not asked for; the step
        time) of ``m`` micro-batches."""
        K = self._K
        layout = self._layout(m)
        snap = self._resume_from(layout, m)
        cut = layout.cut(self._layout(m + group_of(self._schedule, K)))
        offsets = layout.offsets
        if snap is None:
            out = [-1.0] * layout.n
            t0s = [0.0] * layout.n
            pos = offsets[:-1]
            states = [(-1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)] * K
        else:
            out, t0s, pos = [], [], []
            for s, c in enumerate(snap.cut):
                x, y, e = snap.layout.offsets[s], offsets[s], offsets[s + 1]
                out += snap.out[x:x + c]
                out += [-1.0] * (e - y - c)
                t0s += snap.starts[x:x + c]
                t0s += [0.0] * (e - y - c)
                pos.append(y + c)
            states = list(snap.states)  # type: ignore[arg-type]
        # where this timeline's own snapshot is taken (-1: a stage already past it, resumed further on)
        snap_at = [offsets[s] + c if offsets[s] + c >= pos[s] else -1 for s, c in enumerate(cut)]
        mine: list[tuple[float, ...] | None] = [None] * K
        codes, ups, downs = layout.rows
        stages, entries = self._stages, self._entries
        pos = list(pos)
        done = sum(offsets[s + 1] - pos[s] for s in range(K))
        while done:
            progressed = False
            for s in range(K):
                p, stop, snap_s = pos[s], offsets[s + 1], snap_at[s]
                if p == stop and snap_s != p:
                    continue
                pv, a0, a1, a2, a3, adp, app, lb = states[s]  # type: ignore[misc]
                ent, generic, sends, backward = entries[s], stages[s].recipes, stages[s].sends, self._backward[s]
                start = p
                while True:
                    if p == snap_s:
                        mine[s] = (pv, a0, a1, a2, a3, adp, app, lb)
                        snap_s = -1
                    lim = snap_s if snap_s > p else stop
                    while p < lim:
                        code = codes[p]
                        u = ups[p]
                        t0 = pv
                        if a0 > t0:
                            t0 = a0
                        if u >= 0:
                            recv = out[u]
                            if recv < 0:
                                break  # its input is not there yet: the next stage's turn
                            if recv > t0:
                                t0 = recv
                        else:
                            recv = 0.0
                        e = ent[code]
                        if e is None:  # a chunk's first forward with its parameter gathers, piece by piece
                            t0s[p] = t0
                            f = [a0, a1, a2, a3, adp, app]
                            end = _run_pieces(generic[code], f, pv, recv, [])  # type: ignore[arg-type]
                            a0, a1, a2, a3, adp, app = f
                        else:
                            dur, fr0, fr1, fr2, fr3, ahead, behind, _ = e
                            if ahead:  # the gathers issued ahead queue on the dp stream
                                for d in ahead:
                                    adp = adp + d
                                if adp > t0:
                                    t0 = adp
                            t0s[p] = t0
                            end = t0 + dur
                            if fr0 >= 0:
                                a0 = t0 + fr0
                            if fr1 >= 0:
                                a1 = t0 + fr1
                            if fr2 >= 0:
                                a2 = t0 + fr2
                            if fr3 >= 0:
                                a3 = t0 + fr3
                            for ready, d in behind:
                                t = t0 + ready
                                if adp > t:
                                    t = adp
                                adp = t + d
                        pv = end
                        if backward[code] and end > lb:
                            lb = end
                        if downs[p]:
                            t = app if app > end else end
                            out[p] = app = t + sends[code >> 1]  # by chunk * 3 + kind index: recipe_code // 2
                        else:
                            out[p] = end
                        p += 1
                    else:
                        if p < stop or p == snap_s:
                            continue
                    break
                states[s] = (pv, a0, a1, a2, a3, adp, app, lb)
                snap_at[s] = snap_s
                if p > start:
                    progressed = True
                done -= p - start
                pos[s] = p
            if done and not progressed:  # pragma: no cover - the bundled schedules never deadlock
                raise SpecError(f"schedule {self._schedule} deadlocks on {K} stages and {m} micro-batches",
                                field="schedule", fix="use one of the bundled schedules")
        for s in range(K):  # a stage whose snapshot point is its end, not reached by the sweep above
            if snap_at[s] == offsets[s + 1] == pos[s] and mine[s] is None:
                mine[s] = states[s]
        self._snapshots[m] = _Snapshot(layout, cut, out, t0s, mine)
        step = max((st[0] for st in states), default=0.0)
        for s in range(K):
            pv, a0, a1, a2, a3, adp, app, lb = states[s]  # type: ignore[misc]
            f = [a0, a1, a2, a3, adp, app]
            _run_tail(stages[s].tail, f, lb, [])
            step = max(step, *f)
        if not with_starts:
            return None, step
        at = np.array(t0s)
        return {key: at[idx].tolist() for key, idx in layout.groups()}, step
