"""``python -m validation.moe`` on real gloo ranks (loopback, 2 and 4 ranks, tiny sizes): the expert-parallel layer
matches one process in outputs and gradients, the imbalance knob skews the splits as asked, and its all_to_all and
expert GEMM timings are read by ``simdist calibrate`` / ``simdist validate``. Also the calibrator's side: an
all_to_all row's ``imbalance`` column and how such a point is priced."""

from __future__ import annotations

import pytest

from simdist.calibrate.kernels import read_kernel_measurements
from simdist.calibrate.measurements import read_measurements
from simdist.calibrate.points import Point, predict_points
from simdist.errors import SpecError
from simdist.hardware.presets import load_topology

HEADER = "op,nbytes,num_ranks,time_s,imbalance\n"


def test_an_imbalanced_all_to_all_is_priced_slower_by_its_busiest_receiver():
    topology = load_topology("dgx-h100", num_nodes=1)
    size = 2.0**26  # 64 MiB per rank: NVLink-bound, latency a few per cent
    even, double, quad = predict_points(topology, [Point("all_to_all", 8, None, size, 1.0, None, "t", 1, x)
                                                   for x in (1.0, 2.0, 4.0)])
    # The busiest GPU receives x times the mean over its own NVLink ingress: its extra bytes add time linearly in
    # x, t(x) = t(1) + (x - 1) (t(2) - t(1)), and the fixed (latency) part keeps t(x) / t(1) under x.
    assert quad - even == pytest.approx(3.0 * (double - even), rel=1e-9)
    assert 1.5 < double / even < 2.0 and 3.0 < quad / even < 4.0


def test_imbalance_column_is_read_and_checked(tmp_path):
    good = tmp_path / "a2a.csv"
    good.write_text(HEADER + "all_to_all,4096,4,1e-4,1.75\nall_to_all,4096,4,1e-4,\n")
    assert [m.imbalance for m in read_measurements(good)] == [1.75, 1.0]
    for body, words in (("all_reduce,4096,4,1e-4,1.5\n", "only all_to_all has unequal splits"),
                        ("all_to_all,4096,4,1e-4,4.5\n", "outside 1..4"),
                        ("all_to_all,4096,4,1e-4,0.5\n", "outside 1..4")):
        bad = tmp_path / "bad.csv"
        bad.write_text(HEADER + body)
        with pytest.raises(SpecError, match=words) as info:
            read_measurements(bad)
        assert "bad.csv:2" in str(info.value) and "\n" not in str(info.value)


torch = pytest.importorskip("torch")

from validation.harness_cli import cli_guard  # noqa: E402
from validation.moe import harness  # noqa: E402
from validation.moe.__main__ import main as moe_main  # noqa: E402
from validation.moe.harness import MoERunConfig, run_moe  # noqa: E402
from validation.moe.layer import MoEConfig  # noqa: E402

TINY = MoEConfig(num_experts=8, topk=2, hidden=16, ffn_hidden=32, tokens_per_rank=24)


@pytest.mark.slow
def test_two_ranks_match_one_process_and_time_the_dispatch():
    config = MoERunConfig(layer=TINY, imbalance=1.0, time_tokens=(32,), warmup=0, iters=2)
    a2a, gemms, check, meta = run_moe(config, 2, timeout_s=60)
    assert meta["world_size"] == "2" and check.world_size == 2 and check.bias == 0.0
    assert check.router_grad_ref_max > 1e-3  # the router gets a real gradient through the gate weights
    assert check.worst < 1e-9, check
    (row,) = a2a
    assert (row.op, row.num_ranks, row.nbytes) == ("all_to_all", 2, 32 * 2 * 16 * 4)  # tokens x topk x h x fp32
    assert 1.0 <= row.imbalance <= 2.0 and row.time_s > 0
    assert {g.name.split()[0] for g in gemms} == {"expert_fc1", "expert_fc2", "expert_fc1_grouped",
                                                  "expert_fc2_grouped", "moe_permute"}
    single = [g for g in gemms if g.name.split()[0] == "expert_fc1"]
    assert sum(g.m for g in single) <= 2 * 32 * 2  # rows the experts received
    # per rank: the grouped GEMMs and the permutation cover the rows it received, every local expert's in one call
    h, f = TINY.hidden, TINY.ffn_hidden
    received = 0
    for rank in (0, 1):
        of = {g.name.split()[0]: g for g in gemms if g.name.endswith(f"rank {rank}")}
        rows = of["moe_permute"].hbm_bytes / (2 * h * 4)  # read + written, fp32
        assert of["moe_permute"].kernel == "memory" and rows == int(rows) > 0
        assert of["expert_fc1_grouped"].flops == 2.0 * rows * f * h == of["expert_fc2_grouped"].flops
        assert of["expert_fc1_grouped"].batch <= TINY.num_experts // 2 and of["expert_fc1_grouped"].kernel == "gemm"
        received += rows
    assert received == 2 * 32 * TINY.topk  # dropless: every routed copy lands on one rank


