"""Run a function on N local ranks with an initialised torch.distributed process group, or under torchrun.

``launch(fn, world_size=4, backend="gloo", args=(...))`` calls ``fn(rank, world_size, *args)`` on every
rank and returns what rank 0 returned. Two ways in:

- spawned here (no ``RANK`` in the environment): N child processes (fork for gloo, spawn for NCCL,
  which cannot fork a CUDA context), RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE set in each child
  before ``init_process_group``, which meets its peers through a file in the run's own temporary folder
  (``file://``, a FileStore), not a TCP port picked free and bound later: two runs on one host at once
  (pytest's workers, two users) cannot meet in one store, which two runs that drew the same port could
  (one's rank joining the other's store; the likely cause of a CI run whose gloo connectFullMesh failed
  with "Connection closed by peer" with no rank at fault);
- launched by ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` already set): no spawning, this
  process joins the group and ``launch`` returns this rank's own result (``world_size`` must match).

On the NCCL path every process binds to GPU ``LOCAL_RANK`` (``torch.cuda.set_device``) before the group
starts.

Faults never hang a spawned run, and every message names the rank and what it was doing (`doing`):

- a rank that raises, dies (a signal, ``os._exit``) or stays stopped (SIGSTOP/SIGTSTP) for
  `STOPPED_GRACE_S`, or a run that outlives ``timeout_s``, ends the run: every child is terminated (then
  killed) and `HarnessError` carries one line naming the rank, how it failed and what it was doing; a rank
  whose collective failed because a peer died or stopped is not blamed, the peer is. Collectives that never
  complete also time out through the process group's own ``timeout`` (``init_timeout_s``).
- the ranks are tied to this process: each child watches its parent (the ``multiprocessing`` parent
  sentinel, a pipe that reads EOF when the parent dies, however it dies) from a watchdog thread and exits
  with one ``error: rank R: ...`` line when it goes. On Linux ``prctl(PR_SET_PDEATHSIG, SIGCONT)`` makes the
  kernel resume a rank that was stopped when the parent died, so that its watchdog runs too (a SIGKILLed
  ``python -m validation.collectives`` leaves no orphan, stopped or not).
- what the ranks write to their standard error (Python warnings, C++ log lines such as gloo's
  "connectFullMesh failed" from a rank whose peer already failed) goes to one file per rank: a run that
  succeeds copies it to this process's standard error afterwards, rank by rank; a failed run keeps it in
  a temporary folder that its one-line message names, so that the failure stays one line.
- results so far are kept: rank 0 hands each finished result to the parent as it goes (`report`); the
  `HarnessError` of a failed run carries them (``items``), and when the parent itself dies, rank 0's
  watchdog calls the ``salvage`` function given to `launch` with them, so the harness CLIs write what was
  measured to a ``*.partial.csv`` file (see `partial_path`) instead of losing it.
"""

from __future__ import annotations

import ctypes
import datetime
import math
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from validation.supervise import REPORTED_EXIT, STOPPED_GRACE_S, Watch, blame, check, read_activity, reap, take

__all__ = ["MAX_SPAWNED_RANKS", "STOPPED_GRACE_S", "HarnessError", "doing", "is_torchrun", "launch",
           "partial_path", "report"]

BACKENDS = ("gloo", "nccl")
MAX_SPAWNED_RANKS = 64
"""Most ranks `launch` spawns on one host (a bound on the processes one command line can start)."""
_ACTIVITY_BYTES = 240
_PR_SET_PDEATHSIG, _PR_SET_NAME = 1, 15  # linux/prctl.h


class HarnessError(RuntimeError):
    """A failed harness run, as one line (a rank that raised, died, stopped or hung; bad arguments).

    ``items``: what rank 0 handed over with `report` before the failure (results so far), in order.
    """

    def __init__(self, message: str, items: list[Any] | None = None, status: int = 2) -> None:
        super().__init__(" ".join(message.split()))
        self.items: list[Any] = list(items or [])
        self.status = status
        """The CLI's exit status: 2, or 130 for a run stopped by Ctrl-C (`cli_guard`)."""

    def amended(self, note: str) -> HarnessError:
        """The same failure with ``note`` (where the partial results went) appended."""
        return HarnessError(f"{self}; {note}", self.items, self.status)


