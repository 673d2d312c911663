"""Interactive plotly chart of a calibration's validation (`simdist validate --html`).

One row of two panels per measured sweep (an op on a rank count): time against size (log-log; sizes are
nccl-tests sizes) with the measured points (fitted ones and held-out ones marked apart), the calibrated
prediction as a curve with its fit band (the curve at the confidence-interval ends of latency and
bandwidth factor, simdist.calibrate.calibration), and the uncalibrated prediction dashed; beside it the
error of each prediction at the measured points, (predicted - measured) / measured in percent.

Plain data in (`ValidateSeries`), no simdist.calibrate import (report sits below calibrate). The band is drawn
within a factor `BAND_SPAN` of the curve and only where finite, so that a degenerate interval can never stretch
the time axis over hundreds of decades (it is the fit's uncertainty, not a second prediction).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["BAND_SPAN", "ValidateSeries", "validate_figure", "validate_figure_html"]

Pairs = tuple[tuple[float, float], ...]
BAND_SPAN = 10.0


@dataclass(frozen=True, slots=True)
class ValidateSeries:
    """One measured sweep and its predictions: (bytes, seconds) pairs, sorted by size."""

    label: str
    fitted: Pairs
    """Measured points the calibration was fitted on."""
    heldout: Pairs
    """Measured points it had to predict."""
    curve: Pairs
    band_low: Pairs
    band_high: Pairs
    uncalibrated: Pairs


def _at(pairs: Pairs, sizes: Sequence[float]) -> np.ndarray:
    """A curve interpolated (log-log) at ``sizes``."""
    x = np.log2([p[0] for p in pairs])
    y = np.log2([p[1] for p in pairs])
    return 2.0 ** np.interp(np.log2(np.asarray(sizes, dtype=float)), x, y)


def _bounded(band: Pairs, curve: Pairs, towards: float) -> list[float]:
    """The band's times, finite and within a factor BAND_SPAN of the curve (``towards`` < 1: the lower edge)."""
    out = []
    for (_, b), (_, c) in zip(band, curve, strict=True):
        limit = c * (BAND_SPAN ** (-1 if towards < 1 else 1))
        ok = np.isfinite(b) and b > 0
        out.append(float(min(max(b, limit), c) if towards < 1 else max(min(b, limit), c)) if ok else c)
    return out


def validate_figure(series: Sequence[ValidateSeries], title: str = "Calibration: predicted vs measured") -> go.Figure:
    rows = max(len(series), 1)
    names = [n for s in series for n in (f"{s.label}: time", f"{s.label}: error of the prediction")]
    fig = make_subplots(rows=rows, cols=2, subplot_titles=names or None, horizontal_spacing=0.08,
                        vertical_spacing=min(0.12, 0.5 / rows))
    for i, s in enumerate(series, start=1):
        legend = i == 1
        xs = [p[0] for p in s.curve]
        high, low = _bounded(s.band_high, s.curve, 2.0), _bounded(s.band_low, s.curve, 0.5)
        fig.add_trace(go.Scatter(x=xs + xs[::-1], y=high + low[::-1],
                                 fill="toself", fillcolor="rgba(31,119,180,0.18)", line={"width": 0},
                                 name="fit band (95 % CI)", legendgroup="band", showlegend=legend,
                                 hoverinfo="skip"), row=i, col=1)
        fig.add_trace(go.Scatter(x=xs, y=[p[1] for p in s.curve], mode="lines", line={"color": "#1f77b4"},
                                 name="calibrated", legendgroup="cal", showlegend=legend), row=i, col=1)
        fig.add_trace(go.Scatter(x=[p[0] for p in s.uncalibrated], y=[p[1] for p in s.uncalibrated], mode="lines",
                                 line={"color": "#7f7f7f", "dash": "dash"}, name="uncalibrated", legendgroup="unc",
                                 showlegend=legend), row=i, col=1)
        for pts, name, marker in ((s.fitted, "measured (fitted)", {"color": "#2ca02c", "symbol": "circle"}),
                                  (s.heldout, "measured (held out)", {"color": "#d62728", "symbol": "diamond",
                                                                      "size": 9})):
            if pts:
                fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers", marker=marker,
                                         name=name, legendgroup=name, showlegend=legend), row=i, col=1)
        measured = sorted(s.fitted + s.heldout)
        if measured and s.curve:
            sizes = [p[0] for p in measured]
            truth = np.array([p[1] for p in measured])
            for curve, name, color in ((s.curve, "calibrated", "#1f77b4"), (s.uncalibrated, "uncalibrated",
                                                                              "#7f7f7f")):
                err = 100.0 * (_at(curve, sizes) - truth) / truth
                fig.add_trace(go.Scatter(x=sizes, y=err, mode="markers+lines", marker={"color": color},
                                         line={"color": color, "width": 1}, name=f"error, {name}",
                                         legendgroup=f"err-{name}", showlegend=legend), row=i, col=2)
        fig.update_xaxes(type="log", title_text="size (bytes)", row=i, col=1)
        fig.update_xaxes(type="log", title_text="size (bytes)", row=i, col=2)
        fig.update_yaxes(type="log", title_text="time (s)", row=i, col=1)
        fig.update_yaxes(title_text="error %", row=i, col=2)
    fig.update_layout(title=html.escape(title), height=380 * rows + 120, template="plotly_white")
    return fig


def validate_figure_html(series: Sequence[ValidateSeries], title: str = "Calibration: predicted vs measured") -> str:
    """A self-contained HTML page (plotly.js inlined: opens offline)."""
    return validate_figure(series, title).to_html(include_plotlyjs=True, full_html=True)
