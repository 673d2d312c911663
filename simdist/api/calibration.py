"""Calibration and validation (simdist calibrate, simdist validate) and how a calibration is applied."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simdist.errors import SimdistNote, SimdistWarning, SpecError
from simdist.hardware import Topology
from simdist.hardware.presets import topology_document
from simdist.spec.load import Document

# --------------------------------------------------------------------------- calibration and validation
# (issue 5 parts 3-4: `simdist calibrate`, `simdist validate`, `--calibration`; keep this section contiguous)
HOLDOUT_HELP = "sizes (every other size of each sweep), large (the largest third), ranks (the largest rank count), none"


def names_a_file(topology: str) -> bool:
    """Whether a calibration's ``topology`` names a topology file (a path) rather than a preset."""
    return topology.endswith((".yaml", ".yml")) or "/" in topology or "\\" in topology


def calibration_topology(cal: Any, *, trust: bool = False) -> str:
    """The topology a calibration was fitted for: a preset name, or the file it names resolved relative to the
    calibration file, inside its folder unless ``trust`` (simdist.api.provenance.confined_path: a calibration from
    elsewhere must not make simdist read any file here), and reported."""
    from simdist.api.provenance import confined_path

    if not names_a_file(cal.spec.topology):
        return cal.spec.topology
    return str(confined_path(cal.spec.topology, Path(cal.source), kind="calibration", field="topology",
                             trust=trust))


def _cluster_calibration(calibration: str | Path | None, cluster: str | Path, *, field: str = "--cluster",
                         trust: bool = False) -> Any:
    """The calibration file loaded and checked against the cluster's topology name (an error) and GPU (a
    `SimdistWarning` naming both); None: no calibration. A calibration of a topology file fits the cluster of that
    very file; another file is read (`calibration_topology`: confined unless ``trust``) and compared by name."""
    if calibration is None:
        return None
    from simdist.calibrate.calibration import load_calibration

    cal = load_calibration(calibration)
    data = topology_document(cluster).data
    fitted = None
    if names_a_file(cal.spec.topology):
        own = Path(cal.spec.topology)
        own = own if own.is_absolute() else Path(cal.source).parent / own
        if not (names_a_file(str(cluster)) and own.resolve() == Path(cluster).resolve()):
            fitted = str(topology_document(calibration_topology(cal, trust=trust)).data.get("name", own.stem))
        else:
            fitted = str(data.get("name", str(cluster)))
    cal.check_topology(str(data.get("name", str(cluster))), field=field, gpu=_gpu_of(data), fitted=fitted)
    return cal


def _gpu_of(topology_data: dict[str, Any]) -> Any:
    """The GpuSpec a topology document names (a preset or inline), or None when it cannot be read here."""
    from simdist.errors import SimdistError
    from simdist.hardware.gpus import gpu_preset
    from simdist.spec.gpu import GpuSpec

    gpu = topology_data.get("gpu")
    try:
        return gpu_preset(gpu) if isinstance(gpu, str) else GpuSpec.model_validate(gpu) if gpu else None
    except (SimdistError, ValueError):
        return None  # the topology's own loading reports a bad GPU


