"""Text tables of a layout search and a hardware comparison (rich, rendered to a string)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

GIB = 2**30
SCHEDULE_SHORT = {"1f1b": "1f1b", "interleaved_1f1b": "i1f1b", "gpipe": "gpipe", "zb_h1": "zb-h1"}
RECOMPUTE_SHORT = {"none": "-", "selective": "sel", "full": "full"}
AXIS_SHORT = {"tp": "t", "cp": "c", "ep": "e", "dp": "d", "pp": "p"}
LEGEND = ("sched i1f1b: interleaved 1F1B; rec(ompute) sel: selective, -: none; full values in --json and --html\n"
          "order: the mesh axes innermost first, by initial (t tp, c cp, e ep, d dp, p pp): tcdp is tp-cp-dp-pp")


def _table(title: str) -> Table:
    """A compact table (no vertical rules): a search's 20 columns fit 120 characters."""
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)


def _render(*items: Any) -> str:
    """``items`` as text, every cell whole: as wide as the table needs (never cut to a terminal's width), trailing
    spaces removed."""
    # file: never stdout (rich flushes its file when a capture ends: a full disk behind stdout would fail here)
    console = Console(file=io.StringIO(), width=1000, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        for item in items:
            console.print(item)
    return "\n".join(line.rstrip() for line in cap.get().split("\n"))


def short_order(order: str) -> str:
    """A mesh axis order in the table's short form: 'tp-cp-dp-pp' -> 'tcdp' (the axes' initials)."""
    return "".join(AXIS_SHORT.get(a, a) for a in order.split("-")) if order else order


def _layout_cells(layout: Mapping[str, Any]) -> list[str]:
    return [str(layout["tp"]), str(layout["pp"]), str(layout["dp"]), str(layout["cp"]), str(layout["vpp"]),
            str(layout["micro_batch_size"]), str(layout["zero_stage"]),
            RECOMPUTE_SHORT.get(layout["recompute"], layout["recompute"]),
            "yes" if layout["sequence_parallel"] else "no", SCHEDULE_SHORT.get(layout["schedule"], layout["schedule"])]


RANKED_COLUMNS = ("#", "tp", "pp", "dp", "cp", "vpp", "micro batch", "ZeRO", "recompute", "sequence parallel",
                  "schedule", "order", "ep", "etp", "step s", "tokens/s", "MFU", "GiB/GPU", "engine step s",
                  "p10-p90 s", "engine MFU")
"""The ranked table's columns with their values in full (`ranked_rows`: the HTML report's table)."""


def ranked_rows(doc: Mapping[str, Any], *, top: int = 10) -> list[list[str]]:
    """The top ``top`` ranked layouts as `RANKED_COLUMNS` cells, every value in full."""
    engine = {e["key"]: e for e in doc.get("engine", [])}
    default_order = (doc.get("placement") or {}).get("default_order", "")
    out = []
    for i, row in enumerate(doc["ranked"][:top], start=1):
        e, lay = engine.get(row["key"], {}), row["layout"]
        out.append([str(i), str(lay["tp"]), str(lay["pp"]), str(lay["dp"]), str(lay["cp"]), str(lay["vpp"]),
                    str(lay["micro_batch_size"]), str(lay["zero_stage"]), lay["recompute"],
                    "yes" if lay["sequence_parallel"] else "no", lay["schedule"],
                    lay.get("order") or default_order or "tp-cp-dp-pp", str(lay.get("ep", 1)),
                    str(lay.get("etp") or lay["tp"]), f"{row['step_time_s']:.6g}", f"{row['tokens_per_s']:,.0f}",
                    f"{row['mfu']:.2%}", f"{row['memory_per_gpu_bytes'] / GIB:.2f}",
                    f"{e['engine_step_time_s']:.6g}" if "engine_step_time_s" in e else "",
                    band_cell(e.get("step_time_band_s"), digits=4),
                    f"{e['engine_mfu']:.2%}" if "engine_mfu" in e else ""])
    return out


def search_text(doc: Mapping[str, Any], *, top: int = 10, explain_pruned: bool = False) -> str:
    """The ranked table (closed form; the engine's figures beside the re-simulated top k), compact (`LEGEND`),
    then `search_notes`."""
    p = doc["problem"]
    engine = {e["key"]: e for e in doc.get("engine", [])}
    where = doc.get("cluster_title") or f"{p['num_nodes']} x {p['cluster']}"
    table = _table(f"{p['model']} on {doc['num_gpus']} GPUs ({where}), global batch {p['global_batch_size']}")
    placement = doc.get("placement")
    default_order = placement["default_order"] if placement else ""
    orders = placement is not None or any("order" in r["layout"] for r in doc["ranked"][:top])
    experts = any("ep" in r["layout"] or "etp" in r["layout"] for r in doc["ranked"][:top])
    for name in ("#", "tp", "pp", "dp", "cp", "vpp", "mbs", "zero", "rec", "sp", "sched",
                 *(("order",) if orders else ()), *(("ep", "etp") if experts else ()), "step s", "tokens/s", "MFU",
                 "GiB", "engine s", "p10-p90 s", "eng MFU"):
        table.add_column(name, justify="left" if name in ("rec", "sched", "order") else "right")
    for i, row in enumerate(doc["ranked"][:top], start=1):
        e = engine.get(row["key"], {})
        eng_step = f"{e['engine_step_time_s']:.3f}" if "engine_step_time_s" in e else ("error" if e else "")
        eng_mfu = f"{e['engine_mfu']:.1%}" if "engine_mfu" in e else ""
        band = band_cell(e.get("step_time_band_s"))
        order = [short_order(row["layout"].get("order") or default_order) or "default"] if orders else []
        order += ([str(row["layout"].get("ep", 1)), str(row["layout"].get("etp") or row["layout"]["tp"])] if experts
                  else [])
        table.add_row(str(i), *_layout_cells(row["layout"]), *order, f"{row['step_time_s']:.3f}",
                      f"{row['tokens_per_s']:,.0f}", f"{row['mfu']:.1%}", f"{row['memory_per_gpu_bytes'] / GIB:.1f}",
                      eng_step, band, eng_mfu)
    return _render(table) + "\n".join([LEGEND, *search_notes(doc, top=top, explain_pruned=explain_pruned)]) + "\n"


def _timed(doc: Mapping[str, Any]) -> str:
    """How many closed forms the sweep timed (a results file written before these keys: unknown)."""
    if "evaluated_now" not in doc:
        return "the top and the Pareto front"
    resumed = f", {doc['resumed']} resumed" if doc.get("resumed") else ""
    return f"{doc['evaluated_now']} timed{resumed}"


def search_notes(doc: Mapping[str, Any], *, top: int = 10, explain_pruned: bool = False) -> list[str]:
    """The lines under a search's table: what was enumerated, pruned, ruled out and re-simulated, the placement."""
    placement = doc.get("placement")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(doc["pruned_counts"].items(), key=lambda kv: -kv[1])) or "none"
    lines = [
             f"{doc['candidates']} layouts enumerated, {doc['feasible']} feasible, {doc['evaluated']} reported by "
             f"the closed form ({_timed(doc)}) in {doc['sweep_s']:.2f} s on {doc['executor']}; pruned: {counts}"]
    if doc.get("bounded_count"):
        lines.append(f"{doc['bounded_count']} feasible layouts ruled out by a lower bound of their step: slower than "
                     f"#{min(len(doc['ranked']), top)} and off the memory-throughput Pareto front")
    if doc.get("engine"):
        lines.append(f"top {len(doc['engine'])} re-simulated by the engine in {doc['engine_s']:.2f} s; p10-p90: the "
                     "prediction band of the engine's step (simdist.predict.bands)")
        for e in doc["engine"]:
            if "engine_error" in e:
                lines.append(f"  {e['key']}: engine error: {e['engine_error']}")
    if placement:
        lines.append(placement_line(placement))
    if doc.get("interrupted"):
        lines.append(f"interrupted: {doc['evaluated']} of {doc['feasible']} feasible layouts evaluated")
    if explain_pruned and doc.get("pruned"):
        lines += pruned_lines(doc["pruned"])
    return lines


