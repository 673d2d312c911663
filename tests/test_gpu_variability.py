"""GPU-to-GPU speed variability (simdist.hardware.variability): the slowest of a job's N GPUs sets the step's pace,
every compute piece 1 + cv z(N) as long as the median GPU's, z(N) Blom's expected largest of N standard normals."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simdist import api
from simdist.analytic.bound import compute_bound_s, lower_bound_s
from simdist.analytic.step import CommPricer, analytic_step
from simdist.hardware.compute import reference_gpus
from simdist.hardware.gpus import GPU_PRESETS
from simdist.hardware.variability import (
    expected_max_normal,
    gpu_variability,
    pace_ratio,
    slowest_factor,
    variability_factor,
)
from simdist.plan.stage_pace import PACE_DIGITS, stage_loads
from simdist.predict.step import checked_step
from tests.cli_harness import run_cli

PHI_INV = NormalDist().inv_cdf


def _scenario(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- the closed form, by hand
def test_the_slowest_of_one_gpu_is_the_median_gpu():
    assert expected_max_normal(1) == 0.0  # Phi^-1((1 - 0.375) / (1 + 0.25)) = Phi^-1(0.5)
    assert slowest_factor(0.05, 1) == 1.0 and variability_factor(0.05, 1) == 1.0


def test_the_slowest_of_two_by_blom():
    z2 = PHI_INV(1.625 / 2.25)  # (2 - 0.375) / (2 + 0.25)
    assert expected_max_normal(2) == pytest.approx(z2, rel=1e-15)
    assert z2 == pytest.approx(1 / math.sqrt(math.pi), rel=0.05)  # the exact E[max of 2] = 1 / sqrt(pi) = 0.564
    assert variability_factor(0.02, 2) == pytest.approx(1 + 0.02 * z2, rel=1e-15)


def test_blom_is_close_to_the_exact_expected_maxima():
    # exact E[max of n standard normals] (Harter 1961's tables): n = 8: 1.4236, n = 100: 2.5076
    assert expected_max_normal(8) == pytest.approx(1.4236, rel=0.01)
    assert expected_max_normal(100) == pytest.approx(2.5076, rel=0.01)


def test_identical_gpus_change_nothing():
    for n in (1, 2, 8, 512, 16_384):
        for ref in (1, 8):
            assert variability_factor(0.0, n, ref) == 1.0
    assert gpu_variability(GPU_PRESETS["h100-sxm"], 0.0, 16_384) == 1.0


def test_the_a100_constants_hold_the_slowest_of_8():
    a100, h100 = GPU_PRESETS["a100-sxm-80gb"], GPU_PRESETS["h100-sxm"]
    assert reference_gpus(a100) == 8 and reference_gpus(h100) == 1
    cv = 0.03
    assert gpu_variability(a100, cv, 8) == 1.0  # the fit's own group: the constants as they are
    z = PHI_INV((512 - 0.375) / 512.25), PHI_INV((8 - 0.375) / 8.25)
    assert gpu_variability(a100, cv, 512) == pytest.approx((1 + cv * z[0]) / (1 + cv * z[1]), rel=1e-14)
    assert gpu_variability(h100, cv, 512) == pytest.approx(1 + cv * z[0], rel=1e-14)
    assert gpu_variability(a100, cv, 2) < 1.0  # fewer GPUs than the fit's: a faster slowest GPU


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 20_000), more=st.integers(0, 20_000), ref=st.sampled_from([1, 8]),
       cv=st.floats(0.0, 0.2), dcv=st.floats(0.0, 0.2))
@example(n=9, more=0, ref=8, cv=0.03125, dcv=4.335234022310063e-17)
def test_the_factor_grows_with_the_gpus_and_the_spread(n, more, ref, cv, dcv):
    # monotone to rounding: a spread larger by 4e-17 may round the ratio 1 ulp lower (a CI run found cv 0.03125 on 9
    # GPUs against 8), so each comparison allows 1e-12 relative
    tol = 1.0 - 1e-12
    assert variability_factor(cv, n + more, ref) >= variability_factor(cv, n, ref) * tol
    if n >= ref:  # at least the reference group: slower with a wider spread
        higher = min(0.2, cv + dcv)
        assert variability_factor(higher, n, ref) >= variability_factor(cv, n, ref) * tol
        assert variability_factor(cv, n, ref) >= tol


# ----------------------------------------------------------------------------- a pipeline of unequal stages
def test_equal_stages_or_identical_gpus_keep_the_job_factor():
    assert pace_ratio(0.02, (3.0, 3.0, 3.0), 8) == 1.0
    assert pace_ratio(0.0, (1.0, 2.0), 8) == 1.0


def test_a_stage_far_lighter_leaves_the_heavy_stage_s_gpus_to_pace():
    # loads (0.5, 1): the light stage never paces, so the pace is the heavy stage's 8 GPUs' slowest against the
    # slowest of both stages' 16: (1 + cv E[max of 8]) / (1 + cv E[max of 16]), exact expected maxima 1.4236 and
    # 1.7660 (Harter 1961's tables)
    cv = 0.05
    assert pace_ratio(cv, (0.5, 1.0), 8) == pytest.approx((1 + cv * 1.4236) / (1 + cv * 1.7660), rel=2e-5)


def test_a_stage_without_compute_never_paces_and_warns_nothing():
    # a stage whose load rounds to 0 of the heaviest (no layers of its own): the heavy stage alone paces, against
    # the slowest of both stages' GPUs, as for loads (0.5, 1) above; no division by its zero share
    import warnings

    cv = 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pace_ratio(cv, (0.0, 1.0), 8) == pytest.approx((1 + cv * 1.4236) / (1 + cv * 1.7660), rel=2e-5)
        assert pace_ratio(cv, (1e-6, 1.0), 8) == pace_ratio(cv, (0.0, 1.0), 8) == pace_ratio(cv, (0.5, 1.0), 8)


@pytest.mark.parametrize("cv, loads, n", [(0.02, (1.0,) * 7 + (1.03,), 8), (0.05, (1.0, 1.02, 0.9, 1.0), 16),
                                          (0.02, (1.0, 1.001), 4), (0.2, (0.7, 1.0, 0.95), 2)])
def test_the_pace_is_the_expected_slowest_stage_by_monte_carlo(cv, loads, n):
    # draw every GPU's time, take each stage's slowest, then the pipeline's slowest stage: the same expectation
    rng = np.random.default_rng(20261207)
    r = np.array(loads) / max(loads)
    slowest = rng.standard_normal((40_000, len(loads), n)).max(axis=2)
    ratio = (r * (1 + cv * slowest)).max(axis=1).mean() / (1 + cv * slowest).max(axis=1).mean()
    assert pace_ratio(cv, loads, n) == pytest.approx(ratio, abs=6e-4)


@settings(max_examples=100, deadline=None)
@given(loads=st.lists(st.floats(0.1, 1.0), min_size=2, max_size=6), extra=st.floats(0.0, 0.5),
       cv=st.floats(0.001, 0.2), n=st.integers(1, 64))
def test_a_heavier_light_stage_never_paces_faster(loads, extra, cv, n):
    # at most the equal stages' pace; a stage's load nearer the heaviest's makes the pipeline no faster
    base = pace_ratio(cv, tuple(loads), n)
    i = loads.index(min(loads))
    heavier = list(loads)
    heavier[i] = min(max(loads), heavier[i] + extra)
    assert 0.0 < base <= 1.0
    assert pace_ratio(cv, tuple(heavier), n) >= base * (1 - 1e-6)


_HEAVY_HEAD = """
cluster: {preset: dgx-h100, gpu_speed_cv: CV}
model: {preset: llama3-8b, num_layers: 4, vocab_size: 256000}
parallel: {tp: 2, pp: 4}
training: {global_batch_size: 32, micro_batch_size: 1}
"""


def test_a_heavy_last_stage_paces_the_pipeline(tmp_path: Path):
    # four stages of one decoder layer each, the last with a 256k-vocabulary output layer and its loss: the last
    # stage is the heavy one, a slow GPU elsewhere waits for it
    path = _scenario(tmp_path, _HEAVY_HEAD.replace("CV", "0.03"))
    spec = api.load_scenario(path)
    cfg = checked_step(spec.spec, spec.topology)[1]
    loads = stage_loads(cfg)
    assert loads[-1] > 1.5 * max(loads[:-1])
    job = 1 + 0.03 * expected_max_normal(8)
    assert cfg.gpu_variability == pytest.approx(job, rel=1e-14)  # the job's factor, before the pace
    pace = round(pace_ratio(0.03, loads, 2), PACE_DIGITS)  # to 0.1 %: StepConfig.paced_variability's
    assert cfg.paced_variability == pytest.approx(job * pace, rel=1e-14)
    assert cfg.paced_variability == pytest.approx(job * (1 + 0.03 * 0.5642) / (1 + 0.03 * 1.4236), abs=6e-4)
    run = api.run(path, fidelity="closed_form").result
    assert run["gpu_variability"]["stage_pace"] == pytest.approx(pace, rel=1e-12)
    assert run["gpu_variability_factor"] == pytest.approx(cfg.paced_variability, rel=1e-12)


def test_a_straggler_in_a_light_stage_waits_for_the_heavy_one(tmp_path: Path):
    # the mechanism on the engine's own schedule: a GPU 3 % slow in the first stage costs the step almost nothing,
    # the same GPU in the last (heavy) stage almost its 3 % of the compute
    path = _scenario(tmp_path, _HEAVY_HEAD.replace("CV", "0"))
    plain = api.run(path).result["step_time_s"]
    first = api.run(path, ["faults.stragglers=[{rank: 0, slower_by: 0.03}]"]).result["step_time_s"]
    last = api.run(path, ["faults.stragglers=[{rank: 6, slower_by: 0.03}]"]).result["step_time_s"]
    assert first - plain < 0.1 * (last - plain)
    assert last > plain * 1.015


# ----------------------------------------------------------------------------- a step
def _dp(tmp_path: Path, nodes: int, cv: float, preset: str = "dgx-h100") -> dict:
    """A data-parallel tiny decoder, one micro-batch per GPU (weak scaling: the same work per GPU at any size), its
    gradients reduced after the backward (nothing overlaps the compute)."""
    gpus = 8 * nodes
    path = _scenario(tmp_path, f"""
