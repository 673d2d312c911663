"""The validation harnesses under Ctrl-C, bad arguments and a closed stdout (issue 35): one line, status 130 / 2 / 0,
and the results finished so far kept in ``OUT.partial.csv``."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]


def test_ctrl_c_keeps_the_kernels_finished_so_far(tmp_path):
    out = tmp_path / "k.csv"
    proc = subprocess.Popen([sys.executable, "-m", "validation.kernels", "--gemm-sizes", "64:8192:x2",
                             "--memory-sizes", "", "--attention", "", "--max-flops", "1e13", "--out", str(out)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # a kernel has been timed and reported
    assert first.startswith("gemm"), first
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted (Ctrl-C)" in err and "Traceback" not in err, err
    partial = tmp_path / "k.partial.csv"
    assert partial.exists() and not out.exists()
    assert "# incomplete: interrupted" in partial.read_text()


@pytest.mark.parametrize("module", ["validation.kernels", "validation.collectives", "validation.mlp",
                                    "validation.moe"])
def test_bad_arguments_are_one_line(module):
    r = subprocess.run([sys.executable, "-m", module, "--no-such-flag"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: unrecognized arguments: --no-such-flag"), r.stderr
    assert "usage:" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
