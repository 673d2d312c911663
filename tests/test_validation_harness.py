"""The torch validation harness on gloo (loopback, 2-4 ranks, tiny sizes): collectives CLI, the MLP's cuts
against the single-process reference, the lecture's unequal-batch example, and failures that never hang.

The fault tests kill and stop real processes (the harness CLI and its ranks) with signals; each waits for the
processes to end with a bound of a minute, a guard against a hang, not a timing assertion."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from simdist.calibrate.measurements import read_measurements  # noqa: E402
from simdist.calibrate.steps import read_csv_metadata, read_step_measurements  # noqa: E402
from simdist.collectives.ops import op_info  # noqa: E402
from validation import collectives  # noqa: E402
from validation.harness_cli import cli_guard  # noqa: E402
from validation.machine import cpu_model  # noqa: E402
from validation.mlp import ALL_CUTS, MLPConfig, StepConfig, run_steps, weighted_gradient_sum_  # noqa: E402
from validation.spawn import HarnessError, launch  # noqa: E402

pytestmark = pytest.mark.slow  # every test spawns torch.distributed ranks

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
    sized = [op for op in collectives.BENCH_OPS if op != "barrier"]  # the default: every op with a size
    assert [(m.op, m.nbytes) for m in rows] == [(op, s) for op in sized for s in (1024, 4096)]
    for m in rows:
        assert m.num_ranks == 2 and m.time_s > 0 and m.num_nodes == 1 and m.device
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
    import torch.distributed as dist

    # both ranks past init first: rank 0 leaving while rank 1 still connects its gloo mesh would fail rank 1's init
    # (a race this test once lost under load) instead of leaving it hanging in its function
    dist.barrier()
    if rank == 1:
        time.sleep(60)


@pytest.mark.parametrize(("fn", "words"), [(_crash, "rank 1 failed while running _crash: ValueError: boom"),
                                           (_die, "rank 1 exited with status 3 while running _die"),
                                           (_hang, "timed out after 2 s waiting for rank(s) 1 (rank 1 was running "
                                                   "_hang)")])
def test_a_failing_rank_is_one_line_and_every_process_ends(fn, words):
    with pytest.raises(HarnessError) as info:
        launch(fn, world_size=2, timeout_s=2)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert multiprocessing.active_children() == []


def _chatty(rank, world, fail):
    os.write(2, f"C++ log line of rank {rank}\n".encode())  # what gloo's logging does: fd 2, below Python
    if fail and rank == 1:
        raise ValueError("boom")
    return rank


def test_what_ranks_write_to_stderr_is_handed_over_after_a_run_and_kept_aside_on_failure(capfd):
    # the CI failure of 2026-12-07: a peer's "Gloo connectFullMesh failed" log line made a failure two lines
    assert launch(_chatty, world_size=2, args=(False,)) == 0
    err = capfd.readouterr().err
    assert err.splitlines() == ["[rank 0] C++ log line of rank 0", "[rank 1] C++ log line of rank 1"]
    with pytest.raises(HarnessError) as info:
        launch(_chatty, world_size=2, args=(True,))
    assert capfd.readouterr().err == ""
    message = str(info.value)
    assert message.startswith("rank 1 failed while running _chatty: ValueError: boom")
    logs = Path(message.rsplit("standard error is in ", 1)[1])
    assert (logs / "rank1.stderr").read_text() == "C++ log line of rank 1\n"
    import shutil

    shutil.rmtree(logs)


def test_spawned_ranks_meet_through_their_own_file_not_a_port_another_run_may_hold(monkeypatch):
    # CI of 4d56a38: gloo's connectFullMesh failed ("Connection closed by peer") with no rank at fault while
    # another pytest worker ran ranks too; a TCP rendezvous on a port picked free and bound later can be
    # drawn by two runs at once. Here no port can be bound from Python (the old launch picked its port so):
    # the run must not need one.
    import socket

    def taken(self, address):
        raise OSError(f"address {address} already in use (this test)")

    monkeypatch.setattr(socket.socket, "bind", taken)
    assert launch(lambda rank, world: world * 10 + rank, world_size=2) == 20


def test_cli_failure_in_a_child_exits_non_zero_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "validation.mlp", "--ranks", "3", "--width", "64", "--batch", "8",
                           "--cuts", "tensor_parallel", "--check"], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith("error: rank ") and "divisible by --ranks (3)" in proc.stderr


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for torchrun's env:// rendezvous."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_under_torchrun_the_process_joins_instead_of_spawning(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    assert launch(lambda rank, world: (rank, world, os.getpid()), world_size=1) == (0, 1, os.getpid())
    with pytest.raises(HarnessError, match="torchrun started 1 ranks but --ranks is 2"):
        launch(lambda rank, world: None, world_size=2)


# --------------------------------------------------------------------------- faults of real processes (issue 17)
BIG = 64 * 2**20  # the size the ranks are in the middle of when they are hit (200 x ~0.1 s on gloo)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _ended(pids: list[int], bound_s: float = 60.0) -> bool:
    """Whether every process in ``pids`` ended (gone or a zombie) within ``bound_s`` (a hang guard)."""
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        if all(_state(p) in ("gone", "Z") for p in pids):
            return True
        time.sleep(0.1)
    return False


def _ranks_of(pid: int) -> dict[int, int]:
    """rank -> pid of the harness process's ranks (they name themselves simdist-rank<R>, validation.spawn)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if int(stat[1]) == pid and comm.startswith("simdist-rank"):
                out[int(comm.removeprefix("simdist-rank"))] = int(entry.name)
    return out


