"""HTML report of a layout search: tp x pp heatmap of the best throughput, memory vs throughput with its
Pareto front, and the winner's simulated timeline (simdist.report.step_html's figures); and the comparison chart."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from simdist.plan.opgraph import OpGraph
from simdist.report.step_html import STYLE, breakdown_figure, timeline_figure

GIB = 2**30


def heatmap_figure(ranked: Sequence[Mapping[str, Any]], bounded: Sequence[Mapping[str, Any]] = ()) -> go.Figure:
    """Best tokens/s for each (tp, pp); a cell of layouts all ruled out by their bound shows the bound ("at
    most"); empty cells: no feasible layout."""
    best: dict[tuple[int, int], float] = {}
    for r in ranked:
        k = (r["layout"]["tp"], r["layout"]["pp"])
        best[k] = max(best.get(k, 0.0), r["tokens_per_s"])
    at_most: dict[tuple[int, int], float] = {}
    for r in bounded:
        k = (r["layout"]["tp"], r["layout"]["pp"])
        if k not in best:
            at_most[k] = max(at_most.get(k, 0.0), r["tokens_per_s_upper_bound"])
    cells = {**best, **at_most}
    tps = sorted({k[0] for k in cells})
    pps = sorted({k[1] for k in cells})
    z = [[cells.get((t, p)) for p in pps] for t in tps]
    text = [["at most " if (t, p) in at_most else "" for p in pps] for t in tps]
    fig = go.Figure(go.Heatmap(z=z, x=[str(p) for p in pps], y=[str(t) for t in tps], colorscale="Viridis",
                               text=text, colorbar={"title": "tokens/s"},
                               hovertemplate="tp %{y}, pp %{x}: %{text}%{z:,.0f} tokens/s"))
    fig.update_layout(title="best throughput per tp x pp (closed form)", xaxis_title="pp", yaxis_title="tp",
                      height=420)
    return fig


def pareto_front(ranked: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Layouts no other layout beats on both memory (less) and throughput (more), by increasing memory."""
    front: list[Mapping[str, Any]] = []
    best = -1.0
    for r in sorted(ranked, key=lambda r: (r["memory_per_gpu_bytes"], -r["tokens_per_s"])):
        if r["tokens_per_s"] > best:
            front.append(r)
            best = r["tokens_per_s"]
    return front


def pareto_figure(ranked: Sequence[Mapping[str, Any]]) -> go.Figure:
    fig = go.Figure()
    fig.add_trace(go.Scattergl(
        x=[r["memory_per_gpu_bytes"] / GIB for r in ranked], y=[r["tokens_per_s"] for r in ranked], mode="markers",
        name="layouts", marker={"size": 5, "opacity": 0.5}, text=[r["key"] for r in ranked],
        hovertemplate="%{text}<br>%{x:.1f} GiB, %{y:,.0f} tokens/s"))
    front = pareto_front(ranked)
    fig.add_trace(go.Scatter(
        x=[r["memory_per_gpu_bytes"] / GIB for r in front], y=[r["tokens_per_s"] for r in front],
        mode="lines+markers", name="Pareto front", line={"shape": "hv"}, text=[r["key"] for r in front],
        hovertemplate="%{text}<br>%{x:.1f} GiB, %{y:,.0f} tokens/s"))
    fig.update_layout(title="memory per GPU vs throughput", xaxis_title="GiB per GPU (peak stage)",
                      yaxis_title="tokens/s", height=460)
    return fig


def search_report_html(doc: Mapping[str, Any], *, winner_graph: OpGraph | None = None, winner_trace: Any = None,
                       winner_result: Mapping[str, Any] | None = None, table_text: str = "") -> str:
    p = doc["problem"]
    title = f"Layout search: {p['model']} on {doc['num_gpus']} GPUs of {p['cluster']}"
    figures = []
    if doc["ranked"]:
        figures += [heatmap_figure(doc["ranked"], doc.get("bounded", [])), pareto_figure(doc["ranked"])]
    if winner_graph is not None and winner_trace is not None:
        key = doc["engine"][0]["key"] if doc.get("engine") else ""
        figures.append(timeline_figure(winner_graph, winner_trace, title=f"the winner's timeline ({key}, engine)"))
        if winner_result is not None:
            figures.append(breakdown_figure(winner_result))
    divs = [fig.to_html(include_plotlyjs=(i == 0), full_html=False, config={"displaylogo": False})
            for i, fig in enumerate(figures)]
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<pre>{html.escape(table_text)}</pre>" + "".join(divs) + "</body></html>")


def compare_report_html(rows: Sequence[Mapping[str, Any]], *, table_text: str = "") -> str:
    ok = [r for r in rows if "error" not in r]
    names = [r["cluster"] for r in ok]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=names, y=[r["time_to_train_days"] for r in ok], name="days to train"))
    if any(r.get("cost_usd") is not None for r in ok):
        fig.add_trace(go.Bar(x=names, y=[(r.get("cost_usd") or 0) / 1e6 for r in ok], name="cost (M USD)",
                             yaxis="y2", offsetgroup="cost"))
        fig.update_layout(yaxis2={"title": "M USD", "overlaying": "y", "side": "right"})
    fig.update_layout(title="time (and cost) to train, best layout per cluster", yaxis_title="days",
                      barmode="group", height=460)
    return ('<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Hardware comparison</title>'
            f"<style>{STYLE}</style></head><body><h1>Hardware comparison</h1>"
            f"<pre>{html.escape(table_text)}</pre>"
            + fig.to_html(include_plotlyjs=True, full_html=False, config={"displaylogo": False}) + "</body></html>")
