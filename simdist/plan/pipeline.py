"""The pipeline skeleton of an op graph: a schedule's steps on every stage, wired across stages.

`build_pipeline` asks a `PipelineEmitter` for the ops of each step (so a caller can add tensor-parallel
communication, recompute, ... inside a step) and for the op that moves an activation or gradient between
stages, then adds the dependencies a pipeline imposes (Narayanan et al. 2021, arXiv:2104.04473 sec. 2.2):
F of model part j needs F of part j-1; B of part j needs B of part j+1 (the last part's B needs its own F);
every B needs its own F; every W needs its B. `pipeline_graph` builds the uniform graph `simdist bubble` runs.
Parts sit where the schedule places them (simdist.plan.schedule.model_part: Megatron's interleaving, the V of
zb_v and dualpipev, dualpipe's two directions), so a send goes wherever the next part is (none within a stage).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from simdist.errors import SpecError
from simdist.plan.opgraph import Comm, Op, OpGraph
from simdist.plan.schedule import (
    SPLIT_BACKWARD,
    TWO_CHUNK_SCHEDULES,
    WEIGHT_GRAD_SHARE,
    Step,
    check_schedule,
    chunks_per_stage,
    model_part,
    num_model_parts,
    part_location,
    schedule_order,
)
from simdist.plan.schedule_v import late_sends, microbatch_direction

__all__ = ["PipelineEmitter", "UniformCosts", "UniformEmitter", "build_pipeline", "pipeline_graph"]

StepKey = tuple[int, str, int, int]
"""(stage, kind, microbatch, chunk)."""

KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight_grad"}


class PipelineEmitter(Protocol):
    def compute(self, graph: OpGraph, stage: int, step: Step) -> tuple[int, int]:
        """Add the ops of ``step`` on ``stage`` (a chain; first and last op id); deps inside the chain are the
        emitter's business. Called in program order per stage."""
        ...

    def transfer(self, graph: OpGraph, src_stage: int, dst_stage: int, step: Step) -> int | None:
        """Add the op that sends the activation (F) or gradient (B) of ``step`` from src to dst stage; None if
        no op is needed (then the dependency is direct)."""
        ...


