"""Close the calibration loop on this machine: measure, fit, predict held-out points, report the error.

Usage (one command; issue 5 item 5)::

    python -m validation.loop --backend gloo --ranks 2,4 --out-dir out/ [--quick]

Steps, each reusing the harness and the library (no copies):

1. **Measure** per rank count: the collective sweep (`validation.collectives.benchmark`; default ops
   all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, send_recv) and the CS336 MLP's cuts with
   gradient checks against the single-process reference (`validation.mlp.harness.run_steps`).
2. **Fit** `simdist calibrate` of ``--topology`` (default ``cpu-loopback``, topologies/cpu-loopback.yaml) on
   part of the points: every other size of each sweep is held out (`simdist.calibrate.calibration.split_holdout`,
   ``sizes``); the compute constants come from the ``single`` MLP steps.
3. **Validate** `simdist validate`: the held-out sizes are predicted by that calibration, by the preset
   uncalibrated, and the error is printed per op (MAPE); with several rank counts, also the largest rank count
   predicted from a fit on the others (``ranks``).

Writes ``collectives.csv`` and ``steps.csv`` (measurements, ``#`` metadata: command, torch version, CPU, load),
``calibration.yaml`` (fitted with the ``sizes`` hold-out; its ``fit`` block carries the held-out MAPE),
``validation.md`` (conditions, machine, per-point table, MAPE per op, gradient checks, step times) and
``validation.html`` (measured points, predicted curve and band, held-out sizes). Every file is written whole
or not at all (a temporary file, then a rename); the reports only once the fit and the validation succeeded.
Exit status: 0, 1 when a gradient check fails (the files are still written), 2 for bad input or a failed run
(one ``error:`` line).

``--quick``: a small sweep (1K:1M:x4, 2 warm-up + 5 timed iterations) and a small MLP (width 256, batch 32,
3 timed steps): seconds on two cores, what tests/test_validation_loop.py runs.
"""

from __future__ import annotations

import argparse
import datetime
import math
import shlex
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simdist import api
from simdist.calibrate.measurements import Measurement, write_measurements_csv, write_text_atomic
from simdist.calibrate.steps import StepMeasurement, write_step_measurements_csv
from simdist.files import check_target
from simdist.hardware.presets import topology_document
from simdist.units import parse_size_list
from validation.collectives import BENCH_OPS, BenchConfig, benchmark, parse_sizes
from validation.harness_cli import HarnessParser, cli_guard
from validation.mlp.harness import ALL_CUTS, CheckResult, StepConfig, run_steps
from validation.mlp.model import MLPConfig
from validation.spawn import HarnessError

__all__ = ["LOOP_OPS", "LoopConfig", "Measured", "Outcome", "fit_and_report", "main", "measure"]

LOOP_OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
GRAD_TOLERANCE = 1e-5  # relative, as python -m validation.mlp --check (issue 5 item 2)


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """What to measure: rank counts, the collective sweep and the MLP shape."""

    ranks: tuple[int, ...]
    backend: str = "gloo"
    topology: str = "cpu-loopback"
    ops: tuple[str, ...] = LOOP_OPS
    sizes: tuple[int, ...] = tuple(int(s) for s in parse_size_list("1K:16M:x4"))
    warmup: int = 5
    iters: int = 20
    mlp: MLPConfig = field(default_factory=lambda: MLPConfig(num_layers=4, width=1024, batch=128))
    mlp_warmup: int = 2
    mlp_iters: int = 10
    timeout_s: float = 600.0
    command: str = "python -m validation.loop"


@dataclass(frozen=True, slots=True)
class Measured:
    """Everything measured: collective rows, MLP step rows, gradient checks (per rank count), metadata."""

    collectives: tuple[Measurement, ...]
    steps: tuple[StepMeasurement, ...]
    checks: tuple[tuple[int, CheckResult], ...]
    metadata: dict[str, str]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The validation documents (`simdist.api.validate`) by hold-out, and the calibration's fit block."""

    validations: dict[str, dict[str, Any]]
    calibration: dict[str, Any]
    files: dict[str, Path]
    checks_ok: bool


