"""Small plotly figures the teaching notebooks show (through `simdist.api`): values held by each rank,
line charts of sweeps, grouped bars. Plain data in; no simulation here, only drawing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["bar_figure", "line_figure", "rank_values_figure"]

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def rank_values_figure(stages: Mapping[str, Sequence[Sequence[float]]], title: str = "what each rank holds"
                       ) -> go.Figure:
    """One heatmap per stage (rank x element, the value written in each cell), side by side.

    ``stages`` maps a caption ("inputs", "after reduce_scatter", ...) to one list of values per rank;
    ranks holding fewer values than the widest leave the rest of their row blank.
    """
    names = list(stages)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, horizontal_spacing=0.06)
    top = max((abs(v) for rows in stages.values() for row in rows for v in row), default=1.0) or 1.0
    for col, name in enumerate(names, start=1):
        rows = stages[name]
        width = max((len(r) for r in rows), default=0)
        z = [[row[i] if i < len(row) else None for i in range(width)] for row in rows]
        text = [["" if v is None else f"{v:g}" for v in zr] for zr in z]
        fig.add_trace(go.Heatmap(
            z=z, text=text, texttemplate="%{text}", x=[f"[{i}]" for i in range(width)],
            y=[f"rank {r}" for r in range(len(rows))], zmin=0, zmax=top, colorscale="Blues", showscale=False,
            hovertemplate="%{y} element %{x}: %{z}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col, showticklabels=col == 1)
    fig.update_layout(title=title, template="plotly_white", height=120 + 45 * max(len(r) for r in stages.values()),
                      width=max(420, 260 * len(names)))
    return fig


def line_figure(x: Sequence[float], series: Mapping[str, Sequence[float]], *, title: str, x_title: str,
                y_title: str, log_x: bool = False, log_y: bool = False, y_format: str | None = None,
                dashed: Sequence[str] = ()) -> go.Figure:
    """One line per series over the shared ``x`` (series named in ``dashed`` are dashed: formulas)."""
    fig = go.Figure()
    for n, (name, ys) in enumerate(series.items()):
        dash = "dash" if name in dashed else "solid"
        fig.add_trace(go.Scatter(x=list(x), y=list(ys), name=name, mode="lines" if dash == "dash" else "lines+markers",
                                 line={"color": PALETTE[n % len(PALETTE)], "dash": dash}))
    fig.update_layout(title=title, template="plotly_white", hovermode="x unified",
                      legend={"orientation": "h", "y": -0.2})
    fig.update_xaxes(title_text=x_title, type="log" if log_x else "linear")
    fig.update_yaxes(title_text=y_title, type="log" if log_y else "linear", rangemode="tozero")
    if y_format:
        fig.update_yaxes(tickformat=y_format)
    return fig


def bar_figure(categories: Sequence[str], series: Mapping[str, Sequence[float]], *, title: str, y_title: str,
               stacked: bool = False, y_format: str | None = None) -> go.Figure:
    """Grouped (or stacked) bars: one bar per series in each category."""
    fig = go.Figure()
    for n, (name, ys) in enumerate(series.items()):
        fig.add_trace(go.Bar(x=list(categories), y=list(ys), name=name, marker={"color": PALETTE[n % len(PALETTE)]}))
    fig.update_layout(title=title, template="plotly_white", barmode="stack" if stacked else "group",
                      legend={"orientation": "h", "y": -0.2})
    fig.update_yaxes(title_text=y_title)
    if y_format:
        fig.update_yaxes(tickformat=y_format)
    return fig
