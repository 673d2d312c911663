"""The clamp before a routed expert's gated activation as Megatron-Core runs it (simdist.plan.glu_clamp: GPT-OSS's
swiglu_limit): eager kernels between fc1 and the fused activation, counted by hand on tiny shapes and against the
kernels torch runs (validation.glu_clamp_ops)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from simdist.plan.activations import activation_bytes_per_layer
from simdist.plan.expert_parallel import ExpertParallel
from simdist.plan.glu_clamp import clamp_kernels
from simdist.plan.layer_cost import layer_work
from simdist.plan.model import Model
from simdist.plan.model_presets import resolve_model
from simdist.spec.scenario import ModelSpec
from tests.cli_harness import run_cli

# h 64, 8 experts of width 128, top-2, 128 tokens, every layer MoE
TINY = Model("tiny-moe", "decoder", num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=4,
             ffn_hidden_size=256, seq_length=128, vocab_size=1000, swiglu=True, num_experts=8, moe_router_topk=2,
             moe_ffn_hidden_size=128)
CLAMPED = dataclasses.replace(TINY, activation_func_clamp_value=7.0)
ATEN = {"gate": "clamp", "linear": "clamp", "cat": "cat", "zero": "scalar_tensor", "ge": "ge", "le": "le",
        "and": "logical_and_", "where": "where", "grad": "cat"}
"""simdist's kernel (by its last word) -> the ATen op torch runs for it."""


def _bytes(kernels) -> float:
    return sum(k.hbm_bytes for k in kernels)


def test_the_clamp_reads_and_writes_what_the_module_docstring_counts():
    # 10 rows, halves of 4: 40 elements a half, bf16
    fwd, bwd = clamp_kernels(40, 2)
    # two clamps (a half read and written: 2 + 2 B), the cat of both halves (80 elements, 2 + 2 B)
    assert [k.name for k in fwd] == ["expert_clamp_gate", "expert_clamp_linear", "expert_clamp_cat"]
    assert _bytes(fwd) == 40 * 4 + 40 * 4 + 80 * 4 == 16 * 40
    # the linear half's ge, le (2 + 1 B), logical_and (1 + 1 + 1), where (1 + 2 + 2); the gate's le and where; the
    # chunk's backward concatenates the two gradients (80 elements, 2 + 2 B); the fills move no bytes
    assert len(bwd) == 9
    assert _bytes(bwd) == 40 * (3 + 3 + 3 + 5) + 40 * (3 + 5) + 80 * 4 == 30 * 40
    assert all(k.kind == "memory" for k in (*fwd, *bwd))


def test_the_kernels_are_those_torch_runs():
    pytest.importorskip("torch")
    from validation.glu_clamp_ops import count

    forward, backward = count()
    fwd, bwd = clamp_kernels(40, 2)
    assert [ATEN[k.name.rsplit("_", 1)[-1]] for k in fwd] == forward
    assert [ATEN[k.name.rsplit("_", 1)[-1]] for k in bwd] == backward


def test_a_clamped_moe_layer_runs_the_clamp_between_fc1_and_the_activation():
    # ep 4: 2 local experts; a balanced rank receives as many rows as it sends, 128 tokens x top-2 = 256; imbalance
    # 2: 512
    plain = layer_work(TINY, layer=1, attention="flash", experts=ExpertParallel(ep=4))
    work = layer_work(CLAMPED, layer=1, attention="flash", experts=ExpertParallel(ep=4, imbalance=2.0))
    assert not any(k.name.startswith("expert_clamp") for k in (*plain.forward, *plain.backward))
    names = [k.name for k in work.forward]
    i = names.index("expert_fc1")
    assert names[i + 1:i + 5] == ["expert_clamp_gate", "expert_clamp_linear", "expert_clamp_cat", "expert_swiglu"]
    bwd = [k.name for k in work.backward]
    assert bwd.index("expert_swiglu_grad") < bwd.index("expert_clamp_split_grad") < bwd.index("expert_fc1_input_grad")
    # the busiest rank's 512 rows x 128 wide halves: 16 B an element forward, 30 backward
    fwd_clamp = [k for k in work.forward if k.name.startswith("expert_clamp")]
    bwd_clamp = [k for k in work.backward if k.name.startswith("expert_clamp")]
    assert _bytes(fwd_clamp) == 16 * 512 * 128 and _bytes(bwd_clamp) == 30 * 512 * 128
    # memory-bound kernels: model FLOPs are unchanged
    assert work.model_flops == layer_work(TINY, layer=1, attention="flash",
                                          experts=ExpertParallel(ep=4, imbalance=2.0)).model_flops


