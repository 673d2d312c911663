"""Prediction bands under a calibration: each fitted constant sampled from its confidence interval
(simdist.predict.band_ranges), the rest from the stated ranges; hand-computed on steps where the band is a closed
function of one constant, and invariants."""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdist import api
from simdist.analytic.step import CommPricer, analytic_observables
from simdist.calibrate.calibration import Calibration, Correction
from simdist.errors import SimdistWarning
from simdist.hardware import load_topology
from simdist.hardware.compute import compute_efficiency
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.predict.band_ranges import CalibratedRanges, CollectiveRanges, Interval, calibrated_ranges
from simdist.predict.bands import _samples, band_of
from simdist.spec.calibration import CalibrationSpec

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile: a 95 % interval's ends

# One GPU (no collective), GEMMs compute-bound at any efficiency (HBM 1 PB/s), no launch overhead and no framework
# dispatch on the host (so the band's host factor has nothing to move): the step is G / gemm_peak_efficiency + C
# exactly (C: the element-wise kernels at the fp32 rate), a closed function of one constant.
ONE_GPU = """
cluster:
  preset: cpu-loopback
  gpus_per_node: 1
  gpu: {name: band-test-gpu, form_factor: pcie, hbm_capacity: 4 GiB, hbm_bandwidth: 1 PB/s,
        peak: {fp32: 100 GFLOP/s, tf32: 100 GFLOP/s, bf16: 100 GFLOP/s, fp16: 100 GFLOP/s}}
model: {preset: cs336-mlp, kind: mlp, num_layers: 2, hidden_size: 256}
parallel: {tp: 1, pp: 1, dp: 1}
training: {micro_batch_size: 64, global_batch_size: 64, precision: fp32, host_overhead: {dispatch: 0 us}}
"""

# Four gloo ranks of data parallelism: one all_reduce of the gradients (4 layers x 512 x 512 fp32: 4.2 MB, inside
# the 1 KiB - 16 MiB the reference sweep measured).
GLOO_DP = """
cluster: {preset: cpu-loopback}
model: {preset: cs336-mlp, kind: mlp, num_layers: 4, hidden_size: HIDDEN}
parallel: {tp: 1, pp: 1, dp: 4}
training: {micro_batch_size: 32, global_batch_size: 128, precision: fp32}
"""
REFERENCE = Path(__file__).parent.parent / "validation" / "reference"


def _compute_calibration(path: Path, ci: tuple[float, float]) -> Path:
    """A calibration of cpu-loopback fitting gemm_peak_efficiency 0.6 (interval ``ci``) and a launch overhead of 0
    (an interval of zero width: it keeps the stated range, which moves 0 nowhere)."""
    path.write_text(f"""topology: cpu-loopback
compute: {{gemm_peak_efficiency: 0.6, launch_overhead: 0 us}}
fit:
  compute: {{points: 6, cut: single, gemm_peak_efficiency_ci: [{ci[0]}, {ci[1]}], launch_overhead_ci: [0 us, 0 us],
            mape_pct: 1.0, mape_uncalibrated_pct: 5.0}}
""")
    return path


def _width(band: dict[str, float]) -> float:
    return (band["p90"] - band["p10"]) / band["p50"]


@pytest.fixture(scope="module")
def one_gpu_step(tmp_path_factory):
    """(scenario path, T(gemm_peak_efficiency): the closed-form step at launch overhead 0)."""
    path = tmp_path_factory.mktemp("band") / "one.yaml"
    path.write_text(ONE_GPU)
    sc = api.load_scenario(path)
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    eff = dataclasses.replace(compute_efficiency(cfg.gpu), launch_overhead_s=0.0)

    def step_s(pe: float) -> float:
        e = dataclasses.replace(eff, gemm_peak_efficiency=pe)
        return analytic_observables(dataclasses.replace(cfg, compute_efficiency=e), CommPricer(sc.topology))[0][
            "step_s"]

    return path, step_s


