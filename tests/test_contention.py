"""The no-contention shortcut (simdist.engine.contention): when it says an op graph's collectives never meet on a
shared link, the engine's timeline is the uncontended one; when they do, it says so.

Hand-checked stories on one shared link, then a property on random two-rank graphs (hypothesis), then a real step
where the shortcut answers for the engine (the closed form's numbers) and one where it must not.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist import api
from simdist.engine.contention import REL, alone_durations, contention_free, departs, engine_alone, first_divergence
from simdist.engine.graph import run_graph
from simdist.engine.uncontended import uncontended
from simdist.plan.opgraph import Job, Op, OpGraph

LINK_Bps = 100.0
SHARED, OWN = 1, 10  # link ids: one both ranks' sends cross, and one of each rank's own (OWN + rank)


def send(rank: int, nbytes: float, deps: list[int], latency_s: float = 0.0, capacity_Bps: float = LINK_Bps) -> Op:
    """A send of ``nbytes`` over the shared link and its rank's own link, priced at the shared link's rate."""
    bandwidth_s = nbytes / capacity_Bps
    job = Job(latency_s, bandwidth_s, ((SHARED, nbytes, 1), (OWN + rank, nbytes, 1)))
    return Op(f"send{rank}", rank, "pp", "comm", duration_s=latency_s + bandwidth_s, deps=deps, job=job)


def capacity(link: int) -> float:
    return LINK_Bps


def test_two_sends_one_after_the_other_are_free_and_the_engine_agrees():
    # rank 0 sends 100 B (1 s), then rank 1, after it, 50 B (0.5 s): never at once on link 1
    g = OpGraph([send(0, 100.0, []), send(1, 50.0, [0])])
    alone = uncontended(g)
    assert contention_free(g, alone, capacity)
    assert run_graph(g, capacity).end_s == pytest.approx(alone.end_s, rel=1e-12) == (1.0, 1.5)


def test_two_sends_at_once_are_not_free_and_the_engine_slows_them():
    # both at 0 on link 1: 50 B/s each, the 50 B send ends at 1 s, the 100 B one at 1.5 s (not 1 and 0.5)
    g = OpGraph([send(0, 100.0, []), send(1, 50.0, [])])
    alone = uncontended(g)
    assert not contention_free(g, alone, capacity)
    assert run_graph(g, capacity).end_s == pytest.approx((1.5, 1.0), rel=1e-12)
    assert alone.end_s == (1.0, 0.5)


def test_a_send_priced_faster_than_its_shared_link_is_not_free():
    # priced at 200 B/s but link 1 carries 100 B/s: the engine takes 1 s alone, not 0.5 s
    g = OpGraph([send(0, 100.0, [], capacity_Bps=200.0), send(1, 50.0, [0])])
    assert not contention_free(g, uncontended(g), capacity)


def test_touching_transfers_are_free_but_latency_does_not_count_as_transfer():
    # rank 1's send starts at 0.9 s with 0.1 s of latency: its bytes move from 1 s, when rank 0's have arrived
    compute = Op("f", 1, "compute", "forward", duration_s=0.9)
    g = OpGraph([send(0, 100.0, []), compute, send(1, 50.0, [1], latency_s=0.1)])
    alone = uncontended(g)
    assert contention_free(g, alone, capacity)
    assert run_graph(g, capacity).end_s == pytest.approx(alone.end_s, rel=1e-12)


@st.composite
def two_rank_graphs(draw):
    ops: list[Op] = []
    for rank in (0, 1):
        last = -1
        for _ in range(draw(st.integers(1, 5))):
            ops.append(Op("f", rank, "compute", "forward", duration_s=draw(st.floats(0.0, 3.0)),
                          deps=[last] if last >= 0 else []))
            ops.append(send(rank, draw(st.sampled_from([10.0, 50.0, 100.0]) | st.floats(1.0, 200.0)),
                            [len(ops) - 1], latency_s=draw(st.sampled_from([0.0, 0.1]))))
            last = len(ops) - 1
    return OpGraph(ops)


@settings(max_examples=200, deadline=None)
@given(two_rank_graphs())
def test_free_means_the_engine_timeline_is_the_uncontended_one(graph):
    alone = uncontended(graph)
    engine = run_graph(graph, capacity)
    if contention_free(graph, alone, capacity):
        assert engine.start_s == pytest.approx(alone.start_s, rel=1e-9, abs=1e-12)
        assert engine.end_s == pytest.approx(alone.end_s, rel=1e-9, abs=1e-12)
    else:  # the shared link is busy with both at once somewhere: some send ends later than alone
        assert engine.makespan_s >= alone.makespan_s * (1 - 1e-12)
        assert any(e > a * (1 + 1e-12) for e, a in zip(engine.end_s, alone.end_s, strict=True))


def test_the_engine_resumed_at_the_first_divergence_is_the_engine_from_zero():
    # rank 0: compute 1 s, then a 100 B send (1 s alone); rank 1: compute 1.5 s, then a 50 B send: they meet on the
    # shared link at 1.5 s, rank 0's send half done: the engine is the uncontended timeline up to 1.5 s
    g = OpGraph([Op("f", 0, "compute", "forward", duration_s=1.0), send(0, 100.0, [0]),
                 Op("f", 1, "compute", "forward", duration_s=1.5), send(1, 50.0, [2])])
    alone = uncontended(g)
    assert first_divergence(g, alone, capacity) == 1.5
    engine = run_graph(g, capacity)
    # from 1.5 s both at 50 B/s: rank 0's last 50 B end at 2.5 s, rank 1's 50 B too
    assert engine.end_s == pytest.approx((1.0, 2.5, 1.5, 2.5), rel=1e-12)
    for cut in (1.5, 1.2, 0.5):  # resumed at the divergence or before it, rank 0's send under way or not begun
        assert run_graph(g, capacity, resume=(alone, cut)).end_s == pytest.approx(engine.end_s, rel=1e-12)
    # free: never diverges, and resuming at inf is the uncontended trace itself
    free = OpGraph([send(0, 100.0, []), send(1, 50.0, [0])])
    assert first_divergence(free, uncontended(free), capacity) == float("inf")
    assert run_graph(free, capacity, resume=(uncontended(free), float("inf"))) == uncontended(free)


@st.composite
def graphs_with_collectives(draw):
    """Two ranks' compute and sends, and collectives of both (one sync id: they start together) on the shared link
    and a link of their own, in latency or moving bytes when the engine is resumed."""
    ops: list[Op] = []
    last = {0: -1, 1: -1}
    sync = 0
    for _ in range(draw(st.integers(1, 6))):
        what = draw(st.sampled_from(["compute", "send", "collective"]))
        if what == "collective":
            nbytes = draw(st.floats(1.0, 200.0))
            latency_s = draw(st.sampled_from([0.0, 0.2]))
            job = Job(latency_s, nbytes / LINK_Bps, ((SHARED, nbytes, 1), (OWN + 5, nbytes, 1)))
            for rank in (0, 1):
                ops.append(Op("ar", rank, "dp", "comm", duration_s=latency_s + nbytes / LINK_Bps,
                              deps=[last[rank]] if last[rank] >= 0 else [], job=job, sync=sync))
                last[rank] = len(ops) - 1
            sync += 1
            continue
        rank = draw(st.sampled_from([0, 1]))
        deps = [last[rank]] if last[rank] >= 0 else []
        if what == "compute":
            ops.append(Op("f", rank, "compute", "forward", duration_s=draw(st.floats(0.0, 3.0)), deps=deps))
        else:
            ops.append(send(rank, draw(st.floats(1.0, 200.0)), deps, latency_s=draw(st.sampled_from([0.0, 0.1]))))
        last[rank] = len(ops) - 1
    return OpGraph(ops)


@settings(max_examples=300, deadline=None)
@given(two_rank_graphs() | graphs_with_collectives(), st.sampled_from([1.0, 0.999, 0.7, 0.3]))
def test_the_engine_resumed_at_the_first_divergence_equals_the_engine_from_zero(graph, earlier):
    # resumed at the first divergence, or at any earlier time (a transfer or a latency under way there)
    alone = uncontended(graph)
    engine = run_graph(graph, capacity)
    cut = first_divergence(graph, alone, capacity)
    resumed = run_graph(graph, capacity, resume=(alone, cut if cut == float("inf") else cut * earlier))
    assert resumed.start_s == pytest.approx(engine.start_s, rel=1e-9, abs=1e-12)
    assert resumed.end_s == pytest.approx(engine.end_s, rel=1e-9, abs=1e-12)
    # before the cut the engine's timeline is the uncontended one
    for i, e in enumerate(alone.end_s):
        if e <= cut:
            assert engine.end_s[i] == pytest.approx(e, rel=1e-9, abs=1e-12)


def _run(schedule: str, dp: int) -> dict:
    args = [f"parallel.dp={dp}", f"cluster.num_nodes={16 * dp}", f"schedule={schedule}"]
    return api.run("scenarios/llama3-405b-16k.yaml", args).result


def test_a_pipeline_without_contention_is_answered_by_the_closed_form_and_matches_it():
    # Llama 3 405B, PP 16, DP 1, 1F1B, 2,048 micro-batches: pipeline sends never meet on a link
    engine = _run("1f1b", 1)
    sim = engine["simulation"]
    assert "no contention" in sim["micro_batches"] and "by the closed form" in sim["micro_batches"], sim
    assert engine["contention_s"] == 0.0
    closed = api.run("scenarios/llama3-405b-16k.yaml", ["parallel.dp=1", "cluster.num_nodes=16", "schedule=1f1b"],
                     fidelity="closed_form").result
    assert engine["step_time_s"] == pytest.approx(closed["step_time_s"], rel=1e-12)
    for key in ("pipeline_phase_s", "bubble_fraction", "mfu"):
        assert engine[key] == pytest.approx(closed[key], rel=1e-9), key


@pytest.mark.parametrize("scenario, contended", [
    ("scenarios/llama3-405b-16k.yaml", True),  # DP 128: the gradient reduce-scatters meet the pipeline sends
    ("scenarios/korthikanti2022-22b.yaml", False),  # one rank: nothing meets
])
def test_a_step_simulated_from_its_first_divergence_is_the_engine_run_from_zero(scenario, contended):
    # simdist run simulates from the first divergence (simdist.predict.engine_step.alone_and_cut); the same op graph run
    # by the engine from 0 gives every op the same start and end
    from simdist.predict.engine_step import capacities, first_replica
    from simdist.report.step_metrics import observables

    sc = api.load_scenario(scenario)
    prediction = api.predict(sc.spec, sc.topology)
    assert (prediction.result["contention_s"] > 1e-6) == contended
    graph = prediction.plan.graph
    one, many = capacities(prediction.topology, None)
    alone = uncontended(graph)
    cut = first_divergence(graph, uncontended(graph, durations=alone_durations(graph, one, many)), one, many,
                           alone_durations(graph, one, many))
    assert (cut < alone.makespan_s) == contended
    engine = run_graph(graph, one, many)
    assert prediction.trace.start_s == pytest.approx(engine.start_s, rel=1e-9, abs=1e-12)
    assert prediction.trace.end_s == pytest.approx(engine.end_s, rel=1e-9, abs=1e-12)
    first = first_replica(prediction.plan)
    ours, theirs = observables(graph, prediction.trace, first), observables(graph, engine, first)
    assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12)


def _divergence_by_scan(graph: OpGraph, alone, durations: list[float] | None) -> float:
    """`first_divergence` spelled out: per shared link its transfers (one per collective instance) by (start, end),
    the first that starts before one ahead of it has ended; condition 1 where an op's time alone is not its
    duration."""
    engine = engine_alone(graph, capacity)
    tol = REL * alone.makespan_s
    diverge, failing = math.inf, set()
    for i, op in enumerate(graph.ops):
        d = op.duration_s if durations is None else durations[i]
        if op.job is not None and abs(engine.durations[i] - d) > REL * max(abs(d), 1e-300):
            diverge = min(diverge, alone.start_s[i])
            failing.add(i)
    busy: dict[int, list[tuple[float, float]]] = {}
    seen: set[int] = set()
    for i, move in enumerate(engine.moves):
        if move is None or i in failing or (move[2] >= 0 and move[2] in seen):
            continue
        seen.add(move[2])
        for link in move[1]:
            busy.setdefault(link, []).append((alone.start_s[i] + move[0], alone.end_s[i]))
    for transfers in busy.values():
        transfers.sort()
        for k in range(1, len(transfers)):
            if transfers[k][0] < max(end for _, end in transfers[:k]) - tol:
                diverge = min(diverge, transfers[k][0])
                break
    return diverge


@settings(max_examples=200, deadline=None)
@given(two_rank_graphs() | graphs_with_collectives(), st.booleans())
def test_the_first_divergence_is_the_per_link_scan(graph, engine_times):
    durations = alone_durations(graph, capacity) if engine_times else None
    alone = uncontended(graph, durations=durations)
    expected = _divergence_by_scan(graph, alone, durations)
    assert first_divergence(graph, alone, capacity, durations=durations) == expected


def test_departs_is_the_scalar_tolerance_test_per_op():
    ops = [Op("f", 0, "compute", "forward", duration_s=d) for d in (1.0, 1.0, 0.0, 0.0, 2.0, math.nan)]
    times = [1.0, 1.0 + 1e-9, 0.0, 1e-300, 2.0 * (1 + 1e-13), 1.0]
    got = departs(ops, times)
    assert isinstance(got, np.ndarray)
    assert got.tolist() == [False, True, False, True, False, False]  # (0 vs 1e-300: beyond REL x 1e-300)
    assert departs(ops, times, [1.0 + 1e-9] * 6).tolist() == [True, False, True, True, True, True]
