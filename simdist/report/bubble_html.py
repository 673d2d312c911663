"""Interactive plotly chart of the pipeline bubble against the micro-batch count (`simdist bubble --html`).

One line (with markers) for the simulated bubble fraction (idle / total stage-time, from the engine's
timeline) and one dashed line for the closed form the schedule's paper gives; the gap between them is what
the formula leaves out (uneven stages, p2p time). Written as a full page with plotly.js inlined, as
simdist.report.collective_html does, so the file opens offline.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go

__all__ = ["bubble_figure", "bubble_figure_html"]


def bubble_figure(rows: Iterable[Mapping[str, Any]], title: str = "Pipeline bubble vs micro-batches") -> go.Figure:
    """``rows``: dicts with ``microbatches``, ``bubble_fraction``, ``formula`` (as `simdist.api.bubble` returns)."""
    points = sorted(rows, key=lambda r: r["microbatches"])
    m = [r["microbatches"] for r in points]
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=m, y=[r["bubble_fraction"] for r in points], name="simulated", mode="lines+markers",
        line={"color": "#1f77b4"},
        hovertemplate="M=%{x}<br>simulated bubble %{y:.2%}<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=m, y=[r["formula"] for r in points], name="formula", mode="lines",
        line={"color": "#d62728", "dash": "dash"},
        hovertemplate="M=%{x}<br>formula %{y:.2%}<extra></extra>"))
    fig.update_layout(title=title, template="plotly_white", hovermode="x unified",
                      legend={"orientation": "h", "y": 1.08})
    fig.update_xaxes(title_text="micro-batches per step (M)")
    fig.update_yaxes(title_text="bubble fraction (idle / stage-time)", tickformat=".0%", rangemode="tozero")
    return fig


def bubble_figure_html(rows: Iterable[Mapping[str, Any]], title: str = "Pipeline bubble vs micro-batches") -> str:
    """A self-contained HTML page (plotly.js inlined) of `bubble_figure`."""
    page = bubble_figure(rows, title).to_html(include_plotlyjs=True, full_html=True)
    return page.replace("<head>", f"<head><title>{html.escape(title)}</title>", 1)