def measure(config: LoopConfig, partial_dir: Path | None = None) -> Measured:
    """Run the collective sweep and the MLP cuts on every rank count of ``config`` (spawned gloo/NCCL ranks).

    A failed run raises `HarnessError`; with ``partial_dir``, what was measured before it (earlier rank counts
    and the sizes or cuts the failed run finished) is first kept in ``collectives.partial.csv`` and
    ``steps.partial.csv`` there (validation.spawn.partial_path).
    """
    rows: list[Measurement] = []
    steps: list[StepMeasurement] = []
    checks: list[tuple[int, CheckResult]] = []
    meta: dict[str, str] = {}
    bench = BenchConfig(ops=config.ops, sizes=config.sizes, warmup=config.warmup, iters=config.iters,
                        backend=config.backend, command=config.command)
    step_config = StepConfig(mlp=config.mlp, cuts=ALL_CUTS, backend=config.backend, warmup=config.mlp_warmup,
                             iters=config.mlp_iters, num_microbatches=0, check=True, command=config.command)
    coll_out = partial_dir / "collectives.csv" if partial_dir is not None else None
    steps_out = partial_dir / "steps.csv" if partial_dir is not None else None
    for n in config.ranks:
        try:
            got, _, run_meta = benchmark(bench, n, timeout_s=config.timeout_s, partial=coll_out)
        except HarnessError as exc:
            raise _kept(exc, rows, steps, meta, coll_out, steps_out, coll_items=exc.items) from None
        rows += got
        meta = meta or dict(run_meta)
        micro = min(config.mlp.batch, 2 * n)  # as python -m validation.mlp: 2 micro-batches per stage
        try:
            cut_rows, cut_checks, _ = run_steps(_with_micro(step_config, micro), n, timeout_s=config.timeout_s,
                                                partial=steps_out)
        except HarnessError as exc:
            raise _kept(exc, rows, steps, meta, coll_out, steps_out, step_items=exc.items) from None
        steps += cut_rows
        checks += [(n, c) for c in cut_checks]
    meta.update(world_size=",".join(map(str, config.ranks)), command=config.command)
    return Measured(tuple(rows), tuple(steps), tuple(checks), meta)


def _kept(exc: HarnessError, rows: list[Measurement], steps: list[StepMeasurement], meta: dict[str, str],
          coll_out: Path | None, steps_out: Path | None, *, coll_items: Sequence[Any] = (),
          step_items: Sequence[Any] = ()) -> HarnessError:
    """The failure, with the measurements taken before it kept beside the outputs (when a folder is given)."""
    from validation.collectives import keep_partial as keep_collectives
    from validation.mlp.harness import keep_partial as keep_steps

    if coll_out is None or steps_out is None:
        return exc
    coll_out.parent.mkdir(parents=True, exist_ok=True)
    head = [("meta", meta)] if meta else []
    notes = [keep_collectives([*head, *(("row", r, []) for r in rows), *coll_items], str(exc), coll_out)]
    if steps or step_items:
        notes.append(keep_steps([*head, *(("row", s) for s in steps), *step_items], str(exc), steps_out))
    return HarnessError(f"{exc}; {'; '.join(notes)}")


def _with_micro(config: StepConfig, micro: int) -> StepConfig:
    from dataclasses import replace

    return replace(config, num_microbatches=micro)


