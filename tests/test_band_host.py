"""The prediction band's host factor (simdist.predict.bands, uncertainty.yaml's ``host``): the host's framework time
per op is drawn from its stated range, and it moves a step exactly as far as the host sets the step's pace."""

from __future__ import annotations

import numpy as np
import pytest

from simdist import api
from simdist.hardware.host import host_overhead
from simdist.predict.bands import _samples
from simdist.predict.stated_ranges import host_range, time_factor
from simdist.report.band_line import band_line
from tests.test_band_calibration import ONE_GPU

# test_band_calibration's one GPU, made too fast to matter (1000 PFLOP/s, 1 PB/s) and given its host's default
# dispatch back: every kernel is done long before the host issues the next (2 us of GPU launch gap at most 1.2 x
# against 8.3 us of host time per op at the range's low end), so the step is the host's: A + B x dispatch_s, A the
# launches, B the ops issued.
HOST_BOUND = ONE_GPU.replace("100 GFLOP/s", "1000 PFLOP/s").replace(", host_overhead: {dispatch: 0 us}", "")
assert "1000 PFLOP/s" in HOST_BOUND and "host_overhead" not in HOST_BOUND


def test_the_stated_range_is_its_sources_arithmetic():
    # host_overhead.csv's op (dispatch 8.48 + launch 5 = 13.48 us, a torch Linear forward on a DGX H100's Xeon) against
    # the range's two measured ends: a torch.split's 3.3 us of dispatch (p10), and a Transformer Engine FP8 Linear at
    # 2 x a torch Linear's op time, the launch held (p90)
    host, hr = host_overhead(), host_range()
    assert host.dispatch_s * hr["p10"] == pytest.approx(3.3e-6, rel=0.01)
    assert host.dispatch_s * hr["p90"] + host.launch_s == pytest.approx(2 * host.op_s, rel=0.01)
    assert all(word in hr["reason"] for word in ("#32194", "#761", "#2126", "Assumption"))


def _step(path, dispatch_us: float | None = None) -> dict:
    sets = None if dispatch_us is None else [f"training.host_overhead.dispatch={dispatch_us} us"]
    return api.run(path, sets, fidelity="closed_form").result


def test_a_host_bound_step_gets_the_band_of_its_host_range(tmp_path):
    path = tmp_path / "host.yaml"
    path.write_text(HOST_BOUND)
    t4, t8, t12 = (_step(path, d)["step_time_s"] for d in (4, 8, 12))
    B = (t8 - t4) / 4e-6
    A = t4 - B * 4e-6
    assert B > 0 and A > 0 and t12 == pytest.approx(A + B * 12e-6, rel=1e-12)  # linear in the dispatch
    r = _step(path)
    dispatch = 8.48e-6  # host_overhead.csv's x86 host
    assert r["step_time_s"] == pytest.approx(A + B * dispatch, rel=1e-12)
    # the host's column is the fifth (compute, collectives, memory-bound, spread, host: no calibration here)
    hr = host_range()
    f = np.array([time_factor(z, hr["p10"], hr["p90"]) for z in _samples(5)[4].tolist()])
    ratios = (A + B * dispatch * f) / (A + B * dispatch)
    expected = dict(zip(("p10", "p50", "p90"), (r["step_time_s"] * np.quantile(ratios, [0.1, 0.5, 0.9])).tolist(),
                        strict=True))
    assert r["step_time_band_s"] == pytest.approx(expected, rel=1e-9)
    host = [s for s in r["step_time_band_sources"] if s["part"] == "host"]
    assert len(host) == 1 and host[0]["applies_to"] == ["dispatch_s"]
    assert host[0]["dispatch_s"]["p10"] == pytest.approx(dispatch * hr["p10"])
    assert host[0]["dispatch_s"]["p90"] == pytest.approx(dispatch * hr["p90"])
    assert f"host time per framework op x {hr['p10']:g}-{hr['p90']:g}" in band_line(r["step_time_band_sources"])


def test_a_step_without_framework_dispatch_has_no_host_factor(tmp_path):
    # a CPU core standing in for the device runs its ops on the host (their time in its compute constants), and a
    # scenario may state a dispatch of 0: nothing for the factor to move, no source for it
    path = tmp_path / "cpu.yaml"
    path.write_text("cluster: {preset: cpu-loopback, gpus_per_node: 1}\n"
                    "model: {preset: cs336-mlp, kind: mlp, num_layers: 2, hidden_size: 256}\n"
                    "parallel: {tp: 1, pp: 1, dp: 1}\n"
                    "training: {micro_batch_size: 64, global_batch_size: 64, precision: fp32}\n")
    inline = tmp_path / "zero.yaml"
    inline.write_text(HOST_BOUND.replace("precision: fp32}", "precision: fp32, host_overhead: {dispatch: 0 us}}"))
    for p in (path, inline):
        r = _step(p)
        assert not [s for s in r["step_time_band_sources"] if s["part"] == "host"]
        assert "host" not in r["step_time_band_how"]
