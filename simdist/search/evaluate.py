"""Evaluate candidates with the closed form (simdist.analytic.step): the functions every executor runs
(`screen_batch`: a lower bound of each step; `evaluate_batch`: the exact closed form, with the contention estimate
of simdist.search.contention where the problem asks for it: the bound, of the contention-free step, stays below).

A candidate is the problem's base scenario with its layout set (`candidate_spec`: a ``model_copy`` of one
validated `ScenarioSpec`), and it goes through the same builder and validity check as `simdist run`
(simdist.plan.layout.step_config_of), for the closed form here and for the engine in simdist.search.rank. A worker
builds the problem's cluster, model and collective-price cache once (``context``) and keeps them for every batch
of the same problem, so the prices computed for one layout serve the next. Prices are keyed by group shape
(simdist.analytic.pricing.CommPricer), never by evaluation order, so a result does not depend on which worker
computed it or what it computed before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simdist.analytic.bound import compute_bound_s, lower_bound_s
from simdist.analytic.step import CommPricer, analytic_step
from simdist.errors import SimdistError, SpecError
from simdist.hardware import load_topology
from simdist.hardware.topology import Topology
from simdist.plan.layer_split import parse_layout
from simdist.plan.layout import step_config_of
from simdist.plan.mesh import Mesh, parse_order
from simdist.plan.model import Model
from simdist.plan.model_presets import resolve_model
from simdist.plan.step import StepConfig
from simdist.plan.step_memory import peak_memory_bytes
from simdist.predict.cluster import cluster_of
from simdist.search.contention import ContendedPricer
from simdist.search.space import Candidate, SearchProblem
from simdist.spec.scenario import ModelSpec, ScenarioSpec

ATTENTION = "flash"


@dataclass(slots=True)
class Context:
    topology: Topology
    model: Model
    pricer: CommPricer
    base: ScenarioSpec
    """The problem as a scenario; every candidate is a copy with its layout set."""
    contended: dict[Mesh, ContendedPricer] = field(default_factory=dict)
    """A contention-aware pricer per mesh (`contended_pricer`), kept for the candidates that share the mesh."""
    factors: dict[tuple, float] = field(default_factory=dict)
    """Contention factors by group and translates placed, shared by the meshes' pricers (ContendedPricer)."""
    configs: dict[str, tuple[StepConfig, float]] = field(default_factory=dict)
    """(StepConfig, peak memory per GPU) by candidate key, kept from pruning to the closed form (`configured`): a
    search builds each feasible layout's once in its process."""
    memory: dict[Candidate, float] = field(default_factory=dict)
    """Peak memory per GPU by candidate without its placement (`configured`)."""
    compute_bounds: dict[Candidate, float] = field(default_factory=dict)
    """Compute bound by candidate without its placement (`quick_screen_batch`)."""
    verdicts: dict[Candidate, tuple[str, Any] | None] = field(default_factory=dict)
    """Pruning's verdict (rule and reason, or None: feasible) by candidate without its placement, for a dense model
    (simdist.search.prune.why_pruned)."""
    placed: dict[Candidate, StepConfig] = field(default_factory=dict)
    """A StepConfig of each dense layout built, by the layout without its placement (`configured`)."""
    too_big: dict[tuple, int] = field(default_factory=dict)
    """The smallest micro-batch pruned for memory, by the candidate's other fields (simdist.search.prune)."""


def contended_pricer(ctx: Context, mesh: Mesh) -> ContendedPricer:
    """The problem's pricer with its contention estimate on ``mesh`` (simdist.search.contention), one per mesh."""
    hit = ctx.contended.get(mesh)
    if hit is None:
        if len(ctx.contended) >= 64:
            ctx.contended.clear()
        hit = ctx.contended[mesh] = ContendedPricer(ctx.topology, mesh, ctx.pricer, ctx.factors)
    return hit


_CONTEXTS: dict[SearchProblem, Context] = {}


def resolve_problem_model(problem: SearchProblem) -> Model:
    if problem.base:  # the base scenario's model (a preset, inline fields or an hf_config at an absolute path)
        return resolve_model(base_spec(problem).model)
    spec = ModelSpec(preset=problem.model, seq_length=problem.seq_length) if problem.seq_length else ModelSpec(
        preset=problem.model)
    try:
        return resolve_model(spec)
    except SimdistError as err:
        raise type(err)(err.problem, field="--model", fix=err.fix) from None


