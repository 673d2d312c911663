"""The closed-form step (simdist.analytic.step) is the engine's execution rule without contention.

It reads the same recipes (simdist.plan.recipe) as the op-graph builder, so on any layout it must equal the
uncontended timeline of the op graph (simdist.engine.uncontended: the engine's rules, every collective alone),
observable by observable; and where no collective shares a link with another, the engine itself.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdist import api
from simdist.analytic.pricing import chunk_cost_entry, price_pieces, recipe_entry
from simdist.analytic.select import rank_choices
from simdist.analytic.stages import _geometry, _simple, _stages
from simdist.analytic.step import CommPricer, analytic_observables, analytic_step
from simdist.collectives.group import Group
from simdist.collectives.request import Request
from simdist.engine.uncontended import uncontended
from simdist.plan.layout import LayoutRuleError, step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.step import build_step
from simdist.predict.price import price_graph
from simdist.predict.step import predict_step
from simdist.report.step_metrics import observables
from simdist.spec.scenario import ScenarioSpec

K22 = "scenarios/published/korthikanti2022-22b.yaml"
DP4 = ["cluster.num_nodes=4", "parallel.dp=4", "training.global_batch_size=16"]
SMALL = {"num_layers": 12, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 512, "vocab_size": 32000}


def _graph_observables(cfg, topology) -> dict[str, float]:
    plan = build_step(cfg)
    price_graph(plan.graph, topology, mesh=cfg.mesh, reduced_axes=plan.reduced_axes, with_links=False)
    trace = uncontended(plan.graph)
    ranks = sorted(r for (_, d), r in plan.stage_ranks.items() if d == 0)
    return observables(plan.graph, trace, ranks)


def _agree(a: dict[str, float], b: dict[str, float], rel: float) -> None:
    scale = a["step_s"]
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=rel, abs=rel * scale), key


layouts = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2, 4]),
    "pp": st.sampled_from([1, 2, 3, 4]),
    "dp": st.sampled_from([1, 2]),
    "cp": st.sampled_from([1, 2]),
    "vpp": st.sampled_from([1, 2]),
    "zero_stage": st.sampled_from([0, 1, 2, 3]),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "schedule": st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b", "zb_h1"]),
    "grad_reduce": st.sampled_from(["per_parameter", "bucketed", "overlapped"]),
    "bucket": st.sampled_from([None, "20 MB"]),
    "microbatches": st.integers(1, 6),
    "mbs": st.sampled_from([1, 2]),
    "sp": st.booleans(),
    "tp_overlap": st.booleans(),
    "per_parameter": st.booleans(),
    # host costs (simdist.hardware.host): defaults, no step gap, or a slow host whose dispatch bounds the kernels
    "host": st.sampled_from([None, {"step_gap": "0 us"}, {"step_gap": "50 us", "dispatch": "200 us"}]),
    # uneven pipelines: layer counts that pp x vpp do not divide, each way of splitting them, and random per-chunk
    # lists with chunks that hold only the embedding, only the loss, or nothing
    "num_layers": st.sampled_from([6, 12, 13, 14]),
    "split": st.sampled_from(["auto", "lighter_ends", "chunks", "uniform", "parameters", "account_for_loss"]),
    "chunk_seed": st.integers(0, 2**16),
    # mixture of experts: ep x etp carved out of tp x cp x dp, uneven all_to_alls, the dispatchers, mixed dense and
    # MoE layers, the 1F1B A2A overlap (simdist.plan.comm_overlap.overlapped_comm)
    "moe": st.sampled_from([None, None, {"freq": 1}, {"freq": 2}]),
    "ep": st.sampled_from([1, 2, 4]),
    "etp": st.sampled_from([None, 1]),
    "imbalance": st.sampled_from([1.0, 1.5, 2.0]),
    "dispatcher": st.sampled_from(["alltoall", "alltoall", "allgather", "flex"]),
    "a2a_overlap": st.sampled_from([False, False, True]),
    # Megatron-LM --overlap-param-gather: drawn, it brings the distributed optimizer and the overlapped reduction it
    # needs (simdist.plan.data_parallel._gathered_forward)
    "param_overlap": st.sampled_from([False, False, False, True]),
})

MOE = {"num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 512}


def _split_fields(x: dict, vpp: int) -> dict:
    """The scenario's parallel fields that pick the layer split ``x["split"]``."""
    split, n, parts = x["split"], x["num_layers"], x["pp"] * vpp
    if split == "chunks":  # a random composition of the layers over the parts, zeros allowed
        rng = random.Random(x["chunk_seed"])
        counts = [0] * parts
        ends = parts > 2 and x["chunk_seed"] % 2 == 0  # the embedding and the loss alone in their chunks
        for _ in range(n):
            counts[rng.randrange(1, parts - 1) if ends else rng.randrange(parts)] += 1
        return {"layers_per_stage": [[counts[c * x["pp"] + s] for c in range(vpp)] for s in range(x["pp"])]}
    if split in ("uniform", "parameters"):
        return {"partition_method": split} if vpp == 1 else {}
    if split == "account_for_loss":
        return {"account_for_loss_in_pipeline_split": True}
    return {"pipeline_split": split}


