"""`simdist calibrate` and `simdist validate`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from simdist import api
from simdist.cli import (
    JsonOption,
    _print_json,
    app,
    check_target,
    emit,
)
from simdist.errors import SimdistError

# --------------------------------------------------------------------------- calibration and validation
# (issue 5 parts 3-4: `simdist calibrate`, `simdist validate`; keep this section contiguous)
MeasurementsArgument = Annotated[list[Path] | None, typer.Argument(
    help="Measurement files: our CSV, nccl-tests output (text or -J JSON), MLP step CSVs, kernel CSVs, PyTorch "
         "profiler traces (*.pt.trace.json[.gz], one per rank, or their folder).")]
HoldoutOption = Annotated[str, typer.Option("--holdout", help=api.HOLDOUT_HELP)]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} %"


def _warn(doc: dict[str, Any]) -> None:
    """The document's warnings as ``warning: <one line>`` on stderr (stdout stays the result, or the JSON)."""
    for line in doc.get("warnings", []):
        sys.stderr.write(f"warning: {line}\n")


@app.command("calibrate")
def calibrate_cmd(
    measurements: MeasurementsArgument = None,
    topology: Annotated[str, typer.Option("--topology", help="The topology preset to calibrate.")] = "",
    out: Annotated[Path | None, typer.Option("--out", help="Write the calibration YAML here.")] = None,
    num_nodes: Annotated[int | None, typer.Option("--num-nodes", min=1, help="Nodes of the cluster.")] = None,
    holdout: Annotated[str, typer.Option("--holdout", help="Fit on part only and report the rest's error: "
                                                           + api.HOLDOUT_HELP)] = "none",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap confidence intervals.")] = 0,
    as_json: JsonOption = False,
) -> None:
    """Fit link-tier efficiencies, per-collective latency/bandwidth and compute constants to measurements."""
    if not topology:
        raise SimdistError("no topology given", field="--topology", fix="add --topology dgx-h100 (simdist topo list)")
    if out is not None:
        check_target(out, field="--out")
    if seed < 0:
        raise SimdistError(f"--seed {seed} must be at least 0", field="--seed", fix="give e.g. 0")
    doc = api.calibrate(list(measurements or []), topology, num_nodes=num_nodes, out=out, holdout=holdout, seed=seed)
    _warn(doc)
    if as_json:
        _print_json(doc)
        return
    cal = doc["calibration"]
    fit = cal.get("fit", {})
    kernels = fit.get("kernels")
    lines = [f"# calibration of {topology} from {fit.get('points', 0)} points "
             f"(MAPE {_pct(fit.get('mape_pct'))}, uncalibrated {_pct(fit.get('mape_uncalibrated_pct'))})"
             + (f" and {kernels['points']} kernels" if kernels else "")]
    for key, value in cal.get("overrides", {}).items():
        lines.append(f"  override {key}: {value}")
    for op, c in cal.get("collectives", {}).items():
        above = c.get("above_range_factor", 1.0)
        lines.append(f"  {op:<15} latency +{c['latency']}, bandwidth x {c['bandwidth_factor']:.3f}"
                     + (f", {len(c['efficiency'])} efficiency knots" if c.get("efficiency") else "")
                     + (f"; above {c['size_range'][1]}: the physical model x {above:.3f}" if c.get("size_range")
                        else ""))
    if cal.get("compute"):
        lines.append(f"  compute         {cal['compute']}")
    if kernels:
        for label, key in (("kernels", "per_kind"), (f"held-out kernels ({holdout})", "heldout_per_kind")):
            if kernels.get(key):
                lines.append(f"# {label}: " + ", ".join(
                    f"{kind} {k['points']} (MAPE {_pct(k['mape_pct'])}, "
                    f"uncalibrated {_pct(k['mape_uncalibrated_pct'])})" for kind, k in kernels[key].items()))
    if fit.get("heldout_points"):
        lines.append(f"# held out ({holdout}): {fit['heldout_points']} points, MAPE "
                     f"{_pct(fit.get('heldout_mape_pct'))}, "
                     f"uncalibrated {_pct(fit.get('heldout_mape_uncalibrated_pct'))}")
    lines.append(f"wrote {out}" if out is not None else doc["yaml"].rstrip())
    emit("\n".join(lines))


