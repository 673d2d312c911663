"""Pipeline bubble and schedules (simdist bubble, simdist schedule)."""

from __future__ import annotations

import math
from typing import Any

from simdist.errors import SpecError
from simdist.limits import (
    MICROBATCHES,
    PIPELINE_OPS,
    PIPELINE_STAGES,
    SCHEDULE_GRID_STEPS,
    STAGE_TIME_MAX,
    STAGE_TIME_MIN,
    SWEEP_POINTS,
    VPP,
    Limit,
)

# Schedules whose bubble and makespan have an exact closed form with uniform stages and free p2p
# (Narayanan et al. 2021 sec. 2.2.1-2.2.2; tests/test_bad_input.py checks it against the simulation):
# makespan (M+K-1)(F+B) for gpipe and 1f1b, (V M+K-1)(F+B)/V for interleaved_1f1b.
CLOSED_FORM_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")

# --------------------------------------------------------------------------- pipeline bubble and schedules
# (issue 4: `simdist bubble`, `simdist schedule`; keep this section contiguous)
_BUBBLE_FLAGS = {"schedule": "--schedule", "parallel.pp": "--stages", "parallel.vpp": "--virtual",
                 "training.global_batch_size": "--microbatches"}


def _pipeline_costs(num_stages: int, forward_s: float, backward_s: float, stage_times: list[float] | None,
                    p2p_s: float) -> Any:
    """Uniform costs, or per-stage forward times (each stage's backward keeps the backward/forward ratio)."""
    from simdist.plan.pipeline import UniformCosts

    for flag, value in (("--forward-time", forward_s), ("--backward-time", backward_s)):
        _check_time(value, flag)
    if not (math.isfinite(p2p_s) and p2p_s >= 0):
        raise SpecError(f"p2p time {p2p_s:g} must be >= 0", field="--p2p-time", fix="give 0 or more seconds")
    if p2p_s:
        _check_time(p2p_s, "--p2p-time")
    if stage_times is None:
        return UniformCosts.uniform(num_stages, forward_s, backward_s, p2p_s=p2p_s)
    if len(stage_times) != num_stages or not all(math.isfinite(t) and t > 0 for t in stage_times):
        raise SpecError(f"{len(stage_times)} stage times for {num_stages} stages", field="--stage-times",
                        fix=f"give {num_stages} positive forward times, e.g. {','.join(['1'] * min(num_stages, 8))}"
                            + ("..." if num_stages > 8 else ""))
    for t in stage_times:
        _check_time(t, "--stage-times")
    ratio = backward_s / forward_s
    return UniformCosts(tuple(stage_times), tuple(t * ratio for t in stage_times), p2p_s=p2p_s)


def _check_time(value: float, flag: str) -> None:
    if not (math.isfinite(value) and STAGE_TIME_MIN.value <= value <= STAGE_TIME_MAX.value):
        raise SpecError(f"time {value:g} must be a number of seconds from {STAGE_TIME_MIN.text()} to "
                        f"{STAGE_TIME_MAX.text()}", field=flag, fix="e.g. 1")


def _steps(schedule: str, num_stages: int, num_microbatches: int, vpp: int) -> int:
    """Compute steps of a pipeline (F, B and, for the split-backward schedules, W per micro-batch, chunk and stage;
    zb_v and dualpipev run two chunks a stage, dualpipe two half-loads of micro-batches)."""
    from simdist.plan.schedule import SPLIT_BACKWARD

    chunks = 2 if schedule in ("zb_v", "dualpipev") else vpp
    return num_stages * num_microbatches * chunks * (3 if schedule in SPLIT_BACKWARD else 2)


def _check_steps(schedule: str, num_stages: int, num_microbatches: int, vpp: int, limit: Limit, fix: str) -> None:
    from simdist.limits import check_work

    check_work(_steps(schedule, num_stages, num_microbatches, vpp), limit,
               what=f"{schedule} with {num_stages:,} stages x {num_microbatches:,} micro-batches x {vpp} chunk(s)",
               field="--microbatches", fix=fix)