def _moe_fields(x: dict) -> tuple[dict, dict, dict]:
    """The model, parallel and training fields of ``x``'s mixture of experts (none where x["moe"] is None)."""
    moe = x.get("moe")
    if moe is None:
        return {}, {}, {}
    ep = x["ep"]
    return ({**MOE, "moe_layer_freq": moe["freq"]},
            {"ep": ep, **({"etp": x["etp"]} if x["etp"] is not None else {})},
            {"moe_imbalance": min(x["imbalance"], max(ep, 1)), "moe_token_dispatcher_type": x["dispatcher"],
             "overlap_moe_expert_parallel_comm": x["a2a_overlap"]})


def _spec(x: dict) -> ScenarioSpec:
    if x.get("param_overlap"):
        x = {**x, "zero_stage": 1, "grad_reduce": "overlapped"}
    gpn = x["tp"] * x["cp"]  # tensor and context peers in one node, data and pipeline ranks across nodes
    vpp = x["vpp"] if x["schedule"] in ("interleaved_1f1b", "zb_v", "dualpipev") else 1
    m = x["microbatches"] * (x["pp"] if vpp > 1 and x["schedule"] == "interleaved_1f1b" else 1)
    moe_model, moe_parallel, moe_training = _moe_fields(x)
    return ScenarioSpec.model_validate({
        "cluster": {"preset": "dgx-h100", "num_nodes": x["pp"] * x["dp"], "gpus_per_node": gpn,
                    "host": {"cpu_sockets": 1, "pcie_switches_per_socket": 1}, "inter_node": {"nics_per_node": gpn},
                    **({"gpu_speed_cv": x["gpu_speed_cv"]} if "gpu_speed_cv" in x else {})},
        "model": {**SMALL, "num_layers": x.get("num_layers", SMALL["num_layers"]), **moe_model},
        "parallel": {"tp": x["tp"], "pp": x["pp"], "dp": x["dp"], "cp": x["cp"], "vpp": vpp,
                     "zero_stage": x["zero_stage"], "sequence_parallel": x["sp"] and x["tp"] > 1,
                     **(_split_fields(x, vpp) if "split" in x else {}), **moe_parallel},
        "training": {"micro_batch_size": x["mbs"], "global_batch_size": m * x["mbs"] * x["dp"],
                     "recompute": x["recompute"], "grad_reduce": x["grad_reduce"],
                     "grad_bucket_size": x["bucket"],
                     "zero3_fetch": "per_parameter" if x["per_parameter"] and x["zero_stage"] == 3 else "prefetch",
                     **({"host_overhead": x["host"]} if x.get("host") else {}), **moe_training,
                     **({"tp_comm_overlap": True} if x.get("tp_overlap") and x["sp"] and x["tp"] > 1 else {}),
                     **({"overlap_param_gather": True} if x.get("param_overlap") else {})},
        "schedule": x["schedule"],
    })


