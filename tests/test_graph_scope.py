"""Megatron-Core's partial CUDA graphs (training.cuda_graph_scope, simdist.plan.graph_scope): the replayed parts'
kernels at the graph's gap, one host call and one input copy per replay, the rest issued op by op; in both
fidelities, and Megatron-LM's rules on the scopes (one line, exit 2)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from simdist import api
from simdist.hardware.compute import compute_efficiency, kernel_time_s, kernels_time_s
from simdist.hardware.host import host_overhead
from simdist.plan.chunk_cost import chunk_cost
from simdist.plan.graph_scope import graph_tags, replayed_run
from simdist.plan.layer_cost import layer_work
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.optimizer import optimizer_step_kernels
from simdist.spec.scenario import ModelSpec
from tests.conftest import TOY_TOPOLOGY, toy_gpu

SCENARIO = f"""
cluster: {{file: {TOY_TOPOLOGY}, num_nodes: 1, gpus_per_node: 1, inter_node: {{nics_per_node: 1}}}}
model: {{num_layers: 2, hidden_size: 256, num_attention_heads: 4, ffn_hidden_size: 704, seq_length: 256,
         vocab_size: 512, swiglu: true}}
training: {{global_batch_size: 1, attention: flash, optimizer_implementation: foreach{{extra}}}}
"""


def _step(tmp_path: Path, extra: str = "") -> tuple[float, float, Path]:
    path = tmp_path / f"s{abs(hash(extra))}.yaml"
    path.write_text(SCENARIO.replace("{extra}", extra))
    return (api.run(path).result["step_time_s"], api.run(path, fidelity="closed_form").result["step_time_s"], path)


def test_the_attention_half_replayed_costs_its_kernels_at_the_graphs_gap_and_one_call_per_replay(tmp_path):
    engine, closed, path = _step(tmp_path, ", cuda_graph_scope: [attn]")
    assert closed == pytest.approx(engine, rel=1e-9)
    sc = api.load_scenario(path)
    model = resolve_model(sc.spec.model)
    cfg = step_config_of(sc.spec, sc.topology, model)
    gpu, host, eff = toy_gpu(), host_overhead(toy_gpu()), compute_efficiency(toy_gpu())
    graph_eff = dataclasses.replace(eff, launch_overhead_s=eff.graph_launch_overhead_s)
    layer = layer_work(model, attention="flash")
    copy = layer.graph_input
    copy_gpu, copy_host = kernel_time_s(gpu, copy, "bf16", eff), host.issue_s(copy)

    def phase(kernels, scopes) -> float:
        # by hand: the attention part (one stretch: the forward's first kernels, the backward's last) is one replay
        gpu_s = issue = 0.0
        for k, tag in zip(kernels, scopes, strict=True):
            if tag == "attn":
                gpu_s += kernel_time_s(gpu, k, "bf16", graph_eff)
            else:
                gpu_s += kernel_time_s(gpu, k, "bf16", eff)
                issue += host.issue_s(k)
        return max(gpu_s + copy_gpu, issue + copy_host + host.op_s)

    assert layer.forward_scopes[0] == "attn" and layer.backward_scopes[-1] == "attn"
    layers = model.num_layers * (phase(layer.forward, layer.forward_scopes)
                                 + phase(layer.backward, layer.backward_scopes))
    cost = chunk_cost(cfg, ((0, model.num_layers),), True, True)
    eager = step_config_of(api.load_scenario(_step(tmp_path)[2]).spec, sc.topology, model)
    eager_cost = chunk_cost(eager, ((0, model.num_layers),), True, True)

    def issued(kernels) -> float:
        return host.run_time_s(kernels_time_s(gpu, kernels, "bf16", eff), kernels)

    eager_layers = model.num_layers * (issued(layer.forward) + issued(layer.backward))
    # the embedding, head and loss stay eager: the chunk differs from the eager one by the layers' difference alone
    assert cost.forward_s + cost.backward_s == pytest.approx(
        eager_cost.forward_s + eager_cost.backward_s - eager_layers + layers, rel=1e-12)
    opt = optimizer_step_kernels(cost.num_params, implementation="foreach", num_tensors=cost.num_tensors)
    assert engine == pytest.approx(cost.forward_s + cost.backward_s
                                   + host.run_time_s(kernels_time_s(gpu, opt, "bf16"), opt), rel=1e-9)


def test_replaying_every_part_sits_between_eager_and_the_whole_step_graphed(tmp_path):
    eager = _step(tmp_path)[0]
    parts = _step(tmp_path, ", cuda_graph_scope: [attn, mlp]")[0]
    whole = _step(tmp_path, ", cuda_graphs: true")[0]
    # a toy model's kernels last microseconds: the host is the bottleneck, so each replayed part saves its issue time;
    # the whole-step graph also replays the embedding, head and loss, without the per-replay input copies
    assert whole < parts < eager
    assert _step(tmp_path, ", cuda_graph_scope: [full]")[0] == pytest.approx(whole, rel=1e-12)
    assert _step(tmp_path, ", cuda_graph_scope: [full_iteration]")[0] == pytest.approx(whole, rel=1e-12)


def test_a_replay_is_one_call_and_one_copy_per_stretch():
    gpu, host = replayed_run([1.0, 2.0, 3.0, 4.0], [0.5] * 4, [True, True, False, True], [0.9, 1.9, 2.9, 3.9],
                             call_s=0.25, copy_s=0.1, copy_issue_s=0.05)
    assert gpu == pytest.approx([1.0, 1.9, 3.0, 4.0])  # copy + graphed, graphed, eager, copy + graphed
    assert host == pytest.approx([0.3, 0.0, 0.5, 0.3])


def test_scopes_name_the_parts_of_megatrons_layers():
    assert graph_tags(["attn", "moe_router", "moe_preprocess"]) == {"attn", "moe_router"}
    assert graph_tags(["moe"]) == {"moe_router", "moe_experts"}
    assert graph_tags(None) == frozenset()
    moe = resolve_model(ModelSpec.model_validate(dict(num_layers=1, hidden_size=256, num_attention_heads=4,
                                                      ffn_hidden_size=512, seq_length=128, vocab_size=512,
                                                      swiglu=True, num_experts=8, moe_router_topk=2)))
    work = layer_work(moe, attention="flash")
    names = dict(zip((k.name for k in work.forward), work.forward_scopes, strict=True))
    assert names["qkv"] == "attn" and names["router"] == "moe_router" and names["expert_fc1"] == "moe_experts"
    backward = dict(zip((k.name for k in work.backward), work.backward_scopes, strict=True))
    assert backward["router_weight_grad"] == "moe_router" and backward["expert_fc1_weight_grad"] == "moe_experts"
    assert backward["qkv_weight_grad"] == "attn"


@pytest.mark.parametrize(("scopes", "model", "fix"), [
    ("[moe_preprocess]", "moe", "add moe_router"),
    ("[moe, moe_router]", "moe", "keep one of moe and moe_router"),
    ("[moe_router]", "dense", "use attn and mlp"),
    ("[moe]", "moe", "moe_expert_capacity_factor"),
    ("[full, attn]", "dense", "keep full alone"),
    ("[attention]", "dense", "cuda_graph_scope"),
])
def test_scopes_megatron_refuses_are_refused(tmp_path, cli, scopes, model, fix):
    text = SCENARIO.replace("{extra}", f", cuda_graph_scope: {scopes}")
    if model == "moe":
        text = text.replace("swiglu: true}", "swiglu: true, num_experts: 4, moe_router_topk: 2}")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code, out, err = cli("run", str(path), "--fidelity", "closed_form")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("error: ") and "cuda_graph_scope" in err and fix in err
