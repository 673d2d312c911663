"""Terminal tables of a simulated training step (`step_tables`, `render_text`) and their number formats.

Input is the JSON-able result dict of ``simdist run`` (SI units: seconds, bytes; ``mfu``, ``hfu``,
``bubble_fraction`` and link ``utilization`` as fractions 0..1; ``*_tflops_per_gpu`` in TFLOP/s as the
key names say). Output: rich tables (metrics, time breakdown, memory per stage, busiest links) and the
same rendered as plain text, 120 columns wide.

Formats: times via simdist.units.format_time ("1.234 s", "850.2 ms"), memory in GiB (2**30 bytes, as
HBM is sized), bandwidth in GB/s (1e9 bytes/s, the nccl-tests convention), fractions as "57.1 %".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from io import StringIO
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from simdist.report.band_line import band_line
from simdist.units import GiB, format_bandwidth, format_bytes, format_time

__all__ = [
    "BREAKDOWN_ROWS",
    "MEMORY_PARTS",
    "breakdown_rows",
    "format_gib",
    "format_percent",
    "format_seconds",
    "placement_line",
    "render_text",
    "split_line",
    "step_tables",
    "variability_line",
]

TEXT_WIDTH = 120
MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "other")
BREAKDOWN_ROWS = (
    ("compute", ("compute_s",)),
    ("recompute", ("recompute_s",)),
    ("exposed comm tp", ("exposed_comm_s", "tp")),
    ("exposed comm cp", ("exposed_comm_s", "cp")),
    ("exposed comm pp", ("exposed_comm_s", "pp")),
    ("exposed comm dp", ("exposed_comm_s", "dp")),
    ("exposed comm ep", ("exposed_comm_s", "ep")),
    ("exposed comm etp", ("exposed_comm_s", "etp")),
    ("exposed comm edp", ("exposed_comm_s", "edp")),
    ("bubble", ("bubble_s",)),
    ("optimizer", ("optimizer_s",)),
)
NA = "n/a"
_EXPERT_AXES = ("ep", "etp", "edp")


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def format_percent(fraction: float | None, digits: int = 1) -> str:
    """0.5712 -> '57.1 %'."""
    return NA if _missing(fraction) else f"{100.0 * float(fraction):.{digits}f} %"  # type: ignore[arg-type]


def format_gib(nbytes: float | None) -> str:
    """85899345920 -> '80.00 GiB' (GiB = 2**30 bytes)."""
    return NA if _missing(nbytes) else f"{float(nbytes) / GiB:.2f} GiB"  # type: ignore[arg-type]


def format_seconds(seconds: float | None) -> str:
    """0.8502 -> '850.2 ms' (simdist.units.format_time)."""
    if _missing(seconds):
        return NA
    return "0 s" if seconds == 0 else format_time(float(seconds))  # type: ignore[arg-type]


def _number(value: float | None, fmt: str, unit: str) -> str:
    return NA if _missing(value) else f"{float(value):{fmt}} {unit}"  # type: ignore[arg-type]


def _yes_no(value: object) -> str:
    return NA if value is None else ("yes" if value else "NO")


def breakdown_rows(result: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(component, seconds) of ``result['breakdown']`` in BREAKDOWN_ROWS order (a missing one is 0; the expert
    axes' rows only where the breakdown has them: simdist.report.step_metrics.exposed_comm)."""
    breakdown = result.get("breakdown") or {}
    rows = []
    for label, path in BREAKDOWN_ROWS:
        if path[-1] in _EXPERT_AXES and path[-1] not in (breakdown.get("exposed_comm_s") or {}):
            continue
        value: Any = breakdown
        for key in path:
            value = value.get(key, 0.0) if isinstance(value, Mapping) else 0.0
        rows.append((label, float(value or 0.0)))
    return rows


