"""Text tables of a layout search and a hardware comparison (rich, rendered to a string)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

GIB = 2**30


def _render(*items: Any, width: int = 160) -> str:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        for item in items:
            console.print(item)
    return cap.get()


def _layout_cells(layout: Mapping[str, Any]) -> list[str]:
    return [str(layout["tp"]), str(layout["pp"]), str(layout["dp"]), str(layout["cp"]), str(layout["vpp"]),
            str(layout["micro_batch_size"]), str(layout["zero_stage"]), layout["recompute"],
            "yes" if layout["sequence_parallel"] else "no", layout["schedule"]]


def search_text(doc: Mapping[str, Any], *, top: int = 10, explain_pruned: bool = False) -> str:
    """The ranked table (closed form; the engine's figures beside the re-simulated top k)."""
    p = doc["problem"]
    engine = {e["key"]: e for e in doc.get("engine", [])}
    table = Table(title=f"{p['model']} on {doc['num_gpus']} GPUs ({p['num_nodes']} x {p['cluster']}), global batch "
                        f"{p['global_batch_size']}", title_justify="left")
    for name in ("#", "tp", "pp", "dp", "cp", "vpp", "mbs", "zero", "recompute", "sp", "schedule", "step s",
                 "tokens/s", "MFU", "GiB/GPU", "engine step s", "engine MFU"):
        table.add_column(name, justify="left" if name in ("recompute", "schedule") else "right")
    for i, row in enumerate(doc["ranked"][:top], start=1):
        e = engine.get(row["key"], {})
        eng_step = f"{e['engine_step_time_s']:.3f}" if "engine_step_time_s" in e else ("error" if e else "")
        eng_mfu = f"{e['engine_mfu']:.1%}" if "engine_mfu" in e else ""
        table.add_row(str(i), *_layout_cells(row["layout"]), f"{row['step_time_s']:.3f}",
                      f"{row['tokens_per_s']:,.0f}", f"{row['mfu']:.1%}", f"{row['memory_per_gpu_bytes'] / GIB:.1f}",
                      eng_step, eng_mfu)
    counts = ", ".join(f"{k} {v}" for k, v in doc["pruned_counts"].items()) or "none"
    lines = [f"{doc['candidates']} layouts enumerated, {doc['feasible']} feasible, {doc['evaluated']} evaluated by "
             f"the closed form in {doc['sweep_s']:.2f} s on {doc['executor']}; pruned: {counts}"]
    if doc.get("bounded_count"):
        lines.append(f"{doc['bounded_count']} feasible layouts ruled out by a lower bound of their step: slower than "
                     f"#{min(len(doc['ranked']), top)} and off the memory-throughput Pareto front")
    if doc.get("engine"):
        lines.append(f"top {len(doc['engine'])} re-simulated by the engine in {doc['engine_s']:.2f} s")
        for e in doc["engine"]:
            if "engine_error" in e:
                lines.append(f"  {e['key']}: engine error: {e['engine_error']}")
    if doc.get("interrupted"):
        lines.append(f"interrupted: {doc['evaluated']} of {doc['feasible']} feasible layouts evaluated")
    if explain_pruned and doc.get("pruned"):
        lines.append("pruned layouts:")
        lines += [f"  {p['key']}: {p['rule']}: {p['reason']}" for p in doc["pruned"]]
    return _render(table) + "\n".join(lines) + "\n"


def compare_text(rows: Sequence[Mapping[str, Any]], *, tokens: float, pue: float) -> str:
    table = Table(title=f"time and cost to train {tokens:.3g} tokens", title_justify="left")
    for name in ("cluster", "GPUs", "best layout", "step s", "tokens/s", "MFU", "days", "GPU-hours", "energy MWh",
                 "USD"):
        table.add_column(name, justify="left" if name in ("cluster", "best layout") else "right")
    for r in rows:
        if "error" in r:
            table.add_row(r["cluster"], str(r.get("num_gpus", "")), "no feasible layout", "", "", "", "", "", "", "")
            continue
        table.add_row(
            r["cluster"], str(r["num_gpus"]), r["layout"], f"{r['step_time_s']:.3f}", f"{r['tokens_per_s']:,.0f}",
            f"{r['mfu']:.1%}", f"{r['time_to_train_days']:.2f}", f"{r['gpu_hours']:,.0f}",
            f"{r['energy_kwh'] / 1e3:,.1f}" if r["energy_kwh"] is not None else "-",
            f"{r['cost_usd']:,.0f}" if r["cost_usd"] is not None else "-")
    notes = [f"{r['cluster']}: {r['note']}" for r in rows if r.get("note")]
    notes += [f"{r['cluster']}: {r['error']}" for r in rows if "error" in r]
    notes.append(f"energy: GPUs at TDP for the whole run x PUE {pue:g} ({'GPUs only' if pue == 1 else 'facility'}); "
                 "cost: GPU-hours x the --price given (none: -)")
    return _render(table) + "\n".join(notes) + "\n"
