"""simdist.predict.beside: work in a forked child beside the caller, or in-process where not (tiny stories)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from simdist.predict import beside
from simdist.predict.beside import Beside

forks = pytest.mark.skipif(not (sys.platform.startswith("linux") and hasattr(os, "fork")), reason="needs Linux's fork")


@pytest.fixture(autouse=True)
def _fork(monkeypatch):
    # Fork whatever this process's threads and CPUs (a test run may have left a thread behind, and CI's machine may
    # have one CPU): these stories test the mechanism; when simdist forks is can_fork's business, tested below.
    monkeypatch.setattr(beside, "can_fork", lambda: True)


@forks
def test_the_child_prepares_and_finishes_with_the_callers_message():
    parent = os.getpid()
    with Beside(lambda: (os.getpid(), [1.0, 2.0]), lambda prep, msg: (prep[0], sum(prep[1]) * msg)) as job:
        assert job.forked
        pid, value = job.result(0.1)
    assert pid != parent  # prepared in the child
    assert value == (1.0 + 2.0) * 0.1  # the same float, pickled back bit for bit


def test_no_child_where_switched_off_or_not_safe(monkeypatch):
    monkeypatch.undo()  # the real can_fork
    monkeypatch.setenv("SIMDIST_PROCESSES", "1")
    assert not beside.can_fork()
    monkeypatch.delenv("SIMDIST_PROCESSES")
    import threading

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not beside.can_fork()  # a second thread: a fork would copy this one only
    finally:
        stop.set()
        other.join()
    monkeypatch.setenv("SIMDIST_PROCESSES", "1")
    job = Beside(lambda: os.getpid(), lambda prep, msg: (prep, msg))
    assert not job.forked
    assert job.result("m") == (os.getpid(), "m")  # computed here when asked for


@forks
def test_a_niced_child_runs_at_its_niceness():
    with Beside(lambda: os.nice(0), lambda prep, msg: prep, nice=3) as job:
        assert job.forked and job.result(None) == os.nice(0) + 3


@forks
def test_a_failed_child_is_computed_again_in_the_caller():
    parent = os.getpid()

    def prepare():
        if os.getpid() != parent:
            raise RuntimeError("only in the child")
        return 3

    with Beside(prepare, lambda prep, msg: prep + msg) as job:
        assert job.forked and job.result(4) == 7


@forks
def test_an_error_of_the_work_is_raised_in_the_caller():
    def prepare():
        raise ValueError("bad layout")

    with Beside(prepare, lambda prep, msg: prep) as job, pytest.raises(ValueError, match="bad layout"):
        job.result(None)


@forks
def test_a_killed_child_is_computed_again_in_the_caller():
    import time

    def prepare():
        time.sleep(30)  # (in the child only: the caller's prepare below is the fallback's)
        return 1

    job = Beside(prepare, lambda prep, msg: prep + msg)
    assert job.forked
    os.kill(job._pid, signal.SIGKILL)
    job._prepare = lambda: 1  # the caller's own computation, once the child is gone
    assert job.result(1) == 2


@forks
def test_close_stops_a_child_whose_result_is_not_asked_for():
    import time

    job = Beside(lambda: time.sleep(30), lambda prep, msg: msg)
    pid = job._pid
    job.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped
    assert not job.forked
