"""Goodput (failures and checkpoints) and prediction bands: hand calculations and invariants."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from simdist import api
from simdist.predict.goodput import goodput
from simdist.predict.stated_ranges import time_factor
from simdist.spec.faults import CheckpointSpec


def test_llama3_cluster_reproduces_its_observed_interruption_rate() -> None:
    # Dubey et al. 2024 sec 3.3.4: 419 unexpected interruptions in 54 days on 16,384 GPUs (2,048 hosts, 8 NICs
    # each): the per-component rates scaled back to that cluster give its MTBF, 54 x 24 / 419 hours.
    g = goodput(num_gpus=16384, num_hosts=2048, num_nics=16384, num_params=405e9, checkpoint=CheckpointSpec())
    assert g["mtbf_s"] == pytest.approx(54 * 24 * 3600 / 419, rel=1e-12)
    assert g["failures_per_day"] == pytest.approx(419 / 54, rel=1e-12)


def test_goodput_is_the_young_daly_first_order_form() -> None:
    # MTBF M, write delta = 60 s, restart R = 600 s, interval tau given (1200 s) and at Young's optimum.
    cp = CheckpointSpec.model_validate({"write": "60 s", "restart": "10 min", "interval": "20 min"})
    g = goodput(num_gpus=16384, num_hosts=2048, num_nics=16384, num_params=1e9, checkpoint=cp)
    m = 54 * 24 * 3600 / 419
    assert g["fraction"] == pytest.approx(1200 / 1260 * (1 - (600 + 1260 / 2) / m), rel=1e-12)
    opt = goodput(num_gpus=16384, num_hosts=2048, num_nics=16384, num_params=1e9,
                  checkpoint=CheckpointSpec.model_validate({"write": "60 s", "restart": "10 min"}))
    assert opt["checkpoint_interval_s"] == pytest.approx(math.sqrt(2 * 60 * m), rel=1e-12)
    # the optimum beats intervals on either side of it
    for tau in ("5 min", "2 h"):
        other = goodput(num_gpus=16384, num_hosts=2048, num_nics=16384, num_params=1e9,
                        checkpoint=CheckpointSpec.model_validate({"write": "60 s", "restart": "10 min",
                                                                  "interval": tau}))
        assert other["fraction"] < opt["fraction"]


def test_default_checkpoint_write_is_the_model_states_over_storage_bandwidth() -> None:
    # 14 bytes per parameter (bf16 weights + fp32 master + 2 Adam moments) at 2 TB/s
    g = goodput(num_gpus=8, num_hosts=1, num_nics=8, num_params=1e9, checkpoint=CheckpointSpec())
    assert g["checkpoint_write_s"] == pytest.approx(14e9 / 2e12)


def test_split_lognormal_factor_hits_its_stated_percentiles() -> None:
    z90 = 1.2815515655446004
    assert time_factor(z90, 0.9, 1.5) == pytest.approx(1.5)
    assert time_factor(-z90, 0.9, 1.5) == pytest.approx(0.9)
    assert time_factor(0.0, 0.9, 1.5) == 1.0


def test_run_json_carries_band_goodput_and_how(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("""
cluster: {preset: dgx-h100, num_nodes: 2}
model: {num_layers: 8, hidden_size: 2048, num_attention_heads: 16, seq_length: 1024, vocab_size: 32000}
parallel: {tp: 2, pp: 2, dp: 4}
training: {micro_batch_size: 1, global_batch_size: 32}
""")
    out = api.run(path)
    r = out.result
    b = r["step_time_band_s"]
    assert b["p10"] < b["p50"] < b["p90"]
    # the band brackets the prediction: the ranges have median 1 and the step grows with each factor
    assert b["p10"] < r["step_time_s"] < b["p90"]
    assert "uncertainty.yaml" in r["step_time_band_how"]
    assert 0 < r["goodput"]["fraction"] <= 1
    assert "step time band" in out.text and "goodput" in out.text
    closed = api.run(path, fidelity="closed_form").result
    assert closed["step_time_band_s"]["p50"] / closed["step_time_s"] == pytest.approx(
        b["p50"] / r["step_time_s"], rel=1e-12)  # the same relative band for either fidelity


def test_band_on_shared_fast_forward_samples_equals_each_closed_form_detecting_its_own(tmp_path: Path) -> None:
    # The 33 closed forms of a band (nominal + 32 sampled) are timed on the samples whose cycle the nominal step's
    # timeline shows (detected once), not each detecting its own: the same band.
    from simdist.analytic.step import CommPricer, fast_forward_plan
    from simdist.plan.layout import step_config_of
    from simdist.plan.model_presets import resolve_model
    from simdist.predict.bands import step_band

    path = tmp_path / "s.yaml"
    path.write_text("""
cluster: {preset: dgx-h100, num_nodes: 2}
model: {num_layers: 8, hidden_size: 1024, num_attention_heads: 16, seq_length: 1024, vocab_size: 32000}
parallel: {tp: 2, pp: 4, dp: 2, vpp: 2}
training: {micro_batch_size: 1, global_batch_size: 512}
schedule: interleaved_1f1b
""")
    sc = api.load_scenario(path)
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    pricer = CommPricer(sc.topology, None)
    plan = fast_forward_plan(cfg, pricer, for_engine=True)
    assert plan is not None  # the shared samples are used
    shared, how = step_band(cfg, pricer, 10.0, plan)
    own, _ = step_band(cfg, pricer, 10.0, None)
    assert shared == pytest.approx(own, rel=1e-9)
    assert shared["p10"] < shared["p50"] < shared["p90"] and "Latin hypercube" in how