def metrics_table(result: Mapping[str, Any]) -> Table:
    fits = result.get("fits_in_memory")
    table = Table(title="step metrics", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("step time", format_seconds(result.get("step_time_s")))
    band = result.get("step_time_band_s")
    if band:
        table.add_row("step time band p10 / p50 / p90",
                      " / ".join(format_seconds(band[k]) for k in ("p10", "p50", "p90")))
    table.add_row("tokens/s", _number(result.get("tokens_per_s"), ",.0f", "tokens/s"))
    table.add_row("model TFLOP/s per GPU", _number(result.get("model_tflops_per_gpu"), ".1f", "TFLOP/s"))
    table.add_row("hardware TFLOP/s per GPU", _number(result.get("hardware_tflops_per_gpu"), ".1f", "TFLOP/s"))
    table.add_row("MFU", format_percent(result.get("mfu")))
    if result.get("mfu_full_attention") not in (None, result.get("mfu")):
        table.add_row("MFU (every attention score)", format_percent(result.get("mfu_full_attention")))
    if "hfu" in result:
        table.add_row("HFU", format_percent(result.get("hfu")))
    table.add_row("pipeline bubble", format_percent(result.get("bubble_fraction")))
    table.add_row("memory per GPU", format_gib(result.get("memory_per_gpu_bytes")))
    table.add_row("fits in memory", _yes_no(fits))
    good = result.get("goodput")
    if good:
        table.add_row("goodput (failures, checkpoints)", format_percent(good.get("fraction")))
    return table


def breakdown_table(result: Mapping[str, Any]) -> Table:
    step = result.get("step_time_s")
    table = Table(title="step time breakdown", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("component")
    table.add_column("time", justify="right")
    table.add_column("of step", justify="right")
    for label, seconds in breakdown_rows(result):
        share = seconds / step if not _missing(step) and step > 0 else None  # type: ignore[operator]
        table.add_row(label, format_seconds(seconds), format_percent(share))
    return table


def memory_table(result: Mapping[str, Any]) -> Table:
    table = Table(title="memory per GPU by pipeline stage", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("stage", "rank", *MEMORY_PARTS, "total", "capacity", "fits"):
        table.add_column(col, justify="left" if col == "fits" else "right")
    for row in result.get("memory") or []:
        parts = [format_gib(row.get(f"{part}_bytes")) for part in MEMORY_PARTS]
        table.add_row(str(row.get("stage", NA)), str(row.get("rank", NA)), *parts, format_gib(row.get("total_bytes")),
                      format_gib(row.get("capacity_bytes")), _yes_no(row.get("fits")))
    return table


def links_table(result: Mapping[str, Any]) -> Table:
    """Busiest links: traffic over the step, its average rate (bytes / step time) and utilisation."""
    step = result.get("step_time_s")
    table = Table(title="busiest links", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("link", "kind", "src -> dst", "traffic", "avg rate", "utilization"):
        table.add_column(col, justify="right" if col in ("traffic", "avg rate", "utilization") else "left")
    for row in sorted(result.get("links") or [], key=lambda r: -float(r.get("utilization") or 0.0)):
        nbytes = row.get("bytes")
        rate = nbytes / step if not _missing(nbytes) and not _missing(step) and step > 0 else None
        route = f"{row.get('src', NA)} -> {row.get('dst', NA)}"
        table.add_row(str(row.get("link", NA)), str(row.get("kind", NA)), route,
                      NA if _missing(nbytes) else format_bytes(nbytes), NA if rate is None else format_bandwidth(rate),
                      format_percent(row.get("utilization")))
    return table


def collectives_table(result: Mapping[str, Any]) -> Table:
    table = Table(title="collectives per step", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("axis", "op", "size", "ranks", "algorithm", "protocol", "time each", "count"):
        table.add_column(col, justify="right" if col in ("size", "ranks", "time each", "count") else "left")
    for row in result.get("collectives") or []:
        table.add_row(str(row.get("axis", NA)), str(row.get("op", NA)),
                      NA if _missing(row.get("nbytes")) else format_bytes(row["nbytes"]),
                      str(row.get("num_ranks", NA)), algorithm_label(row), str(row.get("protocol", NA)),
                      format_seconds(row.get("time_s")), str(row.get("count", NA)))
    return table


def algorithm_label(row: Mapping[str, Any]) -> str:
    """A collectives row's algorithm, with the kernel that runs it where it is not NCCL's: "direct (hybridep)"."""
    kernel = row.get("kernel")
    algorithm = str(row.get("algorithm", NA))
    return algorithm if kernel in (None, "nccl") else f"{algorithm} ({kernel})"


def _runs(values: list[int]) -> str:
    """[7, 8, 8, 8, 7] -> '7, 8 x 3, 7'."""
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        out.append(f"{values[i]} x {j - i + 1}" if j > i else str(values[i]))
        i = j + 1
    return ", ".join(out)


def split_line(result: Mapping[str, Any]) -> str:
    """The pipeline's layer split in one line: how it was chosen, layers per stage, Megatron-LM's layout string."""
    layout = result.get("layout") or {}
    stages = layout.get("layers_per_stage")
    if not stages or (len(stages) < 2 and layout.get("vpp", 1) == 1):
        return ""
    text = f"pipeline split: {layout.get('pipeline_split') or 'given'}; layers per stage {_runs(list(stages))}"
    if layout.get("pipeline_layout"):
        text += f"; layout {layout['pipeline_layout']}"
    return text


def placement_line(result: Mapping[str, Any]) -> str:
    """A job on part of the cluster: the GPUs it uses and those left idle (empty for a whole-cluster job)."""
    layout = result.get("layout") or {}
    idle = layout.get("idle_gpus") or 0
    if not idle:
        return ""
    where = layout.get("placement") or {}
    return (f"partial job: {layout.get('num_gpus')} of the cluster's {layout.get('cluster_gpus')} GPUs "
            f"({where.get('num_nodes')} node(s) x {where.get('gpus_per_node')} GPUs), {idle} GPUs idle")


def variability_line(result: Mapping[str, Any]) -> str:
    """The spread of the GPUs' speeds (cluster.gpu_speed_cv: simdist.hardware.variability), empty where they are
    identical."""
    v = result.get("gpu_variability")
    if not v:
        return ""
    line = (f"GPU speed spread (gpu_speed_cv {v['gpu_speed_cv']:g}): the slowest of {v['num_gpus']} GPUs sets the "
            f"pace, compute x {v['factor']:.4f}")
    if v["reference_gpus"] > 1:
        line += (f" ({v['slowest_of_job']:.4f} / {v['slowest_of_reference']:.4f}: the compute constants hold the "
                 f"slowest of {v['reference_gpus']})")
    if v.get("stage_pace", 1.0) < 1.0:
        line += f"; its pipeline is paced by its heaviest stage: x {v['stage_pace']:.4f} of that"
    return line


def step_tables(result: Mapping[str, Any]) -> list[Table]:
    """Metrics, breakdown, memory per stage and busiest links (and collectives when the result lists any)."""
    tables = [metrics_table(result), breakdown_table(result), memory_table(result), links_table(result)]
    if result.get("collectives"):
        tables.append(collectives_table(result))
    return tables


def fault_lines(faults: Mapping[str, Any] | None) -> list[str]:
    """The what-ifs of a run (simdist.predict.faults: its ``faults``): the stragglers, degraded links, and who
    waited for whom at the data-parallel collectives."""
    if not faults:
        return []
    lines = []
    for st in faults.get("stragglers", []):
        lines.append(f"straggler: rank {st['rank']} (stage {st['stage']}, replica {st['dp']}) computes "
                     f"{st['compute_time_factor']:.3g} x slower")
    for d in faults.get("degraded_links", []):
        lines.append(f"degraded link: {d['src']} -> {d['dst']} at {d['bandwidth_fraction']:.3g} of its bandwidth")
    for h in faults.get("heterogeneous_nodes", []):
        lines.append(f"nodes {', '.join(map(str, h['nodes']))}: {h['gpu']} GPUs (their ranks are listed as stragglers "
                     "with the kernel model's time factor)")
    for d in faults.get("failed_links", []):
        lines.append(f"failed link: {d['src']} - {d['dst']} (ECMP routes around it)")
    for w in faults.get("waits", [])[:8]:
        lines.append(f"rank {w['rank']} (stage {w['stage']}, replica {w['dp']}) waited {w['wait_s'] * 1e3:.3f} ms at "
                     f"data-parallel collectives for rank(s) {', '.join(map(str, w['waits_for'][:4]))}")
    if faults.get("seen_by"):
        lines.append(f"faults seen by the {faults['seen_by']}")
    return lines


def render_text(result: Mapping[str, Any]) -> str:
    """`step_tables` as plain text (no colour codes), 120 columns wide: the step's name, the tables, the layout note."""
    buf = StringIO()
    # force_jupyter=False: inside a notebook kernel rich would otherwise display the tables as HTML as well.
    console = Console(file=buf, force_jupyter=False, width=TEXT_WIDTH, color_system=None, force_terminal=False,
                      record=False, highlight=False, emoji=False)
    console.print(str(result.get("name") or result.get("scenario") or "training step"), markup=False)
    for line in (placement_line(result), split_line(result)):
        if line:
            console.print(line, markup=False)
    spread = variability_line(result)
    if spread:
        console.print(spread, markup=False, soft_wrap=True)  # one line, however long
    for table in step_tables(result):
        console.print(table)
    band = band_line(result.get("step_time_band_sources"))
    if band:
        console.print(band, markup=False, soft_wrap=True)  # one line, however long
    note = (result.get("layout") or {}).get("note")
    if note:
        console.print(note, markup=False)
    for line in fault_lines(result.get("faults")):
        console.print(line, markup=False)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"
