"""torch.compile (the compiled kernel style: simdist.plan.elementwise) and CUDA graphs (no host launch per kernel, the
graph's gap between kernels): a one-GPU step is the sum of its kernels as each mechanism issues them, in both
fidelities. The loss is compiled only where the framework compiles it (training.compile_loss: torchtitan's
compile.components; simdist.plan.execution.loss_compiled)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from simdist import api
from simdist.hardware.compute import compute_efficiency, kernels_time_s
from simdist.hardware.host import host_overhead
from simdist.plan.chunk_cost import chunk_cost
from simdist.plan.layer_cost import layer_work
from simdist.plan.layout import step_config_of
from simdist.plan.model_ends import embedding_work, head_work
from simdist.plan.model_presets import resolve_model
from simdist.plan.optimizer import optimizer_step_kernels
from tests.conftest import TOY_TOPOLOGY, toy_gpu

SCENARIO = f"""
cluster: {{file: {TOY_TOPOLOGY}, num_nodes: 1, gpus_per_node: 1, inter_node: {{nics_per_node: 1}}}}
model: {{num_layers: 2, hidden_size: 256, num_attention_heads: 4, ffn_hidden_size: 704, seq_length: 256,
         vocab_size: 512, swiglu: true}}
training: {{global_batch_size: 1, attention: flash, kernel_fusion: eager, compile: {{compile}},
           cuda_graphs: {{graphs}}, optimizer_implementation: foreach, compile_loss: {{loss}}}}
"""


def _run(tmp_path: Path, compile: bool, graphs: bool, loss: bool | None = None):
    path = tmp_path / f"{compile}-{graphs}-{loss}.yaml"
    path.write_text(SCENARIO.replace("{compile}", str(compile).lower()).replace("{graphs}", str(graphs).lower())
                    .replace("{loss}", "null" if loss is None else str(loss).lower()))
    engine = api.run(path).result["step_time_s"]
    closed = api.run(path, fidelity="closed_form").result["step_time_s"]
    return path, engine, closed


def _hand(path: Path, style: str, graphs: bool, loss_style: str | None = None) -> float:
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
        return gpu_s if graphs else host.run_time_s(gpu_s, kernels)

    layer = layer_work(model, attention="flash", style=style)
    head, emb = head_work(model, tp=1, style=style, loss_style=loss_style), embedding_work(model, tp=1, style=style)
    total = model.num_layers * (issued(layer.forward) + issued(layer.backward))
    total += sum(issued(w.forward) + issued(w.backward) for w in (head, emb))
    # the optimizer is never graphed (Megatron-LM's full-iteration graph leaves it out): the host issues its kernels
    opt = optimizer_step_kernels(cost.num_params, implementation="foreach", num_tensors=cost.num_tensors)
    return total + host.run_time_s(kernels_time_s(gpu, opt, "bf16"), opt)


@pytest.mark.parametrize(("compile", "graphs", "loss"), [
    (False, False, None), (True, False, None), (False, True, None), (True, True, None),
    (True, False, True), (False, False, True), (True, True, True)])
def test_a_one_gpu_step_is_its_kernels_as_issued(tmp_path, compile, graphs, loss):
    # the scenario names no framework (Megatron-Core's way): compile covers the blocks, the loss stays eager unless
    # compile_loss says so (it may be compiled alone, as torchtitan's compile.components ["loss"] does)
    path, engine, closed = _run(tmp_path, compile, graphs, loss)
    hand = _hand(path, "compiled" if compile else "eager", graphs, "compiled" if loss else "eager")
    assert closed == pytest.approx(engine, rel=1e-9)
    assert engine == pytest.approx(hand, rel=1e-9)


def test_torchtitan_compiles_its_loss_with_the_model_and_the_others_do_not(tmp_path):
    from simdist.plan.execution import execution_of

    path = _run(tmp_path, True, False)[0]
    styles = {}
    for framework, loss in (("torchtitan", None), ("torchtitan", False), ("fsdp", None), ("composer", None),
                            ("fsdp", True)):
        sc = api.load_scenario(path, [f"training.framework={framework}",
                                      f"training.compile_loss={'null' if loss is None else str(loss).lower()}"])
        styles[(framework, loss)] = execution_of(sc.spec, 1).loss_style
    assert styles == {("torchtitan", None): "compiled", ("torchtitan", False): "eager", ("fsdp", None): "eager",
                      ("composer", None): "eager", ("fsdp", True): "compiled"}
    # an eager loss over the vocabulary costs more than a compiled one, by the loss kernels alone
    eager, compiled = _run(tmp_path, True, False, False), _run(tmp_path, True, False, True)
    assert eager[1] > compiled[1] and eager[2] > compiled[2]


def test_each_mechanism_saves_time(tmp_path):
    times = {(c, g): _run(tmp_path, c, g)[1] for c in (False, True) for g in (False, True)}
    assert times[(True, False)] < times[(False, False)]  # fewer passes over memory
    assert times[(False, True)] < times[(False, False)]  # no host launches (this small model is host-bound)
    assert times[(True, True)] < min(times[(True, False)], times[(False, True)])