def test_a_gemm_efficiency_interval_gives_the_band_its_closed_form_gives(one_gpu_step, tmp_path):
    path, step_s = one_gpu_step
    # the step is G / pe + C: two evaluations give G and C, a third checks the form
    t3, t6, t9 = step_s(0.3), step_s(0.6), step_s(0.9)
    G = (t3 - t6) / (1 / 0.3 - 1 / 0.6)
    C = t6 - G / 0.6
    assert G > 0 and C > 0
    assert t9 == pytest.approx(G / 0.9 + C, rel=1e-12)
    lo, hi = 0.5, 0.66  # lopsided, as bootstrap intervals are: 0.1 below, 0.06 above
    run = api.run(path, calibration=_compute_calibration(tmp_path / "cal.yaml", (lo, hi)), fidelity="closed_form")
    r = run.result
    assert r["step_time_s"] == pytest.approx(t6, rel=1e-12)
    # gemm_peak_efficiency's column (the third: the first two are the stated factors): 0.6 at z = 0, the interval's
    # ends at z = -/+1.96 of a split normal on the log scale
    z = _samples(3)[2]
    pe = np.where(z >= 0, 0.6 * np.exp(z / Z95 * math.log(hi / 0.6)), 0.6 * np.exp(-z / Z95 * math.log(lo / 0.6)))
    ratios = (G / pe + C) / t6
    expected = dict(zip(("p10", "p50", "p90"), (t6 * np.quantile(ratios, [0.1, 0.5, 0.9])).tolist(), strict=True))
    assert r["step_time_band_s"] == pytest.approx(expected, rel=1e-9)
    fitted = [s for s in r["step_time_band_sources"] if s["method"] == "calibration_ci"]
    assert [(s["part"], s["constant"], s["interval"]["low"], s["interval"]["high"]) for s in fitted] == [
        ("compute", "gemm_peak_efficiency", lo, hi)]
    stated = {s["part"]: s for s in r["step_time_band_sources"] if s["method"] == "stated_range"}
    # the stated compute factor moves what the calibration left without an interval; memory_efficiency has its own
    assert stated["compute"]["applies_to"] == ["launch_overhead_s"]
    assert stated["memory"]["applies_to"] == ["memory_efficiency"]
    assert stated["compute"]["calibrated_without_interval"] == ["launch_overhead_s"]  # zero width: stated
    assert "95% confidence intervals of calibration" in r["step_time_band_how"] and "-/+1.96 sigma" in \
        r["step_time_band_how"]
    line = [ln for ln in run.text.splitlines() if ln.startswith("step time band from")]
    assert len(line) == 1 and "cal.yaml: gemm_peak_efficiency" in line[0] and "uncertainty.yaml" in line[0]


def test_a_narrow_interval_narrows_the_band_and_a_wide_one_widens_it(one_gpu_step, tmp_path):
    path, _ = one_gpu_step
    stated = api.run(path, fidelity="closed_form").result
    assert [s["method"] for s in stated["step_time_band_sources"]] == ["stated_range"] * 3
    widths = {}
    for name, ci in (("narrow", (0.595, 0.605)), ("wide", (0.4, 0.8))):
        cal = _compute_calibration(tmp_path / f"{name}.yaml", ci)
        widths[name] = _width(api.run(path, calibration=cal, fidelity="closed_form").result["step_time_band_s"])
    # stated: compute time x 0.96-1.20 (p10-p90, the default GPU row); narrow: +-0.8 % at 95 %; wide: x 0.75-1.5
    assert widths["narrow"] < 0.05 * _width(stated["step_time_band_s"])
    assert widths["wide"] > 2 * _width(stated["step_time_band_s"])