def band_cell(band: Mapping[str, float] | None, scale: float = 1.0, digits: int = 3) -> str:
    """A prediction band (simdist.predict.bands) as ``p10-p90`` (times ``scale``); empty without one."""
    if not band:
        return ""
    return f"{band['p10'] * scale:.{digits}f}-{band['p90'] * scale:.{digits}f}"


def placement_line(placement: Mapping[str, Any]) -> str:
    """The winner's placements (mesh axis orders): the best against the base scenario's order."""
    if "engine_gain" in placement:
        text = (f"placement (by the engine, {len(placement['orders'])} orders of the winning layout): best "
                f"{placement['order']} {placement['engine_step_time_s']:.3f} s, default {placement['default_order']} "
                f"{placement['default_engine_step_time_s']:.3f} s ({placement['engine_gain']:+.1%}); "
                f"closed form {placement['step_time_s']:.3f} s vs {placement['default_step_time_s']:.3f} s")
    else:
        text = (f"placement (by the closed form, {len(placement['orders'])} orders of the winning layout): best "
                f"{placement['order']} {placement['step_time_s']:.3f} s, default {placement['default_order']} "
                f"{placement['default_step_time_s']:.3f} s ({placement['gain']:+.1%})")
    if len(placement["orders"]) > 2 or "engine_gain" in placement:
        figure = "engine_step_time_s" if "engine_gain" in placement else "step_time_s"
        text += "; " + ", ".join(f"{o['order']} {o[figure]:.3f} s" for o in placement["orders"])
    if placement.get("note"):
        text += f" ({placement['note']})"
    return text


