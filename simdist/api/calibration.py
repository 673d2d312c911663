"""Calibration and validation (simdist calibrate, simdist validate) and how a calibration is applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simdist.errors import SpecError
from simdist.hardware import Topology
from simdist.hardware.presets import topology_document
from simdist.spec.load import read_yaml

# --------------------------------------------------------------------------- calibration and validation
# (issue 5 parts 3-4: `simdist calibrate`, `simdist validate`, `--calibration`; keep this section contiguous)
HOLDOUT_HELP = "sizes (every other size of each sweep), large (the largest third), ranks (the largest rank count), none"


def _cluster_calibration(calibration: str | Path | None, cluster: str | Path, *, field: str = "--cluster") -> Any:
    """The calibration file loaded and checked against the cluster's topology name (None: no calibration)."""
    if calibration is None:
        return None
    from simdist.calibrate.calibration import load_calibration

    cal = load_calibration(calibration)
    name = topology_document(cluster).data.get("name", str(cluster))
    cal.check_topology(str(name), field=field)
    return cal


def _scenario_calibration(path: str | Path, assignments: list[str] | None,
                          calibration: str | Path | None) -> tuple[Any, list[str]]:
    """(calibration, its overrides as ``cluster.*`` assignments) of a scenario: ``calibration`` if given, else the
    scenario's ``calibration:`` field (relative to the scenario file). The scenario's own cluster fields win."""
    doc = read_yaml(path)
    if assignments:
        doc = doc.with_assignments(assignments)
    data = doc.data
    if calibration is None and data.get("calibration"):
        calibration = Path(str(data["calibration"]))
        if not calibration.is_absolute():
            calibration = Path(path).parent / calibration
    if calibration is None:
        return None, []
    cluster = data.get("cluster") if isinstance(data.get("cluster"), dict) else {}
    target: str | Path | None = cluster.get("preset")
    if cluster.get("file"):
        target = Path(str(cluster["file"]))
        target = target if target.is_absolute() else Path(path).parent / target
    if target is None:
        return None, []  # load_scenario reports the missing cluster
    cal = _cluster_calibration(calibration, target, field="cluster.preset")
    return cal, cal.assignments("cluster", keep=cluster)


def _calibration_hooks(cal: Any, topology: Topology) -> dict[str, Any]:
    """predict_step's keyword arguments that apply a calibration."""
    if cal is None:
        return {}
    return {"compute_efficiency": cal.compute_efficiency(topology.gpu), "adjust": cal.adjust()}


