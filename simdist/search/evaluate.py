"""Evaluate candidates with the closed form (simdist.analytic.step): the function every executor runs.

A worker builds the problem's cluster, model and collective-price cache once (``context``) and keeps them for
every batch of the same problem, so the prices computed for one layout serve the next. Prices are keyed by
group shape (simdist.analytic.step.CommPricer), never by evaluation order, so a result does not depend on
which worker computed it or what it computed before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simdist.analytic.step import CommPricer, analytic_step
from simdist.errors import SimdistError
from simdist.hardware import load_topology
from simdist.hardware.topology import Topology
from simdist.plan.mesh import Mesh
from simdist.plan.model import Model
from simdist.plan.model_presets import resolve_model
from simdist.plan.step import StepConfig
from simdist.search.prune import peak_memory_bytes
from simdist.search.space import Candidate, SearchProblem
from simdist.spec.scenario import ModelSpec

ATTENTION = "flash"


@dataclass(slots=True)
class Context:
    topology: Topology
    model: Model
    pricer: CommPricer


_CONTEXTS: dict[SearchProblem, Context] = {}


def resolve_problem_model(problem: SearchProblem) -> Model:
    spec = ModelSpec(preset=problem.model, seq_length=problem.seq_length) if problem.seq_length else ModelSpec(
        preset=problem.model)
    try:
        return resolve_model(spec)
    except SimdistError as err:
        raise type(err)(err.problem, field="--model", fix=err.fix) from None


def context(problem: SearchProblem) -> Context:
    ctx = _CONTEXTS.get(problem)
    if ctx is None:
        if len(_CONTEXTS) > 8:
            _CONTEXTS.clear()
        topology = load_topology(problem.cluster, num_nodes=problem.num_nodes)
        ctx = _CONTEXTS[problem] = Context(topology, resolve_problem_model(problem), CommPricer(topology))
    return ctx


def step_config(problem: SearchProblem, c: Candidate, ctx: Context) -> StepConfig:
    """The StepConfig simdist.predict.step.step_config builds from the equivalent scenario (even layer split)."""
    model, gpu = ctx.model, ctx.topology.gpu
    return StepConfig(
        model=model, gpu=gpu, mesh=Mesh(tp=c.tp, cp=c.cp, dp=c.dp, pp=c.pp), schedule=c.schedule,
        micro_batch_size=c.micro_batch_size, global_batch_size=problem.global_batch_size,
        layers_per_stage=(model.num_layers // c.pp,) * c.pp, vpp=c.vpp, recompute=c.recompute,
        precision=problem.precision, sequence_parallel=c.sequence_parallel, zero_stage=c.zero_stage,
        attention=ATTENTION, zero3_fetch=problem.zero3_fetch if c.zero_stage == 3 else "prefetch",
        capacity_bytes=gpu.hbm_capacity)


def evaluate_one(problem: SearchProblem, c: Candidate, ctx: Context) -> dict[str, Any]:
    step = analytic_step(step_config(problem, c, ctx), ctx.pricer)
    memory = peak_memory_bytes(c, ctx.model, global_batch_size=problem.global_batch_size,
                               precision=problem.precision, attention=ATTENTION)
    return {"key": c.key, "layout": c.as_dict(), "memory_per_gpu_bytes": memory, **step.as_dict()}


def evaluate_batch(problem: SearchProblem, batch: list[Candidate]) -> list[dict[str, Any]]:
    """Closed-form results of ``batch``, in its order (runs in a worker process, or on a Dask worker)."""
    ctx = context(problem)
    return [evaluate_one(problem, c, ctx) for c in batch]
