"""Check each cut against the single-process reference and time its training step, on every rank.

`run_steps(config, world_size)` launches the ranks (validation.spawn) and returns rank 0's rows
(`simdist.calibrate.steps.StepMeasurement`), gradient checks (`CheckResult`) and run metadata.

Check: a fresh cut (seeded weights, the same data) takes one step; each rank compares its gradients and
updated weights with the matching shard of `reference_step`, computed on the same rank; the largest absolute
differences and the largest reference gradient are reduced by MAX over ranks. ``grad_rel_err`` is the largest
gradient difference over the largest reference gradient (the scale of the check); fp32 with other summation
orders lands near 1e-7.

Timing (the lecture and nccl-tests): ``warmup`` untimed steps, then ``iters`` steps each preceded by a barrier
(and ``torch.cuda.synchronize()`` on GPU) and closed by a synchronize; per-rank times are reduced by MAX and
SUM all_reduces. ``time_s`` = median over iterations of the max over ranks, ``time_mean_s`` = the mean over
iterations and ranks. The ``single`` cut (the whole batch on one process) runs on rank 0 while the other
ranks wait at a barrier, and is recorded with world_size 1.

Each rank says what it is doing (validation.spawn.doing: the cut, check or timed step i of n), so a fault names
it; rank 0 hands each timed cut to the parent as it finishes (validation.spawn.report), so a failed run keeps
the cuts timed so far (`keep_partial`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simdist.calibrate.steps import StepMeasurement, write_step_measurements_csv
from validation.machine import device_name, start_rank
from validation.mlp.cuts import DDP_BUCKET_BYTES, Cut, build_cut
from validation.mlp.model import MLPConfig, reference_step
from validation.spawn import doing, launch, partial_path, report
from validation.timing import device_sync, median_s, over_ranks, timed_iterations

__all__ = ["ALL_CUTS", "CheckResult", "StepConfig", "keep_partial", "run_steps"]

ALL_CUTS: tuple[str, ...] = ("single", "data_parallel", "data_parallel_bucketed", "tensor_parallel",
                             "pipeline_gpipe", "pipeline_1f1b")


@dataclass(frozen=True, slots=True)
class StepConfig:
    mlp: MLPConfig
    cuts: tuple[str, ...] = ALL_CUTS
    backend: str = "gloo"
    warmup: int = 2
    iters: int = 10
    num_microbatches: int = 4
    batch_split: tuple[int, ...] | None = None
    bucket_bytes: int = DDP_BUCKET_BYTES
    check: bool = True
    timed: bool = True
    command: str = ""
    profile_dir: str | None = None
    """Also profile each cut (torch.profiler, CPU and CUDA activities, shapes recorded): one trace per rank in
    ``profile_dir/<cut>/rank<r>.*.pt.trace.json.gz`` (`profile_cut`), for ``simdist calibrate`` and ``simdist
    validate --trace``."""
    profile_steps: int = 3


@dataclass(frozen=True, slots=True)
class CheckResult:
    cut: str
    grad_abs_err: float  # max |g - g_ref| over ranks and parameters
    grad_rel_err: float  # grad_abs_err / max |g_ref|
    weight_abs_err: float  # max |w - w_ref| after the SGD update
    grad_ref_max: float


def run_steps(config: StepConfig, world_size: int, *, timeout_s: float = 600.0, partial: str | Path | None = None
              ) -> tuple[list[StepMeasurement], list[CheckResult], dict[str, str]]:
    """Run the checks and timings on ``world_size`` ranks (spawned, or this torchrun rank); rank 0's results.

    A failed run's `HarnessError` carries the cuts timed so far (``items``, see `keep_partial`); ``partial``:
    where rank 0 keeps them itself if this process dies mid-run.
    """
    salvage = (_salvage, (str(partial),)) if partial is not None else None
    return launch(_worker, world_size=world_size, backend=config.backend, args=(config,), timeout_s=timeout_s,
                  salvage=salvage)


def keep_partial(items: list[Any], reason: str, out: str | Path) -> str:
    """Write the steps a failed run timed (`run_steps`'s ``items``) to ``partial_path(out)``, its
    ``# incomplete:`` line saying why; returns a note for the error message."""
    rows = [it[1] for it in items if it[0] == "row"]
    meta = next((dict(it[1]) for it in items if it[0] == "meta"), {})
    if not rows:
        return "no cut had been timed"
    path = partial_path(out)
    write_step_measurements_csv(rows, path, metadata={**meta, "incomplete": reason})
    return f"the {len(rows)} step measurement(s) finished so far are in {path}"


def _salvage(items: list[Any], reason: str, out: str) -> str:
    return keep_partial(items, reason, out)


def _worker(rank: int, world: int, config: StepConfig) -> Any:
    device, meta = start_rank(rank, world, config.backend, config.command)
    doing("computing the single-process reference step")
    reference = reference_step(config.mlp, device) if config.check else None
    rows: list[StepMeasurement] = []
    checks: list[CheckResult] = []
    for name in config.cuts:
        if config.check and name != "single":
            doing(f"checking cut {name} against the reference")
            cut = _build(name, config, rank, world, device)
            cut.step()
            checks.append(_compare(cut, reference, device))
        if config.timed:
            row = _time_cut(name, config, rank, world, device)
            if row is not None:
                rows.append(row)
                report(("row", row))
        if config.profile_dir is not None:
            profile_cut(name, config, rank, world, device)
    return rows, checks, meta


def profile_cut(name: str, config: StepConfig, rank: int, world: int, device: Any) -> None:
    """Profile ``config.profile_steps`` training steps of cut ``name`` after one warm-up step (torch.profiler's
    schedule: wait 0, warmup 1, active profile_steps), each step marked by ``prof.step()`` (the ProfilerStep#N
    annotations simdist reads as step boundaries); every rank writes its own gzip trace
    (torch.profiler.tensorboard_trace_handler). The single-process cut runs on rank 0 alone."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    single = name == "single"
    if not single or rank == 0:
        doing(f"profiling cut {name}")
        cut = _build(name, config, rank, world, device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        folder = Path(str(config.profile_dir)) / name
        handler = tensorboard_trace_handler(str(folder), worker_name=f"rank{rank}", use_gzip=True)
        steps = config.profile_steps
        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps), record_shapes=True,
                     on_trace_ready=handler) as prof:
            for _ in range(steps + 1):
                if not single:
                    dist.barrier()
                cut.step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                prof.step()
    doing(f"waiting for every rank at the barrier after profiling cut {name}")
    dist.barrier()


def _build(name: str, config: StepConfig, rank: int, world: int, device: Any) -> Cut:
    return build_cut(name, config.mlp, rank, world, device, num_microbatches=config.num_microbatches,
                     batch_split=list(config.batch_split) if config.batch_split else None,
                     bucket_bytes=config.bucket_bytes)


def _compare(cut: Cut, reference: Any, device: Any) -> CheckResult:
    import torch
    import torch.distributed as dist

    grads, updated = reference
    g_err = w_err = g_ref = 0.0
    for p, (layer, cols) in zip(cut.params, cut.shards, strict=True):
        g_err = max(g_err, (p.grad - grads[layer][:, cols]).abs().max().item())
        w_err = max(w_err, (p.detach() - updated[layer][:, cols]).abs().max().item())
        g_ref = max(g_ref, grads[layer][:, cols].abs().max().item())
    errors = torch.tensor([g_err, w_err, g_ref], dtype=torch.float64, device=device)
    dist.all_reduce(errors, op=dist.ReduceOp.MAX)
    g_err, w_err, g_ref = errors.tolist()
    return CheckResult(cut.name, g_err, g_err / g_ref if g_ref > 0 else float("inf"), w_err, g_ref)


def _time_cut(name: str, config: StepConfig, rank: int, world: int, device: Any) -> StepMeasurement | None:
    import torch.distributed as dist

    single = name == "single"
    times: list[float] = []
    cut = None
    if not single or rank == 0:
        doing(f"building cut {name}")
        cut = _build(name, config, rank, world, device)
        times = timed_iterations(cut.step, warmup=config.warmup, iters=config.iters, sync=device_sync(device),
                                 what=f"cut {name}'s training step", barrier=None if single else dist.barrier)
    doing(f"waiting for every rank at the barrier after timing cut {name}")
    dist.barrier()
    if single:
        if rank != 0:
            return None
        maxima = means = times
    else:
        maxima, means = over_ranks(times, device)
        if rank != 0:
            return None
    assert cut is not None
    return StepMeasurement(
        cut=name, world_size=1 if single else world, num_layers=config.mlp.num_layers, width=config.mlp.width,
        global_batch=config.mlp.batch, num_microbatches=cut.num_microbatches, dtype="fp32",
        time_s=median_s(maxima), time_mean_s=statistics.fmean(means), num_samples=len(maxima),
        backend=config.backend, device=device_name(config.backend), source="validation.mlp")
