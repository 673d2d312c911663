"""zb_v, dualpipe, dualpipev (simdist.plan.schedule_v): valid orders, DeepSeek-V3 Table 2 bubbles, memory, errors."""

from collections import Counter

import pytest

from simdist.engine.graph import run_graph
from simdist.errors import SpecError
from simdist.plan.activations import in_flight_microbatches
from simdist.plan.pipeline import UniformCosts, pipeline_graph
from simdist.plan.schedule import bubble_formula, check_schedule, model_part, part_location, schedule_order
from simdist.plan.schedule_v import microbatch_direction
from simdist.report.bubble import simulated_bubble

VPP = {"zb_v": 2, "dualpipe": 1, "dualpipev": 2}
CASES = [("zb_v", 1, 3), ("zb_v", 2, 4), ("zb_v", 4, 8), ("zb_v", 3, 2), ("dualpipe", 2, 4), ("dualpipe", 4, 8),
         ("dualpipe", 6, 14), ("dualpipev", 1, 2), ("dualpipev", 3, 6), ("dualpipev", 4, 9)]


def simulate(name, k, m, f=1.0, b=2.0):
    graph = pipeline_graph(name, num_stages=k, num_microbatches=m, vpp=VPP[name],
                           costs=UniformCosts.uniform(k, forward_s=f, backward_s=b))
    trace = run_graph(graph)
    return graph, trace, simulated_bubble(graph, trace)


def table2_idle(schedule, pp, f, b, w):
    """DeepSeek-V3 (arXiv:2412.19437) Table 2, per device; F, B (full backward), W of one chunk; F&B = F + B."""
    return {"1f1b": (pp - 1) * (f + b), "zb1p": (pp - 1) * (f + b - 2 * w),
            "dualpipe": (pp / 2 - 1) * ((f + b) + b - 3 * w)}[schedule]


def in_flight_peak(row):
    live = peak = 0
    for st in row:
        live += 1 if st.kind == "F" else -1 if st.kind == "W" else 0
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(("name", "k", "m"), CASES)
def test_every_step_once_and_f_before_b_before_w_on_each_stage(name, k, m):
    order = schedule_order(name, num_stages=k, num_microbatches=m, vpp=VPP[name])
    assert len(order) == k
    for s, row in enumerate(order):
        if name == "dualpipe":  # each micro-batch on its direction's copy only
            pairs = {(i, microbatch_direction(name, i, m)) for i in range(m)}
        else:
            pairs = {(i, c) for i in range(m) for c in (0, 1)}
        assert Counter((st.kind, st.microbatch, st.chunk) for st in row) == Counter(
            (kind, i, c) for kind in "FBW" for i, c in pairs)
        at = {(st.kind, st.microbatch, st.chunk): n for n, st in enumerate(row)}
        for i, c in pairs:
            assert at[("F", i, c)] < at[("B", i, c)] < at[("W", i, c)], (s, i, c)


@pytest.mark.parametrize(("name", "k", "m"), CASES)
def test_cross_stage_dependencies_hold_in_the_simulated_timeline(name, k, m):
    graph, trace, _ = simulate(name, k, m)
    span = {}
    for n, op in enumerate(graph.ops):
        kind = {"forward": "F", "backward": "B", "weight_grad": "W"}[op.kind]
        span[(op.stage, kind, op.microbatch, op.chunk)] = (trace.start_s[n], trace.end_s[n])
    parts = 2 * k if name != "dualpipe" else k
    for i in range(m):
        d = microbatch_direction(name, i, m)
        route = [part_location(p, k, name, d) for p in range(parts)]
        for p in range(1, parts):  # F of part p after F of p-1; B of p-1 after B of p
            assert span[(*route[p][:1], "F", i, route[p][1])][0] >= span[(route[p - 1][0], "F", i, route[p - 1][1])][1]
            assert span[(route[p - 1][0], "B", i, route[p - 1][1])][0] >= span[(route[p][0], "B", i, route[p][1])][1]
        assert span[(route[-1][0], "B", i, route[-1][1])][0] >= span[(route[-1][0], "F", i, route[-1][1])][1]


