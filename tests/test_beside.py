"""simdist.predict.beside: work in a forked child beside the caller, or in-process where not (tiny stories)."""

from __future__ import annotations

import os
import signal

import pytest

from simdist.predict import beside
from simdist.predict.beside import Beside

forks = pytest.mark.skipif(not beside.can_fork(), reason="needs Linux, one thread and two CPUs")


@forks
def test_the_child_prepares_and_finishes_with_the_callers_message():
    parent = os.getpid()
    with Beside(lambda: (os.getpid(), [1.0, 2.0]), lambda prep, msg: (prep[0], sum(prep[1]) * msg)) as job:
        assert job.forked
        pid, value = job.result(0.1)
    assert pid != parent  # prepared in the child
    assert value == (1.0 + 2.0) * 0.1  # the same float, pickled back bit for bit


def test_no_child_where_switched_off(monkeypatch):
    monkeypatch.setenv("SIMDIST_PROCESSES", "1")
    assert not beside.can_fork()
    job = Beside(lambda: os.getpid(), lambda prep, msg: (prep, msg))
    assert not job.forked
    assert job.result("m") == (os.getpid(), "m")  # computed here when asked for


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
