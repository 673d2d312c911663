"""The closed form's timelines for the fast-forward plan (simdist.analytic.timeline._Timelines, program.step_groups).

A timeline records each step's start by its index in the program and groups them once at the end; the candidate
samples are timed without recording starts; a step too short to fast-forward is never priced. Each must give what
the plain recording gives: the generic timeline's starts (recorded step by step), the same step times, the same
plan.
"""

from __future__ import annotations

import pytest

from simdist import api
from simdist.analytic import timeline as closed
from simdist.analytic.program import program, step_groups
from simdist.analytic.stages import _stages
from simdist.analytic.step import CommPricer, _plan, fast_forward_plan
from simdist.plan import fastforward
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.schedule import SPLIT_BACKWARD
from tests.test_analytic_step import _spec


def _cfg(schedule: str, vpp: int, microbatches: int):
    spec = _spec({"tp": 2, "pp": 4, "dp": 1, "cp": 1, "vpp": vpp, "zero_stage": 1, "recompute": "none",
                  "schedule": schedule, "grad_reduce": "bucketed", "bucket": None,
                  "microbatches": microbatches, "mbs": 1, "sp": True, "per_parameter": False})
    topology = api.cluster_of(spec)
    return step_config_of(spec, topology, resolve_model(spec.model)), topology


@pytest.mark.parametrize("schedule,k,m,vpp", [("interleaved_1f1b", 4, 8, 2), ("1f1b", 3, 5, 1), ("zb_h1", 4, 6, 1),
                                              ("gpipe", 2, 3, 1), ("zb_v", 4, 6, 2), ("dualpipe", 4, 8, 1),
                                              ("dualpipev", 2, 5, 2)])
def test_step_groups_are_the_program_grouped_by_stage_kind_and_chunk(schedule, k, m, vpp):
    prog = program(schedule, k, m, vpp)
    by_hand: dict[tuple, list[int]] = {}
    for i in range(len(prog)):
        by_hand.setdefault((prog.stage[i], prog.kind[i], prog.chunk[i]), []).append(i)
    groups = step_groups(schedule, k, m, vpp)
    assert [key for key, _ in groups] == list(by_hand)  # in order of each group's first step
    assert {key: idx.tolist() for key, idx in groups} == by_hand
    # each group is one (stage, kind, chunk) in micro-batch order
    for (s, kind, chunk), idx in groups:
        assert [prog.microbatch[i] for i in idx] == sorted(prog.microbatch[i] for i in idx)
        assert {(prog.stage[i], prog.kind[i], prog.chunk[i]) for i in idx} == {(s, kind, chunk)}


@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1), ("zb_v", 2),
                                          ("dualpipe", 1), ("dualpipev", 2)])
def test_fast_timeline_starts_equal_the_generic_timelines(schedule, vpp):
    # _timeline (step by step, its starts recorded as it goes) and the compiled timeline (starts by program index,
    # grouped at the end) on the same stages: the same starts, exactly, and the same step
    cfg, topology = _cfg(schedule, vpp, 12)
    stages = _stages(cfg, CommPricer(topology))
    assert closed._fast(stages)
    fast_starts: dict = {}
    generic_starts: dict = {}
    fast = closed._compiled_timeline(cfg, closed._pack(stages), 12, fast_starts)[0]
    generic = closed._timeline(cfg, stages, 12, generic_starts)[0]
    assert fast == generic
    def lists(starts: dict) -> dict:  # the compiled timeline's starts are arrays, the step-by-step one's lists
        return {key: list(seq) for key, seq in starts.items()}

    assert lists(fast_starts) == generic_starts
    assert len(fast_starts) == cfg.mesh.pp * cfg.chunks * (3 if schedule in SPLIT_BACKWARD else 2)
    timelines = closed._Timelines(cfg, stages)
    assert timelines.step_of(12) == fast == timelines.timeline(12)[1]
    assert lists(timelines.timeline(12)[0]) == generic_starts


@pytest.mark.parametrize("schedule,vpp,microbatches", [("1f1b", 1, 192), ("interleaved_1f1b", 2, 100)])
def test_plan_with_step_of_is_the_plan_of_timelines_alone(schedule, vpp, microbatches):
    # the candidate samples timed without starts (step_of) give the plan that timing them with starts gives
    cfg, topology = _cfg(schedule, vpp, microbatches)
    timelines = closed._Timelines(cfg, _stages(cfg, CommPricer(topology)))
    M = cfg.microbatches(0)
    with_starts = fastforward.plan(cfg.schedule, cfg.mesh.pp, M, timelines.timeline, vpp=vpp)
    without = fastforward.plan(cfg.schedule, cfg.mesh.pp, M, timelines.timeline, vpp=vpp,
                               step_of=timelines.step_of)
    assert with_starts is not None
    assert without == with_starts
    assert fast_forward_plan(cfg, CommPricer(topology)) == with_starts


def test_a_step_too_short_to_fast_forward_is_not_priced():
    # 8 micro-batches: no plan pays, so the plan reads no timeline and prices no stage
    cfg, topology = _cfg("1f1b", 1, 8)

    def refuse():
        raise AssertionError("stages priced for a step that is not fast-forwarded")

    assert _plan(cfg, refuse, True) is None
    pricer = CommPricer(topology)
    assert fast_forward_plan(cfg, pricer, for_engine=True) is None
    assert pricer.misses == 0 and not pricer._memo
    # a long one prices its stages once, on the first timeline
    calls = []
    cfg, topology = _cfg("1f1b", 1, 192)
    stages = _stages(cfg, CommPricer(topology))
    assert _plan(cfg, lambda: calls.append(1) or stages, True) is not None
    assert calls == [1]
