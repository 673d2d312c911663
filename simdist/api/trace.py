"""Profiler traces at the API: read them as measurements (`trace_measurement_kinds`, which `simdist calibrate`
uses) and compare a scenario's predicted step with the measured one (`validate_trace`, `simdist validate --trace`).

The readers are simdist.calibrate.trace_read (streamed Kineto JSON), trace_kernels (classes and measurements)
and trace_step (the measured step's breakdown).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from simdist.errors import SimdistWarning, SpecError

__all__ = ["read_traces", "trace_measurement_kinds", "validate_trace"]

TOP_KERNELS = 10
"""Kernel groups listed by `validate_trace`: those whose predicted and measured total times differ most."""


def read_traces(paths: list[str | Path]) -> list[Any]:
    """Every rank trace named (a folder: its ``*.json``/``*.json.gz``), checked to be one run's: one world size,
    no rank twice."""
    from simdist.calibrate.trace_read import read_trace, trace_files

    if not paths:
        raise SpecError("no trace files given", field="TRACE",
                        fix="pass the *.pt.trace.json(.gz) files torch.profiler wrote, one per rank, or their folder")
    traces = [read_trace(p) for p in trace_files(paths)]
    worlds = {t.world_size for t in traces if t.world_size is not None}
    if len(worlds) > 1:
        raise SpecError(f"the traces are of runs of different sizes (world sizes {sorted(worlds)})", field="TRACE",
                        fix="give the traces of one run (one file per rank)")
    seen: dict[int, str] = {}
    for t in traces:
        if t.rank is not None:
            if t.rank in seen:
                raise SpecError(f"rank {t.rank} appears twice: {seen[t.rank]} and {t.path}", field="TRACE",
                                fix="give one trace per rank of one run (a folder may hold several runs' traces)")
            seen[t.rank] = t.path
    world = next(iter(worlds), None)
    if world is not None and any(r >= world for r in seen):
        raise SpecError(f"rank {max(seen)} of a world of {world}", field="TRACE", fix="give the traces of one run")
    return traces


def trace_measurement_kinds(paths: list[str | Path]) -> tuple[list[Any], list[Any]]:
    """(collective measurements, kernel measurements) of the rank traces (simdist.calibrate.trace_kernels); what was
    left out is said as warnings."""
    from simdist.calibrate.trace_kernels import trace_measurements

    traces = read_traces(paths)
    measurements, kernels, notes = trace_measurements(traces)
    for note in notes:
        warnings.warn(SimdistWarning(f"traces: {note}"), stacklevel=2)
    if not measurements and not kernels:
        counts = ", ".join(f"{n} {cat}" for cat, n in sorted(traces[0].counts().items()))
        raise SpecError(f"{traces[0].path}: no kernel with its shapes and no collective with its size (it has "
                        f"{counts})", field="TRACE",
                        fix="profile with record_shapes=True and activities=[CPU, CUDA]")
    return measurements, kernels


def _pct(predicted: float, measured: float) -> float | None:
    return 100.0 * (predicted - measured) / measured if measured > 0 else None


def validate_trace(paths: list[str | Path], scenario: str | Path, *, assignments: list[str] | None = None,
                   calibration: str | Path | None = None, html: str | Path | None = None) -> dict[str, Any]:
    """The scenario's predicted step beside the traces' measured one (`simdist validate --trace`).

    Returns ``rows`` (step, compute, exposed communication, idle: measured, predicted, error %), ``ranks`` (each
    rank's measured breakdown), ``categories`` (per kernel class: measured time of the kernels with known shapes
    and simdist's time for the same kernels), ``kernels`` (the `TOP_KERNELS` kernel groups whose predicted and
    measured totals differ most), ``measured``/``predicted`` (the two breakdowns) and ``warnings``.
    """
    from simdist.api.calibration import _recording

    return _recording(lambda: _validate(paths, scenario, assignments or [], calibration, html))


def _validate(paths: list[str | Path], scenario: str | Path, assignments: list[str],
              calibration: str | Path | None, html: str | Path | None) -> dict[str, Any]:
    from simdist.api import run
    from simdist.calibrate.devices import same_device
    from simdist.calibrate.kernel_fit import predict_kernels
    from simdist.calibrate.trace_kernels import trace_measurements
    from simdist.calibrate.trace_step import measured_step
    from simdist.files import check_target

    if html is not None:
        check_target(html, field="--html")
    traces = read_traces(paths)
    measured, ranks = measured_step(traces)
    out = run(scenario, assignments, calibration=calibration, timeline=html is not None)
    result = out.result
    b = result["breakdown"]
    predicted = {"step_s": result["step_time_s"],
                 "compute_s": b["compute_s"] + b["recompute_s"] + b["optimizer_s"],
                 "exposed_comm_s": sum(b["exposed_comm_s"].values()),
                 "idle_s": b["idle_s"] + b["bubble_s"]}
    rows = [{"what": what, "measured_s": getattr(measured, what), "predicted_s": predicted[what],
             "error_pct": _pct(predicted[what], getattr(measured, what))}
            for what in ("step_s", "compute_s", "exposed_comm_s", "idle_s")]
    device = next((t.device for t in traces if t.device), None)
    prediction = out.prediction
    gpu = prediction.topology.gpu if prediction is not None else None
    if device and gpu is not None and same_device(device, gpu) is False:
        warnings.warn(SimdistWarning(f"the traces ran on {device}, the scenario's GPU is {gpu.name}: kernel times "
                                     "compare two GPUs"), stacklevel=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimdistWarning)  # the calibrate notes are not this command's
        _, kernels, _ = trace_measurements(traces)
    kernel_rows: list[dict[str, Any]] = []
    categories: dict[str, dict[str, float]] = {}
    if kernels and gpu is not None:
        eff = out.calibration.compute_efficiency(gpu) if out.calibration is not None else None
        times = predict_kernels(kernels, gpu, eff)
        steps = max(measured.steps, 1) * max(len(traces), 1)
        for k, t in zip(kernels, times, strict=True):
            calls = k.num_samples / steps  # calls per rank and step
            kernel_rows.append({"kernel": k.kernel, "name": k.name, "dtype": k.dtype, "m": k.m, "n": k.n, "k": k.k,
                                "batch": k.batch, "hbm_bytes": k.hbm_bytes, "calls_per_step": calls,
                                "measured_s": k.time_s, "predicted_s": float(t), "error_pct": _pct(float(t), k.time_s),
                                "difference_per_step_s": calls * (float(t) - k.time_s)})
            c = categories.setdefault(k.kernel, {"measured_s": 0.0, "predicted_s": 0.0})
            c["measured_s"] += calls * k.time_s
            c["predicted_s"] += calls * float(t)
        for c in categories.values():
            c["error_pct"] = _pct(c["predicted_s"], c["measured_s"])
        kernel_rows.sort(key=lambda r: -abs(r["difference_per_step_s"]))
    doc = {"scenario": str(scenario), "traces": [t.path for t in traces], "device": device,
           "rows": rows, "measured": measured.as_dict(), "predicted": {**predicted, "breakdown": b},
           "ranks": [r.as_dict() for r in ranks], "categories": categories,
           "kernels": kernel_rows[:TOP_KERNELS], "kernel_groups": len(kernel_rows)}
    if html is not None:
        from simdist.files import write_text
        from simdist.report.trace_html import trace_comparison_html

        measured_bars, which = _measured_bars(traces[0])
        predicted_bars, rank = _predicted_bars(prediction)
        page = trace_comparison_html(
            measured_bars, predicted_bars, title=f"{Path(str(scenario)).name}: measured and predicted step",
            measured_title=f"measured: {Path(traces[0].path).name}, {which}",
            predicted_title=f"predicted: rank {rank}" if rank is not None else "predicted (closed form: no timeline)",
            rows=rows)
        write_text(html, page, field="--html")
        doc["html"] = str(html)
    return doc


def _measured_bars(trace: Any) -> tuple[list[Any], str]:
    """One step of a rank's classified kernels as bars (the second step when there are two or more)."""
    from simdist.calibrate.trace_kernels import classify
    from simdist.report.trace_html import Bar

    windows = trace.steps
    a, b = windows[1] if len(windows) > 1 else windows[0]
    bars = []
    for c in classify(trace):
        if c.end_us > a and c.start_us < b:
            lane = "collectives" if c.kind == "collective" else "compute"
            bars.append(Bar(lane, c.kind, (max(c.start_us, a) - a) * 1e-6, (min(c.end_us, b) - a) * 1e-6, c.name))
    return bars, f"step {2 if len(windows) > 1 else 1} of {len(windows)}"


def _predicted_bars(prediction: Any) -> tuple[list[Any], int | None]:
    """The first simulated rank's ops on the predicted timeline, as bars by stream."""
    from simdist.report.trace_html import Bar

    if prediction is None or prediction.plan is None or prediction.trace is None:
        return [], None
    graph, trace = prediction.plan.graph, prediction.trace
    rank = min(op.rank for op in graph.ops)
    bars = []
    for i, op in enumerate(graph.ops):
        if op.rank != rank:
            continue
        start, end = float(trace.start_s[i]), float(trace.end_s[i])
        if end <= start:
            continue
        category = "collective" if op.comm is not None else op.kind if op.kind in ("recompute", "optimizer") \
            else "compute"
        bars.append(Bar(op.stream, category, start, end, op.name))
    return bars, rank
