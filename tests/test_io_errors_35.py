"""Issue 35, I/O: every writer on a full disk, under ``ulimit -f`` and ``ulimit -n``, and with stdout on a full disk
ends in one ``error:`` line and exit 2, with no traceback, no half-written target and no temporary file left.

The full disk is simulated in-process (``os.fsync`` failing with ENOSPC: the last step before the rename) and by
``/dev/full`` as stdout; the limits are real ones, set in a subprocess (``resource.setrlimit``; SIGXFSZ ignored, so
that a write past RLIMIT_FSIZE fails with EFBIG as it does in Python)."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli_harness import REPO, run_cli

TINY = {"name": "tiny", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "model": {"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 512,
                  "vocab_size": 32000},
        "parallel": {"tp": 8}, "training": {"micro_batch_size": 1, "global_batch_size": 1}}
NCCL_LOG = str(REPO / "tests" / "data" / "all_reduce_perf_a100x8.txt")
NCCL_DUMP = str(REPO / "tests" / "data" / "machines" / "dgx-h100.nccl-topo.xml")
SEARCH = ["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8",
          "--schedules", "1f1b", "--max-cp", "1", "--max-micro-batch", "2", "--top", "0"]


def _writers(folder: Path) -> dict[str, tuple[list[str], str]]:
    """Each writer: (its command line, the file it writes), in ``folder``."""
    (folder / "s.yaml").write_text(yaml.safe_dump(TINY))
    return {
        "run --out": (["run", "s.yaml", "--fidelity", "closed_form", "--out", "out"], "out/report.json"),
        "calibrate --out": (["calibrate", NCCL_LOG, "--topology", "dgx-a100", "--out", "cal.yaml"], "cal.yaml"),
        "topo import --out": (["topo", "import", NCCL_DUMP, "--out", "node.yaml"], "node.yaml"),
        "search --out": ([*SEARCH, "--out", "r.jsonl"], "r.jsonl"),
        "bubble --html": (["bubble", "--schedule", "1f1b", "--stages", "4", "--sweep-microbatches", "1:8", "--html",
                           "b.html"], "b.html"),
    }


def _left(folder: Path, inputs: set[str]) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")} - inputs


@pytest.mark.parametrize("writer", ["run --out", "calibrate --out", "topo import --out", "search --out",
                                    "bubble --html"])
def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, writer):
    argv, target = _writers(tmp_path)[writer]

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    r = run_cli(argv, cwd=tmp_path)
    assert r.one_line_error() and "no space left on the device" in r.err, r.err
    assert "free space" in r.err
    left = _left(tmp_path, {"s.yaml"})
    if writer == "search --out":  # a log, appended as results arrive: its lines so far stay for --resume
        assert "the results written before are kept" in r.err and f"--resume {target}" in r.err, r.err
        assert left <= {target}
    else:
        assert not left, left  # no target, no temporary file, no folder created for it


def _limited(resource_id: int, value: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource_id, (value, value))

    return preexec


def _simdist(argv: list[str], cwd: Path, *, preexec=None, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "simdist", *argv], cwd=cwd, stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=300, preexec_fn=preexec, env=env)


def _one_line(proc: subprocess.CompletedProcess) -> bool:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return (proc.returncode == 2 and bool(lines) and lines[-1].startswith("error: ") and "Traceback" not in proc.stderr
            and sum(ln.startswith("error: ") for ln in lines) == 1)


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["run --out", "calibrate --out", "topo import --out", "search --out"])
def test_a_file_size_limit_is_one_line_and_leaves_no_temporary(tmp_path, writer):
    argv, target = _writers(tmp_path)[writer]
    proc = _simdist(argv, tmp_path, preexec=_limited(resource.RLIMIT_FSIZE, 600))
    assert _one_line(proc) and "ulimit -f" in proc.stderr, proc.stderr
    left = _left(tmp_path, {"s.yaml"})
    assert not [p for p in left if p.endswith(".tmp")], left
    assert left <= ({target} if writer == "search --out" else set()), left


@pytest.mark.slow
def test_too_few_file_descriptors_is_one_line(tmp_path):
    proc = _simdist([*SEARCH, "--workers", "2"], tmp_path, preexec=_limited(resource.RLIMIT_NOFILE, 12))
    assert _one_line(proc) and "too many open files" in proc.stderr and "ulimit -n" in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["run", "s.yaml", "--fidelity", "closed_form"],
                                  ["run", "s.yaml", "--fidelity", "closed_form", "--json"],
                                  SEARCH, ["topo", "show", "dgx-h100"]], ids=lambda a: " ".join(a[:2] + a[-1:]))
def test_stdout_on_a_full_disk_is_one_line(tmp_path, argv):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(TINY))
    with open("/dev/full", "w") as full:
        proc = _simdist(argv, tmp_path, stdout=full)
    assert _one_line(proc), proc.stderr
    assert "cannot write to standard output: no space left on the device" in proc.stderr, proc.stderr


def _harness(module: str, argv: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd, stderr=subprocess.PIPE, text=True,
                          timeout=300, env=env, **{"stdout": subprocess.PIPE, **kwargs})


@pytest.mark.slow
def test_a_report_harness_on_a_full_disk_or_a_device_is_one_line(tmp_path):
    with open("/dev/full", "w") as full:
        proc = _harness("validation.accuracy_collectives", [], tmp_path, stdout=full)
    assert _one_line(proc) and "cannot write to standard output" in proc.stderr, proc.stderr
    proc = _harness("validation.accuracy_collectives", ["--out", "/dev/full"], tmp_path)
    assert _one_line(proc) and "--out: cannot write /dev/full" in proc.stderr, proc.stderr
    proc = _harness("validation.accuracy_collectives", ["--out", "r.md"], tmp_path,
                    preexec_fn=_limited(resource.RLIMIT_FSIZE, 600))
    assert _one_line(proc) and "ulimit -f" in proc.stderr and not list(tmp_path.iterdir()), proc.stderr


@pytest.mark.parametrize("module", ["validation.accuracy_collectives", "validation.accuracy_training",
                                    "validation.bands", "validation.closed_form_agreement",
                                    "validation.overlap_profile"])
def test_report_harness_arguments_are_one_line(module, capsys):
    import importlib

    from validation.harness_cli import cli_guard

    main = importlib.import_module(module).main
    assert cli_guard(main, ["--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unrecognized arguments: --no-such-flag") and err.count("\n") == 1, err
    assert "usage:" not in err


@pytest.mark.slow
def test_a_measuring_harness_keeps_its_results_when_stdout_is_full(tmp_path):
    pytest.importorskip("torch")
    with open("/dev/full", "w") as full:
        proc = _harness("validation.kernels", ["--quick", "--gemm-sizes", "16:32:x2", "--attention", "",
                                               "--memory-sizes", "4K", "--out", "k.csv"], tmp_path, stdout=full)
    assert _one_line(proc) and "cannot write to standard output" in proc.stderr, proc.stderr
    assert "gemm" in (tmp_path / "k.csv").read_text()  # the kernels timed are written all the same
