"""Command line: thin typer commands over `simdist.api`.

Bad input never prints a traceback: a `SimdistError` or a usage error becomes one line on stderr
(``error: ...``) and exit status 2. ``--json`` prints exactly one JSON document on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

try:  # typer >= 0.20 vendors click as typer._click; older releases use click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from simdist import api
from simdist.errors import EXIT_USAGE, SimdistError

# Exit and Abort live in typer itself in recent releases (typer.Exit, typer.Abort), in click's exceptions before.
_EXIT = tuple({getattr(typer, "Exit", None), getattr(click_exceptions, "Exit", None)} - {None})
_ABORT = tuple({getattr(typer, "Abort", None), getattr(click_exceptions, "Abort", None)} - {None})

app = typer.Typer(
    name="simdist",
    help="Discrete-event simulator of distributed-training cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
topo_app = typer.Typer(help="Inspect topology presets and clusters.", no_args_is_help=True)
app.add_typer(topo_app, name="topo")

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a field: key=value (dotted path, YAML value), repeatable."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout, nothing else.")]
CalibrationOption = Annotated[Path | None, typer.Option(
    "--calibration", help="A calibration file (simdist calibrate) fitted for this cluster.")]


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and a rename: never half a file."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise SimdistError(f"folder {directory} does not exist", field="--html", fix="create it or pick another path")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@topo_app.command("list")
def topo_list(as_json: JsonOption = False) -> None:
    """List the bundled topology presets."""
    presets = api.topology_presets()
    if as_json:
        _print_json(presets)
        return
    width = max(len(p["name"]) for p in presets)
    for p in presets:
        typer.echo(f"{p['name']:<{width}}  {p['gpus_per_node']:>3} GPUs/node  {p['description']}")


@topo_app.command("gpus")
def topo_gpus(as_json: JsonOption = False) -> None:
    """List the GPU presets (dense peak TFLOP/s, HBM)."""
    gpus = api.gpu_presets()
    if as_json:
        _print_json(gpus)
        return
    for name, g in gpus.items():
        peak = g["peak"]
        fp8 = f"{peak['fp8'] / 1e12:g}" if peak["fp8"] else "-"
        typer.echo(
            f"{name:<14} {g['name']:<22} bf16 {peak['bf16'] / 1e12:>6g}  fp8 {fp8:>6}  tf32 {peak['tf32'] / 1e12:>6g}  "
            f"fp32 {peak['fp32'] / 1e12:>5g} TFLOP/s  "
            f"{g['hbm_capacity'] / 2**30:g} GiB at {g['hbm_bandwidth'] / 1e12:g} TB/s"
        )


@topo_app.command("show")
def topo_show(
    name: Annotated[str, typer.Argument(help="A preset name (see `simdist topo list`) or a topology YAML file.")],
    num_nodes: Annotated[
        int | None, typer.Option("--num-nodes", min=1, help="Number of nodes (racks for gb200-nvl72).")
    ] = None,
    assignments: SetOption = None,
    as_json: JsonOption = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write an interactive plotly drawing to FILE.")] = None,
) -> None:
    """Describe a cluster: GPUs, links by kind, per-GPU bandwidth per tier, bisection, example routes."""
    topology, summary = api.topology_summary(name, num_nodes=num_nodes, assignments=assignments or [])
    if html is not None:
        from simdist.report.topology_html import topology_figure_html

        write_atomically(html, topology_figure_html(topology))
    if as_json:
        _print_json(summary)
        return
    from simdist.report.topology_text import render_topology

    typer.echo(render_topology(summary))
    if html is not None:
        typer.echo(f"wrote {html}")


@app.command("schema")
def schema_cmd(kind: Annotated[str, typer.Argument(help="topology or scenario")]) -> None:
    """Print the JSON schema of a topology or scenario file."""
    _print_json(api.schema(kind))


@app.command("check")
def check(
    scenario: Annotated[Path, typer.Argument(help="A scenario YAML file.")],
    assignments: SetOption = None,
    as_json: JsonOption = False,
) -> None:
    """Validate a scenario: its fields, its cluster, and that the layout fills the cluster."""
    loaded = api.load_scenario(scenario, assignments or [])
    p = loaded.spec.parallel
    result = {
        "scenario": str(scenario),
        "name": loaded.spec.name,
        "cluster": loaded.topology.spec.name,
        "num_gpus": loaded.topology.num_gpus,
        "layout": {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "vpp": p.vpp},
        "valid": True,
    }
    if as_json:
        _print_json(result)
    else:
        typer.echo(
            f"{scenario}: ok - {loaded.spec.name or 'unnamed'}: tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} on "
            f"{loaded.topology.num_gpus} GPUs of {loaded.topology.spec.name}"
        )


@app.command("collective")
def collective_cmd(
    cluster: Annotated[str, typer.Option("--cluster", help="Topology preset or file.")],
    op: Annotated[str, typer.Option("--op", help="all_reduce, all_gather, reduce_scatter, broadcast, reduce, "
                                                 "all_to_all, scatter, gather, send_recv, barrier.")],
    ranks: Annotated[int, typer.Option("--ranks", help="Number of ranks (the first GPUs of the cluster).")],
    sizes: Annotated[str, typer.Option("--bytes", help="Sizes: 8:8G:x2 (nccl-tests -b:-e:-f), or 1M,64M.")] = "8:8G:x2",
    algorithm: Annotated[str, typer.Option("--algorithm", help="auto, or a name; several: ring,tree,auto.")] = "auto",
    protocol: Annotated[str, typer.Option("--protocol", help="auto, LL, LL128 or Simple.")] = "auto",
    fidelity: Annotated[str, typer.Option("--fidelity", help="auto, detailed or fast.")] = "auto",
    num_nodes: Annotated[int | None, typer.Option("--num-nodes", min=1, help="Number of nodes.")] = None,
    root: Annotated[int, typer.Option("--root", help="Root rank of rooted collectives.")] = 0,
    assignments: SetOption = None,
    as_json: JsonOption = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write a busbw/time chart per algorithm.")] = None,
    compare: Annotated[Path | None, typer.Option("--compare", help="Overlay measurements: our CSV, or "
                                                                     "nccl-tests output (text or -J JSON).")] = None,
    calibration: CalibrationOption = None,
) -> None:
    """Simulate a collective over a size sweep and report time, algbw and busbw as nccl-tests does."""
    from simdist.units import parse_size_list

    try:
        size_list = parse_size_list(sizes)
    except SimdistError as err:
        raise err.located(field_prefix="--bytes") from None
    names = [a.strip() for a in algorithm.split(",") if a.strip()]
    if not names:
        raise SimdistError("no algorithm given", field="--algorithm", fix="use auto or e.g. ring")
    measured = None
    if compare is not None:
        from simdist.calibrate.measurements import read_measurements

        measured = read_measurements(compare)
    series = {name: api.collective(cluster, op, ranks, size_list, algorithm=name, protocol=protocol,
                                   num_nodes=num_nodes, assignments=assignments or [], fidelity=fidelity,
                                   root=root, calibration=calibration)
              for name in names}
    if html is not None:
        extra = api.collective_curves(cluster, op, ranks, size_list, num_nodes=num_nodes,
                                      assignments=assignments or [], fidelity=fidelity, root=root,
                                      protocol=protocol, skip=set(series), calibration=calibration)
        from simdist.report.collective_html import collective_figure_html

        curves = {**series, **extra}
        title = f"{op} on {ranks} ranks of {cluster}" + (f" x {num_nodes} nodes" if num_nodes else "")
        write_atomically(html, collective_figure_html(api.curves_for_report(curves), measured, title=title))
    if as_json:
        doc: dict[str, Any] = {"cluster": cluster, "num_nodes": num_nodes, "op": op, "num_ranks": ranks,
                               "rows": [row.to_dict() for rows in series.values() for row in rows]}
        if measured is not None:
            doc["compare"] = api.compare_rows(series, measured)
        _print_json(doc)
        return
    typer.echo(f"# {op} on {ranks} ranks of {cluster}" + (f" ({num_nodes} nodes)" if num_nodes else ""))
    typer.echo(f"# {'size':>12} {'algorithm':>16} {'proto':>6} {'time(us)':>11} {'algbw(GB/s)':>12} "
               f"{'busbw(GB/s)':>12}  fidelity")
    for rows in series.values():
        for r in rows:
            typer.echo(f"  {int(r.nbytes):>12} {r.algorithm:>16} {r.protocol:>6} {r.time_s * 1e6:>11.2f} "
                       f"{r.algbw_GBps:>12.2f} {r.busbw_GBps:>12.2f}  {r.fidelity}")
    if measured is not None:
        for line in api.compare_rows(series, measured):
            typer.echo(f"  measured {int(line['bytes']):>12} {line['measured_busbw_GBps']:>8.2f} GB/s busbw, "
                       f"predicted {line['predicted_busbw_GBps']:>8.2f} ({line['error_pct']:+.1f}%)")
    if html is not None:
        typer.echo(f"wrote {html}")


@app.command("run")
def run_cmd(
    scenario: Annotated[Path, typer.Argument(help="A scenario YAML file (see scenarios/).")],
    assignments: SetOption = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write report.json, trace.json, report.html here.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 2 if the layout does not fit in memory.")] = False,
    as_json: JsonOption = False,
    calibration: CalibrationOption = None,
    simulate: Annotated[str, typer.Option(
        "--simulate", help="auto | representatives (one rank per stage, the others' traffic folded onto shared "
                           "links) | full (every rank)")] = "auto",
) -> None:
    """Predict one training step: step time, throughput, MFU, bubble, breakdown, memory, links."""
    output = api.run(scenario, assignments or [], out_dir=out, strict=strict, calibration=calibration,
                     simulate=simulate)
    if as_json:
        _print_json(output.result)
        return
    typer.echo(output.text.rstrip())
    if output.files:
        typer.echo(f"report: {output.files['report.html']}  (trace: {output.files['trace.json']}, "
                   f"json: {output.files['report.json']})")


@app.command("assumptions")
def assumptions_cmd(as_json: JsonOption = False) -> None:
    """List the modelling assumptions (``# Assumption:`` comments) in the code and presets."""
    found = api.assumptions()
    if as_json:
        _print_json(found)
        return
    for item in found:
        typer.echo(f"{item['file']}:{item['line']}: {item['text']}")


# --------------------------------------------------------------------------- pipeline bubble and schedules
# (issue 4: `simdist bubble`, `simdist schedule`; keep this section contiguous)
ScheduleOption = Annotated[str, typer.Option("--schedule", help="gpipe, 1f1b, interleaved_1f1b or zb_h1.")]
StagesOption = Annotated[int, typer.Option("--stages", help="Pipeline stages K.")]
VirtualOption = Annotated[int, typer.Option("--virtual", help="Model chunks per stage V (interleaved_1f1b).")]
ForwardOption = Annotated[float, typer.Option("--forward-time", help="A stage's forward time per micro-batch.")]
BackwardOption = Annotated[float, typer.Option("--backward-time", help="A stage's backward time (input + weight).")]
StageTimesOption = Annotated[str | None, typer.Option(
    "--stage-times", help="Per-stage forward times, e.g. 1,1,1.5,1 (backward keeps the backward/forward ratio).")]
P2POption = Annotated[float, typer.Option("--p2p-time", help="Time of one activation/gradient send between stages.")]


def _stage_times(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SimdistError(f"cannot read stage times '{text}'", field="--stage-times",
                           fix="give comma-separated seconds, e.g. 1,1,1.5,1") from None


@app.command("bubble")
def bubble_cmd(
    schedule: ScheduleOption,
    stages: StagesOption,
    microbatches: Annotated[int | None, typer.Option("--microbatches", help="Micro-batches per step M.")] = None,
    virtual: VirtualOption = 1,
    forward_time: ForwardOption = 1.0,
    backward_time: BackwardOption = 2.0,
    stage_times: StageTimesOption = None,
    p2p_time: P2POption = 0.0,
    as_json: JsonOption = False,
    sweep: Annotated[str | None, typer.Option("--sweep-microbatches", help="Sweep M: 1:64, 4:64:4 or 1,2,4.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write the sweep's bubble chart to FILE.")] = None,
) -> None:
    """Simulate a pipeline schedule: bubble fraction (idle / total stage-time) against the closed form."""
    costs = {"forward_s": forward_time, "backward_s": backward_time, "stage_times": _stage_times(stage_times),
             "p2p_s": p2p_time}
    if sweep is None and html is not None:
        raise SimdistError("--html draws a sweep", field="--html", fix="add --sweep-microbatches, e.g. 1:64")
    if sweep is not None:
        rows = api.bubble_sweep(schedule, num_stages=stages, microbatches=api.microbatch_range(sweep), vpp=virtual,
                                **costs)
        if html is not None:
            from simdist.report.bubble_html import bubble_figure_html

            title = f"{schedule}: bubble vs micro-batches, K={stages}" + (f", V={virtual}" if virtual > 1 else "")
            write_atomically(html, bubble_figure_html(rows, title=title))
        if as_json:
            _print_json({"schedule": schedule, "stages": stages, "virtual": virtual, "rows": rows})
            return
        typer.echo(f"# {schedule}, K={stages} stages, V={virtual}; formula {rows[0]['formula_text']}")
        typer.echo(f"# {'M':>5} {'simulated':>10} {'formula':>10} {'utilization':>12} {'makespan(s)':>12}")
        for r in rows:
            typer.echo(f"  {r['microbatches']:>5} {r['bubble_fraction']:>10.2%} {r['formula']:>10.2%} "
                       f"{r['utilization']:>12.2%} {r['makespan_s']:>12.6g}")
        if html is not None:
            typer.echo(f"wrote {html}")
        return
    if microbatches is None:
        raise SimdistError("no micro-batch count given", field="--microbatches",
                           fix="add --microbatches M, or --sweep-microbatches 1:64")
    doc = api.bubble(schedule, num_stages=stages, num_microbatches=microbatches, vpp=virtual, **costs)
    if as_json:
        _print_json(doc)
        return
    typer.echo(f"# {schedule}, K={stages} stages, M={microbatches} micro-batches, V={virtual}")
    typer.echo(f"  simulated bubble  {doc['bubble_fraction']:>8.2%}")
    typer.echo(f"  formula           {doc['formula']:>8.2%}   {doc['formula_text']}")
    typer.echo(f"  utilization       {doc['utilization']:>8.2%}")
    typer.echo(f"  makespan          {doc['makespan_s']:>8.6g} s")


@app.command("schedule")
def schedule_cmd(
    schedule: ScheduleOption,
    stages: StagesOption,
    microbatches: Annotated[int, typer.Option("--microbatches", help="Micro-batches per step M.")],
    virtual: VirtualOption = 1,
    forward_time: ForwardOption = 1.0,
    backward_time: BackwardOption = 2.0,
    stage_times: StageTimesOption = None,
    p2p_time: P2POption = 0.0,
) -> None:
    """Print a pipeline schedule's simulated timeline: stages x time slots (F3, B3, W3, F3.1 = chunk 1)."""
    typer.echo(api.schedule_grid(schedule, num_stages=stages, num_microbatches=microbatches, vpp=virtual,
                                 forward_s=forward_time, backward_s=backward_time,
                                 stage_times=_stage_times(stage_times), p2p_s=p2p_time))

# --------------------------------------------------------------------------- calibration and validation
# (issue 5 parts 3-4: `simdist calibrate`, `simdist validate`; keep this section contiguous)
MeasurementsArgument = Annotated[list[Path] | None, typer.Argument(
    help="Measurement files: our CSV, nccl-tests output (text or -J JSON), MLP step CSVs.")]
HoldoutOption = Annotated[str, typer.Option("--holdout", help=api.HOLDOUT_HELP)]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} %"


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
    doc = api.calibrate(list(measurements or []), topology, num_nodes=num_nodes, out=out, holdout=holdout, seed=seed)
    if as_json:
        _print_json(doc)
        return
    cal = doc["calibration"]
    fit = cal.get("fit", {})
    typer.echo(f"# calibration of {topology} from {fit.get('points', 0)} points "
               f"(MAPE {_pct(fit.get('mape_pct'))}, uncalibrated {_pct(fit.get('mape_uncalibrated_pct'))})")
    for key, value in cal.get("overrides", {}).items():
        typer.echo(f"  override {key}: {value}")
    for op, c in cal.get("collectives", {}).items():
        typer.echo(f"  {op:<15} latency +{c['latency']}, bandwidth x {c['bandwidth_factor']:.3f}"
                   + (f", {len(c['efficiency'])} efficiency knots" if c.get("efficiency") else ""))
    if cal.get("compute"):
        typer.echo(f"  compute         {cal['compute']}")
    if fit.get("heldout_points"):
        typer.echo(f"# held out ({holdout}): {fit['heldout_points']} points, MAPE {_pct(fit.get('heldout_mape_pct'))}"
                   f", uncalibrated {_pct(fit.get('heldout_mape_uncalibrated_pct'))}")
    typer.echo(f"wrote {out}" if out is not None else doc["yaml"].rstrip())


@app.command("validate")
def validate_cmd(
    measurements: MeasurementsArgument = None,
    calibration: Annotated[Path | None, typer.Option("--calibration", help="The calibration file to check.")] = None,
    holdout: HoldoutOption = "sizes",
    html: Annotated[Path | None, typer.Option("--html", help="Write the predicted-vs-measured chart here.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Fit on part of the measurements, predict the rest: per-point error and MAPE, calibrated and not."""
    if calibration is None:
        raise SimdistError("no calibration given", field="--calibration",
                           fix="add --calibration cal.yaml (from simdist calibrate)")
    doc = api.validate(list(measurements or []), calibration, holdout=holdout, html=html)
    if as_json:
        _print_json(doc)
        return
    typer.echo(f"# {doc['topology']}: {doc['predicted_points']} points predicted (holdout {holdout}; fitted on "
               f"{doc['fit_points']})")
    typer.echo(f"# {'op':<15} {'ranks':>5} {'size':>12} {'measured(us)':>13} {'predicted(us)':>14} {'error':>8} "
               f"{'uncalibrated(us)':>17} {'error':>8}")
    for r in doc["rows"]:
        typer.echo(f"  {r['op']:<15} {r['num_ranks']:>5} {int(r['nbytes']):>12} {r['measured_s'] * 1e6:>13.2f} "
                   f"{r['predicted_s'] * 1e6:>14.2f} {r['error_pct']:>+7.1f}% {r['uncalibrated_s'] * 1e6:>17.2f} "
                   f"{r['uncalibrated_error_pct']:>+7.1f}%")
    for label, key in (("calibrated (held-out fit)", "mape_pct"), ("uncalibrated", "uncalibrated_mape_pct"),
                       ("calibration file", "calibration_file_mape_pct")):
        m = doc[key]
        per_op = ", ".join(f"{op} {_pct(v)}" for op, v in m["per_op"].items())
        typer.echo(f"MAPE {label}: {_pct(m['all'])} ({per_op})")
    if html is not None:
        typer.echo(f"wrote {html}")


# --------------------------------------------------------------------------- layout search and hardware comparison
# (issue 7: `simdist search`, `simdist compare`; keep this section contiguous)
ModelOption = Annotated[str, typer.Option("--model", help="Model preset (gpt3-175b, llama3-70b, ...).")]
GpusOption = Annotated[int, typer.Option("--gpus", help="Number of GPUs.")]
WorkersOption = Annotated[int, typer.Option("--workers", help="Local worker processes (1: in this process).")]
DaskOption = Annotated[str | None, typer.Option("--dask", help="Evaluate on an existing Dask scheduler, "
                                                                "e.g. tcp://host:8786 (pip install simdist[dask]).")]
SeqOption = Annotated[int | None, typer.Option("--seq", help="Sequence length (default: the model preset's).")]
PrecisionOption = Annotated[str, typer.Option("--precision", help="bf16, fp16, fp8, tf32 or fp32.")]


def _progress(as_json: bool):
    """A rich progress bar with ETA on stderr (none with --json): (on_total, on_progress, stop)."""
    if as_json:
        return None, None, lambda: None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(TextColumn("closed form"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn(), console=Console(stderr=True), transient=True)
    task: list[Any] = []

    def on_total(n: int) -> None:
        bar.start()
        task.append(bar.add_task("sweep", total=n))

    def on_progress(k: int) -> None:
        if task:
            bar.advance(task[0], k)

    def stop() -> None:
        if task:  # a bar never started prints nothing, so an error stays one line
            bar.stop()

    return on_total, on_progress, stop


@app.command("search")
def search_cmd(
    model: ModelOption,
    cluster: Annotated[str, typer.Option("--cluster", help="Topology preset (see `simdist topo list`).")],
    gpus: GpusOption,
    global_batch: Annotated[int, typer.Option("--global-batch", help="Global batch in sequences.")],
    seq: SeqOption = None,
    max_tp: Annotated[int | None, typer.Option("--max-tp", help="Largest tp (default: GPUs per node).")] = None,
    max_pp: Annotated[int, typer.Option("--max-pp", help="Largest pp.")] = 64,
    max_cp: Annotated[int, typer.Option("--max-cp", help="Largest cp (powers of two).")] = 2,
    max_vpp: Annotated[int, typer.Option("--max-vpp", help="Largest virtual pipeline size (interleaved).")] = 4,
    max_mbs: Annotated[int, typer.Option("--max-micro-batch", help="Largest micro-batch (powers of two).")] = 8,
    schedules: Annotated[str, typer.Option("--schedules", help="Schedules to try: 1f1b,interleaved_1f1b,gpipe,"
                                                               "zb_h1.")] = "1f1b,interleaved_1f1b",
    precision: PrecisionOption = "bf16",
    top: Annotated[int, typer.Option("--top", help="Re-simulate the best K with the engine.")] = 3,
    rows: Annotated[int, typer.Option("--rows", help="Rows of the ranked table.")] = 10,
    explain_pruned: Annotated[bool, typer.Option("--explain-pruned", help="List every pruned layout and why.")] = False,
    workers: WorkersOption = 1,
    dask: DaskOption = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue from (and append to) a results file.")
                      ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write results as JSON lines as they arrive.")] = None,
    as_json: JsonOption = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write the HTML report (heatmap, Pareto, timeline).")
                    ] = None,
) -> None:
    """Search parallel layouts: prune, rank by the closed form, re-simulate the top K with the engine."""
    if resume is not None and out is not None and resume != out:
        raise SimdistError("--resume and --out name different files", field="--out",
                           fix="give one file: --resume appends to it")
    on_total, on_progress, stop = _progress(as_json)
    try:
        output = api.search(model, cluster, gpus, global_batch, seq_length=seq, precision=precision, max_tp=max_tp,
                            max_pp=max_pp, max_cp=max_cp, max_vpp=max_vpp, max_micro_batch=max_mbs,
                            schedules=tuple(s.strip() for s in schedules.split(",") if s.strip()), top_k=top,
                            workers=workers, dask=dask, results_file=resume or out, html=html,
                            explain_pruned=explain_pruned, rows=rows, on_total=on_total, on_progress=on_progress)
    finally:
        stop()
    if as_json:
        _print_json(output.doc)
    else:
        typer.echo(output.text.rstrip())
        if output.files:
            typer.echo(f"wrote {output.files['html']}")
    if output.interrupted:
        sys.exit(130)


@app.command("compare")
def compare_cmd(
    model: ModelOption,
    clusters: Annotated[str, typer.Option("--clusters", help="Presets to compare: dgx-a100,dgx-h100,gb200-nvl72.")],
    gpus: GpusOption,
    tokens: Annotated[float, typer.Option("--tokens", help="Tokens to train, e.g. 300e9.")],
    global_batch: Annotated[int, typer.Option("--global-batch", help="Global batch in sequences.")] = 1536,
    price: Annotated[list[str] | None, typer.Option("--price", help="cluster=USD per GPU-hour (repeatable).")
                     ] = None,
    pue: Annotated[float, typer.Option("--pue", help="Facility overhead on the GPUs' TDP energy (1.0: none).")] = 1.0,
    seq: SeqOption = None,
    precision: PrecisionOption = "bf16",
    workers: WorkersOption = 1,
    dask: DaskOption = None,
    as_json: JsonOption = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write the comparison chart.")] = None,
) -> None:
    """Compare clusters: best layout on each, time, cost and energy to train --tokens tokens."""
    doc = api.compare(model, clusters.split(","), gpus, tokens, global_batch_size=global_batch, prices=price or [],
                      pue=pue, seq_length=seq, precision=precision, workers=workers, dask=dask)
    from simdist.report.search_table import compare_text

    text = compare_text(doc["rows"], tokens=tokens, pue=pue)
    if html is not None:
        from simdist.report.search_html import compare_report_html

        write_atomically(html, compare_report_html(doc["rows"], table_text=text))
    if as_json:
        _print_json(doc)
        return
    typer.echo(text.rstrip())
    if html is not None:
        typer.echo(f"wrote {html}")


def _fail(message: str) -> None:
    sys.stderr.write("error: " + " ".join(message.split()) + "\n")
    sys.exit(EXIT_USAGE)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``simdist`` console script and ``python -m simdist``."""
    try:
        code = app(args=argv, prog_name="simdist", standalone_mode=False)
    except SimdistError as err:
        _fail(err.one_line())
    except click_exceptions.NoArgsIsHelpError as err:
        sys.stdout.write(err.format_message() + "\n")
        sys.exit(0)
    except click_exceptions.UsageError as err:
        where = f"{err.ctx.command_path}: " if err.ctx is not None else ""
        _fail(where + err.format_message())
    except click_exceptions.ClickException as err:
        _fail(err.format_message())
    except _EXIT as err:
        sys.exit(getattr(err, "exit_code", 0))
    except _ABORT:
        sys.stderr.write("aborted\n")
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