def _measuring(tmp_path: Path) -> tuple[subprocess.Popen, dict[int, int], Path]:
    """The collectives CLI on 2 ranks, once it has finished 1 KiB and is inside its long 64 MiB all_reduce."""
    out = tmp_path / "m.csv"
    log, err = (tmp_path / "stdout.txt").open("w"), (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "validation.collectives", "--ranks", "2", "--ops", "all_reduce",
                             "--bytes", f"1K,{BIG}", "--warmup", "1", "--iters", "200", "--out", str(out)],
                            stdout=log, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO)
    end = time.monotonic() + 120  # a hang guard: a loaded 2-core machine takes seconds to import torch twice
    while "1024 B on 2 ranks" not in (tmp_path / "stdout.txt").read_text():
        assert proc.poll() is None and time.monotonic() < end, (tmp_path / "stderr.txt").read_text()
        time.sleep(0.1)
    ranks = _ranks_of(proc.pid)
    assert sorted(ranks) == [0, 1]
    return proc, ranks, out


def _kept(out: Path, reason: str) -> None:
    """The 1 KiB row finished before the fault is kept in m.partial.csv, saying why; m.csv is not written."""
    partial = out.with_name("m.partial.csv")
    assert not out.exists() and [(m.op, m.nbytes) for m in read_measurements(partial)] == [("all_reduce", 1024)]
    assert reason in read_csv_metadata(partial)["incomplete"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_harness_process_ends_its_ranks_even_a_stopped_one(tmp_path):
    proc, ranks, out = _measuring(tmp_path)
    os.kill(ranks[1], signal.SIGSTOP)  # a stopped rank would never see its parent go ...
    os.kill(proc.pid, signal.SIGKILL)  # ... without PR_SET_PDEATHSIG(SIGCONT) resuming it
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert _ended(list(ranks.values())), {r: _state(p) for r, p in ranks.items()}
    lines = (tmp_path / "stderr.txt").read_text().splitlines()
    for r in (0, 1):
        (line,) = [x for x in lines if x.startswith(f"error: rank {r}: ")]
        assert f"the harness process (pid {proc.pid}) died while this rank was " in line
        assert f"all_reduce of {BIG} B" in line  # allocating its buffers, or running it
    _kept(out, "the harness process died")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(("sig", "words"), [(signal.SIGSTOP, "rank 1 was stopped (SIGSTOP or SIGTSTP) for 3 s"),
                                            (signal.SIGKILL, "rank 1 was killed by SIGKILL")])
def test_a_stopped_or_killed_rank_ends_the_run_naming_it(tmp_path, sig, words):
    proc, ranks, out = _measuring(tmp_path)
    os.kill(ranks[1], sig)
    assert proc.wait(timeout=60) == 2
    assert _ended(list(ranks.values()))
    err = (tmp_path / "stderr.txt").read_text()
    assert err.count("\n") == 1 and err.startswith(f"error: {words} while ") and f"all_reduce of {BIG} B" in err, err
    assert "finished so far are in" in err
    _kept(out, words)


def test_the_default_output_calibrates_as_it_is(tmp_path, cli):
    # issue 17: python -m validation.collectives ... --out m.csv, then simdist calibrate m.csv --topology cpu-loopback
    out = tmp_path / "m.csv"
    assert collectives.main(["--ranks", "2", "--bytes", "1K:64K:x4", "--iters", "2", "--warmup", "1",
                             "--out", str(out)]) == 0
    code, _, err = cli("calibrate", str(out), "--topology", "cpu-loopback", "--out", str(tmp_path / "c.yaml"))
    assert code == 0, err
    from simdist.calibrate.calibration import load_calibration

    cal = load_calibration(tmp_path / "c.yaml")
    assert set(cal.spec.collectives) == set(collectives.DEFAULT_OPS) and cal.spec.gpu == cpu_model()
    assert "ran on" not in err  # a CPU measured for the cpu-core pseudo-GPU: no GPU mismatch


@pytest.mark.parametrize(("module", "argv", "words"), [
    ("mlp", ["--tolerance", "-1"], "--tolerance must be a finite number 0 or more"),
    ("mlp", ["--lr", "nan"], "--lr must be a finite number above 0"),
    ("mlp", ["--bucket-mb", "0"], "--bucket-mb must be a finite number above 0"),
    ("mlp", ["--timeout", "inf"], "--timeout must be a finite number above 0"),
    ("mlp", ["--microbatches", "-2"], "--microbatches and --seed must be >= 0"),
    ("mlp", ["--cuts", ","], "--cuts: unknown cut(s) (none)"),
    ("mlp", ["--width", "100000000"], "more than half of this host's"),
    ("mlp", ["--out", "."], "names a folder"),
    ("collectives", ["--bytes", "8:8G:xabc"], "--bytes"),
    ("collectives", ["--bytes", "8:8G:x"], "--bytes"),
    ("collectives", ["--timeout", "nan"], "--timeout must be a positive number of seconds"),
    ("collectives", ["--ranks", "0"], "--ranks must be at least 1"),
    ("collectives", ["--ranks", "1000"], "exceeds the 64 ranks"),
    ("collectives", ["--bytes", "64G", "--ranks", "8"], "more than half of this host's"),
    ("collectives", ["--ops", ","], "--ops: unknown op(s) (none)"),
    ("collectives", ["--out", "."], "names a folder"),
    ("loop", ["--out-dir", "o", "--ranks", "2", "--timeout", "nan"], "--timeout a positive number of seconds"),
    ("loop", ["--out-dir", "o", "--ranks", "2", "--bytes", "1K:1M:xq"], "--bytes"),
])
def test_argument_errors_exit_2_with_one_line(module, argv, words, capsys, tmp_path, monkeypatch):
    from validation import loop
    from validation.mlp import __main__ as mlp_main

    monkeypatch.chdir(tmp_path)
    main = {"mlp": mlp_main.main, "collectives": collectives.main, "loop": loop.main}[module]
    assert cli_guard(main, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, nothing spawned


def test_a_negative_tolerance_exits_2_from_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "validation.mlp", "--tolerance", "-1"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--tolerance" in proc.stderr
