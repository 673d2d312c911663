"""Megatron-LM --tp-comm-overlap: the sequence-parallel collectives hide behind the compute, whose reduce-scatter
GEMMs lose the SMs Transformer Engine's userbuffers kernels take (simdist.hardware.tp_overlap)."""

from __future__ import annotations

import pytest

from simdist import api
from simdist.analytic.step import CommPricer, analytic_step
from simdist.errors import SimdistError
from simdist.hardware.compute import compute_efficiency, kernel_time_s
from simdist.hardware.tp_overlap import gemm_slowdown
from simdist.plan.layer_cost import layer_work
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.spec.scenario import ScenarioSpec

SPEC = {"cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpus_per_node": 4, "gpu_speed_cv": 0},
        "model": {"num_layers": 4, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 4096,
                  "vocab_size": 32000},
        "parallel": {"tp": 4, "sequence_parallel": True},
        "training": {"micro_batch_size": 1, "global_batch_size": 1}}


def _step(overlap: bool):
    spec = ScenarioSpec.model_validate({**SPEC, "training": {**SPEC["training"], "tp_comm_overlap": overlap}})
    topology = api.cluster_of(spec)
    cfg = step_config_of(spec, topology, resolve_model(spec.model))
    return cfg, analytic_step(cfg, CommPricer(topology))


def test_overlap_hides_the_tp_collectives_and_charges_the_lost_sms() -> None:
    # One GPU group, one micro-batch: the forward step is compute then its tp collectives back to back, or with the
    # overlap max(compute + lost-SM time, collectives); the compute of these 4096-wide layers is longer than their
    # all-gathers and reduce-scatters on NVLink, so the exposed tp time vanishes in the forward and shrinks in the
    # backward, and the step gains the projection's and fc2's time on 24 and 16 fewer of the H100's 132 SMs.
    cfg, plain = _step(False)
    _, over = _step(True)
    assert gemm_slowdown(cfg.gpu, "bf16", "projection") == pytest.approx(132 / (132 - 24))
    assert gemm_slowdown(cfg.gpu, "bf16", "mlp_down") == pytest.approx(132 / (132 - 16))
    assert gemm_slowdown(cfg.gpu, "fp8", "mlp_down") == pytest.approx(132 / 131)
    work = layer_work(cfg.model, tp=4, sequence_parallel=True, attention="flash")
    eff = compute_efficiency(cfg.gpu)
    tax = cfg.model.num_layers * sum((gemm_slowdown(cfg.gpu, "bf16", k.name) - 1)
                                     * kernel_time_s(cfg.gpu, k, "bf16", eff) for k in work.forward if k.kind == "gemm")
    assert tax > 0
    assert over.compute_s == pytest.approx(plain.compute_s + tax, rel=1e-6)
    assert plain.tp_comm_s > 0 and over.tp_comm_s < 0.5 * plain.tp_comm_s
    assert over.step_time_s < plain.step_time_s


def test_an_overlapped_collective_leaves_one_chunk_exposed() -> None:
    # Ring exchange moves one chunk per tp peer: the first chunk of an all-gather is exposed (1/tp); bf16's pipelined
    # reduce-scatter runs in 4 chunks, the last exposed (1/4); fp8's reduce-scatter is a ring exchange too.
    from simdist.hardware.tp_overlap import exposed_share

    assert exposed_share("all_gather", "bf16", 4) == pytest.approx(1 / 4)
    assert exposed_share("reduce_scatter", "bf16", 8) == pytest.approx(1 / 4)
    assert exposed_share("reduce_scatter", "fp8", 8) == pytest.approx(1 / 8)
    # the recipe keeps that share of each tp collective in the forward step's path and hides the rest
    from simdist.plan.chunk_cost import chunk_cost
    from simdist.plan.recipe import step_recipe

    cfg, _ = _step(True)
    cost = chunk_cost(cfg, cfg.part_layers(0), True, True)
    pieces = step_recipe(cfg, cost, "F").pieces
    tp = [p for p in pieces if p.comm is not None and p.comm.axis == "tp" and p.comm.op == "all_gather"]
    total = sum(n * nbytes for op, nbytes, axis, n, *_ in cost.forward_comm if axis == "tp" and op == "all_gather")
    exposed = sum(p.comm.nbytes * p.comm.count for p in tp if not p.label.startswith("overlapped"))
    assert exposed == pytest.approx(total / 4)


def test_overlap_needs_sequence_parallelism() -> None:
    bad = {**SPEC, "parallel": {"tp": 4}, "training": {**SPEC["training"], "tp_comm_overlap": True}}
    spec = ScenarioSpec.model_validate(bad)
    with pytest.raises(SimdistError, match=r"training\.tp_comm_overlap"):
        step_config_of(spec, api.cluster_of(spec), resolve_model(spec.model))
