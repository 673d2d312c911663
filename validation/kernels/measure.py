"""Time `KernelCase`s on one device with the harness's discipline, inside one supervised rank.

`measure(config)` runs on one rank launched by validation.spawn (so a kernel that crashes or hangs ends the run
with one line naming what it was doing, and the kernels timed so far are kept: `keep_partial`). Each kernel:
its inputs are allocated once (seeded), it is called back to back ``calls`` times per timed iteration (enough calls
that an iteration lasts at least ``min_iteration_s``: a short kernel is timed as simdist prices it, one of many on
one stream, each paying its launch), after ``warmup`` untimed iterations, ``iters`` timed ones closed by a device
synchronize (validation.timing); the row's time is the median iteration over ``calls``. On a CPU the rank runs one
intra-op thread (validation.spawn), the one core the ``cpu-core`` pseudo-GPU describes (gpus/cpu-core.yaml).

Attention is torch's scaled_dot_product_attention; on CUDA with bf16/fp16 it is pinned to the FlashAttention-2
backend (``torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)``), recorded as ``flash2`` so that simdist
prices it from that kernel's curves; elsewhere the backend torch picks, recorded as ``cpu`` or ``sdpa`` (priced as
batched GEMMs).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simdist.calibrate.kernels import KernelMeasurement, write_kernel_measurements_csv
from validation.kernels.shapes import KernelCase
from validation.machine import device_name, run_metadata
from validation.spawn import doing, launch, partial_path, report
from validation.timing import device_sync, median_s, timed_iterations

__all__ = ["KernelRunConfig", "keep_partial", "measure"]


@dataclass(frozen=True, slots=True)
class KernelRunConfig:
    cases: tuple[KernelCase, ...]
    device: str = "cpu"  # cpu | cuda
    dtype: str = "fp32"
    warmup: int = 3
    iters: int = 10
    min_iteration_s: float = 1e-3
    max_calls: int = 1000
    command: str = ""


def measure(config: KernelRunConfig, *, timeout_s: float, partial: str | Path | None = None
            ) -> tuple[list[KernelMeasurement], dict[str, str]]:
    """Every case timed on one rank (module doc): (rows, the run's metadata)."""
    salvage = (_salvage, (str(partial),)) if partial is not None else None
    return launch(_worker, world_size=1, backend="nccl" if config.device == "cuda" else "gloo", args=(config,),
                  timeout_s=timeout_s, on_item=_print, salvage=salvage)


def _print(item: Any) -> None:
    if item[0] == "row":
        r = item[1]
        shape = f"{r.m}x{r.n}x{r.k} x{r.batch}" if r.m else f"{int(r.hbm_bytes)} B"
        name = f"{r.name} {'causal' if r.causal else 'full'} {r.direction}" if r.kernel == "attention" else r.name
        print(f"{r.kernel:9s} {name:24s} {shape:>22s}: {r.time_s * 1e6:12.2f} us, "
              f"{r.flops / r.time_s / 1e9:10.2f} GFLOP/s, {r.hbm_bytes / r.time_s / 1e9:8.2f} GB/s", flush=True)


def keep_partial(items: list[Any], reason: str, out: str | Path) -> str:
    """Write the kernels a failed run timed to ``partial_path(out)`` (``# incomplete:`` says why); a note."""
    rows = [it[1] for it in items if it[0] == "row"]
    if not rows:
        return "no kernel had been timed"
    meta = {**next((dict(it[1]) for it in items if it[0] == "meta"), {}), "incomplete": reason}
    write_kernel_measurements_csv(rows, partial_path(out), metadata=meta)
    return f"the {len(rows)} kernel measurement(s) finished so far are in {partial_path(out)}"


def _salvage(items: list[Any], reason: str, out: str) -> str:
    return keep_partial(items, reason, out)


def _dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _runner(case: KernelCase, dtype: Any, device: Any) -> tuple[Any, str | None]:
    """(a function running the kernel once, the attention kernel family) with its inputs allocated."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int, grad: bool = False) -> Any:
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device).requires_grad_(grad)

    if case.kind == "gemm":
        if case.batch == 1:
            a, b = rand(case.m, case.k), rand(case.k, case.n)
            return (lambda: a @ b), None
        a, b = rand(case.batch, case.m, case.k), rand(case.batch, case.k, case.n)
        return (lambda: torch.bmm(a, b)), None
    if case.kind == "attention":
        shape = (case.batch, case.heads, case.seq, case.head_dim)
        q, k, v = (rand(*shape, grad=case.direction == "backward") for _ in range(3))
        flash = device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
        family = "flash2" if flash else ("cpu" if device.type == "cpu" else "sdpa")

        def attend() -> Any:
            if not flash:
                return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)

        if case.direction == "forward":
            return (lambda: attend()), family
        out = attend()
        grad = torch.ones_like(out)
        return (lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)), family
    x = rand(case.elements // case.width if case.name in ("layer_norm", "softmax") else case.elements,
             *((case.width,) if case.name in ("layer_norm", "softmax") else ()))
    y = rand(*x.shape)
    ops = {"layer_norm": lambda: F.layer_norm(x, (case.width,)), "gelu": lambda: F.gelu(x),
           "add": lambda: torch.add(x, y), "softmax": lambda: torch.softmax(x, dim=-1)}
    return ops[case.name], None


def _calls(run: Any, sync: Any, config: KernelRunConfig) -> int:
    """Back-to-back calls per timed iteration: enough to last ``min_iteration_s`` (at most ``max_calls``)."""
    sync()
    start = time.perf_counter()
    run()
    sync()
    once = max(time.perf_counter() - start, 1e-9)
    return max(1, min(config.max_calls, math.ceil(config.min_iteration_s / once)))


def _worker(rank: int, world: int, config: KernelRunConfig) -> Any:
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if config.device == "cuda" else torch.device("cpu")
    doing("collecting the run's metadata")
    meta = run_metadata("nccl" if config.device == "cuda" else "gloo", 1, config.command)
    meta["kernel_device"] = config.device
    meta["torch_threads"] = str(torch.get_num_threads())
    report(("meta", meta))
    label = device_name("nccl" if config.device == "cuda" else "gloo")
    dtype = _dtype(config.dtype)
    element = torch.empty((), dtype=dtype).element_size()
    sync = device_sync(device)
    rows = []
    for case in config.cases:
        what = f"{case.kind} {case.name}"
        doing(f"allocating the inputs of {what}")
        run, family = _runner(case, dtype, device)
        calls = _calls(run, sync, config)

        def repeated(run: Any = run, calls: int = calls) -> None:
            for _ in range(calls):
                run()

        times = timed_iterations(repeated, warmup=config.warmup, iters=config.iters, sync=sync,
                                 what=f"{what} ({calls} calls per iteration)")
        per = [t / calls for t in times]
        attention = case.kind == "attention"
        row = KernelMeasurement(
            kernel=case.kind, name=case.name, dtype=config.dtype, flops=case.flops(), hbm_bytes=case.hbm_bytes(element),
            time_s=median_s(per), time_mean_s=sum(per) / len(per), num_samples=len(per), device=label,
            source="validation.kernels", m=case.m or (case.seq if attention else None),
            n=case.n or (case.seq if attention else None), k=case.k or (case.head_dim if attention else None),
            batch=case.batch * (case.heads if attention else 1), seq_len=case.seq if attention else None,
            head_dim=case.head_dim if attention else None, causal=case.causal if attention else None,
            direction=case.direction if attention else None, attention_kernel=family)
        rows.append(row)
        report(("row", row))
        del run
    return rows, meta
