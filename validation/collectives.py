"""Benchmark torch.distributed collectives (gloo on CPU, NCCL on GPU) and write our measurement CSV.

Usage (spawns the ranks itself, or runs under torchrun when launched by it)::

    python -m validation.collectives --backend gloo --ranks 4 --bytes 1K:16M:x4 --out coll.csv
    python -m validation.collectives --backend nccl --ranks 8 --bytes 8:8G:x2 --ops all_reduce,all_gather \\
        --warmup 5 --iters 20 --out coll.csv --samples samples.csv
    torchrun --nnodes 2 --nproc-per-node 8 ... -m validation.collectives --backend nccl --ranks 16 ...

Ops (simdist names): broadcast, reduce, all_gather (``all_gather_into_tensor``, ``all_gather_single`` since
torch 2.13), reduce_scatter (``reduce_scatter_tensor`` / ``reduce_scatter_single``), all_reduce, all_to_all
(``all_to_all_single``), send_recv (each rank sends to rank+1 and receives from rank-1 at once, nccl-tests
sendrecv_perf), scatter, gather, and barrier (measured once, 0 bytes; only when ``--ops`` names it: it has no
size, so `simdist calibrate` skips it); gloo in torch 2.13 offers all of them. ``--ops all`` (the default) is
every sized op, so the default output calibrates as it is (``simdist calibrate m.csv --topology cpu-loopback``).
Sizes use nccl-tests syntax (``8:8G:x2``, ``1M:4M:+1M``, ``1M,64M``; simdist.units.parse_size_list) and its conventions
(simdist.collectives.ops): the size is the full buffer for all_reduce / broadcast / reduce, the full
output for all_gather, the full input for reduce_scatter, the root's full buffer for scatter / gather,
what each rank sends in total for all_to_all. Elements are fp32; as nccl-tests does, a size is rounded
down to whole elements and, for the segmented ops, to a multiple of the rank count.

Timing (nccl-tests src/common.cu and the CS336 lecture): ``--warmup`` untimed iterations, then
``--iters`` timed iterations, each preceded by a barrier (and ``torch.cuda.synchronize()`` on GPU) and
closed by ``torch.cuda.synchronize()``. The per-rank times are reduced by two all_reduces (MAX and SUM
over ranks) per size; ``time_s`` in the CSV is the median over iterations of the per-iteration maximum,
algbw = size / time_s and busbw = algbw x the op's nccl-tests factor. ``--samples`` keeps every
iteration (max and mean over ranks). Both files open with ``# key: value`` metadata lines (command,
torch / NCCL versions, backend, CPU or GPU model, host count, ``nvidia-smi topo -m``); each row names the
device it ran on (``device``: the GPU, or the CPU model on gloo), which `simdist calibrate` compares with the
topology's GPU.

Faults (validation.spawn): a rank that raises, dies or stays stopped ends the run within seconds, and the
killed ``python -m validation.collectives`` process itself takes its ranks with it; the one-line message
names the rank and what it was doing (op, size, iteration), and the sizes measured so far are kept in
``OUT.partial.csv`` (``coll.csv`` -> ``coll.partial.csv``; ``--out`` itself is only ever written whole).
Each finished size is printed as it completes.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simdist.calibrate.measurements import Measurement, _metadata_lines, write_measurements_csv, write_text_atomic
from simdist.collectives.ops import algbw_Bps, busbw_Bps
from simdist.errors import SimdistError
from simdist.files import check_target
from simdist.units import parse_size_list
from validation.harness_cli import HarnessParser, cli_guard
from validation.machine import device_name, start_rank
from validation.spawn import HarnessError, doing, launch, partial_path, report
from validation.timing import device_sync, median_s, over_ranks, timed_iterations

__all__ = ["BENCH_OPS", "DEFAULT_OPS", "BenchConfig", "Sample", "benchmark", "host_memory_bytes", "keep_partial",
           "main", "parse_sizes"]

BENCH_OPS: tuple[str, ...] = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce", "all_to_all",
                              "send_recv", "barrier", "scatter", "gather")
DEFAULT_OPS: tuple[str, ...] = tuple(op for op in BENCH_OPS if op != "barrier")
"""``--ops all``: every op with a size (barrier has none to fit a bandwidth to)."""
_SEGMENTED = ("all_gather", "reduce_scatter", "all_to_all", "scatter", "gather")
_ELEMENT_BYTES = 4  # fp32


@dataclass(frozen=True, slots=True)
class BenchConfig:
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    warmup: int
    iters: int
    backend: str
    command: str


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed iteration: the max and the mean over ranks of its time."""

    op: str
    nbytes: int
    num_ranks: int
    iteration: int
    time_max_s: float
    time_mean_s: float


