"""FSDP's gradient accumulation without sync (training.fsdp_no_sync: FSDP1 no_sync(), FSDP2
set_requires_gradient_sync(False)): every micro-batch but the last adds its gradients into unsharded ones kept in the
reduction's dtype (FSDP2 FSDPParam.to_accumulated_grad_if_needed / accumulate_unsharded_grad_if_needed), and the last
micro-batch reduce-scatters them unit by unit in its backward (simdist.plan.recipe, simdist.plan.fsdp)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist.errors import SpecError
from simdist.hardware.compute import kernels_time_s
from simdist.plan.chunk_cost import chunk_cost
from simdist.plan.fsdp import units_of
from simdist.plan.kernel_work import elementwise
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.recipe import step_recipe
from tests.conftest import TOY_TOPOLOGY

ROOT = Path(__file__).resolve().parents[1]

# 8 ranks, ZeRO-3 over 8, micro-batch 1 of a global 32: 4 micro-batches a rank
SCENARIO = f"""
cluster: {{file: {TOY_TOPOLOGY}, num_nodes: 2}}
model: {{num_layers: 4, hidden_size: 1024, num_attention_heads: 8, seq_length: 1024, vocab_size: 4096, swiglu: true}}
parallel: {{dp: 8}}
training: {{framework: torchtitan, micro_batch_size: 1, global_batch_size: 32, recompute: none, NO_SYNC}}
"""


def _path(tmp_path: Path, no_sync: bool, text: str = SCENARIO) -> Path:
    path = tmp_path / f"s{int(no_sync)}.yaml"
    path.write_text(text.replace("NO_SYNC", f"fsdp_no_sync: {str(no_sync).lower()}"))
    return path


def _backward(tmp_path: Path, no_sync: bool, last: bool):
    s = api.load_scenario(_path(tmp_path, no_sync))
    cfg = step_config_of(s.spec, s.topology, resolve_model(s.spec.model))
    cost = chunk_cost(cfg, cfg.part_layers(0), True, True)
    return cfg, cost, step_recipe(cfg, cost, "B", last=last).pieces


def _compute_s(pieces) -> float:
    return sum(p.duration_s for p in pieces if p.comm is None and p.kind == "backward" and not p.tax_of)


def _scatter_bytes(pieces) -> float:
    return sum(p.comm.nbytes for p in pieces if p.comm is not None and p.comm.op == "reduce_scatter")


def test_only_the_last_micro_batch_reduce_scatters_and_every_one_accumulates(tmp_path):
    cfg, cost, synced = _backward(tmp_path, False, last=False)
    _, _, held = _backward(tmp_path, True, last=False)
    _, _, last = _backward(tmp_path, True, last=True)
    # the gradients of a unit: fp32 reduction (torchtitan), 4 bytes each
    assert _scatter_bytes(synced) == pytest.approx(cost.num_params * 4, rel=1e-12)
    assert _scatter_bytes(held) == 0.0
    assert _scatter_bytes(last) == _scatter_bytes(synced)
    # every no_sync micro-batch adds its bf16 gradients into the fp32 accumulated ones: 2 read + 4 read + 4 written
    units = units_of(cost).count
    add_s = kernels_time_s(cfg.gpu, [elementwise("add", cost.num_params / units, 10.0, 1.0)] * units, cfg.precision,
                           cfg.compute_efficiency)
    # and the micro-batch that reduce-scatters copies them into its reduce-scatter buffer (FSDP2: 2 + 4 bytes)
    copy_s = kernels_time_s(cfg.gpu, [elementwise("copy", cost.num_params / units, 6.0, 0.0)] * units, cfg.precision,
                            cfg.compute_efficiency)
    assert _compute_s(held) - _compute_s(synced) == pytest.approx(add_s - copy_s, rel=1e-9)
    assert _compute_s(last) - _compute_s(held) == pytest.approx(copy_s, rel=1e-9)


def test_the_accumulated_gradients_stay_unsharded_in_the_reduction_dtype(tmp_path):
    synced = api.run(_path(tmp_path, False), fidelity="closed_form").result["memory"][0]
    held = api.run(_path(tmp_path, True), fidelity="closed_form").result["memory"][0]
    params = synced["params_bytes"] / 4 * 8  # the fp32 shard of 1/8 of the stage's parameters
    assert synced["grads_bytes"] == pytest.approx(params * 4 / 8, rel=1e-12)
    assert held["grads_bytes"] == pytest.approx(params * 4, rel=1e-12)
    assert held["params_bytes"] == synced["params_bytes"] and held["optimizer_bytes"] == synced["optimizer_bytes"]


def test_both_fidelities_time_it_alike(tmp_path):
    for no_sync in (False, True):
        closed = api.run(_path(tmp_path, no_sync), fidelity="closed_form").result["step_time_s"]
        engine = api.run(_path(tmp_path, no_sync)).result["step_time_s"]
        assert engine == pytest.approx(closed, rel=1e-6)


def test_kempnerforge_175b_accumulation_runs_out_of_memory_as_its_report_says():
    # KempnerInstitute/KempnerForge benchmarks/175b_360gpu/README.md: gradient accumulation ran out of memory at 175B,
    # so the run took micro-batch 8 without it; its accumulation keeps each rank's 43.75B parameters' gradients in fp32
    path = ROOT / "scenarios/published/kempnerforge-175b-tp4-fsdp90.yaml"
    assert api.run(path, fidelity="closed_form").result["fits_in_memory"]
    twice = api.run(path, ["training.global_batch_size=1440"], fidelity="closed_form").result
    assert not twice["fits_in_memory"]
    assert twice["memory"][0]["grads_bytes"] > 141e9


def test_no_sync_needs_fsdp_unit_by_unit(tmp_path):
    text = SCENARIO.replace("parallel: {dp: 8}", "parallel: {dp: 8, zero_stage: 1}")
    with pytest.raises(SpecError) as err:
        api.run(_path(tmp_path, True, text), fidelity="closed_form")
    assert err.value.field == "training.fsdp_no_sync"