def build_pipeline(graph: OpGraph, order: list[list[Step]], emitter: PipelineEmitter, *, vpp: int = 1,
                   schedule: str = "1f1b") -> dict[StepKey, tuple[int, int]]:
    """Add every stage's steps (program order) and the cross-stage dependencies; return the steps' op ids.

    Pass 1 creates the ops, stage by stage in program order: a step's compute chain, then (for F and B with
    a neighbour part) its transfer op, which depends on the chain's last op. Pass 2 adds the dependencies
    that point across stages (they may point forward in op-id order). ``schedule`` places the parts
    (`model_part`); ``vpp`` is the scenario's (zb_v, dualpipe and dualpipev run two chunks a stage).
    """
    k = len(order)
    if schedule in TWO_CHUNK_SCHEDULES:
        return _build_placed(graph, order, emitter, vpp=vpp, schedule=schedule)
    num_parts = k * vpp
    steps: dict[StepKey, tuple[int, int]] = {}
    sends: dict[StepKey, int] = {}
    ops = graph.ops  # OpGraph.add and extend append to this list: ids index it
    compute, transfer = emitter.compute, emitter.transfer
    # Once per step of the schedule (every micro-batch): `model_part` and `_neighbour` inline, `OpGraph.depend` too
    for stage, stage_order in enumerate(order):
        for step in stage_order:
            kind, mb, chunk = step.kind, step.microbatch, step.chunk
            key = (stage, kind, mb, chunk)
            if key in steps:
                raise SpecError(f"stage {stage} runs {step.label(vpp)} twice", field="schedule",
                                fix="give each (kind, micro-batch, chunk) once per stage")
            if not 0 <= chunk < vpp:
                raise SpecError(f"stage {stage} step {step.label(vpp)} names chunk {chunk} of {vpp}",
                                field="parallel.vpp", fix=f"use chunks 0..{vpp - 1}")
            first, last = compute(graph, stage, step)
            steps[key] = (first, last)
            part = chunk * k + stage  # model_part(stage, chunk, k)
            if kind == "F":  # _neighbour: the next part for F, the previous for B
                nxt = part + 1 if part + 1 < num_parts else -1
            elif kind == "B":
                nxt = part - 1
            else:
                nxt = -1
            if nxt >= 0:
                op = transfer(graph, stage, nxt % k, step)
                if op is not None:
                    deps = ops[op].deps  # graph.depend(op, last)
                    if last not in deps:
                        deps.append(last)
                    sends[key] = op
    for (stage, kind, mb, chunk), (first, _) in steps.items():
        deps = ops[first].deps  # graph.depend(first, *needs), needs in this order
        part = chunk * k + stage
        if kind == "F" or kind == "B":
            src = part - 1 if kind == "F" else part + 1
            if 0 <= src < num_parts:
                src_key = (src % k, kind, mb, src // k)
                if src_key not in steps:
                    raise SpecError(f"stage {stage} runs {kind}{mb} of part {part}, but part {src}'s {kind}{mb} "
                                    "is never run", field="schedule", fix="run every step on every stage")
                d = sends.get(src_key)
                if d is None:
                    d = steps[src_key][1]
                if d not in deps:
                    deps.append(d)
        if kind == "B" or kind == "W":
            own = (stage, "F" if kind == "B" else "B", mb, chunk)
            got = steps.get(own)
            if got is None:
                raise SpecError(f"stage {stage} runs {kind}{mb} without its {own[1]}{mb}", field="schedule",
                                fix="run every step on every stage")
            if got[1] not in deps:
                deps.append(got[1])
    return steps


def _build_placed(graph: OpGraph, order: list[list[Step]], emitter: PipelineEmitter, *, vpp: int, schedule: str
                  ) -> dict[StepKey, tuple[int, int]]:
    """`build_pipeline` for the two-chunk placements (simdist.plan.schedule_v): the same two passes, with the
    parts located by `model_part` and `part_location` (dualpipe's by the micro-batch's direction)."""
    k = len(order)
    chunks = chunks_per_stage(schedule, vpp)
    num_parts = num_model_parts(schedule, k, vpp)
    m = len({st.microbatch for st in order[0]}) if order else 0
    late = late_sends(schedule, k, m)  # DualPipe(V) sends that leave when a later step on the stage ends
    waiting: dict[StepKey, list[Step]] = {}  # the step whose end sends them -> those steps
    steps: dict[StepKey, tuple[int, int]] = {}
    sends: dict[StepKey, int] = {}
    ops = graph.ops

    def near(part: int, mb: int) -> tuple[int, int]:
        return part_location(part, k, schedule, microbatch_direction(schedule, mb, m))

    def send(stage: int, step: Step, last: int) -> None:
        """The output of ``step`` leaves ``stage`` when op ``last`` ends."""
        part = model_part(stage, step.chunk, k, schedule)
        nxt = part + 1 if step.kind == "F" else part - 1
        if not 0 <= nxt < num_parts:
            return
        dst = near(nxt, step.microbatch)[0]
        op = emitter.transfer(graph, stage, dst, step) if dst != stage else None  # the V's turn: no send
        if op is None:
            sends[(stage, step.kind, step.microbatch, step.chunk)] = last
            return
        if last not in ops[op].deps:
            ops[op].deps.append(last)
        sends[(stage, step.kind, step.microbatch, step.chunk)] = op

    for stage, stage_order in enumerate(order):
        for step in stage_order:
            kind, mb, chunk = step.kind, step.microbatch, step.chunk
            key = (stage, kind, mb, chunk)
            if key in steps:
                raise SpecError(f"stage {stage} runs {step.label(chunks)} twice", field="schedule",
                                fix="give each (kind, micro-batch, chunk) once per stage")
            if not 0 <= chunk < chunks:
                raise SpecError(f"stage {stage} step {step.label(chunks)} names chunk {chunk} of {chunks}",
                                field="parallel.vpp", fix=f"use chunks 0..{chunks - 1}")
            first, last = emitter.compute(graph, stage, step)
            steps[key] = (first, last)
            if kind != "W":
                target = late.get(key)
                if target is None:
                    send(stage, step, last)
                else:
                    waiting.setdefault((stage, *target), []).append(step)
            for held in waiting.pop(key, ()):
                send(stage, held, last)
    if waiting:  # pragma: no cover - late_sends names later steps of the same stage only
        raise SpecError(f"sends wait for steps never run: {sorted(waiting)[:3]}", field="schedule",
                        fix="run every step on every stage")
    for (stage, kind, mb, chunk), (first, _) in steps.items():
        deps = ops[first].deps
        part = model_part(stage, chunk, k, schedule)
        if kind in ("F", "B"):
            src = part - 1 if kind == "F" else part + 1
            if 0 <= src < num_parts:
                src_stage, src_chunk = near(src, mb)
                src_key = (src_stage, kind, mb, src_chunk)
                if src_key not in steps:
                    raise SpecError(f"stage {stage} runs {kind}{mb} of part {part}, but part {src}'s {kind}{mb} "
                                    "is never run", field="schedule", fix="run every step on every stage")
                d = sends[src_key]
                if d not in deps:
                    deps.append(d)
        if kind in ("B", "W"):
            got = steps.get((stage, "F" if kind == "B" else "B", mb, chunk))
            if got is None:
                raise SpecError(f"stage {stage} runs {kind}{mb} without its {'F' if kind == 'B' else 'B'}{mb}",
                                field="schedule", fix="run every step on every stage")
            if got[1] not in deps:
                deps.append(got[1])
    return steps


@dataclass(frozen=True, slots=True)
class UniformCosts:
    """Step times for `simdist bubble`: per stage (len K), for a whole stage's model part; chunk time = /vpp
    (zb_v, dualpipev: /2, the stage's two halves; dualpipe: each chunk is a whole stage's part, a copy)."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    """Input and weight gradients together (zb_h1 splits it by ``weight_grad_share``)."""
    p2p_s: float = 0.0
    """Time of one activation or gradient send between stages."""
    weight_grad_share: float = WEIGHT_GRAD_SHARE
    """zb_h1: the share of B that is W (simdist.plan.schedule.WEIGHT_GRAD_SHARE)."""

    @classmethod
    def uniform(cls, num_stages: int, forward_s: float = 1.0, backward_s: float = 2.0, **kw: float) -> UniformCosts:
        return cls((forward_s,) * num_stages, (backward_s,) * num_stages, **kw)

    def check(self, num_stages: int) -> None:
        for name, times in (("forward_s", self.forward_s), ("backward_s", self.backward_s)):
            if len(times) != num_stages:
                raise SpecError(f"{len(times)} {name} times for {num_stages} stages", field=f"costs.{name}",
                                fix=f"give one time per stage ({num_stages})")
            for t in times:
                if not (math.isfinite(t) and t > 0):
                    raise SpecError(f"stage time {t} must be a positive number of seconds", field=f"costs.{name}",
                                    fix="give times > 0, e.g. 1")
        if not (math.isfinite(self.p2p_s) and self.p2p_s >= 0):
            raise SpecError(f"p2p time {self.p2p_s} must be >= 0", field="costs.p2p_s", fix="give 0 or more seconds")
        if not 0 < self.weight_grad_share < 1:
            raise SpecError(f"weight-gradient share {self.weight_grad_share} must lie in (0, 1)",
                            field="costs.weight_grad_share", fix="use 0.5 (W = B/2)")


@dataclass(slots=True)
class UniformEmitter:
    """One compute op per step on rank = stage; one send op per transfer on the sender's ``pp`` stream."""

    costs: UniformCosts
    vpp: int = 1
    split_backward: bool = False
    """zb_h1: B is the input gradient only (1 - weight_grad_share of the backward time), W the rest."""
    share: int | None = None
    """Parts per stage: a chunk takes 1/share of the stage's times (None: vpp; dualpipe: 1, a whole part)."""

    def compute(self, graph: OpGraph, stage: int, step: Step) -> tuple[int, int]:
        c = self.costs
        if step.kind == "F":
            time_s = c.forward_s[stage]
        elif step.kind == "W":
            time_s = c.backward_s[stage] * c.weight_grad_share
        else:
            time_s = c.backward_s[stage] * ((1 - c.weight_grad_share) if self.split_backward else 1.0)
        op = graph.add(Op(name=f"{step.label(self.vpp)}@s{stage}", rank=stage, stream="compute",
                          kind=KIND_NAMES[step.kind], duration_s=time_s / (self.share or self.vpp), stage=stage,
                          microbatch=step.microbatch, chunk=step.chunk))
        return op, op

    def transfer(self, graph: OpGraph, src_stage: int, dst_stage: int, step: Step) -> int | None:
        if self.costs.p2p_s == 0:
            return None
        return graph.add(Op(name=f"send {step.label(self.vpp)} s{src_stage}->s{dst_stage}", rank=src_stage,
                            stream="pp", kind="comm", duration_s=self.costs.p2p_s, stage=src_stage,
                            microbatch=step.microbatch, chunk=step.chunk,
                            comm=Comm("send_recv", (src_stage, dst_stage), 0.0, "pp")))


def pipeline_graph(schedule: str, *, num_stages: int, num_microbatches: int, vpp: int = 1,
                   costs: UniformCosts) -> OpGraph:
    """A graph with one rank per stage (rank = stage), streams ``compute`` and ``pp``."""
    check_schedule(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp)
    costs.check(num_stages)
    order = schedule_order(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp)
    graph = OpGraph()
    em = UniformEmitter(costs, chunks_per_stage(schedule, vpp), split_backward=schedule in SPLIT_BACKWARD,
                        share=num_model_parts(schedule, num_stages, vpp) // num_stages)
    build_pipeline(graph, order, em, vpp=vpp, schedule=schedule)
    return graph
