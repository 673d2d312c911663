"""Check the expert-parallel MoE layer against one process and time its all_to_all and expert GEMMs, on every rank.

`run_moe(config, world_size)` launches the ranks (validation.spawn: dead ranks, stopped ranks and hangs end the
run with one line naming the rank) and returns rank 0's all_to_all rows (simdist.calibrate.measurements.Measurement
with ``imbalance``), expert GEMM rows (simdist.calibrate.kernels.KernelMeasurement), the check (`MoECheck`) and the
run's metadata.

**Check** (float64, so that the comparison measures the algorithm, not rounding): every rank builds the same seeded
layer and every rank's tokens, runs the single-process layer (validation.moe.layer.reference_forward) on all of
them and takes loss = sum(output x probe) / tokens and its gradients; then the expert-parallel layer on its own
tokens with its E / P experts, the same loss on its share, backward, and the router's gradient summed over ranks.
Compared: the output, the input gradient, the local experts' W1 and W2 gradients and the router gradient, each as
max |difference| / max |reference| (reduced by MAX over ranks). float64 with other summation orders lands near
1e-15; the tolerance (``--tolerance``, default 1e-9) leaves room for that and none for a misrouted row.

**Timing** (``--dtype``, default fp32), per per-rank token count of ``time_tokens``: the routing is skewed by the
bias that makes the busiest rank receive ``imbalance`` x the mean rows (validation.moe.layer.solve_bias); the
dispatch ``all_to_all_single`` with its unequal splits is timed with the collective harness's discipline
(validation.timing: warm-up, a barrier before each iteration, median over iterations of the max over ranks) and
written as an nccl-tests style row: op all_to_all, ``nbytes`` = each rank's send buffer (tokens x top-k x h x
element size, the same on every rank: dropless routing), ``imbalance`` = the busiest rank's received bytes / the
mean, as realised. Then each rank's local expert GEMMs (fc1: rows x h -> f, fc2: rows x f -> h, rows = the tokens
that expert received), the same as one grouped call over its experts, and the permutation of its received rows into
expert order are timed one rank at a time (the others wait at a barrier, so CPU ranks do not share cores while
timing) and written as kernel rows (gemm, and memory for the permutation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from simdist.calibrate.kernels import KernelMeasurement, write_kernel_measurements_csv
from simdist.calibrate.measurements import Measurement, write_measurements_csv
from simdist.collectives.ops import algbw_Bps, busbw_Bps
from validation.machine import device_name, start_rank
from validation.moe.layer import (
    MoEConfig,
    global_imbalance,
    hot_bias,
    init_params,
    make_tokens,
    moe_forward,
    plan_dispatch,
    reference_forward,
    route,
    solve_bias,
)
from validation.spawn import doing, launch, partial_path, report
from validation.timing import device_sync, median_s, over_ranks, timed_iterations

__all__ = ["DTYPES", "MoECheck", "MoERunConfig", "keep_partial", "run_moe"]

DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True, slots=True)
class MoERunConfig:
    layer: MoEConfig  # the checked layer (tokens_per_rank: the check's tokens)
    imbalance: float = 1.0
    check: bool = True
    time_tokens: tuple[int, ...] = ()
    warmup: int = 2
    iters: int = 10
    backend: str = "gloo"
    dtype: str = "fp32"
    command: str = ""


@dataclass(frozen=True, slots=True)
class MoECheck:
    world_size: int
    imbalance: float  # realised: busiest rank's received rows / the mean
    bias: float
    output_rel_err: float
    input_grad_rel_err: float
    expert_grad_rel_err: float
    router_grad_rel_err: float
    router_grad_ref_max: float

    @property
    def worst(self) -> float:
        return max(self.output_rel_err, self.input_grad_rel_err, self.expert_grad_rel_err, self.router_grad_rel_err)


def run_moe(config: MoERunConfig, world_size: int, *, timeout_s: float = 600.0,
            partial: tuple[str | Path | None, str | Path | None] = (None, None)
            ) -> tuple[list[Measurement], list[KernelMeasurement], MoECheck | None, dict[str, str]]:
    """Check and time on ``world_size`` ranks (spawned, or this torchrun rank); rank 0's results (module doc).

    A failed run's `HarnessError` carries the sizes finished so far (``items``, see `keep_partial`); ``partial``:
    (all_to_all CSV, kernel CSV) where rank 0 keeps them itself if this process dies mid-run.
    """
    salvage = (_salvage, tuple(str(p) if p is not None else "" for p in partial)) if any(partial) else None
    return launch(_worker, world_size=world_size, backend=config.backend, args=(config,), timeout_s=timeout_s,
                  salvage=salvage)


def keep_partial(items: list[Any], reason: str, out: str | Path | None, kernels_out: str | Path | None) -> str:
    """Write what a failed run finished (`run_moe`'s ``items``) to ``partial_path`` of each output, its
    ``# incomplete:`` line saying why; returns a note for the error message."""
    a2a = [it[1] for it in items if it[0] == "a2a"]
    gemms = [r for it in items if it[0] == "gemms" for r in it[1]]
    meta = {**next((dict(it[1]) for it in items if it[0] == "meta"), {}), "incomplete": reason}
    kept = []
    if a2a and out:
        write_measurements_csv(a2a, partial_path(out), metadata=meta)
        kept.append(f"{len(a2a)} all_to_all row(s) in {partial_path(out)}")
    if gemms and kernels_out:
        write_kernel_measurements_csv(gemms, partial_path(kernels_out), metadata=meta)
        kept.append(f"{len(gemms)} expert GEMM row(s) in {partial_path(kernels_out)}")
    return "kept " + " and ".join(kept) if kept else "no size had finished"


def _salvage(items: list[Any], reason: str, out: str, kernels_out: str) -> str:
    return keep_partial(items, reason, out or None, kernels_out or None)


def _torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}[name]


