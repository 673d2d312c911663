"""Training steps under zb_v, dualpipe and dualpipev (simdist.plan.schedule_v): both fidelities, the closed form equal
to the uncontended engine, the step's bubble against the schedule's, DualPipe's doubled parameters, the V layer
split, and one clear error per bad combination."""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist.analytic.bound import compute_bound_s, lower_bound_s
from simdist.analytic.step import CommPricer, analytic_observables
from simdist.errors import SimdistError
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.schedule import bubble_formula
from simdist.plan.step import build_step, collective_runs
from simdist.plan.step_memory import step_memory
from tests.test_analytic_step import _agree, _graph_observables

VPP = {"zb_v": 2, "dualpipe": 1, "dualpipev": 2, "1f1b": 1, "zb_h1": 1}
TWO = ("zb_v", "dualpipe", "dualpipev")


def _tiny(tmp_path: Path, schedule: str, *, parallel: str = "", training: str = "", m: int = 8, pp: int = 4,
          model: str = "num_layers: 8, hidden_size: 256, num_attention_heads: 4, seq_length: 512, vocab_size: 1000",
          cluster: str = "preset: dgx-h100") -> str:
    p = tmp_path / f"{schedule}.yaml"
    p.write_text(f"cluster: {{{cluster}}}\nmodel: {{{model}}}\n"
                 f"parallel: {{tp: 1, pp: {pp}, dp: 2, vpp: {VPP[schedule]}, zero_stage: 1{parallel}}}\n"
                 f"training: {{micro_batch_size: 1, global_batch_size: {2 * m}{training}}}\n"
                 f"schedule: {schedule}\n", encoding="utf-8")
    return str(p)


def _cfg(path: str):
    sc = api.load_scenario(path)
    return step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model)), sc.topology


@pytest.mark.parametrize("schedule", TWO)
@pytest.mark.parametrize("training", ["", ", grad_reduce: overlapped", ", grad_reduce: overlapped, "
                                      "overlap_param_gather: true"])
def test_closed_form_equals_the_uncontended_engine(tmp_path, schedule, training):
    cfg, topology = _cfg(_tiny(tmp_path, schedule, training=training))
    engine = _graph_observables(cfg, topology)
    for compiled in (False, True):  # step by step and the compiled recurrence (DualPipe's held sends in both)
        closed, _ = analytic_observables(cfg, CommPricer(topology), fast_forward=False, compiled=compiled)
        _agree(engine, closed, 1e-9)
    # the search's bounds stay below the exact closed form
    assert compute_bound_s(cfg) <= lower_bound_s(cfg, CommPricer(topology)) <= closed["step_s"] * (1 + 1e-12)


@pytest.mark.parametrize("schedule", TWO)
def test_simdist_run_both_fidelities(tmp_path, schedule):
    path = _tiny(tmp_path, schedule)
    engine = api.run(path).result
    closed = api.run(path, fidelity="closed_form").result
    assert engine["step_time_s"] >= closed["step_time_s"] * (1 - 1e-9)  # the engine is never faster
    assert engine["step_time_s"] == pytest.approx(closed["step_time_s"], rel=0.05)
    assert engine["simulation"]["micro_batches"] == "all"  # not fast-forwarded (simdist.plan.fastforward.plan)
    for r in (engine, closed):
        assert 0 < r["bubble_fraction"] < 0.5 and len(r["memory"]) == 4


def test_the_op_graph_places_and_counts_the_sends(tmp_path):
    # zb_v: the V's turn (part K-1 -> K) stays on stage K-1; dualpipe: each chunk carries M/2 micro-batches
    for schedule in TWO:
        cfg, _ = _cfg(_tiny(tmp_path, schedule))
        plan = build_step(cfg)
        sends = [op for op in plan.graph.ops if op.comm is not None and op.comm.op == "send_recv"]
        pairs = {(op.stage, plan.stage_ranks[(s, 0)]) for op in sends for s in range(4)
                 if plan.stage_ranks[(s, 0)] == op.comm.ranks[1]}
        assert all(a != b for a, b in {(op.comm.ranks[0], op.comm.ranks[1]) for op in sends})
        # every F and B crosses one stage boundary per part boundary it crosses: 2 (F, B) x M x boundaries
        boundaries = {"zb_v": 6, "dualpipe": 3, "dualpipev": 6}[schedule]
        assert len(sends) == 2 * 8 * boundaries, schedule
        counted = sum(n for key, n in collective_runs(cfg).items() if key[0] == "send_recv")
        assert counted == len(sends) and pairs


@pytest.mark.parametrize("schedule", ["dualpipe", "dualpipev", "zb_v"])
def test_uniform_stages_and_free_p2p_give_the_schedules_bubble(tmp_path, schedule):
    # An mlp of 128 layers on pp = 4 (every chunk alike), no host gaps, NVLink near-infinite (p2p free), a large
    # micro-batch (the optimizer, which fills an early stage's bubble, is ~2% of the compute): the step's bubble is
    # `simdist bubble`'s (DeepSeek-V3 Table 2 for dualpipe, the README's on 2K stages for dualpipev; F = B_input = W
    # up to the roofline's B/F = 1.96). ZB-V's greedy order sits between its bound and its unit-time bubble.
    path = _tiny(tmp_path, schedule, m=8, model="kind: mlp, num_layers: 128, hidden_size: 8192",
                 cluster="preset: dgx-h100, scale_up: {bandwidth: 900000 GB/s, latency: 0.000001 us}",
                 training=", host_overhead: {launch: 0 us, dispatch: 0 us, step_gap: 0 us}")
    path = Path(path)
    path.write_text(path.read_text().replace("micro_batch_size: 1, global_batch_size: 16",
                                             "micro_batch_size: 8192, global_batch_size: 131072"))
    r = api.run(str(path), fidelity="closed_form").result
    schedule_bubble = api.bubble(schedule, num_stages=4, num_microbatches=8, vpp=VPP[schedule])
    formula = bubble_formula(schedule, num_stages=4, num_microbatches=8, vpp=VPP[schedule])
    if schedule == "zb_v":
        assert formula - 1e-9 <= r["bubble_fraction"] <= schedule_bubble["bubble_fraction"] + 0.005
    else:
        assert schedule_bubble["bubble_fraction"] == pytest.approx(formula, abs=1e-12)
        assert formula == pytest.approx({"dualpipe": 2 / 26, "dualpipev": 3 / 27}[schedule], abs=1e-12)
        assert r["bubble_fraction"] == pytest.approx(formula, abs=0.002)
    if schedule == "dualpipe":  # the engine agrees
        assert api.run(str(path)).result["bubble_fraction"] == pytest.approx(r["bubble_fraction"], abs=1e-6)