def _config(x: dict):
    """(StepConfig, Topology) of the drawn layout ``x``, or None where the layout check refuses it."""
    spec = _spec(x)
    topology = api.cluster_of(spec)
    try:
        return step_config_of(spec, topology, resolve_model(spec.model)), topology
    except LayoutRuleError:
        return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts)
def test_closed_form_is_the_uncontended_op_graph(x):
    # Every piece of every step of every layout (ZeRO 0-3 with prefetch or per-parameter traffic, buckets,
    # recompute, zb_h1's split backward, interleaved chunks of uneven layers, chunks holding only the embedding,
    # only the loss, or nothing) times the same in both: the graph
    # here is priced on its real groups, the closed form by group shape, which agree on one leaf of dgx-h100.
    made = _config(x)
    if made is None:
        return
    cfg, topology = made
    closed, how = analytic_observables(cfg, CommPricer(topology), fast_forward=False)
    _agree(_graph_observables(cfg, topology), closed, 1e-9)
    assert how is None


@pytest.mark.parametrize("assignments", [
    [],
    ["training.recompute=full", "parallel.sequence_parallel=false"],
    [*DP4, "parallel.zero_stage=0"],
    [*DP4, "parallel.zero_stage=0", "training.grad_bucket_size=100 MB", "training.grad_reduce=overlapped"],
    [*DP4, "parallel.zero_stage=1"],
    [*DP4, "parallel.zero_stage=2"],
    [*DP4, "parallel.zero_stage=3", "training.zero3_fetch=per_parameter"],
    [*DP4, "parallel.zero_stage=3", "training.zero3_fetch=per_parameter", "training.recompute=full"],
    ["cluster.num_nodes=2", "parallel.pp=2", "training.global_batch_size=16", "schedule=zb_h1"],
    ["cluster.num_nodes=2", "parallel.pp=2", "training.global_batch_size=16", "schedule=interleaved_1f1b",
     "parallel.vpp=2"],
])
def test_equals_the_engine_where_nothing_contends(assignments):
    # Data-parallel groups of one GPU per node, each on its own NIC; pipeline sends on their own links: the engine
    # finds no contention (its JSON says so), and the closed form reproduces it, through `simdist run`'s JSON.
    sc = api.load_scenario(K22, assignments)
    engine = predict_step(sc.spec, sc.topology).result
    closed = predict_step(sc.spec, sc.topology, fidelity="closed_form").result
    assert engine["contention_s"] == pytest.approx(0.0, abs=1e-9 * engine["step_time_s"])
    for key in ("step_time_s", "bubble_fraction", "mfu", "tokens_per_s"):
        assert closed[key] == pytest.approx(engine[key], rel=1e-9, abs=1e-12), key
    for key, value in engine["breakdown"].items():
        if isinstance(value, dict):
            for axis, seconds in value.items():
                assert closed["breakdown"][key][axis] == pytest.approx(seconds, rel=1e-9, abs=1e-12)
        else:
            assert closed["breakdown"][key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert closed["simulation"]["fidelity"] == "closed_form" and closed["collectives"] == engine["collectives"]


@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("gpipe", 1), ("zb_h1", 1), ("interleaved_1f1b", 2)])
def test_fast_forward_equals_every_micro_batch(schedule, vpp):
    # 192 micro-batches (interleaved: 4 x 100) on 4 stages with uneven stages and chunks (14 layers: 3 + 4 + 4 + 3)
    # and the LM head on the last: the steady state repeats, and three short schedules extended give the answer.
    spec = _spec({"tp": 2, "pp": 4, "dp": 2, "cp": 1, "vpp": vpp, "zero_stage": 1, "recompute": "selective",
                  "schedule": schedule, "grad_reduce": "overlapped", "bucket": "20 MB",
                  "microbatches": 100 if vpp > 1 else 192,
                  "mbs": 1, "sp": True, "per_parameter": False,
                  # GPU-bound: without host costs, which bound this small model's kernels (simdist.hardware.host)
                  "host": {"step_gap": "0 us", "dispatch": "0 us", "launch": "0 us"}})
    spec = spec.model_copy(update={"model": spec.model.model_copy(update={"num_layers": 14}),
                                   "parallel": spec.parallel.model_copy(update={"pipeline_split": "lighter_ends"})})
    topology = api.cluster_of(spec)
    cfg = step_config_of(spec, topology, resolve_model(spec.model))
    full, how_full = analytic_observables(cfg, CommPricer(topology), fast_forward=False)
    fast, how_fast = analytic_observables(cfg, CommPricer(topology))
    assert how_full is None and how_fast is not None
    # 1F1B with lighter end stages: K - 1 = 3, or 1 where the kernel costs make one stage the bottleneck each
    # micro-batch (H100 with tile/wave quantization and FlashAttention-2's measured curve: the head's stage).
    assert how_fast.cycle in ((1, 3) if schedule == "1f1b" else (how_fast.cycle,))
    _agree(full, fast, 1e-9)


