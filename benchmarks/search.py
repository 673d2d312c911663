"""Benchmark of the layout search: closed-form configurations per second, and the engine re-simulation of the top k.

Run from the repository root with the project's virtualenv active:

    python benchmarks/search.py [--model gpt3-175b] [--cluster dgx-a100] [--gpus 1024] [--global-batch 1536]
                                [--workers 1] [--top 3] [--min-configs 10000] [--readme] [--readme-phases]
                                [--any-layout] [--dask-local 2]

Figures:
- cold: the first sweep over the feasible layouts (collective prices computed and cached), of the closed form with
  every collective alone (`run --fidelity closed_form`'s) and with the contention estimate search ranks by;
- warm: the same sweep again, median of three (cached prices and chunk costs): the per-configuration cost; and of
  it the compiled timeline loop with its breakdown sweep alone (its arguments captured during one sweep and run
  again: median of 5 passes), and where the loop's steps go: per configuration the steps of its program and those
  the loop ran (the rest jumped over in the steady state, simdist.analytic.steady), by schedule, interleaving and
  pipeline stages (the groups that run the most first);
- 10k: --min-configs evaluations (the feasible set repeated) with --workers processes, or on a Dask LocalCluster of
  --dask-local workers (issue 32: 10^6 configurations on 2 workers; the workers with the README's settings,
  simdist.search.executors.DASK_WORKER_SETTINGS, in jobs of DaskExecutor.job_size as a search splits them), wall
  time;
- engine: simdist.predict.step.predict_step on the top k, seconds each;
- --readme: the README's default search (`simdist search --model gpt3-175b ...`) as a whole process, median wall of
  three runs and peak resident memory;
- --readme-phases: the same search three more times, each in a process of its own with its phases timed (enumeration,
  compute bounds, schedule bounds, alone closed forms, closed forms with the contention estimate, the engine's
  re-simulations, placement, and the rest: imports and output), medians: what moved when the whole process's wall
  time is lost in a noisy machine's spread.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simdist.search.evaluate import evaluate_batch
from simdist.search.executors import DASK_WORKER_SETTINGS, dask_env_name, make_executor
from simdist.search.rank import enumerate_feasible, resimulate
from simdist.search.space import SearchProblem
from simdist.search.sweep import BATCH


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--cluster", default="dgx-a100")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--global-batch", type=int, default=1536)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--min-configs", type=int, default=10_000)
    ap.add_argument("--readme", action="store_true", help="also time the README's default search, whole process")
    ap.add_argument("--readme-phases", action="store_true", help="also time the README's default search's phases "
                    "(three processes, medians)")
    ap.add_argument("--phases-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=BATCH, help=f"configurations per job (default {BATCH}, the sweep's)")
    ap.add_argument("--dask-local", type=int, default=0, metavar="N",
                    help="run the --min-configs evaluations on a Dask LocalCluster of N single-threaded worker "
                         "processes (pip install 'simdist[dask]') instead of --workers")
    ap.add_argument("--any-layout", action="store_true", help="every layout, not only those Megatron-Core runs "
                    "(the space the issue-32 figures of 12-20 ms per configuration were measured on)")
    a = ap.parse_args()
    if a.phases_child:
        phases_child()
        return
    problem = SearchProblem(a.model, a.cluster, a.gpus // 8, a.global_batch, framework_layouts=not a.any_layout)
    t = time.perf_counter()
    feasible, pruned, n, *_ = enumerate_feasible(problem)
    enum_s = time.perf_counter() - t
    print(f"{n} layouts enumerated, {len(feasible)} feasible, {len(pruned)} pruned in {enum_s:.2f} s")
    rows: list = []
    for label, p in (("closed form (every collective alone)", dataclasses.replace(problem, contention=False)),
                     ("closed form + contention estimate (what search ranks by)", problem)):
        t = time.perf_counter()
        rows = evaluate_batch(p, feasible)
        cold = time.perf_counter() - t
        warms = []
        for _ in range(3):
            t = time.perf_counter()
            evaluate_batch(p, feasible)
            warms.append(time.perf_counter() - t)
        warm = statistics.median(warms)
        print(f"{label}: cold {cold:.2f} s ({cold / len(feasible) * 1e6:.0f} us per config), warm (median of 3) "
              f"{warm:.3f} s ({len(feasible) / warm:,.0f} configs/s, {warm / len(feasible) * 1e6:.0f} us per config)")
    loop_alone(problem, feasible)
    many = (feasible * (a.min_configs // len(feasible) + 1))[:a.min_configs]
    cluster = client = None
    if a.dask_local:
        import dask
        from distributed import Client, LocalCluster

        # the worker settings the README recommends (DASK_WORKER_SETTINGS), as environment variables the spawned
        # worker processes read when they start, and in this process's configuration, which a LocalCluster's
        # nannies hand their workers (over the variables: without it the workers ran at Dask's defaults)
        for key, value in DASK_WORKER_SETTINGS.items():
            os.environ.setdefault(dask_env_name(key), str(value))
        dask.config.set(DASK_WORKER_SETTINGS)
        cluster = LocalCluster(n_workers=a.dask_local, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    where = f"a Dask LocalCluster of {a.dask_local} worker(s)" if client is not None else f"{a.workers} worker(s)"
    t = time.perf_counter()
    try:
        with make_executor(workers=a.workers, dask=client) as ex:
            size = ex.job_size(len(many), a.batch)  # as simdist.search.sweep splits a phase's candidates
            jobs = [(problem, many[i:i + size]) for i in range(0, len(many), size)]
            for _ in ex.run(evaluate_batch, jobs):
                pass
    finally:
        if client is not None:
            client.close()
            cluster.close()
    big = time.perf_counter() - t
    print(f"{len(many):,} configs on {where} (cold caches per worker): {big:.2f} s ({len(many) / big:,.0f} configs/s)")
    if a.readme:
        readme_search(a.workers)
    if a.readme_phases:
        readme_phases()
    rows.sort(key=lambda r: -r["tokens_per_s"])
    for row in rows[:a.top]:
        t = time.perf_counter()
        out, _ = resimulate(problem, row)
        print(f"engine {row['key']}: {time.perf_counter() - t:.2f} s, closed form {row['step_time_s']:.3f} s vs engine "
              f"{out.get('engine_step_time_s', float('nan')):.3f} s")


def loop_alone(problem: SearchProblem, feasible: list) -> None:
    """The compiled timeline loop with its breakdown sweep alone (simdist.analytic.timeline_jit.timed, what the warm
    figure spends in numba): its arguments captured during one warm sweep, then run again, median of 5 passes, per
    configuration."""
    import simdist.analytic.timeline as timeline
    import simdist.analytic.timeline_jit as jit

    timed, observables, calls, shapes = jit.timed, timeline._compiled_observables, [], []

    def capture(*args):
        calls.append(args)
        return timed(*args)

    def shape(cfg, stages, packed, num_microbatches):
        shapes.append((cfg.schedule, cfg.vpp, cfg.mesh.pp))
        return observables(cfg, stages, packed, num_microbatches)

    jit.timed = capture  # simdist.analytic.timeline._compiled_observables imports it at each call
    timeline._compiled_observables = shape
    try:
        evaluate_batch(problem, feasible)
    finally:
        jit.timed, timeline._compiled_observables = timed, observables
    passes = []
    for _ in range(5):
        t = time.perf_counter()
        for args in calls:
            timed(*args)
        passes.append(time.perf_counter() - t)
    per_config_us = statistics.median(passes) / len(feasible) * 1e6
    print(f"  of which the compiled timeline loop and breakdown alone: {per_config_us:.0f} us per config (median of 5 "
          f"passes over the {len(calls)} calls of one sweep)")
    loop_steps(jit, calls, shapes)


def loop_steps(jit, calls: list, shapes: list) -> None:
    """Where the loop's steps go: each captured call run again without the breakdown (simdist.analytic.timeline_jit.
    run, which returns the steps it ran; the rest it jumped over in the steady state), by schedule, interleaving and
    pipeline stages, the groups that run the most steps first."""
    groups: dict[tuple, list[int]] = {}
    for key, args in zip(shapes, calls, strict=True):
        (*head, _flops, _simple_flops, _parts, sends, steps, counts, backward, spans, body, tolerance) = args
        ran = jit.run(*head, sends, steps, counts, backward, False, spans, body, tolerance)[-1]
        g = groups.setdefault(key, [0, 0, 0])
        g[0] += 1
        g[1] += steps.shape[1]
        g[2] += ran
    total_steps = sum(g[1] for g in groups.values())
    total_ran = sum(g[2] for g in groups.values())
    print(f"  steps per config: {total_steps / len(calls):,.0f} in the programs, {total_ran / len(calls):,.0f} run "
          f"({1 - total_ran / total_steps:.0%} jumped over in the steady state); the most run:")
    for (schedule, vpp, pp), (n, programmed, ran) in sorted(groups.items(), key=lambda kv: -kv[1][2])[:5]:
        print(f"    {schedule} vpp {vpp} pp {pp}: {n} configs, {programmed / n:,.0f} steps each, {ran / n:,.0f} run, "
              f"{ran / total_ran:.0%} of all the steps run")


README_SEARCH = ["search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "1024", "--global-batch", "1536",
                 "--top", "3"]


def readme_search(workers: int) -> None:
    """The README's default search as a whole process, three times: median wall time and the peak resident memory
    of the process (and of its worker processes, with --workers > 1: a process's rusage counts its waited-for
    children), each run's own (os.wait4: not this benchmark's other children, whose helper holds its sweeps)."""
    walls, peaks = [], []
    for _ in range(3):
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "simdist", *README_SEARCH, "--workers", str(workers)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        walls.append(time.perf_counter() - t)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, proc.args)
        peaks.append(usage.ru_maxrss / 1024)  # KiB on Linux -> MiB
    print(f"README default search ({workers} worker(s)): median wall {statistics.median(walls):.2f} s "
          f"(runs {', '.join(f'{w:.2f}' for w in walls)}), peak RSS {max(peaks):.0f} MiB "
          f"(runs {', '.join(f'{p:.0f}' for p in peaks)})")


PHASES = {"simdist.search.rank": ("enumerate_feasible", "resimulate", "placement_gain"),
          "simdist.search.sweep": ("quick_screen_batch", "screen_batch", "alone_screen_batch", "evaluate_batch")}
"""The functions each phase of a search runs in (in this process: the sweep's executor calls them here)."""
PHASE_NAMES = {"enumerate_feasible": "enumeration", "quick_screen_batch": "compute bounds",
               "screen_batch": "schedule bounds", "alone_screen_batch": "alone closed forms",
               "evaluate_batch": "closed forms with contention", "resimulate": "engine",
               "placement_gain": "placement (its own engine runs included)"}


def phases_child() -> None:
    """(In a process of its own, started by `readme_phases`.) The README's search with its phases timed: one line
    ``PHASES {json}`` on stderr, seconds by phase and the whole process's."""
    import importlib
    import json

    start = time.perf_counter()
    spent: dict[str, float] = {}
    active: list[str] = []  # a phase called inside another (placement's engine runs) counts as the outer one

    def timing(name: str, f):
        def timed(*args, **kwargs):
            if active:
                return f(*args, **kwargs)
            active.append(name)
            t = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
                active.pop()
        return timed

    for module, names in PHASES.items():
        mod = importlib.import_module(module)
        for name in names:
            setattr(mod, name, timing(name, getattr(mod, name)))
    from simdist.cli import app

    with contextlib.suppress(SystemExit):  # (the command line's exit)
        app(README_SEARCH, prog_name="simdist")
    spent["whole"] = time.perf_counter() - start
    print("PHASES " + json.dumps(spent), file=sys.stderr)


def readme_phases() -> None:
    """`phases_child` three times, each in a fresh process: the median seconds of each phase."""
    import json

    runs = []
    for _ in range(3):
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--phases-child"], check=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = next(x for x in reversed(done.stderr.splitlines()) if x.startswith("PHASES "))
        runs.append(json.loads(line[len("PHASES "):]))
    medians = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in (*PHASE_NAMES, "whole")}
    # the rest: imports, the problem's set-up, the output (the interpreter's start is before "whole")
    rest = medians["whole"] - sum(medians[k] for k in PHASE_NAMES)
    parts = ", ".join(f"{PHASE_NAMES[k]} {medians[k]:.2f} s" for k in PHASE_NAMES)
    print(f"README default search, phases (median of 3 processes, in-process executor): {parts}; rest "
          f"{rest:.2f} s; whole {medians['whole']:.2f} s from the script's start")


if __name__ == "__main__":
    main()