def is_torchrun() -> bool:
    """True when this process was started by torchrun (or another launcher setting the env:// variables)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def partial_path(out: str | Path) -> Path:
    """Where a failed run keeps its results so far: ``m.csv`` -> ``m.partial.csv`` (never the target itself)."""
    p = Path(out)
    return p.with_name(f"{p.stem}.partial{p.suffix or '.csv'}")


# --------------------------------------------------------------------------- inside a rank
class _RankState:
    """What this process knows about itself as a spawned rank (module state of the child; None in a parent)."""

    rank: ClassVar[int | None] = None
    activity: ClassVar[Any] = None  # a shared ctypes char array the parent reads
    results: ClassVar[Any] = None  # the queue to the parent
    items: ClassVar[list[Any]] = []
    parent_pid: ClassVar[int] = 0
    salvage: ClassVar[Any] = None
    stderr_fd: ClassVar[int] = 2  # the standard error this rank was started with (its own fd 2 is a file)
    stderr_path: ClassVar[str] = ""  # that file


def doing(what: str) -> None:
    """Record what this rank is doing now, as a phrase that follows "while": "running all_reduce of 1048576 B,
    timed iteration 3 of 20"; failure messages name it. Cheap (a copy into shared memory); a no-op outside a
    spawned rank."""
    slot = _RankState.activity
    if slot is not None:
        slot.value = what.encode("utf-8", "replace")[: _ACTIVITY_BYTES - 1]


def report(item: Any) -> None:
    """Hand one finished result to the parent now (rank 0 only is kept): it survives a later failure."""
    _RankState.items.append(item)
    if _RankState.results is not None and _RankState.rank == 0:
        _RankState.results.put((0, "item", item))


def _orphaned(rank: int, parent_pid: int, salvage: tuple[Callable[..., str], tuple[Any, ...]] | None) -> None:
    """One line saying the parent died and what this rank was doing (results so far kept by rank 0); exit."""
    with _ORPHAN_LOCK:  # the watchdog and a collective failing because a peer left may both get here
        what = read_activity(_RankState.activity) if _RankState.activity is not None else "running"
        message = f"error: rank {rank}: the harness process (pid {parent_pid}) died while this rank was {what}"
        if salvage is not None and rank == 0:
            reason = f"the harness process died while rank 0 was {what}"
            try:
                message += f"; {salvage[0](list(_RankState.items), reason, *salvage[1])}"
            except Exception as exc:  # a failed salvage must not keep the orphan alive
                message += f"; results so far lost ({type(exc).__name__}: {exc})"
        message += f"; rank {rank} exits"
        sys.stderr.flush()
        os.write(_RankState.stderr_fd, (" ".join(message.split()) + "\n").encode("utf-8", "replace"))
        _drop_if_empty(_RankState.stderr_path)  # nobody is left to hand it over
        os._exit(3)


_ORPHAN_LOCK = threading.Lock()


def _drop_if_empty(path: str) -> None:
    """Remove this rank's empty standard-error file, and its folder once the last rank removed its own."""
    try:
        if path and os.path.getsize(path) == 0:
            os.remove(path)
            os.rmdir(os.path.dirname(path))
    except OSError:  # not empty, or another rank's file is still there
        pass


