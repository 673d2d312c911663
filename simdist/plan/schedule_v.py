"""Two-chunk pipeline schedules: ZB-V, DualPipe and DualPipeV (their placements, orders and bubble formulas).

Each stage holds two model chunks and splits the backward into B (input gradient) and W (weight gradient), as
zb_h1 does (simdist.plan.schedule); the orders are data in the same form (per stage, `Step`s in program order).

- ``zb_v`` (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241 sec. 6, and Qi et al. 2024,
  "Pipeline Parallelism with Controllable Memory", arXiv:2405.15362): the model is cut into 2K parts laid out as
  a V: stage s holds chunk 0 = part s and chunk 1 = part 2K-1-s, so a micro-batch runs down the stages and back
  and its loss (the last part) is on stage 0. The order is the paper's greedy heuristic (arXiv:2401.10241 sec.
  3.1, applied to the V placement as sec. 6 does) run on unit step times: a free stage runs a ready B (chunk 1
  first), else a ready F (chunk 1 first) while fewer than 2K chunk micro-batches are in flight (F done, W not:
  2K half-size chunks = 1F1B's peak of K whole-stage micro-batches, the paper's memory bound), else its oldest
  deferred W. The papers give ZB-V no closed form beyond "near zero bubble when T_F = T_B = T_W"; `bubble_formula`
  gives the bound every V order obeys (see there), and the tests pin how close this order comes.
- ``dualpipe`` (DeepSeek-AI 2024, DeepSeek-V3 technical report, arXiv:2412.19437 sec. 3.2.1, Table 2): a
  bidirectional pipeline: the model is cut into K parts, half the micro-batches run stages 0..K-1 and half run
  K-1..0, so stage s holds part s (chunk 0, direction 0) and part K-1-s (chunk 1, direction 1): two copies of
  the parameters. The order follows the eight phases of deepseek-ai/DualPipe's ``DualPipe.step`` (warm-up
  forwards, forward pairs, zero-bubble B/W, the F&B steady state, cool-down backwards, deferred W), restated
  here as data. Table 2: bubble (PP/2-1)(F&B + B - 3W), PP+1 micro-batches of activations, 2x parameters.
  Needs an even K and an even M >= 2K (DualPipe asserts both).
- ``dualpipev`` (deepseek-ai/DualPipe README, "DualPipeV", the "cut-in-half" schedule of Sea AI Lab): DualPipe
  on 2K stages folded onto K devices: the V placement of zb_v (one copy of the parameters) and DualPipe's
  phases with rank r of K and M micro-batches, all of them running the V. README table: the same bubble
  (PP/2-1)(F&B + B - 3W) with PP = 2K stages, and PP+1 = 2K+1 chunk micro-batches of activations. Needs M >= 2K.

# Assumption: DualPipe overlaps the forward of one micro-batch with the backward of another on one stage (F&B:
# their communication hides under each other's compute). The op graph runs one compute step at a time per stage,
# so F&B takes F + B here: no overlap gain; `bubble_formula` evaluates Table 2 with F&B = F + B, which the
# simulation matches exactly for uniform stages when F = B_input = W (tests).
# Assumption: DualPipe's two copies are two modules with their own parameters, gradients and optimizer state
# (deepseek-ai/DualPipe examples/example_dualpipe.py builds rank r's DualPipe from two PipelineStage modules
# loaded with parts r and PP-1-r, and sums each copy's gradients with its twin's on rank PP-1-r after the step):
# a training step's memory counts both copies' (simdist.plan.step_memory: layers_on_stage and the stage's layers), its
# data-parallel reduction and optimizer run per copy (a chunk each, simdist.plan.data_parallel.tail), and the exchange
# of the twins' gradients between ranks r and PP-1-r is not timed.
# A DualPipe backward that is not deferred (its "full" backward) is B followed at once by its W, and its gradient
# goes out after the W, as the whole pass ends; an F&B pair's outputs both go out when the pair ends, and the
# other sends DualPipe holds back (step 2's) wait as there (`late_sends`; the op graph sends then).
"""

from __future__ import annotations

from collections.abc import Callable

from simdist.errors import SpecError

__all__ = [
    "TWO_CHUNK_SCHEDULES",
    "V_SCHEDULES",
    "check_two_chunk",
    "dualpipe_order",
    "dualpipev_order",
    "late_sends",
    "microbatch_direction",
    "part_location",
    "two_chunk_bubble",
    "two_chunk_part",
    "two_chunk_text",
    "zb_v_order",
]

