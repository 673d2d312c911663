"""A routed expert's fc2 bias as Megatron-Core's TEGroupedMLP adds it (simdist.plan.moe_bias): per local expert, in
eager PyTorch, weighted by the router probability; counted by hand on tiny shapes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from simdist.plan.expert_parallel import ExpertParallel
from simdist.plan.layer_cost import layer_work
from simdist.plan.model import Model
from simdist.plan.model_presets import resolve_model
from simdist.plan.moe_bias import fc2_bias_kernels
from simdist.spec.scenario import ModelSpec
from tests.cli_harness import run_cli

# h 64, 8 experts of width 128, top-2, 128 tokens, every layer MoE
TINY = Model("tiny-moe", "decoder", num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=4,
             ffn_hidden_size=256, seq_length=128, vocab_size=1000, swiglu=True, num_experts=8, moe_router_topk=2,
             moe_ffn_hidden_size=128)
BIASED = dataclasses.replace(TINY, add_bias_linear=True)


def _bytes(kernels) -> float:
    return sum(k.hbm_bytes for k in kernels)


def test_fp32_probabilities_make_the_chain_fp32_and_cast_it_back():
    # 2 experts of 3 rows, h 4, bf16 outputs, fp32 probabilities (w = 4): 12 elements an expert, 24 in all
    fwd, bwd = fc2_bias_kernels(3, 2, 4, 2, 4)
    # forward, per expert: b x p written (4 B + the row's probability read, 4 B over 4 columns) and t + b p (2 + 4 +
    # 4 B); then one cat of the 24 fp32 sums (4 + 4 B) and one cast back to bf16 (4 + 2 B)
    assert [k.name for k in fwd] == ["expert_fc2_bias_scale", "expert_fc2_bias_add"] * 2 + [
        "expert_fc2_bias_cat", "expert_fc2_bias_cast"]
    assert _bytes(fwd) == 2 * (12 * 5 + 12 * 10) + 24 * 8 + 24 * 6 == 696
    # backward: the cast's gradient (2 + 4 B); per expert t's gradient cast to bf16 (4 + 2), d(bp) x p (4 + 4 + 1),
    # its sum over the rows (4), b's [4] gradient cast (4 + 2), d(bp) x b (4 + 4), its sum over h (4); the t
    # gradients concatenated (2 + 2 B) and the 6 probability gradients (4 + 4 B each)
    assert len(bwd) == 6 * 2 + 3
    assert _bytes(bwd) == 24 * 6 + 2 * (12 * 6 + 12 * 9 + 12 * 4 + 4 * 6 + 12 * 8 + 12 * 4) + 24 * 4 + 6 * 8 == 1080
    # the ops between bf16 and fp32 are eager casts (priced at eager_cast_share), the fp32-only ones are not
    casts = {k.name for k in (*fwd, *bwd) if k.eager_cast}
    assert casts == {"expert_fc2_bias_" + n for n in ("scale", "add", "cast", "cast_grad", "add_grad", "bias_cast")}


def test_bf16_probabilities_keep_the_chain_in_bf16_without_casts():
    # w = 2: no promotion, no cast back, no gradient casts
    fwd, bwd = fc2_bias_kernels(3, 2, 4, 2, 2)
    assert len(fwd) == 2 * 2 + 1 and len(bwd) == 4 * 2 + 2
    assert _bytes(fwd) == 2 * (12 * 2.5 + 12 * 6) + 24 * 4 == 300
    assert _bytes(bwd) == 2 * (12 * 4.5 + 12 * 2 + 12 * 4 + 12 * 2) + 24 * 4 + 6 * 4 == 420
    assert not any(k.eager_cast for k in (*fwd, *bwd))
    # per element of the experts' output: 12 B forward and 16 B backward, as the module docstring counts
    big_f, big_b = fc2_bias_kernels(4096, 4, 2880, 2, 2)
    elements = 4096 * 4 * 2880
    assert _bytes(big_f) / elements == pytest.approx(12, rel=1e-3)
    assert _bytes(big_b) / elements == pytest.approx(16, rel=1e-3)


def test_an_moe_layer_with_biases_runs_the_chain_on_its_busiest_ranks_rows():
    # ep 4: 2 local experts, a balanced rank's 256 rows, 128 an expert; imbalance 2: 256 an expert
    plain = layer_work(TINY, layer=1, attention="flash", experts=ExpertParallel(ep=4))
    work = layer_work(BIASED, layer=1, attention="flash", experts=ExpertParallel(ep=4, imbalance=2.0))
    names = [k.name for k in work.forward]
    assert not any(k.name.startswith("expert_fc2_bias") for k in (*plain.forward, *plain.backward))
    # after fc2's grouped GEMM, before the combine; its backward before fc2's gradients
    i = names.index("expert_fc2")
    assert names[i + 1:i + 6] == ["expert_fc2_bias_scale", "expert_fc2_bias_add"] * 2 + ["expert_fc2_bias_cat"]
    bwd = [k.name for k in work.backward]
    assert bwd.index("expert_fc2_bias_split_grad") < bwd.index("expert_fc2_input_grad")
    (cat,) = [k for k in work.forward if k.name == "expert_fc2_bias_cat"]
    assert cat.hbm_bytes == 2 * 256 * 64 * 4  # bf16 probabilities: 512 rows x 64 read and written at 2 B
    # model FLOPs count the balanced rows only; the busiest rank executes twice them
    assert cat.flops == 0 and work.model_flops == layer_work(
        BIASED, layer=1, attention="flash", experts=ExpertParallel(ep=4)).model_flops
    # one GEMM per expert (SequentialMLP, moe_grouped_gemm false) has no chain
    seq = layer_work(BIASED, layer=1, attention="flash", experts=ExpertParallel(ep=4, grouped_gemm=False))
    assert not any(k.name.startswith("expert_fc2_bias") for k in seq.forward)
    # the chain is the experts' (Megatron's mlp node) and recomputed with the moe module, not moe_act
    redo = layer_work(BIASED, layer=1, attention="flash", experts=ExpertParallel(ep=4), recompute="selective",
                      recompute_modules=("moe_act",))
    assert not any(k.name.startswith("expert_fc2_bias") for k in redo.recompute)


def test_the_router_dtype_sets_the_probabilities_bytes():
    assert ExpertParallel().prob_bytes(2) == 2 and ExpertParallel().prob_bytes(4) == 4
    assert ExpertParallel(router_dtype="fp32").prob_bytes(2) == 4
    assert ExpertParallel(router_dtype="fp64").prob_bytes(2) == 8
    fp32 = layer_work(BIASED, layer=1, attention="flash", experts=ExpertParallel(ep=4, router_dtype="fp32"))
    assert "expert_fc2_bias_cast" in [k.name for k in fp32.forward]


def test_gpt_oss_carries_biases_and_other_presets_do_not():
    assert resolve_model(ModelSpec(preset="gpt-oss-120b")).add_bias_linear
    assert not resolve_model(ModelSpec(preset="qwen3-30b-a3b")).add_bias_linear
    assert resolve_model(ModelSpec(preset="qwen3-30b-a3b", add_bias_linear=True)).add_bias_linear


def test_gpt_oss_hf_config_has_biases(tmp_path):
    cfg = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "num_hidden_layers": 2,
           "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 256, "num_local_experts": 8,
           "num_experts_per_tok": 2, "hidden_act": "silu", "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert resolve_model(ModelSpec(hf_config=path)).add_bias_linear
    cfg["model_type"], cfg["architectures"] = "qwen3_moe", ["Qwen3MoeForCausalLM"]
    path.write_text(json.dumps(cfg))
    assert not resolve_model(ModelSpec(hf_config=path)).add_bias_linear


@pytest.mark.parametrize("field, value", [("moe_router_dtype", "fp32"), ("moe_router_fusion", "true")])
def test_a_router_setting_on_a_dense_model_is_one_clear_error(tmp_path, field, value):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("cluster: {preset: dgx-h100, num_nodes: 1}\nmodel: {preset: gpt3-175b, num_layers: 2}\n"
                        "parallel: {tp: 8}\ntraining: {micro_batch_size: 1, global_batch_size: 8, "
                        f"{field}: {value}}}\n")
    result = run_cli(["run", str(scenario)])
    assert result.one_line_error() and f"training.{field}" in result.err
