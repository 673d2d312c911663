"""The GPUs' speed spread in a prediction band (simdist.predict.bands): each draw scales the stated spread
(cluster.gpu_speed_cv) by a factor of uncertainty.yaml's ``gpu_speed_spread`` range, and the step's compute by the
slowest GPU's pace at the drawn spread over that at the stated one; checked on the slowest-of-N formula by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simdist import api
from simdist.hardware.variability import expected_max_normal, gpu_variability
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.stage_pace import paced_variabilities
from simdist.predict.bands import _spread_factors
from simdist.predict.stated_ranges import Z90, spread_range
from simdist.report.band_line import band_line

# 16 H100 (two DGX hosts; H100's constants are single-GPU measurements: reference group 1), data parallel only
DP16 = """
cluster: {preset: dgx-h100, num_nodes: 2}
model: {preset: cs336-mlp, kind: mlp, num_layers: 4, hidden_size: 1024}
parallel: {tp: 1, pp: PP, dp: DP}
training: {micro_batch_size: 8, global_batch_size: 256, precision: bf16}
"""


def _scenario(tmp_path, pp: int = 1):
    path = tmp_path / f"spread-{pp}.yaml"
    path.write_text(DP16.replace("PP", str(pp)).replace("DP", str(16 // pp)))
    return path


def _cfg(path):
    sc = api.load_scenario(path)
    return step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))


def test_the_stated_range_is_the_sources():
    r = spread_range()
    assert (r["p10"], r["p90"]) == (0.4, 1.8)  # cv 0.008 - 0.036 around the default 0.02
    assert "Sinha" in r["reason"] and "Assumption" in r["reason"]


def test_each_draw_is_the_slowest_of_16_at_its_spread_by_hand(tmp_path):
    cfg = _cfg(_scenario(tmp_path))
    assert cfg.gpu_speed_cv == 0.02 and cfg.mesh.num_ranks == 16
    z16 = expected_max_normal(16)  # 1.769 (Blom: Phi^-1(15.625 / 16.25))
    got = _spread_factors(cfg, np.array([0.0, Z90, -Z90]))
    assert got is not None
    # z = 0: the stated spread; z = +-Z90: the range's p90 and p10 (1.8 and 0.4 times cv)
    assert got == pytest.approx([1.0, (1 + 0.036 * z16) / (1 + 0.02 * z16), (1 + 0.008 * z16) / (1 + 0.02 * z16)],
                                rel=1e-12)
    assert got[1] == pytest.approx(1.0273, abs=1e-4) and got[2] == pytest.approx(0.9795, abs=1e-4)


def test_a_pipelines_draws_are_its_paced_variability_at_the_drawn_spread(tmp_path):
    cfg = _cfg(_scenario(tmp_path, pp=2))
    assert cfg.mesh.pp == 2
    assert paced_variabilities(cfg, [cfg.gpu_speed_cv])[0] == pytest.approx(cfg.paced_variability, rel=1e-12)
    for cv in (0.008, 0.036):
        other = dataclasses.replace(cfg, gpu_speed_cv=cv, gpu_variability=gpu_variability(cfg.gpu, cv, 16))
        assert paced_variabilities(cfg, [cv])[0] == pytest.approx(other.paced_variability, rel=1e-12)


def test_identical_gpus_or_one_gpu_draw_no_spread(tmp_path):
    even = _cfg(_scenario(tmp_path))
    assert _spread_factors(even, np.zeros(4)) is None  # every draw at the stated spread: nothing moves
    assert _spread_factors(dataclasses.replace(even, gpu_speed_cv=0.0), np.array([Z90])) is None
    one = tmp_path / "one.yaml"
    single = "{preset: cpu-loopback, gpus_per_node: 1, gpu: h100-sxm}"
    one.write_text(DP16.replace("{preset: dgx-h100, num_nodes: 2}", single)
                   .replace("PP", "1").replace("DP", "1").replace("global_batch_size: 256", "global_batch_size: 16"))
    assert _spread_factors(_cfg(one), np.array([-Z90, Z90])) is None  # the slowest of one GPU is that GPU


def test_the_run_reports_the_spread_it_drew(tmp_path):
    path = _scenario(tmp_path)
    r = api.run(path, fidelity="closed_form").result
    spread = [s for s in r["step_time_band_sources"] if s["constant"] == "GPU speed spread factor"]
    assert len(spread) == 1 and spread[0]["method"] == "stated_range"
    assert spread[0]["gpu_speed_cv"] == pytest.approx({"p10": 0.008, "p50": 0.02, "p90": 0.036})
    assert "speed spread x 0.4-1.8 (p10-p90: gpu_speed_cv 0.008-0.036" in r["step_time_band_how"]
    # the text output's one line names it as the spread's factor, not as a compute time factor
    line = band_line(r["step_time_band_sources"])
    assert "GPU speed spread x 0.4-1.8" in line and "compute time x 0.4-1.8" not in line
    band = r["step_time_band_s"]
    assert band["p10"] <= r["step_time_s"] * 1.0001 <= band["p90"] * 1.0001
    even = api.run(path, ["cluster.gpu_speed_cv=0"], fidelity="closed_form").result
    assert not [s for s in even["step_time_band_sources"] if s["constant"] == "GPU speed spread factor"]
    assert "speed spread" not in even["step_time_band_how"]