cluster: {{preset: {preset}, num_nodes: {nodes}, gpu_speed_cv: {cv}}}
model: {{preset: llama3-8b, num_layers: 2}}
parallel: {{dp: {gpus}}}
training: {{global_batch_size: {gpus}, micro_batch_size: 1}}
""", f"dp{gpus}-{cv}.yaml")
    return api.run(path, fidelity="closed_form").result


def test_weak_scaling_slows_the_compute_by_the_ratio_of_the_factors(tmp_path: Path):
    cv = 0.02
    small, large = _dp(tmp_path, 1, cv), _dp(tmp_path, 64, cv)
    small0, large0 = _dp(tmp_path, 1, 0.0), _dp(tmp_path, 64, 0.0)
    z8, z512 = PHI_INV((8 - 0.375) / 8.25), PHI_INV((512 - 0.375) / 512.25)
    # identical GPUs: weak scaling costs no compute
    assert large0["breakdown"]["compute_s"] == pytest.approx(small0["breakdown"]["compute_s"], rel=1e-12)
    for run, run0, z in ((small, small0, z8), (large, large0, z512)):
        assert run["gpu_variability_factor"] == pytest.approx(1 + cv * z, rel=1e-14)
        for part in ("compute_s", "optimizer_s"):
            assert run["breakdown"][part] == pytest.approx(run0["breakdown"][part] * (1 + cv * z), rel=1e-12)
        # the gradient reduction runs after the backward: the step grows by the compute's growth alone
        grown = (run0["breakdown"]["compute_s"] + run0["breakdown"]["optimizer_s"]) * cv * z
        assert run["step_time_s"] - run0["step_time_s"] == pytest.approx(grown, rel=1e-9)
    ratio = large["breakdown"]["compute_s"] / small["breakdown"]["compute_s"]
    assert ratio == pytest.approx((1 + cv * z512) / (1 + cv * z8), rel=1e-12)  # 1.0606 / 1.0287
    assert "gpu_variability_factor" not in small0 and "gpu_variability" not in small0  # cv 0: the JSON unchanged


def test_an_a100_node_is_the_constants_own_group(tmp_path: Path):
    same = _dp(tmp_path, 1, 0.05, "dgx-a100")
    plain = _dp(tmp_path, 1, 0.0, "dgx-a100")
    assert same["gpu_variability_factor"] == 1.0 and same["gpu_variability"]["reference_gpus"] == 8
    assert same["step_time_s"] == plain["step_time_s"]


_TP_PP = "parallel: {tp: 2, pp: 2, dp: DP, zero_stage: 1, sequence_parallel: true}\n" \
         "training: {global_batch_size: BATCH, micro_batch_size: 1, grad_reduce: overlapped}\n"
LAYOUTS = {
    "tp, pp, overlapped buckets": _TP_PP.replace("DP", "2").replace("BATCH", "16"),
    "fsdp": "parallel: {dp: 8, zero_stage: 3}\ntraining: {global_batch_size: 16, micro_batch_size: 1}\n",
    "zb_h1": "parallel: {pp: 4, dp: 2}\ntraining: {global_batch_size: 16, micro_batch_size: 1}\nschedule: zb_h1\n",
    "a straggler beside the spread": _TP_PP.replace("DP", "2").replace("BATCH", "16")
    + "faults: {stragglers: [{rank: 5, slower_by: 0.05}]}\n",
    # two nodes: buckets shorter than the backward they overlap, whose interference tax (simdist.plan.interference)
    # is then the buckets' share, not the slowed backward's (a straggler's closed form once slowed it too)
    "two nodes, a tax below its cap": "cluster: {num_nodes: 2}\n" + _TP_PP.replace("DP", "4").replace("BATCH", "32")
    + "faults: {stragglers: [{rank: 0, slower_by: 0.3}]}\n",
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_engine_and_the_closed_form_agree(tmp_path: Path, layout: str):
    path = _scenario(tmp_path, "model: {preset: llama3-8b, num_layers: 4}\n" + LAYOUTS[layout])
    cluster = ["cluster.preset=dgx-h100", "cluster.gpu_speed_cv=0.03"]
    engine = api.run(path, cluster).result
    closed = api.run(path, cluster, fidelity="closed_form").result
    # the engine's step with every collective alone is the closed form's (contention is the engine's own)
    assert engine["simulation"]["uncontended_step_time_s"] == pytest.approx(closed["step_time_s"], rel=1e-9)
    for part in ("compute_s", "recompute_s", "optimizer_s"):
        assert engine["breakdown"][part] == pytest.approx(closed["breakdown"][part], rel=1e-9)
    plain = api.run(path, [cluster[0], "cluster.gpu_speed_cv=0"], fidelity="closed_form").result
    assert closed["step_time_s"] > plain["step_time_s"]


def test_a_straggler_slower_than_the_spread_keeps_its_own_factor(tmp_path: Path):
    path = _scenario(tmp_path, "cluster: {preset: dgx-h100, gpu_speed_cv: 0.03}\n"
                     "model: {preset: llama3-8b, num_layers: 4}\n" + LAYOUTS["a straggler beside the spread"])
    spec = api.load_scenario(path)
    cfg = checked_step(spec.spec, spec.topology)[1]
    # 1.043 < 1.05, paced by the heavier of the two stages (the output layer's: simdist.plan.stage_pace)
    spread = (1 + 0.03 * PHI_INV((8 - 0.375) / 8.25)) * round(pace_ratio(0.03, stage_loads(cfg), 4), PACE_DIGITS)
    assert cfg.paced_variability == pytest.approx(spread, rel=1e-14) and spread < 1.05
    assert cfg.rank_factor(5) == 1.05 and cfg.rank_factor(0) == cfg.paced_variability
    where = cfg.mesh.coords(5)
    assert cfg.compute_factor(where["pp"], where["dp"]) == 1.05  # the straggler's stage and replica
    assert cfg.compute_factor(where["pp"], 1 - where["dp"]) == cfg.paced_variability  # the other replica's


def test_the_search_bounds_stay_below_a_faster_slowest_gpu(tmp_path: Path):
    # an A100 job of 2 GPUs at the widest spread: compute 0.83 x the constants', which hold the slowest of 8
    path = _scenario(tmp_path, """