def test_v_and_bidirectional_placements():
    k = 4
    assert [model_part(s, c, k, "zb_v") for c in (0, 1) for s in range(k)] == [0, 1, 2, 3, 7, 6, 5, 4]
    assert model_part(0, 1, k, "dualpipev") == 2 * k - 1  # the last part (the loss) returns to stage 0
    assert [model_part(s, 1, k, "dualpipe") for s in range(k)] == [3, 2, 1, 0]
    assert part_location(5, k, "zb_v") == (2, 1) and part_location(0, k, "dualpipe", 1) == (3, 1)
    assert model_part(1, 1, k) == 5  # Megatron's interleaving unchanged


@pytest.mark.parametrize(("k", "m"), [(2, 4), (4, 8), (4, 10), (6, 12), (8, 16), (8, 20)])
def test_dualpipe_bubble_is_deepseek_table_2_with_f_b_w_equal(k, m):
    # F = B_input = W = 1 (stage forward 1, backward 2, W = B/2): a full backward B = 2, F&B = F + B = 3
    _, trace, simulated = simulate("dualpipe", k, m)
    idle = table2_idle("dualpipe", k, 1.0, 2.0, 1.0)
    assert idle == 2 * (k / 2 - 1)  # hand check: (K/2-1)(3 + 2 - 3)
    assert trace.makespan_s == pytest.approx(m * 3.0 + idle)
    assert simulated == pytest.approx(bubble_formula("dualpipe", num_stages=k, num_microbatches=m), abs=1e-12)
    assert simulated == pytest.approx(idle / (m * 3.0 + idle), abs=1e-12)


def test_dualpipe_hand_checked_k4_m8():
    # K=4, M=8, F = B_input = W = 1: work M(F+B) = 24 per stage, Table 2 idle (4/2-1)(3 + 2 - 3) = 2 -> 26
    _, trace, simulated = simulate("dualpipe", 4, 8)
    assert trace.makespan_s == pytest.approx(26.0)
    assert simulated == pytest.approx(2 / 26, abs=1e-12)


@pytest.mark.parametrize(("k", "m"), [(2, 4), (3, 6), (4, 8), (4, 12)])
def test_dualpipev_bubble_is_the_readme_formula_on_2k_stages(k, m):
    # README: DualPipeV on PP/2 devices has DualPipe's bubble with PP = 2K stages (a chunk is half a device's part)
    _, trace, simulated = simulate("dualpipev", k, m)
    chunk = 0.5  # F = B_input = W = 0.5 s per chunk
    idle = table2_idle("dualpipe", 2 * k, chunk, 2 * chunk, chunk)
    assert trace.makespan_s == pytest.approx(m * 3.0 + idle)
    assert simulated == pytest.approx(bubble_formula("dualpipev", num_stages=k, num_microbatches=m, vpp=2), abs=1e-12)
    # the same fraction as DualPipe on 2K stages with 2M micro-batches
    _, _, dual = simulate("dualpipe", 2 * k, 2 * m)
    assert simulated == pytest.approx(dual, abs=1e-12)


def test_table_2_baselines_1f1b_and_zb1p():
    # Table 2's 1F1B (PP-1)(F+B) and ZB1P (PP-1)(F+B-2W), against simdist's 1f1b and zb_h1 (ZB-H1 = ZB1P)
    k, m = 4, 8
    _, one, _ = simulate_classic("1f1b", k, m)
    assert one.makespan_s - m * 3.0 == pytest.approx(table2_idle("1f1b", k, 1.0, 2.0, 1.0))
    _, zb, _ = simulate_classic("zb_h1", k, m)
    assert zb.makespan_s - m * 3.0 == pytest.approx(table2_idle("zb1p", k, 1.0, 2.0, 1.0))
    assert table2_idle("dualpipe", k, 1.0, 2.0, 1.0) < table2_idle("zb1p", k, 1.0, 2.0, 1.0)


def simulate_classic(name, k, m):
    graph = pipeline_graph(name, num_stages=k, num_microbatches=m, costs=UniformCosts.uniform(k))
    trace = run_graph(graph)
    return graph, trace, simulated_bubble(graph, trace)


