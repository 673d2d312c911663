"""Interactive plotly figure of a collective's cost against message size (`collective_figure`, `..._html`).

Two stacked panels share a log x axis of message size (nccl-tests ``size``, ticks in binary units:
1K, 1M, 1G): bus bandwidth on top (GB/s = 1e9 bytes/s, nccl-tests doc/PERFORMANCE.md: busbw = algbw x
the op's factor, algbw = size / time), time below (log scale). One line per predicted curve (an
algorithm: "ring", "tree", "auto", ...) and one marker set per measured source.

The reference curve ("auto" when there is one, else the first) is split into three regions
(`curve_regions`): latency-bound (time within 2x of the smallest time), the knee (the size where busbw
reaches half its peak; for time = a + S/B this is S = a.B) and the plateau (busbw >= 90 % of peak).

Plain data in, no simdist.calibrate import: measured points are anything with ``nbytes``, ``time_s``
and ``busbw_Bps`` (a `Measurement` fits), grouped by ``label`` or else the file name of ``source``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simdist.units import format_bytes, format_time

__all__ = ["Curve", "CurvePoint", "Regions", "collective_figure", "collective_figure_html", "curve_regions"]

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
MARKERS = ("circle", "diamond", "square", "triangle-up", "x", "star", "cross", "triangle-down")
KNEE_FRACTION, PLATEAU_FRACTION, LATENCY_FACTOR = 0.5, 0.9, 2.0


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One point of a cost curve: ``nbytes`` (nccl-tests size) takes ``time_s`` at ``busbw_Bps``."""

    nbytes: float
    time_s: float
    busbw_Bps: float

    @property
    def algbw_Bps(self) -> float:
        return self.nbytes / self.time_s if self.time_s > 0 else math.inf


@dataclass(frozen=True, slots=True)
class Curve:
    """A labelled curve (one algorithm's prediction), points sorted by size."""

    label: str
    points: tuple[CurvePoint, ...]

    @classmethod
    def of(cls, label: str, rows: Iterable) -> Curve:
        """From CurvePoints, (nbytes, time_s, busbw_Bps) tuples, dicts or objects with those attributes."""
        return cls(str(label), tuple(sorted((_point(r) for r in rows), key=lambda p: p.nbytes)))


@dataclass(frozen=True, slots=True)
class Regions:
    """Where a busbw curve stops being latency-bound, turns (knee) and flattens (plateau), in bytes."""

    latency_end_bytes: float
    knee_bytes: float
    plateau_start_bytes: float
    peak_busbw_Bps: float
    min_time_s: float


def _point(row: object) -> CurvePoint:
    if isinstance(row, CurvePoint):
        return row
    if isinstance(row, Mapping):
        return CurvePoint(float(row["nbytes"]), float(row["time_s"]), float(row["busbw_Bps"]))
    if isinstance(row, (tuple, list)):
        nbytes, time_s, busbw = row[:3]
        return CurvePoint(float(nbytes), float(time_s), float(busbw))
    return CurvePoint(float(row.nbytes), float(row.time_s), float(row.busbw_Bps))  # type: ignore[attr-defined]


def _curve(item: object) -> Curve:
    if isinstance(item, Curve):
        return item
    if isinstance(item, Mapping):
        return Curve.of(item["label"], item.get("points", item.get("rows", ())))
    return Curve.of(item.label, item.points)  # type: ignore[attr-defined]


def _crossing(x0: float, y0: float, x1: float, y1: float, target: float) -> float:
    """Size where the segment (log x, y) reaches ``target``; x0 when flat."""
    if y1 == y0:
        return x0
    frac = min(max((target - y0) / (y1 - y0), 0.0), 1.0)
    return math.exp(math.log(x0) + frac * (math.log(x1) - math.log(x0)))