def test_dualpipe_holds_two_copies_of_the_parameters(tmp_path):
    # DeepSeek-V3 Table 2: DualPipe's parameters 2x (each stage holds parts s and K-1-s); the V's one copy
    one, _ = _cfg(_tiny(tmp_path, "zb_h1"))
    dual, _ = _cfg(_tiny(tmp_path, "dualpipe"))
    vee, _ = _cfg(_tiny(tmp_path, "zb_v"))
    assert dual.layers_per_stage == (4, 4, 4, 4) and one.layers_per_stage == (2, 2, 2, 2)
    assert [dual.stage_layers(s) for s in (0, 1)] == [(0, 1, 6, 7), (2, 3, 4, 5)]
    assert vee.stage_layers(0) == (0, 7) and vee.stage_layers(3) == (3, 4)  # parts 0 and 7, 3 and 4
    a, b, v = step_memory(one), step_memory(dual), step_memory(vee)
    for field in ("params_bytes", "grads_bytes", "optimizer_bytes"):  # a middle stage: no embedding or head
        assert getattr(b[1], field) == pytest.approx(2 * getattr(a[1], field), rel=1e-12), field
        assert getattr(v[1], field) == pytest.approx(getattr(a[1], field), rel=1e-12), field
    # the embedding and the head: both on each of DualPipe's end stages (parts 0 and K-1), both on the V's stage 0
    assert b[0].params_bytes == pytest.approx(b[3].params_bytes, rel=1e-12)
    assert b[0].params_bytes > b[1].params_bytes and v[0].params_bytes > v[3].params_bytes
    assert v[3].params_bytes == pytest.approx(v[1].params_bytes, rel=1e-12)


def test_a_per_stage_split_follows_the_v(tmp_path):
    cfg, _ = _cfg(_tiny(tmp_path, "zb_v", parallel=", layers_per_stage: [[1, 0], [1, 1], [1, 1], [1, 2]]"))
    # chunk 1 of stage s is part 2K-1-s: stage 3's [1, 2] are parts 3 and 4
    assert cfg.model_parts() == (1, 1, 1, 1, 2, 1, 1, 0)
    assert [cfg.stage_chunks(s) for s in range(4)] == [(1, 0), (1, 1), (1, 1), (1, 2)]
    closed = api.run(_tiny(tmp_path, "dualpipev", parallel=", layers_per_stage: [[1, 0], [1, 1], [1, 1], [1, 2]]"),
                     fidelity="closed_form").result
    assert closed["layout"]["layers_per_chunk"] == [[1, 0], [1, 1], [1, 1], [1, 2]]


@pytest.mark.parametrize(("schedule", "extra", "field", "words"), [
    ("dualpipe", {"pp": 3}, "parallel.pp", "even pp"),
    ("dualpipe", {"m": 6}, "training.global_batch_size", "at least 2 x pp = 8"),
    ("dualpipe", {"parallel": ", vpp: 2"}, "parallel.vpp", "needs vpp 1"),
    ("zb_v", {"parallel": ", vpp: 1"}, "parallel.vpp", "needs vpp 2"),
    ("dualpipev", {"m": 7}, "training.global_batch_size", "at least 2 x pp = 8"),
    ("zb_v", {"parallel": ", pipeline_split: lighter_ends"}, "parallel.pipeline_split", "stage 0"),
    ("dualpipe", {"parallel": ", zero_stage: 3", "training": ", zero3_fetch: per_layer"}, "training.zero3_fetch",
     "splits the weight gradients"),
])
def test_bad_combinations_give_one_clear_error(tmp_path, schedule, extra, field, words):
    parallel = extra.get("parallel", "")
    cluster = "preset: dgx-h100" + (", num_nodes: 3" if extra.get("pp") == 3 else "")  # pp 3 x dp 8
    text = Path(_tiny(tmp_path, schedule, parallel="", training=extra.get("training", ""), m=extra.get("m", 8),
                      pp=extra.get("pp", 4), cluster=cluster)).read_text()
    if "vpp" in parallel:
        text = text.replace(f"vpp: {VPP[schedule]}", parallel.strip(", "))
        parallel = ""
    if "zero_stage" in parallel:
        text = text.replace("zero_stage: 1", parallel.strip(", "))
        parallel = ""
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("zero_stage: 1}", f"zero_stage: 1{parallel}}}")
                    .replace("dp: 2", "dp: 8" if extra.get("pp") == 3 else "dp: 2"))
    with pytest.raises(SimdistError) as err:
        api.run(str(path), fidelity="closed_form")
    assert err.value.field == field and words in str(err.value) and err.value.fix, str(err.value)
