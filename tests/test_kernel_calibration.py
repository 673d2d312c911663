"""Compute calibration from measured kernels (issue 14 item 8): the kernel CSV, the fit (constants recovered exactly
from times the roofline generated, each from the kernels that identify it), a scenario's layer shapes, and
``python -m validation.kernels --device cpu --quick`` on this machine feeding ``simdist calibrate`` / ``validate``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from simdist.calibrate.kernel_fit import KNEE_GRID, efficiency_of, fit_kernels, predict_kernels, split_kernel_holdout
from simdist.calibrate.kernels import (
    KernelMeasurement,
    kernel_of,
    read_kernel_measurements,
    write_kernel_measurements_csv,
)
from simdist.errors import SpecError
from simdist.hardware.compute import compute_efficiency, kernel_time_s
from simdist.hardware.gpus import gpu_preset
from simdist.plan.kernel_work import elementwise
from simdist.spec.calibration import ComputeCalibration


def _gemm(m: int, n: int, k: int, dtype: str = "bf16") -> KernelMeasurement:
    return KernelMeasurement("gemm", "sweep", dtype, 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), 1.0, 1.0, 1,
                             "test", "t", m, n, k)


def _memory(elements: int) -> KernelMeasurement:
    return KernelMeasurement("memory", "gelu", "bf16", 8.0 * elements, 4.0 * elements, 1.0, 1.0, 1, "test", "t")


def _timed(rows: list[KernelMeasurement], gpu, eff) -> list[KernelMeasurement]:
    """The rows with the times simdist's roofline gives them under ``eff`` (a measurement without noise)."""
    return [replace(r, time_s=float(t), time_mean_s=float(t)) for r, t in zip(rows, predict_kernels(rows, gpu, eff),
                                                                               strict=True)]


SWEEP = [_gemm(m, nk, nk) for m in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096) for nk in (512, 4096)]
MEMORY = [_memory(e) for e in (2**16, 2**18, 2**20, 2**22, 2**24, 2**26)]


@pytest.mark.parametrize("gpu_name", ["h100-sxm", "cpu-core"])
def test_the_fit_recovers_the_constants_the_times_were_made_with(gpu_name):
    gpu = gpu_preset(gpu_name)
    # (a fitted memory_efficiency is applied to every memory kernel as measured: memory_kernel_share 1)
    truth = replace(compute_efficiency(gpu), gemm_peak_efficiency=0.63, gemm_knee_dim=KNEE_GRID[22],
                    memory_efficiency=0.55, launch_overhead_s=7e-6, memory_kernel_share=1.0)
    cal, info = fit_kernels(_timed(SWEEP + MEMORY, gpu, truth), gpu, holdout="sizes")
    assert cal.gemm_peak_efficiency == 0.63 and cal.gemm_knee_dim == pytest.approx(KNEE_GRID[22], rel=1e-12)
    assert cal.memory_efficiency == pytest.approx(0.55, rel=1e-6)
    assert float(cal.launch_overhead) == pytest.approx(7e-6, rel=1e-6)
    assert info.heldout_points == 9 + 3 and all(k.mape_pct < 1e-4 for k in info.heldout_per_kind.values())
    assert info.heldout_per_kind["gemm"].mape_uncalibrated_pct > 10  # the defaults were not the truth: teeth
    assert info.notes == []


def test_what_the_kernels_cannot_identify_is_kept_and_said():
    gpu = gpu_preset("h100-sxm")
    default = compute_efficiency(gpu)
    truth = replace(default, gemm_peak_efficiency=0.5)
    one_dim = [_gemm(1024, n, 1024) for n in (1024, 2048, 4096, 8192)]  # smallest dimension always 1024
    cal, info = fit_kernels(_timed(one_dim, gpu, truth), gpu)
    assert cal.gemm_knee_dim is None and cal.memory_efficiency is None and info.gemm_knee_dim_ci is None
    assert cal.gemm_peak_efficiency == pytest.approx(0.5, abs=0.011)
    assert any("not identified" in n for n in info.notes) and any("no memory kernels" in n for n in info.notes)
    assert efficiency_of(gpu, cal).gemm_knee_dim == default.gemm_knee_dim  # applied: the default knee stays


def test_a_calibrated_memory_efficiency_prices_every_memory_kernel_at_it():
    # B200's normalisation kernels run at its norm_kernel_share (0.51) of the stated rate; a calibrated
    # memory_efficiency is the rate the machine's own memory kernels reached: norms and the rest alike at share 1
    gpu = gpu_preset("b200")
    assert compute_efficiency(gpu).norm_share == 0.51
    applied = efficiency_of(gpu, ComputeCalibration(gemm_peak_efficiency=0.6, memory_efficiency=0.7))
    assert (applied.memory_kernel_share, applied.norm_share) == (1.0, 1.0)
    norm = kernel_time_s(gpu, elementwise("rmsnorm", 1e8, 1.0, 0.0, norm=True), "bf16", applied)
    assert norm == pytest.approx(1e8 / (gpu.hbm_bandwidth * 0.7) + applied.launch_overhead_s, rel=1e-12)


def test_memory_faster_than_nominal_is_bounded_and_said():
    gpu = gpu_preset("cpu-core")
    fast = replace(compute_efficiency(gpu), memory_efficiency=1.0)
    rows = [replace(r, time_s=r.time_s / 2) for r in _timed(SWEEP[:6] + MEMORY, gpu, fast)]  # 2x the nominal GB/s
    cal, info = fit_kernels(rows, gpu)
    assert cal.memory_efficiency == 1.0 and any("nominal" in n for n in info.notes)