def _worker(rank: int, world: int, config: MoERunConfig) -> Any:
    device, meta = start_rank(rank, world, config.backend, config.command)
    check = _check(rank, world, config, device) if config.check else None
    a2a: list[Measurement] = []
    gemms: list[KernelMeasurement] = []
    for tokens in config.time_tokens:
        row, rows = _time_size(rank, world, config, replace(config.layer, tokens_per_rank=tokens), device, meta)
        if rank == 0:
            a2a.append(row)
            gemms += rows
            report(("a2a", row))
            report(("gemms", rows))
    return a2a, gemms, check, meta


def _rel(diff: Any, ref: Any) -> tuple[float, float]:
    return float(diff.detach().abs().max()), float(ref.detach().abs().max())


def _check(rank: int, world: int, config: MoERunConfig, device: Any) -> MoECheck:
    import torch
    import torch.distributed as dist

    cfg = config.layer
    f64 = torch.float64
    doing("building the checked layer and every rank's tokens")
    router, w1, w2 = init_params(cfg, f64, device)
    x_all, probe_all = make_tokens(cfg, world, f64, device)
    t, local = cfg.tokens_per_rank, cfg.num_experts // world
    mine, experts = slice(rank * t, (rank + 1) * t), slice(rank * local, (rank + 1) * local)
    doing(f"finding the routing bias for imbalance {config.imbalance:g}")
    bias_value, realised = solve_bias(cfg, world, config.imbalance, global_imbalance(x_all[mine], router, cfg, world))
    bias = hot_bias(cfg, world, bias_value, f64, device)

    doing("computing the single-process reference layer and its gradients")
    ref = [p.clone().requires_grad_() for p in (x_all, router, w1, w2)]
    out_ref = reference_forward(ref[0], (ref[1], ref[2], ref[3]), cfg.topk, bias)
    ((out_ref * probe_all).sum() / len(x_all)).backward()

    doing("running the expert-parallel layer forward and backward")
    x = x_all[mine].clone().requires_grad_()
    r, a, b = (p.clone().requires_grad_() for p in (router, w1[experts], w2[experts]))
    out = moe_forward(x, r, a, b, cfg.topk, bias, world)
    ((out * probe_all[mine]).sum() / len(x_all)).backward()
    dist.all_reduce(r.grad)  # the replicated router's gradient: the sum over every rank's tokens

    doing("comparing with the reference")
    pairs = [_rel(out - out_ref[mine], out_ref[mine]), _rel(x.grad - ref[0].grad[mine], ref[0].grad[mine]),
             _rel(a.grad - ref[2].grad[experts], ref[2].grad[experts]),
             _rel(b.grad - ref[3].grad[experts], ref[3].grad[experts]), _rel(r.grad - ref[1].grad, ref[1].grad)]
    errors = torch.tensor([v for pair in pairs for v in pair], dtype=f64, device=device)
    dist.all_reduce(errors, op=dist.ReduceOp.MAX)
    e = errors.tolist()

    def rel(i: int) -> float:
        # A quantity that is zero in the reference is checked by its difference itself: with top-1 routing the
        # router's gradient is zero (its one gate weight is normalised to 1), and a relative error of it is 0/0.
        return e[2 * i] / e[2 * i + 1] if e[2 * i + 1] > 0 else e[2 * i]

    return MoECheck(world, realised, bias_value, rel(0), rel(1), max(rel(2), rel(3)), rel(4), e[9])