def test_a_calibrated_collective_moves_by_its_latency_and_bandwidth_intervals():
    # t = L_n + t_model / (f e(S)) (simdist.calibrate.calibration.Correction); sampled L' and f': the same correction
    # with L_n x L' / L and f', on the cached prices and on new ones alike.
    spec = CalibrationSpec.model_validate({
        "topology": "cpu-loopback",
        "collectives": {"all_reduce": {"latency": "100 us", "latency_by_ranks": {2: "50 us", 4: "400 us"},
                                       "bandwidth_factor": 1.2, "efficiency_sizes": ["4096 B", "1048576 B"],
                                       "efficiency": [0.5, 1.0], "size_range": ["1024 B", "16777216 B"]}},
        "fit": {"collectives": {"all_reduce": {"points": 8, "latency_ci": ["20 us", "300 us"],
                                               "bandwidth_factor_ci": [0.9, 1.5], "mape_pct": 3.0,
                                               "mape_uncalibrated_pct": 40.0}}}})
    ranges = calibrated_ranges(spec, "cal.yaml")
    c = ranges.collectives["all_reduce"]
    assert c.latency is not None and not c.latency.log
    assert (c.latency.value, c.latency.low, c.latency.high) == pytest.approx((100e-6, 20e-6, 300e-6), rel=1e-12)
    assert c.bandwidth_factor == Interval(1.2, 0.9, 1.5, 0.95, True)
    topology = load_topology("cpu-loopback")
    zl, zb, stated = 0.7, -1.3, 1.7
    latency = 100e-6 + zl / Z95 * 200e-6  # the high half: (300 - 100) us at +1.96
    factor = 1.2 * math.exp(-zb / Z95 * math.log(0.9 / 1.2))  # the low half, on the log scale
    expected = Correction(latency, factor, tuple(math.log2(s) for s in (4096, 1048576)), (0.5, 1.0),
                          (1024.0, 16777216.0), 1.0, "all_reduce",
                          ((2, 50e-6 * latency / 100e-6), (4, 400e-6 * latency / 100e-6)))
    raw = CommPricer(topology)
    pricer = CommPricer(topology, Calibration.of(spec).adjust())
    groups = [(0, 1), (0, 1, 2, 3), (0, 2)]
    sizes = [2048.0, 65536.0, 4e6]
    for g in groups:
        pricer.time_s("all_reduce", g, sizes[0])  # cached before perturbing; the other sizes are priced after

    def time_of(op, n, nbytes, t):
        return ranges.collectives[op].time_s(t, n, nbytes, zl, zb, stated) if op in ranges.collectives else t * stated

    moved = pricer.perturbed(time_of)
    for g in groups:
        for nbytes in sizes:
            assert moved.time_s("all_reduce", g, nbytes) == pytest.approx(
                expected.time_s(raw.time_s("all_reduce", g, nbytes), nbytes, len(g)), rel=1e-12)
        # above the calibrated sizes the calibration did not fit: the stated factor on the whole time
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SimdistWarning)
            assert moved.time_s("all_reduce", g, 64e6) == pytest.approx(
                stated * pricer.time_s("all_reduce", g, 64e6), rel=1e-12)
        # an op the calibration did not correct: the stated factor
        assert moved.time_s("all_gather", g, 65536.0) == pytest.approx(
            stated * raw.time_s("all_gather", g, 65536.0), rel=1e-12)


def test_a_latency_fitted_at_zero_moves_by_its_interval_added():
    c = CollectiveRanges("all_reduce", 0.0, (), math.inf, Interval(0.0, 0.0, 2e-3), None)
    # no bandwidth interval: the bandwidth part takes the stated factor
    assert c.time_s(1e-3, 4, 1e5, 1.0, 0.0, 1.5) == pytest.approx(1e-3 / Z95 * 2 + 1.5e-3, rel=1e-12)
    assert c.time_s(1e-3, 4, 1e5, -1.0, 0.0, 1.5) == pytest.approx(1.5e-3, rel=1e-12)  # clamped at 0


def test_intervals_map_to_their_ends_and_zero_width_keeps_the_stated_range():
    rate = Interval.of("bandwidth_factor", 1.2, [0.9, 1.5], 0.95)
    assert rate is not None and rate.log
    assert rate.at(0.0) == 1.2 and rate.at(Z95) == pytest.approx(1.5) and rate.at(-Z95) == pytest.approx(0.9)
    time = Interval.of("latency_s", 1e-4, [2e-5, 3e-4], 0.95)
    assert time is not None and not time.log
    assert time.at(Z95) == pytest.approx(3e-4) and time.at(-Z95) == pytest.approx(2e-5)
    assert time.at(-10) == 0.0  # a time never goes negative
    ninety = Interval.of("latency_s", 1e-4, [0.0, 2e-4], 0.9)
    assert ninety is not None and ninety.at(1.6448536269514722) == pytest.approx(2e-4)  # a 90 % interval: +-1.645
    assert Interval.of("gemm_peak_efficiency", 0.38, [0.38, 0.38], 0.95) is None  # not bootstrapped: no spread known
    assert Interval.of("bandwidth_factor", 1.0, [0.0, 2.0], 0.95) is None  # a rate's interval must stay positive
    assert Interval.of("latency_s", 1e-4, None, 0.95) is None
    widened = Interval.of("gemm_peak_efficiency", 0.7, [0.5, 0.6], 0.95)  # leaves out its value: widened to hold it
    assert widened is not None and (widened.low, widened.high) == (0.5, 0.7)