cluster: {preset: dgx-a100, gpus_per_node: 2, host: {cpu_sockets: 1, pcie_switches_per_socket: 1},
          inter_node: {nics_per_node: 2}, gpu_speed_cv: 0.2}
model: {preset: llama3-8b, num_layers: 4}
parallel: {pp: 2}
training: {global_batch_size: 8, micro_batch_size: 1}
""")
    spec = api.load_scenario(path)
    cfg = checked_step(spec.spec, spec.topology)[1]
    assert cfg.paced_variability < 0.9
    pricer = CommPricer(spec.topology)
    exact = analytic_step(cfg, pricer).step_time_s
    assert 0 < compute_bound_s(cfg) <= lower_bound_s(cfg, pricer) * (1 + 1e-12)
    assert lower_bound_s(cfg, pricer) <= exact * (1 + 1e-12)


# ----------------------------------------------------------------------------- the report and bad input
def test_the_run_text_states_the_factor(tmp_path: Path):
    path = _scenario(tmp_path, "cluster: {preset: dgx-a100, num_nodes: 2, gpu_speed_cv: 0.02}\n"
                               "model: {preset: llama3-8b, num_layers: 2}\nparallel: {dp: 16}\n"
                               "training: {global_batch_size: 16, micro_batch_size: 1}\n")
    r = run_cli(["run", path, "--fidelity", "closed_form"])
    assert r.code == 0
    line = next(ln for ln in r.out.splitlines() if ln.startswith("GPU speed spread"))
    factor = (1 + 0.02 * PHI_INV((16 - 0.375) / 16.25)) / (1 + 0.02 * PHI_INV((8 - 0.375) / 8.25))
    assert "gpu_speed_cv 0.02" in line and "slowest of 16 GPUs" in line and f"x {factor:.4f}" in line
    assert "slowest of 8" in line
    plain = run_cli(["run", path, "--fidelity", "closed_form", "--set", "cluster.gpu_speed_cv=0"])
    assert plain.code == 0 and "GPU speed spread" not in plain.out


@pytest.mark.parametrize("value", ["-0.01", "0.25", "fast"])
def test_a_bad_spread_is_one_line_naming_the_field(tmp_path: Path, value: str):
    path = _scenario(tmp_path, f"cluster: {{preset: dgx-h100, gpu_speed_cv: {value}}}\nmodel: {{preset: llama3-8b}}\n"
                               "parallel: {dp: 8}\ntraining: {global_batch_size: 8}\n")
    r = run_cli(["run", path])
    assert r.one_line_error(), r.err
    assert "cluster.gpu_speed_cv" in r.err and "fix:" in r.err
