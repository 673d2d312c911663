"""Where evaluations run: in this process, on local worker processes, or on an existing Dask cluster.

Every executor takes a function and a list of argument tuples and yields ``(index, result)`` as results
arrive; callers order results by index, so output order never depends on the executor. Dask is optional
(``pip install simdist[dask]``) and imported only when ``--dask`` is given.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from simdist.errors import SpecError

DASK_CONNECT_TIMEOUT_S = 10.0


class Executor:
    """Runs ``fn(*args)`` for each args tuple; ``run`` yields (index, result) as each finishes."""

    name = "in-process"

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
            try:
                self.client = Client(address, timeout=timeout_s)
            except (OSError, TimeoutError, ValueError) as err:
                reason = str(err).splitlines()[0] if str(err) else type(err).__name__
                raise SpecError(f"cannot reach the Dask scheduler at {address} within {timeout_s:g} s ({reason})",
                                field="--dask", fix="start one (dask scheduler; dask worker ADDRESS) or check the "
                                                    "address, e.g. tcp://host:8786") from None
        self.name = f"Dask at {self.client.scheduler.address}"
        self._futures: list[Any] = []

    def run(self, fn: Callable[..., Any], jobs: list[tuple]) -> Iterator[tuple[int, Any]]:
        from distributed import as_completed

        futures = [self.client.submit(fn, *args, pure=False) for args in jobs]
        self._futures = futures
        index = {f.key: i for i, f in enumerate(futures)}
        for f in as_completed(futures):
            yield index[f.key], f.result()

    def close(self) -> None:
        if self._futures:
            self.client.cancel(self._futures)
        if self._own:
            self.client.close()


def make_executor(*, workers: int = 1, dask: Any = None) -> Executor:
    if dask is not None:
        return DaskExecutor(dask)
    if workers < 1:
        raise SpecError(f"--workers {workers} must be at least 1", field="--workers", fix="give 1 or more")
    return Executor() if workers == 1 else ProcessExecutor(workers)
