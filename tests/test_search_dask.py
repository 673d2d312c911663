"""The Dask executor: same results as in-process against a LocalCluster; an unreachable scheduler fails fast."""

from __future__ import annotations

import pytest

from simdist.errors import SpecError
from simdist.search.executors import DaskExecutor, Executor
from simdist.search.rank import enumerate_feasible
from simdist.search.space import SearchProblem
from simdist.search.sweep import sweep

distributed = pytest.importorskip("distributed")

SMALL = SearchProblem("llama3-8b", "dgx-h100", 2, 32, max_cp=1, max_vpp=2, max_micro_batch=2)


@pytest.mark.filterwarnings("ignore::simdist.errors.SimdistNote")  # the workers' settings
def test_dask_local_cluster_matches_in_process():
    feasible, *_ = enumerate_feasible(SMALL)
    local, local_bounded, _, local_new, _ = sweep(SMALL, feasible, Executor())
    with (distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None,
                                   protocol="tcp://") as lc,
          DaskExecutor(lc.scheduler_address, timeout_s=10) as ex):  # by address, as --dask does
        remote, bounded, interrupted, new, _ = sweep(SMALL, feasible, ex)
    # branch and bound: the same layouts timed exactly, the same ones bounded, whoever runs the batches
    assert not interrupted and new == local_new and 0 < new <= len(feasible)
    assert remote == local and bounded == local_bounded


@pytest.mark.filterwarnings("ignore::simdist.errors.SimdistNote")  # the workers' settings
def test_dask_jobs_grow_where_many_candidates_wait():
    """One worker: a phase of n candidates goes out in jobs of ceil(n / 4), at least the sweep's 64 and at most 512;
    in-process and on local processes always 64. Whatever the job size, the rows are the same and in order."""
    from simdist.search.executors import DASK_JOB_MAX, ProcessExecutor

    assert Executor().job_size(100_000, 64) == 64
    with ProcessExecutor(1) as pool:
        assert pool.job_size(100_000, 64) == 64
    with (distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None,
                                   protocol="tcp://") as lc,
          DaskExecutor(lc.scheduler_address, timeout_s=10) as ex):
        assert [ex.job_size(n, 64) for n in (10, 256, 257, 1000, 2048, 2049, 10**6)] == [64, 64, 65, 250, 512, 512,
                                                                                        DASK_JOB_MAX]
        feasible, *_ = enumerate_feasible(SMALL)
        assert len(feasible) == 476 and ex.job_size(len(feasible), 64) == 119  # the screening: jobs of 119
        remote, bounded, *_ = sweep(SMALL, feasible, ex)
    local, local_bounded, *_ = sweep(SMALL, feasible, Executor())
    assert remote == local and bounded == local_bounded


def test_workers_without_the_recommended_settings_get_one_note():
    """Dask's defaults (the worker profiler every 10 ms, the loop and memory checks every 20 and 100 ms) earn one
    note naming the environment variables, once per executor; workers with DASK_WORKER_SETTINGS earn none."""
    import warnings

    import dask

    from simdist.errors import SimdistNote
    from simdist.search.executors import DASK_WORKER_SETTINGS

    def cluster():
        return distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None,
                                        protocol="tcp://")  # in-process workers read this process's Dask config

    with cluster() as lc, DaskExecutor(lc.scheduler_address, timeout_s=10) as ex:
        with pytest.warns(SimdistNote, match="1 of 1 Dask workers .*DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False "
                                             "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL=1000ms"):
            assert list(ex.run(abs, [(-1,)])) == [(0, 1)]
        with warnings.catch_warnings():
            warnings.simplefilter("error", SimdistNote)
            assert list(ex.run(abs, [(-2,)])) == [(0, 2)]  # once per executor
    with (dask.config.set(DASK_WORKER_SETTINGS), cluster() as lc,
          DaskExecutor(lc.scheduler_address, timeout_s=10) as ex, warnings.catch_warnings()):
        warnings.simplefilter("error", SimdistNote)
        assert list(ex.run(abs, [(-3,)])) == [(0, 3)]


def test_unreachable_scheduler_is_one_clear_error():
    with pytest.raises(SpecError, match=r"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:9") as info:
        DaskExecutor("tcp://127.0.0.1:9", timeout_s=1)
    assert info.value.field == "--dask" and "\n" not in info.value.one_line()


@pytest.mark.parametrize(("address", "words"), [
    ("ucx://10.0.0.1:8786", "the ucx:// scheme is not supported"),
    ("tls://10.0.0.1:8786", "the tls:// scheme is not supported"),
    ("inproc://x/1/2", "the inproc:// scheme is not supported"),
    ("tcp://10.0.0.1", "not a host:port address"),
    ("tcp://10.0.0.1:99999", "not a host:port address"),
    ("tcp://10.0.0.1:8\u00b9", "not a host:port address"),
])
def test_only_plain_tcp_addresses(address, words):
    with pytest.raises(SpecError, match=words) as info:
        DaskExecutor(address, timeout_s=1)
    assert info.value.field == "--dask"


_NOT_DASK = """
import socket, sys, threading, time
from simdist.errors import SpecError
from simdist.search.executors import DaskExecutor

def web(conn):
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok" + b"\\xff" * 64)

def silent(conn):
    time.sleep(600)

handler = web if sys.argv[1] == "web" else silent
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(4)

def loop():
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=handler, args=(conn,), daemon=True).start()

threading.Thread(target=loop, daemon=True).start()
try:
    DaskExecutor(f"tcp://127.0.0.1:{server.getsockname()[1]}", timeout_s=2)
except SpecError as err:
    print(err.one_line())
"""


@pytest.mark.parametrize("kind", ["web", "silent"])
def test_what_is_not_a_dask_scheduler_is_one_line_within_seconds(kind):
    # In a process of its own: the client left connecting in the background (its own timeout is not always kept)
    # must not share distributed's loop with the next test's cluster (it did, and that test waited forever). A
    # CLI run ends there, and with it that thread.
    import subprocess
    import sys

    # no timing asserted: the silent port answers nothing for 600 s, so a connection that waited for it would run
    # into this hang guard (the refusal comes after the 2 s timeout + 5 s)
    out = subprocess.run([sys.executable, "-c", _NOT_DASK, kind], capture_output=True, text=True, timeout=300)
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and "cannot reach the Dask scheduler" in lines[0], out.stdout + out.stderr


def test_a_cluster_without_workers_stops_with_one_line(monkeypatch):
    from simdist.search import executors

    monkeypatch.setattr(executors, "DASK_NO_WORKER_S", 1.0)
    with (distributed.LocalCluster(processes=False, n_workers=0, dashboard_address=None, protocol="tcp://") as lc,
          DaskExecutor(lc.scheduler_address, timeout_s=10) as ex,
          pytest.raises(SpecError, match="has had no worker for 1 s; 3 evaluation") as info):
        list(ex.run(abs, [(-1,), (-2,), (-3,)]))
    assert "--out" in info.value.one_line()