@pytest.mark.slow
def test_top_1_routing_checks_the_zero_router_gradient_absolutely():
    # top-1: the one gate weight is normalised to 1, so the router gets no gradient; a relative error of it was 0/0
    # (reported as inf, the check failed on a correct layer)
    config = MoERunConfig(layer=MoEConfig(num_experts=8, topk=1, hidden=16, ffn_hidden=32, tokens_per_rank=24),
                          imbalance=1.0, time_tokens=(32,), warmup=0, iters=1)
    _, _, check, _ = run_moe(config, 2, timeout_s=60)
    assert check.router_grad_ref_max == 0.0 and check.router_grad_rel_err < 1e-12
    assert check.worst < 1e-9, check


@pytest.mark.slow
def test_a_router_without_its_gradient_path_fails_the_check(monkeypatch):
    real = harness.moe_forward

    def gates_detached(x, router, *rest):  # the bug the router-gradient check exists for
        return real(x, router.detach() + 0.0 * router, *rest)

    monkeypatch.setattr(harness, "moe_forward", gates_detached)  # forked ranks inherit the patch
    _, _, check, _ = run_moe(MoERunConfig(layer=TINY, imbalance=1.0), 2, timeout_s=60)
    assert check.output_rel_err < 1e-9 and check.router_grad_rel_err > 0.1


@pytest.mark.slow
def test_four_skewed_ranks_check_and_their_timings_calibrate(tmp_path, cli, capsys):
    a2a, gemms = tmp_path / "a2a.csv", tmp_path / "gemms.csv"
    code = moe_main(["--ranks", "4", "--experts", "8", "--topk", "2", "--hidden", "16", "--ffn", "32", "--tokens",
                     "24", "--imbalance", "1.8", "--time-tokens", "16,32,64,128", "--warmup", "0", "--iters", "2",
                     "--out", str(a2a), "--kernels-out", str(gemms)])
    out = capsys.readouterr().out
    assert code == 0 and "ok" in out.splitlines()[-1], out
    rows = read_measurements(a2a)
    assert [m.nbytes for m in rows] == [t * 2 * 16 * 4 for t in (16, 32, 64, 128)]
    # The skew reaches the asked share, within the whole rows of the smallest size (16 tokens x 2 x 4 ranks).
    assert all(1.8 <= m.imbalance <= 1.8 + 4 / (16 * 2) for m in rows), [m.imbalance for m in rows]
    code, text, err = cli("calibrate", str(a2a), str(gemms), "--topology", "cpu-loopback", "--out",
                          str(tmp_path / "cal.yaml"), "--json")
    assert code == 0, err
    import json

    cal = json.loads(text)["calibration"]
    assert set(cal["collectives"]) == {"all_to_all"} and cal["compute"]["gemm_peak_efficiency"] > 0
    measured = read_kernel_measurements(gemms)
    per_kind = cal["fit"]["kernels"]["per_kind"]
    assert per_kind["gemm"]["points"] == sum(m.kernel == "gemm" for m in measured)
    assert per_kind["memory"]["points"] == sum(m.kernel == "memory" for m in measured) == 4 * 4  # a rank, a size
    code, text, err = cli("validate", str(a2a), str(gemms), "--calibration", str(tmp_path / "cal.yaml"), "--json")
    assert code == 0, err
    doc = json.loads(text)
    assert [r["imbalance"] for r in doc["rows"]] == pytest.approx([m.imbalance for m in rows][1::2])
    assert doc["kernel_rows"] and set(doc["kernel_mape_pct"]["per_kernel"]) == {"gemm", "memory"}


@pytest.mark.parametrize(("argv", "words"), [
    (["--experts", "6", "--ranks", "4"], "--experts 6 is not divisible by --ranks 4"),
    (["--ranks", "4", "--experts", "8", "--topk", "4", "--imbalance", "3"], "--imbalance must be a number from 1 "
                                                                            "to 2"),
    (["--imbalance", "nan"], "--imbalance"),
    (["--dtype", "bf16"], "gloo's CPU all_to_all is timed in fp32"),
    (["--time-tokens", "1,x"], "--time-tokens"),
    (["--tolerance", "0"], "--tolerance must be a finite number above 0"),
])
def test_argument_errors_exit_2_with_one_line_before_spawning(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli_guard(moe_main, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
    assert list(tmp_path.iterdir()) == []
