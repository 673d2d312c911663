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
    if r.row.dataset != acc.BRIDGE_MOE:
        # The MoE recipes fit by fine-grained recompute (MLA up-projection, MoE activation) and paged stashes of the
        # routed tokens that simdist does not model: their memory is reported in the table, not asserted.
        assert r.fits, f"{label}: the published run fitted in its GPUs' memory, the model says it does not"


def test_every_published_row_is_covered() -> None:
    rows = acc.rows()
    assert sum(r.dataset == "korthikanti2022_table5" for r in rows) == 9  # 4 models x 2 + the DP 8 run
    assert sum(r.dataset == "megatron2021_table2" for r in rows) == 6
    assert sum(r.dataset == "megatron2021_table2_zero3" for r in rows) == 6
    assert sum(r.dataset == acc.BRIDGE for r in rows) >= 5  # H100, B200 and GB200 FP8 runs of Llama 3 70B / 405B
    assert sum(r.dataset == acc.BRIDGE_MOE for r in rows) >= 4  # DeepSeek-V3, Qwen3 MoE, GPT-OSS
    assert all((acc.SCENARIOS / r.scenario).is_file() for r in rows)


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