def fit_and_report(measured: Measured, out_dir: Path, config: LoopConfig) -> Outcome:
    """Write the measurements, fit on part of them, validate on the rest, write the report (see module doc)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {name: out_dir / name for name in ("collectives.csv", "steps.csv", "calibration.yaml",
                                               "validation.md", "validation.html")}
    write_measurements_csv(list(measured.collectives), files["collectives.csv"], metadata=measured.metadata)
    write_step_measurements_csv(list(measured.steps), files["steps.csv"], metadata=measured.metadata)
    paths: list[str | Path] = [files["collectives.csv"], files["steps.csv"]]
    # The report files are staged under hidden names and renamed at the end: all appear, or none.
    stage = {k: out_dir / f".{k}.loop-stage" for k in ("calibration.yaml", "validation.html")}
    try:
        cal = api.calibrate(paths, config.topology, holdout="sizes", out=stage["calibration.yaml"])
        validations = {"sizes": api.validate(paths, stage["calibration.yaml"], holdout="sizes",
                                             html=stage["validation.html"])}
        if len(set(config.ranks)) > 1:
            validations["ranks"] = api.validate(paths, stage["calibration.yaml"], holdout="ranks")
        checks_ok = all(c.grad_rel_err <= GRAD_TOLERANCE for _, c in measured.checks)
        report = report_markdown(measured, validations, cal["calibration"], config, checks_ok)
        for key, path in stage.items():
            path.replace(files[key])
        write_text_atomic(files["validation.md"], report)
    finally:
        for path in stage.values():
            path.unlink(missing_ok=True)
    return Outcome(validations, cal["calibration"], files, checks_ok)


# --------------------------------------------------------------------------- the report
def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f}"


def _size(nbytes: float) -> str:
    for unit, scale in (("M", 2**20), ("K", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{int(nbytes // scale)}{unit}"
    return f"{int(nbytes)}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.1f} %"


def median_abs_error(rows: Sequence[dict[str, Any]], key: str = "error_pct") -> float | None:
    """Median |error| in percent of validation rows: robust to the odd scheduler stall, unlike the mean."""
    return statistics.median(abs(r[key]) for r in rows) if rows else None


def mape_lines(validation: dict[str, Any]) -> list[str]:
    """``op: calibrated X %, uncalibrated Y %`` per op, then all ops (what the loop prints)."""
    cal, unc = validation["mape_pct"], validation["uncalibrated_mape_pct"]
    lines = [f"  {op:16s} held-out MAPE {_pct(v):>9}   uncalibrated {_pct(unc['per_op'][op]):>9}"
             for op, v in cal["per_op"].items()]
    return [*lines, f"  {'all ops':16s} held-out MAPE {_pct(cal['all']):>9}   uncalibrated {_pct(unc['all']):>9}"]


def report_markdown(measured: Measured, validations: dict[str, dict[str, Any]], calibration: dict[str, Any],
                    config: LoopConfig, checks_ok: bool) -> str:
    """The validation report: conditions, machine, held-out table and MAPE per op, gradient checks, steps."""
    meta = measured.metadata
    fit = calibration.get("fit", {})
    compute, compute_fit = calibration.get("compute") or {}, fit.get("compute") or {}
    out = [f"# Validation: {config.backend} on {config.topology}, measured on this machine", "",
           f"Generated by `{config.command}` on {datetime.date.today().isoformat()}.", "",
           "## Conditions", "",
           "| | |", "|---|---|"]
    keys = ("date_utc", "cpu_model", "cpu_count", "load_average_1m", "torch_version", "python", "backend",
            "launcher", "host_count", "gpu", "nccl_version")
    out += [f"| {k} | {meta[k]} |" for k in keys if k in meta]
    out += [f"| ranks | {', '.join(map(str, config.ranks))} (processes on one host) |",
            f"| collectives | {', '.join(config.ops)}; sizes {', '.join(_size(s) for s in config.sizes)}; "
            f"{config.warmup} warm-up + {config.iters} timed iterations, time = median over iterations of the "
            "max over ranks |",
            f"| MLP | {config.mlp.num_layers} layers, width {config.mlp.width}, batch {config.mlp.batch}, fp32; "
            f"{config.mlp_warmup} warm-up + {config.mlp_iters} timed steps; cuts {', '.join(ALL_CUTS)} |", ""]
    for holdout, doc in validations.items():
        what = ("every other size of each sweep held out; fit on the rest" if holdout == "sizes" else
                "the largest rank count held out; fit on the others")
        out += [f"## Held-out prediction: {holdout} ({what})", "",
                f"{doc['fit_points']} points fitted, {doc['predicted_points']} predicted.", "",
                "| op | ranks | size | measured (us) | predicted (us) | error | uncalibrated (us) | error |",
                "|---|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['op']} | {r['num_ranks']} | {_size(r['nbytes'])} | {_us(r['measured_s'])} | "
                f"{_us(r['predicted_s'])} | {r['error_pct']:+.1f} % | {_us(r['uncalibrated_s'])} | "
                f"{r['uncalibrated_error_pct']:+.1f} % |" for r in doc["rows"]]
        out += ["", "| op | held-out MAPE, calibrated | uncalibrated preset | median abs error, calibrated | "
                "uncalibrated |", "|---|---:|---:|---:|---:|"]
        cal, unc = doc["mape_pct"], doc["uncalibrated_mape_pct"]
        for op, v in cal["per_op"].items():
            mine = [r for r in doc["rows"] if r["op"] == op]
            out.append(f"| {op} | {_pct(v)} | {_pct(unc['per_op'][op])} | {_pct(median_abs_error(mine))} | "
                       f"{_pct(median_abs_error(mine, 'uncalibrated_error_pct'))} |")
        out += [f"| **all** | **{_pct(cal['all'])}** | **{_pct(unc['all'])}** | "
                f"**{_pct(median_abs_error(doc['rows']))}** | "
                f"**{_pct(median_abs_error(doc['rows'], 'uncalibrated_error_pct'))}** |", ""]
        if doc.get("warnings"):
            out += ["Warnings of `simdist validate`:", "", *(f"- {w}" for w in doc["warnings"]), ""]
    out += ["## Compute (MLP `single` cut)", "",
            f"gemm_peak_efficiency {compute.get('gemm_peak_efficiency', 'n/a')} "
            f"(95 % CI {compute_fit.get('gemm_peak_efficiency_ci', 'n/a')}), launch overhead "
            f"{compute.get('launch_overhead', 'n/a')}; step MAPE {_pct(compute_fit.get('mape_pct'))}, "
            f"uncalibrated {_pct(compute_fit.get('mape_uncalibrated_pct'))}.", "",
            "## MLP gradient checks (against the single-process reference, relative tolerance "
            f"{GRAD_TOLERANCE:g})", "", "| ranks | cut | grad max abs diff | relative | result |",
            "|---:|---|---:|---:|---|"]
    out += [f"| {n} | {c.cut} | {c.grad_abs_err:.2e} | {c.grad_rel_err:.2e} | "
            f"{'ok' if c.grad_rel_err <= GRAD_TOLERANCE else 'FAILED'} |" for n, c in measured.checks]
    out += ["", f"All checks {'passed' if checks_ok else 'did NOT pass'}.", "", "## MLP step times", "",
            "| ranks | cut | micro-batches | step (ms, median of max over ranks) | mean (ms) |",
            "|---:|---|---:|---:|---:|"]
    out += [f"| {s.world_size} | {s.cut} | {s.num_microbatches} | {s.time_s * 1e3:.2f} | {s.time_mean_s * 1e3:.2f} |"
            for s in measured.steps]
    out += ["", "Files: `collectives.csv`, `steps.csv` (measurements with their `#` metadata), `calibration.yaml` "
            "(fitted on the non-held-out sizes), `validation.html` (measured points, calibrated curve and band).",
            "Noise: ranks share the host's cores with each other and with anything else running (load average "
            "above); held-out errors of a few tens of percent at latency-bound sizes are the machine's jitter."]
    cores = int(meta.get("cpu_count", "0") or 0)
    if cores and max(config.ranks) > cores:
        out += ["", f"**Ranks outnumber cores** ({max(config.ranks)} ranks on {cores} cores): a collective step "
                "waits until its peer is scheduled, so times at those rank counts are scheduler time slices "
                "(milliseconds) rather than loopback latency and bandwidth. The calibration fits a latency per op "
                "and rank count, but one bandwidth shape per op over all rank counts, and a rank count it has not "
                "measured takes the op's latency: the errors at those rank counts, and of the rank-count hold-out, "
                "say so."]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- command line
def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = HarnessParser(prog="python -m validation.loop", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--ranks", default="4", help="rank counts, comma list (2,4: also hold out a rank count)")
    parser.add_argument("--topology", default="cpu-loopback", help="the topology preset to calibrate")
    parser.add_argument("--out-dir", required=True, help="folder for the measurements, calibration and report")
    parser.add_argument("--quick", action="store_true", help="small sweep and MLP (seconds; CI)")
    parser.add_argument("--bytes", default=None, help="collective sizes, nccl-tests syntax (default 1K:16M:x4)")
    parser.add_argument("--ops", default=None,
                        help=f"comma list of {','.join(BENCH_OPS)} (default {','.join(LOOP_OPS)})")
    parser.add_argument("--iters", type=int, default=None, help="timed iterations per size (default 20, quick 5)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run's ranks are stopped")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace, command: str) -> LoopConfig:
    """The `LoopConfig` of parsed arguments; bad values raise `HarnessError` (one line)."""
    try:
        ranks = tuple(int(v) for v in args.ranks.split(",") if v.strip())
    except ValueError:
        raise HarnessError(f"--ranks '{args.ranks}' is not a comma list of integers (fix: e.g. --ranks 2,4)") from None
    if not ranks or min(ranks) < 2:
        raise HarnessError(f"--ranks '{args.ranks}': every rank count must be at least 2 (fix: e.g. --ranks 2,4)")
    ops = LOOP_OPS if args.ops is None else tuple(o.strip() for o in args.ops.split(",") if o.strip())
    unknown = [o for o in ops if o not in BENCH_OPS or o == "barrier"]
    if unknown or not ops:
        raise HarnessError(f"--ops: unknown or unfittable op(s) {', '.join(unknown) or '(none)'} "
                           f"(fix: use some of {','.join(LOOP_OPS)})")
    gpn = int(topology_document(args.topology).data.get("gpus_per_node", 1))  # unknown preset: PresetError
    if args.topology == "cpu-loopback" and max(ranks) > gpn:
        raise HarnessError(f"--ranks {max(ranks)} exceeds the {gpn} ranks of the cpu-loopback preset "
                           f"(fix: use at most {gpn} ranks)")
    iters = args.iters if args.iters is not None else (5 if args.quick else 20)
    if iters < 1 or not (math.isfinite(args.timeout) and args.timeout > 0):
        raise HarnessError(f"--iters must be >= 1 and --timeout a positive number of seconds, got {iters} and "
                           f"{args.timeout:g}")
    sizes = args.bytes or ("1K:1M:x4" if args.quick else "1K:16M:x4")
    mlp = MLPConfig(num_layers=4, width=256, batch=32) if args.quick else MLPConfig(num_layers=4, width=1024,
                                                                                    batch=128)
    return LoopConfig(ranks=ranks, backend=args.backend, topology=args.topology, ops=ops,
                      sizes=parse_sizes(sizes), warmup=2 if args.quick else 5,
                      iters=iters, mlp=mlp, mlp_warmup=1 if args.quick else 2, mlp_iters=3 if args.quick else 10,
                      timeout_s=args.timeout, command=command)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    config = config_from_args(args, "python -m validation.loop " + shlex.join(argv))
    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise HarnessError(f"--out-dir {out_dir} is a file (fix: name a folder)")
    check_target(out_dir / "validation.md", field="--out-dir")  # a folder it can write, before measuring
    print(f"measuring {len(config.ops)} collectives x {len(config.sizes)} sizes and the MLP cuts on "
          f"{', '.join(map(str, config.ranks))} {config.backend} ranks ...", flush=True)
    measured = measure(config, partial_dir=out_dir)
    outcome = fit_and_report(measured, out_dir, config)
    for holdout, doc in outcome.validations.items():
        print(f"held out: {holdout} ({doc['predicted_points']} points predicted from {doc['fit_points']})")
        print("\n".join(mape_lines(doc)))
        print(f"  {'all ops':16s} median |error| {_pct(median_abs_error(doc['rows'])):>9}   uncalibrated "
              f"{_pct(median_abs_error(doc['rows'], 'uncalibrated_error_pct')):>9}")
    for line in dict.fromkeys(w for doc in outcome.validations.values() for w in doc.get("warnings", [])):
        print(f"warning: {line}", file=sys.stderr)  # what simdist validate could not vouch for (validation.md too)
    failed = [f"{c.cut} on {n} ranks" for n, c in measured.checks if c.grad_rel_err > GRAD_TOLERANCE]
    print(f"MLP gradient checks: {len(measured.checks) - len(failed)} of {len(measured.checks)} passed")
    print("wrote " + ", ".join(str(p) for p in outcome.files.values()))
    if failed:
        print(f"error: gradients differ from the single-process reference in: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli_guard(main))