def base_spec(problem: SearchProblem) -> ScenarioSpec:
    """The scenario a search varies the layout of (validated once)."""
    if problem.base:
        return _scenario_base(problem.base)
    model: dict[str, Any] = {"preset": problem.model}
    if problem.seq_length:
        model["seq_length"] = problem.seq_length
    cluster_key = "file" if Path(problem.cluster).suffix in (".yaml", ".yml") else "preset"
    flags = {"training.precision": "--precision", "model.seq_length": "--seq",
             "training.global_batch_size": "--global-batch", "cluster": "--cluster", "model": "--model"}
    try:
        return _base_spec(problem, model, cluster_key)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        flag = next((f for k, f in flags.items() if where.startswith(k)), "--model")
        raise SpecError(f"{where}: {first['msg']}", field=flag, fix="see simdist search --help") from None


@lru_cache(maxsize=16)
def _scenario_base(text: str) -> ScenarioSpec:
    return ScenarioSpec.model_validate_json(text)


def _base_spec(problem: SearchProblem, model: dict[str, Any], cluster_key: str) -> ScenarioSpec:
    return ScenarioSpec.model_validate({
        "name": f"{problem.model} on {problem.num_nodes} x {problem.cluster}",
        "cluster": {cluster_key: problem.cluster, "num_nodes": problem.num_nodes},
        "model": model,
        "training": {"global_batch_size": problem.global_batch_size, "precision": problem.precision,
                     "attention": ATTENTION},
    })


def candidate_spec(problem: SearchProblem, base: ScenarioSpec, c: Candidate) -> ScenarioSpec:
    """``base`` with the candidate's layout, schedule and training settings (a copy; no file, no re-parse)."""
    parallel = base.parallel.model_copy(update={"tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp, "vpp": c.vpp,
                                                "sequence_parallel": c.sequence_parallel,
                                                "zero_stage": c.zero_stage, **({"order": c.order} if c.order else {}),
                                                "ep": c.ep, "etp": c.etp or None,
                                                "layers_per_stage": _split(base, c.pp),
                                                "pipeline_layout": _layout(base.parallel.pipeline_layout,
                                                                           c.pp * (c.vpp or 1))})
    training = base.training.model_copy(update={
        "micro_batch_size": c.micro_batch_size, "recompute": c.recompute,
        "zero3_fetch": problem.zero3_fetch if c.zero_stage == 3 else "prefetch"})
    return base.model_copy(update={"name": f"{problem.model} {c.key} on {problem.num_nodes} x {problem.cluster}",
                                   "parallel": parallel, "training": training, "schedule": c.schedule})


@lru_cache(maxsize=64)
def _layout(layout: str | None, num_parts: int) -> str | None:
    """The base scenario's Megatron-LM pipeline layout where the candidate has its number of model parts (pp x
    vpp), else none: the candidate's layers are split as Megatron-LM splits them by default (`pipeline_split`)."""
    if layout is None:
        return None
    try:
        return layout if len(parse_layout(layout)) == num_parts else None
    except SimdistError:
        return layout  # a bad layout: the layout check names it


def _split(base: ScenarioSpec, pp: int) -> list[int] | None:
    """The base scenario's explicit layers per stage where the candidate keeps its stage count, else none."""
    split = base.parallel.layers_per_stage
    return split if split is not None and len(split) == pp else None


def context(problem: SearchProblem) -> Context:
    ctx = _CONTEXTS.get(problem)
    if ctx is None:
        if len(_CONTEXTS) > 8:
            _CONTEXTS.clear()
        topology = (cluster_of(base_spec(problem)) if problem.base else
                    load_topology(problem.cluster, num_nodes=problem.num_nodes))
        ctx = _CONTEXTS[problem] = Context(topology, resolve_problem_model(problem), CommPricer(topology),
                                           base_spec(problem))
    return ctx


def step_config(problem: SearchProblem, c: Candidate, ctx: Context) -> StepConfig:
    """The candidate's StepConfig, built (and checked) as `simdist run` builds a scenario's."""
    return configured(problem, c, ctx)[0]


CONFIGS_MAX = 50_000
"""Candidates whose StepConfig and memory a process keeps (`configured`; about 1 KiB each)."""