def pruned_lines(pruned: Sequence[Mapping[str, Any]], *, examples: int = 3) -> list[str]:
    """``--explain-pruned``: the counts by reason first (most first, with examples of each), then every layout."""
    by_rule: dict[str, list[Mapping[str, Any]]] = {}
    for p in pruned:
        by_rule.setdefault(p["rule"], []).append(p)
    lines = [f"pruned layouts: {len(pruned)}, by reason (most first):"]
    for rule, items in sorted(by_rule.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"  {rule}: {len(items)}")
        lines += [f"    e.g. {p['key']}: {p['reason']}" for p in items[:examples]]
    lines.append("each pruned layout:")
    lines += [f"  {p['key']}: {p['rule']}: {p['reason']}" for p in pruned]
    return lines


def grid_text(doc: Mapping[str, Any]) -> str:
    """The summary of a grid search: the best layout at each point (closed form; the engine's beside it)."""
    keys = list(doc["grid"])
    table = _table(f"best layout per grid point ({doc['num_points']} points over {doc['scenario']})")
    for name in (*keys, "best layout", "step s", "tokens/s", "MFU", "GiB/GPU", "engine step s", "p10-p90 s",
                 "engine MFU", "vs default order"):
        table.add_column(name, justify="left" if name in (*keys, "best layout") else "right")
    for row in doc["summary"]:
        cells = [str(row["values"][k]) for k in keys]
        if "error" in row:
            table.add_row(*cells, row["error"], *[""] * 8)
            continue
        placed = row.get("placement", {})
        gain = placed.get("engine_gain", placed.get("gain"))
        table.add_row(*cells, row["layout"], f"{row['step_time_s']:.3f}", f"{row['tokens_per_s']:,.0f}",
                      f"{row['mfu']:.1%}", f"{row['memory_per_gpu_bytes'] / GIB:.1f}",
                      f"{row['engine_step_time_s']:.3f}" if row.get("engine_step_time_s") else "",
                      band_cell(row.get("step_time_band_s")),
                      f"{row['engine_mfu']:.1%}" if row.get("engine_mfu") else "",
                      f"{gain:+.1%}" if gain is not None else "")
    tail = ""
    if doc.get("interrupted"):
        tail = f"interrupted after {len(doc['summary'])} of {doc['num_points']} grid points (shown)\n"
    return _render(table) + tail


