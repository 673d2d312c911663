"""One self-contained HTML page of a simulated training step (`step_report_html`) and its plotly figures.

Sections: a header (scenario, key metrics, layout), a timeline of the simulated ranks (one row per
"rank r / stream", x in ms, bars coloured by op kind; communication ops by axis), the step-time
breakdown, memory per pipeline stage (stacked parts against the GPU's capacity), the busiest links'
utilisation, and the collectives the step runs. plotly.js is inlined once (as
simdist.report.collective_html does with ``to_html(include_plotlyjs=True)``), so the page works offline.

Efficiency: graphs hold 10^4+ ops, so the timeline draws one horizontal ``go.Bar`` trace per kind
(``base`` = start, ``x`` = duration, numpy arrays) rather than one trace per op.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go

from simdist.plan.opgraph import Op, OpGraph
from simdist.report.step_table import (
    MEMORY_PARTS,
    algorithm_label,
    breakdown_rows,
    format_gib,
    format_percent,
    format_seconds,
)
from simdist.report.step_trace import StepTrace, stream_tid
from simdist.units import GiB, format_bytes

__all__ = [
    "breakdown_figure",
    "links_figure",
    "memory_figure",
    "op_group",
    "step_report_html",
    "timeline_figure",
]

MS_PER_S = 1e3
KIND_COLORS = {
    "forward": "#1f77b4",
    "backward": "#ff7f0e",
    "weight_grad": "#ffbb78",
    "recompute": "#9467bd",
    "optimizer": "#8c564b",
    "comm tp": "#2ca02c",
    "comm cp": "#bcbd22",
    "comm pp": "#d62728",
    "comm dp": "#17becf",
}
FALLBACK_COLORS = ("#e377c2", "#7f7f7f", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")
MEMORY_COLORS = dict(zip(MEMORY_PARTS, ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"), strict=True))
TIMELINE_HOVER = ("<b>%{customdata[0]}</b><br>%{y}<br>start %{base:.4g} ms, duration %{x:.4g} ms"
                  "<br>micro-batch %{customdata[1]}, chunk %{customdata[2]}%{customdata[3]}<extra>%{fullData.name}"
                  "</extra>")


def op_group(op: Op) -> str:
    """The legend entry of an op: "comm <axis>" for a communication op, else its kind."""
    return f"comm {op.comm.axis}" if op.comm is not None else op.kind


def _color(group: str, index: int) -> str:
    return KIND_COLORS.get(group, FALLBACK_COLORS[index % len(FALLBACK_COLORS)])


def _track_label(rank: int, stream: str) -> str:
    return f"rank {rank} / {stream}"


def timeline_figure(graph: OpGraph, trace: StepTrace, title: str = "timeline of the simulated ranks") -> go.Figure:
    """Gantt chart: one row per (rank, stream) track, one bar per op, one trace per `op_group`."""
    starts = np.asarray(trace.start_s, dtype=float)
    ends = np.asarray(trace.end_s, dtype=float)
    if starts.shape != (len(graph.ops),) or ends.shape != (len(graph.ops),):
        raise ValueError(f"trace covers {starts.size} ops but the graph has {len(graph.ops)}; "
                         "pass the trace simulated from this graph")
    extra: dict[str, int] = {}
    tracks = sorted(graph.tracks(), key=lambda t: (t[0], stream_tid(t[1], extra)))
    order = [_track_label(rank, stream) for rank, stream in tracks]
    groups: dict[str, list[int]] = {}
    for i, op in enumerate(graph.ops):
        groups.setdefault(op_group(op), []).append(i)
    fig = go.Figure()
    for n, (group, ids) in enumerate(groups.items()):
        idx = np.asarray(ids, dtype=np.int64)
        ok = idx[~(np.isnan(starts[idx]) | np.isnan(ends[idx]))]
        ops = [graph.ops[i] for i in ok]
        custom = np.empty((len(ops), 4), dtype=object)
        for row, op in enumerate(ops):
            comm = op.comm
            custom[row] = (html.escape(op.name), op.microbatch, op.chunk,
                           f"<br>{comm.op} {format_bytes(comm.nbytes)} over {len(comm.ranks)} ranks" if comm else "")
        fig.add_trace(go.Bar(
            orientation="h", name=group, y=[_track_label(op.rank, op.stream) for op in ops],
            base=starts[ok] * MS_PER_S, x=np.maximum(ends[ok] - starts[ok], 0.0) * MS_PER_S,
            marker={"color": _color(group, n), "line": {"width": 0}}, customdata=custom,
            hovertemplate=TIMELINE_HOVER, meta={"role": "timeline", "group": group},
        ))
    fig.add_vline(x=float(trace.makespan_s) * MS_PER_S, line={"color": "#333", "dash": "dot", "width": 1},
                  annotation_text=f"step {format_seconds(trace.makespan_s)}", annotation_position="top")
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=order, autorange="reversed",
                     title_text="rank / stream")
    fig.update_xaxes(title_text="time (ms)", rangemode="tozero")
    height = min(max(260, 22 * len(order) + 140), 4000)
    fig.update_layout(title={"text": title}, template="plotly_white", barmode="overlay", bargap=0.25,
                      height=height, hovermode="closest", legend={"title": {"text": "op kind"}})
    return fig


def breakdown_figure(result: Mapping[str, Any]) -> go.Figure:
    """The step-time breakdown (compute, recompute, exposed comm per axis, bubble, optimizer) in ms."""
    rows = breakdown_rows(result)
    step = result.get("step_time_s") or 0.0
    fig = go.Figure(go.Bar(
        x=[label for label, _ in rows], y=[s * MS_PER_S for _, s in rows],
        text=[format_seconds(s) for _, s in rows], textposition="outside",
        customdata=[format_percent(s / step if step else None) for _, s in rows],
        hovertemplate="%{x}: %{text} (%{customdata} of the step)<extra></extra>",
        marker={"color": ["#1f77b4", "#9467bd", "#2ca02c", "#bcbd22", "#d62728", "#17becf", "#7f7f7f", "#8c564b"]},
        meta={"role": "breakdown"},
    ))
    fig.update_layout(title={"text": "step time breakdown"}, template="plotly_white", height=380,
                      yaxis={"title": {"text": "time (ms)"}}, showlegend=False)
    return fig


def memory_figure(result: Mapping[str, Any]) -> go.Figure:
    """Memory per GPU by stage: stacked params/grads/optimizer/activations/other (GiB), capacity as a line."""
    rows = list(result.get("memory") or [])
    x = [f"stage {r.get('stage')} (rank {r.get('rank')})" for r in rows]
    fig = go.Figure()
    for part in MEMORY_PARTS:
        values = [float(r.get(f"{part}_bytes") or 0.0) for r in rows]
        fig.add_trace(go.Bar(
            x=x, y=[v / GiB for v in values], name=part, marker={"color": MEMORY_COLORS[part]},
            customdata=[format_gib(v) for v in values],
            hovertemplate=f"%{{x}}<br>{part} %{{customdata}}<extra></extra>", meta={"role": "memory", "part": part},
        ))
    capacities = [r.get("capacity_bytes") for r in rows]
    if rows and all(c is not None for c in capacities):
        fig.add_trace(go.Scatter(
            x=x, y=[c / GiB for c in capacities], name="capacity", mode="lines+markers",
            line={"color": "#d62728", "dash": "dash", "width": 2}, marker={"symbol": "line-ew-open", "size": 14},
            hovertemplate="capacity %{y:.2f} GiB<extra></extra>", meta={"role": "capacity"},
        ))
    fig.update_layout(title={"text": "memory per GPU by pipeline stage"}, template="plotly_white", barmode="stack",
                      height=420, yaxis={"title": {"text": "GiB"}, "rangemode": "tozero"})
    return fig


def links_figure(result: Mapping[str, Any]) -> go.Figure:
    """Utilisation of the busiest links over the step (%), busiest at the top."""
    rows = sorted(result.get("links") or [], key=lambda r: float(r.get("utilization") or 0.0))
    labels = [f"{r.get('link')} ({r.get('kind')})" for r in rows]
    fig = go.Figure(go.Bar(
        orientation="h", y=labels, x=[100.0 * float(r.get("utilization") or 0.0) for r in rows],
        customdata=[[f"{r.get('src')} -> {r.get('dst')}", format_bytes(float(r.get("bytes") or 0.0))] for r in rows],
        hovertemplate="%{y}<br>%{customdata[0]}<br>%{customdata[1]} moved, %{x:.1f} % busy<extra></extra>",
        marker={"color": "#17becf"}, meta={"role": "links"},
    ))
    fig.update_layout(title={"text": "busiest links (utilisation over the step)"}, template="plotly_white",
                      height=max(260, 24 * len(rows) + 120), xaxis={"title": {"text": "utilization (%)"},
                                                                   "range": [0, 100]})
    return fig


def _metric_cards(result: Mapping[str, Any]) -> str:
    fits = result.get("fits_in_memory")
    tflops = [(k, result.get(k)) for k in ("model_tflops_per_gpu", "hardware_tflops_per_gpu")]
    items = [
        ("step time", format_seconds(result.get("step_time_s"))),
        ("tokens/s", "n/a" if result.get("tokens_per_s") is None else f"{float(result['tokens_per_s']):,.0f}"),
        *[(("model" if k.startswith("model") else "hardware") + " TFLOP/s per GPU",
           "n/a" if v is None else f"{float(v):.1f}") for k, v in tflops],
        ("MFU", format_percent(result.get("mfu"))),
        ("HFU", format_percent(result.get("hfu"))),
        ("bubble", format_percent(result.get("bubble_fraction"))),
        ("memory per GPU", format_gib(result.get("memory_per_gpu_bytes"))
         + ("" if fits is None else (" (fits)" if fits else " (does NOT fit)"))),
    ]
    return "".join(f'<div class="card"><div class="label">{html.escape(k)}</div>'
                   f'<div class="value">{html.escape(v)}</div></div>' for k, v in items)


def _layout_line(layout: Mapping[str, Any]) -> str:
    parts = [f"{key.upper()} {layout[key]}" for key in ("tp", "pp", "dp", "cp", "vpp") if key in layout]
    if "num_gpus" in layout:
        parts.append(f"{layout['num_gpus']} GPUs")
    if "num_microbatches" in layout:
        parts.append(f"{layout['num_microbatches']} micro-batches")
    if "schedule" in layout:
        parts.append(f"schedule {layout['schedule']}")
    return " · ".join(html.escape(str(p)) for p in parts)


def _collectives_table(result: Mapping[str, Any]) -> str:
    rows = result.get("collectives") or []
    if not rows:
        return ""
    head = "".join(f"<th>{c}</th>" for c in ("axis", "op", "size", "ranks", "algorithm", "protocol", "time each",
                                             "count"))
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
            r.get("axis"), r.get("op"), format_bytes(float(r.get("nbytes") or 0.0)), r.get("num_ranks"),
            algorithm_label(r), r.get("protocol"), format_seconds(r.get("time_s")), r.get("count"))) + "</tr>"
        for r in rows)
    return f'<h2>collectives per step</h2><table class="coll"><tr>{head}</tr>{body}</table>'


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{margin:0 0 4px 0;font-size:22px} h2{font-size:17px;margin:24px 0 6px 0}
.sub{color:#555;margin-bottom:12px} .note{color:#555;font-style:italic;margin:6px 0 12px 0}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:130px}
.card .label{font-size:12px;color:#666} .card .value{font-size:18px;font-weight:600}
table.coll{border-collapse:collapse;font-size:13px} table.coll td,table.coll th{border:1px solid #ddd;padding:3px 8px}
"""


def step_report_html(graph: OpGraph, trace: StepTrace, result: Mapping[str, Any]) -> str:
    """The whole report as one HTML page (plotly.js inlined once; no network access needed to view it)."""
    name = str(result.get("name") or result.get("scenario") or "training step")
    layout = result.get("layout") or {}
    figures = [timeline_figure(graph, trace), breakdown_figure(result)]
    if result.get("memory"):
        figures.append(memory_figure(result))
    if result.get("links"):
        figures.append(links_figure(result))
    divs = [fig.to_html(include_plotlyjs=(i == 0), full_html=False, config={"displaylogo": False})
            for i, fig in enumerate(figures)]
    scenario = result.get("scenario")
    sub = html.escape(str(scenario)) if scenario and scenario != name else ""
    note = html.escape(str(layout.get("note") or ""))
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(name)}</title>'
        f"<style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(name)}</h1><div class=\"sub\">{sub}</div>"
        f'<div class="cards">{_metric_cards(result)}</div>'
        f'<div class="sub">{_layout_line(layout)}</div>'
        f'<div class="note">{note}</div>'
        + "".join(divs)
        + _collectives_table(result)
        + "</body></html>"
    )