def _check_pipeline(schedule: str, num_stages: int, num_microbatches: int, vpp: int) -> None:
    """simdist.plan.schedule's checks, with the CLI flags as field names."""
    from simdist.plan.schedule import check_schedule

    for flag, value, limit in (("--stages", num_stages, PIPELINE_STAGES), ("--microbatches", num_microbatches,
                                                                             MICROBATCHES), ("--virtual", vpp, VPP)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{flag} {value!r} must be a whole number >= 1", field=flag, fix="give e.g. 4")
        if value > limit.value:
            raise SpecError(f"{flag} {value:,} is above the limit of {limit.text()} ({limit.reason})", field=flag,
                            fix=f"give at most {limit.text()}")
    try:
        check_schedule(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp)
    except SpecError as err:
        raise SpecError(err.problem, field=_BUBBLE_FLAGS.get(err.field or "", err.field), fix=err.fix) from None


def _pipeline_run(schedule: str, *, num_stages: int, num_microbatches: int, vpp: int, forward_s: float,
                  backward_s: float, stage_times: list[float] | None, p2p_s: float) -> tuple[Any, Any, Any]:
    from simdist.engine.graph import run_graph
    from simdist.plan.pipeline import pipeline_graph

    _check_pipeline(schedule, num_stages, num_microbatches, vpp)
    costs = _pipeline_costs(num_stages, forward_s, backward_s, stage_times, p2p_s)
    graph = pipeline_graph(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp, costs=costs)
    return costs, graph, run_graph(graph)


def bubble(schedule: str, *, num_stages: int, num_microbatches: int, vpp: int = 1, forward_s: float = 1.0,
           backward_s: float = 2.0, stage_times: list[float] | None = None, p2p_s: float = 0.0) -> dict[str, Any]:
    """Simulate one pipeline step of ``schedule`` and compare its bubble with the closed form.

    ``forward_s``/``backward_s`` are a whole stage's times per micro-batch (a chunk takes 1/vpp of them);
    ``stage_times`` replaces the forward time per stage (backward scales with it); ``p2p_s`` is one send.
    """
    from simdist.plan.schedule import bubble_formula, bubble_formula_text
    from simdist.report.bubble import simulated_bubble

    _check_pipeline(schedule, num_stages, num_microbatches, vpp)
    if _steps(schedule, num_stages, num_microbatches, vpp) > PIPELINE_OPS.value:
        exact = schedule in CLOSED_FORM_SCHEDULES and stage_times is None and not p2p_s
        if not exact:
            _check_steps(schedule, num_stages, num_microbatches, vpp, PIPELINE_OPS,
                         fix="use fewer micro-batches or stages (without --stage-times and --p2p-time, gpipe, 1f1b "
                             "and interleaved_1f1b are answered in closed form at any size)")
        return _closed_form(schedule, num_stages, num_microbatches, vpp,
                            _pipeline_costs(num_stages, forward_s, backward_s, stage_times, p2p_s))
    costs, graph, trace = _pipeline_run(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp,
                                        forward_s=forward_s, backward_s=backward_s, stage_times=stage_times,
                                        p2p_s=p2p_s)
    fraction = simulated_bubble(graph, trace)
    # Assumption: with uneven stages the formula is evaluated at the mean stage times (it assumes uniform ones).
    mean_f = sum(costs.forward_s) / num_stages
    mean_b = sum(costs.backward_s) / num_stages
    return {
        "schedule": schedule, "stages": num_stages, "microbatches": num_microbatches, "virtual": vpp,
        "bubble_fraction": fraction,
        "formula": bubble_formula(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp,
                                  forward_s=mean_f, backward_s=mean_b,
                                  weight_grad_share=costs.weight_grad_share),
        "formula_text": bubble_formula_text(schedule),
        "utilization": 1.0 - fraction,
        "makespan_s": trace.makespan_s,
        "forward_s": list(costs.forward_s), "backward_s": list(costs.backward_s), "p2p_s": p2p_s,
    }


def _closed_form(schedule: str, k: int, m: int, v: int, costs: Any) -> dict[str, Any]:
    """`bubble`'s answer without simulating: exact for uniform stages and free p2p (CLOSED_FORM_SCHEDULES)."""
    from simdist.plan.schedule import bubble_formula, bubble_formula_text

    f, b = costs.forward_s[0], costs.backward_s[0]
    fraction = bubble_formula(schedule, num_stages=k, num_microbatches=m, vpp=v, forward_s=f, backward_s=b)
    makespan = (v * m + k - 1) * (f + b) / v if schedule == "interleaved_1f1b" else (m + k - 1) * (f + b)
    return {
        "schedule": schedule, "stages": k, "microbatches": m, "virtual": v, "bubble_fraction": fraction,
        "formula": fraction, "formula_text": bubble_formula_text(schedule), "utilization": 1.0 - fraction,
        "makespan_s": makespan, "forward_s": list(costs.forward_s), "backward_s": list(costs.backward_s),
        "p2p_s": costs.p2p_s, "simulated": False,
        "note": f"{_steps(schedule, k, m, v):,} steps exceed the {PIPELINE_OPS.text()} simdist simulates; with "
                "uniform stages and free p2p the closed form is exact (it equals the simulation wherever both run)",
    }


def microbatch_range(text: str) -> list[int]:
    """``1:64`` (inclusive), ``4:64:4`` (with a step) or ``1,2,4,8`` as a list of micro-batch counts."""
    where = {"field": "--sweep-microbatches", "fix": "write e.g. 1:64, 4:64:4 or 1,2,4,8"}
    try:
        if ":" in text:
            parts = [int(p) for p in text.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            step = parts[2] if len(parts) == 3 else 1
            span = range(parts[0], parts[1] + 1, step) if step > 0 else range(0)
            if len(span) > SWEEP_POINTS.value:  # counted, not listed
                raise SpecError(f"'{text}' names {len(span):,} micro-batch counts, above the limit of "
                                f"{SWEEP_POINTS.text()} for one sweep", **where)
            values = list(span)
        else:
            values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise SpecError(f"cannot read micro-batch counts '{text}'", **where) from None
    if len(values) > SWEEP_POINTS.value:
        raise SpecError(f"'{text}' names {len(values):,} micro-batch counts, above the limit of "
                        f"{SWEEP_POINTS.text()} for one sweep", **where)
    if not values or min(values) < 1:
        raise SpecError(f"'{text}' gives no micro-batch counts >= 1", **where)
    return values


def bubble_sweep(schedule: str, *, num_stages: int, microbatches: list[int], vpp: int = 1,
                 **costs: Any) -> list[dict[str, Any]]:
    """`bubble` for each micro-batch count (interleaved_1f1b keeps the multiples of the stage count)."""
    counts = list(microbatches)
    two_chunk = schedule in ("zb_v", "dualpipe", "dualpipev")
    _check_pipeline(schedule, num_stages, 2 * num_stages if two_chunk else num_stages, vpp)
    if schedule in ("dualpipe", "dualpipev"):  # keep the counts DualPipe runs (simdist.plan.schedule_v)
        counts = [m for m in counts if m >= 2 * num_stages and (schedule == "dualpipev" or m % 2 == 0)]
        if not counts:
            raise SpecError(f"no micro-batch count in the sweep suits {schedule} on {num_stages} stages (at least "
                            f"{2 * num_stages}{', even' if schedule == 'dualpipe' else ''})",
                            field="--sweep-microbatches", fix=f"sweep e.g. {2 * num_stages}:{num_stages * 16}:2")
    if schedule == "interleaved_1f1b":
        counts = [m for m in counts if m % num_stages == 0]
        if not counts:
            raise SpecError(f"no micro-batch count in the sweep is a multiple of the {num_stages} stages",
                            field="--sweep-microbatches", fix=f"sweep e.g. {num_stages}:{num_stages * 16}")
    exact = schedule in CLOSED_FORM_SCHEDULES and costs.get("stage_times") is None and not costs.get("p2p_s")
    simulated = sum(_steps(schedule, num_stages, m, vpp) for m in counts
                    if not (exact and _steps(schedule, num_stages, m, vpp) > PIPELINE_OPS.value))
    from simdist.limits import check_work

    check_work(simulated, PIPELINE_OPS, what=f"simulating the sweep ({len(counts)} points of {schedule} on "
                                             f"{num_stages} stages)", field="--sweep-microbatches",
               fix="sweep fewer or smaller micro-batch counts")
    return [bubble(schedule, num_stages=num_stages, num_microbatches=m, vpp=vpp, **costs) for m in counts]


def schedule_grid(schedule: str, *, num_stages: int, num_microbatches: int, vpp: int = 1, forward_s: float = 1.0,
                  backward_s: float = 2.0, stage_times: list[float] | None = None, p2p_s: float = 0.0) -> str:
    """The simulated timeline of ``schedule`` as a stage x time-slot text grid (see simdist.report.schedule_text)."""
    from simdist.report.schedule_text import schedule_grid_text

    _check_pipeline(schedule, num_stages, num_microbatches, vpp)
    _check_steps(schedule, num_stages, num_microbatches, vpp, SCHEDULE_GRID_STEPS,
                 fix="print a smaller schedule (the grid is for reading); `simdist bubble` answers large ones")
    _, graph, trace = _pipeline_run(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp,
                                    forward_s=forward_s, backward_s=backward_s, stage_times=stage_times,
                                    p2p_s=p2p_s)
    return schedule_grid_text(graph, trace)