def curve_regions(curve: Curve) -> Regions | None:
    """The latency-bound end, knee and plateau start of ``curve`` (None with fewer than two points).

    knee: the smallest size where busbw reaches KNEE_FRACTION of its peak; plateau: from the smallest
    size after which busbw stays >= PLATEAU_FRACTION of peak; latency-bound: from the smallest size
    while time <= LATENCY_FACTOR x the smallest time. Crossings are interpolated on log size.
    """
    pts = [p for p in curve.points if p.nbytes > 0 and p.time_s > 0]
    if len(pts) < 2:
        return None
    xs, bus = [p.nbytes for p in pts], [p.busbw_Bps for p in pts]
    times = [math.log(p.time_s) for p in pts]
    peak, t_min = max(bus), min(p.time_s for p in pts)

    def rise(values: list[float], target: float, start: int) -> float:
        if start == 0 or values[start - 1] >= target:
            return xs[start]
        return _crossing(xs[start - 1], values[start - 1], xs[start], values[start], target)

    knee = rise(bus, KNEE_FRACTION * peak, next(i for i, b in enumerate(bus) if b >= KNEE_FRACTION * peak))
    level = PLATEAU_FRACTION * peak
    stays = [i for i in range(len(bus)) if all(b >= level for b in bus[i:])]
    plateau = rise(bus, level, stays[0] if stays else next(i for i, b in enumerate(bus) if b >= level))
    t_cap = math.log(LATENCY_FACTOR * t_min)
    last = -1
    while last + 1 < len(pts) and times[last + 1] <= t_cap:
        last += 1
    if last < 0:
        latency_end = xs[0]
    elif last == len(pts) - 1:
        latency_end = xs[-1]
    else:
        latency_end = _crossing(xs[last], times[last], xs[last + 1], times[last + 1], t_cap)
    return Regions(latency_end, knee, plateau, peak, t_min)


def _size_label(nbytes: float) -> str:
    for shift, suffix in ((40, "T"), (30, "G"), (20, "M"), (10, "K")):
        if nbytes >= 2**shift:
            return f"{nbytes / 2**shift:g}{suffix}"
    return f"{nbytes:g}"


def _size_ticks(sizes: list[float]) -> tuple[list[float], list[str]]:
    lo, hi = math.floor(math.log2(min(sizes))), math.ceil(math.log2(max(sizes)))
    step = next(s for s in (1, 2, 5, 10) if (hi - lo) / s <= 14)
    exps = [e for e in range(lo, hi + 1) if e % step == 0] or [lo]
    return [2.0**e for e in exps], [_size_label(2.0**e) for e in exps]


def _time_ticks(times: list[float]) -> tuple[list[float], list[str]]:
    lo, hi = math.floor(math.log10(min(times) * 1e6)), math.ceil(math.log10(max(times) * 1e6))
    return [10.0**e for e in range(lo, hi + 1)], [format_time(10.0**e * 1e-6) for e in range(lo, hi + 1)]


def _hover(points: Iterable[CurvePoint]) -> list[list[str | float]]:
    return [[f"{format_bytes(p.nbytes)} ({p.nbytes:.0f} B)", format_time(p.time_s), p.algbw_Bps / 1e9,
             p.busbw_Bps / 1e9] for p in points]


HOVER = ("<b>%{fullData.name}</b><br>size %{customdata[0]}<br>time %{customdata[1]}"
         "<br>algbw %{customdata[2]:.2f} GB/s<br>busbw %{customdata[3]:.2f} GB/s<extra></extra>")


def _measured_groups(measured: object) -> list[Curve]:
    if measured is None:
        return []
    if isinstance(measured, Mapping):
        return [Curve.of(label, rows) for label, rows in measured.items()]
    groups: dict[str, list] = {}
    for r in measured:  # type: ignore[attr-defined]
        label = getattr(r, "label", None) or PurePath(str(getattr(r, "source", None) or "measured")).name
        if getattr(r, "in_place", False):
            label = f"{label} (in-place)"
        groups.setdefault(label, []).append(r)
    return [Curve.of(label, rows) for label, rows in groups.items()]


def _add(fig: go.Figure, curve: Curve, role: str, style: dict, legend: str) -> None:
    x = [p.nbytes for p in curve.points]
    custom = _hover(curve.points)
    for row, y in ((1, [p.busbw_Bps / 1e9 for p in curve.points]), (2, [p.time_s * 1e6 for p in curve.points])):
        fig.add_trace(go.Scatter(
            x=x, y=y, name=curve.label, legendgroup=legend, showlegend=row == 1, customdata=custom,
            hovertemplate=HOVER, meta={"role": role, "label": curve.label, "panel": "busbw" if row == 1 else "time"},
            **style,
        ), row=row, col=1)


