"""`simdist search` and `simdist compare`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from simdist import api
from simdist.cli import (
    JsonOption,
    SetOption,
    _print_json,
    app,
    check_target,
    emit,
    write_atomically,
)
from simdist.cli.streams import to_stderr
from simdist.errors import SimdistError, note

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
    """A rich progress bar on stderr (none with --json), one line per phase of the sweep: the lower bounds of every
    feasible layout, then the closed form of those the bounds cannot rule out (simdist.search.sweep), each
    moving as its batches finish, with its ETA. (on_total, on_progress, stop)."""
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

    bar = Progress(TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn(), console=Console(stderr=True), transient=True)
    tasks: dict[str, Any] = {}
    total: list[int] = []

    def on_total(n: int) -> None:
        bar.start()
        total[:] = [n]

    def on_progress(k: int, phase: str = "closed form") -> None:
        if not total:
            return
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total[0])
        bar.advance(tasks[phase], k)

    def stop() -> None:
        if total:  # a bar never started prints nothing, so an error stays one line
            bar.stop()

    return on_total, on_progress, stop


@app.command("search")
def search_cmd(
    scenario: Annotated[Path | None, typer.Argument(
        help="A scenario file whose cluster, model and training to keep (its layout is searched); or give "
             "--model, --cluster, --gpus and --global-batch.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model preset (gpt3-175b, llama3-70b, ...).")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Topology preset (see `simdist topo list`) or "
                                                                  "topology file.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="Number of GPUs (with a scenario: resizes its "
                                                             "cluster).")] = None,
    global_batch: Annotated[int | None, typer.Option("--global-batch", help="Global batch in sequences.")] = None,
    assignments: SetOption = None,
    grid: Annotated[list[str] | None, typer.Option(
        "--grid", help="Vary a scenario field: key=v1,v2,... (dotted path, YAML values; repeatable: every "
                       "combination is searched), e.g. cluster.inter_node.oversubscription=1,2,4.")] = None,
    placement: Annotated[bool, typer.Option("--placement/--no-placement",
                                            help="Also search the mesh axis order (parallel.order: which groups "
                                                 "share a host or a leaf switch).")] = True,
    seq: SeqOption = None,
    max_tp: Annotated[int | None, typer.Option("--max-tp", help="Largest tp (default: GPUs per node).")] = None,
    max_pp: Annotated[int, typer.Option("--max-pp", help="Largest pp.")] = 64,
    max_cp: Annotated[int, typer.Option("--max-cp", help="Largest cp (powers of two).")] = 2,
    max_vpp: Annotated[int, typer.Option("--max-vpp", help="Largest virtual pipeline size (interleaved).")] = 4,
    max_mbs: Annotated[int, typer.Option("--max-micro-batch", help="Largest micro-batch (powers of two).")] = 8,
    schedules: Annotated[str, typer.Option("--schedules", help="Schedules to try: 1f1b,interleaved_1f1b,gpipe,"
                                                               "zb_h1.")] = "1f1b,interleaved_1f1b",
    precision: Annotated[str | None, typer.Option("--precision", help="bf16, fp16, fp8, tf32 or fp32 (default: "
                                                                     "bf16, or the scenario's).")] = None,
    zero3_fetch: Annotated[str | None, typer.Option("--zero3-fetch", help="ZeRO-3 parameter traffic: prefetch "
                                                                          "(FSDP-style) or per_parameter (DeepSpeed "
                                                                          "2021); default prefetch, or the "
                                                                          "scenario's.")] = None,
    zero_with_pp: Annotated[bool, typer.Option("--zero-with-pp/--no-zero-with-pp",
                                               help="Try ZeRO-2/3 with pipeline stages too (a large part of the "
                                                    "space)")] = True,
    any_layout: Annotated[bool, typer.Option("--any-layout", help="Also try layouts the scenario's framework does "
                                                                  "not run (Megatron-Core by default: no ZeRO-2/3 "
                                                                  "with pipeline stages).")] = False,
    no_contention: Annotated[bool, typer.Option("--no-contention", help="Rank by the closed form with every "
                                                                        "collective alone (no contention estimate)."
                                                )] = False,
    memory_headroom: Annotated[str, typer.Option("--memory-headroom", help="Memory a layout must leave free per "
                                                                           "GPU beyond the modelled peak, e.g. "
                                                                           "'4 GiB' or 0.")] = "2 GiB",
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
    results = resume or out
    if results is not None:  # refused now, not after the sweep
        check_target(results, field="--resume" if resume is not None else "--out")
    how = (f"run the same command with --resume {results} to continue" if results is not None else
           "add --out results.jsonl to keep results as they arrive, so that an interrupted search can --resume")
    on_total, on_progress, stop = _progress(as_json)
    try:
        output = api.search(model, cluster, gpus, global_batch, scenario=scenario, assignments=assignments or [],
                            grid=grid or [], placement=placement, seq_length=seq, precision=precision, max_tp=max_tp,
                            max_pp=max_pp, max_cp=max_cp, max_vpp=max_vpp, max_micro_batch=max_mbs,
                            schedules=tuple(s.strip() for s in schedules.split(",") if s.strip()), top_k=top,
                            workers=workers, dask=dask, results_file=results, html=html,
                            explain_pruned=explain_pruned, rows=rows, on_total=on_total, on_progress=on_progress,
                            zero3_fetch=zero3_fetch, zero_with_pp=zero_with_pp, framework_layouts=not any_layout,
                            memory_headroom=memory_headroom, contention=not no_contention)
    except KeyboardInterrupt:
        stop()
        to_stderr(f"interrupted before any layout was ranked; {how}")
        sys.exit(130)
    finally:
        stop()
    if output.interrupted:
        d = output.doc
        if "points" in d:
            note(f"interrupted: {len(d['points'])} of {d['num_points']} grid points searched (shown); {how}")
        else:
            note(f"interrupted: {d['evaluated']:,} of {d['feasible']:,} layouts evaluated"
                 + ("" if d["engine"] else ", none re-simulated") + f" (shown); {how}")
    if as_json:
        _print_json(output.doc)
    else:
        emit(output.text.rstrip() + (f"\nwrote {output.files['html']}" if output.files else ""))
    if output.interrupted:
        sys.exit(130)


@app.command("compare")
def compare_cmd(
    scenario: Annotated[Path | None, typer.Argument(
        help="A scenario file whose model and training to keep (its cluster is replaced by each compared one); "
             "or give --model.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model preset (gpt3-175b, llama3-70b, ...).")] = None,
    clusters: Annotated[str | None, typer.Option("--clusters", help="Presets or files to compare at --gpus GPUs "
                                                                    "each: dgx-a100,dgx-h100,gb200-nvl72.")] = None,
    cluster: Annotated[list[str] | None, typer.Option(
        "--cluster", help="A cluster with its own GPU count: PRESET_OR_FILE:GPUS (repeatable), e.g. "
                          "dgx-a100:1024; without :GPUS a budget sizes it.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs of every --clusters cluster.")] = None,
    tokens: Annotated[float | None, typer.Option("--tokens", help="Tokens to train, e.g. 300e9.")] = None,
    global_batch: Annotated[int | None, typer.Option("--global-batch", help="Global batch in sequences (default "
                                                                            "1536, or the scenario's).")] = None,
    assignments: SetOption = None,
    price: Annotated[list[str] | None, typer.Option("--price", help="cluster=USD per GPU-hour (repeatable).")
                     ] = None,
    budget_usd: Annotated[float | None, typer.Option(
        "--budget-usd-per-hour", help="Equal spend: each cluster gets the whole nodes this buys per hour (needs "
                                      "--price for each).")] = None,
    budget_kw: Annotated[float | None, typer.Option(
        "--budget-kw", help="Equal power: each cluster gets the whole nodes this powers (GPUs at TDP x PUE).")] = None,
    days: Annotated[float | None, typer.Option(
        "--days", help="A deadline for --tokens: the cheapest cluster that makes it (a cluster without :GPUS gets "
                       "the fewest nodes, doubling, that do).")] = None,
    pue: Annotated[float, typer.Option("--pue", help="Facility overhead on the GPUs' TDP energy (1.0: none).")] = 1.0,
    seq: SeqOption = None,
    precision: Annotated[str | None, typer.Option("--precision", help="bf16, fp16, fp8, tf32 or fp32 (default: "
                                                                      "bf16, or the scenario's).")] = None,
    max_tp: Annotated[int | None, typer.Option("--max-tp", help="Largest tp (default: GPUs per node).")] = None,
    max_pp: Annotated[int, typer.Option("--max-pp", help="Largest pp.")] = 64,
    max_cp: Annotated[int, typer.Option("--max-cp", help="Largest cp (powers of two).")] = 2,
    max_vpp: Annotated[int, typer.Option("--max-vpp", help="Largest virtual pipeline size (interleaved).")] = 4,
    max_mbs: Annotated[int, typer.Option("--max-micro-batch", help="Largest micro-batch (powers of two).")] = 8,
    schedules: Annotated[str, typer.Option("--schedules", help="Schedules to try: 1f1b,interleaved_1f1b,gpipe,"
                                                               "zb_h1.")] = "1f1b,interleaved_1f1b",
    workers: WorkersOption = 1,
    dask: DaskOption = None,
    as_json: JsonOption = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write the comparison chart.")] = None,
) -> None:
    """Compare clusters: best layout on each, time, cost and energy to train --tokens tokens."""
    if html is not None:
        check_target(html, field="--html")
    try:
        doc = api.compare(model, clusters.split(",") if clusters else None, gpus, tokens, sized=cluster or [],
                          scenario=scenario, assignments=assignments or [], global_batch_size=global_batch,
                          prices=price or [], pue=pue, seq_length=seq, precision=precision, workers=workers,
                          dask=dask, budget_usd_per_hour=budget_usd, budget_kw=budget_kw, days=days,
                          max_tp=max_tp, max_pp=max_pp, max_cp=max_cp, max_vpp=max_vpp, max_micro_batch=max_mbs,
                          schedules=tuple(s.strip() for s in schedules.split(",") if s.strip()))
    except KeyboardInterrupt:
        to_stderr("interrupted: compare prints its table once every cluster is searched (nothing to keep); "
                  "run it again, or `simdist search --out FILE` per cluster to resume")
        sys.exit(130)
    from simdist.report.search_table import compare_notes, compare_text

    text = compare_text(doc["rows"], tokens=doc["tokens"], pue=pue, answer=doc.get("answer"))
    if html is not None:
        from simdist.report.search_html import compare_report_html

        write_atomically(html, compare_report_html(doc["rows"], notes=compare_notes(doc["rows"], pue=pue,
                                                                                     answer=doc.get("answer"))))
    if as_json:
        _print_json(doc)
        return
    emit(text.rstrip() + (f"\nwrote {html}" if html is not None else ""))
