"""Pipeline schedules as data: orders, closed-form bubbles, and the simulated timeline that checks them."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.engine.graph import run_graph
from simdist.errors import SpecError
from simdist.plan.opgraph import Op, OpGraph
from simdist.plan.pipeline import UniformCosts, UniformEmitter, build_pipeline, pipeline_graph
from simdist.plan.schedule import SCHEDULES, Step, bubble_formula, schedule_order
from simdist.report.bubble import simulated_bubble
from simdist.report.schedule_text import schedule_grid_text


def simulate(schedule, k, m, v=1, **costs):
    graph = pipeline_graph(schedule, num_stages=k, num_microbatches=m, vpp=v,
                           costs=UniformCosts.uniform(k, **costs))
    trace = run_graph(graph)
    return graph, trace, simulated_bubble(graph, trace)


def in_flight_peak(order, done_kind):
    """Most micro-batches (per chunk) whose F ran and whose ``done_kind`` step has not yet."""
    live, peak = 0, 0
    for step in order:
        live += 1 if step.kind == "F" else (-1 if step.kind == done_kind else 0)
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(("m", "bubble", "utilization"), [(4, 3 / 7, 0.571), (16, 3 / 19, 0.842)])
def test_1f1b_bubble_k4_matches_narayanan(m, bubble, utilization):
    _, trace, simulated = simulate("1f1b", 4, m)
    assert simulated == pytest.approx(bubble, abs=1e-12)
    assert bubble_formula("1f1b", num_stages=4, num_microbatches=m) == pytest.approx(bubble, abs=1e-12)
    assert round(1 - simulated, 3) == utilization
    assert trace.makespan_s == pytest.approx((m + 3) * 3.0)  # (M+K-1)(tf+tb)


def test_interleaving_divides_the_bubble_by_v():
    # Narayanan et al. 2021 sec. 2.2.2: K=4, M=8, V=2 -> (K-1)/(VM+K-1) = 3/19
    _, trace, simulated = simulate("interleaved_1f1b", 4, 8, 2)
    assert simulated == pytest.approx(3 / 19, abs=1e-12)
    assert trace.makespan_s == pytest.approx(8 * 3 + 3 * 3 / 2)  # M(tf+tb) + (K-1)(tf+tb)/V


def test_zb_h1_bubble_is_a_third_of_1f1b_when_f_b_w_are_equal():
    # Qi et al. 2023 sec. 3.1: T_F = T_B = T_W = 1 (tb = 2 tf, W = B/2): bubble (K-1) vs 1F1B's 3(K-1)
    _, trace, simulated = simulate("zb_h1", 4, 8)
    assert trace.makespan_s == pytest.approx(8 * 3 + 3)
    assert simulated == pytest.approx(3 / 27, abs=1e-12)
    _, base, _ = simulate("1f1b", 4, 8)
    assert base.makespan_s - 24 == pytest.approx(3 * (trace.makespan_s - 24))


@settings(max_examples=60, deadline=None)
@given(schedule=st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b"]), k=st.integers(1, 6),
       groups=st.integers(1, 4), extra=st.integers(0, 5), v=st.integers(1, 3),
       f=st.floats(0.1, 3.0), ratio=st.floats(0.2, 3.0))
def test_simulated_bubble_equals_formula(schedule, k, groups, extra, v, f, ratio):
    m = k * groups if schedule == "interleaved_1f1b" else groups + extra
    v = v if schedule == "interleaved_1f1b" else 1
    _, _, simulated = simulate(schedule, k, m, v, forward_s=f, backward_s=f * ratio)
    assert simulated == pytest.approx(bubble_formula(schedule, num_stages=k, num_microbatches=m, vpp=v,
                                                     forward_s=f, backward_s=f * ratio), abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 7), m=st.integers(1, 16), f=st.floats(0.1, 3.0))
def test_zb_h1_simulated_bubble_equals_formula(k, m, f):
    # W = B/2 = tf: T_F = T_B = T_W, the case Qi et al. draw (fig. 3)
    _, _, simulated = simulate("zb_h1", k, m, forward_s=f, backward_s=2 * f)
    formula = bubble_formula("zb_h1", num_stages=k, num_microbatches=m, forward_s=f, backward_s=2 * f)
    assert simulated == pytest.approx(formula, abs=1e-9)
    if m >= k:
        assert formula == pytest.approx((k - 1) / (3 * m + k - 1), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(schedule=st.sampled_from(SCHEDULES[:4]), k=st.integers(1, 8), m=st.integers(1, 20), v=st.integers(1, 4))
def test_every_step_appears_exactly_once_per_stage_and_chunk(schedule, k, m, v):
    if schedule != "interleaved_1f1b":
        v = 1
    else:
        m = k * (1 + m % 4)
    order = schedule_order(schedule, num_stages=k, num_microbatches=m, vpp=v)
    kinds = ("F", "B", "W") if schedule == "zb_h1" else ("F", "B")
    expected = Counter((kind, mb, c) for kind in kinds for mb in range(m) for c in range(v))
    assert len(order) == k
    for stage in order:
        assert Counter((s.kind, s.microbatch, s.chunk) for s in stage) == expected


@pytest.mark.parametrize(("k", "m"), [(4, 8), (8, 3), (5, 5), (1, 4)])
def test_1f1b_keeps_at_most_k_minus_s_forwards_in_flight(k, m):
    order = schedule_order("1f1b", num_stages=k, num_microbatches=m)
    for s, stage in enumerate(order):
        assert in_flight_peak(stage, "B") == min(k - s, m)
    gpipe = schedule_order("gpipe", num_stages=k, num_microbatches=m)
    assert all(in_flight_peak(stage, "B") == m for stage in gpipe)


@pytest.mark.parametrize(("k", "m"), [(4, 8), (6, 6), (3, 10)])
def test_zb_h1_peak_in_flight_is_1f1b_peak(k, m):
    # Same peak memory as 1F1B: micro-batches whose F ran and whose W has not stay <= K on every stage.
    order = schedule_order("zb_h1", num_stages=k, num_microbatches=m)
    assert max(in_flight_peak(stage, "W") for stage in order) == k
    assert in_flight_peak(order[0], "W") == k


def test_interleaved_warmup_and_chunk_order_follow_megatron():
    k, m, v = 4, 8, 2
    order = schedule_order("interleaved_1f1b", num_stages=k, num_microbatches=m, vpp=v)
    for s, stage in enumerate(order):
        warmup = next(i for i, step in enumerate(stage) if step.kind == "B") - 1  # one F precedes the first B
        assert warmup == (k - s - 1) * 2 + (v - 1) * k
    assert order[0][:8] == [Step("F", i % 4, i // 4) for i in range(8)]  # micro-batches in groups of K
    assert order[0][order[0].index(Step("B", 0, 1)) + 1:][:1] == [Step("F", 7, 0)]


def test_schedule_errors_name_field_and_fix():
    with pytest.raises(SpecError) as err:
        schedule_order("pipedream", num_stages=4, num_microbatches=8)
    assert err.value.field == "schedule" and all(name in str(err.value) for name in SCHEDULES)
    with pytest.raises(SpecError) as err:
        schedule_order("1f1b", num_stages=4, num_microbatches=8, vpp=2)
    assert err.value.field == "parallel.vpp"
    with pytest.raises(SpecError) as err:
        schedule_order("interleaved_1f1b", num_stages=4, num_microbatches=6, vpp=2)
    assert err.value.field == "training.global_batch_size" and "8 micro-batches" in str(err.value)
    with pytest.raises(SpecError) as err:
        schedule_order("1f1b", num_stages=0, num_microbatches=6)
    assert err.value.field == "parallel.pp"


def test_one_slow_stage_raises_the_bubble_above_the_formula():
    costs = UniformCosts((1.0, 1.0, 1.5, 1.0), (2.0, 2.0, 3.0, 2.0))
    graph = pipeline_graph("1f1b", num_stages=4, num_microbatches=16, costs=costs)
    trace = run_graph(graph)
    assert simulated_bubble(graph, trace) > bubble_formula("1f1b", num_stages=4, num_microbatches=16) + 0.05
    assert trace.makespan_s >= 16 * 4.5  # the slow stage is busy M(tf+tb) = 72 s


def test_p2p_time_adds_two_sends_per_stage_boundary_to_gpipe():
    # GPipe: the last forward and the last backward each cross K-1 boundaries -> + 2(K-1) p2p
    for k, m in [(2, 3), (4, 4), (4, 8)]:
        _, trace, _ = simulate("gpipe", k, m, p2p_s=0.25)
        assert trace.makespan_s == pytest.approx((m + k - 1) * 3 + 2 * (k - 1) * 0.25)


def test_build_pipeline_wires_cross_stage_deps_through_transfers():
    costs = UniformCosts.uniform(2, p2p_s=0.5)
    graph = OpGraph()
    order = schedule_order("1f1b", num_stages=2, num_microbatches=2)
    steps = build_pipeline(graph, order, UniformEmitter(costs), vpp=1)
    f0_s1 = steps[(1, "F", 0, 0)][0]
    (send,) = graph.ops[f0_s1].deps
    assert graph.ops[send].stream == "pp" and graph.ops[send].rank == 0
    assert graph.ops[send].deps == [steps[(0, "F", 0, 0)][1]]
    deps = graph.ops[steps[(0, "B", 0, 0)][0]].deps
    (grad_send,) = [d for d in deps if graph.ops[d].stream == "pp"]
    assert graph.ops[grad_send].rank == 1 and graph.ops[grad_send].deps == [steps[(1, "B", 0, 0)][1]]
    assert steps[(0, "F", 0, 0)][1] in deps  # B needs its own F
    assert run_graph(graph).makespan_s == pytest.approx((2 + 1) * 3 + 2 * 0.5)


def test_build_pipeline_with_a_custom_emitter_and_no_transfer_ops():
    class TwoOps:
        def compute(self, graph, stage, step):
            a = graph.add(Op(f"{step.kind}{step.microbatch}a", stage, "compute", "forward", 1.0))
            b = graph.add(Op(f"{step.kind}{step.microbatch}b", stage, "tp", "comm", 0.5, deps=[a]))
            return a, b

        def transfer(self, graph, src, dst, step):
            return None

    graph = OpGraph()
    steps = build_pipeline(graph, schedule_order("gpipe", num_stages=2, num_microbatches=1), TwoOps())
    first, _ = steps[(1, "F", 0, 0)]
    assert graph.ops[first].deps == [steps[(0, "F", 0, 0)][1]]  # direct: the previous chain's last op
    # F chain 1.5 on each stage, then B chains: 4 x 1.5 on the critical path
    assert run_graph(graph).makespan_s == pytest.approx(6.0)


def test_grid_of_1f1b_is_the_textbook_picture():
    graph, trace, _ = simulate("1f1b", 4, 8)
    lines = schedule_grid_text(graph, trace).splitlines()
    assert lines[1].split()[2:12] == ["F0", "F1", "F2", "F3", ".", ".", ".", ".", ".", "."]
    assert lines[4].split()[2:11] == [".", ".", ".", "F0", "B0", "B0", "F1", "B1", "B1"]
    assert all(len(line.split()) - 2 == 33 for line in lines[1:])  # 33 slots of 1 s
    graph, trace, _ = simulate("interleaved_1f1b", 2, 2, 2)
    assert "F0.1" in schedule_grid_text(graph, trace)


def test_zb_h1_formula_is_a_lower_bound_and_the_simulation_is_right_when_the_input_gradient_outlasts_forward():
    # Issue 13: the formula (Qi et al. 2023 sec. 3.1) departs from the simulation when backward > 2x forward.
    # Hand case K=2, M=2, F=1, B=4 split into B (input gradient) = W (weight gradient) = 2:
    #   stage 1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7] W0 [7,9] W1 [9,11]
    #   stage 0: F0 [0,1] F1 [1,2] (idle) B0 [4,6] W0 [6,8] B1 [8,10] W1 [10,12]   -> makespan 12
    # Stage 0 cannot do better with any order: B1 cannot start before stage 1's B1 ends (7), and before it
    # only [6,7] is free, shorter than W0 (2): either W0 goes first (B1 at 8: 12) or after B1 (7+2+2+2 = 13).
    # The formula charges (K-1)(F+Bi-W) = 1 of bubble per stage, i.e. makespan 10 + 1 = 11, which assumes the
    # deferred W's exactly fill the cool-down gaps: true when T_W = T_B <= T_F (the paper draws
    # T_F = T_B = T_W), not here. So the simulation (1/6) is right and the formula (1/11) is a lower bound.
    _, trace, simulated = simulate("zb_h1", 2, 2, forward_s=1.0, backward_s=4.0)
    assert trace.makespan_s == pytest.approx(12.0, abs=1e-12)
    assert simulated == pytest.approx(1 - (2 * 2 * 5) / (2 * 12), abs=1e-12)  # idle 4 of 2 ranks x 12
    formula = bubble_formula("zb_h1", num_stages=2, num_microbatches=2, forward_s=1.0, backward_s=4.0)
    assert formula == pytest.approx(1 - 10 / 11, abs=1e-12)
    assert formula < simulated


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 6), m=st.integers(1, 12), f=st.floats(0.1, 3.0), ratio=st.floats(0.2, 6.0))
def test_zb_h1_formula_never_exceeds_the_simulated_bubble(k, m, f, ratio):
    _, _, simulated = simulate("zb_h1", k, m, forward_s=f, backward_s=f * ratio)
    formula = bubble_formula("zb_h1", num_stages=k, num_microbatches=m, forward_s=f, backward_s=f * ratio)
    assert formula <= simulated + 1e-9


def test_bubble_definition_on_a_hand_checked_two_stage_timeline():
    # README "Bubble": compute-idle time inside the pipeline phase / (ranks x phase length). 1F1B, K=2, M=2,
    # F=1, B=2, free p2p:
    #   stage 0: F0 [0,1] F1 [1,2] (idle 2-4) B0 [4,6] (idle 6-7) B1 [7,9]
    #   stage 1: (idle 0-1) F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7] (idle 7-9)
    # phase [0,9]; idle 2 + 1 on stage 0, 1 + 2 on stage 1 = 6 of 2 x 9 = 1/3 = (K-1)/(M+K-1).
    graph, trace, simulated = simulate("1f1b", 2, 2, forward_s=1.0, backward_s=2.0)
    starts = {(op.rank, op.name): (trace.start_s[i], trace.end_s[i]) for i, op in enumerate(graph.ops)
              if op.stream == "compute"}
    assert sorted(starts.values()) == sorted([(0, 1), (1, 2), (4, 6), (7, 9), (1, 2), (2, 4), (4, 5), (5, 7)])
    assert trace.makespan_s == pytest.approx(9.0)
    assert simulated == pytest.approx(6 / 18, abs=1e-12)
