"""Where evaluations run: in this process, on local worker processes, or on an existing Dask cluster.

Every executor takes a function and a list of argument tuples and yields ``(index, result)`` as results
arrive; callers order results by index, so output order never depends on the executor. Dask is optional
(``pip install simdist[dask]``) and imported only when ``--dask`` is given.

The Dask scheduler is trusted: it runs simdist's code with the search's inputs, and whatever answers at the address
is sent them (Dask's own model, distributed.readthedocs.io "Security"). So ``--dask`` takes a plain ``tcp://host:port``
(or ``host:port``) only, refuses TLS, UCX and in-process schemes with that reason, gives up on an address that does
not answer as a Dask scheduler within DASK_CONNECT_TIMEOUT_S (a silent port, a web server: one line, never a hang or
an out-of-memory), and while it waits for results stops with one line when the cluster has had no worker for
DASK_NO_WORKER_S or the scheduler goes away; the rows finished so far are in the search's results file.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from simdist.errors import SpecError, note

DASK_CONNECT_TIMEOUT_S = 10.0
DASK_NO_WORKER_S = 30.0
"""Seconds the search waits on a Dask cluster without a single worker before it stops (workers restarting come
back within seconds)."""
DASK_WINDOW_MIN = 16
DASK_WINDOW_PER_WORKER = 4
"""Jobs kept on a Dask cluster at a time: 4 per worker (each worker busy, the next batches queued beside it), at
least 16 (a cluster whose workers are still joining)."""
DASK_JOB_MAX = 512
"""The most candidates `DaskExecutor.job_size` puts in one job. A Dask task costs the scheduler, the worker and the
client a few milliseconds each whatever it carries, against about 1 ms of closed form per candidate: on a
LocalCluster of 2 single-threaded workers on this 2-core machine the same 60,000 warm evaluations ran at 1,428
candidates/s in jobs of 64, 1,581 in jobs of 256, 1,738 in jobs of 512 and 1,604 in jobs of 1,024 (scratch script
timing simdist.search.evaluate.evaluate_batch through `DaskExecutor.run`, 2026-12-05; runs vary by about 5 %). 512
is past the knee and keeps what a Ctrl-C loses to about half a second per worker."""
DASK_WORKER_SETTINGS = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1000ms",
    "distributed.worker.memory.monitor-interval": "1000ms",
}
"""Dask configuration that keeps a worker's own threads off the CPU a search's closed form runs on (README, Search:
give them to ``dask worker`` as DASK_* environment variables; benchmarks/search.py gives them to its LocalCluster).
By default a worker samples its running task's stack every 10 ms (its profiler), checks its event loop every 20 ms
and its memory every 100 ms, each taking the interpreter lock from the task: one worker evaluating the README's
1,801 layouts warm took 1,108 us a layout against 926 us in a plain process, 1,045 us without the profiler and
1,009 us with all three (scratch script, 2026-12-05; the rest is the worker's event loop and heartbeats)."""
_DASK_FIX = "start one (dask scheduler; dask worker ADDRESS) or check the address, e.g. tcp://host:8786"


def dask_address(address: str) -> str:
    """``tcp://host:port`` from ``--dask`` (``host:port`` accepted), or a SpecError naming what is wrong."""
    text = address.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "tcp", text
    if scheme != "tcp":
        raise SpecError(f"{address}: the {scheme}:// scheme is not supported (simdist talks to a trusted Dask "
                        "scheduler over plain tcp://)", field="--dask",
                        fix="give tcp://host:port (a TLS or UCX cluster: reach it through a tunnel to its tcp port)")
    host, colon, port = rest.rpartition(":")
    if not colon or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise SpecError(f"{address}: not a host:port address", field="--dask",
                        fix="give tcp://host:port, e.g. tcp://127.0.0.1:8786")
    return f"tcp://{host}:{int(port)}"


class Executor:
    """Runs ``fn(*args)`` for each args tuple; ``run`` yields (index, result) as each finishes."""

    name = "in-process"

    def job_size(self, num_candidates: int, base: int) -> int:
        """Candidates per job when ``num_candidates`` are to be evaluated at once: ``base`` (simdist.search.sweep's
        BATCH). In-process and on local processes a job costs nothing beyond its candidates (a process pool's
        pickling: about 0.3 ms a job of 64), so small jobs keep the progress bar and Ctrl-C fine-grained."""
        return base

    def run(self, fn: Callable[..., Any], jobs: list[tuple]) -> Iterator[tuple[int, Any]]:
        for i, args in enumerate(jobs):
            yield i, fn(*args)

    def close(self) -> None:
        pass

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ignore_sigint() -> None:
    # Ctrl-C goes to the whole process group; the parent decides (keep what finished), workers carry on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ProcessExecutor(Executor):
    """concurrent.futures.ProcessPoolExecutor with ``workers`` processes."""

    def __init__(self, workers: int) -> None:
        self.name = f"{workers} local processes"
        self.workers = workers
        self._pool = ProcessPoolExecutor(max_workers=workers, initializer=_ignore_sigint)
        self._pending: list[Future] = []

    def run(self, fn: Callable[..., Any], jobs: list[tuple]) -> Iterator[tuple[int, Any]]:
        futures = {self._pool.submit(fn, *args): i for i, args in enumerate(jobs)}
        self._pending = list(futures)
        left = set(futures)
        while left:
            done, left = wait(left, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=lambda f: futures[f]):
                yield futures[f], f.result()

    def close(self) -> None:
        for f in self._pending:
            f.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)