V_SCHEDULES = ("zb_v", "dualpipev")
"""Schedules of the V placement: stage s holds model parts s and 2K-1-s (vpp = 2)."""
TWO_CHUNK_SCHEDULES = (*V_SCHEDULES, "dualpipe")
"""Schedules whose stages hold two chunks; dualpipe's are two copies (parts s and K-1-s of K parts, vpp = 1)."""

StepOf = Callable[..., object]


def two_chunk_part(schedule: str, stage: int, chunk: int, num_stages: int) -> int:
    """The model part of ``chunk`` on ``stage``: V: s or 2K-1-s; dualpipe: s (direction 0) or K-1-s (direction 1)."""
    if schedule == "dualpipe":
        return stage if chunk == 0 else num_stages - 1 - stage
    return stage if chunk == 0 else 2 * num_stages - 1 - stage


def microbatch_direction(schedule: str, microbatch: int, num_microbatches: int) -> int:
    """dualpipe: 0 for the first half of the micro-batches (stages 0..K-1), 1 for the rest; 0 otherwise."""
    return int(schedule == "dualpipe" and microbatch >= num_microbatches // 2)


def part_location(schedule: str, part: int, num_stages: int, direction: int = 0) -> tuple[int, int]:
    """(stage, chunk) that runs model ``part`` (the inverse of `two_chunk_part`; dualpipe: in ``direction``)."""
    k = num_stages
    if schedule == "dualpipe":
        return (part, 0) if direction == 0 else (k - 1 - part, 1)
    return (part, 0) if part < k else (2 * k - 1 - part, 1)


def check_two_chunk(name: str, *, num_stages: int, num_microbatches: int, vpp: int) -> None:
    """zb_v, dualpipe, dualpipev's own rules (simdist.plan.schedule.check_schedule checks the common ones)."""
    need = 1 if name == "dualpipe" else 2
    if vpp != need:
        what = ("holds parts s and K-1-s of a model cut into pp parts (two copies of the parameters)"
                if name == "dualpipe" else "cuts the model into 2 pp parts laid out as a V (2 chunks per stage)")
        raise SpecError(f"schedule {name} {what}, so it needs vpp {need}, not {vpp}", field="parallel.vpp",
                        fix=f"set vpp to {need} (parallel.vpp, or --virtual {need})")
    if name == "dualpipe" and num_stages % 2:
        raise SpecError(f"dualpipe runs half the micro-batches from each end and needs an even pp, not {num_stages}",
                        field="parallel.pp", fix=f"use pp {num_stages + 1} or {max(num_stages - 1, 2)}, or "
                                                 "schedule dualpipev (any pp)")
    least = 2 * num_stages
    if name == "dualpipe" and (num_microbatches % 2 or num_microbatches < least):
        up = max(least, num_microbatches + num_microbatches % 2)
        raise SpecError(f"dualpipe needs an even number of micro-batches, at least 2 x pp = {least}, not "
                        f"{num_microbatches} (half run each direction; DeepSeek's DualPipe asserts both)",
                        field="training.global_batch_size",
                        fix=f"make global_batch_size / (micro_batch_size x dp) even and >= {least}, e.g. {up}")
    if name == "dualpipev" and num_microbatches < least:
        raise SpecError(f"dualpipev needs at least 2 x pp = {least} micro-batches, not {num_microbatches} "
                        "(DeepSeek's DualPipeV asserts it)", field="training.global_batch_size",
                        fix=f"make global_batch_size / (micro_batch_size x dp) at least {least}")


def zb_v_order(k: int, m: int, step: StepOf) -> list[list]:
    """Every stage's ZB-V order (module docstring): the greedy heuristic on unit step times."""
    parts = [(s, 2 * k - 1 - s) for s in range(k)]
    last = 2 * k - 1
    f_end: dict[tuple[int, int], int] = {}  # (micro-batch, part) -> end time of its F
    b_end: dict[tuple[int, int], int] = {}
    next_f = [[0, 0] for _ in range(k)]
    next_b = [[0, 0] for _ in range(k)]
    deferred: list[list[tuple[int, int]]] = [[] for _ in range(k)]
    live = [0] * k
    left = [6 * m] * k
    orders: list[list] = [[] for _ in range(k)]
    t = 0
    while any(left):
        moved = False
        for s in range(k):
            if not left[s]:
                continue
            pick = None
            for c in (1, 0):  # a ready B, chunk 1 (the earlier part of the backward) first
                i, p = next_b[s][c], parts[s][c]
                if i < m and f_end.get((i, p), t + 1) <= t and (p == last or b_end.get((i, p + 1), t + 1) <= t):
                    pick = ("B", i, c)
                    break
            if pick is None and live[s] < 2 * k:
                for c in (1, 0):
                    i, p = next_f[s][c], parts[s][c]
                    if i < m and (p == 0 or f_end.get((i, p - 1), t + 1) <= t):
                        pick = ("F", i, c)
                        break
            if pick is None and deferred[s]:
                pick = ("W", *deferred[s].pop(0))
            if pick is None:
                continue
            kind, i, c = pick
            orders[s].append(step(kind, i, c))
            left[s] -= 1
            moved = True
            if kind == "F":
                f_end[(i, parts[s][c])] = t + 1
                next_f[s][c] += 1
                live[s] += 1
            elif kind == "B":
                b_end[(i, parts[s][c])] = t + 1
                next_b[s][c] += 1
                deferred[s].append((i, c))
            else:
                live[s] -= 1
        if not moved and t > 6 * m + 4 * k:  # pragma: no cover - the rules above always progress
            raise RuntimeError(f"zb_v order stalled at K={k}, M={m}")
        t += 1
    return orders


def _dual_phases(rank: int, ranks: int, chunks: int, run: Callable[[str, int, bool], int],
                 late: Callable[[int, int], None], edge: bool) -> None:
    """DualPipe's eight phases on ``rank`` of ``ranks`` with ``chunks`` micro-batches per phase (deepseek-ai/DualPipe
    ``DualPipe.step``; DualPipeV's are these with rank r of 2K). ``run(kind, phase, zb)`` records one step and
    returns its index: F or B of the phase's next micro-batch (zb: B defers its W; otherwise its W follows at
    once), or W, the oldest deferred one. ``late(a, b)``: step a's output is sent when step b ends (DualPipe sends
    an F&B pair's outputs after both). ``edge``: DualPipe's middle rank, DualPipeV's last rank."""
    half = ranks // 2
    h = min(rank, ranks - 1 - rank)
    for _ in range(2 * (half - h - 1)):  # 1: forwards of phase 0
        run("F", 0, False)
    held = -1
    for i in range(h + 1):  # 2: forward pairs; off the edge the phase-0 output leaves after the phase-1 forward
        f0 = run("F", 0, False)
        f1 = run("F", 1, False)
        if not edge:
            late(f0, f1)
        elif i == h:
            held = f1  # the edge's last phase-1 forward leaves after the first steady-state forward
    for _ in range(half - h - 1):  # 3: B (W deferred), that W, F of phase 1
        run("B", 1, True)
        run("W", 0, False)
        run("F", 1, False)
    for _ in range(chunks - ranks + h + 1):  # 4: the steady state, F0&B1 then F1&B0 (outputs after each pair)
        f0 = run("F", 0, False)
        if held >= 0:
            late(held, f0)
            held = -1
        late(f0, run("B", 1, False))
        late(run("F", 1, False), run("B", 0, False))
    for _ in range(half - h - 1):  # 5: B1, then F1&B0
        run("B", 1, False)
        late(run("F", 1, False), run("B", 0, False))
    zb = False
    for i in range(h + 1):  # 6: backward pairs, the second half with W deferred
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        run("B", 1, zb)
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        run("B", 0, zb)
    for _ in range(half - h - 1):  # 7: a deferred W, then B0 with its W deferred
        run("W", 0, False)
        run("B", 0, True)
    for _ in range(h + 1):  # 8: the remaining deferred W
        run("W", 0, False)


def _dual_order(rank: int, ranks: int, chunks: int, chunk_of: Callable[[int], int],
                microbatch_of: Callable[[int, int], int], edge: bool
                ) -> tuple[list[tuple[str, int, int]], dict[int, int]]:
    """One stage's DualPipe(V) order as (kind, micro-batch, chunk), and where each late send waits: step index ->
    the index of the step whose end sends it (a full backward's W; a pair's B or its W)."""
    order: list[tuple[str, int, int]] = []
    after: dict[int, int] = {}
    next_f, next_b = [0, 0], [0, 0]
    deferred: list[tuple[int, int]] = []

    def run(kind: str, phase: int, zb: bool) -> int:
        if kind == "W":
            order.append(("W", *deferred.pop(0)))
            return len(order) - 1
        chunk = chunk_of(phase)
        counter = next_f if kind == "F" else next_b
        i = microbatch_of(chunk, counter[phase])
        counter[phase] += 1
        order.append((kind, i, chunk))
        at = len(order) - 1
        if kind == "B":
            if zb:
                deferred.append((i, chunk))
            else:  # a full backward: its W at once, its gradient sent when the whole pass ends
                order.append(("W", i, chunk))
                after[at] = len(order) - 1
                return len(order) - 1
        return at

    def late(a: int, b: int) -> None:
        after[a] = after.get(b, b)

    _dual_phases(rank, ranks, chunks, run, late, edge)
    return order, after


def _dual(name: str, k: int, m: int) -> list[tuple[list[tuple[str, int, int]], dict[int, int]]]:
    if name == "dualpipe":  # M/2 per direction; past the middle the phases swap (phase 0 starts at the near end)
        half_m = m // 2
        return [_dual_order(s, k, half_m, lambda phase, s=s: phase ^ int(s >= k // 2),
                            lambda chunk, n: chunk * half_m + n, s in (k // 2 - 1, k // 2)) for s in range(k)]
    return [_dual_order(s, 2 * k, m, lambda phase: phase, lambda chunk, n: n, s == k - 1) for s in range(k)]


def late_sends(name: str, num_stages: int, num_microbatches: int
               ) -> dict[tuple[int, str, int, int], tuple[str, int, int]]:
    """DualPipe(V)'s sends that wait for a later step on the stage: (stage, kind, micro-batch, chunk) of the step
    whose output is sent -> (kind, micro-batch, chunk) of the step whose end sends it. Empty for other schedules."""
    if name not in ("dualpipe", "dualpipev"):
        return {}
    out: dict[tuple[int, str, int, int], tuple[str, int, int]] = {}
    for s, (order, after) in enumerate(_dual(name, num_stages, num_microbatches)):
        for a, b in after.items():
            if order[a][0] != "W":
                out[(s, *order[a])] = order[b]
    return out


def dualpipe_order(k: int, m: int, step: StepOf) -> list[list]:
    """DualPipe on K (even) stages, M (even) micro-batches: M/2 per direction (deepseek-ai/DualPipe)."""
    return [[step(*st) for st in order] for order, _ in _dual("dualpipe", k, m)]


def dualpipev_order(k: int, m: int, step: StepOf) -> list[list]:
    """DualPipeV on K stages (DualPipe's phases as rank r of 2K ranks, phase = chunk), M micro-batches."""
    return [[step(*st) for st in order] for order, _ in _dual("dualpipev", k, m)]


def two_chunk_bubble(name: str, *, num_stages: int, num_microbatches: int, forward_s: float, backward_s: float,
                     weight_grad_share: float) -> float:
    """The bubble fraction (idle / total stage-time) for uniform stages and free p2p; times are a whole stage's.

    dualpipe: DeepSeek-V3 Table 2: bubble (PP/2-1)(F&B + B - 3W) per stage over the M (F + B) of work, with F, B,
    W one chunk's forward, full backward and weight-gradient times (a chunk is one of K parts: a whole stage's
    times) and F&B = F + B (module docstring's Assumption): (K/2-1)(F + 2B - 3W) / (M(F+B) + that).
    dualpipev: the README's same formula with PP = 2K stages of half a device each: F, B, W are half the stage's
    times and each device does 2M chunk passes: (K-1)(F + 2B - 3W)/2 / (M(F+B) + that), with stage times.
    zb_v: a lower bound, not the paper's (it gives none): stage K-1 starts after the K-1 chunk forwards before
    it, so the makespan is at least M(F+B) + (K-1)F/2 (stage times): bubble >= (K-1)F/2 / (M(F+B) + (K-1)F/2).
    The heuristic order stays within a few chunk steps of it (tests).
    """
    k, m = num_stages, num_microbatches
    f, b, w = forward_s, backward_s, backward_s * weight_grad_share
    work = m * (f + b)
    if name == "dualpipe":
        idle = (k / 2 - 1) * ((f + b) + b - 3 * w)
    elif name == "dualpipev":
        idle = (k - 1) * ((f + b) + b - 3 * w) / 2
    else:
        idle = (k - 1) * f / 2
    return idle / (work + idle)


def two_chunk_text(name: str) -> str:
    """The formula `two_chunk_bubble` evaluates, as text for tables (stage times F, B = B_input + W, W)."""
    return {
        "dualpipe": "(K/2-1)(F&B+B-3W)/(M(F+B)+..), F&B=F+B",
        "dualpipev": "(2K/2-1)(F&B+B-3W)/(..) per half-stage chunk, F&B=F+B",
    }.get(name, ">= (K-1)(F/2)/(M(F+B)+(K-1)F/2) (lower bound)")