@pytest.mark.parametrize(("k", "m"), [(2, 4), (4, 8), (4, 16), (6, 24)])
def test_zb_v_is_near_zero_bubble_and_above_its_bound(k, m):
    # Qi et al.: with T_F = T_B = T_W ZB-V's bubble is near zero; the bound is the ramp to stage K-1
    _, trace, simulated = simulate("zb_v", k, m)
    bound = bubble_formula("zb_v", num_stages=k, num_microbatches=m, vpp=2)
    assert bound == pytest.approx((k - 1) * 0.5 / (m * 3.0 + (k - 1) * 0.5), abs=1e-12)
    assert simulated >= bound - 1e-12
    assert trace.makespan_s - m * 3.0 <= (k - 1) * 0.5 + 2.0  # within 4 chunk steps of the bound
    _, zb1p, _ = simulate_classic("zb_h1", k, m)
    assert trace.makespan_s < zb1p.makespan_s or k == 1


@pytest.mark.parametrize(("name", "k", "m", "chunks"), [
    ("zb_v", 4, 8, 8), ("zb_v", 4, 3, 6), ("dualpipe", 4, 8, 5), ("dualpipe", 8, 40, 9), ("dualpipev", 4, 8, 9),
    ("dualpipev", 3, 20, 7)])
def test_in_flight_chunks_match_the_papers_memory(name, k, m, chunks):
    # ZB-V: 1F1B's peak, 2K half-size chunks; DualPipe: PP+1 parts; DualPipeV: PP+1 = 2K+1 half-size chunks
    order = schedule_order(name, num_stages=k, num_microbatches=m, vpp=VPP[name])
    assert [in_flight_peak(row) for row in order] == [chunks] * k
    for s in range(k):  # whole-stage units (a stage's two chunks together)
        assert in_flight_microbatches(name, num_stages=k, num_microbatches=m, vpp=VPP[name],
                                      stage=s) == pytest.approx(chunks / 2)


@pytest.mark.parametrize(("name", "k", "m", "vpp", "field", "words"), [
    ("dualpipe", 3, 8, 1, "parallel.pp", "even pp"),
    ("dualpipe", 4, 9, 1, "training.global_batch_size", "even"),
    ("dualpipe", 4, 6, 1, "training.global_batch_size", "at least 2 x pp = 8"),
    ("dualpipe", 4, 8, 2, "parallel.vpp", "needs vpp 1"),
    ("zb_v", 4, 8, 1, "parallel.vpp", "needs vpp 2"),
    ("zb_v", 4, 8, 3, "parallel.vpp", "needs vpp 2"),
    ("dualpipev", 4, 8, 1, "parallel.vpp", "needs vpp 2"),
    ("dualpipev", 4, 7, 2, "training.global_batch_size", "at least 2 x pp = 8"),
])
def test_each_invalid_combination_names_its_field_and_fix(name, k, m, vpp, field, words):
    with pytest.raises(SpecError) as err:
        check_schedule(name, num_stages=k, num_microbatches=m, vpp=vpp)
    assert err.value.field == field and words in str(err.value) and err.value.fix


def test_zb_v_runs_any_micro_batch_count():
    check_schedule("zb_v", num_stages=4, num_microbatches=1, vpp=2)
    _, _, simulated = simulate("zb_v", 4, 1)
    assert 0 < simulated < 1


def test_bubble_api_and_sweep_keep_the_counts_dualpipe_runs():
    from simdist import api

    doc = api.bubble("dualpipe", num_stages=4, num_microbatches=8)
    assert doc["makespan_s"] == pytest.approx(26.0) and doc["bubble_fraction"] == pytest.approx(doc["formula"])
    rows = api.bubble_sweep("dualpipe", num_stages=4, microbatches=[4, 8, 9, 10])
    assert [r["microbatches"] for r in rows] == [8, 10]
    with pytest.raises(SpecError) as err:
        api.bubble_sweep("dualpipev", num_stages=4, microbatches=[1, 3], vpp=2)
    assert err.value.field == "--sweep-microbatches"
    with pytest.raises(SpecError) as err:
        api.bubble("zb_v", num_stages=4, num_microbatches=8)
    assert err.value.field == "--virtual"
