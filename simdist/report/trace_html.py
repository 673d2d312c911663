"""A measured step (from a profiler trace) above the predicted one, one rank each, as a plotly page
(`simdist validate --trace ... --html`).

Plain data in (`Bar`: a lane, a category, start and end in seconds from the step's start, a label), no
simdist.calibrate import (report sits below calibrate): simdist.api.trace builds the bars from the trace's
classified kernels and from the simulated op graph's timeline. Each panel draws one horizontal bar per kernel or op
on its lane, coloured by category; the table under them is the comparison's rows (step, compute, exposed
communication, idle: measured, predicted, error).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["Bar", "trace_comparison_html"]

COLOURS = {"gemm": "#1f77b4", "attention": "#9467bd", "memory": "#2ca02c", "compute": "#1f77b4",
           "collective": "#d62728", "recompute": "#17becf", "optimizer": "#8c564b", "other": "#7f7f7f"}
MAX_BARS = 20_000
"""Bars drawn per panel (the first ones in time): a browser stays responsive."""


@dataclass(frozen=True, slots=True)
class Bar:
    lane: str
    category: str
    start_s: float
    end_s: float
    label: str


def _panel(fig: go.Figure, bars: Sequence[Bar], row: int) -> None:
    bars = sorted(bars, key=lambda b: b.start_s)[:MAX_BARS]
    for category in sorted({b.category for b in bars}):
        mine = [b for b in bars if b.category == category]
        fig.add_trace(go.Bar(
            y=[b.lane for b in mine], x=[(b.end_s - b.start_s) * 1e3 for b in mine],
            base=[b.start_s * 1e3 for b in mine], orientation="h", name=category,
            marker_color=COLOURS.get(category, COLOURS["other"]), legendgroup=category, showlegend=row == 1,
            hovertext=[f"{b.label}<br>{(b.end_s - b.start_s) * 1e6:.1f} us at {b.start_s * 1e3:.3f} ms" for b in mine],
            hoverinfo="text"), row=row, col=1)


def trace_comparison_html(measured: Sequence[Bar], predicted: Sequence[Bar], *, title: str,
                          measured_title: str, predicted_title: str, rows: Sequence[dict]) -> str:
    """The page: the two timelines (ms from each step's start) and the comparison table."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=(measured_title, predicted_title))
    _panel(fig, measured, 1)
    _panel(fig, predicted, 2)
    fig.update_layout(title={"text": title}, barmode="overlay", template="plotly_white",
                      height=260 + 40 * (len({b.lane for b in measured}) + len({b.lane for b in predicted})))
    fig.update_xaxes(title_text="ms from the step's start", row=2, col=1)
    table = "".join(
        f"<tr><td>{html.escape(str(r['what']))}</td><td>{r['measured_s'] * 1e3:.3f}</td>"
        f"<td>{r['predicted_s'] * 1e3:.3f}</td><td>"
        + ("-" if r.get("error_pct") is None else f"{r['error_pct']:+.1f} %") + "</td></tr>" for r in rows)
    body = fig.to_html(full_html=False, include_plotlyjs=True)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title></head><body>"
            + body + "<table border='1' cellpadding='4'><tr><th></th><th>measured ms</th><th>predicted ms</th>"
            "<th>error</th></tr>" + table + "</table></body></html>")
