"""Issue 35, unbounded work: a kernel CSV past the fit's row limit and measurement files past the input size limit
are refused in one line before any fitting; `compare` resolves every cluster before searching any."""

from __future__ import annotations

import os

import pytest

from simdist.calibrate.kernel_fit import fit_kernels
from simdist.calibrate.kernels import KernelMeasurement
from simdist.errors import LimitError
from simdist.hardware.gpus import gpu_preset
from simdist.limits import INPUT_BYTES, KERNEL_ROWS
from tests.cli_harness import run_cli

HEADER = "kernel,name,dtype,flops,hbm_bytes,time_s,m,n,k\n"


def _kernel_rows(count: int) -> str:
    out = []
    for i in range(count):
        m = 64 * (1 + i % 64)
        if i % 4:
            out.append(f"gemm,sweep,bf16,{2.0 * m * 1024 * 1024},{2.0 * (2 * m * 1024 + 1024 * 1024)},"
                       f"{1e-5 + m * 1e-8},{m},1024,1024\n")
        else:
            out.append(f"memory,gelu,bf16,{8.0 * m},{4.0 * m * 1024},{4e-6 + m * 1e-9},,,\n")
    return HEADER + "".join(out)


@pytest.fixture
def no_fit(monkeypatch):
    """Fail the test if the kernel fit's grid search starts (the refusal must come before any fitting)."""
    import simdist.calibrate.kernel_fit as kernel_fit

    def refuse(*args, **kwargs):
        pytest.fail("the kernel fit ran")

    monkeypatch.setattr(kernel_fit, "_grid", refuse)


def test_a_kernel_csv_past_the_row_limit_is_refused_before_fitting(tmp_path, no_fit):
    path = tmp_path / "kernels.csv"
    path.write_text(_kernel_rows(int(KERNEL_ROWS.value) + 1))
    out = tmp_path / "cal.yaml"
    r = run_cli(["calibrate", str(path), "--topology", "dgx-h100", "--out", str(out)])
    assert r.one_line_error(), r.err
    assert f"{int(KERNEL_ROWS.value) + 1:,} kernels, above the limit of {KERNEL_ROWS.text()}" in r.err, r.err
    assert "kernels.csv" in r.err and not out.exists()


def test_validate_refuses_the_same_kernel_csv(tmp_path, no_fit):
    path = tmp_path / "kernels.csv"
    path.write_text(_kernel_rows(int(KERNEL_ROWS.value) + 1))
    cal = tmp_path / "cal.yaml"
    cal.write_text("topology: dgx-h100\n")
    r = run_cli(["validate", str(path), "--calibration", str(cal)])
    assert r.one_line_error() and f"above the limit of {KERNEL_ROWS.text()}" in r.err, r.err


def test_kernels_from_any_source_are_bounded_at_the_fit():
    # kernels from profiler traces reach the fit without a CSV: the fit checks their count itself
    row = KernelMeasurement("gemm", "sweep", "bf16", 2.0 * 64**3, 6.0 * 64**2, 1e-5, 1e-5, 1, "t", "trace.json",
                            64, 64, 64)
    with pytest.raises(LimitError, match=f"above the limit of {KERNEL_ROWS.text()}"):
        fit_kernels([row] * (int(KERNEL_ROWS.value) + 1), gpu_preset("h100-sxm"))


def test_a_kernel_csv_at_the_limit_still_reads(tmp_path):
    from simdist.calibrate.kernels import read_kernel_measurements

    path = tmp_path / "kernels.csv"
    path.write_text(_kernel_rows(int(KERNEL_ROWS.value)))
    assert len(read_kernel_measurements(path)) == KERNEL_ROWS.value


@pytest.mark.parametrize(("name", "argv"), [
    ("m.csv", ["calibrate", "{f}", "--topology", "dgx-h100"]),  # CSV or nccl-tests: told apart by content
    ("nccl.txt", ["calibrate", "{f}", "--topology", "dgx-h100"]),
    ("k.csv", ["validate", "{f}", "--calibration", "{cal}"]),
])
def test_a_measurement_file_past_the_size_limit_is_refused_unread(tmp_path, name, argv, monkeypatch):
    big = tmp_path / name
    with open(big, "wb") as fh:  # sparse: 1 GiB that takes no disk
        fh.truncate(2**30)
    cal = tmp_path / "cal.yaml"
    cal.write_text("topology: dgx-h100\n")
    reads: list[int] = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    r = run_cli([a.format(f=big, cal=cal) for a in argv])
    assert r.one_line_error() and f"larger than {INPUT_BYTES.text()}" in r.err, r.err
    assert sum(reads) <= 4 * (INPUT_BYTES.value + 2**20)  # never the whole gigabyte


def test_compare_resolves_every_cluster_before_searching_any(monkeypatch):
    import simdist.search.compare as search_compare

    def searched(*args, **kwargs):
        pytest.fail("a cluster was searched before every cluster was resolved")

    monkeypatch.setattr(search_compare, "compare_problems", searched)
    for argv in (["--clusters", "dgx-h100,no-such-cluster", "--gpus", "8"],
                 ["--cluster", "dgx-h100:8", "--cluster", "missing.yaml:8"]):
        r = run_cli(["compare", "--model", "llama3-8b", *argv, "--tokens", "1e9", "--global-batch", "8"])
        assert r.one_line_error() and ("no-such-cluster" in r.err or "missing.yaml" in r.err), r.err
