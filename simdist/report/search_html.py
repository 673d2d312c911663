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


def heatmap_figure(ranked: Sequence[Mapping[str, Any]], bounded: Sequence[Mapping[str, Any]] = (),
                   infeasible: Mapping[str, str] | None = None) -> go.Figure:
    """Best tokens/s for each (tp, pp); a cell of layouts all ruled out by their bound shows the bound ("at
    most"); a cell with no feasible layout is grey and says why (``infeasible``: "tp,pp" -> the reason that
    pruned most of its layouts, `infeasible_cells`)."""
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
    why = {tuple(int(v) for v in k.split(",")): reason for k, reason in (infeasible or {}).items()}
    why = {k: v for k, v in why.items() if k not in cells}
    tps = sorted({k[0] for k in cells} | {k[0] for k in why})
    pps = sorted({k[1] for k in cells} | {k[1] for k in why})
    z = [[cells.get((t, p)) for p in pps] for t in tps]
    text = [["at most " if (t, p) in at_most else "" for p in pps] for t in tps]
    fig = go.Figure(go.Heatmap(z=z, x=[str(p) for p in pps], y=[str(t) for t in tps], colorscale="Viridis",
                               text=text, colorbar={"title": "tokens/s"},
                               hovertemplate="tp %{y}, pp %{x}: %{text}%{z:,.0f} tokens/s<extra></extra>"))
    if why:  # the infeasible cells: grey, labelled with their reason
        grey = [[1 if (t, p) in why else None for p in pps] for t in tps]
        label = [[why.get((t, p), "") for p in pps] for t in tps]
        fig.add_trace(go.Heatmap(z=grey, x=[str(p) for p in pps], y=[str(t) for t in tps], showscale=False,
                                 colorscale=[[0, "#d9d9d9"], [1, "#d9d9d9"]], text=label, texttemplate="%{text}",
                                 hovertemplate="tp %{y}, pp %{x}: no feasible layout (%{text})<extra></extra>"))
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
                       winner_result: Mapping[str, Any] | None = None) -> str:
    p = doc["problem"]
    title = f"Layout search: {p['model']} on {doc['num_gpus']} GPUs of {doc.get('cluster_title') or p['cluster']}"
    figures = []
    if doc["ranked"]:
        figures += [heatmap_figure(doc["ranked"], doc.get("bounded", []), doc.get("infeasible_cells")),
                    pareto_figure(doc["ranked"])]
    if winner_graph is not None and winner_trace is not None:
        key = doc["engine"][0]["key"] if doc.get("engine") else ""
        figures.append(timeline_figure(winner_graph, winner_trace, title=f"the winner's timeline ({key}, engine)"))
        if winner_result is not None:
            figures.append(breakdown_figure(winner_result))
    divs = [fig.to_html(include_plotlyjs=(i == 0), full_html=False, config={"displaylogo": False})
            for i, fig in enumerate(figures)]
    from simdist.report.search_table import RANKED_COLUMNS, ranked_rows, search_notes

    notes = "\n".join(search_notes(doc, top=max(len(doc["ranked"]), 1)))
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            + html_table(RANKED_COLUMNS, ranked_rows(doc, top=len(doc["ranked"])))
            + f"<pre>{html.escape(notes)}</pre>" + "".join(divs) + "</body></html>")


def html_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A real HTML table (every value whole, selectable, sortable by a reader's tools)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table class="coll"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def days_band_error_y(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The days' prediction band (``time_to_train_days_band``: p10, p90) of compare rows as plotly's asymmetric
    error bars; None unless every row has one."""
    bands = [r.get("time_to_train_days_band") for r in rows]
    if not rows or not all(bands):
        return None
    return {"type": "data", "symmetric": False, "color": "black", "thickness": 1.5,
            "array": [b["p90"] - r["time_to_train_days"] for b, r in zip(bands, rows, strict=True)],
            "arrayminus": [r["time_to_train_days"] - b["p10"] for b, r in zip(bands, rows, strict=True)]}


def compare_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Days, cost and energy to train, side by side: one panel (and its own axis) each, every bar labelled; the
    days carry their prediction band (p10-p90) as an error bar."""
    from plotly.subplots import make_subplots

    ok = [r for r in rows if "error" not in r]
    names = [r.get("label") or f"{r['cluster']} x {r['num_gpus']}" for r in ok]
    panels = [("days to train", "days", [r["time_to_train_days"] for r in ok], "{:.1f}")]
    if any(r.get("cost_usd") is not None for r in ok):
        panels.append(("cost (M USD)", "M USD", [(r["cost_usd"] / 1e6 if r.get("cost_usd") is not None else None)
                                                  for r in ok], "{:.2f}"))
    if any(r.get("energy_kwh") is not None for r in ok):
        panels.append(("energy (MWh)", "MWh", [(r["energy_kwh"] / 1e3 if r.get("energy_kwh") is not None else None)
                                                for r in ok], "{:,.0f}"))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels], horizontal_spacing=0.08)
    for i, (name, unit, values, fmt) in enumerate(panels, start=1):
        fig.add_trace(go.Bar(x=names, y=[v if v is not None else 0 for v in values], name=name, showlegend=False,
                             text=[fmt.format(v) if v is not None else "n/a" for v in values], textposition="outside",
                             error_y=days_band_error_y(ok) if i == 1 else None,
                             hovertemplate="%{x}: %{y:,.3g} " + unit + "<extra></extra>"), row=1, col=i)
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=1, col=i)
    fig.update_layout(title="time, cost and energy to train, best layout per cluster", height=480,
                      width=max(720, 360 * len(panels)), template="plotly_white")
    return fig


COMPARE_COLUMNS = ("cluster", "GPUs", "best layout", "step s", "tokens/s", "MFU", "days", "days p10-p90", "goodput",
                   "days with failures", "GPU-hours", "energy kWh", "USD", "note")


def compare_rows_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """A comparison's rows as a real HTML table, every value whole."""
    cells = []
    for r in rows:
        if "error" in r:
            cells.append([r["cluster"], str(r.get("num_gpus", "")), "", *[""] * 10, r["error"]])
            continue
        band = r.get("time_to_train_days_band")
        failures = r.get("time_to_train_with_failures_days")
        cells.append([r["cluster"], str(r["num_gpus"]), r["layout"], f"{r['step_time_s']:.6g}",
                      f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.2%}", f"{r['time_to_train_days']:.4g}",
                      f"{band['p10']:.4g}-{band['p90']:.4g}" if band else "",
                      f"{r['goodput']:.2%}" if r.get("goodput") is not None else "",
                      f"{failures:.4g}" if failures is not None else "", f"{r['gpu_hours']:,.0f}",
                      f"{r['energy_kwh']:,.0f}" if r.get("energy_kwh") is not None else "",
                      f"{r['cost_usd']:,.0f}" if r.get("cost_usd") is not None else "", r.get("note") or ""])
    return html_table(COMPARE_COLUMNS, cells)


def compare_report_html(rows: Sequence[Mapping[str, Any]], *, notes: Sequence[str] = ()) -> str:
    """The comparison as HTML: its table (real HTML), its ``notes`` (simdist.report.search_table.compare_notes) and
    the figure."""
    fig = compare_figure(rows)
    return ('<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Hardware comparison</title>'
            f"<style>{STYLE}</style></head><body><h1>Hardware comparison</h1>"
            + compare_rows_html(rows) + f"<pre>{html.escape(chr(10).join(notes))}</pre>"
            + fig.to_html(include_plotlyjs=True, full_html=False, config={"displaylogo": False}) + "</body></html>")
