"""A program's steady form (simdist.analytic.steady) and the compiled loop's jump over its repeating bodies.

The wave order must be an order the program may run in (each step after its stage's previous step and after its
upstream step; every stage's steps in their own order), its body must recur step for step, and a loop that jumps
over bodies must give the step-by-step timeline's answer: on a hand-checked uniform 1F1B, (M + K - 1)(F + B), and on
random layouts to 1e-9 of the step time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdist.analytic import timeline as closed
from simdist.analytic.pricing import CommPricer
from simdist.analytic.program import program
from simdist.analytic.steady import MIN_BODIES, steady_form
from simdist.analytic.step import analytic_observables
from simdist.analytic.timeline import _backward_codes
from simdist.analytic.timeline_kernel import SIMPLE, Packed, Unit, pack, run_program
from simdist.api.scenario import load_scenario
from simdist.plan.accounting import CATEGORIES
from simdist.plan.fastforward import group_of
from simdist.predict.step import checked_step
from tests.test_analytic_step import _agree, layouts
from tests.test_timeline_kernel import _compiled_priced, _oracle

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios" / "published"
SCHEDULES = [("1f1b", 1), ("gpipe", 1), ("zb_h1", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 3)]


@pytest.mark.parametrize(("schedule", "vpp"), SCHEDULES)
@pytest.mark.parametrize("num_stages", [2, 4, 8])
def test_wave_order_is_an_order_the_program_may_run_in_and_its_body_recurs(schedule, vpp, num_stages):
    m = num_stages * 12
    prog = program(schedule, num_stages, m, vpp)
    form = steady_form(schedule, num_stages, m, vpp)
    assert form is not None
    steps, (first, length, repeats, lookback) = form.steps, form.body.tolist()
    n = steps.shape[1]
    index = np.arange(n)
    # every step after its upstream step; every stage's steps (recipe codes, downstream) in the program's order
    up = steps[2]
    assert (up[up >= 0] < index[up >= 0]).all()
    for s in range(num_stages):
        assert steps[1, steps[0] == s].tolist() == prog.steps[1, prog.steps[0] == s].tolist()
        assert steps[3, steps[0] == s].tolist() == prog.steps[3, prog.steps[0] == s].tolist()
    # the body: one cycle of micro-batches (a group of K interleaved), repeated back to back
    cycle = group_of(schedule, num_stages) * (n // m)
    assert length in (cycle, 2 * cycle)
    assert repeats >= MIN_BODIES and first + repeats * length <= n
    rel = np.where(steps[2] >= 0, index - steps[2], -1)
    body = np.stack([steps[0], steps[1], rel, steps[3]])
    for r in range(1, repeats):
        assert np.array_equal(body[:, first + r * length:first + (r + 1) * length], body[:, first:first + length])
    assert 0 < lookback <= first
    assert rel[first:].max() == lookback


def test_upstream_steps_are_the_programs():
    # renumbered, each step's upstream is the step it was in the program: the same (stage, code, micro-batch) pair
    prog = program("interleaved_1f1b", 4, 48, 2)
    form = steady_form("interleaved_1f1b", 4, 48, 2)
    # a step is known by its stage and its number among that stage's steps (both orders keep each stage's order)
    def names(steps: np.ndarray) -> list[tuple[int, int]]:
        seen = [0] * 4
        out = []
        for s in steps[0].tolist():
            out.append((s, seen[s]))
            seen[s] += 1
        return out

    a, b = names(prog.steps), names(form.steps)
    up_a = {a[i]: (a[u] if u >= 0 else None) for i, u in enumerate(prog.steps[2].tolist())}
    up_b = {b[i]: (b[u] if u >= 0 else None) for i, u in enumerate(form.steps[2].tolist())}
    assert up_a == up_b


def test_no_steady_form_where_the_steady_state_is_short_or_sends_are_held():
    assert steady_form("1f1b", 4, 6, 1) is None  # 6 micro-batches on 4 stages: no 4 bodies
    assert steady_form("dualpipev", 4, 32, 2) is None  # DualPipeV holds sends for later steps
    assert steady_form("1f1b", 4, 64, 1) is not None


def _unit(forward_s: float, backward_s: float) -> Unit:
    """A stage whose forward takes ``forward_s`` and backward ``backward_s`` (simple steps, no streams beside) and
    whose tail is empty."""
    C = 6  # recipe codes of one chunk: (F, B, W) x (edge or not)
    kind = np.zeros(C, dtype=np.int8)
    kind[:4] = SIMPLE
    empty = np.zeros((0, 4))
    return Unit(kind=kind, recipe=np.full(C, -1, dtype=np.int64),
                duration=np.array([forward_s, forward_s, backward_s, backward_s, 0.0, 0.0]),
                frees=np.full((C, 4), -1.0), ahead_ptr=np.zeros(C + 1, dtype=np.int64), ahead=np.zeros((0, 3)),
                behind_ptr=np.zeros(C + 1, dtype=np.int64), behind=empty,
                recipe_ptr=np.zeros(2, dtype=np.int64), recipe_needs=np.array([-1], dtype=np.int64),
                recipe_end=np.array([-1], dtype=np.int64), piece=empty, dep_ptr=np.zeros(1, dtype=np.int64),
                deps=np.zeros(0, dtype=np.int64), tail=0, simple_flops=np.zeros((C, 2)),
                parts=np.zeros((C, len(CATEGORIES))), recipe_flops=np.zeros((1, 2)))


def _uniform(num_stages: int, forward_s: float, backward_s: float, send_s: float) -> Packed:
    """K stages of one unit (`_unit`), sends ``send_s``."""
    return pack([_unit(forward_s, backward_s)] * num_stages, [[send_s] * 3] * num_stages)


@pytest.mark.parametrize(("num_stages", "m"), [(4, 32), (8, 100)])
def test_uniform_1f1b_jumps_and_is_the_textbook_step(num_stages, m):
    # uniform stages, F = 1, B = 2, no sends: (M + K - 1)(F + B) (Narayanan et al. 2021 sec. 2.2: the bubble is
    # (K - 1)(F + B)); the loop jumps over most of the steady state and gives the same, exactly
    packed = _uniform(num_stages, 1.0, 2.0, 0.0)
    prog, form = program("1f1b", num_stages, m, 1), steady_form("1f1b", num_stages, m, 1)
    backward = _backward_codes(6, False)
    whole = run_program(packed, prog.steps, prog.counts, backward, False, False)
    jumped = run_program(packed, form.steps, prog.counts, backward, False, False, form.body)
    assert whole[0] == jumped[0] == (m + num_stages - 1) * 3.0
    assert whole[5] == len(prog)
    assert jumped[5] < len(prog) / 2
    np.testing.assert_array_equal(whole[2], jumped[2])  # each stage's first start and last end


def test_sends_and_uneven_ends_jump_to_the_same_step():
    # sends of 0.3 and a last stage 1.5x as slow: a longer transient, the same step as running every step
    packed = pack([_unit(1.0, 2.0)] * 5 + [_unit(1.5, 3.0)], [[0.3] * 3] * 6)
    prog, form = program("1f1b", 6, 200, 1), steady_form("1f1b", 6, 200, 1)
    backward = _backward_codes(6, False)
    whole = run_program(packed, prog.steps, prog.counts, backward, False, False)
    jumped = run_program(packed, form.steps, prog.counts, backward, False, False, form.body)
    assert jumped[0] == pytest.approx(whole[0], rel=1e-12)
    assert jumped[5] < len(prog) / 2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts, st.integers(2, 6))
def test_jumping_compiled_closed_form_is_the_step_by_step_timeline(x, groups):
    # long steps (enough micro-batches for a steady form) of every layout the compiled loop times: the same step
    # and breakdown as the step-by-step timeline, to 1e-9 of the step time
    found = _compiled_priced(x)
    if found is None:
        return
    cfg, stages = found
    g = group_of(cfg.schedule, cfg.mesh.pp)
    m = g * (groups * max(cfg.mesh.pp, 2) + 4)
    oracle = _oracle(cfg, stages, m)
    packed = closed._pack(stages)
    _agree(oracle, closed._observables(cfg, stages, m, packed), 1e-9)
    # the step time alone, as the fast-forward's samples and the search's bound ask for it (no spans: every layout
    # with a steady form jumps here, whatever its breakdown needs)
    assert closed._compiled_timeline(cfg, packed, m)[0] == pytest.approx(oracle["step_s"], rel=1e-9)


def test_a_search_jumps_where_a_run_samples_and_both_are_the_whole_step():
    # Narayanan et al.'s 175B on 384 GPUs: 384 micro-batches on 12 stages. `simdist run`'s closed form samples three
    # short steps (the fast-forward); a search's (compiled=True) times every micro-batch with the loop's jump and
    # spends no detection timeline; both equal the whole step timed without either to 1e-9
    scenario = load_scenario(str(SCENARIOS / "megatron2021-175b-ptdp-384.yaml"), [])
    _, cfg, _ = checked_step(scenario.spec, scenario.topology)
    pricer = CommPricer(scenario.topology)
    sampled, how = analytic_observables(cfg, pricer)
    searched, searched_how = analytic_observables(cfg, pricer, compiled=True)
    whole, _ = analytic_observables(cfg, pricer, fast_forward=False, compiled=False)
    assert how is not None and searched_how is None
    _agree(whole, sampled, 1e-9)
    _agree(whole, searched, 1e-9)