def benchmark(config: BenchConfig, world_size: int, *, timeout_s: float | None = None,
              partial: str | Path | None = None, progress: bool = False
              ) -> tuple[list[Measurement], list[Sample], dict[str, str]]:
    """Run the sweep on ``world_size`` ranks (spawned, or this torchrun rank); rank 0's rows, samples, metadata.

    ``timeout_s``: seconds before every rank is stopped (`HarnessError`); default 600 s plus 2 s per timed or
    warm-up iteration of the sweep. A failed run's `HarnessError` carries the sizes finished so far (``items``,
    see `keep_partial`); ``partial``: where rank 0 keeps them itself if this process dies. ``progress``: print
    each finished size.
    """
    if timeout_s is None:
        timeout_s = 600.0 + 2.0 * len(config.sizes) * len(config.ops) * (config.warmup + config.iters)
    salvage = (_salvage, (str(partial),)) if partial is not None else None
    return launch(_worker, world_size=world_size, backend=config.backend, args=(config,), timeout_s=timeout_s,
                  on_item=_print_item if progress else None, salvage=salvage)


def _print_item(item: Any) -> None:
    if item[0] == "row":
        m = item[1]
        print(f"{m.op:15s} {m.nbytes:>12d} B on {m.num_ranks} ranks: {m.time_s * 1e6:12.1f} us, "
              f"busbw {m.busbw_Bps / 1e9:8.3f} GB/s", flush=True)


def _unpack(items: list[Any]) -> tuple[list[Measurement], list[Sample], dict[str, str]]:
    rows = [it[1] for it in items if it[0] == "row"]
    samples = [s for it in items if it[0] == "row" for s in it[2]]
    meta = next((dict(it[1]) for it in items if it[0] == "meta"), {})
    return rows, samples, meta


def keep_partial(items: list[Any], reason: str, out: str | Path) -> str:
    """Write the measurements a failed run finished (`benchmark`'s ``items``) to ``partial_path(out)``, its
    ``# incomplete:`` line saying why; returns a note for the error message."""
    rows, _, meta = _unpack(items)
    if not rows:
        return "no size had finished"
    path = partial_path(out)
    write_measurements_csv(rows, path, metadata={**meta, "incomplete": reason})
    return f"the {len(rows)} measurement(s) finished so far are in {path}"


def _salvage(items: list[Any], reason: str, out: str) -> str:
    return keep_partial(items, reason, out)


