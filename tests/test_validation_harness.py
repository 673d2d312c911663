"""The torch validation harness on gloo (loopback, 2-4 ranks, tiny sizes): collectives CLI, the MLP's cuts
against the single-process reference, the lecture's unequal-batch example, and failures that never hang."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from simdist.calibrate.measurements import read_measurements  # noqa: E402
from simdist.calibrate.steps import read_csv_metadata, read_step_measurements  # noqa: E402
from simdist.collectives.ops import op_info  # noqa: E402
from validation import collectives  # noqa: E402
from validation.mlp import ALL_CUTS, MLPConfig, StepConfig, run_steps, weighted_gradient_sum_  # noqa: E402
from validation.spawn import HarnessError, free_port, launch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = MLPConfig(num_layers=4, width=64, batch=16, lr=0.1)


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_cut_matches_the_single_process_reference(ranks):
    cuts = tuple(c for c in ALL_CUTS if c != "single")
    config = StepConfig(mlp=TINY, cuts=cuts, num_microbatches=2 * ranks, bucket_bytes=3 * 64 * 64 * 4 - 1,
                        check=True, timed=False)
    rows, checks, meta = run_steps(config, ranks, timeout_s=60)
    assert rows == [] and meta["world_size"] == str(ranks)
    assert [c.cut for c in checks] == list(cuts)
    for c in checks:
        assert c.grad_ref_max > 1e-4, c  # the gradients are not vanishingly small: the check has teeth
        assert c.grad_rel_err < 1e-5 and c.grad_abs_err < 1e-5 * c.grad_ref_max, c
        assert c.weight_abs_err < 1e-5, c


def test_unequal_local_batches_give_the_global_batch_gradient():
    config = StepConfig(mlp=MLPConfig(num_layers=2, width=32, batch=4, lr=0.1),
                        cuts=("data_parallel", "data_parallel_bucketed"), batch_split=(1, 3), check=True, timed=False)
    _, checks, _ = run_steps(config, 2, timeout_s=60)
    for c in checks:
        assert c.grad_rel_err < 1e-5, c


def _lecture_example(rank, world):
    import torch.distributed as dist

    # Per-example gradients [1, 3, 5, 7] of loss = mean_i w x_i, split 1 | 3 (CS336 lecture 8).
    x = torch.tensor([[1.0], [3.0, 5.0, 7.0]][rank])
    w = torch.zeros((), requires_grad=True)
    (w * x).mean().backward()
    local = w.grad.item()
    weighted = w.grad.clone()
    weighted_gradient_sum_([weighted], len(x), 4)
    naive = w.grad.clone()
    dist.all_reduce(naive, op=dist.ReduceOp.AVG)
    return local, weighted.item(), naive.item()


def test_the_lecture_example_weights_by_share_of_examples():
    local, weighted, naive = launch(_lecture_example, world_size=2, timeout_s=30)
    assert local == 1.0  # rank 0's own mean
    assert weighted == pytest.approx(4.0, abs=1e-6)  # mean of [1, 3, 5, 7]
    assert naive == pytest.approx(3.0, abs=1e-6)  # the naive average of the rank means, which is wrong


def test_timed_steps_are_written_and_read_back(tmp_path):
    out = tmp_path / "steps.csv"
    from validation.mlp.__main__ import main

    code = main(["--ranks", "2", "--width", "32", "--batch", "8", "--layers", "2", "--iters", "2", "--warmup", "1",
                 "--cuts", "single,data_parallel,pipeline_1f1b", "--out", str(out), "--check"])
    assert code == 0
    rows = read_step_measurements(out)
    assert [(r.cut, r.world_size, r.num_microbatches) for r in rows] == [
        ("single", 1, 1), ("data_parallel", 2, 1), ("pipeline_1f1b", 2, 4)]
    assert all(r.time_s > 0 and r.num_samples == 2 and r.backend == "gloo" for r in rows)
    meta = read_csv_metadata(out)
    assert meta["torch_version"] == torch.__version__ and meta["command"].startswith("python -m validation.mlp")


def test_collectives_cli_writes_nccl_tests_sized_measurements(tmp_path):
    out, samples = tmp_path / "coll.csv", tmp_path / "samples.csv"
    code = collectives.main(["--ranks", "2", "--bytes", "1K,4K", "--iters", "2", "--warmup", "1",
                             "--out", str(out), "--samples", str(samples)])
    assert code == 0
    rows = read_measurements(out)
    sized = [op for op in collectives.BENCH_OPS if op != "barrier"]
    assert [(m.op, m.nbytes) for m in rows] == [(op, s) for op in sized[:6] for s in (1024, 4096)] + [
        ("send_recv", 1024), ("send_recv", 4096), ("barrier", 0)] + [(op, s) for op in sized[7:] for s in (1024, 4096)]
    for m in rows:
        assert m.num_ranks == 2 and m.time_s > 0 and m.num_nodes == 1
        assert m.algbw_Bps == pytest.approx(m.nbytes / m.time_s, rel=1e-12)
        assert m.busbw_Bps == pytest.approx(m.algbw_Bps * op_info(m.op).busbw_factor(2), rel=1e-12)
    assert next(m for m in rows if m.op == "all_reduce").busbw_Bps == pytest.approx(
        next(m for m in rows if m.op == "all_reduce").algbw_Bps)  # 2(n-1)/n = 1 at n = 2
    assert len(samples.read_text().splitlines()) == len(read_csv_metadata(samples)) + 1 + 2 * len(rows)
    assert read_csv_metadata(out)["backend"] == "gloo"


def test_sizes_round_to_whole_elements_and_rank_multiples():
    assert collectives.element_count("all_reduce", 1002, 3) == 250
    assert collectives.element_count("all_gather", 1000, 3) == 249  # 250 elements -> a multiple of 3
    assert collectives.element_count("reduce_scatter", 4, 4) == 4  # at least one element per rank


def _crash(rank, world):
    if rank == 1:
        raise ValueError("boom")
    import torch.distributed as dist

    dist.barrier()  # rank 0 waits for a peer that is gone


def _die(rank, world):
    if rank == 1:
        os._exit(3)
    time.sleep(30)


def _hang(rank, world):
    if rank == 1:
        time.sleep(60)


@pytest.mark.parametrize(("fn", "words"), [(_crash, "rank 1 failed: ValueError: boom"),
                                           (_die, "rank 1 died with exit code 3"),
                                           (_hang, "timed out after 2 s waiting for rank(s) 1")])
def test_a_failing_rank_is_one_line_and_every_process_ends(fn, words):
    start = time.monotonic()
    with pytest.raises(HarnessError) as info:
        launch(fn, world_size=2, timeout_s=2)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert time.monotonic() - start < 10
    assert multiprocessing.active_children() == []


def test_cli_failure_in_a_child_exits_non_zero_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "validation.mlp", "--ranks", "3", "--width", "64", "--batch", "8",
                           "--cuts", "tensor_parallel", "--check"], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith("error: rank ") and "divisible by --ranks (3)" in proc.stderr


def test_under_torchrun_the_process_joins_instead_of_spawning(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    assert launch(lambda rank, world: (rank, world, os.getpid()), world_size=1) == (0, 1, os.getpid())
    with pytest.raises(HarnessError, match="torchrun started 1 ranks but --ranks is 2"):
        launch(lambda rank, world: None, world_size=2)
