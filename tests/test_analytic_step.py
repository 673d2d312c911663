"""The closed-form step time (simdist.analytic.step) against the engine path (simdist.predict.step)."""

from __future__ import annotations

import pytest

from simdist import api
from simdist.analytic.select import rank_choices
from simdist.analytic.step import CommPricer, analytic_step
from simdist.collectives.group import Group
from simdist.collectives.request import Request
from simdist.plan.model_presets import resolve_model
from simdist.predict.step import predict_step, step_config

K22 = "scenarios/published/korthikanti2022-22b.yaml"
DP4 = ["cluster.num_nodes=4", "parallel.dp=4", "training.global_batch_size=16"]


def _both(path: str, assignments: list[str]) -> tuple[float, float]:
    sc = api.load_scenario(path, assignments)
    cfg = step_config(sc.spec, sc.topology, resolve_model(sc.spec.model))
    closed = analytic_step(cfg, CommPricer(sc.topology)).step_time_s
    engine = predict_step(sc.spec, sc.topology).result["step_time_s"]
    return closed, engine


@pytest.mark.parametrize("assignments", [
    [],
    ["training.recompute=full", "parallel.sequence_parallel=false"],
    [*DP4, "parallel.zero_stage=0"],
    [*DP4, "parallel.zero_stage=0", "training.grad_bucket_size=100 MB"],
    [*DP4, "parallel.zero_stage=1"],
    [*DP4, "parallel.zero_stage=2"],
    [*DP4, "parallel.zero_stage=3", "training.zero3_fetch=per_parameter"],
    [*DP4, "parallel.zero_stage=3", "training.zero3_fetch=per_parameter", "training.recompute=full"],
])
def test_equals_engine_where_nothing_overlaps(assignments):
    # One pipeline stage: forward and backward chains, then the gradient reduction, the optimizer and the
    # ZeRO gathers run back to back; the closed form must reproduce the engine exactly.
    closed, engine = _both(K22, assignments)
    assert closed == pytest.approx(engine, rel=1e-6)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb_h1", "interleaved_1f1b"])
def test_pipelines_within_one_percent(schedule):
    # Measured: +0.01 % (interleaved) to +0.25 % (zb_h1) on this two-stage pipeline.
    extra = ["parallel.vpp=2"] if schedule == "interleaved_1f1b" else []
    closed, engine = _both(K22, ["cluster.num_nodes=2", "parallel.pp=2", "training.global_batch_size=16",
                                 f"schedule={schedule}", *extra])
    assert closed == pytest.approx(engine, rel=0.01)


@pytest.mark.parametrize("name", ["korthikanti2022-175b.yaml", "megatron2021-175b-ptdp-1536.yaml"])
def test_published_scenarios_within_five_percent(name):
    # Measured: +0.2 % (Korthikanti 175B, interleaved) and -2.3 % (Megatron 175B on 1,536 GPUs: the engine sees
    # data-parallel traffic share links that the closed form prices alone). The larger published files
    # (530B, 1T) take minutes in the engine; measured there: +0.5 % .. -6.7 % (README of the search, report).
    closed, engine = _both(f"scenarios/published/{name}", [])
    assert closed == pytest.approx(engine, rel=0.05)


def test_pricer_caches_by_group_shape():
    sc = api.load_scenario(K22, DP4)
    pricer = CommPricer(sc.topology)
    ranks = (0, 8, 16, 24)
    t = pricer.time_s("all_reduce", ranks, 1e9)
    expected = rank_choices(Request("all_reduce", Group(sc.topology, ranks), 1e9))[0].predicted_s
    assert t == expected
    # The same shape elsewhere in the node (first peer on GPU 1) is another key; the same shape again is a hit.
    assert pricer.shape_time_s("all_reduce", 0, 4, 8, 1e9) == t
    assert pricer.misses == 1
    pricer.time_s("all_reduce", (1, 9, 17, 25), 1e9)
    assert pricer.misses == 2
    assert pricer.time_s("all_reduce", (0,), 1e9) == 0.0


def test_breakdown_adds_up_on_one_stage():
    sc = api.load_scenario(K22, [*DP4, "parallel.zero_stage=1"])
    cfg = step_config(sc.spec, sc.topology, resolve_model(sc.spec.model))
    r = analytic_step(cfg, CommPricer(sc.topology))
    parts = r.compute_s + r.recompute_s + r.tp_comm_s + r.dp_exposed_s + r.optimizer_s + r.bubble_s + r.pp_comm_s
    assert parts == pytest.approx(r.step_time_s, rel=1e-9)
    assert r.tokens_per_s == pytest.approx(16 * 2048 / r.step_time_s)
