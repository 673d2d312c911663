"""`python -m validation.loop`: measure gloo collectives and MLP cuts here, fit cpu-loopback, predict held-out sizes.

Tolerances, for a noisy shared 2-core CI machine (2 gloo ranks plus whatever else runs there): the loop's
held-out sizes (every other size of 1K:1M:x2, 30 points) must be predicted by the calibration fitted on the
others with a *median* absolute error below 40 % and at most half the uncalibrated preset's median error (the
preset's 20 us / 2 GB/s priors describe an idle host; measured here: ~150-300 us latency, calibrated medians
of 10-25 %). Mean errors (MAPE) are not asserted tightly: single sizes hit scheduler stalls of ~4 ms (a CFS
time slice) in some runs, a 10-20x outlier no alpha-beta model predicts; the MAPE must only stay below 150 %.
The MLP gradient checks must pass at 1e-5 relative (fp32, other summation order: ~1e-7).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from simdist import api
from simdist.calibrate.calibration import load_calibration
from simdist.calibrate.measurements import read_measurements
from simdist.calibrate.steps import read_step_measurements
from simdist.errors import SpecError
from validation import loop

pytestmark = pytest.mark.slow  # torch.distributed runs on gloo in subprocesses

REPO = Path(__file__).resolve().parents[1]
FILES = {"collectives.csv", "steps.csv", "calibration.yaml", "validation.md", "validation.html"}


def _loop(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "validation.loop", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("loop")
    proc = _loop("--backend", "gloo", "--ranks", "2", "--quick", "--bytes", "1K:1M:x2", "--iters", "10",
                 "--out-dir", str(out))
    return proc, out


# serial: the held-out error bound holds with the CPU to itself (under -n auto one CI run measured 62 % against 40 %).
@pytest.mark.serial
def test_loop_measures_fits_and_predicts_held_out_sizes(run):
    proc, out = run
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in out.iterdir()} == FILES  # nothing else, no staging leftovers
    assert "held out: sizes" in proc.stdout and "MLP gradient checks: 5 of 5 passed" in proc.stdout
    rows = read_measurements(out / "collectives.csv")
    assert {r.op for r in rows} == set(loop.LOOP_OPS) and {r.num_ranks for r in rows} == {2}
    steps = read_step_measurements(out / "steps.csv")
    assert {s.cut for s in steps} == {"single", "data_parallel", "data_parallel_bucketed", "tensor_parallel",
                                      "pipeline_gpipe", "pipeline_1f1b"}
    cal = load_calibration(out / "calibration.yaml")
    assert cal.spec.topology == "cpu-loopback" and cal.spec.fit.holdout == "sizes"
    assert set(cal.spec.collectives) == set(loop.LOOP_OPS) and cal.spec.compute is not None
    doc = api.validate([out / "collectives.csv"], out / "calibration.yaml", holdout="sizes")
    errors = [abs(r["error_pct"]) for r in doc["rows"]]
    uncal = [abs(r["uncalibrated_error_pct"]) for r in doc["rows"]]
    assert len(errors) == 30
    assert statistics.median(errors) < 40.0, errors
    assert statistics.median(errors) <= 0.5 * statistics.median(uncal), (errors, uncal)
    assert doc["mape_pct"]["all"] < 150.0
    report = (out / "validation.md").read_text()
    assert "| **all** |" in report and "All checks passed." in report and "cpu_model" in report
    assert "plotly" in (out / "validation.html").read_text()[:5000].lower()


@pytest.mark.serial  # reads the measuring run above (a module fixture: measured once, in the serial pass)
def test_a_failed_fit_leaves_no_half_written_report(run, tmp_path, monkeypatch):
    _, out = run
    measured = loop.Measured(tuple(read_measurements(out / "collectives.csv")),
                             tuple(read_step_measurements(out / "steps.csv")), (), {"command": "test"})
    config = loop.LoopConfig(ranks=(2,))

    def boom(*args, **kwargs):
        raise SpecError("validation failed on purpose", field="MEASUREMENTS")

    monkeypatch.setattr(loop.api, "validate", boom)
    with pytest.raises(SpecError):
        loop.fit_and_report(measured, tmp_path, config)
    # The measurements are whole files; the calibration, report and chart are absent, and nothing is staged.
    assert {p.name for p in tmp_path.iterdir()} == {"collectives.csv", "steps.csv"}
    assert len(read_measurements(tmp_path / "collectives.csv")) == len(measured.collectives)


@pytest.mark.parametrize(("args", "words"), [
    (["--ranks", "1"], "at least 2"),
    (["--ranks", "2,x"], "comma list"),
    (["--ranks", "8"], "exceeds the 4 ranks"),
    (["--ranks", "2", "--topology", "dgx-z"], "dgx-z"),
    (["--ranks", "2", "--ops", "barrier"], "barrier"),
])
def test_bad_arguments_are_one_line_and_write_nothing(args, words, tmp_path):
    pytest.importorskip("torch")
    proc = _loop(*args, "--out-dir", str(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert words in proc.stderr
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- issue 5 item 7: bad input
FAILED_RUN = """# nThread 1 nGpus 8 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20
#  Rank  0 Group  0 Pid  40123 on    node01 device  0 [0x07] NVIDIA A100-SXM4-80GB
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
node01: Test NCCL failure common.cu:1005 'unhandled system error (run with NCCL_DEBUG=INFO for details) / '
 .. node01 pid 40123: Test failure common.cu:891
