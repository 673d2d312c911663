"""ZeRO-3 run as FSDP runs it (training.zero3_fetch: per_layer, simdist.plan.fsdp): each unit gathered one ahead of its
compute, its gradients reduce-scattered behind it. The step of one micro-batch is composed by hand from the chunk's
compute and the collectives' prices, and both fidelities must give it exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist.analytic.pricing import CommPricer
from simdist.analytic.step import analytic_step
from simdist.plan.chunk_cost import chunk_cost
from simdist.plan.data_parallel import tail
from simdist.plan.fsdp import units_of
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.predict.step import predict_step
from tests.conftest import TOY_TOPOLOGY

SCENARIO = """
name: fsdp
cluster: {{file: {toy}, num_nodes: 2, gpus_per_node: 1, inter_node: {{nics_per_node: 1}}, gpu_speed_cv: 0}}
model: {{num_layers: 4, hidden_size: 2048, num_attention_heads: 16, seq_length: 1024, vocab_size: 2048,
         swiglu: true, ffn_hidden_size: 5632, tied_embeddings: false}}
parallel: {{dp: 2, zero_stage: 3, reshard_after_forward: {reshard}}}
training: {{micro_batch_size: 1, global_batch_size: 2, zero3_fetch: per_layer, fsdp_version: 1,
           grad_reduce_in_fp32: false, backward_prefetch: {prefetch}, kernel_fusion: eager, attention: sdpa}}