def test_pricer_caches_by_group_shape():
    sc = api.load_scenario(K22, DP4)
    pricer = CommPricer(sc.topology)
    ranks = (0, 8, 16, 24)
    t = pricer.time_s("all_reduce", ranks, 1e9)
    expected = rank_choices(Request("all_reduce", Group(sc.topology, ranks), 1e9))[0].predicted_s
    assert t == expected
    # The same shape elsewhere in the node (first peer on GPU 1) is another key; the same shape again is a hit.
    assert pricer.shape_time_s("all_reduce", 0, 4, 8, 1e9) == t
    assert pricer.misses == 1
    pricer.time_s("all_reduce", (1, 9, 17, 25), 1e9)
    assert pricer.misses == 2
    assert pricer.time_s("all_reduce", (0,), 1e9) == 0.0


def test_a_recipe_priced_alike_is_one_priced_recipe_and_equals_the_exact_pricing():
    """CommPricer.priced shares a priced recipe (and its simple form) between pricers and group shapes that time its
    pieces alike, and what it returns is price_pieces' own: equal field by field, and another timing (every
    collective twice as long) another object."""
    sc = api.load_scenario(K22, DP4)
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    pricer = CommPricer(sc.topology)
    g = _geometry(cfg, pricer)[0]
    layers, first, last = g.chunks[0]
    cost, cost_token = chunk_cost_entry(cfg, layers, first, last)
    slow = CommPricer(sc.topology).scaled(lambda nbytes: 2.0)
    for kind in ("F", "B"):
        r, pieces_token = recipe_entry(cfg, cost, cost_token, kind, False)
        assert any(p.comm is not None for p in r.pieces)
        priced = [p.priced(r.pieces, r.end, g.groups, compile=_simple, pieces_token=pieces_token)
                  for p in (pricer, CommPricer(sc.topology), slow)]
        (a, simple_a), (b, simple_b), (c, _) = priced
        assert a is b and simple_a is simple_b  # one timing: one priced recipe, one simple form
        assert a == price_pieces(pricer, r.pieces, r.end, g.groups) and simple_a == _simple(a)
        assert c is not a and c == price_pieces(slow, r.pieces, r.end, g.groups)
        comm = [j for j, p in enumerate(r.pieces) if p.comm is not None and a.durations[j] > 0]
        assert comm and all(c.durations[j] > a.durations[j] for j in comm)


