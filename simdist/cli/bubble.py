"""`simdist bubble` and `simdist schedule`: pipeline schedules and their bubble."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from simdist import api
from simdist.cli import (
    JsonOption,
    _print_json,
    app,
    check_target,
    emit,
    write_atomically,
)
from simdist.errors import SimdistError

# --------------------------------------------------------------------------- pipeline bubble and schedules
# (issue 4: `simdist bubble`, `simdist schedule`; keep this section contiguous)
ScheduleOption = Annotated[str, typer.Option(
    "--schedule", help="gpipe, 1f1b, interleaved_1f1b, zb_h1, zb_v, dualpipe or dualpipev.")]
StagesOption = Annotated[int, typer.Option("--stages", help="Pipeline stages K.")]
VirtualOption = Annotated[int, typer.Option(
    "--virtual", help="Model chunks per stage V (interleaved_1f1b; 2 for zb_v and dualpipev).")]
ForwardOption = Annotated[float, typer.Option("--forward-time", help="A stage's forward time per micro-batch.")]
BackwardOption = Annotated[float, typer.Option("--backward-time", help="A stage's backward time (input + weight).")]
StageTimesOption = Annotated[str | None, typer.Option(
    "--stage-times", help="Per-stage forward times, e.g. 1,1,1.5,1 (backward keeps the backward/forward ratio).")]
P2POption = Annotated[float, typer.Option("--p2p-time", help="Time of one activation/gradient send between stages.")]


def _stage_times(text: str | None) -> list[float] | None:
    if text is None:
        return None
    if text.count(",") >= 4096:
        raise SimdistError("more than 4096 stage times", field="--stage-times", fix="give one time per stage")
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
    if html is not None:
        check_target(html, field="--html")
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
        lines = [f"# {schedule}, K={stages} stages, V={virtual}; formula {rows[0]['formula_text']}",
                 f"# {'M':>5} {'simulated':>10} {'formula':>10} {'utilization':>12} {'makespan(s)':>12}"]
        for r in rows:
            lines.append(f"  {r['microbatches']:>5} {r['bubble_fraction']:>10.2%} {r['formula']:>10.2%} "
                         f"{r['utilization']:>12.2%} {r['makespan_s']:>12.6g}"
                         + ("  (closed form)" if r.get("simulated") is False else ""))
        if html is not None:
            lines.append(f"wrote {html}")
        emit("\n".join(lines))
        return
    if microbatches is None:
        raise SimdistError("no micro-batch count given", field="--microbatches",
                           fix="add --microbatches M, or --sweep-microbatches 1:64")
    doc = api.bubble(schedule, num_stages=stages, num_microbatches=microbatches, vpp=virtual, **costs)
    if as_json:
        _print_json(doc)
        return
    closed = doc.get("simulated") is False
    emit("\n".join([
        f"# {schedule}, K={stages} stages, M={microbatches} micro-batches, V={virtual}",
        f"  {'closed-form bubble' if closed else 'simulated bubble  '}{doc['bubble_fraction']:>8.2%}",
        f"  formula           {doc['formula']:>8.2%}   {doc['formula_text']}",
        f"  utilization       {doc['utilization']:>8.2%}",
        f"  makespan          {doc['makespan_s']:>8.6g} s",
        *([f"# {doc['note']}"] if closed else []),
    ]))


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
    emit(api.schedule_grid(schedule, num_stages=stages, num_microbatches=microbatches, vpp=virtual,
                                 forward_s=forward_time, backward_s=backward_time,
                                 stage_times=_stage_times(stage_times), p2p_s=p2p_time))
