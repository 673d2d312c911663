"""Calibration that cannot make predictions worse unnoticed (issue 17 item 7): regularised fits, the physical
model outside the measured sizes, finite intervals, and warnings where a calibration cannot vouch for itself.

Samples (tests/data, provenance in make_nccltests_samples.py): the A100 all_reduce sweep (out-of-place columns
published by ml-engineering, 8 x A100 NVSwitch, 32 KiB .. 16 GiB) and the synthetic H200 all_gather sweep.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from simdist import api
from simdist.api.calibration import _chart_series
from simdist.calibrate import calibration as cb
from simdist.calibrate.correction_fit import MAX_KNOTS, POINTS_PER_KNOT, isotonic
from simdist.calibrate.measurements import read_measurements
from simdist.calibrate.points import PLATEAU_SHARE, predict_details
from simdist.collectives.ops import op_info
from simdist.errors import SimdistWarning, SpecError
from simdist.report.validate_html import BAND_SPAN, ValidateSeries, validate_figure

DATA = Path(__file__).parent / "data"
A100 = DATA / "all_reduce_perf_a100x8.txt"
H200 = DATA / "all_gather_perf_h200x8.txt"
GLOO = Path(__file__).parents[1] / "validation" / "reference" / "gloo_cpu_loop_collectives.csv"


def _quiet_fit(path: Path, topology: str, holdout: str = "none"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimdistWarning)
        return cb.fit_calibration(read_measurements(path), topology, holdout=holdout)


# --------------------------------------------------------------------------- the done-when figures
def test_a100_large_holdout_is_no_worse_than_uncalibrated_and_every_bound_is_finite(tmp_path, cli):
    cal = tmp_path / "a.yaml"
    code, _, err = cli("calibrate", str(A100), "--topology", "dgx-a100", "--out", str(cal))
    assert code == 0 and err == ""
    code, out, err = cli("validate", str(A100), "--calibration", str(cal), "--holdout", "large", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["predicted_points"] == 7
    # Measured: calibrated 2.7 %, uncalibrated 3.0 % (before this issue: 20.6 % against 3.0 %).
    assert doc["mape_pct"]["all"] <= doc["uncalibrated_mape_pct"]["all"]
    assert doc["mape_pct"]["all"] == pytest.approx(2.68, abs=0.05)
    # the 7 held-out sizes lie above the 128 MiB fitted on: predicted by the physical model, and said so, once
    assert err.count("warning: ") == 1 and "above the largest calibrated one (128 MiB" in err
    measured = read_measurements(A100)
    top = max(m.busbw_Bps for m in measured)
    spec = cb.load_calibration(cal).spec
    bounds = [float(v) for t in spec.fit.tiers for v in t.busbw_ci]
    # The correction's bandwidth bound at the plateau: the uncalibrated model's busbw x the CI's fast end.
    factor = op_info("all_reduce").busbw_factor(8)
    model_plateau = factor * 2.0**34 / cb.predict_points(cb.build_cluster("dgx-a100", []), [
        cb.Point("all_reduce", 8, None, 2.0**34, 1.0, None, "probe")])[0]
    bounds += [model_plateau * v for v in spec.fit.collectives["all_reduce"].bandwidth_factor_ci]
    assert all(math.isfinite(b) and 0 < b <= 10 * top for b in bounds), (bounds, top)
    # and the chart's band: no time in it implies a busbw above 10x the largest measured
    points = cb.aggregate(measured)
    fitted = cb.Calibration.of(_quiet_fit(A100, "dgx-a100", "large"))
    tuned = cb.build_cluster("dgx-a100", points, overrides=fitted.spec.overrides)
    (series,) = _chart_series(cb, points, cb.split_holdout(points, "large")[1], fitted, tuned,
                              cb.build_cluster("dgx-a100", points))
    for size, t in series.band_low + series.band_high:
        assert math.isfinite(t) and factor * size / t <= 10 * top


def test_every_other_size_held_out(tmp_path, cli):
    cal = tmp_path / "a.yaml"
    cli("calibrate", str(A100), "--topology", "dgx-a100", "--out", str(cal))
    code, out, err = cli("validate", str(A100), "--calibration", str(cal), "--holdout", "sizes", "--json")
    doc = json.loads(out)
    assert code == 0
    # Measured: 29.3 % uncalibrated, 8.6 % calibrated (16 GiB, held out above the 8 GiB fitted, by the physics)
    assert doc["uncalibrated_mape_pct"]["all"] == pytest.approx(29.3, abs=0.05)
    assert doc["mape_pct"]["all"] == pytest.approx(8.6, abs=0.05)
    assert "above the largest calibrated one (8 GiB" in err


# --------------------------------------------------------------------------- regularised fits
@pytest.mark.parametrize(("path", "topology"), [(A100, "dgx-a100"), (H200, "hgx-h200"), (GLOO, "cpu-loopback")])
def test_knots_are_bounded_by_the_points_and_efficiency_by_one(path, topology):
    spec = _quiet_fit(path, topology)
    points = cb.aggregate(read_measurements(path))
    for op, c in spec.collectives.items():
        sizes = {p.nbytes for p in points if p.op == op}
        knots = c.efficiency or []
        # one knot for the latency-bound sizes, then one per POINTS_PER_KNOT of the others, at most MAX_KNOTS
        assert len(knots) <= min(1 + MAX_KNOTS, 1 + len(sizes) // POINTS_PER_KNOT) < len(sizes)
        assert all(0.0 < v <= 1.0 for v in knots) and (not knots or max(knots) == 1.0)
        assert c.size_range == [min(sizes), max(sizes)]


def test_an_old_file_with_efficiencies_above_one_is_refused(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("topology: dgx-a100\ncollectives:\n  all_reduce:\n    latency: 35 us\n    bandwidth_factor: 1.05\n"
                   "    efficiency_sizes: [32768 B, 65536 B]\n    efficiency: [1.478, 1.0]\n")
    with pytest.raises(SpecError, match=r"\[0.001, 1\].*fit it again"):
        cb.load_calibration(old)


def _achieved_share_of_plateau(spec, path: Path, topology: str) -> tuple[np.ndarray, float]:
    """(g at each knot = beta S x rate(S) / t_model, the op's plateau factor F) of the one op of a sample."""
    (op, c), = spec.collectives.items()
    corr = cb.Correction.of(c, op)
    tuned = cb.build_cluster(topology, [], overrides=spec.overrides)
    n = cb.aggregate(read_measurements(path))[0].num_ranks
    knots = [cb.Point(op, n, None, float(s), 1.0, None, "knot") for s in c.efficiency_sizes]
    _, share = predict_details(tuned, knots)
    return share * np.array([corr.rate(p.nbytes) for p in knots]), c.above_range_factor


@pytest.mark.parametrize(("path", "topology"), [(A100, "dgx-a100"), (H200, "hgx-h200")])
def test_on_gpu_links_the_achieved_rate_never_falls_with_size_nor_beats_the_plateau(path, topology):
    g, plateau = _achieved_share_of_plateau(_quiet_fit(path, topology), path, topology)
    assert np.all(np.diff(g) >= -1e-3 * plateau) and np.all(g <= plateau * (1 + 1e-3))


def test_on_a_cpu_host_the_rate_may_fall_when_buffers_leave_the_caches(tmp_path):
    # gloo on 2 ranks with the shape measured here: 0.2 ms per call, 1 GB/s while the buffers fit the caches
    # (up to 1 MiB), 0.8 GB/s beyond (gloo's all_gather: 0.99 GB/s at 1 MiB, 0.81 at 4 MiB on this machine)
    sizes = [2**k for k in range(10, 23)]
    path = tmp_path / "cpu.csv"
    path.write_text("op,nbytes,num_ranks,time_s\n" + "".join(
        f"all_gather,{s},2,{2e-4 + 0.5 * s / (1e9 if s <= 2**20 else 0.8e9)}\n" for s in sizes))
    spec = _quiet_fit(path, "cpu-loopback")
    c = spec.collectives["all_gather"]
    corr = cb.Correction.of(c, "all_gather")
    tuned = cb.build_cluster("cpu-loopback", [], overrides=spec.overrides)
    knots = [cb.Point("all_gather", 2, None, float(s), 1.0, None, "knot") for s in c.efficiency_sizes]
    _, share = predict_details(tuned, knots)
    g = share * np.array([corr.rate(p.nbytes) for p in knots])
    assert np.diff(g)[-1] < 0  # not forced monotone on a CPU host: the fall past the caches is kept
    calibrated = cb.calibrated_times(cb.Calibration.of(spec), tuned, cb.aggregate(read_measurements(path)))
    measured = [2e-4 + 0.5 * s / (1e9 if s <= 2**20 else 0.8e9) for s in sizes]
    assert np.max(np.abs(calibrated / measured - 1)) < 0.1


def test_isotonic_is_the_pool_adjacent_violators_fit():
    assert list(isotonic(np.array([1.0, 3.0, 2.0, 4.0]), np.ones(4))) == [1.0, 2.5, 2.5, 4.0]
    assert list(isotonic(np.array([3.0, 1.0]), np.array([3.0, 1.0]))) == [2.5, 2.5]  # weighted mean


def test_sizes_above_the_measured_range_fall_back_to_the_physical_model():
    spec = _quiet_fit(A100, "dgx-a100", holdout="large")  # fitted on 32 KiB .. 128 MiB
    assert spec.overrides == {}  # no point there is bandwidth-bound: the links keep the preset's efficiency
    c = spec.collectives["all_reduce"]
    assert c.size_range[1] == 2**27 and c.above_range_factor == 1.0
    corr = cb.Correction.of(c, "all_reduce")
    cluster = cb.build_cluster("dgx-a100", [])
    model = cb.predict_points(cluster, [cb.Point("all_reduce", 8, None, 2.0**30, 1.0, None, "x")])[0]
    with pytest.warns(SimdistWarning, match="physical model"):
        assert corr.time_s(model, 2.0**30) == pytest.approx(c.latency + model, rel=1e-12)


# --------------------------------------------------------------------------- the NVLink tier and TP all-gathers
def test_the_link_tier_moves_only_with_bandwidth_bound_points_and_all_gathers_follow_it():
    spec = _quiet_fit(A100, "dgx-a100")
    points = cb.aggregate(read_measurements(A100))
    base = cb.build_cluster("dgx-a100", points)
    model, share = predict_details(base, points)
    plateau = share >= PLATEAU_SHARE
    assert plateau.sum() == 6  # 512 MiB .. 16 GiB
    measured = np.array([p.time_s for p in points])
    # closed form: efficiency 0.77 x the median of t_model / t_measured where the model is bandwidth-bound
    expected = round(0.77 * float(np.median(model[plateau] / measured[plateau])), 4)
    assert spec.overrides == {"scale_up": {"efficiency": expected}} and expected == pytest.approx(0.7742)
    # A ring all-gather of a TP group is bandwidth-bound at 4 GiB: it speeds up by exactly 0.7742 / 0.77, as the
    # measured all_reduce plateau (234.9 GB/s busbw against the preset's 230.6) says the links do. (The old
    # whole-sweep line fit set 0.742 and slowed it by 3.8 %.)
    out = Path(__import__("tempfile").mkdtemp()) / "a.yaml"
    out.write_text(cb.to_yaml(spec))
    before = api.collective("dgx-a100", "all_gather", 8, [2.0**32])[0].time_s
    after = api.collective("dgx-a100", "all_gather", 8, [2.0**32], calibration=out)[0].time_s
    assert before / after == pytest.approx(expected / 0.77, rel=2e-3)


def test_a_sweep_that_never_reaches_its_plateau_leaves_the_links_alone():
    spec = _quiet_fit(A100, "dgx-a100", holdout="large")
    assert spec.overrides == {} and all(t.plateau_points == 0 for t in spec.fit.tiers)
    assert all(t.efficiency_after == t.efficiency_before == 0.77 for t in spec.fit.tiers)


# --------------------------------------------------------------------------- warnings
def test_one_point_calibration_warns(tmp_path, cli):
    one = tmp_path / "one.csv"
    one.write_text("op,nbytes,num_ranks,time_s\nall_reduce,1073741824,8,8.25e-3\n")
    with pytest.warns(SimdistWarning, match=r"all_reduce: calibrated from 1 size\(s\) \(1 point\(s\)\)"):
        spec = cb.fit_calibration(read_measurements(one), "dgx-a100")
    assert spec.fit.warnings and math.isfinite(spec.collectives["all_reduce"].bandwidth_factor)
    code, out, err = cli("calibrate", str(one), "--topology", "dgx-a100", "--out", str(tmp_path / "c.yaml"))
    assert out.startswith("# calibration of dgx-a100 from 1 points")
    assert code == 0 and err.count("\n") == 1 and err.startswith("warning: all_reduce: calibrated from 1 size")
    three = tmp_path / "three.csv"
    three.write_text("op,nbytes,num_ranks,time_s\n" + "".join(f"all_reduce,{2**k},8,{1e-5 * k}\n"
                                                              for k in (20, 24, 28)))
    with pytest.warns(SimdistWarning, match="from 3 size"):
        cb.fit_calibration(read_measurements(three), "dgx-a100")


def test_measurements_of_another_gpu_warn_naming_both(tmp_path, cli):
    cal = tmp_path / "on_h100.yaml"
    code, _, err = cli("calibrate", str(A100), "--topology", "dgx-h100", "--out", str(cal))
    assert code == 0 and err.count("\n") == 2  # the GPUs, and the NVLS note (the next test)
    assert "warning: the measurements ran on NVIDIA A100-SXM4-80GB, but topology 'dgx-h100' has H100-SXM5-80GB" in err
    assert cb.load_calibration(cal).spec.gpu == "NVIDIA A100-SXM4-80GB"  # the file records what it was fitted on
    # validating H200 measurements against it: both GPUs named
    code, out, err = cli("validate", str(H200), "--calibration", str(cal), "--holdout", "none", "--json")
    assert code == 0 and "ran on NVIDIA H200" in err and "fitted on NVIDIA A100-SXM4-80GB" in err
    assert any("NVIDIA H200" in w for w in json.loads(out)["warnings"])
    # applying it to the topology's own GPU (an H100 cluster): a warning, and the prediction still comes
    code, out, err = cli("collective", "--cluster", "dgx-h100", "--op", "all_reduce", "--ranks", "8", "--bytes", "1G",
                         "--calibration", str(cal), "--json")
    assert code == 0 and json.loads(out)["rows"]
    assert err.startswith("warning: ") and "A100-SXM4-80GB" in err and "H100-SXM5-80GB" in err


def test_same_gpu_no_warning(tmp_path, cli):
    cal = tmp_path / "a.yaml"
    code, _, err = cli("calibrate", str(A100), "--topology", "dgx-a100", "--out", str(cal))
    assert code == 0 and err == ""
    code, _, err = cli("collective", "--cluster", "dgx-a100", "--op", "all_reduce", "--ranks", "8", "--bytes", "1G",
                       "--calibration", str(cal), "--json")
    assert code == 0 and err == ""


def test_validate_warns_when_the_calibration_is_worse_on_held_out_points(tmp_path, cli):
    cal = tmp_path / "h.yaml"
    cli("calibrate", str(H200), "--topology", "hgx-h200", "--out", str(cal))
    code, out, err = cli("validate", str(H200), "--calibration", str(cal), "--holdout", "large", "--json")
    doc = json.loads(out)
    # the synthetic H200 sweep's largest third: the fitted latency (3 us) on top of a model already 9 % slow at
    # 64 MiB: calibrated 2.55 %, uncalibrated 2.24 %
    assert code == 0 and doc["mape_pct"]["all"] > doc["uncalibrated_mape_pct"]["all"]
    assert "calibrated prediction is worse than the uncalibrated preset" in err
    assert "2.5 % vs 2.2 %" in err


def test_barrier_rows_are_skipped_with_a_warning(tmp_path):
    mixed = tmp_path / "m.csv"
    mixed.write_text("op,nbytes,num_ranks,time_s\nbarrier,0,2,1e-4\n"
                     + "".join(f"all_reduce,{2**k},2,{2e-4 + 2**k / 1e9}\n" for k in range(10, 22, 2)))
    with pytest.warns(SimdistWarning, match=r"skipped 1 barrier or 0-byte row\(s\)"):
        spec = cb.fit_calibration(read_measurements(mixed), "cpu-loopback")
    assert set(spec.collectives) == {"all_reduce"}


# --------------------------------------------------------------------------- finite intervals
@pytest.mark.parametrize("times", [
    [1e-4, 1e-4, 1e-4, 1e-4],  # no size trend at all
    [1e-4, 5e-5, 2e-4, 1e-4],  # noise only
    [1e-4, 2e-4, 4e-4],  # three points
])
def test_confidence_intervals_stay_finite_on_degenerate_sweeps(tmp_path, times):
    path = tmp_path / "d.csv"
    path.write_text("op,nbytes,num_ranks,time_s\n" + "".join(f"all_gather,{2**(16 + 2 * i)},8,{t}\n"
                                                               for i, t in enumerate(times)))
    spec = _quiet_fit(path, "dgx-a100")
    info = spec.fit.collectives["all_gather"]
    values = [*info.bandwidth_factor_ci, *info.latency_ci] + [float(v) for t in spec.fit.tiers
                                                               for v in t.busbw_ci]
    assert all(math.isfinite(v) and v >= 0 for v in values)
    assert 0 < info.bandwidth_factor_ci[0] <= info.bandwidth_factor_ci[1] < 1e3


def test_the_chart_band_never_stretches_the_axis():
    sizes = [2.0**k for k in range(10, 20)]
    curve = tuple((s, 1e-5 + s / 1e10) for s in sizes)
    wild = ValidateSeries("x", curve[:3], curve[3:5], curve, tuple((s, 1e-300) for s in sizes),
                          tuple((s, 1e300) for s in sizes), curve)
    band = validate_figure([wild]).data[0]
    ys = np.array(band.y, dtype=float)
    top, low = max(t for _, t in curve), min(t for _, t in curve)
    assert np.all(np.isfinite(ys)) and ys.max() <= BAND_SPAN * top and ys.min() >= low / BAND_SPAN


def _all_gather_busbw(topology: str, calibration: Path | None) -> float:
    return api.collective(topology, "all_gather", 8, [2.0**32], calibration=calibration)[0].busbw_GBps * 1e9


def test_an_all_reduce_without_nvls_does_not_slow_the_ring_all_gathers(tmp_path):
    # The A100 sweep (no NVLink SHARP on A100's NVSwitch) fitted to dgx-h100, whose tuner picks NVLS for large
    # all-reduces (472 GB/s busbw). Blaming the links for the missing in-switch reduction set NVLink to
    # 0.82 x 235 / 472 = 0.41 and priced the TP all-gathers (rings) at 189 GB/s, 19 % below the 235 GB/s these
    # very links moved; priced without NVLS, the links get 0.82 x 235 / 368 = 0.52 and the rings 235 GB/s.
    with pytest.warns(SimdistWarning) as caught:
        spec = cb.fit_calibration(read_measurements(A100), "dgx-h100")
    notes = [str(w.message) for w in caught]
    assert any("no faster than the links allow without NVLS" in n for n in notes)
    assert any("A100-SXM4-80GB" in n and "H100-SXM5-80GB" in n for n in notes)
    cal = tmp_path / "a100_on_h100.yaml"
    cal.write_text(cb.to_yaml(spec))
    plateau = np.median([m.busbw_Bps for m in read_measurements(A100) if m.nbytes >= 2**30])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimdistWarning)
        assert _all_gather_busbw("dgx-h100", cal) == pytest.approx(plateau, rel=0.02)
        big = api.collective("dgx-h100", "all_reduce", 8, [2.0**32], calibration=cal)[0].busbw_GBps * 1e9
    assert big == pytest.approx(plateau, rel=0.02)  # and the all-reduce itself still matches its measurement


def test_an_all_reduce_faster_than_the_links_alone_is_credited_to_nvls(tmp_path):
    # A (synthetic) H200 all_reduce plateau at 480 GB/s busbw, the NVLS figure NVIDIA quotes (nccl-tests #212):
    # faster than any ring on 450 GB/s links, so only NVLS explains it and the links stay near 0.82.
    path = tmp_path / "nvls.csv"
    path.write_text("op,nbytes,num_ranks,time_s\n" + "".join(
        f"all_reduce,{2**k},8,{1.75 * 2**k / 480e9}\n" for k in range(30, 34)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SimdistWarning)
        spec = cb.fit_calibration(read_measurements(path), "hgx-h200")
    assert not any("NVLS" in str(w.message) for w in caught)
    efficiency = spec.overrides["scale_up"]["efficiency"]
    assert efficiency == pytest.approx(0.82 * 480 / 472.5, rel=0.01)  # the model's NVLS plateau: 472.5 GB/s
