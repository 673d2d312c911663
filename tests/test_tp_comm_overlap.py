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

SPEC = {"cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpus_per_node": 4},
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


def test_overlap_needs_sequence_parallelism() -> None:
    bad = {**SPEC, "parallel": {"tp": 4}, "training": {**SPEC["training"], "tp_comm_overlap": True}}
    spec = ScenarioSpec.model_validate(bad)
    with pytest.raises(SimdistError, match=r"training\.tp_comm_overlap"):
        step_config_of(spec, api.cluster_of(spec), resolve_model(spec.model))
