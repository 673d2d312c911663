"""A pipeline timeline as a text grid: rows are stages, columns time slots (`simdist schedule`).

Cells read ``F3`` (forward of micro-batch 3), ``B3`` (backward; input gradient only under zb_h1), ``W3``
(weight gradient), with the model chunk as a suffix when a stage holds several (``F3.1``), and ``.`` where
the stage's compute stream is idle. A step lasting several slots fills several cells. The slot is the
shortest compute op, so a uniform pipeline without p2p time lands exactly on the grid; other timelines are
rounded to the nearest slot.
"""

from __future__ import annotations

from simdist.engine.graph import GraphTrace
from simdist.plan.opgraph import OpGraph

__all__ = ["schedule_grid_text"]

KIND_LETTERS = {"forward": "F", "backward": "B", "weight_grad": "W"}
IDLE = "."


def _label(kind: str, microbatch: int, chunk: int, chunked: bool) -> str:
    text = f"{KIND_LETTERS.get(kind, kind[:1].upper())}{microbatch}"
    return f"{text}.{chunk}" if chunked else text


def schedule_grid_text(graph: OpGraph, trace: GraphTrace, *, slot_s: float | None = None,
                       stream: str = "compute") -> str:
    """The grid of ``stream`` ops per rank (one row per rank, labelled by its pipeline stage)."""
    ids = [i for i, op in enumerate(graph.ops) if op.stream == stream]
    if not ids:
        return "(no ops)"
    if slot_s is None:
        positive = [graph.ops[i].duration_s for i in ids if graph.ops[i].duration_s > 0]
        slot_s = min(positive) if positive else 1.0
    chunked = any(graph.ops[i].chunk > 0 for i in ids)
    ranks = sorted({graph.ops[i].rank for i in ids})
    row_of = {rank: n for n, rank in enumerate(ranks)}
    width = round(trace.makespan_s / slot_s)
    cells = [[IDLE] * width for _ in ranks]
    for i in ids:
        op = graph.ops[i]
        first, last = round(trace.start_s[i] / slot_s), round(trace.end_s[i] / slot_s)
        label = _label(op.kind, op.microbatch, op.chunk, chunked)
        row = cells[row_of[op.rank]]
        for col in range(first, min(last, width)):
            row[col] = label
    cell = max(len(c) for row in cells for c in row)
    names = [f"stage {graph.ops[next(i for i in ids if graph.ops[i].rank == r)].stage}" for r in ranks]
    name_width = max(len(n) for n in names)
    lines = [f"{'':<{name_width}}  slot = {slot_s:g} s, {width} slots, makespan {trace.makespan_s:g} s"]
    for name, row in zip(names, cells, strict=True):
        lines.append(f"{name:<{name_width}}  " + " ".join(f"{c:<{cell}}" for c in row).rstrip())
    return "\n".join(lines)