def element_count(op: str, nbytes: int, world_size: int) -> int:
    """fp32 elements of an nccl-tests size: whole elements, a multiple of the ranks for segmented ops."""
    count = max(1, nbytes // _ELEMENT_BYTES)
    if op in _SEGMENTED:
        count = max(world_size, count // world_size * world_size)
    return count


def _make_op(op: str, count: int, rank: int, n: int, device: Any) -> Callable[[], None]:
    import torch
    import torch.distributed as dist

    def buf(elements: int) -> Any:
        return torch.full((elements,), float(rank + 1), dtype=torch.float32, device=device)

    share = count // n
    if op == "all_reduce":
        x = buf(count)
        return lambda: dist.all_reduce(x)
    if op == "broadcast":
        x = buf(count)
        return lambda: dist.broadcast(x, src=0)
    if op == "reduce":
        x = buf(count)
        return lambda: dist.reduce(x, dst=0)
    if op == "all_gather":
        out, x = buf(count), buf(share)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        return lambda: gather(out, x)
    if op == "reduce_scatter":
        out, x = buf(share), buf(count)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in 2.13
        return lambda: scatter(out, x)
    if op == "all_to_all":
        out, x = buf(count), buf(count)
        return lambda: dist.all_to_all_single(out, x)
    if op == "scatter":
        out = buf(share)
        chunks = list(buf(count).chunk(n)) if rank == 0 else None
        return lambda: dist.scatter(out, chunks, src=0)
    if op == "gather":
        x = buf(share)
        outs = [buf(share) for _ in range(n)] if rank == 0 else None
        return lambda: dist.gather(x, outs, dst=0)
    if op == "send_recv":
        out, x = buf(count), buf(count)

        def ring() -> None:
            # nccl-tests sendrecv_perf: every rank sends to rank+1 and receives from rank-1 concurrently.
            reqs = [dist.isend(x, (rank + 1) % n), dist.irecv(out, (rank - 1) % n)]
            for req in reqs:
                req.wait()

        return ring
    if op == "barrier":
        return lambda: dist.barrier()
    raise HarnessError(f"unknown op '{op}' (fix: use one of {', '.join(BENCH_OPS)})")


def _worker(rank: int, world_size: int, config: BenchConfig) -> Any:
    import torch.distributed as dist

    device, meta = start_rank(rank, world_size, config.backend, config.command)
    sync = device_sync(device)
    rows: list[Measurement] = []
    samples: list[Sample] = []
    hosts = int(meta.get("host_count", "1")) if rank == 0 else 1
    device_label = device_name(config.backend) if rank == 0 else ""
    for op in config.ops:
        if op == "send_recv" and world_size < 2:
            continue
        sizes = (0,) if op == "barrier" else tuple(dict.fromkeys(
            element_count(op, s, world_size) * _ELEMENT_BYTES for s in config.sizes))
        for nbytes in sizes:
            what = f"{op} of {nbytes} B"
            doing(f"allocating the buffers of {what}")
            run = _make_op(op, max(1, nbytes // _ELEMENT_BYTES), rank, world_size, device)
            times = timed_iterations(run, warmup=config.warmup, iters=config.iters, sync=sync, what=what,
                                     barrier=dist.barrier)
            doing(f"reducing the timings of {what} over the ranks")
            maxima, means = over_ranks(times, device)  # nccl-tests reports the max over ranks by default
            if rank != 0:
                continue
            time_s = median_s(maxima)
            row = Measurement(
                op=op, nbytes=nbytes, num_ranks=world_size, time_s=time_s, algbw_Bps=algbw_Bps(nbytes, time_s),
                busbw_Bps=busbw_Bps(op, world_size, nbytes, time_s), source="validation.collectives",
                dtype="float32", algorithm=None, in_place=False, num_nodes=hosts,
                label=f"{config.backend} median of {config.iters}", nccl_version=meta.get("nccl_version"),
                device=device_label)
            mine = [Sample(op, nbytes, world_size, i, a, b) for i, (a, b) in enumerate(zip(maxima, means, strict=True))]
            rows.append(row)
            samples += mine
            report(("row", row, mine))
    return rows, samples, meta


def write_samples_csv(samples: list[Sample], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Every timed iteration: op, nbytes, num_ranks, iteration, time_max_s, time_mean_s."""
    out = io.StringIO()
    out.write(_metadata_lines(metadata))
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(("op", "nbytes", "num_ranks", "iteration", "time_max_s", "time_mean_s"))
    for s in samples:
        writer.writerow((s.op, s.nbytes, s.num_ranks, s.iteration, repr(s.time_max_s), repr(s.time_mean_s)))
    write_text_atomic(path, out.getvalue())


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = HarnessParser(prog="python -m validation.collectives", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--bytes", default="1K:1M:x4", help="nccl-tests sizes: 8:8G:x2, 1M:4M:+1M or 1M,64M")
    parser.add_argument("--ops", default="all",
                        help=f"comma list of {','.join(BENCH_OPS)} (default all: every op but barrier)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default="collectives.csv")
    parser.add_argument("--samples", default=None, help="also write every timed iteration to this CSV")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds before the ranks are stopped (default: 600 + 2 per iteration of the sweep)")
    return parser.parse_args(argv)


def parse_sizes(text: str, flag: str = "--bytes") -> tuple[int, ...]:
    """nccl-tests sizes of a flag as whole bytes; a bad value is one `HarnessError` line (exit 2)."""
    try:
        sizes = tuple(int(s) for s in parse_size_list(text))
    except SimdistError as exc:
        raise HarnessError(f"{flag}: {exc}") from None
    except (ValueError, OverflowError):
        raise HarnessError(f"{flag} '{text}' is not a size list (fix: e.g. 1K:16M:x4, 1M:4M:+1M or 1M,64M)") from None
    if not sizes or min(sizes) < 1:
        raise HarnessError(f"{flag} '{text}': every size must be at least 1 byte (fix: e.g. 1K:16M:x4)")
    return sizes


def host_memory_bytes() -> int | None:
    """Physical memory of this host (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _check_memory(sizes: tuple[int, ...], ranks: int, backend: str) -> None:
    """Refuse a gloo sweep whose buffers cannot fit this host's memory (before spawning anything)."""
    memory = host_memory_bytes()
    if backend != "gloo" or memory is None:
        return
    # Assumption: the widest op holds about three buffers of the size per rank (all_to_all: in and out;
    # scatter's root: the chunks, the input and the output).
    need = 3 * max(sizes) * ranks
    if need > memory // 2:
        raise HarnessError(f"--bytes up to {max(sizes)} B on {ranks} gloo ranks needs ~{need / 2**30:.1f} GiB of "
                           f"buffers, more than half of this host's {memory / 2**30:.1f} GiB "
                           f"(fix: lower the largest size or --ranks)")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    ops = DEFAULT_OPS if args.ops == "all" else tuple(o.strip() for o in args.ops.split(",") if o.strip())
    unknown = [o for o in ops if o not in BENCH_OPS]
    if unknown or not ops:
        raise HarnessError(f"--ops: unknown op(s) {', '.join(unknown) or '(none)'} "
                           f"(fix: use {','.join(BENCH_OPS)} or all)")
    if args.warmup < 0 or args.iters < 1:
        raise HarnessError("--warmup must be >= 0 and --iters >= 1")
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        raise HarnessError(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    if args.ranks < 1:
        raise HarnessError(f"--ranks must be at least 1, got {args.ranks}")
    sizes = parse_sizes(args.bytes)
    _check_memory(sizes, args.ranks, args.backend)
    out = Path(args.out)
    for flag, path in (("--out", out), ("--samples", args.samples)):  # before timing: an unwritable output would
        if path:                                                       # lose the results
            check_target(path, field=flag)
    command = "python -m validation.collectives " + shlex.join(sys.argv[1:] if argv is None else argv)
    config = BenchConfig(ops=ops, sizes=sizes, warmup=args.warmup, iters=args.iters, backend=args.backend,
                         command=command)
    try:
        result = benchmark(config, args.ranks, timeout_s=args.timeout, partial=out, progress=True)
    except HarnessError as exc:
        raise exc.amended(keep_partial(exc.items, str(exc), out)) from None
    if result is None or not result[2]:
        return 0  # a torchrun rank other than 0: rank 0 writes the files
    rows, samples, meta = result
    write_measurements_csv(rows, out, metadata=meta)
    if args.samples:
        write_samples_csv(samples, args.samples, meta)
    print(f"wrote {len(rows)} measurements to {out}" + (f", samples to {args.samples}" if args.samples else ""))
    return 0


if __name__ == "__main__":
    sys.exit(cli_guard(main))