def _recording(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()``'s document with the `SimdistWarning`s raised meanwhile as ``warnings`` (each once, in order); notes
    (`SimdistNote`: a file read, a line dropped) pass on as they came."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SimdistWarning)
        doc = fn()
    doubts = [w for w in caught if issubclass(w.category, SimdistWarning) and not issubclass(w.category, SimdistNote)]
    lines = [" ".join(str(w.message).split()) for w in doubts]
    for w in caught:  # anything else (notes: a file read) is passed on as it came
        if not any(w is d for d in doubts):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    doc["warnings"] = list(dict.fromkeys(lines))
    return doc


def _scenario_calibration(doc: Document, base_dir: Path, calibration: str | Path | None, *, trust: bool = False
                          ) -> tuple[Any, list[str]]:
    """(calibration, its overrides as ``cluster.*`` assignments) of a scenario (``doc``, its overrides applied):
    ``calibration`` if given, else the scenario's ``calibration:`` field (relative to ``base_dir``, the scenario
    file's folder). The scenario's own cluster fields win."""
    data = doc.data if isinstance(doc.data, dict) else {}
    if calibration is None and data.get("calibration"):
        calibration = Path(str(data["calibration"]))
        if not calibration.is_absolute():
            calibration = base_dir / calibration
    if calibration is None:
        return None, []
    cluster = data.get("cluster") if isinstance(data.get("cluster"), dict) else {}
    target: str | Path | None = cluster.get("preset")
    if cluster.get("file"):
        target = Path(str(cluster["file"]))
        target = target if target.is_absolute() else base_dir / target
    if target is None:
        return None, []  # scenario_of reports the missing cluster
    cal = _cluster_calibration(calibration, target, field="cluster.preset", trust=trust)
    return cal, cal.assignments("cluster", keep=cluster)


def _calibration_hooks(cal: Any, topology: Topology) -> dict[str, Any]:
    """predict_step's keyword arguments that apply a calibration."""
    if cal is None:
        return {}
    from simdist.predict.band_ranges import calibrated_ranges

    return {"compute_efficiency": cal.compute_efficiency(topology.gpu), "adjust": cal.adjust(),
            "band_ranges": calibrated_ranges(cal.spec, cal.source)}


def read_measurement_files(paths: list[str | Path]) -> tuple[list[Any], list[Any]]:
    """(collective measurements, MLP step measurements) of the files, each format detected (kernel CSVs:
    `read_measurement_kinds`)."""
    collectives, steps, _ = read_measurement_kinds(paths)
    return collectives, steps


def read_measurement_kinds(paths: list[str | Path]) -> tuple[list[Any], list[Any], list[Any]]:
    """(collective measurements, MLP step measurements, kernel measurements) of the files, each format detected:
    PyTorch profiler traces (and folders of them) by their content (simdist.api.trace), a kernel CSV
    (simdist.calibrate.kernels) and a step CSV by their header, everything else as
    simdist.calibrate.measurements.read_measurements detects it."""
    import csv

    from simdist.calibrate.kernels import looks_like_kernel_csv, read_kernel_measurements
    from simdist.calibrate.measurements import read_measurements
    from simdist.calibrate.steps import STEP_CSV_COLUMNS, read_step_measurements

    if not paths:
        raise SpecError("no measurement files given", field="MEASUREMENTS",
                        fix="pass our CSV, nccl-tests output (text or -J JSON), an MLP step CSV, a kernel CSV or "
                            "PyTorch profiler traces")
    from simdist.calibrate.trace_read import looks_like_trace
    from simdist.files import read_text

    collectives: list[Any] = []
    steps: list[Any] = []
    kernels: list[Any] = []
    traces = [p for p in paths if Path(p).is_dir() or looks_like_trace(p)]
    if traces:  # every rank's trace together: a collective's time is its shortest over ranks
        from simdist.api.trace import trace_measurement_kinds

        collectives, kernels = trace_measurement_kinds(traces)
    for path in paths:
        if path in traces:
            continue
        p = Path(path)
        first = ""
        if p.is_file():
            lines = read_text(p, errors="replace").splitlines()  # bounded (INPUT_BYTES): a 1 GB file is refused
            first = next((ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")), "")
        header = {h.strip() for h in next(csv.reader([first]))} if first else set()
        if looks_like_kernel_csv(header):
            kernels += read_kernel_measurements(p)
        elif {"cut", "world_size"} <= header and set(STEP_CSV_COLUMNS) & header:
            steps += read_step_measurements(p)
        else:
            collectives += read_measurements(p)
    return collectives, steps, kernels


def calibrate(paths: list[str | Path], topology: str, *, num_nodes: int | None = None, out: str | Path | None = None,
              holdout: str = "none", seed: int = 0) -> dict[str, Any]:
    """Fit a calibration of ``topology`` to measurement files (`simdist calibrate`); write it to ``out`` (YAML).

    Returns ``{"calibration": the file's content as JSON, "yaml": its text, "out": the path or None,
    "warnings": [one line each: few points, measurements of another GPU, ...]}``.
    """
    from simdist.calibrate.calibration import fit_calibration, to_yaml

    topology_document(topology)  # an unknown preset: one clear error before reading anything

    def run() -> dict[str, Any]:
        measurements, steps, kernels = read_measurement_kinds(paths)
        spec = fit_calibration(measurements, topology, num_nodes=num_nodes, steps=steps, holdout=holdout, seed=seed,
                               sources=[str(p) for p in paths], kernels=kernels)
        if out is not None and names_a_file(topology):  # read relative to the calibration (calibration_topology)
            spec = spec.model_copy(update={"topology": os.path.relpath(Path(topology).resolve(),
                                                                       Path(out).resolve().parent)})
        text = to_yaml(spec)
        if out is not None:
            _write_text(Path(out), text, field="--out")
        return {"calibration": spec.model_dump(mode="json", exclude_none=True), "yaml": text,
                "out": str(out) if out is not None else None}

    return _recording(run)


def _write_text(path: Path, text: str, *, field: str) -> None:
    from simdist.files import write_text

    write_text(path, text, field=field)


def _mapes(rows: list[dict[str, Any]], key: str, by: str = "op") -> dict[str, Any]:
    from simdist.calibrate.fit import mape_pct

    ops = sorted({r[by] for r in rows})
    return {"all": mape_pct([r[key] for r in rows], [r["measured_s"] for r in rows]) if rows else None,
            f"per_{by}": {op: mape_pct([r[key] for r in rows if r[by] == op],
                                       [r["measured_s"] for r in rows if r[by] == op]) for op in ops}}


def validate(paths: list[str | Path], calibration: str | Path, *, holdout: str = "sizes",
             html: str | Path | None = None, trust_paths: bool = False) -> dict[str, Any]:
    """Fit on part of the measurements, predict the rest (`simdist validate`).

    The topology is the calibration file's. ``holdout`` (see `HOLDOUT_HELP`) selects the points to predict;
    they are predicted by a calibration fitted on the others (``predicted_s``), by the preset uncalibrated
    (``uncalibrated_s``) and by the given file (``file_s``). With ``none`` every point is predicted by the file.
    ``warnings`` says what the figures cannot vouch for: a calibrated prediction worse than the uncalibrated one
    on the held-out points, points above the fitted sizes, measurements of another GPU than the calibration's
    or the topology's, too few points.

    Kernel CSVs (``python -m validation.kernels``) are validated alike: the held-out kernels
    (simdist.calibrate.kernel_fit.split_kernel_holdout) predicted by compute constants fitted on the others, by the
    GPU's defaults and by the file: ``kernel_rows`` (kernel, name, shape, measured_s, predicted_s, uncalibrated_s,
    file_s, errors) and ``kernel_mape_pct`` / ``kernel_uncalibrated_mape_pct`` / ``kernel_calibration_file_mape_pct``
    (``all`` and ``per_kernel``). Collective rows carry ``imbalance`` (1 for an even all_to_all).
    """
    return _recording(lambda: _validate(paths, calibration, holdout=holdout, html=html, trust=trust_paths))


def _validate(paths: list[str | Path], calibration: str | Path, *, holdout: str, html: str | Path | None,
              trust: bool = False) -> dict[str, Any]:
    from simdist.calibrate import calibration as cb

    cal = cb.load_calibration(calibration)
    measurements, _, kernels = read_measurement_kinds(paths)
    if not measurements and not kernels:
        raise SpecError("no collective or kernel measurements to validate", field="MEASUREMENTS",
                        fix="pass our CSV, nccl-tests output or a kernel CSV (python -m validation.kernels)")
    name = calibration_topology(cal, trust=trust)  # a file it names: beside it, unless --trust-paths
    points = cb.aggregate(measurements)
    train, test = cb.split_holdout(points, holdout) if points else ([], [])
    base = cb.build_cluster(name, points)
    device = cb.measured_device([*measurements, *kernels])
    line = _device_mismatch(device, cal.spec.gpu, str(calibration)) or cb.check_device(device, base)
    if line is not None:
        warnings.warn(SimdistWarning(line), stacklevel=2)
    kernel_part = _validate_kernels(kernels, cal, base.gpu, holdout) if kernels else {}
    if not points:
        empty = _mapes([], "predicted_s")
        return {"topology": name, "calibration": str(calibration), "holdout": holdout, "fit_points": 0,
                "predicted_points": 0, "rows": [], "mape_pct": empty, "uncalibrated_mape_pct": empty,
                "calibration_file_mape_pct": empty, **kernel_part}
    if holdout == "none":
        fitted, test = cal, points
    else:
        fitted = cb.Calibration.of(cb.fit_calibration(measurements, name, holdout=holdout))
    tuned = cb.build_cluster(name, points, overrides=fitted.spec.overrides)
    as_file = cb.build_cluster(name, points, overrides=cal.spec.overrides)
    predicted = cb.calibrated_times(fitted, tuned, test)
    uncal = cb.predict_points(base, test)
    by_file = cb.calibrated_times(cal, as_file, test)
    rows = []
    for p, t, u, f in zip(test, predicted, uncal, by_file, strict=True):
        rows.append({"op": p.op, "num_ranks": p.num_ranks, "num_nodes": p.num_nodes, "nbytes": p.nbytes,
                     "imbalance": p.imbalance,
                     "measured_s": p.time_s, "predicted_s": float(t), "uncalibrated_s": float(u), "file_s": float(f),
                     "error_pct": 100.0 * (t - p.time_s) / p.time_s,
                     "uncalibrated_error_pct": 100.0 * (u - p.time_s) / p.time_s})
    result: dict[str, Any] = {
        "topology": name, "calibration": str(calibration), "holdout": holdout,
        "fit_points": len(train) if holdout != "none" else 0, "predicted_points": len(rows), "rows": rows,
        "mape_pct": _mapes(rows, "predicted_s"), "uncalibrated_mape_pct": _mapes(rows, "uncalibrated_s"),
        "calibration_file_mape_pct": _mapes(rows, "file_s"), **kernel_part,
    }
    _warn_if_worse(result, holdout)
    if html is not None:
        from simdist.report.validate_html import validate_figure_html

        series = _chart_series(cb, points, test if holdout != "none" else [], fitted, tuned, base)
        mape, unc = result["mape_pct"]["all"], result["uncalibrated_mape_pct"]["all"]
        title = (f"{name}: measured vs calibrated prediction (holdout {holdout}; MAPE {mape:.1f} %, "
                 f"uncalibrated {unc:.1f} %)")
        _write_text(Path(html), validate_figure_html(series, title=title), field="--html")
        result["html"] = str(html)
    return result


def _validate_kernels(kernels: list[Any], cal: Any, gpu: Any, holdout: str) -> dict[str, Any]:
    """The kernel part of `validate`: the held-out kernels predicted by constants fitted on the others, by the GPU's
    defaults and by the file (``kernel_rows``, ``kernel_mape_pct``, ...)."""
    from simdist.calibrate.kernel_fit import efficiency_of, fit_kernels, predict_kernels, split_kernel_holdout

    if holdout == "none":
        fitted, test = cal.spec.compute, list(kernels)
    else:
        _, test = split_kernel_holdout(kernels, holdout)
        fitted = fit_kernels(kernels, gpu, holdout=holdout)[0] if test else None
        if not test:
            warnings.warn(SimdistWarning(f"--holdout {holdout} holds no kernel out (kernels have no rank count, and "
                                         "kinds of fewer than 4 sizes keep every size): no kernel is predicted; use "
                                         "--holdout sizes or large"), stacklevel=3)
    predicted = predict_kernels(test, gpu, efficiency_of(gpu, fitted))
    uncal = predict_kernels(test, gpu)
    by_file = predict_kernels(test, gpu, efficiency_of(gpu, cal.spec.compute))
    rows = []
    for r, t, u, f in zip(test, predicted, uncal, by_file, strict=True):
        rows.append({"kernel": r.kernel, "name": r.name, "dtype": r.dtype, "m": r.m, "n": r.n, "k": r.k,
                     "batch": r.batch, "flops": r.flops, "hbm_bytes": r.hbm_bytes, "measured_s": r.time_s,
                     "predicted_s": float(t), "uncalibrated_s": float(u), "file_s": float(f),
                     "error_pct": 100.0 * (t - r.time_s) / r.time_s,
                     "uncalibrated_error_pct": 100.0 * (u - r.time_s) / r.time_s})
    return {"kernel_rows": rows, "kernel_mape_pct": _mapes(rows, "predicted_s", "kernel"),
            "kernel_uncalibrated_mape_pct": _mapes(rows, "uncalibrated_s", "kernel"),
            "kernel_calibration_file_mape_pct": _mapes(rows, "file_s", "kernel")}


def _device_mismatch(measured: str | None, fitted_on: str | None, source: str) -> str | None:
    """A warning line when measurements of one GPU are validated against a calibration fitted on another."""
    from simdist.calibrate.devices import device_family

    if not measured or not fitted_on:
        return None
    mine, theirs = device_family(measured), device_family(fitted_on)
    if mine is None or theirs is None or mine[0] == theirs[0]:
        return None
    return (f"the measurements ran on {measured}, but calibration {source} was fitted on {fitted_on}: its figures "
            "describe the other GPU")


def _warn_if_worse(result: dict[str, Any], holdout: str) -> None:
    """A `SimdistWarning` when the calibrated prediction misses the held-out points by more than the preset."""
    if holdout == "none" or not result["rows"]:
        return
    cal, unc = result["mape_pct"], result["uncalibrated_mape_pct"]
    worse = [op for op, v in cal["per_op"].items() if v > unc["per_op"][op]]
    if cal["all"] > unc["all"] or worse:
        ops = ", ".join(f"{op} {cal['per_op'][op]:.1f} % vs {unc['per_op'][op]:.1f} %" for op in worse)
        warnings.warn(SimdistWarning(
            f"on the {len(result['rows'])} held-out points (--holdout {holdout}) the calibrated prediction is worse "
            f"than the uncalibrated preset" + (f" for {ops}" if ops else "") +
            f" (all: MAPE {cal['all']:.1f} % vs {unc['all']:.1f} %): measure over the range you predict, or use the "
            "preset"), stacklevel=3)


def _chart_series(cb: Any, points: list[Any], held_out: list[Any], fitted: Any, tuned: Any, base: Any) -> list[Any]:
    """One `ValidateSeries` per measured sweep: points, the calibrated curve and its fit band, the preset."""
    import dataclasses
    import math

    from simdist.report.validate_html import ValidateSeries

    held = {id(p) for p in held_out}
    series = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimdistWarning)  # the curve spans the measured sizes; rows already warned
        for key in sorted({p.series for p in points}, key=str):
            pts = sorted((p for p in points if p.series == key), key=lambda p: p.nbytes)
            lo, hi = math.log2(pts[0].nbytes), math.log2(pts[-1].nbytes)
            grid = [cb.Point(key[0], key[1], key[2], 2.0 ** (lo + (hi - lo) * i / 24), 1.0, key[3], "grid",
                             imbalance=key[4]) for i in range(25)]
            model = cb.predict_points(tuned, grid)
            corr, info = fitted.correction(key[0]), fitted.spec.fit.collectives.get(key[0])
            curve = cb.calibrated_times(fitted, tuned, grid)
            band_lo, band_hi = curve, curve
            if corr is not None and info is not None:
                def moved(latency: float, factor: float, c: Any = corr) -> Any:
                    shift = latency - c.latency_s
                    return dataclasses.replace(c, latency_s=latency, bandwidth_factor=factor,
                                               latency_by_ranks=tuple((n, max(0.0, v + shift))
                                                                      for n, v in c.latency_by_ranks))
                fast = moved(info.latency_ci[0], info.bandwidth_factor_ci[1])
                slow = moved(info.latency_ci[1], info.bandwidth_factor_ci[0])
                band_lo = [fast.time_s(float(m), g.nbytes, g.num_ranks) for m, g in zip(model, grid, strict=True)]
                band_hi = [slow.time_s(float(m), g.nbytes, g.num_ranks) for m, g in zip(model, grid, strict=True)]
            sizes = [g.nbytes for g in grid]
            series.append(ValidateSeries(
                label=f"{key[0]}, {key[1]} ranks" + (f" on {key[2]} nodes" if key[2] else "")
                + (f", imbalance {key[4]:g}" if key[4] != 1.0 else ""),
                fitted=tuple((p.nbytes, p.time_s) for p in pts if id(p) not in held),
                heldout=tuple((p.nbytes, p.time_s) for p in pts if id(p) in held),
                curve=tuple(zip(sizes, map(float, curve), strict=True)),
                band_low=tuple(zip(sizes, map(float, band_lo), strict=True)),
                band_high=tuple(zip(sizes, map(float, band_hi), strict=True)),
                uncalibrated=tuple(zip(sizes, map(float, cb.predict_points(base, grid)), strict=True))))
    return series