def _mwh(kwh: float | None) -> str:
    if kwh is None:
        return "-"
    return f"{kwh / 1e3:,.1f}" if kwh >= 1e4 else f"{kwh / 1e3:.3g}"


def compare_text(rows: Sequence[Mapping[str, Any]], *, tokens: float, pue: float,
                 answer: Mapping[str, Any] | None = None) -> str:
    table = _table(f"time and cost to train {tokens:.3g} tokens")
    deadline = any("meets_deadline" in r for r in rows)
    names = ("cluster", "GPUs", "best layout", "step s", "tokens/s", "MFU", "days", "days p10-p90", "goodput",
             "days w/ failures", "GPU-hours", "energy MWh", "USD", *(("deadline",) if deadline else ()))
    for name in names:
        table.add_column(name, justify="left" if name in ("cluster", "best layout") else "right")
    for r in rows:
        if "error" in r:
            table.add_row(r["cluster"], str(r.get("num_gpus", "")), "no feasible layout", *[""] * (len(names) - 3))
            continue
        failures = r.get("time_to_train_with_failures_days")
        table.add_row(
            r["cluster"], str(r["num_gpus"]), r["layout"], f"{r['step_time_s']:.3f}", f"{r['tokens_per_s']:,.0f}",
            f"{r['mfu']:.1%}", f"{r['time_to_train_days']:.2f}", band_cell(r.get("time_to_train_days_band"), digits=2),
            f"{r['goodput']:.1%}" if r.get("goodput") is not None else "-",
            f"{failures:.2f}" if failures is not None else "-",
            f"{r['gpu_hours']:,.0f}",
            _mwh(r["energy_kwh"]),
            f"{r['cost_usd']:,.0f}" if r["cost_usd"] is not None else "-",
            *((("yes" if r.get("meets_deadline") else "no"),) if deadline else ()))
    return _render(table) + "\n".join(compare_notes(rows, pue=pue, answer=answer)) + "\n"


def compare_notes(rows: Sequence[Mapping[str, Any]], *, pue: float, answer: Mapping[str, Any] | None = None
                  ) -> list[str]:
    """The lines under a comparison's table: sizes, errors, fidelities, what energy, cost and goodput mean, the
    answer to a budget's question."""
    notes = [f"{r['cluster']}: {r['note']}" for r in rows if r.get("note")]
    notes += [f"{r.get('label', r['cluster'])}: sized by {r['sized_by']}" for r in rows if r.get("sized_by")]
    notes += [f"{r['cluster']}: {r['error']}" for r in rows if "error" in r]
    fidelities = sorted({r["fidelity"] for r in rows if "fidelity" in r})
    notes.append(f"step, tokens/s and MFU: {' and '.join(fidelities) or 'engine'} (one fidelity per row); "
                 "days p10-p90: the prediction band of the step (simdist.predict.bands), scaled to the days")
    notes.append(f"energy: GPUs at TDP for the whole run x PUE {pue:g} ({'GPUs only' if pue == 1 else 'facility'}); "
                 "cost: GPU-hours x the --price given (none: -)")
    if any(r.get("goodput") is not None for r in rows):
        notes.append("goodput: the share of the run's time spent training between failures, checkpoints and restarts "
                     "(simdist.predict.goodput); days w/ failures: days / goodput")
    if answer is not None:
        if answer.get("cluster") is None:
            notes.append(f"answer ({answer['question']}): none - {answer.get('reason', '')}")
        else:
            extra = f", {answer['cost_usd']:,.0f} USD" if answer.get("cost_usd") is not None else ""
            notes.append(f"answer ({answer['question']}): {answer['cluster']}, "
                         f"{answer['time_to_train_days']:.1f} days{extra}")
    return notes
