"""Small plotly figures the teaching notebooks show (through `simdist.api`): values held by each rank,
line charts of sweeps, grouped bars, a hardware comparison's time/cost/energy (with the prediction band of the
days), prediction bands side by side, and predicted vs measured collective times. Plain data in; no simulation
here, only drawing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simdist.report.search_html import days_band_error_y

__all__ = ["band_figure", "bar_figure", "compare_figure", "line_figure", "prediction_figure", "rank_values_figure"]

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


def compare_figure(rows: Sequence[Mapping[str, Any]], title: str = "best layout per cluster") -> go.Figure:
    """Days to train, cost (where priced) and energy per cluster, side by side; rows with an ``error`` are left out.

    ``rows`` are a hardware comparison's rows (simdist.search.compare): ``cluster`` (``label`` where given:
    the cluster and its size), ``time_to_train_days``, ``cost_usd`` (None without a price), ``energy_kwh``;
    ``time_to_train_days_band`` (p10, p90), where every row has one, draws the days' band as an error bar.
    """
    ok = [r for r in rows if "error" not in r]
    names = [r.get("label", r["cluster"]) for r in ok]
    panels = [("days to train", [r["time_to_train_days"] for r in ok]),
              ("cost (million USD)", [r["cost_usd"] / 1e6 if r.get("cost_usd") is not None else None for r in ok]),
              ("energy (GWh)", [r["energy_kwh"] / 1e6 for r in ok])]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels], horizontal_spacing=0.08)
    days_error = days_band_error_y(ok)
    for col, (name, ys) in enumerate(panels, start=1):
        fig.add_trace(go.Bar(x=names, y=ys, name=name, marker={"color": PALETTE[col - 1]},
                             text=[f"{y:,.1f}" if y is not None else "no price" for y in ys], textposition="outside",
                             error_y=days_error if col == 1 else None,
                             hovertemplate="%{x}: %{y:,.2f}<extra>" + name + "</extra>"), row=1, col=col)
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    fig.update_layout(title=title, template="plotly_white", showlegend=False, height=420)
    return fig


def band_figure(labels: Sequence[str], bands: Sequence[Mapping[str, float]], predictions: Sequence[float], *,
                title: str, x_title: str = "step time (s)") -> go.Figure:
    """One row per label: the band's p10-p90 as a bar, its p50 and the prediction as markers (the band of
    simdist.predict.bands: ``{"p10", "p50", "p90"}``)."""
    fig = go.Figure()
    lo = [b["p10"] for b in bands]
    fig.add_trace(go.Bar(y=list(labels), x=[b["p90"] - b["p10"] for b in bands], base=lo, orientation="h",
                         name="p10-p90", marker={"color": PALETTE[0], "opacity": 0.35},
                         hovertemplate="%{y}: p10 %{base:.3f} .. p90 %{x:.3f} wider<extra></extra>"))
    fig.add_trace(go.Scatter(y=list(labels), x=[b["p50"] for b in bands], mode="markers", name="p50",
                             marker={"color": PALETTE[0], "symbol": "line-ns-open", "size": 18}))
    fig.add_trace(go.Scatter(y=list(labels), x=list(predictions), mode="markers", name="prediction",
                             marker={"color": PALETTE[1], "size": 10, "symbol": "diamond"}))
    fig.update_layout(title=title, template="plotly_white", height=160 + 60 * len(labels),
                      legend={"orientation": "h", "y": -0.3})
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(autorange="reversed")
    return fig


def prediction_figure(rows: Sequence[Mapping[str, Any]], title: str = "predicted vs measured") -> go.Figure:
    """Measured collective times against two predictions, and their errors, by size (log-log).

    ``rows`` hold ``op``, ``num_ranks``, ``nbytes``, ``measured_s``, ``predicted_s`` (calibrated) and
    ``uncalibrated_s`` (simdist.calibrate's validation rows); one colour family per (op, ranks) sweep.
    Left: time; right: (prediction - measured) / measured in percent.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=["time vs size", "error of the prediction"],
                        horizontal_spacing=0.1)
    sweeps = sorted({(r["op"], r["num_ranks"]) for r in rows})
    for n, (op, ranks) in enumerate(sweeps):
        pts = sorted((r for r in rows if (r["op"], r["num_ranks"]) == (op, ranks)), key=lambda r: r["nbytes"])
        x = [r["nbytes"] for r in pts]
        tag = f"{op}, {ranks} ranks" if len(sweeps) > 1 else ""
        base = PALETTE[(2 * n) % len(PALETTE)]
        fig.add_trace(go.Scatter(x=x, y=[r["measured_s"] for r in pts], mode="markers", name=f"measured {tag}".strip(),
                                 marker={"color": "black", "size": 8, "symbol": "diamond"}), row=1, col=1)
        for key, name, dash in (("predicted_s", "calibrated", "solid"), ("uncalibrated_s", "uncalibrated", "dash")):
            color = base if key == "predicted_s" else "#7f7f7f"
            fig.add_trace(go.Scatter(x=x, y=[r[key] for r in pts], mode="lines+markers", name=f"{name} {tag}".strip(),
                                     line={"color": color, "dash": dash}, legendgroup=name), row=1, col=1)
            err = [100.0 * (r[key] - r["measured_s"]) / r["measured_s"] for r in pts]
            fig.add_trace(go.Scatter(x=x, y=err, mode="lines+markers", name=f"error, {name} {tag}".strip(),
                                     line={"color": color, "dash": dash}, legendgroup=name, showlegend=False),
                          row=1, col=2)
    fig.add_hline(y=0.0, line={"color": "black", "width": 1}, row=1, col=2)
    fig.update_xaxes(type="log", title_text="size (bytes, as nccl-tests counts)")
    fig.update_yaxes(type="log", title_text="time (s)", row=1, col=1)
    fig.update_yaxes(title_text="error (%)", row=1, col=2)
    fig.update_layout(title=title, template="plotly_white", height=440, legend={"orientation": "h", "y": -0.25})
    return fig
