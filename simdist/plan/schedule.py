"""Pipeline schedules as data: per stage, the steps (F, B, W of a micro-batch and model chunk) in program order.

``schedule_order`` returns a list (one entry per pipeline stage) of `Step` lists; the op graph built from it
(simdist.plan.pipeline) decides *when* each step runs, so one order serves every cost model. Schedules:

- ``gpipe`` (Huang et al. 2019, arXiv:1811.06965 sec. 2.2): every forward, then every backward. Backwards run
  in micro-batch order (0, 1, ...), as Narayanan et al. 2021 (arXiv:2104.04473) fig. 3 draws GPipe; with
  uniform stages reverse order gives the same makespan.
- ``1f1b`` (PipeDream-Flush; Narayanan et al. 2021 sec. 2.2.1, Megatron-LM
  ``forward_backward_pipelining_without_interleaving``): stage s warms up with min(K-s-1, M) forwards, then
  alternates one forward and one backward, then drains the remaining backwards.
- ``interleaved_1f1b`` (Narayanan et al. 2021 sec. 2.2.2, Megatron-LM
  ``forward_backward_pipelining_with_interleaving``): V model chunks per stage, micro-batches in groups of K,
  warm-up (K-s-1)*2 + (V-1)*K forwards (at most M*V); needs M % K == 0 as Megatron did.
- ``zb_h1`` (Qi et al. 2023, arXiv:2401.10241 sec. 3.1): B is split into B (input gradient, on the critical
  path) and W (weight gradient, deferrable); the F/B order is 1F1B's and stage s defers each W by s
  backwards, so at most K micro-batches are in flight on any stage (1F1B's peak, on stage 0) while the
  deferred W passes fill the cool-down bubble.

- ``zb_v``, ``dualpipe``, ``dualpipev``: two chunks per stage with B split from W (simdist.plan.schedule_v: their
  sources, orders, placements and formulas).

Chunk c of stage s holds model part c*K + s (Megatron's layout), so a micro-batch visits stages 0..K-1 V times;
zb_v and dualpipev place parts as a V and dualpipe bidirectionally (`model_part`, `part_location`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from simdist.errors import SpecError
from simdist.plan import schedule_v
from simdist.plan.schedule_v import TWO_CHUNK_SCHEDULES, V_SCHEDULES

__all__ = ["SCHEDULES", "SPLIT_BACKWARD", "TWO_CHUNK_SCHEDULES", "V_SCHEDULES", "WEIGHT_GRAD_SHARE", "Step",
           "bubble_formula", "bubble_formula_text", "chunk_microbatches", "chunks_per_stage", "model_part",
           "num_model_parts", "part_location", "part_table", "schedule_order", "stage_steps"]

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", *TWO_CHUNK_SCHEDULES)
SPLIT_BACKWARD = ("zb_h1", *TWO_CHUNK_SCHEDULES)
"""Schedules whose B is the input gradient only, with a W step per (micro-batch, chunk) for the weight gradient."""
STEP_KINDS = ("F", "B", "W")
# Assumption: zb_h1's weight-gradient pass W is half of the backward (2 of its 4 GEMM passes: Qi et al. 2023 sec 2.1
# measure T_W close to T_B, the input-gradient pass); the training step and `simdist bubble` both use this share.
WEIGHT_GRAD_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Step:
    kind: str
    """"F" forward, "B" backward (input and weight gradients; in zb_h1 the input gradient only), "W" weight grad."""
    microbatch: int
    chunk: int = 0
    """Virtual-pipeline model chunk (interleaved_1f1b); 0 otherwise."""

    def label(self, vpp: int = 1) -> str:
        """``F3``, or ``F3.1`` (chunk as suffix) when the stage holds several chunks."""
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if vpp > 1 else "")


def model_part(stage: int, chunk: int, num_stages: int, schedule: str = "1f1b") -> int:
    """The model part that chunk ``chunk`` of ``stage`` holds: Megatron-LM's interleaved layout, or the V /
    bidirectional placement of zb_v, dualpipev, dualpipe (simdist.plan.schedule_v.two_chunk_part)."""
    if schedule in TWO_CHUNK_SCHEDULES:
        return schedule_v.two_chunk_part(schedule, stage, chunk, num_stages)
    return chunk * num_stages + stage


@lru_cache(maxsize=1024)
def part_table(num_stages: int, vpp: int, schedule: str = "1f1b") -> tuple[tuple[int, ...], ...]:
    """Per stage, the model part each of its chunks holds (`model_part` of every stage and chunk), made once per
    shape: layer splits and step configurations read it for thousands of layouts."""
    return tuple(tuple(model_part(s, c, num_stages, schedule) for c in range(chunks_per_stage(schedule, vpp)))
                 for s in range(num_stages))


def part_location(part: int, num_stages: int, schedule: str = "1f1b", direction: int = 0) -> tuple[int, int]:
    """(stage, chunk) that holds model ``part`` (`model_part`'s inverse; dualpipe: for micro-batches of
    ``direction``, simdist.plan.schedule_v.microbatch_direction)."""
    if schedule in TWO_CHUNK_SCHEDULES:
        return schedule_v.part_location(schedule, part, num_stages, direction)
    return part % num_stages, part // num_stages


def chunks_per_stage(schedule: str, vpp: int) -> int:
    """Model chunks a stage runs: vpp, or 2 for zb_v, dualpipe (two copies) and dualpipev."""
    return 2 if schedule in TWO_CHUNK_SCHEDULES else vpp


def num_model_parts(schedule: str, num_stages: int, vpp: int) -> int:
    """Parts the model is cut into: K vpp (dualpipe: K, each held twice)."""
    return num_stages if schedule == "dualpipe" else num_stages * vpp


def chunk_microbatches(schedule: str, chunk: int, num_microbatches: int) -> tuple[int, int]:
    """(first, last) micro-batch that ``chunk`` of a stage runs: 0 and M-1, or dualpipe's half for the chunk's
    direction (chunk c runs micro-batches c M/2 .. (c+1) M/2 - 1: simdist.plan.schedule_v.microbatch_direction)."""
    if schedule == "dualpipe":
        half = num_microbatches // 2
        return chunk * half, chunk * half + half - 1
    return 0, num_microbatches - 1


def check_schedule(name: str, *, num_stages: int, num_microbatches: int, vpp: int = 1) -> None:
    """Raise a SpecError (with the field and the fix) unless the schedule can run this pipeline."""
    if name not in SCHEDULES:
        raise SpecError(f"unknown schedule '{name}'", field="schedule", fix=f"use one of: {', '.join(SCHEDULES)}")
    if not isinstance(num_stages, int) or num_stages < 1:
        raise SpecError(f"pipeline stages must be a whole number >= 1, not {num_stages}", field="parallel.pp",
                        fix="give 1 or more stages")
    if not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise SpecError(f"micro-batches must be a whole number >= 1, not {num_microbatches}",
                        field="training.global_batch_size",
                        fix="global_batch_size / (micro_batch_size x dp) must be at least 1")
    if not isinstance(vpp, int) or vpp < 1:
        raise SpecError(f"virtual pipeline size must be a whole number >= 1, not {vpp}", field="parallel.vpp",
                        fix="use vpp 1 (no interleaving) or more")
    if name in TWO_CHUNK_SCHEDULES:
        schedule_v.check_two_chunk(name, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp)
        return
    if vpp > 1 and name != "interleaved_1f1b":
        raise SpecError(f"schedule {name} runs one model chunk per stage, but vpp is {vpp}", field="parallel.vpp",
                        fix="set vpp to 1, or use schedule interleaved_1f1b")
    if name == "interleaved_1f1b" and num_microbatches % num_stages:
        up = -(-num_microbatches // num_stages) * num_stages
        # Megatron-LM's interleaved schedule asserted this (schedules.py, "number of microbatches ... should
        # be divisible by pipeline-model-parallel-size when using interleaved schedule").
        raise SpecError(
            f"interleaved_1f1b needs the number of micro-batches ({num_microbatches}) to be a multiple of the "
            f"pipeline stages ({num_stages})", field="training.global_batch_size",
            fix=f"make global_batch_size / (micro_batch_size x dp) a multiple of pp, e.g. {up} micro-batches")


def schedule_order(name: str, *, num_stages: int, num_microbatches: int, vpp: int = 1) -> list[list[Step]]:
    """Per stage, the steps in program order (see the module docstring for each schedule)."""
    check_schedule(name, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp)
    return [list(row) for row in _orders(name, num_stages, num_microbatches, vpp)]


def stage_steps(name: str, *, num_stages: int, num_microbatches: int, vpp: int = 1) -> list[np.ndarray]:
    """`schedule_order` as numbers: per stage, its steps in program order, each as (kind index in STEP_KINDS x
    num_microbatches + micro-batch) x vpp + chunk (no `Step` objects where the schedule is laid out in numpy)."""
    check_schedule(name, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp)
    k, m = num_stages, num_microbatches
    if name == "interleaved_1f1b":
        return [_interleaved(s, k, m, vpp) for s in range(k)]
    vpp = chunks_per_stage(name, vpp)
    return [np.fromiter(((_KIND[st.kind] * m + st.microbatch) * vpp + st.chunk for st in row), dtype=np.int64,
                        count=len(row)) for row in _orders(name, k, m, vpp)]


@lru_cache(maxsize=16)
def _orders(name: str, k: int, m: int, vpp: int) -> tuple[tuple[Step, ...], ...]:
    """`schedule_order`, cached by its arguments (the closed form's program and the op graph of one step read
    the same orders; a few entries: one of 2,048 micro-batches of 7 chunks on 16 stages holds 460,000 references),
    its steps shared by every stage that runs them (values: they are frozen)."""
    vpp = chunks_per_stage(name, vpp)
    table = [Step(kind, i, c) for kind in STEP_KINDS for i in range(m) for c in range(vpp)]

    def step(kind: str, i: int, chunk: int = 0) -> Step:
        return table[(_KIND[kind] * m + i) * vpp + chunk]

    if name == "interleaved_1f1b":
        return tuple(tuple(table[j] for j in _interleaved(s, k, m, vpp).tolist()) for s in range(k))
    if name in TWO_CHUNK_SCHEDULES:
        build_all = {"zb_v": schedule_v.zb_v_order, "dualpipe": schedule_v.dualpipe_order,
                     "dualpipev": schedule_v.dualpipev_order}[name]
        return tuple(tuple(row) for row in build_all(k, m, step))
    build = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "zb_h1": _zb_h1}[name]
    return tuple(tuple(build(s, k, m, step)) for s in range(k))


_KIND = {kind: i for i, kind in enumerate(STEP_KINDS)}


def _gpipe(stage: int, k: int, m: int, step: Callable[..., Step]) -> list[Step]:
    return [step("F", i) for i in range(m)] + [step("B", i) for i in range(m)]


def _one_f_one_b(stage: int, k: int, m: int, step: Callable[..., Step]) -> list[Step]:
    # Narayanan et al. 2021 sec. 2.2.1; Megatron-LM: num_warmup = min(pp - rank - 1, num_microbatches).
    warmup = min(k - stage - 1, m)
    order = [step("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [step("F", warmup + i), step("B", i)]
    order += [step("B", i) for i in range(m - warmup, m)]
    return order


def _interleaved(stage: int, k: int, m: int, vpp: int) -> np.ndarray:
    """The stage's steps as indices into `_orders`' table of steps (kind, micro-batch, chunk)."""
    # Megatron-LM forward_backward_pipelining_with_interleaving: the n-th forward of a stage is micro-batch
    # (n // (K V)) K + n % K of chunk (n mod K V) // K; backwards visit the chunks in reverse.
    group = k * vpp
    total = m * vpp
    n = np.arange(total)
    microbatch, chunk = (n // group) * k + n % k, (n % group) // k
    forward = microbatch * vpp + chunk  # STEP_KINDS: F first, then B
    backward = (m + microbatch) * vpp + vpp - 1 - chunk
    # warm-up forwards, then one forward and one backward in turn, then the remaining backwards
    warmup = min((k - stage - 1) * 2 + (vpp - 1) * k, total)
    steady = total - warmup
    order = np.empty(2 * total, dtype=np.int64)
    order[:warmup] = forward[:warmup]
    order[warmup:warmup + 2 * steady:2] = forward[warmup:]
    order[warmup + 1:warmup + 2 * steady:2] = backward[:steady]
    order[warmup + 2 * steady:] = backward[steady:]
    return order


def _zb_h1(stage: int, k: int, m: int, step: Callable[..., Step]) -> list[Step]:
    # Qi et al. 2023 sec. 3.1 (ZB-H1): 1F1B's F/B order; W(i) runs right after B(i + s) on stage s (the
    # "adjusted starting points of W"), and the deferred W's end the stage. In flight (F done, W not):
    # 1F1B's K - s plus s deferred = K at most, 1F1B's peak.
    order: list[Step] = []
    next_w = 0
    for st in _one_f_one_b(stage, k, m, step):
        order.append(st)
        if st.kind == "B" and st.microbatch >= stage:
            order.append(step("W", next_w))
            next_w += 1
    order += [step("W", i) for i in range(next_w, m)]
    return order


def bubble_formula(name: str, *, num_stages: int, num_microbatches: int, vpp: int = 1, forward_s: float = 1.0,
                   backward_s: float = 2.0, weight_grad_share: float = 0.5) -> float:
    """The closed-form bubble fraction (idle / total stage-time) for uniform stages and free p2p.

    gpipe, 1f1b: (K-1)/(M+K-1) (Narayanan et al. 2021 sec. 2.2.1: bubble (K-1)(tf+tb) over an ideal M(tf+tb)).
    interleaved_1f1b: (K-1)/(V M+K-1) (sec. 2.2.2: the bubble shrinks by V).
    zb_h1 (Qi et al. 2023 sec. 3.1, for M >= K): bubble time (K-1)(T_F + T_B - T_W) per stage, with T_B the
    input-gradient and T_W the weight-gradient time, so the fraction is
    (K-1)(T_F+T_B-T_W) / (M(T_F+T_B+T_W) + (K-1)(T_F+T_B-T_W)). For M < K (not in the paper) the critical path
    of our order is M+K-1 (F, B) pairs then one W, i.e. makespan (M+K-1)(T_F+T_B) + max(M-K+1, 1) T_W covers
    both cases. The paper draws T_F = T_B = T_W; the fixed order matches this exactly (simulated, tests) when
    T_W = T_B <= T_F, e.g. W = B/2 with tb = 2 tf: (K-1)/(3M+K-1). Otherwise the simulation shows more bubble.
    """
    k, m, v = num_stages, num_microbatches, vpp
    if name in TWO_CHUNK_SCHEDULES:
        return schedule_v.two_chunk_bubble(name, num_stages=k, num_microbatches=m, forward_s=forward_s,
                                           backward_s=backward_s, weight_grad_share=weight_grad_share)
    if name == "interleaved_1f1b":
        return (k - 1) / (v * m + k - 1)
    if name == "zb_h1":
        t_w = backward_s * weight_grad_share
        t_b = backward_s - t_w
        makespan_s = (m + k - 1) * (forward_s + t_b) + max(m - k + 1, 1) * t_w
        return max(1.0 - m * (forward_s + backward_s) / makespan_s, 0.0)
    return (k - 1) / (m + k - 1)


def bubble_formula_text(name: str) -> str:
    """The formula ``bubble_formula`` evaluates, as text for tables."""
    if name in TWO_CHUNK_SCHEDULES:
        return schedule_v.two_chunk_text(name)
    return {
        "interleaved_1f1b": "(K-1)/(V*M+K-1)",
        "zb_h1": "(K-1)(F+Bi-W)/(M(F+B)+(K-1)(F+Bi-W)), M>=K",
    }.get(name, "(K-1)/(M+K-1)")
