"""Work done beside the caller: in a forked child process while the caller goes on, or in-process where not.

`Beside` runs ``prepare()`` in a child forked from the caller (which inherits every object the caller holds, so
nothing is copied to start it), then ``finish(prepared, message)`` once the caller sends ``message``, and returns
what that gives (pickled back, bit for bit the floats the child computed). The caller meanwhile does its own part
of the work: on a machine of two or more CPUs the two parts take the time of the longer, not of their sum.

A fork is used only where it is safe and pays: Linux (macOS's system libraries do not support a fork without
exec), a single thread in the process (a fork copies only the calling thread: a lock another thread held would
never be released in the child), at least two CPUs this process may run on, and not switched off by the
environment variable ``SIMDIST_PROCESSES=1``. Elsewhere, and whenever the child fails (an error, a signal, a
message that does not come back), the same two calls run in the caller's process when `result` is asked for: the
same answer, computed there, any error raised there as the caller's own.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Beside", "can_fork"]

P = TypeVar("P")
R = TypeVar("R")

ENV = "SIMDIST_PROCESSES"
"""Set to 1 to keep simdist in one process (no `Beside` child)."""


def can_fork() -> bool:
    """Whether `Beside` forks a child here (module docstring)."""
    if os.environ.get(ENV, "").strip() == "1" or not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    if threading.active_count() != 1:
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - Linux has sched_getaffinity
        cpus = os.cpu_count() or 1
    return cpus >= 2


class Beside(Generic[P, R]):
    """``finish(prepare(), message)``, the ``prepare`` part started at once beside the caller (module docstring)."""

    def __init__(self, prepare: Callable[[], P], finish: Callable[[P, Any], R] | None = None, *,
                 nice: int = 0) -> None:
        """``finish``: None returns what ``prepare`` gave (no message needed). ``nice``: the child's niceness
        increment (os.nice), for work that has time to spare: where the machine's CPUs are all busy, the processes
        the answer waits for go first."""
        self._prepare = prepare
        self._nice = nice
        self._finish: Callable[[P, Any], R] = finish if finish is not None else _prepared  # type: ignore[assignment]
        self._pid = 0
        self._to_child = self._from_child = -1
        if can_fork():
            self._start()

    def _start(self) -> None:
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: prepare, wait for the message, finish, send the result, exit without clean-up
            code = 1
            try:
                os.close(down_w)
                os.close(up_r)
                if self._nice:
                    with contextlib.suppress(OSError):
                        os.nice(self._nice)
                prepared = self._prepare()
                with os.fdopen(down_r, "rb") as down:
                    message = pickle.load(down)
                result = self._finish(prepared, message)
                with os.fdopen(up_w, "wb") as up:
                    pickle.dump(result, up, protocol=pickle.HIGHEST_PROTOCOL)
                code = 0
            except BaseException:  # any failure: the caller computes it itself
                code = 1
            finally:
                os._exit(code)  # no atexit handlers, no flush of the caller's buffers, no finally of the caller
        os.close(down_r)
        os.close(up_w)
        self._pid, self._to_child, self._from_child = pid, down_w, up_r

    @property
    def forked(self) -> bool:
        """A child is (or was) doing the work."""
        return self._pid > 0

    def result(self, message: Any) -> R:
        """``finish(prepare(), message)``: from the child where it has one, else (or if it failed) computed here."""
        if self._pid > 0:
            got = self._collect(message)
            if got is not None:
                return got[0]
        return self._finish(self._prepare(), message)

    def _collect(self, message: Any) -> tuple[R] | None:
        """The child's result, or None where it failed (it is reaped either way)."""
        pid, self._pid = self._pid, -1
        result: tuple[R] | None = None
        try:
            down = os.fdopen(self._to_child, "wb")
            try:
                pickle.dump(message, down, protocol=pickle.HIGHEST_PROTOCOL)
                down.close()
            except OSError:  # the child ended early (a broken pipe): its status below says so
                with contextlib.suppress(OSError):
                    down.close()
            with os.fdopen(self._from_child, "rb") as up:
                try:
                    result = (pickle.load(up),)
                except (EOFError, pickle.UnpicklingError, OSError):
                    result = None
        finally:
            _, status = os.waitpid(pid, 0)
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        return result

    def close(self) -> None:
        """Stop a child whose result will not be asked for (the caller raised, or no longer needs it)."""
        if self._pid > 0:
            pid, self._pid = self._pid, -1
            for fd in (self._to_child, self._from_child):
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(ProcessLookupError):  # (it had exited)
                os.kill(pid, 9)
            os.waitpid(pid, 0)

    def __del__(self) -> None:  # (a caller that raised before asking for the result)
        self.close()

    def __enter__(self) -> Beside[P, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _prepared(prepared: Any, _message: object) -> Any:
    return prepared
