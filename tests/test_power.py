"""A power-capped GPU sustains a lower clock (simdist.hardware.clock): compute-bound kernels slow by the clock's
share, bandwidth-bound ones do not; checked against an H100 measured at 500 W."""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist.errors import SpecError
from simdist.hardware.clock import STATIC_POWER_SHARE, capped, clock_share
from simdist.hardware.compute import compute_efficiency, kernel_time_s
from simdist.hardware.gemm import architecture
from simdist.hardware.gpus import GPU_PRESETS
from simdist.plan.kernel_work import Kernel

H100 = GPU_PRESETS["h100-sxm"]
GEMM = Kernel("g", 2.0 * 8192**3, 3 * 8192**2 * 2.0, "gemm", (8192, 8192, 8192))


def test_the_clock_share_is_the_cube_root_of_the_dynamic_power_left():
    # 700 W rated, a quarter of it static: (500 - 175) / 525 of the dynamic power, cube-rooted
    share = clock_share(capped(H100, 500))
    assert share == pytest.approx(((500 - 0.25 * 700) / (0.75 * 700)) ** (1 / 3), rel=1e-12)
    assert STATIC_POWER_SHARE == 0.25
    assert clock_share(H100) == 1.0 and clock_share(capped(H100, 700)) == 1.0 and clock_share(capped(H100, 800)) == 1.0


def test_a_500_w_h100_runs_a_gemm_slower_by_the_mechanism_and_near_the_measurement():
    eff_launch = 2e-6
    full = kernel_time_s(H100, GEMM, "bf16") - eff_launch
    slow = kernel_time_s(capped(H100, 500), GEMM, "bf16") - eff_launch
    assert full / slow == pytest.approx(clock_share(capped(H100, 500)), rel=1e-12)
    # pytorch/FBGEMM PR #2546: a bf16 8192^3 GEMM at 585.2 TFLOP/s on an H100 capped at 500 W: within 5 %
    assert GEMM.flops / slow / 1e12 == pytest.approx(585.2, rel=0.05)


def test_bandwidth_bound_kernels_do_not_slow():
    copy = Kernel("copy", 1e9, 4e9, "memory")
    assert kernel_time_s(capped(H100, 500), copy, "bf16") == kernel_time_s(H100, copy, "bf16")


def test_a_capped_cluster_runs_a_slower_step(tmp_path: Path):
    base = "cluster: {{preset: dgx-h100, num_nodes: 1{cap}}}\nmodel: {{preset: llama3-8b}}\n" \
           "parallel: {{dp: 8, zero_stage: 1}}\ntraining: {{global_batch_size: 8}}\n"
    (tmp_path / "a.yaml").write_text(base.format(cap=""))
    (tmp_path / "b.yaml").write_text(base.format(cap=", gpu_power_limit_w: 500"))
    full = api.run(tmp_path / "a.yaml").result
    capped_run = api.run(tmp_path / "b.yaml").result
    assert capped_run["step_time_s"] > full["step_time_s"] * 1.08


def test_a_cap_below_the_static_power_is_refused():
    with pytest.raises(SpecError) as err:
        capped(H100, 150)
    assert err.value.field == "cluster.gpu_power_limit_w" and "above" in err.value.fix


def test_the_grand_teton_h100_is_an_h100_sxm_capped_with_hbm2e():
    # gpus/h100-sxm-hbm2e.yaml: the H100 SXM's compute under a 500 W cap, six HBM2e stacks at 2.4 TB/s
    meta = GPU_PRESETS["h100-sxm-hbm2e"]
    assert meta.power_limit_w == 500 and meta.tdp_w == 700 and meta.peak == H100.peak
    # a compute-bound GEMM at the cap's clock share of the 700 W H100's time (the same efficiency rows)
    launch = 2e-6
    assert (kernel_time_s(H100, GEMM, "bf16") - launch) / (kernel_time_s(meta, GEMM, "bf16") - launch) == \
        pytest.approx(clock_share(capped(H100, 500)), rel=1e-12)
    # a streaming kernel at 2.4 / 3.35 of the H100's bandwidth (the same share of it)
    copy = Kernel("copy", 1e6, 4e9, "memory")
    assert (kernel_time_s(H100, copy, "bf16") - launch) / (kernel_time_s(meta, copy, "bf16") - launch) == \
        pytest.approx(2.4 / 3.35, rel=1e-12)
    assert compute_efficiency(meta) == compute_efficiency(H100)
    assert architecture(meta) == architecture(H100)