class DaskExecutor(Executor):
    """Submits to an existing Dask distributed scheduler (``tcp://host:port``) or a ``distributed.Client``."""

    def __init__(self, address: Any, *, timeout_s: float = DASK_CONNECT_TIMEOUT_S) -> None:
        try:
            from distributed import Client
        except ImportError:
            raise SpecError("--dask needs the dask extra", field="--dask",
                            fix="pip install 'simdist[dask]'") from None
        self._own = not isinstance(address, Client)
        if not self._own:
            self.client = address
        else:
            address = dask_address(str(address))
            self.client = _connect(Client, address, timeout_s)
        self.address = self.client.scheduler.address
        self.name = f"Dask at {self.address}"
        self._futures: list[Any] = []
        self._checked = False

    def run(self, fn: Callable[..., Any], jobs: list[tuple]) -> Iterator[tuple[int, Any]]:
        """Each job's result as it completes, with at most `_window` jobs on the cluster at a time: a finished job's
        future is dropped once its result is read, so a search of 10^6 configurations holds a few batches, not every
        batch's rows (and the wait below scans a short list)."""
        import time

        from distributed import wait as dask_wait

        if not self._checked:
            self._checked = True
            self._note_worker_settings()
        queue = iter(enumerate(jobs))
        index: dict[Any, int] = {}
        pending: set[Any] = set()
        self._futures = pending  # in flight: what close() cancels
        workers = self._workers()

        def top_up() -> None:
            while len(pending) < max(DASK_WINDOW_MIN, DASK_WINDOW_PER_WORKER * workers):
                nxt = next(queue, None)
                if nxt is None:
                    return
                i, args = nxt
                try:
                    f = self.client.submit(fn, *args, pure=False)
                except Exception as err:  # the scheduler went away
                    raise self._lost(err) from None
                index[f.key] = i
                pending.add(f)

        top_up()
        finished = 0
        lonely_since: float | None = None
        while pending:
            try:
                done, _ = dask_wait(list(pending), timeout=2.0, return_when="FIRST_COMPLETED")
            except TimeoutError:  # nothing finished: is anyone working?
                done = set()
            except Exception as err:  # the scheduler went away (CommClosedError, OSError, ...)
                raise self._lost(err) from None
            for f in done:
                pending.discard(f)
                try:
                    result = f.result()
                except (OSError, TimeoutError) as err:
                    raise self._lost(err) from None
                finished += 1
                yield index.pop(f.key), result
            if done:
                lonely_since = None
                top_up()
                continue
            workers = self._workers()
            now = time.monotonic()
            lonely_since = (lonely_since or now) if workers == 0 else None
            if lonely_since is not None and now - lonely_since > DASK_NO_WORKER_S:
                raise SpecError(f"the Dask cluster at {self.address} has had no worker for {DASK_NO_WORKER_S:g} s; "
                                f"{len(jobs) - finished} evaluation(s) wait", field="--dask",
                                fix="start a worker (dask worker ADDRESS); rerun with the same --out to resume "
                                    "from the rows already written")
            top_up()

    def job_size(self, num_candidates: int, base: int) -> int:
        """Larger jobs where many candidates wait (a search's screening of every layout): ``num_candidates`` spread
        over `DASK_WINDOW_PER_WORKER` jobs per worker, at least ``base`` and at most `DASK_JOB_MAX` a job, since a
        Dask task has a fixed cost of its own (`DASK_JOB_MAX`). A few candidates (the branch and bound's rounds)
        stay in jobs of ``base``, so every worker still gets one."""
        workers = max(1, self._workers())
        even = -(-num_candidates // (DASK_WINDOW_PER_WORKER * workers))
        return max(base, min(DASK_JOB_MAX, even))

    def _note_worker_settings(self) -> None:
        """One note when workers run without `DASK_WORKER_SETTINGS` (their own threads then take the interpreter lock
        from the closed form every 10-100 ms); nothing when they have them, or cannot say."""
        try:
            found = self.client.run(_worker_settings_ok)
        except Exception:  # an old or busy worker: no note rather than a failed search
            return
        slow = sum(1 for ok in found.values() if not ok)
        if slow:
            env = " ".join(f"{dask_env_name(k)}={v}" for k, v in DASK_WORKER_SETTINGS.items())
            note(f"{slow} of {len(found)} Dask workers run with their profiler, event-loop tick or memory monitor at "
                 f"Dask's defaults, which take about 9 % of a worker's time from the closed form; start them with "
                 f"{env} (README, Search)")

    def _workers(self) -> int:
        """Workers the scheduler has now."""
        try:
            return len(self.client.scheduler_info().get("workers", {}))
        except Exception as err:
            raise self._lost(err) from None

    def _lost(self, err: BaseException) -> SpecError:
        reason = " ".join(str(err).split())[:160] or type(err).__name__
        return SpecError(f"lost the Dask scheduler at {self.address} ({reason})", field="--dask",
                         fix="restart it and rerun with the same --out to resume from the rows already written")

    def close(self) -> None:
        if self._futures:
            self.client.cancel(self._futures)
        if self._own:
            self.client.close()


def dask_env_name(key: str) -> str:
    """The environment variable Dask reads a configuration key from (dask.config: DASK_ prefix, ``__`` nesting)."""
    return "DASK_" + key.upper().replace(".", "__").replace("-", "_")


def _worker_settings_ok() -> bool:
    """On a worker: whether its configuration has `DASK_WORKER_SETTINGS` (the profiler off, the two checks at least
    1 s apart)."""
    import dask
    from dask.utils import parse_timedelta

    get = dask.config.get
    return (not get("distributed.worker.profile.enabled")
            and parse_timedelta(get("distributed.admin.tick.interval")) >= 1.0
            and parse_timedelta(get("distributed.worker.memory.monitor-interval")) >= 1.0)


def _connect(client_cls: Any, address: str, timeout_s: float) -> Any:
    """A Dask client of ``address``, or a SpecError within ``timeout_s`` + 5 s whatever answers there: nothing, a
    silent port (the client's own timeout is not always kept), or a server that is not Dask (whose reply the Dask
    protocol can read as a huge frame: a MemoryError)."""
    import threading

    box: dict[str, Any] = {}

    def connect() -> None:
        try:
            box["client"] = client_cls(address, timeout=timeout_s)
        except BaseException as err:  # reported below, whatever it is
            box["error"] = err

    thread = threading.Thread(target=connect, name="simdist-dask-connect", daemon=True)
    thread.start()
    thread.join(timeout_s + 5.0)
    if "client" in box:
        return box["client"]
    err = box.get("error")
    if err is None:
        why = f"no answer within {timeout_s + 5:g} s"
    elif isinstance(err, MemoryError):
        why = "what answers there is not a Dask scheduler"
    else:
        why = " ".join(str(err).split())[:160] or type(err).__name__
    raise SpecError(f"cannot reach the Dask scheduler at {address} within {timeout_s:g} s ({why})", field="--dask",
                    fix=_DASK_FIX)


def make_executor(*, workers: int = 1, dask: Any = None) -> Executor:
    if dask is not None:
        return DaskExecutor(dask)
    if workers < 1:
        raise SpecError(f"--workers {workers} must be at least 1", field="--workers", fix="give 1 or more")
    return Executor() if workers == 1 else ProcessExecutor(workers)