"""


def _case(tmp_path: Path, reshard: bool = True, prefetch: str = "pre"):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(reshard=str(reshard).lower(), prefetch=prefetch, toy=TOY_TOPOLOGY))
    s = api.load_scenario(path)
    cfg = step_config_of(s.spec, s.topology, resolve_model(s.spec.model))
    return s, cfg, CommPricer(s.topology)


def _hand(cfg, pricer, reshard: bool, prefetch: str) -> float:
    """One micro-batch (F then B) and the optimizer, composed by hand (simdist.plan.fsdp's module docstring), the
    compute the collectives overlap slowed by simdist.plan.interference's tax."""
    cost = chunk_cost(cfg, cfg.part_layers(0), True, True)
    u = units_of(cost)
    n = u.count
    assert n == cfg.model.num_layers + 2  # the layers, the embedding, the output layer
    group = cfg.mesh.group("dp", 0)
    P = cost.num_params

    def ag(share):
        return pricer.time_s("all_gather", group, P * share * 2)  # bf16 parameters

    def rs(share):
        return pricer.time_s("reduce_scatter", group, P * share * 2)  # bf16 gradients (grad_reduce_in_fp32 false)

    f, bb = cost.forward_s / n, cost.backward_s / n
    x = cfg.interference  # compute takes (1 + x) as long beside collectives: a tax of x / (1 + x) of their time
    share = x / (1 + x)
    # forward: the first unit's (the embedding's) gather, the others' behind it; unit k computes beside unit k+1's
    a1, a_rest = ag(u.first), ag(1 - u.first)
    first_end = a1 + f
    mid_end = first_end + (n - 2) * f
    f_end = max(mid_end, a1 + a_rest) + f + share * min(a_rest, cost.forward_s)
    dp_free = a1 + a_rest
    if not reshard:
        b1 = f_end + bb
        b_end = b1 + (n - 1) * bb
        rs_rest = max(b1, dp_free) + rs((n - 1) / n)
        rs_last = max(b_end, rs_rest) + rs(1 / n)
        b_end += share * min(rs((n - 1) / n), cost.backward_s)
    elif prefetch == "pre":
        # backward: the last layer's unit gathered ahead, the others beside the backward; the output layer's unit
        # is never resharded (no gather)
        g1 = dp_free + ag(u.backward_first)
        g_rest = g1 + ag(u.backward_gathered - u.backward_first)
        b1 = max(f_end, g1) + bb
        b_mid = b1 + (n - 2) * bb
        b_end = max(b_mid, g_rest) + bb
        rs_rest = max(b1, g_rest) + rs((n - 1) / n)
        rs_last = max(b_end, rs_rest) + rs(1 / n)
        beside = ag(u.backward_gathered - u.backward_first) + rs((n - 1) / n)
        b_end += share * min(beside, cost.backward_s)
    else:
        # BACKWARD_POST: each unit's gather after the previous unit's gradients, in the backward's path
        g1 = dp_free + ag(u.backward_first)
        b1 = max(f_end, g1) + bb
        g_rest = max(b1, g1) + ag(u.backward_gathered - u.backward_first)
        b_end = g_rest + (n - 1) * bb
        rs_rest = max(b1, g_rest) + rs((n - 1) / n)
        rs_last = max(b_end, rs_rest) + rs(1 / n)
        b_end += share * min(rs((n - 1) / n), cost.backward_s)
    (opt,) = [p for p in tail(cfg, [cost]).pieces if p.kind == "optimizer"]
    return max(b_end, rs_last) + opt.duration_s


@pytest.mark.parametrize(("reshard", "prefetch"), [(True, "pre"), (True, "post"), (False, "pre")])
def test_fsdp_step_is_the_hand_count_in_both_fidelities(tmp_path, reshard, prefetch):
    s, cfg, pricer = _case(tmp_path, reshard, prefetch)
    hand = _hand(cfg, pricer, reshard, prefetch)
    closed = analytic_step(cfg, pricer, fast_forward=False).step_time_s
    engine = predict_step(s.spec, s.topology).result["step_time_s"]
    assert closed == pytest.approx(hand, rel=1e-9)
    assert engine == pytest.approx(hand, rel=1e-9)


def test_per_unit_gathers_hide_behind_compute_where_a_whole_chunk_gather_does_not(tmp_path):
    # The same step with the chunk gathered at once (zero3_fetch: prefetch): the first forward waits for every
    # parameter; per unit it waits for the embedding's only.
    _, cfg, pricer = _case(tmp_path)
    per_unit = analytic_step(cfg, pricer, fast_forward=False)
    import dataclasses

    whole = analytic_step(dataclasses.replace(cfg, zero3_fetch="prefetch"), pricer, fast_forward=False)
    assert per_unit.step_time_s < whole.step_time_s
    assert per_unit.dp_exposed_s < whole.dp_exposed_s


def test_backward_post_exposes_the_gathers(tmp_path):
    _, pre, pricer = _case(tmp_path, True, "pre")
    _, post, _ = _case(tmp_path, True, "post")
    assert analytic_step(post, pricer, fast_forward=False).step_time_s > \
        analytic_step(pre, pricer, fast_forward=False).step_time_s


def test_sharding_strategy_names(tmp_path):
    from simdist.spec import ParallelSpec

    assert ParallelSpec.model_validate({"dp": 8, "sharding_strategy": "SHARD_GRAD_OP"}).reshard_after_forward is False
    full = ParallelSpec.model_validate({"dp": 8, "sharding_strategy": "FULL_SHARD"})
    assert full.zero_stage == 3 and full.reshard_after_forward
    assert ParallelSpec.model_validate({"dp": 8, "data_parallel_sharding_strategy": "optim"}).zero_stage == 1


PIPELINED = """
name: fsdp-pp
cluster: {{file: {toy}, num_nodes: 2, gpus_per_node: 2, inter_node: {{nics_per_node: 1}}, gpu_speed_cv: 0}}
model: {{num_layers: 4, hidden_size: 1024, num_attention_heads: 8, seq_length: 512, vocab_size: 2048,
         swiglu: true, ffn_hidden_size: 2816, tied_embeddings: false}}
parallel: {{pp: 2, dp: 2, zero_stage: 3{reshard}}}
training: {{framework: torchtitan, micro_batch_size: 1, global_batch_size: 8, zero3_fetch: per_layer}}
"""


def _gathered_bytes(cfg) -> float:
    from simdist.plan.step import collective_runs

    return sum(n * key[2] for key, n in collective_runs(cfg).items() if key[0] == "all_gather" and key[3] == "dp")


def test_pipelined_fsdp_gathers_every_backward_only_where_the_forward_reshards(tmp_path):
    # PyTorch pipelining under FSDP2 (torch/distributed/pipelining/stage.py): one reduce-scatter per step, each
    # backward leaving its units gathered into the next forward. torchtitan keeps them gathered from forward to
    # backward under pipeline parallelism (the default: each stage gathers its parameters once per step); resharded
    # after forward (KempnerForge's apply_fsdp2), the first forward gathers them and so does every backward, all
    # units but the last stage's never-resharded head unit (simdist.plan.fsdp.Units.backward_gathered).
    runs = {}
    for name, reshard in (("default", ""), ("false", ", reshard_after_forward: false"),
                          ("true", ", reshard_after_forward: true")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(PIPELINED.format(toy=TOY_TOPOLOGY, reshard=reshard))
        s = api.load_scenario(path)
        cfg = step_config_of(s.spec, s.topology, resolve_model(s.spec.model))
        runs[name] = cfg, _gathered_bytes(cfg), analytic_step(cfg, CommPricer(s.topology)).step_time_s
    cfg = runs["true"][0]
    costs = [chunk_cost(cfg, cfg.part_layers(k), k == 0, k == 1) for k in range(2)]
    once = sum(c.num_params for c in costs) * 2.0  # bf16; an all_gather's size is its gathered output (nccl-tests)
    again = sum(units_of(c).backward_gathered * c.num_params for c in costs) * 2.0
    m = cfg.microbatches(0)
    assert m == 4 and cfg.execution.grad_sync == "step" and cfg.execution.reshard_after_forward
    assert runs["true"][1] == pytest.approx(once + m * again, rel=1e-12)
    for name in ("default", "false"):
        assert not runs[name][0].execution.reshard_after_forward
        assert runs[name][1] == pytest.approx(once, rel=1e-12)
    assert runs["default"][2] == runs["false"][2] < runs["true"][2]
