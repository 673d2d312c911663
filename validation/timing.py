"""The harness's timing discipline, one copy for every harness (collectives, the MLP's cuts, MoE, kernels).

nccl-tests and the CS336 lecture time a GPU operation the same way: ``warmup`` untimed calls (allocator, NCCL
channels, cuBLAS heuristics and caches settle), then ``iters`` calls, each started together on every rank (a
barrier, after a ``torch.cuda.synchronize()`` so no earlier work is still queued) and closed by a synchronize, so
that the host clock sees the device's work end. Per-rank times are reduced over the ranks by a MAX and a SUM
all_reduce (nccl-tests reports the max over ranks); a row records the median over iterations of those maxima.

# Assumption: the median of per-iteration maxima is robust to the scheduler spikes of a shared host.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from validation.spawn import doing

__all__ = ["device_sync", "median_s", "over_ranks", "timed_iterations"]


def device_sync(device: Any) -> Callable[[], None]:
    """A function that waits for the device's queued work (``torch.cuda.synchronize``; nothing on a CPU)."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def timed_iterations(run: Callable[[], Any], *, warmup: int, iters: int, sync: Callable[[], None], what: str,
                     barrier: Callable[[], Any] | None = None) -> list[float]:
    """Seconds of each of ``iters`` timed calls of ``run`` after ``warmup`` untimed ones (module doc); each phase is
    announced with `validation.spawn.doing` ("running <what>, timed iteration i of n") so a fault names it."""
    for i in range(warmup):
        doing(f"running {what}, warm-up iteration {i + 1} of {warmup}")
        run()
    sync()
    times: list[float] = []
    for i in range(iters):
        doing(f"running {what}, timed iteration {i + 1} of {iters}")
        sync()
        if barrier is not None:
            barrier()
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return times


def over_ranks(times: list[float], device: Any) -> tuple[list[float], list[float]]:
    """(max over ranks, mean over ranks) of each iteration's time: a MAX and a SUM all_reduce (every rank calls it;
    every rank gets the result)."""
    import torch
    import torch.distributed as dist

    t_max = torch.tensor(times, dtype=torch.float64, device=device)
    t_sum = t_max.clone()
    dist.all_reduce(t_max, op=dist.ReduceOp.MAX)
    dist.all_reduce(t_sum, op=dist.ReduceOp.SUM)
    return t_max.cpu().tolist(), (t_sum / dist.get_world_size()).cpu().tolist()


def median_s(times: list[float]) -> float:
    """The row's time: the median of the iterations' (maximum over ranks) times."""
    return statistics.median(times)
