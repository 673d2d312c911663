"""Mixture-of-experts, MLA and sliding-window models: parameter counts (closed forms and the published totals),
the checks of their fields, and their Hugging Face configs (tests/fixtures/hf/, the published config.json keys).
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.errors import SpecError
from simdist.plan.model import Model
from simdist.plan.model_presets import resolve_model
from simdist.spec import ModelSpec
from tests.cli_harness import REPO, run_cli

HF = REPO / "tests" / "fixtures" / "hf"
MOE_PRESETS = ("mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b")


def _model(**fields_) -> Model:
    return resolve_model(ModelSpec.model_validate(fields_))


def _within_last_digit(value: float, published: str) -> bool:
    """``value`` (in billions) is the published figure rounded or truncated at its last digit: published - u/2 <=
    value < published + u (u one unit of that digit; model cards round, some truncate)."""
    figure = float(published)
    unit = 10.0 ** -(len(published.split(".")[1]) if "." in published else 0)
    return figure - unit / 2 <= value < figure + unit


# (preset, total, active, does the published active figure count the input embedding)
#   Mixtral 8x7B: 46.7B total, 12.9B per token (Mistral AI, "Mixtral of experts", 2023-12-11; 12.9B includes both
#     embeddings: without the input one it would be 12.75B).
#   Mixtral 8x22B: 141B / 39B active (Mistral AI, "Cheaper, Better, Faster, Stronger", 2024-04-17).
#   DeepSeek-V3: 671B main model; 36.6B activated "including 0.9B for the output head" (deepseek-ai/DeepSeek-V3
#     README_WEIGHTS.md), the report's 37B (arXiv:2412.19437 abstract): the input embedding is not counted.
#   Qwen3-30B-A3B: 30.5B / 3.3B activated (Qwen/Qwen3-30B-A3B model card; 3.35B with both embeddings, truncated).
#   Qwen3-235B-A22B: 235B / 22B activated (Qwen/Qwen3-235B-A22B model card).
#   GPT-OSS-120B: 116.8B / 5.1B active (OpenAI gpt-oss model card, arXiv:2508.10925, Table 1: the unembedding is
#     counted as active, the embedding not); biases and sinks, not modelled, are ~0.04B of the total.
PUBLISHED = [
    ("mixtral-8x7b", "46.7", "12.9", True),
    ("mixtral-8x22b", "141", "39", True),
    ("deepseek-v3", "671", "36.6", False),
    ("qwen3-30b-a3b", "30.5", "3.3", True),
    ("qwen3-235b-a22b", "235", "22", True),
    ("gpt-oss-120b", "116.8", "5.1", False),
]


@pytest.mark.parametrize(("name", "total", "active", "with_input_embedding"), PUBLISHED)
def test_total_and_active_parameters_match_the_published_figures(name, total, active, with_input_embedding):
    m = _model(preset=name)
    counted = m.num_active_params - (0 if with_input_embedding else m.vocab_size * m.hidden_size)
    assert _within_last_digit(m.num_params / 1e9, total), m.num_params
    assert _within_last_digit(counted / 1e9, active), counted


def test_published_conventions_and_the_mtp_module():
    ds = _model(preset="deepseek-v3")
    assert _within_last_digit((ds.num_active_params - ds.vocab_size * ds.hidden_size) / 1e9, "37")
    # README_WEIGHTS.md: the MTP module has 11.5B unique parameters (the embedding and head are shared). Ours:
    # its MoE layer 11.51B + eh_proj 2h x h 0.10B + norms = 11.61B, within 1%; num_params leaves it out (671B).
    assert ds.mtp_params == pytest.approx(11.5e9, rel=0.01)
    assert ds.mtp_params == 2 * 7168 + 2 * 7168 * 7168 + ds.layer_params(60) + 7168
    # Qwen's model cards: non-embedding 29.9B and 234B.
    for name, non_embedding in (("qwen3-30b-a3b", "29.9"), ("qwen3-235b-a22b", "234")):
        m = _model(preset=name)
        assert _within_last_digit((m.num_params - m.embedding_params) / 1e9, non_embedding)


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_the_published_config_json_gives_the_preset(name):
    preset = _model(preset=name)
    read = _model(hf_config=HF / name / "config.json", seq_length=preset.seq_length)
    assert {f.name: getattr(read, f.name) for f in fields(Model)} == {f.name: getattr(preset, f.name)
                                                                      for f in fields(Model)}
    assert (read.num_params, read.num_active_params) == (preset.num_params, preset.num_active_params)


# ------------------------------------------------------------------ closed forms on tiny models
def test_gqa_qk_norm_and_expert_counts_by_hand():
    # h 64, 4 heads of 32 (q 128), 2 KV groups (kv 64), RMSNorm (SwiGLU, no biases)
    m = Model("t", "decoder", 2, 64, 4, 2, 96, 16, 100, swiglu=True, kv_channels=32, qk_layernorm=True,
              num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=48, moe_shared_expert_intermediate_size=24)
    assert m.attention_params == 64 * (128 + 2 * 64) + 128 * 64 + 2 * 32 + 64
    assert (m.expert_params, m.shared_expert_params, m.router_params) == (3 * 64 * 48, 3 * 64 * 24, 64 * 8)
    moe = 64 + 64 * 8 + 8 * 3 * 64 * 48 + 3 * 64 * 24
    assert m.layer_params(0) == m.layer_params(1) == m.attention_params + moe == m.params_per_layer
    assert m.layer_active_params(1) == m.attention_params + 64 + 64 * 8 + 2 * 3 * 64 * 48 + 3 * 64 * 24
    assert m.num_params == 2 * m.layer_params(0) + 2 * 100 * 64 + 64
    assert m.num_active_params == 2 * m.layer_active_params(0) + 2 * 100 * 64 + 64
    # Megatron-LM's defaults: top-2, expert width = ffn_hidden_size
    d = Model("d", "decoder", 2, 64, 4, 4, 96, 16, 100, num_experts=4)
    assert (d.moe_router_topk, d.moe_ffn_hidden_size) == (2, 96)


def test_mla_by_hand_and_deepseek_v3_attention():
    # h 64, 2 heads, q latent 16, kv latent 8, d 4 + r 2 for Q/K, v 3; latent RMSNorms under qk_layernorm
    m = Model("t", "decoder", 1, 64, 2, 2, 96, 16, 100, swiglu=True, multi_latent_attention=True, q_lora_rank=16,
              kv_lora_rank=8, qk_head_dim=4, qk_pos_emb_head_dim=2, v_head_dim=3, qk_layernorm=True)
    q = 64 * 16 + 16 * 2 * (4 + 2)
    kv = 64 * (8 + 2) + 8 * 2 * (4 + 3)
    assert m.attention_params == q + kv + 2 * 3 * 64 + (16 + 8) + 64
    direct = Model("t", "decoder", 1, 64, 2, 2, 96, 16, 100, swiglu=True, multi_latent_attention=True,
                   kv_lora_rank=8, qk_head_dim=4, qk_pos_emb_head_dim=2, v_head_dim=3)
    assert direct.attention_params == 64 * 2 * 6 + kv + 2 * 3 * 64 + 64
    ds = _model(preset="deepseek-v3")  # q_a 7168x1536, q_b 1536x128x192, kv_a 7168x576, kv_b 512x128x256, o
    assert ds.attention_params == (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
                                   + 1536 + 512 + 7168)
    assert ds.moe_layer_flags() == (False,) * 3 + (True,) * 58
    assert ds.layer_params(0) == ds.attention_params + 3 * 7168 * 18432 + 7168
    with pytest.raises(ValueError, match="layer_params"):
        _ = ds.params_per_layer  # layers differ: no one count


def test_dense_gpt_layer_is_still_narayanan_eq_2():
    h = 64
    gpt = Model("g", "decoder", 3, h, 4, 4, 4 * h, 16, 100)
    assert gpt.params_per_layer == 12 * h * h + 13 * h == gpt.attention_params + gpt.dense_mlp_params
    assert gpt.num_active_params == gpt.num_params == 3 * (12 * h * h + 13 * h) + 100 * h * 2 + 2 * h
    assert (gpt.expert_params, gpt.router_params, gpt.mtp_params) == (0, 0, 0)


def test_window_and_moe_layer_patterns_follow_megatron():
    base = dict(num_layers=6, hidden_size=64, num_attention_heads=4, seq_length=64, vocab_size=100)
    # is_layer_window_attention: layer_number (1-based) % k != 0 windowed; list entries 1 = sliding window
    assert _model(**base, window_size=8, window_attn_skip_freq=2).window_layer_flags() == (True, False) * 3
    assert _model(**base, window_size=8).window_layer_flags() == (True,) * 6
    assert _model(**base, window_size=8, window_attn_skip_freq=[1, 1, 0, 0, 1, 0]).window_layer_flags() == (
        True, True, False, False, True, False)
    assert _model(**base).window_layer_flags() == (False,) * 6
    # moe_layer_pattern: layer i MoE where i % k == 0
    assert _model(**base, num_experts=4, moe_layer_freq=3).moe_layer_flags() == (True, False, False) * 2
    oss = _model(preset="gpt-oss-120b")
    assert oss.window_layer_flags()[:4] == (True, False, True, False) and sum(oss.window_layer_flags()) == 18


@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 6), experts=st.integers(2, 16), topk=st.integers(1, 16), shared=st.integers(0, 64),
       swiglu=st.booleans(), tied=st.booleans(), freq=st.integers(1, 4))
def test_active_never_exceeds_total_and_both_sum_the_layers(layers, experts, topk, shared, swiglu, tied, freq):
    m = Model("p", "decoder", layers, 32, 4, 2, 64, 8, 50, swiglu=swiglu, tied_embeddings=tied,
              num_experts=experts, moe_router_topk=min(topk, experts), moe_ffn_hidden_size=16,
              moe_shared_expert_intermediate_size=shared, moe_layer_freq=freq)
    rest = m.embedding_params + m.final_norm_params
    assert m.num_params == sum(m.layer_params(i) for i in range(layers)) + rest
    assert m.num_active_params == sum(m.layer_active_params(i) for i in range(layers)) + rest
    gap = (experts - m.moe_router_topk) * m.expert_params * sum(m.moe_layer_flags())
    assert m.num_params - m.num_active_params == gap >= 0


# ------------------------------------------------------------------ field checks
TINY = dict(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=64, vocab_size=100)


@pytest.mark.parametrize(("extra", "field"), [
    ({"num_experts": 4, "moe_router_topk": 5}, "model.moe_router_topk"),
    ({"moe_router_topk": 2}, "model.moe_router_topk"),
    ({"moe_ffn_hidden_size": 32}, "model.moe_ffn_hidden_size"),
    ({"moe_layer_freq": 2}, "model.moe_layer_freq"),
    ({"num_experts": 4, "moe_layer_freq": [1, 0, 1]}, "model.moe_layer_freq"),
    ({"num_experts": 4, "moe_layer_freq": [0, 0, 0, 0]}, "model.moe_layer_freq"),
    ({"multi_latent_attention": True, "qk_head_dim": 16, "v_head_dim": 16}, "model.kv_lora_rank"),
    ({"multi_latent_attention": True, "kv_lora_rank": 8, "v_head_dim": 16}, "model.qk_head_dim"),
    ({"multi_latent_attention": True, "kv_lora_rank": 8, "qk_head_dim": 16}, "model.v_head_dim"),
    ({"multi_latent_attention": True, "kv_lora_rank": 8, "qk_head_dim": 16, "v_head_dim": 16,
      "num_query_groups": 2}, "model.num_query_groups"),
    ({"kv_lora_rank": 8}, "model.kv_lora_rank"),
    ({"window_attn_skip_freq": 2}, "model.window_attn_skip_freq"),
    ({"window_size": 16, "window_attn_skip_freq": [1, 0]}, "model.window_attn_skip_freq"),
])
def test_contradicting_fields_are_one_error_naming_the_field(extra, field):
    with pytest.raises(SpecError) as err:
        _model(**TINY, **extra)
    assert err.value.field == field and err.value.fix, err.value


def test_a_preset_override_that_breaks_its_layer_list_is_named():
    with pytest.raises(SpecError, match="lists 61 layers") as err:
        _model(preset="deepseek-v3", num_layers=4)
    assert err.value.field == "model.moe_layer_freq"
    with pytest.raises(SpecError) as err:
        _model(kind="mlp", num_layers=2, hidden_size=64, num_experts=4)
    assert err.value.field == "model.num_experts"


# ------------------------------------------------------------------ Hugging Face configs
def _config(tmp_path: Path, **keys) -> Path:
    doc = {"model_type": "qwen3_moe", "hidden_act": "silu", "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 6, "intermediate_size": 96,
           "max_position_embeddings": 64, "vocab_size": 100, "num_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, "tie_word_embeddings": False, **keys}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in doc.items() if v is not None}))
    return path


def test_hf_layer_patterns_as_transformers_builds_them(tmp_path):
    # Qwen3MoeDecoderLayer: MoE where i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    m = _model(hf_config=_config(tmp_path, decoder_sparse_step=2, mlp_only_layers=[3]))
    assert m.moe_layer_flags() == (False, True, False, False, False, True) and m.qk_layernorm
    assert m.layer_params(0) - m.layer_params(1) == m.dense_mlp_params - m.moe_mlp_params
    # DeepseekV3DecoderLayer: MoE where i >= first_k_dense_replace and i % moe_layer_freq == 0
    m = _model(hf_config=_config(tmp_path, model_type="deepseek_v3", first_k_dense_replace=1, moe_layer_freq=2,
                                 n_shared_experts=2))
    assert m.moe_layer_flags() == (False, False, True, False, True, False)
    assert m.moe_shared_expert_intermediate_size == 2 * 32 and not m.qk_layernorm
    # Qwen's use_sliding_window: layers i >= max_window_layers windowed; Mistral's sliding_window: every layer
    m = _model(hf_config=_config(tmp_path, use_sliding_window=True, sliding_window=16, max_window_layers=4))
    assert m.window_size == 16 and m.window_layer_flags() == (False,) * 4 + (True,) * 2
    m = _model(hf_config=_config(tmp_path, model_type="mixtral", num_experts=None, num_local_experts=8,
                                 moe_intermediate_size=None, sliding_window=16))
    assert m.window_layer_flags() == (True,) * 6 and m.moe_ffn_hidden_size == 96 and m.moe_layer_freq == 1


@pytest.mark.parametrize(("keys", "field"), [
    ({"num_experts_per_tok": None}, "model.hf_config.num_experts_per_tok"),
    ({"num_experts_per_tok": 9}, "model.hf_config.num_experts_per_tok"),
    ({"moe_layer_freq": [0, 1, 1, 1, 1, 1]}, "model.hf_config.moe_layer_freq"),
    ({"layer_types": ["linear_attention"] * 6}, "model.hf_config.layer_types"),
    ({"mlp_only_layers": [0, 1, 2, 3, 4, 5]}, "model.hf_config.first_k_dense_replace"),
    ({"num_local_experts": 4}, "model.hf_config.num_experts"),
    ({"hybrid_override_pattern": "M-M*"}, "model.hf_config.hybrid_override_pattern"),
    ({"text_config": {"num_experts": 8}}, "model.hf_config.text_config"),
    ({"num_experts": 100000}, "model.hf_config.num_experts"),
])
def test_hf_keys_that_would_be_misread_are_refused(tmp_path, keys, field):
    with pytest.raises(SpecError) as err:
        _model(hf_config=_config(tmp_path, **keys))
    assert err.value.field == field, err.value


def test_an_unmodelled_config_key_is_exit_2_through_simdist_run(tmp_path):
    _config(tmp_path, attention_chunk_size=8192)
    (tmp_path / "s.yaml").write_text("cluster: {preset: dgx-a100, num_nodes: 1}\nmodel: {hf_config: config.json}\n"
                                     "parallel: {dp: 8}\ntraining: {global_batch_size: 8, micro_batch_size: 1}\n")
    r = run_cli(["run", tmp_path / "s.yaml"])
    assert r.one_line_error() and "model.hf_config.attention_chunk_size" in r.err and "s.yaml" in r.err, r.err


def test_a_run_reports_total_and_active_parameters(tmp_path):
    (tmp_path / "s.yaml").write_text(
        "cluster: {preset: dgx-a100, num_nodes: 1}\nparallel: {tp: 2, pp: 2, dp: 2}\n"
        "model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4, seq_length: 128, vocab_size: 1024, "
        "num_experts: 8, moe_router_topk: 2, swiglu: true}\ntraining: {global_batch_size: 8, micro_batch_size: 1}\n")
    r = run_cli(["run", tmp_path / "s.yaml", "--fidelity", "closed_form", "--json"])
    assert r.code == 0, r.err
    m = _model(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=128, vocab_size=1024, num_experts=8,
               moe_router_topk=2, swiglu=True)
    reported = json.loads(r.out)["model"]
    assert (reported["num_params"], reported["num_active_params"]) == (m.num_params, m.num_active_params)
    assert m.num_params - m.num_active_params == 4 * 6 * m.expert_params
