"""Megatron-Core's 1F1B A2A overlap, layer by layer (simdist.plan.moe_pairing): each all-to-all hides behind the one
compute segment of the other micro-batch's layer it is paired with."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.plan.interference import taxed_s
from simdist.plan.moe_pairing import exposure_s, pair_time_s, scaled, segments, step_pairing

MS = 1e-3
# pre_dispatch_fwd, mlp_fwd, mlp_bwd (input gradients), mlp_bwd_dw, pre_dispatch_bwd: 1, 2, 2, 1, 3 ms
SEG = (1 * MS, 2 * MS, 2 * MS, 1 * MS, 3 * MS)


@pytest.mark.parametrize(("a_ms", "pair_ms"), [
    (0.0, 9.0),   # nothing to hide: the layer's compute, forward and backward
    (1.0, 9.0),   # every all-to-all shorter than its partner
    # combine_bwd 1.5 beside pre_dispatch_fwd 1: t1 = 1.5; dispatch_bwd ends at 1.5 + max(1.5, 2) + 1.5 = 5,
    # mlp_fwd at 1.5 + max(2 + 1, 1.5) + 2 = 6.5; combine_fwd and pre_dispatch_bwd from 6.5: + max(1.5, 3) = 9.5
    (1.5, 9.5),
    # 2.5: t1 = 2.5; dispatch_bwd ends at 2.5 + 2.5 + 2.5 = 7.5, mlp_fwd at 2.5 + 3 + 2 = 7.5; + max(2.5, 3) = 10.5
    (2.5, 10.5),
    (10.0, 40.0),  # the all-to-alls longer than everything: four of them back to back
])
def test_a_pair_of_layers_takes_the_two_streams_critical_path(a_ms, pair_ms):
    assert pair_time_s(a_ms * MS, *SEG) == pytest.approx(pair_ms * MS, rel=1e-12)


@pytest.mark.parametrize(("a_ms", "delayed_ms", "undelayed_ms"), [
    (1.0, 9.0, 9.0),  # every all-to-all shorter than its partner either way
    # 2.5 with the weight gradients delayed: 10.5 (above); without --delay-wgrad-compute mlp_bwd holds them (mbd 3,
    # mbw 0): t1 = 2.5; dispatch_bwd waits for all 3 ms: 2.5 + max(2.5, 3) + 2.5 = 8, mlp_fwd 2.5 + max(3, 2.5) + 2 =
    # 7.5; + max(2.5, 3) = 11, i.e. max(a, pf) + max(a, mbd + mbw) + max(a, mf) + max(a, pb) = 2.5 + 3 + 2.5 + 3
    (2.5, 10.5, 11.0),
    # 3.5: delayed 3.5 + max(3.5 + 3.5, 3.5 + 2) + 3.5 = 14; undelayed 3.5 + 3.5 + 3.5 + 3.5 = 14
    (3.5, 14.0, 14.0),
])
def test_undelayed_weight_gradients_hold_the_backward_dispatch(a_ms, delayed_ms, undelayed_ms):
    # Megatron-LM --delay-wgrad-compute off: mlp_bwd_dw is a no-op, the weight gradients run inside mlp_bwd, so the
    # backward dispatch starts after them (segments(..., delayed=False) folds mbw into mbd)
    pf, mf, mbd, mbw, pb = SEG
    assert pair_time_s(a_ms * MS, *SEG) == pytest.approx(delayed_ms * MS, rel=1e-12)
    assert pair_time_s(a_ms * MS, pf, mf, mbd + mbw, 0.0, pb) == pytest.approx(undelayed_ms * MS, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.tuples(*[st.floats(0, 10) for _ in range(5)]), st.floats(0, 20))
def test_delaying_the_weight_gradients_never_slows_the_pair(seg, a):
    pf, mf, mbd, mbw, pb = seg
    undelayed = pair_time_s(a, pf, mf, mbd + mbw, 0.0, pb)
    assert pair_time_s(a, *seg) <= undelayed + 1e-9
    assert undelayed == pytest.approx(max(a, pf) + max(a, mbd + mbw) + max(a, mf) + max(a, pb), abs=1e-9)


def test_the_pairs_exposure_is_split_by_compute_and_added_to_the_tax():
    n = 4.0  # MoE layers in the chunk
    seg = (*SEG, n)
    forward, backward = step_pairing(seg, "F"), step_pairing(seg, "B")
    assert forward[-1] == pytest.approx(3 / 9) and backward[-1] == pytest.approx(6 / 9)
    comm = 2 * n * 1.5 * MS  # a step's all-to-alls: two a layer of 1.5 ms
    # the pair's exposure, 4 layers x 0.5 ms, in thirds and two-thirds
    assert exposure_s(comm, forward) == pytest.approx(4 * 0.5 * MS / 3, rel=1e-12)
    assert exposure_s(comm, forward) + exposure_s(comm, backward) == pytest.approx(2 * MS, rel=1e-12)
    assert exposure_s(comm, ()) == 0.0 and step_pairing((), "F") == ()
    # the tax piece: x / (1 + x) of the collectives beside the compute, up to the compute, plus the exposure
    assert taxed_s(0.2, comm, 5 * MS, forward) == pytest.approx(0.2 * 5 * MS + 2 * MS / 3, rel=1e-12)
    assert taxed_s(0.2, comm, 50 * MS) == pytest.approx(0.2 * comm, rel=1e-12)
    # a straggler's compute factor stretches the segments, not the layer count nor the share
    slow = scaled(forward, 2.0)
    assert slow[:5] == pytest.approx(tuple(2 * t for t in SEG)) and slow[5:] == forward[5:]
    assert scaled(forward, 1.0) is forward


@settings(max_examples=200, deadline=None)
@given(st.tuples(*[st.floats(0, 10) for _ in range(5)]), st.floats(0, 20), st.floats(0, 5))
def test_pairing_invariants(seg, a, more):
    compute = sum(seg)
    pair = pair_time_s(a, *seg)
    # never faster than the compute, nor than the four all-to-alls one after the other on the comm stream
    assert pair >= max(compute, 4 * a) - 1e-9
    # never slower than running everything one after the other (no overlap at all)
    assert pair <= compute + 4 * a + 1e-9
    assert pair_time_s(a + more, *seg) >= pair - 1e-9  # slower all-to-alls never make the pair faster


class _Kernel:
    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds = name, seconds


class _Work:
    def __init__(self, forward, backward) -> None:
        self.forward = tuple(_Kernel(n, s) for n, s in forward)
        self.backward = tuple(_Kernel(n, s) for n, s in backward)


def test_segments_are_megatrons_schedule_nodes():
    # the mlp node: the dispatcher's local sort and the routed experts (simdist.plan.moe_pairing.MLP_PREFIXES);
    # the rest of the layer is pre_dispatch (attention, router, shared experts) or rides with the combine
    moe = _Work([("rmsnorm", 1), ("flash_attention", 4), ("router", 1), ("moe_sort_chunks", 1), ("expert_fc1", 3),
                 ("expert_swiglu", 1), ("expert_fc2", 2), ("moe_unsort_chunks", 1), ("moe_unpermute", 1)],
                [("moe_unpermute_grad", 1), ("moe_unsort_chunks_grad", 1), ("expert_fc2_input_grad", 2),
                 ("expert_fc2_weight_grad", 2), ("expert_swiglu_grad", 1), ("expert_fc1_input_grad", 3),
                 ("expert_fc1_weight_grad", 3), ("moe_sort_chunks_grad", 1), ("router_input_grad", 1),
                 ("flash_attention_grad", 8)])
    dense = _Work([("flash_attention", 4), ("mlp_up", 5)], [("mlp_up_input_grad", 5)])
    seg = segments([(moe, 3), (dense, 2)], lambda ks: sum(k.seconds for k in ks))
    # pf: rmsnorm, attention, router, unpermute = 7; mf: sort, fc1, swiglu, fc2, unsort = 8;
    # mbd: unsort, fc2 dgrad, swiglu, fc1 dgrad, sort = 8; mbw: 5; pb: unpermute, router, attention = 10; 3 layers
    assert seg == (7, 8, 8, 5, 10, 3.0)
    assert segments([(dense, 2)], lambda ks: 1.0) == ()
    # without --delay-wgrad-compute the weight gradients are mlp_bwd's own: mbd 8 + 5, mbw 0
    assert segments([(moe, 3), (dense, 2)], lambda ks: sum(k.seconds for k in ks), delayed=False) == \
        (7, 8, 13, 0, 10, 3.0)


def test_delay_wgrad_compute_reaches_the_pairing_and_needs_the_overlap():
    from simdist import api
    from simdist.plan.chunk_cost import chunk_cost
    from simdist.plan.layout import LayoutRuleError, step_config_of
    from simdist.plan.model_presets import resolve_model
    from tests.test_moe_layout import _spec

    costs = {}
    for delay in (False, True):
        spec = _spec({"dp": 8, "ep": 8}, {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": delay})
        cfg = step_config_of(spec, api.cluster_of(spec), resolve_model(spec.model))
        assert cfg.delay_wgrad is delay
        costs[delay] = chunk_cost(cfg, cfg.part_layers(0), True, True).moe_pairing
    pf, mf, mbd, mbw, pb, n = costs[True]
    assert mbw > 0 and costs[False] == pytest.approx((pf, mf, mbd + mbw, 0.0, pb, n), rel=1e-12)
    spec = _spec({"dp": 8, "ep": 8}, {"delay_wgrad_compute": True})
    with pytest.raises(LayoutRuleError, match="delay_wgrad_compute without overlap_moe_expert_parallel_comm") as err:
        step_config_of(spec, api.cluster_of(spec), resolve_model(spec.model))
    assert err.value.field == "training.delay_wgrad_compute"


def test_paired_steps_wait_for_their_all_to_alls_only_through_the_pairing(monkeypatch):
    # a toy whose expert-parallel all-to-all crosses two nodes on 1 Gb/s NICs, far longer than the layer's compute:
    # the paired steps' tax pieces carry the pairing and its exposure; the engine's timeline and the closed form
    # agree on the step
    from simdist import api
    from simdist.analytic.pricing import CommPricer
    from simdist.analytic.step import analytic_observables
    from simdist.plan.chunk_cost import chunk_cost
    from simdist.plan.layout import step_config_of
    from simdist.plan.model_presets import resolve_model
    from simdist.plan.recipe import step_recipe
    from simdist.spec.scenario import ScenarioSpec
    from tests.test_analytic_step import _agree, _graph_observables
    from tests.test_moe_layout import TINY_MOE, _spec

    model = {**TINY_MOE, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 512, "moe_ffn_hidden_size": 256}
    steps = {}
    for overlap in (False, True):
        doc = _spec({"dp": 8, "ep": 8}, {"overlap_moe_expert_parallel_comm": overlap, "global_batch_size": 32}, model,
                    gpus_per_node=4, num_nodes=2).model_dump(mode="json", exclude_unset=True)
        doc["cluster"]["inter_node"]["nic_bandwidth"] = "1 Gb/s"
        spec = ScenarioSpec.model_validate(doc)
        topology = api.cluster_of(spec)
        cfg = step_config_of(spec, topology, resolve_model(spec.model))
        obs = analytic_observables(cfg, CommPricer(topology), fast_forward=False)[0]
        _agree(_graph_observables(cfg, topology), obs, 1e-9)
        steps[overlap] = obs
        cost = chunk_cost(cfg, cfg.part_layers(0), True, True)
        if not overlap:
            assert cost.moe_pairing == ()
            continue
        assert cost.moe_pairing[-1] == 4.0  # the toy's 4 MoE layers
        for kind in ("F", "B"):
            pieces = step_recipe(cfg, cost, kind).pieces
            (tax,) = [p for p in pieces if p.tax_of]
            assert tax.pairing == step_pairing(cost.moe_pairing, kind)
            assert not [p for p in pieces if p.kind == "wait" and set(p.deps) & set(tax.tax_of)]
            alone = step_recipe(cfg, cost, kind, alone=True).pieces  # unpaired: its all-to-alls in its path
            assert not [p for p in alone if p.tax_of]
    # the overlap still hides part of the all-to-alls, which here take most of the step
    assert steps[True]["step_s"] < steps[False]["step_s"]
    # and both fidelities price the pairing's exposure: without it the same layout's step is shorter in each
    import simdist.plan.interference as interference

    monkeypatch.setattr(interference, "exposure_s", lambda comm_s, pairing: 0.0)
    unexposed = analytic_observables(cfg, CommPricer(topology), fast_forward=False)[0]
    _agree(_graph_observables(cfg, topology), unexposed, 1e-9)
    assert unexposed["step_s"] < steps[True]["step_s"] - 1e-3
