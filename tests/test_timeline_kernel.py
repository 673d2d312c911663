"""The compiled closed form (simdist.analytic.timeline_kernel, simdist.plan.accounting_kernel) against its oracle.

The oracle is the step-by-step timeline (simdist.analytic.timeline._timeline: every piece of every step run on its
streams) and simdist.plan.accounting's numpy sweep. On any layout whose steps the compiled recurrence may time
(`_fast`), both give every additive quantity of the step (step time, phase, seconds per category, bubble, idle,
FLOPs) to 1e-9 of the step time; the breakdown sweep alone gives accounting's answer on any intervals.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdist.analytic import timeline as closed
from simdist.analytic.program import program
from simdist.analytic.stages import _stages
from simdist.analytic.step import CommPricer, _num_microbatches
from simdist.analytic.timeline_kernel import pack, pack_stage
from simdist.plan.accounting import CATEGORIES, BlockSummary, account
from simdist.plan.accounting_kernel import BUBBLE, IDLE, account_stages
from tests.test_analytic_step import _agree, _config, layouts


def _priced(x: dict):
    """(the StepConfig of layout ``x``, its stages priced on a fresh pricer), or None where the layout cannot run."""
    found = _config(x)
    if found is None:
        return None
    cfg, topology = found
    return cfg, _stages(cfg, CommPricer(topology))


def _compiled_priced(x: dict):
    """`_priced` of layout ``x`` where the compiled loop may time it (`_fast`), else None."""
    found = _priced(x)
    return found if found is not None and closed._fast(found[1]) else None


def _oracle(cfg, stages, m: int) -> dict[str, float]:
    step, intervals, blocks, model, hardware = closed._timeline(cfg, stages, m)
    acct = account(intervals, step, blocks)
    return {"step_s": step, "phase_s": acct.phase_s, "model_flops": model, "hardware_flops": hardware,
            **{f"{k}_s": v for k, v in acct.mean().items()}}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts)
def test_compiled_closed_form_is_the_step_by_step_timeline(x):
    # ZeRO 0-3 (its parameter gathers issued ahead, its per-micro-batch reduce-scatters overlapping the blocks),
    # buckets, recompute, every schedule, uneven chunks, host costs: the same step and the same breakdown
    found = _compiled_priced(x)
    if found is None:
        return
    cfg, stages = found
    m = _num_microbatches(cfg)
    _agree(_oracle(cfg, stages, m), closed._observables(cfg, stages, m, closed._pack(stages)), 1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts)
def test_flags_kept_per_unit_follow_each_stage_and_the_interval_buffer_is_filled_exactly(x):
    # the fast/overlapping flags found once per set of alike stages are what every stage's own recipes say; the
    # compiled loop sizes its interval buffer (timeline_jit._capacity) to exactly the rows it writes: one per piece
    # issued ahead or behind, run piece by piece, or of a tail
    found = _priced(x)
    if found is None:
        return
    cfg, stages = found
    bare = [dataclasses.replace(s, unit=None) for s in stages]
    assert closed._fast(stages) == closed._fast(bare)
    assert closed._overlapping_work(stages) == closed._overlapping_work(bare)
    if not closed._fast(stages):
        return
    from simdist.analytic.timeline_jit import _capacity

    m = _num_microbatches(cfg)
    packed = closed._pack(stages)
    prog = program(cfg.schedule, cfg.mesh.pp, m, cfg.vpp)
    rows = _capacity(packed.slot, packed.code_base, packed.num_codes, packed.kind, packed.recipe, packed.ahead_ptr,
                     packed.behind_ptr, packed.recipe_ptr, packed.tail, prog.counts)
    # the counts are the program's steps per (stage, recipe code)
    assert prog.counts.sum() == len(prog)
    assert all(prog.counts[s, c] == int(((prog.steps[0] == s) & (prog.steps[1] == c)).sum())
               for s in range(prog.counts.shape[0]) for c in range(prog.counts.shape[1]))
    intervals = closed._compiled_timeline(cfg, packed, m)[1]
    assert len(intervals) == rows


def test_overlapped_parameter_gathers_run_their_first_forwards_piece_by_piece_and_agree():
    # the distributed optimizer's parameter all-gathers overlapped with the next step's forward
    # (--overlap-param-gather): a chunk's first forward is not simple (the gathers are pieces of it), so the
    # compiled timeline runs it piece by piece; the answer is still the step-by-step one
    found = _config({"tp": 2, "pp": 2, "dp": 2, "cp": 1, "vpp": 1, "zero_stage": 1, "recompute": "none",
                     "schedule": "1f1b", "grad_reduce": "overlapped", "bucket": None, "microbatches": 4, "mbs": 1,
                     "sp": True, "per_parameter": True, "param_overlap": True})
    assert found is not None
    cfg, topology = found
    stages = _stages(cfg, CommPricer(topology))
    assert closed._fast(stages)
    packed = closed._pack(stages)
    assert (packed.kind == 2).any()  # GENERIC: some step runs piece by piece
    _agree(_oracle(cfg, stages, 4), closed._observables(cfg, stages, 4, packed), 1e-9)


def test_alike_stages_share_one_unit():
    # the middle stages of a 4-stage pipeline have the same layers, positions and groups: one unit for both
    found = _config({"tp": 1, "pp": 4, "dp": 1, "cp": 1, "vpp": 1, "zero_stage": 1, "recompute": "none",
                     "schedule": "1f1b", "grad_reduce": "bucketed", "bucket": None, "microbatches": 4, "mbs": 1,
                     "sp": False, "per_parameter": False})
    assert found is not None
    cfg, topology = found
    packed = closed._pack(_stages(cfg, CommPricer(topology)))
    assert len(packed.slot) == 4
    assert len(set(packed.slot.tolist())) < 4
    assert packed.slot[1] == packed.slot[2]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts, layouts)
def test_packed_units_read_back_as_each_unit_alone(x, y):
    # the stages of two layouts (their codes may differ in number: a code a unit lacks is the arena's entry 0, no
    # recipe) packed together, each unit given twice, then packed again in a second configuration: every stage's
    # codes, dp pieces, recipes' pieces and dependencies and tail read back through the arena's pointers as its own
    # unit has them, and a unit already in the arena is not laid in again
    units, sends = [], []
    for found in (_priced(x), _priced(y)):
        if found is None:
            return
        for stage in found[1]:
            units.append(pack_stage(stage.recipes, stage.simple, stage.tail))
            sends.append(stage.sends)
    units, sends = units + units, sends + sends
    p = pack(units, sends)
    again = pack(units[::-1], sends[::-1])
    assert again.slot.tolist() == p.slot.tolist()[::-1]
    C = max(len(u.kind) for u in units)

    def rows(table, ptr, k):
        return table[ptr[k]:ptr[k + 1]]

    def recipe_rows(q, r):  # recipe r's pieces of q (a Unit or the Packed), each with its dependencies
        return [(q.piece[j].tolist(), rows(q.deps, q.dep_ptr, j).tolist())
                for j in range(q.recipe_ptr[r], q.recipe_ptr[r + 1])]

    def entry(j, code):
        return p.code_base[j] + code if code < p.num_codes[j] else 0

    for s, u in enumerate(units):
        j, c = p.slot[s], len(u.kind)
        assert p.slot[s] == p.slot[s % (len(units) // 2)]  # a unit given twice is packed once
        assert p.num_codes[j] == c
        assert np.array_equal(p.sends[s, :len(sends[s])], sends[s])
        for code in range(C):
            g, mine = entry(j, code), code < c
            assert p.kind[g] == (u.kind[code] if mine else 0)
            assert p.duration[g] == (u.duration[code] if mine else 0.0)
            assert p.parts[g].tolist() == (u.parts[code].tolist() if mine else [0.0] * p.parts.shape[1])
            plain = mine and u.kind[code] == 1 and u.ahead_ptr[code] == u.ahead_ptr[code + 1] \
                and u.behind_ptr[code] == u.behind_ptr[code + 1]
            assert p.plain[g] == plain
            for name in ("ahead", "behind"):
                got = rows(getattr(p, name), getattr(p, f"{name}_ptr"), g).tolist()
                assert got == (rows(getattr(u, name), getattr(u, f"{name}_ptr"), code).tolist() if mine else [])
            r = p.recipe[g]
            assert (r >= 0) == (mine and u.recipe[code] >= 0)
            if r >= 0:
                assert recipe_rows(p, r) == recipe_rows(u, u.recipe[code])
                assert p.recipe_needs[r] == u.recipe_needs[u.recipe[code]]
        assert recipe_rows(p, p.tail[j]) == recipe_rows(u, u.tail)


def test_a_full_arena_starts_over_and_earlier_configurations_keep_theirs(monkeypatch):
    # past ARENA_ROWS rows the next pack starts a new arena; a Packed made before keeps the arrays it was given, so
    # both time their own stages alike
    import simdist.analytic.timeline_kernel as tk

    found = _config({"tp": 1, "pp": 4, "dp": 1, "cp": 1, "vpp": 1, "zero_stage": 1, "recompute": "none",
                     "schedule": "1f1b", "grad_reduce": "bucketed", "bucket": None, "microbatches": 8, "mbs": 1,
                     "sp": False, "per_parameter": False})
    assert found is not None
    cfg, topology = found
    stages = _stages(cfg, CommPricer(topology))
    before = closed._pack(stages)
    generation = tk._ARENA.generation
    boxes = [st.box() for st in stages.distinct]
    assert all(box[0] == (generation, slot) for box, slot in zip(boxes, sorted(set(before.slot.tolist())),
                                                                  strict=True))
    assert closed._pack(stages).slot.tolist() == before.slot.tolist()  # the same places while the arena holds
    monkeypatch.setattr(tk, "ARENA_ROWS", 1)  # every arena is full from now on
    after = closed._pack(stages)
    assert after.kind is not before.kind  # a new arena's arrays
    assert after.slot[0] == 0 and after.slot.tolist() == sorted(after.slot.tolist())  # laid in afresh, in order
    assert all(box[0][0] == generation + 1 for box in boxes)  # the boxes name the new arena
    assert closed._compiled_timeline(cfg, before, 8)[0] == closed._compiled_timeline(cfg, after, 8)[0]


intervals_of_a_stage = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 12), st.integers(0, len(CATEGORIES) - 1), st.booleans()),
    max_size=25)


@settings(max_examples=150, deadline=None)
@given(st.lists(intervals_of_a_stage, min_size=1, max_size=3), st.integers(0, 60),
       st.lists(st.tuples(st.integers(0, 30), st.integers(1, 6)), max_size=4), st.booleans())
def test_breakdown_sweep_is_accountings(stages, extra, block_list, covered):
    # random intervals (in quarters of a second: exact in binary) on 1-3 stages, with blocks on the first stage
    # (disjoint spans charged by their parts elsewhere): the compiled sweep's per-stage seconds are accounting's
    rows = []
    py_stages = []
    for s, ivs in enumerate(stages):
        stage = []
        for start, length, cat, work in ivs:
            a, b = start / 4, (start + length) / 4
            rows.append((a, b, cat, float(work), s))
            stage.append((a, b, CATEGORIES[cat], work))
        py_stages.append(stage)
    spans = []
    t = 0.0
    for gap, length in block_list:
        t += gap / 4
        spans.append((t, t + length / 4))
        t += length / 4
    ends = [b for _, b, *_ in rows] + [e for _, e in spans]
    step = max(ends, default=0.0) + extra / 4
    K = len(stages)
    total = sum(e - a for a, e in spans)
    first_last = np.full((K, 2), -1.0)
    totals = np.zeros(K)
    blocks = [BlockSummary(0.0, -1.0, -1.0, {}) for _ in range(K)]
    if spans:
        first_last[0] = (spans[0][0], spans[-1][1])
        totals[0] = total
        starts = np.array([a for a, _ in spans])
        stops = np.array([e for _, e in spans])
        blocks[0] = BlockSummary(total, spans[0][0], spans[-1][1], {},
                                 *((starts, stops) if covered else (None, None)))
    if not covered:  # the kernel's uncovered case assumes nothing counting overlaps the blocks: keep it so
        for stage in py_stages:
            stage[:] = [iv for iv in stage if not (iv[3] or iv[2] == "optimizer")
                        or all(iv[1] <= a or iv[0] >= e for a, e in spans)]
        rows = [r for r in rows if not (r[3] or r[2] == CATEGORIES.index("optimizer"))
                or all(r[1] <= a or r[0] >= e for a, e in spans)]
    expected = account(py_stages, step, blocks)
    table = np.array(rows, dtype=float).reshape(-1, 5)
    span_rows = np.array([(a, e, 0) for a, e in spans], dtype=float).reshape(-1, 3)
    lo, hi, seconds = account_stages(table, K, step, first_last, totals, span_rows, covered)
    assert (lo, hi) == pytest.approx((expected.phase_start_s, expected.phase_end_s)) or expected.phase_s == 0
    for s in range(K):
        got = {c: seconds[s, j] for j, c in enumerate(CATEGORIES)} | {"bubble": seconds[s, BUBBLE],
                                                                       "idle": seconds[s, IDLE]}
        assert got == pytest.approx(expected.stages[s], abs=1e-9)


def test_stage_flags_follow_the_stages_asked_about():
    # _fast and _overlapping_work asked in turn about stages with work beside their blocks (parameter gathers run
    # piece by piece) and stages without: each gets its own answer (the flags kept in each stage's unit box), and a
    # list holding other stage objects (no box) the same
    base = {"tp": 2, "pp": 2, "dp": 2, "cp": 1, "vpp": 1, "zero_stage": 1, "recompute": "none", "schedule": "1f1b",
            "bucket": None, "microbatches": 4, "mbs": 1, "sp": True, "per_parameter": True}
    overlapped = _config({**base, "grad_reduce": "overlapped", "param_overlap": True})
    plain = _config({**base, "grad_reduce": "bucketed", "param_overlap": False})
    assert overlapped is not None and plain is not None
    busy = _stages(overlapped[0], CommPricer(overlapped[1]))
    idle = _stages(plain[0], CommPricer(plain[1]))
    for _ in range(2):
        assert closed._overlapping_work(busy) and not closed._overlapping_work(idle)
        assert closed._fast(busy) and closed._fast(idle)
    bare = [dataclasses.replace(s, unit=None) for s in busy]
    assert closed._overlapping_work(bare) and not closed._overlapping_work(idle)


def test_stages_priced_alike_share_one_unit_box_under_the_contention_estimate():
    # a search's contended pricer prices each stage with its own group shapes, and the pricing shares the recipes
    # it times alike: stages whose recipes, simple forms and tail are the same objects share one unit box (packed
    # once, summed once by the bound), and stages that differ keep their own
    from simdist.search.evaluate import configured, contended_pricer, context
    from simdist.search.rank import enumerate_feasible
    from simdist.search.space import SearchProblem

    problem = SearchProblem("gpt3-175b", "dgx-a100", 16, 256)
    feasible, *_ = enumerate_feasible(problem)
    c = next(c for c in feasible if c.pp >= 8 and c.vpp == 1)
    ctx = context(problem)
    cfg, _ = configured(problem, c, ctx)
    stages = _stages(cfg, contended_pricer(ctx, cfg.mesh))

    def content(stage):
        return tuple(map(id, stage.recipes)), tuple(map(id, stage.simple)), id(stage.tail)

    by_content: dict = {}
    for stage in stages:
        by_content.setdefault(content(stage), set()).add(id(stage.unit))
    assert all(len(boxes) == 1 for boxes in by_content.values())
    assert len({id(stage.unit) for stage in stages}) == len(by_content) < len(stages)