def _kernel_lines(doc: dict[str, Any]) -> list[str]:
    """The kernel part of `simdist validate`'s table (measured kernels, validation.kernels)."""
    rows = doc.get("kernel_rows")
    if not rows:
        return []
    lines = [f"# {len(rows)} kernels predicted", f"# {'kernel':<9} {'name':<22} {'m x n x k (batch)':>24} "
             f"{'measured(us)':>13} {'predicted(us)':>14} {'error':>8} {'uncalibrated(us)':>17} {'error':>8}"]
    for r in rows:
        shape = f"{r['m']}x{r['n']}x{r['k']} ({r['batch']})" if r["m"] else f"{int(r['hbm_bytes'])} B"
        lines.append(f"  {r['kernel']:<9} {r['name'][:22]:<22} {shape:>24} {r['measured_s'] * 1e6:>13.2f} "
                     f"{r['predicted_s'] * 1e6:>14.2f} {r['error_pct']:>+7.1f}% {r['uncalibrated_s'] * 1e6:>17.2f} "
                     f"{r['uncalibrated_error_pct']:>+7.1f}%")
    for label, key in (("calibrated (held-out fit)", "kernel_mape_pct"),
                       ("uncalibrated", "kernel_uncalibrated_mape_pct"),
                       ("calibration file", "kernel_calibration_file_mape_pct")):
        m = doc[key]
        per = ", ".join(f"{kind} {_pct(v)}" for kind, v in m["per_kernel"].items())
        lines.append(f"MAPE kernels {label}: {_pct(m['all'])} ({per})")
    return lines


def _trace_lines(doc: dict[str, Any]) -> list[str]:
    """`simdist validate --trace`'s table: the step side by side, then the kernel classes and the top kernels."""
    m = doc["measured"]
    lines = [f"# {doc['scenario']} against {len(doc['traces'])} trace(s) ({m['steps']} steps each"
             + (f", {doc['device']}" if doc.get("device") else "") + ")",
             f"# {'':<16} {'measured(ms)':>13} {'predicted(ms)':>14} {'error':>8}"]
    for r in doc["rows"]:
        err = "-" if r["error_pct"] is None else f"{r['error_pct']:+.1f}%"
        lines.append(f"  {r['what']:<16} {r['measured_s'] * 1e3:>13.3f} {r['predicted_s'] * 1e3:>14.3f} {err:>8}")
    by_op = ", ".join(f"{op} {m.get('comm_by_op_s', {}).get(op, 0.0) * 1e3:.3f} ms ({t * 1e3:.3f} ms exposed)"
                      for op, t in m["exposed_by_op_s"].items()) or "none"
    lines.append(f"# measured communication by op: {by_op}; kernel time by class: gemm "
                 f"{m['gemm_s'] * 1e3:.3f} ms, attention {m['attention_s'] * 1e3:.3f} ms, memory "
                 f"{m['memory_s'] * 1e3:.3f} ms")
    if doc["categories"]:
        lines.append("# kernels with known shapes, per step and rank: " + ", ".join(
            f"{k} measured {c['measured_s'] * 1e3:.3f} ms, predicted {c['predicted_s'] * 1e3:.3f} ms "
            f"({'-' if c['error_pct'] is None else format(c['error_pct'], '+.1f')}%)"
            for k, c in doc["categories"].items()))
        lines.append(f"# the {len(doc['kernels'])} of {doc['kernel_groups']} kernel groups furthest from their "
                     "prediction (per step and rank)")
        for k in doc["kernels"]:
            shape = f"{k['m']}x{k['n']}x{k['k']} ({k['batch']})" if k["m"] else f"{int(k['hbm_bytes'])} B"
            err = "-" if k["error_pct"] is None else f"{k['error_pct']:+.1f}%"
            lines.append(f"  {k['kernel']:<9} {k['name'][:30]:<30} {shape:>22} x{k['calls_per_step']:<5.3g} "
                         f"{k['measured_s'] * 1e6:>10.1f} us {k['predicted_s'] * 1e6:>10.1f} us {err:>8}")
    if doc.get("html"):
        lines.append(f"wrote {doc['html']}")
    return lines