def read_measurement_files(paths: list[str | Path]) -> tuple[list[Any], list[Any]]:
    """(collective measurements, MLP step measurements) of the files, each format detected."""
    import csv

    from simdist.calibrate.measurements import read_measurements
    from simdist.calibrate.steps import STEP_CSV_COLUMNS, read_step_measurements

    if not paths:
        raise SpecError("no measurement files given", field="MEASUREMENTS",
                        fix="pass our CSV, nccl-tests output (text or -J JSON) or an MLP step CSV")
    collectives: list[Any] = []
    steps: list[Any] = []
    for path in paths:
        p = Path(path)
        first = ""
        if p.is_file():
            lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
            first = next((ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")), "")
        header = {h.strip() for h in next(csv.reader([first]))} if first else set()
        if {"cut", "world_size"} <= header and set(STEP_CSV_COLUMNS) & header:
            steps += read_step_measurements(p)
        else:
            collectives += read_measurements(p)
    return collectives, steps


def calibrate(paths: list[str | Path], topology: str, *, num_nodes: int | None = None, out: str | Path | None = None,
              holdout: str = "none", seed: int = 0) -> dict[str, Any]:
    """Fit a calibration of ``topology`` to measurement files (`simdist calibrate`); write it to ``out`` (YAML).

    Returns ``{"calibration": the file's content as JSON, "yaml": its text, "out": the path or None}``.
    """
    from simdist.calibrate.calibration import fit_calibration, to_yaml

    topology_document(topology)  # an unknown preset: one clear error before reading anything
    measurements, steps = read_measurement_files(paths)
    spec = fit_calibration(measurements, topology, num_nodes=num_nodes, steps=steps, holdout=holdout, seed=seed,
                           sources=[str(p) for p in paths])
    text = to_yaml(spec)
    if out is not None:
        _write_text(Path(out), text, field="--out")
    return {"calibration": spec.model_dump(mode="json", exclude_none=True), "yaml": text,
            "out": str(out) if out is not None else None}


def _write_text(path: Path, text: str, *, field: str) -> None:
    from simdist.files import write_text

    write_text(path, text, field=field)


def _mapes(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    from simdist.calibrate.fit import mape_pct

    ops = sorted({r["op"] for r in rows})
    return {"all": mape_pct([r[key] for r in rows], [r["measured_s"] for r in rows]) if rows else None,
            "per_op": {op: mape_pct([r[key] for r in rows if r["op"] == op],
                                    [r["measured_s"] for r in rows if r["op"] == op]) for op in ops}}


def validate(paths: list[str | Path], calibration: str | Path, *, holdout: str = "sizes",
             html: str | Path | None = None) -> dict[str, Any]:
    """Fit on part of the measurements, predict the rest (`simdist validate`).

    The topology is the calibration file's. ``holdout`` (see `HOLDOUT_HELP`) selects the points to predict;
    they are predicted by a calibration fitted on the others (``predicted_s``), by the preset uncalibrated
    (``uncalibrated_s``) and by the given file (``file_s``). With ``none`` every point is predicted by the file.
    """
    import math

    from simdist.calibrate import calibration as cb
    from simdist.calibrate.fit import mape_pct

    cal = cb.load_calibration(calibration)
    measurements, _ = read_measurement_files(paths)
    if not measurements:
        raise SpecError("no collective measurements to validate", field="MEASUREMENTS",
                        fix="pass our CSV or nccl-tests output")
    name = cal.spec.topology
    points = cb.aggregate(measurements)
    train, test = cb.split_holdout(points, holdout)
    if holdout == "none":
        fitted, test = cal, points
    else:
        fitted = cb.Calibration.of(cb.fit_calibration(measurements, name, holdout=holdout))
    base = cb.build_cluster(name, points)
    tuned = cb.build_cluster(name, points, overrides=fitted.spec.overrides)
    as_file = cb.build_cluster(name, points, overrides=cal.spec.overrides)
    predicted = cb.calibrated_times(fitted, tuned, test)
    uncal = cb.predict_points(base, test)
    by_file = cb.calibrated_times(cal, as_file, test)
    rows = []
    for p, t, u, f in zip(test, predicted, uncal, by_file, strict=True):
        rows.append({"op": p.op, "num_ranks": p.num_ranks, "num_nodes": p.num_nodes, "nbytes": p.nbytes,
                     "measured_s": p.time_s, "predicted_s": float(t), "uncalibrated_s": float(u), "file_s": float(f),
                     "error_pct": 100.0 * (t - p.time_s) / p.time_s,
                     "uncalibrated_error_pct": 100.0 * (u - p.time_s) / p.time_s})
    result: dict[str, Any] = {
        "topology": name, "calibration": str(calibration), "holdout": holdout,
        "fit_points": len(train) if holdout != "none" else 0, "predicted_points": len(rows), "rows": rows,
        "mape_pct": _mapes(rows, "predicted_s"), "uncalibrated_mape_pct": _mapes(rows, "uncalibrated_s"),
        "calibration_file_mape_pct": _mapes(rows, "file_s"),
    }
    if html is not None:
        from simdist.report.validate_html import ValidateSeries, validate_figure_html

        series = []
        for key in sorted({p.series for p in points}, key=str):
            pts = sorted((p for p in points if p.series == key), key=lambda p: p.nbytes)
            lo, hi = math.log2(pts[0].nbytes), math.log2(pts[-1].nbytes)
            grid = [cb.Point(key[0], key[1], key[2], 2.0 ** (lo + (hi - lo) * i / 24), 1.0, key[3], "grid")
                    for i in range(25)]
            model = cb.predict_points(tuned, grid)
            corr, info = fitted.correction(key[0]), fitted.spec.fit.collectives.get(key[0])
            curve = cb.calibrated_times(fitted, tuned, grid)
            band_lo, band_hi = curve, curve
            if corr is not None and info is not None:
                fast = cb.Correction(info.latency_ci[0], info.bandwidth_factor_ci[1], corr.knots_log2, corr.values)
                slow = cb.Correction(info.latency_ci[1], info.bandwidth_factor_ci[0], corr.knots_log2, corr.values)
                band_lo = [fast.time_s(float(m), g.nbytes) for m, g in zip(model, grid, strict=True)]
                band_hi = [slow.time_s(float(m), g.nbytes) for m, g in zip(model, grid, strict=True)]
            held = {id(p) for p in test} if holdout != "none" else set()
            sizes = [g.nbytes for g in grid]
            series.append(ValidateSeries(
                label=f"{key[0]}, {key[1]} ranks" + (f" on {key[2]} nodes" if key[2] else ""),
                fitted=tuple((p.nbytes, p.time_s) for p in pts if id(p) not in held),
                heldout=tuple((p.nbytes, p.time_s) for p in pts if id(p) in held),
                curve=tuple(zip(sizes, map(float, curve), strict=True)),
                band_low=tuple(zip(sizes, map(float, band_lo), strict=True)),
                band_high=tuple(zip(sizes, map(float, band_hi), strict=True)),
                uncalibrated=tuple(zip(sizes, map(float, cb.predict_points(base, grid)), strict=True))))
        mape = result["mape_pct"]["all"]
        title = (f"{name}: measured vs calibrated prediction (holdout {holdout}; MAPE {mape:.1f} %, "
                 f"uncalibrated {mape_pct(uncal, [p.time_s for p in test]):.1f} %)")
        _write_text(Path(html), validate_figure_html(series, title=title), field="--html")
        result["html"] = str(html)
    return result