def test_a_confidence_level_outside_0_1_is_one_clear_error(tmp_path, cli):
    cal = _compute_calibration(tmp_path / "cal.yaml", (0.5, 0.7))
    cal.write_text(cal.read_text() + "  confidence: 1.5\n")
    path = tmp_path / "one.yaml"
    path.write_text(ONE_GPU)
    code, _, err = cli("run", str(path), "--calibration", str(cal))
    assert code == 2 and "fit.confidence" in err and len(err.strip().splitlines()) == 1, err


def test_the_reference_gloo_calibration_samples_its_collective_intervals(tmp_path):
    # The CPU gloo sweep and MLP steps of validation/reference: all_reduce fitted on 8 sizes (intervals of the
    # latency and bandwidth factor); the compute from 1 MLP shape (not bootstrapped: zero-width intervals).
    cal = tmp_path / "gloo.yaml"
    api.calibrate([REFERENCE / "gloo_cpu_collectives.csv", REFERENCE / "gloo_cpu_mlp_steps.csv"], "cpu-loopback",
                  out=cal)
    path = tmp_path / "dp.yaml"
    path.write_text(GLOO_DP.replace("HIDDEN", "512"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimdistWarning)
        r = api.run(path, calibration=cal, fidelity="closed_form").result
        b = r["step_time_band_s"]
        assert 0 < b["p10"] <= b["p50"] <= b["p90"]
        fitted = [(s["op"], s["constant"]) for s in r["step_time_band_sources"] if s["method"] == "calibration_ci"]
        assert fitted == [("all_reduce", "latency_s"), ("all_reduce", "bandwidth_factor")]
        compute = next(s for s in r["step_time_band_sources"] if s["part"] == "compute")
        assert compute["method"] == "stated_range"
        assert compute["calibrated_without_interval"][:2] == ["gemm_peak_efficiency", "launch_overhead_s"]
        # 1024 wide: the all_reduce (16.8 MB) is above the 16 MiB the sweep measured: nothing sampled from the
        # calibration there; the stated ranges around its constants
        path.write_text(GLOO_DP.replace("HIDDEN", "1024"))
        big = api.run(path, calibration=cal, fidelity="closed_form").result
    assert all(s["method"] == "stated_range" for s in big["step_time_band_sources"])
    assert "around the calibrated constants" in big["step_time_band_how"]


@pytest.fixture(scope="module")
def dp_step(tmp_path_factory):
    path = tmp_path_factory.mktemp("band") / "dp.yaml"
    path.write_text(GLOO_DP.replace("HIDDEN", "256").replace("dp: 4", "dp: 2").replace(
        "{preset: cpu-loopback}", "{preset: cpu-loopback, gpus_per_node: 2}"))
    sc = api.load_scenario(path)
    return step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model)), sc.topology


def _ci(value: float):
    return st.tuples(st.floats(0.2, 1.0), st.floats(1.0, 3.0)).map(lambda f: (value * f[0], value * f[1]))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pe=_ci(0.6), launch=_ci(5e-6), latency=_ci(1e-4), factor=_ci(1.0), z_width=st.floats(0.5, 0.99))
def test_band_percentiles_are_ordered_under_any_intervals(dp_step, pe, launch, latency, factor, z_width):
    cfg, topology = dp_step
    eff = dataclasses.replace(compute_efficiency(cfg.gpu), gemm_peak_efficiency=0.6, launch_overhead_s=5e-6)
    cfg = dataclasses.replace(cfg, compute_efficiency=eff)
    ranges = CalibratedRanges(
        "cal.yaml", z_width,
        {"gemm_peak_efficiency": Interval(0.6, *pe, z_width, True), "launch_overhead_s": Interval(5e-6, *launch,
                                                                                                  z_width)},
        {"all_reduce": CollectiveRanges("all_reduce", 1e-4, (), math.inf, Interval(1e-4, *latency, z_width),
                                        Interval(1.0, *factor, z_width, True))})
    calibration = Calibration.of(CalibrationSpec.model_validate(
        {"topology": "cpu-loopback", "collectives": {"all_reduce": {"latency": "100 us", "bandwidth_factor": 1.0}}}))
    band = band_of(cfg, CommPricer(topology, calibration.adjust()), 1.0, None, ranges)
    b = band.band
    assert 0 < b["p10"] <= b["p50"] <= b["p90"]
    assert [s["method"] for s in band.sources].count("calibration_ci") == 4