@app.command("validate")
def validate_cmd(
    measurements: MeasurementsArgument = None,
    calibration: Annotated[Path | None, typer.Option("--calibration", help="The calibration file to check.")] = None,
    holdout: HoldoutOption = "sizes",
    html: Annotated[Path | None, typer.Option("--html", help="Write the predicted-vs-measured chart here.")] = None,
    trace: Annotated[bool, typer.Option(
        "--trace", help="The files are PyTorch profiler traces and one scenario (YAML): compare the scenario's "
                        "predicted step with the traces' measured one.")] = False,
    assignments: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a scenario field with --trace, e.g. --set parallel.dp=4.")] = None,
    as_json: JsonOption = False,
    trust_paths: Annotated[bool, typer.Option(
        "--trust-paths", help="the calibration may read the topology file it names outside its own folder")] = False,
) -> None:
    """Fit on part of the measurements, predict the rest: per-point error and MAPE, calibrated and not. With
    --trace: a scenario's predicted step beside profiler traces' measured one."""
    if trace:
        files = list(measurements or [])
        scenarios = [f for f in files if f.suffix.lower() in (".yaml", ".yml")]
        if len(scenarios) != 1:
            raise SimdistError(f"--trace needs one scenario file (.yaml) among the files, got {len(scenarios)}",
                               field="SCENARIO", fix="simdist validate --trace rank0.pt.trace.json ... scenario.yaml")
        from simdist.api.trace import validate_trace

        doc = validate_trace([f for f in files if f not in scenarios], scenarios[0], assignments=assignments,
                             calibration=calibration, html=html)
        _warn(doc)
        if as_json:
            _print_json(doc)
            return
        emit("\n".join(_trace_lines(doc)))
        return
    if assignments:
        raise SimdistError("--set applies to a scenario, given with --trace", field="--set",
                           fix="add --trace and a scenario, or drop --set")
    if calibration is None:
        raise SimdistError("no calibration given", field="--calibration",
                           fix="add --calibration cal.yaml (from simdist calibrate)")
    if html is not None:
        check_target(html, field="--html")
    doc = api.validate(list(measurements or []), calibration, holdout=holdout, html=html, trust_paths=trust_paths)
    _warn(doc)
    if as_json:
        _print_json(doc)
        return
    lines = [f"# {doc['topology']}: {doc['predicted_points']} points predicted (holdout {holdout}; fitted on "
             f"{doc['fit_points']})"]
    if doc["rows"]:
        lines.append(f"# {'op':<15} {'ranks':>5} {'size':>12} {'measured(us)':>13} {'predicted(us)':>14} {'error':>8} "
                     f"{'uncalibrated(us)':>17} {'error':>8}")
    for r in doc["rows"]:
        op = r["op"] if r.get("imbalance", 1.0) == 1.0 else f"{r['op']} x{r['imbalance']:.2f}"
        lines.append(f"  {op:<15} {r['num_ranks']:>5} {int(r['nbytes']):>12} {r['measured_s'] * 1e6:>13.2f} "
                     f"{r['predicted_s'] * 1e6:>14.2f} {r['error_pct']:>+7.1f}% {r['uncalibrated_s'] * 1e6:>17.2f} "
                     f"{r['uncalibrated_error_pct']:>+7.1f}%")
    if doc["rows"] or not doc.get("kernel_rows"):
        for label, key in (("calibrated (held-out fit)", "mape_pct"), ("uncalibrated", "uncalibrated_mape_pct"),
                           ("calibration file", "calibration_file_mape_pct")):
            m = doc[key]
            per_op = ", ".join(f"{op} {_pct(v)}" for op, v in m["per_op"].items())
            lines.append(f"MAPE {label}: {_pct(m['all'])} ({per_op})")
    lines += _kernel_lines(doc)
    if html is not None:
        lines.append(f"wrote {html}")
    emit("\n".join(lines))