def test_holdout_keeps_kinds_apart_and_no_gemm_is_one_error():
    _, test = split_kernel_holdout(SWEEP + MEMORY, "sizes")
    assert sorted(r.kernel for r in test) == ["gemm"] * 9 + ["memory"] * 3
    assert split_kernel_holdout(SWEEP, "ranks") == (SWEEP, [])
    with pytest.raises(SpecError, match="no GEMM kernels to fit"):
        fit_kernels(MEMORY, gpu_preset("cpu-core"))


def test_a_fused_attention_row_is_priced_from_the_attention_curves():
    gpu = gpu_preset("h100-sxm")
    row = KernelMeasurement("attention", "sdpa", "bf16", 4.0 * 16 * 4096**2 * 128 * 0.5, 1e8, 1.0, 1.0, 1, "t", "t",
                            4096, 4096, 128, 16, 4096, 128, True, "forward", "flash2")
    kernel = kernel_of(row)
    assert kernel.attention is not None and kernel.attention.parts == ((1.0, True, 4096.0),)
    as_gemm = kernel_of(replace(row, attention_kernel="cpu"))
    assert as_gemm.attention is None and as_gemm.gemm_mnk == (4096, 4096, 128)
    assert kernel_time_s(gpu, kernel, "bf16") != kernel_time_s(gpu, as_gemm, "bf16")


def test_kernel_csv_round_trips_and_bad_rows_are_one_line(tmp_path):
    path = tmp_path / "k.csv"
    rows = [SWEEP[0], MEMORY[0], replace(SWEEP[1], kernel="attention", causal=True, direction="backward",
                                         attention_kernel="flash2", seq_len=512, head_dim=64)]
    write_kernel_measurements_csv(rows, path, metadata={"gpu": "test"})
    assert read_kernel_measurements(path) == rows
    for body, words in (("conv,x,fp32,1,1,1e-3\n", "unknown kernel kind 'conv'"),
                        ("gemm,x,fp32,100,1,1e-3\n", "a gemm row without m"),
                        ("memory,x,,1,1,1e-3\n", "dtype is blank"),
                        ("memory,x,fp32,1,1,0\n", "time_s")):
        bad = tmp_path / "bad.csv"
        bad.write_text("kernel,name,dtype,flops,hbm_bytes,time_s\n" + body)
        with pytest.raises(SpecError, match=words) as info:
            read_kernel_measurements(bad)
        assert "bad.csv:2" in str(info.value) and "\n" not in str(info.value)


TINY_SCENARIO = """\
cluster: {preset: cpu-loopback}
model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 32, vocab_size: 128}
parallel: {tp: 2, pp: 1, dp: 2}
training: {micro_batch_size: 2, global_batch_size: 8, precision: fp32, attention: flash}
"""


def test_a_scenarios_layer_gives_its_own_gemm_and_attention_shapes(tmp_path):
    from validation.kernels.shapes import scenario_cases

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_SCENARIO)
    cases, what = scenario_cases(path)
    gemms = {c.name: (c.m, c.n, c.k, c.batch) for c in cases if c.kind == "gemm"}
    tokens, h, shard = 2 * 32, 64, 64 // 2  # micro-batch x sequence; tp 2 splits heads and the MLP
    assert gemms["qkv"] == (tokens, 3 * shard, h, 1)  # column-parallel QKV: 3 h / tp outputs
    assert gemms["projection"] == (tokens, h, shard, 1)  # row-parallel projection
    assert gemms["mlp_up"] == (tokens, 4 * h // 2, h, 1) and gemms["mlp_down"] == (tokens, h, 4 * h // 2, 1)
    attention = [c for c in cases if c.kind == "attention"]
    assert [(c.direction, c.batch, c.heads, c.seq, c.head_dim, c.causal) for c in attention] == [
        ("forward", 2, 2, 32, 16, True), ("backward", 2, 2, 32, 16, True)]
    assert "layer(s) 0 of 2, hidden 64, tp 2" in what


torch = pytest.importorskip("torch")


@pytest.mark.slow
def test_kernels_on_this_cpu_calibrate_and_validate(tmp_path, cli, capsys):
    from validation.kernels.__main__ import main

    out = tmp_path / "kernels.csv"
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO)
    assert main(["--device", "cpu", "--quick", "--scenario", str(scenario), "--out", str(out)]) == 0
    capsys.readouterr()
    rows = read_kernel_measurements(out)
    kinds = {r.kernel for r in rows}
    assert kinds == {"gemm", "attention", "memory"} and all(r.time_s > 0 and r.device for r in rows)
    assert {r.name for r in rows} >= {"qkv", "mlp_up", "sweep_square", "sweep_skinny", "sdpa", "layer_norm"}
    assert {r.attention_kernel for r in rows if r.kernel == "attention"} == {"cpu"}
    code, text, err = cli("calibrate", str(out), "--topology", "cpu-loopback", "--holdout", "sizes", "--json",
                          "--out", str(tmp_path / "cal.yaml"))
    assert code == 0, err
    cal = json.loads(text)["calibration"]
    ComputeCalibration.model_validate(cal["compute"])  # a compute section simdist run applies
    assert set(cal["fit"]["kernels"]["heldout_per_kind"]) == kinds
    code, text, err = cli("validate", str(out), "--calibration", str(tmp_path / "cal.yaml"), "--json")
    assert code == 0, err
    doc = json.loads(text)
    assert doc["rows"] == [] and set(doc["kernel_mape_pct"]["per_kernel"]) == kinds
    assert len(doc["kernel_rows"]) == cal["fit"]["kernels"]["heldout_points"]
