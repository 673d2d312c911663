"""A simulated training step as a Chrome Trace Event file (`chrome_trace`, `write_chrome_trace`).

The format is the Trace Event Format (Google, "Trace Event Format" document, the JSON Object Format
section) that chrome://tracing and Perfetto (ui.perfetto.dev) open: ``{"traceEvents": [...],
"displayTimeUnit": "ms"}``. Mapping:

- one process per simulated rank (``pid`` = global rank), named by a ``process_name`` metadata event
  ("rank 12 (stage 1)" or a caller-given label) and sorted by rank (``process_sort_index``);
- one thread per stream (``tid`` = index in `simdist.plan.opgraph.STREAMS`: compute 0, tp 1, cp 2, pp 3,
  dp 4, ep 5; an unknown stream gets the next free tid), named by ``thread_name`` metadata;
- one complete event (``"ph": "X"``) per op, ``ts`` and ``dur`` in microseconds (the format's unit),
  with the op's kind, micro-batch, chunk and stage in ``args`` (and, for a communication op, the
  collective, its size, axis and group size);
- link utilisation as counter events (``"ph": "C"``) in an extra process named "links".

The trace is anything with ``start_s``/``end_s`` (per op id) and ``makespan_s`` (`StepTrace`), such as
simdist.engine.graph.GraphTrace; nothing here imports the engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from simdist.plan.opgraph import STREAMS, Op, OpGraph

__all__ = ["LINKS_PROCESS_NAME", "StepTrace", "chrome_trace", "stream_tid", "write_chrome_trace"]

US_PER_S = 1e6  # Trace Event Format: "ts" and "dur" are in microseconds.
LINKS_PROCESS_NAME = "links"


class StepTrace(Protocol):
    """When each op of a graph ran: ``start_s[i]``/``end_s[i]`` of op id ``i``, and the step's makespan."""

    @property
    def start_s(self) -> Sequence[float]: ...

    @property
    def end_s(self) -> Sequence[float]: ...

    @property
    def makespan_s(self) -> float: ...


def stream_tid(stream: str, extra: dict[str, int] | None = None) -> int:
    """The thread id of ``stream``: its index in STREAMS; unknown streams are numbered after them in ``extra``."""
    if stream in STREAMS:
        return STREAMS.index(stream)
    if extra is None:
        return len(STREAMS)
    return extra.setdefault(stream, len(STREAMS) + len(extra))


def _check_lengths(graph: OpGraph, trace: StepTrace) -> None:
    n = len(graph.ops)
    if len(trace.start_s) != n or len(trace.end_s) != n:
        raise ValueError(
            f"trace covers {len(trace.start_s)} starts / {len(trace.end_s)} ends but the graph has {n} ops; "
            "pass the trace simulated from this graph"
        )


def rank_stages(graph: OpGraph) -> dict[int, int]:
    """Rank -> the smallest pipeline stage among its ops (-1 when no op names a stage)."""
    out: dict[int, int] = {}
    for op in graph.ops:
        if op.stage >= 0 and (op.rank not in out or op.stage < out[op.rank]):
            out[op.rank] = op.stage
    return out


def default_rank_label(rank: int, stage: int) -> str:
    return f"rank {rank} (stage {stage})" if stage >= 0 else f"rank {rank}"


def op_args(op: Op) -> dict[str, Any]:
    """The ``args`` of an op's event: kind, micro-batch, chunk, stage; collective, size, axis, group size."""
    args: dict[str, Any] = {"kind": op.kind, "microbatch": op.microbatch, "chunk": op.chunk, "stage": op.stage}
    if op.comm is not None:
        args.update(op=op.comm.op, nbytes=float(op.comm.nbytes), axis=op.comm.axis,
                    group_size=len(op.comm.ranks))
    return args


def _metadata(name: str, pid: int, value: str | int, tid: int | None = None) -> dict[str, Any]:
    key = "sort_index" if name.endswith("sort_index") else "name"
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": {key: value}}
    if tid is not None:
        event["tid"] = tid
    return event


def _counter_points(counter: Mapping[str, Any]) -> tuple[str, list]:
    name = counter.get("name", counter.get("link"))
    points = counter.get("points", counter.get("samples"))
    if name is None or points is None:
        raise ValueError(f"a link counter needs 'name' (or 'link') and 'points' [(time_s, utilization), ...]; "
                         f"got keys {sorted(counter)}")
    return str(name), list(points)


def chrome_trace(
    graph: OpGraph,
    trace: StepTrace,
    *,
    rank_labels: dict[int, str] | None = None,
    link_counters: list[dict] | None = None,
) -> dict[str, Any]:
    """The Chrome/Perfetto trace of ``graph`` timed by ``trace`` (a JSON-able dict).

    ``rank_labels`` overrides a rank's process name; ``link_counters`` are dicts ``{"name": link,
    "points": [(time_s, utilization), ...]}`` drawn as counters (utilisation 0..1) in a "links"
    process. Ops the trace leaves unset (NaN start or end) are skipped.
    """
    _check_lengths(graph, trace)
    labels = rank_labels or {}
    stages = rank_stages(graph)
    extra: dict[str, int] = {}
    meta: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for rank in graph.ranks():
        meta.append(_metadata("process_name", rank, labels.get(rank, default_rank_label(rank, stages.get(rank, -1)))))
        meta.append(_metadata("process_sort_index", rank, rank))
    for rank, stream in sorted(graph.tracks(), key=lambda t: (t[0], stream_tid(t[1], extra))):
        tid = stream_tid(stream, extra)
        meta.append(_metadata("thread_name", rank, stream, tid))
        meta.append(_metadata("thread_sort_index", rank, tid, tid))
    starts, ends = trace.start_s, trace.end_s
    for i, op in enumerate(graph.ops):
        start, end = float(starts[i]), float(ends[i])
        if math.isnan(start) or math.isnan(end):
            continue
        events.append({
            "name": op.name, "cat": op.kind, "ph": "X", "pid": op.rank, "tid": stream_tid(op.stream, extra),
            "ts": start * US_PER_S, "dur": max(end - start, 0.0) * US_PER_S, "args": op_args(op),
        })
    if link_counters:
        # Assumption: the links process sits after every rank so it sorts last in the viewer.
        pid = (max(graph.ranks()) + 1) if graph.ops else 0
        meta.append(_metadata("process_name", pid, LINKS_PROCESS_NAME))
        meta.append(_metadata("process_sort_index", pid, pid))
        for counter in link_counters:
            name, points = _counter_points(counter)
            for time_s, utilization in points:
                events.append({"name": name, "ph": "C", "pid": pid, "ts": float(time_s) * US_PER_S,
                               "args": {"utilization": float(utilization)}})
    events.sort(key=lambda e: e["ts"])
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def write_chrome_trace(
    path: str | Path,
    graph: OpGraph,
    trace: StepTrace,
    *,
    rank_labels: dict[int, str] | None = None,
    link_counters: list[dict] | None = None,
) -> Path:
    """Write `chrome_trace` to ``path`` (strict JSON, no NaN) and return the path."""
    from simdist.files import json_text, write_text

    doc = chrome_trace(graph, trace, rank_labels=rank_labels, link_counters=link_counters)
    return write_text(path, json_text(doc, compact=True))
