"""Pipeline bubble and schedules (simdist bubble, simdist schedule)."""

from __future__ import annotations

from typing import Any

from simdist.errors import SpecError

# --------------------------------------------------------------------------- pipeline bubble and schedules
# (issue 4: `simdist bubble`, `simdist schedule`; keep this section contiguous)
_BUBBLE_FLAGS = {"schedule": "--schedule", "parallel.pp": "--stages", "parallel.vpp": "--virtual",
                 "training.global_batch_size": "--microbatches"}


def _pipeline_costs(num_stages: int, forward_s: float, backward_s: float, stage_times: list[float] | None,
                    p2p_s: float) -> Any:
    """Uniform costs, or per-stage forward times (each stage's backward keeps the backward/forward ratio)."""
    import math

    from simdist.plan.pipeline import UniformCosts

    for flag, value in (("--forward-time", forward_s), ("--backward-time", backward_s)):
        if not (math.isfinite(value) and value > 0):
            raise SpecError(f"time {value:g} must be a positive number of seconds", field=flag, fix="e.g. 1")
    if not (math.isfinite(p2p_s) and p2p_s >= 0):
        raise SpecError(f"p2p time {p2p_s:g} must be >= 0", field="--p2p-time", fix="give 0 or more seconds")
    if stage_times is None:
        return UniformCosts.uniform(num_stages, forward_s, backward_s, p2p_s=p2p_s)
    if len(stage_times) != num_stages or not all(math.isfinite(t) and t > 0 for t in stage_times):
        raise SpecError(f"{len(stage_times)} stage times for {num_stages} stages", field="--stage-times",
                        fix=f"give {num_stages} positive forward times, e.g. {','.join(['1'] * num_stages)}")
    ratio = backward_s / forward_s
    return UniformCosts(tuple(stage_times), tuple(t * ratio for t in stage_times), p2p_s=p2p_s)


def _check_pipeline(schedule: str, num_stages: int, num_microbatches: int, vpp: int) -> None:
    """simdist.plan.schedule's checks, with the CLI flags as field names."""
    from simdist.plan.schedule import check_schedule

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


def microbatch_range(text: str) -> list[int]:
    """``1:64`` (inclusive), ``4:64:4`` (with a step) or ``1,2,4,8`` as a list of micro-batch counts."""
    where = {"field": "--sweep-microbatches", "fix": "write e.g. 1:64, 4:64:4 or 1,2,4,8"}
    try:
        if ":" in text:
            parts = [int(p) for p in text.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            step = parts[2] if len(parts) == 3 else 1
            values = list(range(parts[0], parts[1] + 1, step)) if step > 0 else []
        else:
            values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise SpecError(f"cannot read micro-batch counts '{text}'", **where) from None
    if not values or min(values) < 1:
        raise SpecError(f"'{text}' gives no micro-batch counts >= 1", **where)
    return values


def bubble_sweep(schedule: str, *, num_stages: int, microbatches: list[int], vpp: int = 1,
                 **costs: Any) -> list[dict[str, Any]]:
    """`bubble` for each micro-batch count (interleaved_1f1b keeps the multiples of the stage count)."""
    counts = list(microbatches)
    _check_pipeline(schedule, num_stages, num_stages, vpp)
    if schedule == "interleaved_1f1b":
        counts = [m for m in counts if m % num_stages == 0]
        if not counts:
            raise SpecError(f"no micro-batch count in the sweep is a multiple of the {num_stages} stages",
                            field="--sweep-microbatches", fix=f"sweep e.g. {num_stages}:{num_stages * 16}")
    return [bubble(schedule, num_stages=num_stages, num_microbatches=m, vpp=vpp, **costs) for m in counts]


def schedule_grid(schedule: str, *, num_stages: int, num_microbatches: int, vpp: int = 1, forward_s: float = 1.0,
                  backward_s: float = 2.0, stage_times: list[float] | None = None, p2p_s: float = 0.0) -> str:
    """The simulated timeline of ``schedule`` as a stage x time-slot text grid (see simdist.report.schedule_text)."""
    from simdist.report.schedule_text import schedule_grid_text

    _, graph, trace = _pipeline_run(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp,
                                    forward_s=forward_s, backward_s=backward_s, stage_times=stage_times,
                                    p2p_s=p2p_s)
    return schedule_grid_text(graph, trace)