def test_a_layouts_stages_are_priced_once_per_pricer_replica_and_straggler():
    # read twice on one pricer: the same stages (a search's bound and its closed form); another replica with a
    # straggler in it, or the same layout without the straggler, or another pricer: their own, priced alike
    sc = api.load_scenario(K22, ["cluster.num_nodes=4", "parallel.dp=2", "parallel.pp=2",
                                 "training.global_batch_size=16", "faults.stragglers=[{rank: 8, slower_by: 0.3}]"])
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    assert cfg.compute_slowdown and cfg.mesh.coords(8)["dp"] == 1
    pricer = CommPricer(sc.topology)
    first = _stages(cfg, pricer)
    assert _stages(cfg, pricer) is first
    slowed = _stages(cfg, pricer, dp_index=1)
    assert slowed is not first and _stages(cfg, pricer, dp_index=1) is slowed
    stage = cfg.mesh.coords(8)["pp"]
    assert slowed[stage].recipes[0].durations != first[stage].recipes[0].durations
    healthy = _stages(dataclasses.replace(cfg, compute_slowdown=()), pricer, dp_index=1)
    assert healthy is not slowed and healthy[stage].recipes[0].durations == first[stage].recipes[0].durations
    fresh = _stages(cfg, CommPricer(sc.topology))
    assert fresh is not first
    assert [(st.sends, [r.durations if r else None for r in st.recipes]) for st in fresh] == \
        [(st.sends, [r.durations if r else None for r in st.recipes]) for st in first]


def test_breakdown_adds_up():
    sc = api.load_scenario(K22, ["cluster.num_nodes=2", "parallel.pp=2", "training.global_batch_size=16",
                                 "training.grad_reduce=overlapped", "parallel.zero_stage=1"])
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    r = analytic_step(cfg, CommPricer(sc.topology))
    parts = (r.compute_s + r.recompute_s + r.tp_comm_s + r.cp_comm_s + r.pp_comm_s + r.dp_exposed_s + r.ep_comm_s
             + r.etp_comm_s + r.edp_exposed_s + r.optimizer_s + r.bubble_s + r.idle_s)
    assert parts == pytest.approx(r.step_time_s, rel=1e-9)
    assert r.tokens_per_s == pytest.approx(16 * 2048 / r.step_time_s)
    assert r.bubble_s == pytest.approx(r.bubble_fraction * r.pipeline_phase_s, rel=1e-9)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts)
def test_search_lower_bound_never_exceeds_the_closed_form(x):
    # simdist.search.sweep's branch and bound rules out a layout whose lower bound is slower than the incumbent: it
    # is sound only if the bound is a bound of the exact closed form, on every kind of layout.
    # The search's first screen, compute alone, must be a bound of that bound (it refines a layout only where the
    # compute bound cannot rule it out), and above zero (every layout computes).
    from simdist.analytic.bound import compute_bound_s, lower_bound_s

    made = _config(x)
    if made is None:
        return
    cfg, topology = made
    pricer = CommPricer(topology)
    exact = analytic_step(cfg, pricer).step_time_s
    bound = lower_bound_s(cfg, pricer)
    assert 0 < bound <= exact * (1 + 1e-12)
    assert 0 < compute_bound_s(cfg) <= bound * (1 + 1e-12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts, st.floats(1.0, 3.0), st.floats(1.0, 3.0))
def test_the_closed_form_never_shortens_when_a_collective_lengthens(x, slow_a, slow_b):
    # simdist.search.sweep's third bound: the closed form with every collective alone bounds the one with the
    # contention estimate (each collective at least as long there) only if the step is monotone in every
    # collective's time, on every kind of layout. Here each op and group size takes its own factor >= 1.
    made = _config(x)
    if made is None:
        return
    cfg, topology = made
    pricer = CommPricer(topology)
    base = analytic_step(cfg, pricer).step_time_s

    def longer(op: str, n: int, nbytes: float, t: float) -> float:
        return t * (slow_a if (len(op) + n) % 2 else slow_b)

    slower = analytic_step(cfg, pricer.perturbed(longer)).step_time_s
    assert slower >= base * (1 - 1e-12)
