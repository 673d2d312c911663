"""The collective cost figure: traces per curve and measured source, log axes, region annotations, HTML."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from simdist.calibrate import read_measurements
from simdist.report.collective_html import (
    Curve,
    CurvePoint,
    collective_figure,
    collective_figure_html,
    curve_regions,
)
from simdist.units import format_bytes

DATA = Path(__file__).resolve().parent / "data"
ALPHA, BETA, FACTOR = 20e-6, 200e9, 2 * 7 / 8  # time = a + S/B; 8-rank all_reduce busbw factor


def alpha_beta(label: str, alpha: float = ALPHA, beta: float = BETA) -> Curve:
    rows = []
    for e in range(8, 35):
        size = 2.0**e
        t = alpha + size / beta
        rows.append((size, t, FACTOR * size / t))
    return Curve.of(label, rows)


def _traces(fig, role: str, panel: str | None = None) -> list:
    return [t for t in fig.data if t.meta["role"] == role and (panel is None or t.meta["panel"] == panel)]


def _annotation(fig, name: str):
    (note,) = [a for a in fig.layout.annotations if a.name == name]
    return note


def test_regions_of_an_alpha_beta_curve():
    r = curve_regions(alpha_beta("auto"))
    knee = ALPHA * BETA  # S/B = a: time 2a, busbw half the asymptote
    assert knee / 2 <= r.knee_bytes <= 2 * knee
    assert r.knee_bytes == pytest.approx(knee, rel=0.05)
    assert r.latency_end_bytes == pytest.approx(knee, rel=0.05)  # time <= 2 a up to S = a.B
    assert r.plateau_start_bytes == pytest.approx(9 * knee, rel=0.1)  # S / (S + aB) = 0.9
    assert r.peak_busbw_Bps == pytest.approx(FACTOR * BETA, rel=0.01) and r.min_time_s == pytest.approx(ALPHA, rel=1e-3)
    assert r.knee_bytes < r.plateau_start_bytes
    assert curve_regions(Curve.of("one", [(1024, 1e-5, 1e8)])) is None


def test_figure_traces_axes_and_annotations():
    ring = alpha_beta("ring", alpha=10e-6, beta=100e9)
    auto = alpha_beta("auto")
    measured = [m for m in read_measurements(DATA / "all_reduce_perf_a100x8.txt") if not m.in_place]
    measured += [m for m in read_measurements(DATA / "all_reduce_perf_a100x8.json") if not m.in_place][:5]
    fig = collective_figure([ring, {"label": auto.label, "points": auto.points}], measured, title="AR 8xA100")

    assert [t.name for t in _traces(fig, "curve", "busbw")] == ["ring", "auto"]
    assert len(_traces(fig, "curve", "time")) == 2
    sources = ["all_reduce_perf_a100x8.txt", "all_reduce_perf_a100x8.json"]
    assert [t.name for t in _traces(fig, "measured", "busbw")] == sources
    assert [len(t.x) for t in _traces(fig, "measured", "time")] == [20, 5]
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert legend == ["ring", "auto", *sources]  # one entry per curve and per measured source

    busbw = _traces(fig, "measured", "busbw")[0]
    assert busbw.y[0] == pytest.approx(1.31) and busbw.x[0] == 32768  # GB/s against bytes
    assert _traces(fig, "measured", "time")[0].y[0] == pytest.approx(43.83)  # us
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type == "log" and fig.layout.yaxis2.type == "log"
    assert fig.layout.yaxis.type != "log"
    assert {"1K", "1M", "1G"} <= set(fig.layout.xaxis.ticktext)
    assert "1 ms" in fig.layout.yaxis2.ticktext
    assert busbw.customdata[0][0].startswith("32 KiB") and "busbw" in busbw.hovertemplate

    r = curve_regions(auto)  # "auto" is the reference curve although listed second
    knee = _annotation(fig, "knee")
    assert "knee" in knee.text and format_bytes(r.knee_bytes) in knee.text
    assert knee.x == pytest.approx(math.log10(r.knee_bytes))  # annotations on a log axis take log10(x)
    assert abs(knee.x - math.log10(ALPHA * BETA)) <= math.log10(2)
    latency, plateau = _annotation(fig, "latency"), _annotation(fig, "plateau")
    assert "latency" in latency.text and format_bytes(r.latency_end_bytes) in latency.text
    assert "plateau" in plateau.text and format_bytes(r.plateau_start_bytes) in plateau.text
    assert 10 ** latency.x < r.latency_end_bytes < r.plateau_start_bytes < 10 ** plateau.x
    rects = {(s.x0, s.x1) for s in fig.layout.shapes if s.type == "rect"}
    assert rects == {(256.0, r.latency_end_bytes), (r.plateau_start_bytes, 2.0**34)}
    assert {s.x0 for s in fig.layout.shapes if s.type == "line"} == {r.knee_bytes}


def test_measured_mapping_and_no_curves():
    pts = [CurvePoint(2.0**e, 1e-5 * (1 + 2.0**e / 4e6), 1e9) for e in range(10, 20)]
    fig = collective_figure([], {"lab run": pts})
    assert [t.name for t in _traces(fig, "measured", "busbw")] == ["lab run"]
    assert not fig.layout.annotations and not fig.layout.shapes


def test_html_is_standalone():
    measured = read_measurements(DATA / "all_gather_perf_h200x8.txt")
    html = collective_figure_html([alpha_beta("auto")], measured, title="all_gather <8x H200>")
    assert "<title>all_gather &lt;8x H200&gt;</title>" in html
    assert "all_gather_perf_h200x8.txt (in-place)" in html  # in-place points are their own legend entry
    assert not re.search(r"<script[^>]*\bsrc=", html)  # plotly.js inlined
    assert len(html) > 1_000_000
