"""Closed-form step time: the "analytic" fidelity of a training step (docs/architecture.md), its entry points.

It reads the one step model (simdist.plan.recipe) the op-graph builder reads, prices each recipe's collectives
alone by group shape (simdist.analytic.pricing.CommPricer; each stage's priced recipes: simdist.analytic.stages),
and times the schedule step by step without building a graph or running SimPy (simdist.analytic.timeline): the
engine's execution rule with nothing contending, so the closed form equals the engine wherever no collective shares
a link with another (tests, to 1e-9; `simdist run --fidelity closed_form` reports it in the engine's JSON).

Cost grows with the schedule's distinct work: a large micro-batch count is fast-forwarded
(simdist.plan.fastforward): three short schedules are timed and their repeating steady state extended.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simdist.analytic.pricing import CommPricer, cached_chunk_cost
from simdist.analytic.stages import _Stage, _stages
from simdist.analytic.timeline import COMPILE_STEPS as COMPILE_STEPS
from simdist.analytic.timeline import _compiled, _jumps, _observables, _pack, _Timelines
from simdist.plan.fastforward import FastForward, extrapolate
from simdist.plan.fastforward import plan as ff_plan
from simdist.plan.step_config import StepConfig

__all__ = ["AnalyticStep", "CommPricer", "analytic_observables", "analytic_step", "cached_chunk_cost",
           "fast_forward_plan"]


def fast_forward_plan(cfg: StepConfig, pricer: CommPricer, *, for_engine: bool = False, beside: bool = False
                      ) -> tuple[int, int, int, int] | None:
    """(cycle, M1, M2, M3) to sample instead of every micro-batch (simdist.plan.fastforward.plan), the cycle read
    off the closed form's timeline; None: time every micro-batch. The stages are priced only where a timeline is
    read (a short step is not fast-forwarded: nothing to price). ``beside`` (the engine's): its smaller samples run
    in a second process beside the largest (simdist.plan.fastforward.samples_cost)."""
    return _plan(cfg, lambda: _stages(cfg, pricer), for_engine, beside)


def _plan(cfg: StepConfig, stages: list[_Stage] | Callable[[], list[_Stage]], for_engine: bool, beside: bool = False,
          compiled: bool | None = None) -> tuple[int, int, int, int] | None:
    if cfg.dp_batch_split is not None or (for_engine and cfg.compute_slowdown):
        return None  # the engine simulates unequal replicas whole
    timelines = _Timelines(cfg, stages, compiled)
    return ff_plan(cfg.schedule, cfg.mesh.pp, cfg.microbatches(0), timelines.timeline, vpp=cfg.vpp,
                   count_detection=not for_engine, step_of=timelines.step_of, beside=beside and for_engine)


def _num_microbatches(cfg: StepConfig) -> int:
    return max(cfg.microbatches(d) for d in (range(cfg.mesh.dp) if cfg.dp_batch_split is not None else (0,)))


def analytic_observables(cfg: StepConfig, pricer: CommPricer, *,
                         fast_forward: bool | tuple[int, int, int, int] = True, compiled: bool | None = None
                         ) -> tuple[dict[str, float], FastForward | None]:
    """The step's additive quantities (as simdist.report.step_metrics.observables measures them on a trace) and
    how its micro-batches were fast-forwarded (None: every one was timed). ``fast_forward``: a (cycle, M1, M2,
    M3) of `fast_forward_plan` samples those counts instead of detecting its own (a caller timing many variants
    of one step, simdist.predict.bands); they are extended only where collinear, as the detected ones.

    With a straggler (``cfg.compute_slowdown``) each distinct replica is timed and the slowest one's answer
    returned: the data-parallel collectives at the step's end wait for it.
    # Assumption: the closed form of a step with a straggler is its slowest replica's timeline, exact where one
    # replica is slowed and the data-parallel collectives run after the backward (the default bucketed
    # reduction); where replicas meet mid-step (overlapped buckets, ZeRO-2/3's per-micro-batch collectives) or
    # stragglers sit in several replicas at different stages, only the engine sees the waits compound.
    """
    if cfg.compute_slowdown:
        replicas = sorted({cfg.mesh.coords(r)["dp"] for r, _ in cfg.compute_slowdown})
        if len(replicas) < cfg.mesh.dp:
            replicas.append(next(d for d in range(cfg.mesh.dp) if d not in replicas))  # a healthy one
        timed = [_replica_observables(cfg, pricer, d, fast_forward, compiled) for d in replicas]
        return max(timed, key=lambda t: t[0]["step_s"])
    return _replica_observables(cfg, pricer, 0, fast_forward, compiled)


def _replica_observables(cfg: StepConfig, pricer: CommPricer, dp_index: int,
                         fast_forward: bool | tuple[int, int, int, int], compiled: bool | None = None
                         ) -> tuple[dict[str, float], FastForward | None]:
    stages = _stages(cfg, pricer, dp_index)
    M = _num_microbatches(cfg)
    if not fast_forward:
        found = None
    elif isinstance(fast_forward, tuple):
        found = fast_forward
    elif compiled is True and _jumps(cfg, stages, M):
        # a caller timing many steps compiled (a search): the loop jumps over the steady state itself, exactly, so
        # no detection timeline is spent looking for a cycle to sample (what `_plan` would cost every such step)
        found = None
    else:
        found = _plan(cfg, stages, False, compiled=compiled)
    if found is not None:
        cycle, *counts = found
        packed = _pack(stages) if _compiled(cfg, stages, sum(counts), compiled) else None
        obs = extrapolate([(m, _observables(cfg, stages, m, packed)) for m in counts], M)
        if obs is not None:
            return obs, FastForward(cycle, tuple(counts), M)  # type: ignore[arg-type]
    return _observables(cfg, stages, M, compiled=compiled), None


@dataclass(frozen=True, slots=True)
class AnalyticStep:
    """A closed-form step: the figures search ranks by (simdist.report.step_metrics.metrics's names)."""

    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    pipeline_phase_s: float
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    pp_comm_s: float
    dp_exposed_s: float
    ep_comm_s: float
    """Exposed expert-parallel token all_to_all (dispatch and combine)."""
    etp_comm_s: float
    edp_exposed_s: float
    """Exposed expert-gradient reduction over the expert-data-parallel group."""
    optimizer_s: float
    bubble_s: float
    idle_s: float
    num_microbatches: int

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__}


def analytic_step(cfg: StepConfig, pricer: CommPricer, *, fast_forward: bool = True, compiled: bool | None = None
                  ) -> AnalyticStep:
    """Closed-form step of ``cfg`` on ``pricer``'s cluster (see the module docstring); ``compiled``: time it with
    the compiled recurrence (True: a caller timing many steps), step by step (False), or by its size (None:
    `COMPILE_STEPS`)."""
    obs, _ = analytic_observables(cfg, pricer, fast_forward=fast_forward, compiled=compiled)
    step = obs["step_s"]
    tokens = cfg.global_batch_size * (cfg.model.seq_length if cfg.model.kind == "decoder" else 1)
    per_gpu = obs["model_flops"] / step if step > 0 else 0.0
    phase = obs["phase_s"]
    return AnalyticStep(
        step_time_s=step, tokens_per_s=tokens / step if step > 0 else 0.0, model_tflops_per_gpu=per_gpu / 1e12,
        mfu=per_gpu / cfg.gpu.peak_flops(cfg.precision),
        bubble_fraction=max(obs["bubble_s"] / phase, 0.0) if phase > 0 else 0.0, pipeline_phase_s=phase,
        compute_s=obs["compute_s"], recompute_s=obs["recompute_s"], tp_comm_s=obs["tp_s"], cp_comm_s=obs["cp_s"],
        pp_comm_s=obs["pp_s"], dp_exposed_s=obs["dp_s"], ep_comm_s=obs["ep_s"], etp_comm_s=obs["etp_s"],
        edp_exposed_s=obs["edp_s"], optimizer_s=obs["optimizer_s"], bubble_s=obs["bubble_s"],
        idle_s=obs["idle_s"], num_microbatches=cfg.microbatches(0))