"""


@pytest.mark.parametrize(("name", "body", "words"), [
    ("empty.csv", "", "empty"),
    ("comments.csv", "# command: x\n# backend: gloo\n", "empty"),
    ("header.csv", "op,nbytes,num_ranks,time_s\n", "header but no rows"),
    ("malformed.csv", "op,nbytes,num_ranks,time_s\nall_reduce,1024,2\n", "fields"),
    ("all_reduce_perf.txt", FAILED_RUN, "the nccl-tests run failed"),
    # time in microseconds beside a bandwidth in bytes/s: 1e6 apart
    ("units.csv", "op,nbytes,num_ranks,time_s,algbw_Bps\nall_reduce,1048576,2,512.0,2048000000\n", "mixed units"),
    ("units_gb.csv", "op,nbytes,num_ranks,time_s,algbw_Bps\nall_reduce,1048576,2,5.12e-4,2.048\n", "mixed units"),
    ("size_unit.csv", "op,nbytes,num_ranks,time_s\nall_reduce,1MB,2,1e-4\n", "not a number"),
])
def test_bad_measurements_are_one_line_for_calibrate_and_validate(name, body, words, tmp_path, cli):
    path = tmp_path / name
    path.write_text(body)
    out = tmp_path / "cal.yaml"
    cal = tmp_path / "given.yaml"
    cal.write_text("topology: cpu-loopback\n")
    for argv in (["calibrate", str(path), "--topology", "cpu-loopback", "--out", str(out)],
                 ["validate", str(path), "--calibration", str(cal), "--html", str(tmp_path / "v.html")]):
        code, out_text, err = cli(*argv)
        assert code == 2 and out_text == "" and err.count("\n") == 1, err
        assert err.startswith("error: ") and words in err and str(path) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "given.yaml"])  # nothing written


def test_a_hanging_run_times_out_with_one_line_and_writes_nothing(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "c.csv"
    proc = subprocess.run([sys.executable, "-m", "validation.collectives", "--ranks", "2", "--bytes", "1M",
                           "--ops", "all_reduce", "--iters", "100000", "--timeout", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "timed out after 2 s" in proc.stderr and "every process was terminated" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module", ["validation.loop", "validation.collectives", "validation.mlp"])
def test_torch_missing_says_how_to_install_the_extra(module, tmp_path):
    # sys.modules["torch"] = None makes `import torch` raise ModuleNotFoundError(name="torch"), as without torch
    code = (f"import sys; sys.modules['torch'] = None; sys.argv = ['x', '--ranks', '2', '--out-dir', "
            f"{str(tmp_path / 'o')!r}] if {module!r} == 'validation.loop' else ['x', '--ranks', '2']; "
            f"import runpy; runpy.run_module({module!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "pip install -e '.[validation]'" in proc.stderr
    assert not (tmp_path / "o").exists()
