"""Branch and bound over a search's feasible layouts: which get the exact closed form, which only a bound.

Every layout gets the cheapest bound first; a tighter one only where the looser cannot decide what happens to it,
and the exact closed form (the search's ranking: with its contention estimate, simdist.search.contention) only
where no bound rules the layout out. The bounds, loosest first (`TIERS`), each a bound of the next:

1. compute alone (simdist.analytic.bound.compute_bound_s): the busiest stage's chunks' compute seconds, no recipe
   or collective priced;
2. the schedule (simdist.analytic.bound.lower_bound_s): the stages' priced recipes, sends and optimizer;
3. the closed form with every collective alone (only where the search ranks with contention): a collective beside
   its translates takes at least its time alone, and the closed form's step never shortens when a collective
   lengthens (its timeline is a max-plus recurrence in a fixed order: tests/test_analytic_step.py).

The sweep is a fixed sequence of rounds whatever the executor (the same layouts are bounded and evaluated on the
way everywhere), and what it reports does not depend on the rounds or on a resume (`sweep`'s last step).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simdist.search.evaluate import alone_screen_batch, evaluate_batch, quick_screen_batch, screen_batch, tokens_of
from simdist.search.executors import Executor
from simdist.search.results import ResultsWriter, read_results
from simdist.search.space import Candidate, SearchProblem

__all__ = ["BATCH", "ROUND", "sweep"]

BATCH = 64
"""Candidates per job an executor runs (a Dask cluster more where many wait: simdist.search.executors.
DaskExecutor.job_size), and per round of the Pareto front's evaluations."""

ROUND = 4 * BATCH
"""Candidates evaluated per round of the top's branch and bound after its first (a batch: a threshold early); the
Pareto front's rounds are a batch each, so that the front tightens between them. Fixed, whatever the executor."""

REPORTED_TIERS = 2
"""The bounds a report shows (compute, schedule); the third tier only decides what is evaluated."""


def _kth(values: list[float], k: int) -> float:
    """The k-th smallest of ``values`` (inf when fewer)."""
    return sorted(values)[k - 1] if len(values) >= k else float("inf")