def _annotate(fig: go.Figure, curve: Curve, regions: Regions) -> None:
    first, last = curve.points[0].nbytes, curve.points[-1].nbytes
    peak_gbs = regions.peak_busbw_Bps / 1e9
    spans = ((first, regions.latency_end_bytes, "#1f77b4"), (regions.plateau_start_bytes, last, "#2ca02c"))
    for x0, x1, color in spans:
        for yref in ("y domain", "y2 domain"):
            fig.add_shape(type="rect", xref="x", yref=yref, x0=x0, x1=x1, y0=0, y1=1, fillcolor=color,
                          opacity=0.10, line_width=0, layer="below")
    for yref in ("y domain", "y2 domain"):
        fig.add_shape(type="line", xref="x", yref=yref, x0=regions.knee_bytes, x1=regions.knee_bytes, y0=0, y1=1,
                      line={"color": "#555", "dash": "dash", "width": 1})
    notes = (
        ("latency", math.sqrt(first * regions.latency_end_bytes), 0.97,
         f"latency-bound<br>≤ {format_bytes(regions.latency_end_bytes)}: time ≤ {LATENCY_FACTOR:g}x "
         f"{format_time(regions.min_time_s)}"),
        ("knee", regions.knee_bytes, 0.62,
         f"knee ≈ {format_bytes(regions.knee_bytes)}<br>busbw {KNEE_FRACTION:.0%} of peak"),
        ("plateau", math.sqrt(regions.plateau_start_bytes * last), 0.12,
         f"plateau ≥ {format_bytes(regions.plateau_start_bytes)}<br>busbw ≥ {PLATEAU_FRACTION:.0%} of "
         f"{peak_gbs:.4g} GB/s"),
    )
    for name, x, y, text in notes:
        # Annotations on a log axis take log10(x); shapes take x itself (plotly).
        fig.add_annotation(name=name, x=math.log10(x), y=y, xref="x", yref="y domain", text=text, showarrow=False,
                           xanchor="left" if name == "knee" else "center", bgcolor="rgba(255,255,255,0.7)",
                           font={"size": 11})


def collective_figure(series: Iterable, measured: object = None, title: str = "Collective cost vs size") -> go.Figure:
    """busbw and time against size: one line per curve of ``series``, markers per measured source.

    ``series``: `Curve` objects, or dicts ``{"label": ..., "points": rows}`` (rows: `CurvePoint`,
    ``(nbytes, time_s, busbw_Bps)`` or objects with those attributes). ``measured``: None, a mapping
    label -> rows, or records (e.g. `Measurement`) grouped by ``label`` / source file name.
    """
    curves = [c for c in (_curve(s) for s in series) if c.points]
    groups = [g for g in _measured_groups(measured) if g.points]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.05, row_heights=[0.55, 0.45])
    for i, curve in enumerate(curves):
        style = {"mode": "lines+markers", "line": {"color": PALETTE[i % len(PALETTE)], "width": 2},
                 "marker": {"size": 4}}
        _add(fig, curve, "curve", style, f"curve:{curve.label}")
    for i, group in enumerate(groups):
        style = {"mode": "markers", "marker": {"symbol": MARKERS[i % len(MARKERS)], "size": 8, "color": "#333",
                                               "line": {"width": 1, "color": "white"}}}
        _add(fig, group, "measured", style, f"measured:{group.label}")
    reference = next((c for c in curves if c.label.lower() == "auto"), curves[0] if curves else None)
    regions = curve_regions(reference) if reference else None
    if regions is not None and reference is not None:
        _annotate(fig, reference, regions)
    sizes = [p.nbytes for c in curves + groups for p in c.points if p.nbytes > 0]
    times = [p.time_s for c in curves + groups for p in c.points if p.time_s > 0]
    if sizes:
        tickvals, ticktext = _size_ticks(sizes)
        fig.update_xaxes(type="log", tickvals=tickvals, ticktext=ticktext)
    else:
        fig.update_xaxes(type="log")
    fig.update_xaxes(title_text="message size (nccl-tests size, binary units)", row=2, col=1)
    fig.update_yaxes(title_text="busbw (GB/s)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(type="log", title_text="time", row=2, col=1)
    if times:
        tickvals, ticktext = _time_ticks(times)
        fig.update_yaxes(tickvals=tickvals, ticktext=ticktext, row=2, col=1)
    fig.update_layout(title={"text": title}, template="plotly_white", height=820, hovermode="closest",
                      legend={"title": {"text": "predicted / measured"}}, margin={"t": 70, "r": 30})
    return fig


def collective_figure_html(series: Iterable, measured: object = None, title: str = "Collective cost vs size") -> str:
    """``collective_figure`` as a standalone HTML page with plotly.js inlined (works offline)."""
    page = collective_figure(series, measured, title).to_html(include_plotlyjs=True, full_html=True)
    return page.replace("<head>", f"<head><title>{html.escape(title)}</title>", 1)