def _rank_tokens(cfg: MoEConfig, rank: int, dtype: Any, device: Any) -> tuple[Any, Any]:
    """This rank's timed tokens (its own seeded generator: no rank builds the others') and the layer."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed + 1000 + rank)
    x = torch.randn(cfg.tokens_per_rank, cfg.hidden, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    return x, init_params(cfg, dtype, device)


def _time_size(rank: int, world: int, config: MoERunConfig, cfg: MoEConfig, device: Any, meta: dict[str, str]
               ) -> tuple[Measurement, list[KernelMeasurement]]:
    import torch
    import torch.distributed as dist

    dtype = _torch_dtype(config.dtype)
    elt = torch.empty((), dtype=dtype).element_size()
    what = f"the dispatch all_to_all of {cfg.tokens_per_rank} tokens x top-{cfg.topk} per rank"
    doing(f"routing {what}")
    x, (router, w1, w2) = _rank_tokens(cfg, rank, dtype, device)
    bias_value, _ = solve_bias(cfg, world, config.imbalance, global_imbalance(x, router, cfg, world))
    r = route(x, router, cfg.topk, hot_bias(cfg, world, bias_value, dtype, device))
    d = plan_dispatch(r.experts, cfg.num_experts, world)
    token = torch.arange(len(x), device=device).repeat_interleave(cfg.topk)
    send = x[token[d.order]].contiguous()
    recv = send.new_empty((sum(d.out_splits), cfg.hidden))
    sync = device_sync(device)
    times = timed_iterations(lambda: dist.all_to_all_single(recv, send, d.out_splits, d.in_splits),
                             warmup=config.warmup, iters=config.iters, sync=sync, what=what, barrier=dist.barrier)
    maxima, _ = over_ranks(times, device)
    received = torch.zeros(world, dtype=torch.float64, device=device)
    received[rank] = sum(d.out_splits)
    dist.all_reduce(received)
    imbalance = float(received.max() / received.mean())
    nbytes = len(send) * cfg.hidden * elt
    time_s = median_s(maxima)
    row = Measurement(op="all_to_all", nbytes=nbytes, num_ranks=world, time_s=time_s,
                      algbw_Bps=algbw_Bps(nbytes, time_s), busbw_Bps=busbw_Bps("all_to_all", world, nbytes, time_s),
                      source="validation.moe", dtype=str(dtype).removeprefix("torch."), in_place=False,
                      num_nodes=int(meta.get("host_count", "1")) if rank == 0 else 1,
                      label=f"{config.backend} moe dispatch, {cfg.num_experts} experts top-{cfg.topk}, "
                            f"median of {config.iters}", nccl_version=meta.get("nccl_version"),
                      device=device_name(config.backend) if rank == 0 else None, imbalance=imbalance)
    local = cfg.num_experts // world
    mine = d.recv_counts.sum(0).tolist()  # rows each local expert received
    rows: list[KernelMeasurement] = []
    for turn in range(world):  # one rank at a time: CPU ranks share cores
        if turn == rank:
            rows = _time_experts(rank, config, cfg, w1[rank * local:(rank + 1) * local],
                                 w2[rank * local:(rank + 1) * local], mine, dtype, device, sync)
        doing(f"waiting for rank {turn} to time its expert GEMMs")
        dist.barrier()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, rows)
    return row, [g for part in gathered for g in part]


def _time_experts(rank: int, config: MoERunConfig, cfg: MoEConfig, w1: Any, w2: Any, counts: list[int], dtype: Any,
                  device: Any, sync: Any) -> list[KernelMeasurement]:
    """fc1 and fc2 (the two matmuls of validation.moe.layer.expert_forward) of each local expert on the rows it
    received, each shape timed once."""
    import torch

    h, f = cfg.hidden, cfg.ffn_hidden
    elt = torch.empty((), dtype=dtype).element_size()
    label = device_name(config.backend)
    seen: set[int] = set()
    out = _time_grouped(rank, config, cfg, w1, w2, counts, dtype, device, sync, elt, label)
    for e, rows in enumerate(counts):
        if rows == 0 or rows in seen:
            continue
        seen.add(rows)
        a = torch.randn(rows, h, dtype=torch.float64).to(dtype=dtype, device=device)
        hidden = torch.randn(rows, f, dtype=torch.float64).to(dtype=dtype, device=device)
        for name, (m, n, k), run in (("expert_fc1", (rows, f, h), lambda a=a, e=e: a @ w1[e]),
                                     ("expert_fc2", (rows, h, f), lambda hidden=hidden, e=e: hidden @ w2[e])):
            times = timed_iterations(run, warmup=config.warmup, iters=config.iters, sync=sync,
                                     what=f"{name} of {rows} rows on rank {rank}")
            t = median_s(times)
            out.append(KernelMeasurement(
                kernel="gemm", name=f"{name} rank {rank}", dtype=config.dtype, flops=2.0 * m * n * k,
                hbm_bytes=float(m * k + k * n + m * n) * elt, time_s=t, time_mean_s=sum(times) / len(times),
                num_samples=len(times), device=label, source="validation.moe", m=m, n=n, k=k))
    return out


def _time_grouped(rank: int, config: MoERunConfig, cfg: MoEConfig, w1: Any, w2: Any, counts: list[int], dtype: Any,
                  device: Any, sync: Any, elt: int, label: str) -> list[KernelMeasurement]:
    """The rank's grouped expert GEMMs and its permutation, as simdist prices them (simdist.plan.moe_cost): fc1 and
    fc2 of every local expert in one call (``batch`` = local experts, ``m`` = the mean rows per expert, ``flops``
    the experts' own sum: the grouped GEMM of --moe-grouped-gemm), and the permutation that gathers the received
    rows into expert order (a memory kernel: each row read and written, 2 x rows x h x element bytes).
    # Assumption: off a GPU there is no grouped GEMM kernel: the grouped call is the experts' matmuls back to back
    # (Transformer Engine's GroupedLinear on CPU-less paths and its multi-stream cuBLAS path run one GEMM each).
    """
    import torch

    h, f = cfg.hidden, cfg.ffn_hidden
    rows = [n for n in counts if n > 0]
    experts = [e for e, n in enumerate(counts) if n > 0]
    if not rows:
        return []
    total = sum(rows)
    inputs = [torch.randn(n, h, dtype=torch.float64).to(dtype=dtype, device=device) for n in rows]
    hiddens = [torch.randn(n, f, dtype=torch.float64).to(dtype=dtype, device=device) for n in rows]
    mean = max(1, round(total / len(rows)))
    out = []
    for name, (n_, k_), run in (
            ("expert_fc1_grouped", (f, h), lambda: [a @ w1[e] for a, e in zip(inputs, experts, strict=True)]),
            ("expert_fc2_grouped", (h, f), lambda: [x @ w2[e] for x, e in zip(hiddens, experts, strict=True)])):
        times = timed_iterations(run, warmup=config.warmup, iters=config.iters, sync=sync,
                                 what=f"{name} of {len(rows)} experts on rank {rank}")
        out.append(KernelMeasurement(
            kernel="gemm", name=f"{name} rank {rank}", dtype=config.dtype, flops=2.0 * total * n_ * k_,
            hbm_bytes=float(total * k_ + len(rows) * k_ * n_ + total * n_) * elt, time_s=median_s(times),
            time_mean_s=sum(times) / len(times), num_samples=len(times), device=label, source="validation.moe",
            m=mean, n=n_, k=k_, batch=len(rows)))
    received = torch.randn(total, h, dtype=torch.float64).to(dtype=dtype, device=device)
    order = torch.randperm(total, generator=torch.Generator().manual_seed(rank)).to(device)
    times = timed_iterations(lambda: received.index_select(0, order), warmup=config.warmup, iters=config.iters,
                             sync=sync, what=f"the permutation of {total} rows on rank {rank}")
    out.append(KernelMeasurement(
        kernel="memory", name=f"moe_permute rank {rank}", dtype=config.dtype, flops=0.0,
        hbm_bytes=2.0 * total * h * elt, time_s=median_s(times), time_mean_s=sum(times) / len(times),
        num_samples=len(times), device=label, source="validation.moe"))
    return out
