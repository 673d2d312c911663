"""torch.compile (the compiled kernel style: simdist.plan.elementwise) and CUDA graphs (no host launch per kernel, the
graph's gap between kernels): a one-GPU step is the sum of its kernels as each mechanism issues them, in both
fidelities."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from simdist import api
from simdist.hardware.compute import compute_efficiency, kernels_time_s
from simdist.hardware.host import host_overhead
from simdist.plan.chunk_cost import chunk_cost
from simdist.plan.layer_cost import embedding_work, head_work, layer_work
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.optimizer import optimizer_step_kernels
from tests.conftest import TOY_TOPOLOGY, toy_gpu

SCENARIO = f"""
cluster: {{file: {TOY_TOPOLOGY}, num_nodes: 1, gpus_per_node: 1, inter_node: {{nics_per_node: 1}}}}
model: {{num_layers: 2, hidden_size: 256, num_attention_heads: 4, ffn_hidden_size: 704, seq_length: 256,
         vocab_size: 512, swiglu: true}}
training: {{global_batch_size: 1, attention: flash, kernel_fusion: eager, compile: {{compile}},
           cuda_graphs: {{graphs}}, optimizer_implementation: foreach}}
"""


def _run(tmp_path: Path, compile: bool, graphs: bool):
    path = tmp_path / f"{compile}-{graphs}.yaml"
    path.write_text(SCENARIO.replace("{compile}", str(compile).lower()).replace("{graphs}", str(graphs).lower()))
    engine = api.run(path).result["step_time_s"]
    closed = api.run(path, fidelity="closed_form").result["step_time_s"]
    return path, engine, closed


def _hand(path: Path, style: str, graphs: bool) -> float:
    sc = api.load_scenario(path)
    model = resolve_model(sc.spec.model)
    cost = chunk_cost(step_config_of(sc.spec, sc.topology, model), ((0, model.num_layers),), True, True)
    gpu = toy_gpu()
    host = host_overhead(gpu)
    eff = compute_efficiency(gpu)
    if graphs:
        eff = dataclasses.replace(eff, launch_overhead_s=eff.graph_launch_overhead_s)

    def issued(kernels) -> float:
        gpu_s = kernels_time_s(gpu, kernels, "bf16", eff)
        return gpu_s if graphs else host.kernels_time_s(gpu_s, len(kernels))

    layer = layer_work(model, attention="flash", style=style)
    head, emb = head_work(model, tp=1, style=style), embedding_work(model, tp=1, style=style)
    total = model.num_layers * (issued(layer.forward) + issued(layer.backward))
    total += sum(issued(w.forward) + issued(w.backward) for w in (head, emb))
    # the optimizer is never graphed (Megatron-LM's full-iteration graph leaves it out): the host issues its kernels
    opt = optimizer_step_kernels(cost.num_params, implementation="foreach", num_tensors=cost.num_tensors)
    return total + host.kernels_time_s(kernels_time_s(gpu, opt, "bf16"), len(opt))


@pytest.mark.parametrize(("compile", "graphs"), [(False, False), (True, False), (False, True), (True, True)])
def test_a_one_gpu_step_is_its_kernels_as_issued(tmp_path, compile, graphs):
    path, engine, closed = _run(tmp_path, compile, graphs)
    hand = _hand(path, "compiled" if compile else "eager", graphs)
    assert closed == pytest.approx(engine, rel=1e-9)
    assert engine == pytest.approx(hand, rel=1e-9)


def test_each_mechanism_saves_time(tmp_path):
    times = {(c, g): _run(tmp_path, c, g)[1] for c in (False, True) for g in (False, True)}
    assert times[(True, False)] < times[(False, False)]  # fewer passes over memory
    assert times[(False, True)] < times[(False, False)]  # no host launches (this small model is host-bound)
    assert times[(True, True)] < min(times[(True, False)], times[(False, True)])
