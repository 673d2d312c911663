"""Accuracy of the training-step model against published iteration times (validation/accuracy_training.py).

Requirement (the step-simulation issue): predicted iteration time within 15 % of published for every row of
Korthikanti et al. 2022 Table 5 and the PTD-P rows of Narayanan et al. 2021 Table 2.
"""

from __future__ import annotations

import csv
import functools

import pytest

from tests.conftest import REPO
from validation import accuracy_training as acc

DOC = REPO / "docs" / "accuracy-training.md"


@functools.cache
def results() -> dict[str, acc.Result]:
    return {r.row.label: r for r in (acc.predict(row) for row in acc.rows())}


@pytest.mark.slow  # the first row predicts all of them (functools.cache)
@pytest.mark.parametrize("label", [r.label for r in acc.rows()])
def test_iteration_time_within_bound(label: str) -> None:
    r = results()[label]
    assert abs(r.error) <= acc.tolerance(r.row), (
        f"{label}: predicted {r.predicted_s:.2f} s, published {r.row.measured_s:.2f} s ({r.error:+.1%})")
    if r.row.dataset not in (acc.BRIDGE_MOE, acc.FSDP_FAMILY):
        # The MoE recipes fit by fine-grained recompute (MLA up-projection, MoE activation) and paged stashes of the
        # routed tokens that simdist does not model: their memory is reported in the table, not asserted.
        assert r.fits, f"{label}: the published run fitted in its GPUs' memory, the model says it does not"
        # The FSDP-family rows: eager activation memory of the published models is an assumption (the doc says so).


def test_every_published_row_is_covered() -> None:
    rows = acc.rows()
    assert sum(r.dataset == "korthikanti2022_table5" for r in rows) == 9  # 4 models x 2 + the DP 8 run
    assert sum(r.dataset == "megatron2021_table2" for r in rows) == 6
    assert sum(r.dataset == "megatron2021_table2_zero3" for r in rows) == 6
    assert sum(r.dataset == acc.BRIDGE for r in rows) >= 5  # H100, B200 and GB200 FP8 runs of Llama 3 70B / 405B
    assert sum(r.dataset == acc.BRIDGE_MOE for r in rows) >= 4  # DeepSeek-V3, Qwen3 MoE, GPT-OSS
    assert sum(r.dataset == acc.FSDP_FAMILY for r in rows) == 44  # IBM 8, KempnerForge 25, OLMo-core 8, torchtitan 3
    assert {r.framework for r in rows} == {"megatron", "deepspeed", "fsdp", "torchtitan"}
    assert {r.generation for r in rows} == {"ampere", "hopper", "blackwell"}
    assert all((acc.SCENARIOS / r.scenario).is_file() for r in rows)


def test_fsdp_family_steps_follow_from_the_published_throughput() -> None:
    # Each published row names its step time or its tokens/s; the step derived from tokens/s/GPU must give back the
    # step time the KempnerForge reports print (within 0.5 %: their step is a median, their tokens/s a mean).
    with open(acc.REFERENCE / f"{acc.FSDP_FAMILY}.csv", newline="") as fh:
        published = {r["id"]: r for r in csv.DictReader(fh)}
    steps = {r.label.split()[0]: r.measured_s for r in acc.rows() if r.dataset == acc.FSDP_FAMILY}
    assert steps["C1"] == pytest.approx(3.13, abs=0.005)
    assert steps["C14"] == pytest.approx(15.32, abs=0.005)
    assert steps["A1"] == pytest.approx(256 * 4096 / (3700 * 128))
    # torchtitan's tps is per device: one 8192-token sequence per GPU per step
    assert steps["T0"] == pytest.approx(8192 / 2931)  # 2.795 s on A100
    assert steps["T1"] == pytest.approx(8192 / 6150)  # 1.332 s on H100, bf16
    assert steps["T2"] == pytest.approx(8192 / 7689.5)  # 1.065 s on H100, float8
    for key, step in steps.items():
        metric = published[key]["published_metric"]
        if "step " in metric:  # KempnerForge prints its step time
            assert step == pytest.approx(float(metric.split("step ")[1].split(" s")[0]), rel=0.005), key


def test_generation_pairs_by_hand() -> None:
    # Two rows of one run: A100 measured 2.0 s for 4096 tokens per GPU, predicted 1.8 s (-10 %); H100 measured 1.0 s for
    # 2048 tokens per GPU, predicted 0.8 s (-20 %). Throughput per GPU: A100 2048 tokens/s, H100 2048 tokens/s, so the
    # measured speedup is 1.00; predicted 2275.6 and 2560 tokens/s, 1.125 = (1 - 0.10) / (1 - 0.20).
    def result(label: str, measured: float, predicted: float, tokens: float) -> acc.Result:
        row = acc.Row(acc.FSDP_FAMILY, label, "x.yaml", (), measured, "src", "torchtitan", "hopper",
                      tokens_per_gpu=tokens)
        return acc.Result(row, predicted, 0.4, 0.0, 1.0, True)

    pairs = acc.GENERATION_PAIRS
    try:
        acc.GENERATION_PAIRS = (("X1", "X2"), ("X1", "X9"))  # the second pair's H100 row is missing: left out
        lines = acc._generation_pairs([result("X1 a100 run", 2.0, 1.8, 4096), result("X2 h100 run", 1.0, 0.8, 2048)])
    finally:
        acc.GENERATION_PAIRS = pairs
    body = [line for line in lines if line.startswith("| X")]
    assert body == ["| X1 / X2 | -10.0 | -20.0 | 1.00 | 1.12 | 1.12 |"]
    # every configured pair names two rows of the check set, an A100 one first
    ids = {r.label.split()[0]: r for r in acc.rows() if r.dataset == acc.FSDP_FAMILY}
    for a100, h100 in acc.GENERATION_PAIRS:
        assert ids[a100].generation == "ampere" and ids[h100].generation == "hopper", (a100, h100)


def test_narayanan_eq3_reproduces_table2_training_days() -> None:
    # Table 2 also gives days for 300B tokens; with F from eq. (3) per iteration of B x s tokens, the
    # published TFLOP/s must give those days back (checks the time derived from TFLOP/s, to 1 day rounding).
    with open(acc.REFERENCE / "megatron2021_table2_zero3_vs_ptdp.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            layers, hidden = (96, 12288) if float(r["params_billion"]) < 200 else (105, 20480)
            batch, seq = int(r["global_batch_size"]), int(r["seq_len"])
            t = acc._narayanan_flops(batch, seq, layers, hidden, 51200) / (
                int(r["num_gpus"]) * float(r["achieved_tflops_per_gpu"]) * 1e12)
            days = 300e9 / (batch * seq) * t / 86400
            assert days == pytest.approx(float(r["training_days_300B_tokens"]), abs=1.0)


@pytest.mark.slow
def test_report_is_up_to_date() -> None:
    expected = acc.report(list(results().values()))
    assert DOC.read_text() == expected, "regenerate: python -m validation.accuracy_training --out " + str(DOC)