def test_moe_act_recompute_reruns_the_clamp_and_keeps_no_extra_copy():
    kw = {"layer": 1, "attention": "flash", "experts": ExpertParallel(ep=4)}
    redo = layer_work(CLAMPED, recompute="selective", recompute_modules=("moe_act",), **kw)
    assert [k.name for k in redo.recompute if k.name.startswith("expert_")] == [
        "expert_clamp_gate", "expert_clamp_linear", "expert_clamp_cat", "expert_swiglu"]
    # kept: fc1's output beside the clamped copy (256 rows x 256 x 2 B) unless moe_act is recomputed
    mem = {"layer": 1, "attention": "flash", "experts": ExpertParallel(ep=4)}
    assert activation_bytes_per_layer(CLAMPED, **mem) - activation_bytes_per_layer(TINY, **mem) == 256 * 256 * 2
    sel = {"recompute": "selective", "modules": ("moe_act",), **mem}
    assert activation_bytes_per_layer(CLAMPED, **sel) == activation_bytes_per_layer(TINY, **sel)


def test_gpt_oss_clamps_at_seven_from_its_preset_and_its_hf_config(tmp_path):
    assert resolve_model(ModelSpec(preset="gpt-oss-120b")).activation_func_clamp_value == 7.0
    assert resolve_model(ModelSpec(preset="qwen3-30b-a3b")).activation_func_clamp_value is None
    cfg = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "num_hidden_layers": 2,
           "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 256, "num_local_experts": 8,
           "num_experts_per_tok": 2, "hidden_act": "silu", "tie_word_embeddings": False, "swiglu_limit": 7.0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert resolve_model(ModelSpec(hf_config=path)).activation_func_clamp_value == 7.0
    # Hugging Face's name is an alias of the field
    assert resolve_model(ModelSpec.model_validate({"preset": "qwen3-30b-a3b", "swiglu_limit": 5})
                         ).activation_func_clamp_value == 5.0
    cfg["swiglu_limit"] = "seven"
    path.write_text(json.dumps(cfg))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"cluster: {{preset: dgx-h100, num_nodes: 1}}\nmodel: {{hf_config: {path}}}\n"
                        "parallel: {dp: 8, ep: 8}\ntraining: {micro_batch_size: 1, global_batch_size: 8}\n")
    result = run_cli(["run", str(scenario)])
    assert result.one_line_error() and "swiglu_limit" in result.err


@pytest.mark.parametrize(("model", "words"), [
    ("{preset: gpt3-175b, num_layers: 2, activation_func_clamp_value: 7}", "no experts"),
    ("{preset: qwen3-30b-a3b, num_layers: 2, swiglu: false, activation_func_clamp_value: 7}", "not gated"),
])
def test_a_clamp_where_no_gated_expert_runs_it_is_one_clear_error(tmp_path, model, words):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"cluster: {{preset: dgx-h100, num_nodes: 1}}\nmodel: {model}\n"
                        "parallel: {tp: 8}\ntraining: {micro_batch_size: 1, global_batch_size: 8}\n")
    result = run_cli(["run", str(scenario)])
    assert result.one_line_error() and "model.activation_func_clamp_value" in result.err and words in result.err
