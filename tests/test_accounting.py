"""The one bubble and breakdown definition (simdist.plan.accounting), pinned on a hand-checked timeline."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.plan.accounting import CATEGORIES, account, account_tables, category_of, interval_table, is_work
from simdist.report.step_metrics import metrics

# Two stages of a step that ends at 11 s. (start, end, category, pipeline work):
STAGE_0 = [(0.0, 1.0, "compute", True),     # F0
           (1.0, 1.5, "tp", True),          # F0's tensor-parallel all-reduce: pipeline work, busy
           (1.5, 2.5, "compute", True),     # F1
           (2.5, 3.0, "pp", False),         # a send: not work, does not fill the bubble
           (4.0, 6.0, "compute", True),     # B0
           (7.0, 9.0, "compute", True),     # B1 (the last pipeline work: the phase ends at 9)
           (9.0, 10.0, "dp", False),        # gradient reduction, after the phase
           (10.0, 11.0, "optimizer", False)]
STAGE_1 = [(1.0, 2.0, "compute", True), (2.0, 4.0, "compute", True), (4.0, 5.0, "compute", True),
           (5.0, 7.0, "compute", True),
           (7.0, 8.0, "dp", False),         # inside the phase but not pipeline work: bubble
           (8.0, 9.0, "optimizer", False)]  # the optimizer computes: busy inside the phase


def test_run_bubble_and_breakdown_on_a_hand_checked_two_stage_timeline():
    acct = account([STAGE_0, STAGE_1], 11.0)
    assert (acct.phase_start_s, acct.phase_end_s) == (0.0, 9.0)
    s0, s1 = acct.stages
    # stage 0 in [0, 9]: idle 2.5-3 (under the send), 3-4, 6-7 -> bubble 2.5; after 9: dp 1, optimizer 1
    assert s0["bubble"] == pytest.approx(2.5) and s0["compute"] == pytest.approx(6.0)
    assert s0["tp"] == pytest.approx(0.5) and s0["pp"] == 0.0
    assert s0["dp"] == pytest.approx(1.0) and s0["optimizer"] == pytest.approx(1.0) and s0["idle"] == 0.0
    # stage 1 in [0, 9]: 0-1 and the reduction 7-8 are bubble (2), optimizer 8-9; after 9 it waits: idle 2
    assert s1["bubble"] == pytest.approx(2.0) and s1["compute"] == pytest.approx(6.0)
    assert s1["dp"] == 0.0 and s1["optimizer"] == pytest.approx(1.0) and s1["idle"] == pytest.approx(2.0)
    for s in (s0, s1):  # the parts add up to the step
        assert sum(s.values()) == pytest.approx(11.0)
    # bubble fraction = bubble / (stages x phase) = (2.5 + 2) / (2 x 9)
    assert acct.bubble_fraction == pytest.approx(0.25)
    mean = acct.mean()
    m = metrics({"step_s": 11.0, "phase_s": acct.phase_s, "model_flops": 0.0, "hardware_flops": 0.0,
                 **{f"{k}_s": v for k, v in mean.items()}}, tokens_per_step=1.0, peak_flops=1.0)
    assert m["bubble_fraction"] == pytest.approx(0.25) and m["pipeline_phase_s"] == pytest.approx(9.0)
    assert m["breakdown"]["bubble_s"] == pytest.approx(m["bubble_fraction"] * m["pipeline_phase_s"])
    assert m["breakdown"]["idle_s"] == pytest.approx(1.0)


def test_what_is_pipeline_work():
    assert is_work("forward", None, 3) and is_work("weight_grad", None, 0) and is_work("recompute", None, 1)
    assert is_work("forward", "tp", 3) and is_work("backward", "cp", 0) and is_work("forward", "dp", 2)  # ZeRO-3
    assert not is_work("forward", "pp", 3)          # a send
    assert not is_work("backward", "dp", -1)        # a gradient bucket of the step, not of a micro-batch
    assert not is_work("optimizer", None, -1)
    assert category_of("optimizer", None) == "optimizer" and category_of("backward", "tp") == "tp"


_CATEGORY = st.sampled_from(CATEGORIES)
_INTERVAL = st.tuples(st.floats(0, 10, allow_nan=False), st.floats(0, 3, allow_nan=False), _CATEGORY, st.booleans()
                      ).map(lambda x: (x[0], x[0] + x[1], x[2], x[3]))  # zero-length ones included


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_INTERVAL, max_size=12), min_size=1, max_size=3))
def test_account_of_columns_is_account_of_intervals(stages):
    """`account_tables` of `interval_table` columns (what observables passes) is `account` of the same intervals,
    float for float; and each stage's parts add up to the step."""
    step_s = max((e for iv in stages for _, e, _, _ in iv), default=0.0) + 1.0
    tables = [interval_table(np.array([x[0] for x in iv], dtype=float), np.array([x[1] for x in iv], dtype=float),
                             np.array([CATEGORIES.index(x[2]) for x in iv], dtype=np.int64),
                             np.array([x[3] for x in iv], dtype=bool)) for iv in stages]
    by_columns, by_intervals = account_tables(tables, step_s), account(stages, step_s)
    assert by_columns == by_intervals
    for parts in by_intervals.stages:
        assert sum(parts.values()) == pytest.approx(step_s, rel=1e-12)


def test_a_stage_that_only_sends_inside_the_phase_is_bubble_there():
    """A send is not pipeline work: the stage whose only op inside the phase is one waits (bubble) all phase long."""
    acct = account([[(0.0, 4.0, "compute", True)], [(1.0, 2.0, "pp", False)], []], 5.0)
    assert acct.stages[1]["bubble"] == 4.0 and acct.stages[1]["pp"] == 0.0 and acct.stages[1]["idle"] == 1.0
    assert acct.stages[2]["bubble"] == 4.0 and acct.stages[2]["idle"] == 1.0
    assert acct.bubble_fraction == pytest.approx(8.0 / 12.0)
