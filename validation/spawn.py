"""Run a function on N local ranks with an initialised torch.distributed process group, or under torchrun.

``launch(fn, world_size=4, backend="gloo", args=(...))`` calls ``fn(rank, world_size, *args)`` on every
rank and returns what rank 0 returned. Two ways in:

- spawned here (no ``RANK`` in the environment): N child processes (fork for gloo, spawn for NCCL,
  which cannot fork a CUDA context), MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, RANK / WORLD_SIZE /
  LOCAL_RANK / LOCAL_WORLD_SIZE set in each child before ``init_process_group``;
- launched by ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` already set): no spawning, this
  process joins the group and ``launch`` returns this rank's own result (``world_size`` must match).

On the NCCL path every process binds to GPU ``LOCAL_RANK`` (``torch.cuda.set_device``) before the group
starts. A child that raises, dies or outlives ``timeout_s`` ends the run: every child is terminated
(then killed) and `HarnessError` carries one line naming the rank and the cause. Collectives that never
complete time out through the process group's own ``timeout`` (``init_timeout_s``), so no rank hangs.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["HarnessError", "cli_guard", "cpu_model", "device_name", "free_port", "is_torchrun", "launch",
           "run_metadata"]

BACKENDS = ("gloo", "nccl")


class HarnessError(RuntimeError):
    """A failed harness run, as one line (a rank that raised, died or hung; bad arguments)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick; a race with another binder is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def is_torchrun() -> bool:
    """True when this process was started by torchrun (or another launcher setting the env:// variables)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def launch(
    fn: Callable[..., Any],
    *,
    world_size: int,
    backend: str = "gloo",
    args: tuple[Any, ...] = (),
    timeout_s: float = 300.0,
    init_timeout_s: float = 60.0,
) -> Any:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return rank 0's result (see module doc)."""
    if backend not in BACKENDS:
        raise HarnessError(f"unknown backend '{backend}' (fix: use one of {', '.join(BACKENDS)})")
    if world_size < 1:
        raise HarnessError(f"--ranks must be at least 1, got {world_size}")
    if is_torchrun():
        launched = int(os.environ["WORLD_SIZE"])
        if launched != world_size:
            raise HarnessError(f"torchrun started {launched} ranks but --ranks is {world_size} (fix: make them equal)")
        rank = int(os.environ["RANK"])
        _init(backend, rank, world_size, init_timeout_s)
        try:
            return fn(rank, world_size, *args)
        finally:
            _destroy()
    if backend == "nccl":
        _check_gpus(world_size)
    return _spawn(fn, world_size, backend, args, timeout_s, init_timeout_s)


def cli_guard(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run a harness CLI ``main``; a `HarnessError` or simdist error becomes ``error: <one line>``, status 2."""
    from simdist.errors import SimdistError

    try:
        return main(argv)
    except (HarnessError, SimdistError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "torch":
            raise
        print("error: the validation harness needs torch, which is not installed "
              "(fix: pip install -e '.[validation]')", file=sys.stderr)
        return 2


def _check_gpus(world_size: int) -> None:
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available < world_size:
        raise HarnessError(f"backend nccl needs {world_size} GPUs, this machine has {available} "
                           f"(fix: lower --ranks or use --backend gloo)")


def _init(backend: str, rank: int, world_size: int, init_timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=init_timeout_s), **kwargs)


def _destroy() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _child(fn: Callable[..., Any], rank: int, world_size: int, backend: str, args: tuple[Any, ...],
           port: int, init_timeout_s: float, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    try:
        import torch

        # Assumption: N ranks share this host's cores; one intra-op thread each avoids oversubscription.
        torch.set_num_threads(1)
        _init(backend, rank, world_size, init_timeout_s)
        value = fn(rank, world_size, *args)
        results.put((rank, "ok", value if rank == 0 else None))
        _destroy()
    except BaseException as exc:  # report every failure (even SystemExit) to the parent as one line
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" at {os.path.basename(last[0].filename)}:{last[0].lineno}" if last else ""
        results.put((rank, "error", f"{type(exc).__name__}: {exc}{where}"))
        results.close()
        results.join_thread()  # flush the queue's feeder thread before the hard exit
        sys.stderr.flush()
        os._exit(1)


def _spawn(fn: Callable[..., Any], world_size: int, backend: str, args: tuple[Any, ...],
           timeout_s: float, init_timeout_s: float) -> Any:
    import torch.distributed  # noqa: F401 - imported once here, forked children inherit it (seconds saved per rank)

    ctx = mp.get_context("spawn" if backend == "nccl" else "fork")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, backend, args, port, init_timeout_s, results),
                         name=f"simdist-rank{r}", daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    done: dict[int, Any] = {}
    failure: str | None = None
    try:
        while len(done) < world_size and failure is None:
            try:
                rank, status, value = results.get(timeout=0.05)
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in done]
                if dead:
                    try:  # a child that raised has queued its message just before exiting: read it
                        rank, status, value = results.get(timeout=0.5)
                    except queue.Empty:
                        r, code = dead[0]
                        failure = f"rank {r} died with exit code {code}"
                        break
                elif time.monotonic() > deadline:
                    late = [r for r in range(world_size) if r not in done]
                    failure = (f"timed out after {timeout_s:g} s waiting for rank(s) {', '.join(map(str, late))}; "
                               f"every process was terminated")
                    break
                else:
                    continue
            if status == "error":
                failure = f"rank {rank} failed: {value}"
            else:
                done[rank] = value
        if failure is None:
            for p in procs:
                p.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        _reap(procs)
        results.close()
    if failure is not None:
        raise HarnessError(failure)
    return done[0]


def _reap(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=2.0)


def run_metadata(backend: str, world_size: int, command: str) -> dict[str, str]:
    """What a measurement CSV records about its run (call on a rank, after the group started)."""
    import platform
    import shutil
    import subprocess

    import torch

    meta = {"command": command, "torch_version": torch.__version__, "backend": backend,
            "world_size": str(world_size), "python": platform.python_version(),
            "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    meta["host_count"] = str(max(1, world_size // max(1, local)))
    meta["launcher"] = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "validation.spawn"
    meta["cpu_model"] = cpu_model()
    meta["cpu_count"] = str(os.cpu_count())
    if hasattr(os, "getloadavg"):  # other work on the host skews CPU timings: record how busy it was
        meta["load_average_1m"] = f"{os.getloadavg()[0]:.2f}"
    if torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name(torch.cuda.current_device())
        meta["cuda_version"] = str(torch.version.cuda)
        nccl = torch.cuda.nccl.version()
        meta["nccl_version"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    if shutil.which("nvidia-smi"):
        try:
            topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
            if topo.returncode == 0 and topo.stdout.strip():
                meta["nvidia_smi_topo_m"] = topo.stdout.rstrip()
        except (OSError, subprocess.SubprocessError):
            pass
    return meta


def device_name(backend: str) -> str:
    """The GPU name on the NCCL path, else the CPU model."""
    import torch

    if backend == "nccl" and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return cpu_model()


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform.processor()."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