def _tie_to_parent(rank: int, salvage: tuple[Callable[..., str], tuple[Any, ...]] | None) -> None:
    """Exit with one line when the parent dies (see the module doc); resume if stopped at that moment."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGCONT), 0, 0, 0)
            libc.prctl(_PR_SET_NAME, f"simdist-rank{rank}".encode()[:15], 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - not glibc: the watchdog alone
            pass
    parent = mp.parent_process()
    parent_pid = os.getppid()
    _RankState.parent_pid = parent_pid

    def watch() -> None:
        from multiprocessing.connection import wait

        if parent is not None and parent.sentinel is not None:
            wait([parent.sentinel])
        else:  # pragma: no cover - multiprocessing always gives a sentinel on POSIX
            while os.getppid() == parent_pid:
                time.sleep(0.2)
        _orphaned(rank, parent_pid, salvage)

    _RankState.salvage = salvage
    threading.Thread(target=watch, name="simdist-parent-watchdog", daemon=True).start()


# --------------------------------------------------------------------------- the parent
def launch(
    fn: Callable[..., Any],
    *,
    world_size: int,
    backend: str = "gloo",
    args: tuple[Any, ...] = (),
    timeout_s: float = 300.0,
    init_timeout_s: float = 60.0,
    on_item: Callable[[Any], None] | None = None,
    salvage: tuple[Callable[..., str], tuple[Any, ...]] | None = None,
) -> Any:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return rank 0's result (see module doc).

    ``on_item(item)`` is called in this process for each item rank 0 `report`s; ``salvage = (fn, args)``:
    ``fn(items, reason, *args) -> note`` runs in rank 0 if this process dies mid-run (module doc).
    """
    if backend not in BACKENDS:
        raise HarnessError(f"unknown backend '{backend}' (fix: use one of {', '.join(BACKENDS)})")
    if world_size < 1:
        raise HarnessError(f"--ranks must be at least 1, got {world_size}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise HarnessError(f"--timeout must be a positive number of seconds, got {timeout_s:g}")
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
    if world_size > MAX_SPAWNED_RANKS:
        raise HarnessError(f"--ranks {world_size} exceeds the {MAX_SPAWNED_RANKS} ranks one host may spawn "
                           f"(fix: use at most {MAX_SPAWNED_RANKS}, or torchrun across hosts)")
    if backend == "nccl":
        _check_gpus(world_size)
    return _spawn(fn, world_size, backend, args, timeout_s, init_timeout_s, on_item, salvage)


def _check_gpus(world_size: int) -> None:
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available < world_size:
        raise HarnessError(f"backend nccl needs {world_size} GPUs, this machine has {available} "
                           f"(fix: lower --ranks or use --backend gloo)")


def _init(backend: str, rank: int, world_size: int, init_timeout_s: float, rendezvous: str | None = None) -> None:
    """Join the process group: through the file ``rendezvous`` (spawned ranks), else torchrun's env://."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
    if rendezvous is not None:
        kwargs["init_method"] = Path(rendezvous).as_uri()
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=init_timeout_s), **kwargs)


def _destroy() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _capture_stderr(path: str) -> None:
    """Send this process's fd 2 (Python's and C++'s standard error alike) to ``path``; keep the original
    for the messages meant for the user when the parent is gone (`_orphaned`)."""
    sys.stderr.flush()
    _RankState.stderr_fd, _RankState.stderr_path = os.dup(2), path
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


def _child(fn: Callable[..., Any], rank: int, world_size: int, backend: str, args: tuple[Any, ...],
           rendezvous: str, init_timeout_s: float, results: Any, activity: Any,
           salvage: tuple[Callable[..., str], tuple[Any, ...]] | None, stderr_path: str) -> None:
    _RankState.rank, _RankState.activity, _RankState.results, _RankState.items = rank, activity, results, []
    _capture_stderr(stderr_path)
    doing("starting (init_process_group)")
    _tie_to_parent(rank, salvage)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size))
    try:
        import torch

        # Assumption: N ranks share this host's cores; one intra-op thread each avoids oversubscription.
        torch.set_num_threads(1)
        _init(backend, rank, world_size, init_timeout_s, rendezvous)
        doing(f"running {getattr(fn, '__name__', 'the harness')}")
        value = fn(rank, world_size, *args)
        doing("finishing (destroy_process_group)")
        results.put((rank, "ok", value if rank == 0 else None))
        _destroy()
    except BaseException as exc:  # report every failure (even SystemExit) to the parent as one line
        if _RankState.parent_pid and os.getppid() != _RankState.parent_pid:
            # the parent is gone (a peer that saw it go may have broken this rank's collective first): say so
            _orphaned(rank, _RankState.parent_pid, _RankState.salvage)
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" at {os.path.basename(last[0].filename)}:{last[0].lineno}" if last else ""
        results.put((rank, "error", f"{type(exc).__name__}: {exc}{where}"))
        results.close()
        results.join_thread()  # flush the queue's feeder thread before the hard exit
        sys.stderr.flush()
        os._exit(REPORTED_EXIT)


def _spawn(fn: Callable[..., Any], world_size: int, backend: str, args: tuple[Any, ...],
           timeout_s: float, init_timeout_s: float, on_item: Callable[[Any], None] | None,
           salvage: tuple[Callable[..., str], tuple[Any, ...]] | None) -> Any:
    import torch.distributed  # noqa: F401 - imported once here, forked children inherit it (seconds saved per rank)

    ctx = mp.get_context("spawn" if backend == "nccl" else "fork")
    results = ctx.Queue()
    activity = [ctx.Array("c", _ACTIVITY_BYTES, lock=False) for _ in range(world_size)]
    logs = Path(tempfile.mkdtemp(prefix="simdist-ranks-"))
    rendezvous = str(logs / "rendezvous")  # a FileStore's file: created by the first rank, removed by the last
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, backend, args, rendezvous, init_timeout_s, results,
                                              activity[r], salvage, str(logs / f"rank{r}.stderr")),
                         name=f"simdist-rank{r}", daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    watch = Watch(procs, activity)
    deadline = time.monotonic() + timeout_s
    done: dict[int, Any] = {}
    items: list[Any] = []
    failure: str | None = None
    interrupted = False
    try:
        try:
            while len(done) < world_size and failure is None:
                try:
                    rank, status, value = results.get(timeout=0.1)
                except queue.Empty:
                    failure = check(watch, done, deadline, timeout_s, results, items, on_item)
                    continue
                error = take(status, rank, value, done, items, on_item)
                if error is not None:
                    failure = blame(watch, done, rank, error)
        except KeyboardInterrupt:  # Ctrl-C: stop the ranks, keep what rank 0 reported (the CLIs keep it as partial)
            failure, interrupted = "interrupted (Ctrl-C)", True
        if failure is None:
            for p in procs:
                p.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        reap(procs)
        results.close()
    kept = _hand_over_stderr(logs, world_size, failed=failure is not None)
    if failure is not None:
        if kept:
            failure += f"; the ranks' own standard error is in {logs}"
        raise HarnessError(failure, items, status=130 if interrupted else 2)
    return done[0]


def _hand_over_stderr(logs: Path, world_size: int, *, failed: bool) -> bool:
    """After a run: a success copies each rank's captured standard error to this process's, prefixed
    ``[rank R]``, and removes ``logs``; a failure keeps ``logs`` when any rank wrote something (True)."""
    texts = []
    for r in range(world_size):
        try:
            texts.append((r, (logs / f"rank{r}.stderr").read_text(errors="replace")))
        except OSError:  # a rank that died before it opened its file
            continue
    wrote = any(text.strip() for _, text in texts)
    if failed and wrote:
        return True
    if wrote:
        sys.stderr.write("".join(f"[rank {r}] {line}\n" for r, text in texts for line in text.splitlines()))
        sys.stderr.flush()
    shutil.rmtree(logs, ignore_errors=True)
    return False