def configured(problem: SearchProblem, c: Candidate, ctx: Context) -> tuple[StepConfig, float]:
    """(the candidate's StepConfig, its peak memory per GPU: simdist.plan.step_memory.peak_memory_bytes), built once per
    process and candidate (pruning, the bounds and the closed form all read them)."""
    hit = ctx.configs.get(c.key)
    if hit is None:
        if len(ctx.configs) >= CONFIGS_MAX:
            ctx.configs.clear()
            ctx.memory.clear()
            ctx.placed.clear()
        layout = c.unplaced
        template = ctx.placed.get(layout)
        if template is not None:
            # another placement of a dense layout already built: its StepConfig with this one's axis order (the
            # one field the order decides without experts or faults; tests/test_search_prune.py compares the two)
            cfg = dataclasses.replace(template, mesh=dataclasses.replace(
                template.mesh, order=parse_order(c.order or ctx.base.parallel.order)))
        else:
            cfg = step_config_of(candidate_spec(problem, ctx.base, c), ctx.topology, ctx.model)
            faults = ctx.base.faults
            if ctx.model.num_experts == 0 and not faults.stragglers and not faults.heterogeneous_nodes:
                ctx.placed[layout] = cfg
        # the placements of one layout need the same memory (no input of simdist.plan.step_memory's memory model is the
        # mesh's axis order): found once
        memory = ctx.memory.get(layout)
        if memory is None:
            memory = ctx.memory[layout] = peak_memory_bytes(cfg)
        hit = ctx.configs[c.key] = (cfg, memory)
    return hit


def evaluate_one(problem: SearchProblem, c: Candidate, ctx: Context) -> dict[str, Any]:
    """The candidate's closed form: with its contention estimate where the problem asks (what search ranks by),
    else with every collective alone (`run --fidelity closed_form`'s)."""
    cfg, memory = configured(problem, c, ctx)
    # compiled: a search times thousands of steps (simdist.analytic.step.COMPILE_STEPS), always the same path
    step = analytic_step(cfg, contended_pricer(ctx, cfg.mesh) if problem.contention else ctx.pricer, compiled=True)
    return {"key": c.key, "layout": c.as_dict(), "memory_per_gpu_bytes": memory, **step.as_dict()}


def tokens_of(problem: SearchProblem) -> float:
    """Tokens (samples for an encoder) of one step of the problem: what a throughput is counted in."""
    ctx = context(problem)
    return problem.global_batch_size * (ctx.model.seq_length if ctx.model.kind == "decoder" else 1)


def _bound_row(c: Candidate, memory: float, bound: float, kind: str, tokens: float) -> dict[str, Any]:
    return {"key": c.key, "layout": c.as_dict(), "memory_per_gpu_bytes": memory,
            "step_time_lower_bound_s": bound, "tokens_per_s_upper_bound": tokens / bound if bound > 0 else 0.0,
            "lower_bound": kind}


def quick_screen_batch(problem: SearchProblem, batch: list[Candidate]) -> list[dict[str, Any]]:
    """`screen_batch` with the looser compute-only bound (simdist.analytic.bound.compute_bound_s): every layout's
    first screen, cheap; the search refines it with `screen_batch` only where it cannot rule a layout out."""
    ctx = context(problem)
    tokens = tokens_of(problem)
    out = []
    for c in batch:
        # the placements of one layout have the same compute bound and memory (neither reads the mesh's axis
        # order): the first one's, without building the others' configs
        layout = c.unplaced
        bound, memory = ctx.compute_bounds.get(layout), ctx.memory.get(layout)
        if bound is None or memory is None:
            cfg, memory = configured(problem, c, ctx)
            bound = ctx.compute_bounds[layout] = compute_bound_s(cfg)
        out.append(_bound_row(c, memory, bound, "compute", tokens))
    return out


def screen_batch(problem: SearchProblem, batch: list[Candidate]) -> list[dict[str, Any]]:
    """A lower bound of each candidate's step (simdist.analytic.bound.lower_bound_s, O(stages x chunks)), its
    memory, and the upper bound of its throughput, in ``batch``'s order."""
    ctx = context(problem)
    tokens = tokens_of(problem)
    out = []
    for c in batch:
        cfg, memory = configured(problem, c, ctx)
        out.append(_bound_row(c, memory, lower_bound_s(cfg, ctx.pricer), "schedule", tokens))
    return out


def alone_screen_batch(problem: SearchProblem, batch: list[Candidate]) -> list[dict[str, Any]]:
    """The closed form with every collective alone (`run --fidelity closed_form`'s step), as a lower bound of the
    one with the contention estimate the search ranks by: with it a collective takes at least its time alone
    (simdist.search.contention: a factor of at least 1 on its transfer) and the closed form's step never shortens
    when a collective lengthens (simdist.search.sweep). Its stages are the ones `screen_batch` priced already."""
    ctx = context(problem)
    return [{"key": c.key, "step_time_lower_bound_s": analytic_step(step_config(problem, c, ctx), ctx.pricer,
                                                                     compiled=True).step_time_s} for c in batch]


def evaluate_batch(problem: SearchProblem, batch: list[Candidate]) -> list[dict[str, Any]]:
    """Closed-form results of ``batch``, in its order (runs in a worker process, or on a Dask worker)."""
    ctx = context(problem)
    return [evaluate_one(problem, c, ctx) for c in batch]
