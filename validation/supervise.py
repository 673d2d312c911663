"""The parent's watch over spawned ranks (validation.spawn): who died, who is stopped, whom to blame.

One line per failure, naming the rank, how it failed and what it was doing (the activity each rank writes
into shared memory, validation.spawn.doing): a rank killed by a signal or exiting without a report, a rank
stopped (state T in /proc) for `STOPPED_GRACE_S`, a run past its timeout. A rank whose collective failed
because a peer died or stopped is not blamed: the peer is (`blame`).
"""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Callable
from typing import Any

__all__ = ["STOPPED_GRACE_S", "Watch", "blame", "check", "reap"]

STOPPED_GRACE_S = 3.0
"""Seconds a spawned rank may stay stopped (SIGSTOP/SIGTSTP) before the run is ended."""
REPORTED_EXIT = 1  # a rank that raised queues its message, then exits with this status (validation.spawn._child)


def read_activity(slot: Any) -> str:
    return slot.value.decode("utf-8", "replace") or "starting"


def _state(pid: int | None) -> str:
    """The process state letter from /proc (R, S, D, T = stopped, t = traced, Z ...); '' where unknown."""
    if pid is None:
        return ""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class Watch:
    """The parent's view of its ranks: exit codes, stopped ranks, what each is doing."""

    def __init__(self, procs: list[Any], activity: list[Any]) -> None:
        self.procs, self.activity = procs, activity
        self.stopped_since: dict[int, float] = {}

    def doing(self, rank: int) -> str:
        return read_activity(self.activity[rank])

    def dead(self, done: dict[int, Any]) -> list[tuple[int, int]]:
        return [(r, p.exitcode) for r, p in enumerate(self.procs) if p.exitcode not in (None, 0) and r not in done]

    def stopped(self, now: float) -> list[int]:
        """Ranks stopped now; those stopped for STOPPED_GRACE_S or longer first."""
        out = []
        for r, p in enumerate(self.procs):
            if p.exitcode is None and _state(p.pid) == "T":
                out.append(r)
                self.stopped_since.setdefault(r, now)
            else:
                self.stopped_since.pop(r, None)
        return out

    def overdue(self, now: float) -> list[int]:
        self.stopped(now)
        return [r for r, t in sorted(self.stopped_since.items()) if now - t >= STOPPED_GRACE_S]

    def culprit(self, done: dict[int, Any], exclude: int | None = None) -> str | None:
        """One line on a rank that died without saying why (a signal, os._exit) or is stopped (not ``exclude``);
        None when there is none (a rank that raised reported its own error, and may be a consequence)."""
        for r, code in self.dead(done):
            if r != exclude and code != REPORTED_EXIT:
                return f"rank {r} {_how_it_ended(code)} while {self.doing(r)}"
        for r in self.stopped(time.monotonic()):
            if r != exclude:
                return f"rank {r} was stopped (SIGSTOP or SIGTSTP) while {self.doing(r)}"
        return None


def take(status: str, rank: int, value: Any, done: dict[int, Any], items: list[Any],
         on_item: Callable[[Any], None] | None) -> str | None:
    """Record one message of a rank: an item (kept, and passed to ``on_item``), its result (``done``), or its
    error, returned for `blame`."""
    if status == "item":
        items.append(value)
        if on_item is not None:
            on_item(value)
        return None
    if status == "error":
        return value
    done[rank] = value
    return None


def check(watch: Watch, done: dict[int, Any], deadline: float, timeout_s: float, results: Any,
           items: list[Any], on_item: Callable[[Any], None] | None) -> str | None:
    """The failure to end the run with when no message came: a dead, long-stopped or late rank; else None."""
    dead = watch.dead(done)
    if dead:
        # A child that raised has queued its message just before exiting: read what is queued first.
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            try:
                rank, status, value = results.get(timeout=0.1)
            except queue.Empty:
                continue
            error = take(status, rank, value, done, items, on_item)
            if error is not None:
                return blame(watch, done, rank, error)
        r, code = dead[0]
        return f"rank {r} {_how_it_ended(code)} while {watch.doing(r)}; every process was terminated"
    now = time.monotonic()
    overdue = watch.overdue(now)
    if overdue:
        r = overdue[0]
        return (f"rank {r} was stopped (SIGSTOP or SIGTSTP) for {STOPPED_GRACE_S:g} s while {watch.doing(r)}; "
                "every process was terminated")
    if now > deadline:
        late = [r for r in range(len(watch.procs)) if r not in done]
        what = "; ".join(f"rank {r} was {watch.doing(r)}" + (" (stopped)" if _state(watch.procs[r].pid) == "T"
                                                             else "") for r in late[:4])
        return (f"timed out after {timeout_s:g} s waiting for rank(s) {', '.join(map(str, late))} ({what}); "
                "every process was terminated")
    return None


def blame(watch: Watch, done: dict[int, Any], rank: int, message: str) -> str:
    """One line for rank ``rank`` raising ``message``: a peer that died or stopped is named as the cause."""
    what = watch.doing(rank)
    end = time.monotonic() + 1.0
    while True:  # a peer killed a moment ago: its exit code appears within milliseconds
        cause = watch.culprit(done, exclude=rank)
        if cause is not None:
            return f"{cause}; rank {rank} then failed while {what}: {message}"
        if time.monotonic() > end:
            return f"rank {rank} failed while {what}: {message}"
        time.sleep(0.05)


def reap(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
            if _state(p.pid) == "T":
                os.kill(p.pid, signal.SIGKILL)  # a stopped process keeps SIGTERM pending forever
    for p in procs:
        p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=2.0)
