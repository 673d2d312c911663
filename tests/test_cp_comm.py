"""Context parallelism's communication types (training.cp_comm_type, simdist.plan.context_parallel): a step of one
micro-batch composed by hand from its compute and the collectives' prices, in both fidelities."""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist.analytic.pricing import CommPricer
from simdist.errors import SimdistError
from simdist.plan.chunk_cost import chunk_cost
from simdist.plan.data_parallel import tail
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from tests.conftest import TOY_TOPOLOGY

SCENARIO = f"""
cluster: {{file: {TOY_TOPOLOGY}, num_nodes: 1, gpus_per_node: 2, gpu_speed_cv: 0}}
model: {{num_layers: 2, hidden_size: 512, num_attention_heads: 8, num_query_groups: 4, ffn_hidden_size: 1024,
         seq_length: 8192, vocab_size: 1024, swiglu: true}}
parallel: {{cp: 2}}
training: {{global_batch_size: 1, attention: flash, cp_comm_type: {{kind}}}}
"""


def _case(tmp_path: Path, kind: str):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("{kind}", kind))
    s = api.load_scenario(path)
    cfg = step_config_of(s.spec, s.topology, resolve_model(s.spec.model))
    return path, cfg, CommPricer(s.topology), chunk_cost(cfg, cfg.part_layers(0), True, True)


def _optimizer_s(cfg, cost) -> float:
    return next(p for p in tail(cfg, [cost]).pieces if p.kind == "optimizer").duration_s


@pytest.mark.parametrize("kind", ["p2p", "all_gather", "a2a"])
def test_a_step_is_the_hand_count_in_both_fidelities(tmp_path, kind):
    path, cfg, pricer, cost = _case(tmp_path, kind)
    group = cfg.mesh.group("cp", 0)
    layers, tokens = cfg.model.num_layers, 8192 // 2
    kv_block = tokens * 2 * 4 * 64 * 2  # this rank's K and V: 4 KV heads of 64, bf16

    def t(op, nbytes):
        return pricer.time_s(op, group, nbytes)

    if kind == "p2p":
        # the ring steps' attention beside the exchanges, a ring all-gather of K, V (and in backward of their
        # gradients' reduce-scatter): per layer a + max(r, c), for alike layers A + max(R, C); the exchanges slow the
        # attention they overlap (simdist.plan.interference: x / (1 + x) of min(R, C))
        x = cfg.interference
        c_f = layers * t("all_gather", 2 * kv_block)
        c_b = layers * (t("all_gather", 2 * kv_block) + t("reduce_scatter", 2 * kv_block))
        r_f = cost.ring_forward_s + x / (1 + x) * min(c_f, cost.ring_forward_s)
        r_b = cost.ring_backward_s + x / (1 + x) * min(c_b, cost.ring_backward_s)
        fwd = cost.forward_s - cost.ring_forward_s + max(r_f, c_f)
        bwd = cost.backward_s - cost.ring_backward_s + max(r_b, c_b)
        assert cost.ring_forward_s > 0
    elif kind == "all_gather":
        fwd = cost.forward_s + layers * t("all_gather", 2 * kv_block)
        bwd = cost.backward_s + layers * (t("all_gather", 2 * kv_block) + t("reduce_scatter", 2 * kv_block))
    else:  # a2a: Q, K, V before and the output after the attention, their gradients in backward
        q, kv = tokens * 512 * 2, tokens * 256 * 2
        fwd = cost.forward_s + layers * (2 * t("all_to_all", q) + 2 * t("all_to_all", kv))
        bwd = cost.backward_s + layers * (2 * t("all_to_all", q) + 2 * t("all_to_all", kv))
    # the cp ranks hold the same weights: their gradients are all-reduced after the backward (Megatron's dp x cp
    # group, fp32 gradients), then the optimizer
    grads = pricer.time_s("all_reduce", cfg.mesh.group("dp_cp", 0), cost.num_params * 4)
    hand = fwd + bwd + grads + _optimizer_s(cfg, cost)
    closed = api.run(path, fidelity="closed_form").result["step_time_s"]
    engine = api.run(path).result["step_time_s"]
    assert closed == pytest.approx(hand, rel=1e-9)
    assert engine == pytest.approx(hand, rel=1e-9)


def test_ulysses_attends_over_the_whole_sequence(tmp_path):
    # a2a runs the kernel over all 8192 keys on heads / cp: its efficiency is read at 8192; the ring's steps at the
    # rank's 4096 queries (one causal, the other a whole block)
    from simdist.plan.layer_cost import layer_work

    _, cfg, _, _ = _case(tmp_path, "p2p")

    def parts(kind):
        work = layer_work(cfg.model, cp=2, attention="flash", cp_comm_type=kind)
        (core,) = [k for k in work.forward if k.kind == "attention"]
        return core.attention.parts

    assert parts("a2a") == ((1.0, True, 8192.0),)
    assert parts("p2p") == ((0.5, True, 4096.0), (0.5, False, 4096.0))


def test_hierarchical_cp_is_refused_with_the_field(tmp_path):
    with pytest.raises(SimdistError) as err:
        api.run(_case(tmp_path, "a2a+p2p")[0])
    assert err.value.field == "training.cp_comm_type"


def test_ulysses_needs_heads_divisible_by_cp(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("{kind}", "a2a").replace("num_attention_heads: 8", "num_attention_heads: 7")
                    .replace("num_query_groups: 4", "num_query_groups: 7"))
    with pytest.raises(SimdistError) as err:
        api.run(path)
    assert err.value.field in ("parallel.cp", "model.num_attention_heads")