def _optimistic_front(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(memory, tokens/s) of the exact rows' Pareto front, by increasing memory."""
    front: list[tuple[float, float]] = []
    best = -1.0
    for r in sorted(rows, key=lambda r: (r["memory_per_gpu_bytes"], -r["tokens_per_s"])):
        if r["tokens_per_s"] > best:
            front.append((r["memory_per_gpu_bytes"], r["tokens_per_s"]))
            best = r["tokens_per_s"]
    return front


def _dominated(memory: float, tokens: float, front: list[tuple[float, float]]) -> bool:
    """Some exact layout needs no more memory and is at least as fast (``front`` by increasing memory)."""
    return any(m <= memory and t >= tokens for m, t in front)


def _open(row: dict[str, Any], threshold: float, front: list[tuple[float, float]]) -> bool:
    """A layout whose compute bound (``row``) the final threshold and exact front cannot rule out: its schedule's
    bound decides whether it is reported exactly, and is the one reported."""
    return row["step_time_lower_bound_s"] <= threshold or not _dominated(row["memory_per_gpu_bytes"],
                                                                          row["tokens_per_s_upper_bound"], front)


class _Bounds:
    """Each candidate's tightest bound so far (``lower``) and its tier (``level``), the rows a report shows
    (``rows``: its schedule bound once found, else its compute bound) and the compute-bound rows (``quick``)."""

    def __init__(self, problem: SearchProblem, run: Callable[..., None], tokens: float) -> None:
        self.tiers: list[Callable[..., list[dict[str, Any]]]] = [quick_screen_batch, screen_batch]
        if problem.contention:
            self.tiers.append(alone_screen_batch)
        self.top = len(self.tiers) - 1
        self.run = run
        self.tokens = tokens
        self.lower: dict[str, float] = {}
        self.level: dict[str, int] = {}
        self.rows: dict[str, dict[str, Any]] = {}
        self.quick: dict[str, dict[str, Any]] = {}

    def screen(self, candidates: list[Candidate], on_rows: Callable[[list[dict[str, Any]]], None]) -> None:
        """The compute bound of every candidate."""
        def sink(rows: list[dict[str, Any]]) -> None:
            for r in rows:
                self.quick[r["key"]] = self.rows[r["key"]] = r
                self.lower[r["key"]] = r["step_time_lower_bound_s"]
                self.level[r["key"]] = 0
            on_rows(rows)
        self.run(self.tiers[0], candidates, sink)

    def tighten(self, candidates: list[Candidate], to: int | None = None) -> None:
        """Each of ``candidates`` one tier up (``to``: up to that tier), loosest first."""
        for level in range(1, self.top + 1 if to is None else to + 1):
            batch = [c for c in candidates if self.level[c.key] == level - 1]
            if not batch:
                continue

            def sink(rows: list[dict[str, Any]], level: int = level) -> None:
                for r in rows:
                    k = r["key"]
                    if level < REPORTED_TIERS:
                        self.rows[k] = r
                    self.lower[k] = max(self.lower[k], r["step_time_lower_bound_s"])
                    self.level[k] = level
            self.run(self.tiers[level], batch, sink)
            if to is None:
                return

    def upper(self, c: Candidate) -> float:
        """The candidate's throughput bound (tokens/s) at its tightest bound."""
        lower = self.lower[c.key]
        return self.tokens / lower if lower > 0 else 0.0


def sweep(problem: SearchProblem, candidates: list[Candidate], executor: Executor, *,
          results_file: Path | None = None, on_progress: Callable[..., None] | None = None, exact_top: int = 10
          ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], bool, int, int]:
    """(exact closed-form results by key, bounded rows by key, interrupted, new, resumed).

    Branch and bound (the module docstring's tiers): every candidate gets the compute bound first; candidates are
    then evaluated exactly in order of their bound while it is no more than the ``exact_top``-th best exact step so
    far, each tightened tier by tier before (a tighter bound may put it past the threshold), so the top
    ``exact_top`` are exactly the closed form's; then every candidate whose optimistic point (its memory, its
    throughput bound) no exact layout dominates is tightened and evaluated too, so the memory-throughput Pareto
    front is exact. The rest are reported with their bound: each is slower than the ``exact_top``-th best and
    dominated on memory and throughput.
    """
    done = read_results(results_file, problem) if results_file is not None else {}
    wanted = {c.key for c in candidates}
    done = {k: v for k, v in done.items() if k in wanted}
    resumed = len(done)
    if on_progress and resumed:
        on_progress(resumed)
    todo = [c for c in candidates if c.key not in done]
    writer = ResultsWriter(results_file, problem) if results_file is not None else None
    interrupted = False
    new = 0
    position = {c.key: i for i, c in enumerate(candidates)}

    def run(fn: Callable, batch: list[Candidate], sink: Callable[[list[dict[str, Any]]], None]) -> None:
        """``fn`` over ``batch`` in jobs of BATCH (the executor's `job_size`: larger on Dask where many wait), each
        job's rows to ``sink`` as it arrives (Ctrl-C keeps them)."""
        size = executor.job_size(len(batch), BATCH)
        for _, rows in executor.run(fn, [(problem, batch[i:i + size]) for i in range(0, len(batch), size)]):
            sink(rows)

    bounds = _Bounds(problem, run, tokens_of(problem))
    try:
        def screened(rows: list[dict[str, Any]]) -> None:
            if on_progress:
                on_progress(len(rows), "lower bounds")

        bounds.screen(candidates, screened)
        lower, level = bounds.lower, bounds.level

        def by_bound(c: Candidate) -> tuple[float, int]:
            return lower[c.key], position[c.key]

        left = sorted(todo, key=by_bound)

        def keep(rows: list[dict[str, Any]]) -> None:
            nonlocal new
            for row in rows:
                done[row["key"]] = row
            new += len(rows)
            if writer is not None:
                writer.write(rows)
            if on_progress:
                on_progress(len(rows))

        def evaluate(batch: list[Candidate]) -> None:
            run(evaluate_batch, batch, keep)

        def retighten(order: list[Candidate], rough: list[Candidate], within: int,
                      keep: Callable[[Candidate], bool] = lambda c: True) -> None:
            """Tighten ``rough`` (some of the first ``within`` of ``order``, which is sorted by bound) and put those
            to ``keep`` back in bound order."""
            bounds.tighten(rough)
            taken = {c.key for c in rough}
            order[:within] = [c for c in order[:within] if c.key not in taken]
            for c in rough:
                if keep(c):
                    insort(order, c, key=by_bound)

        # A short first round sets a threshold early; the rounds decide how much is evaluated, not what is reported
        # (the filter at the end)
        size = BATCH
        while left:  # the top: in order of the bound, while it is no more than the exact_top-th best so far
            threshold = _kth([r["step_time_s"] for r in done.values()], exact_top)
            head = [c for c in left[:size] if lower[c.key] <= threshold]
            rough = [c for c in head if level[c.key] < bounds.top]
            if rough:  # a tighter bound first: it may put them past the threshold, or later in the order
                retighten(left, rough, size)
                continue
            size = ROUND
            if not head:
                break
            evaluate(head)
            left = left[len(head):]

        def dominated(c: Candidate, front: list[tuple[float, float]]) -> bool:
            return _dominated(bounds.rows[c.key]["memory_per_gpu_bytes"], bounds.upper(c), front)

        # The Pareto front: what no exact layout dominates even at its bound. A layout once dominated stays so (the
        # front only grows, a bound only tightens), so the open ones are kept and filtered as either moves.
        front = _optimistic_front(list(done.values()))
        open_ = [c for c in left if not dominated(c, front)]
        while open_:
            rough = [c for c in open_[:BATCH] if level[c.key] < bounds.top]
            if rough:  # the next batch's tighter bounds first (the front grows as the batches before it come in)
                retighten(open_, rough, BATCH, lambda c, front=front: not dominated(c, front))
                continue
            batch = open_[:BATCH]
            evaluate(batch)
            taken = {c.key for c in batch}
            left = [c for c in left if c.key not in taken]
            front = _optimistic_front(list(done.values()))
            open_ = [c for c in open_ if c.key not in taken and not dominated(c, front)]
        # What the report reads is made the same whatever was tightened on the way (rows resumed from a results file
        # were never tightened here, and the rounds tighten some that end up needing less): the schedule's bound
        # wherever the final threshold and front could need it (`_open`), the tightest bound of every exact row
        # within the threshold.
        threshold = _kth([r["step_time_s"] for r in done.values()], exact_top)
        front = _optimistic_front(list(done.values()))
        final = threshold, front
        bounds.tighten([c for c in candidates if level[c.key] < 1 and _open(bounds.quick[c.key], threshold, front)],
                       to=1)
        bounds.tighten([c for c in candidates if c.key in done and level[c.key] < bounds.top
                        and lower[c.key] <= threshold], to=bounds.top)
        if on_progress and left:
            on_progress(len(left))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if writer is not None:
            writer.close()
    rows = bounds.rows
    if not interrupted:
        # Report what does not depend on how the work was batched (or resumed): every layout whose tightest bound is
        # within the exact_top-th best step (the same T whichever rounds found it), and the exact Pareto front;
        # others evaluated on the way are reported by their bound, as the ones never evaluated.
        threshold, front = final
        on_front = set(front)
        done = {k: r for k, r in done.items() if bounds.lower[k] <= threshold
                or (r["memory_per_gpu_bytes"], r["tokens_per_s"]) in on_front}
        rows = {k: v if _open(bounds.quick[k], threshold, front) else bounds.quick[k] for k, v in rows.items()}
    bounded = {k: v for k, v in rows.items() if k not in done}
    return done, bounded, interrupted, new, resumed
