"""The Dask executor: same results as in-process against a LocalCluster; an unreachable scheduler fails fast."""

from __future__ import annotations

import pytest

from simdist.errors import SpecError
from simdist.search.executors import DaskExecutor, Executor
from simdist.search.rank import enumerate_feasible, sweep
from simdist.search.space import SearchProblem

distributed = pytest.importorskip("distributed")

SMALL = SearchProblem("llama3-8b", "dgx-h100", 2, 32, max_cp=1, max_vpp=2, max_micro_batch=2)


def test_dask_local_cluster_matches_in_process():
    feasible, *_ = enumerate_feasible(SMALL)
    local, local_bounded, _, local_new, _ = sweep(SMALL, feasible, Executor())
    with (distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as lc,
          DaskExecutor(lc.scheduler_address, timeout_s=10) as ex):  # by address, as --dask does
        remote, bounded, interrupted, new, _ = sweep(SMALL, feasible, ex)
    # branch and bound: the same layouts timed exactly, the same ones bounded, whoever runs the batches
    assert not interrupted and new == local_new and 0 < new <= len(feasible)
    assert remote == local and bounded == local_bounded


def test_unreachable_scheduler_is_one_clear_error():
    with pytest.raises(SpecError, match=r"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:9") as info:
        DaskExecutor("tcp://127.0.0.1:9", timeout_s=1)
    assert info.value.field == "--dask" and "\n" not in info.value.one_line()
