"""YaRN's attention factor and the unfused RoPE Megatron-Core runs where it is not 1 (simdist.plan.model,
simdist.plan.elementwise ``rotary_unfused``): the factor by hand, the kernels by hand and as torch counts them."""

from __future__ import annotations

import collections
import dataclasses
import json
import math

import pytest

from simdist.errors import SpecError
from simdist.plan.layer_cost import layer_work
from simdist.plan.model import Model
from simdist.plan.model_presets import resolve_model
from simdist.spec.scenario import ModelSpec

# Llama-style: h 64, 4 query heads of 16, 2 KV heads, 128 tokens
TINY = Model("tiny", "decoder", num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
             ffn_hidden_size=128, seq_length=128, vocab_size=1000, swiglu=True)
YARN = dataclasses.replace(TINY, yarn_rotary_scaling_factor=32.0)


def test_the_attention_factor_is_yarns():
    assert TINY.rotary_concentration == 1.0
    assert YARN.rotary_concentration == pytest.approx(0.1 * math.log(32) + 1)  # 1.3466 (GPT-OSS)
    # DeepSeek-V3's mscale = mscale_all_dim = 1: the ratio is 1 (its RoPE stays fused)
    ds = dataclasses.replace(YARN, yarn_rotary_scaling_factor=40.0, yarn_mscale=1.0, yarn_mscale_all_dim=1.0)
    assert ds.rotary_concentration == 1.0
    odd = dataclasses.replace(ds, yarn_mscale=0.707)
    assert odd.rotary_concentration == pytest.approx((0.0707 * math.log(40) + 1) / (0.1 * math.log(40) + 1))
    assert dataclasses.replace(YARN, yarn_rotary_scaling_factor=1.0).rotary_concentration == 1.0
    # a given 0 is a value (Megatron-LM tests mscale_all_dim for None): 0.1 x 0 x ln(s) + 1 = 1 below the ratio
    zero = dataclasses.replace(ds, yarn_mscale=0.707, yarn_mscale_all_dim=0.0)
    assert zero.rotary_concentration == pytest.approx(0.0707 * math.log(40) + 1)
    assert resolve_model(ModelSpec(preset="gpt-oss-120b")).rotary_concentration == pytest.approx(1.3466, abs=1e-4)
    assert resolve_model(ModelSpec(preset="deepseek-v3")).rotary_concentration == 1.0


def _rope(work, backward: bool = False):
    return [k for k in (work.backward if backward else work.forward) if k.name.startswith("rotary")]


def test_yarn_runs_rope_op_by_op_on_q_then_k_under_megatron():
    plain, yarn = layer_work(TINY, attention="flash"), layer_work(YARN, attention="flash")
    # fused: one kernel over Q and K (64 + 32 wide x 128 tokens, read and written at 2 B)
    (fused,) = _rope(plain)
    assert fused.hbm_bytes == 128 * 96 * 4
    fwd, bwd = _rope(yarn), _rope(yarn, backward=True)
    assert len(fwd) == 2 * 12 and len(bwd) == 2 * 7  # per tensor: 6 small cos/sin kernels and 6 passes; 7 back
    # forward 12 a = 24 B an element of Q and K, backward 14 a = 28 B
    assert sum(k.hbm_bytes for k in fwd) == pytest.approx(128 * 96 * 24)
    assert sum(k.hbm_bytes for k in bwd) == pytest.approx(128 * 96 * 28)
    # eager (torchtitan) and compiled keep their own RoPE whatever the factor
    for style in ("eager", "compiled"):
        assert [k.name for k in _rope(layer_work(YARN, attention="flash", style=style))] == \
            [k.name for k in _rope(layer_work(TINY, attention="flash", style=style))]


KERNEL_OF = {"cos": "cos", "sin": "sin", "cos_scale": "mul", "sin_scale": "mul", "cos_cast": "copy_",
             "sin_cast": "copy_", "mul_cos": "mul", "neg": "neg", "rotate_cat": "cat", "mul_sin": "mul",
             "add": "add", "cat": "cat", "mul_sin_grad": "mul", "neg_grad": "neg", "chunk_grad": "cat",
             "mul_cos_grad": "mul", "grads_add": "add_", "slice_grad_zeros": "zero_", "slice_grads_add": "add_"}


def test_the_kernels_are_those_torch_runs():
    pytest.importorskip("torch")
    from validation.rope_ops import count

    forward, backward = count()
    yarn = layer_work(YARN, attention="flash")
    per_tensor = len(_rope(yarn)) // 2
    modelled_f = [KERNEL_OF[k.name.removeprefix("rotary_")] for k in _rope(yarn)[:per_tensor]]
    modelled_b = [KERNEL_OF[k.name.removeprefix("rotary_")] for k in _rope(yarn, backward=True)[:7]]
    assert collections.Counter(modelled_f) == collections.Counter(forward)
    assert collections.Counter(modelled_b) == collections.Counter(backward)


def test_yarn_fields_are_checked_and_read_from_hf_configs(tmp_path):
    with pytest.raises(SpecError, match="yarn_mscale is set without yarn_rotary_scaling_factor"):
        resolve_model(ModelSpec(preset="qwen3-30b-a3b", yarn_mscale=1.0))
    with pytest.raises(SpecError, match="learned positions"):
        resolve_model(ModelSpec(preset="gpt3-175b", yarn_rotary_scaling_factor=4.0))
    cfg = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "num_hidden_layers": 2,
           "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 256, "num_local_experts": 8,
           "num_experts_per_tok": 2, "hidden_act": "silu", "tie_word_embeddings": False,
           "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                            "original_max_position_embeddings": 4096}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    model = resolve_model(ModelSpec(hf_config=path))
    assert model.yarn_rotary_scaling_factor == 32.0 and model.rotary_concentration == pytest.approx(1.3466, abs=1e-4)
    cfg["rope_scaling"] = {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0}
    path.write_text(json.dumps(cfg))
    assert resolve_model(ModelSpec(hf_config=path)).rotary_concentration == 1.0
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}  # frequencies only: no cost
    path.write_text(json.dumps(cfg))
    assert resolve_model(ModelSpec(hf_config=path)).yarn_rotary_scaling_factor == 0.0
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": "big"}
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=r"rope_scaling\.factor"):
        resolve_model(ModelSpec(hf_config=path))
