"""Model presets and resolution: published sizes, overrides, Hugging Face config.json, errors."""

import json

import pytest

from simdist.errors import PresetError, SpecError
from simdist.plan.model_presets import model_presets, preset_source, resolve_model
from simdist.spec import ModelSpec
from simdist.spec.load import parse_yaml, validate


def _spec(**fields) -> ModelSpec:
    return ModelSpec.model_validate(fields)


def test_presets_are_listed_and_cited():
    assert set(model_presets()) == {"gpt3-175b", "megatron-530b", "megatron-1t", "llama3-8b", "llama3-70b",
                                    "llama3-405b", "cs336-mlp", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3",
                                    "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b"}
    for name in model_presets():
        assert preset_source(name)


@pytest.mark.parametrize(("name", "billions"), [("llama3-8b", 8.03), ("llama3-70b", 70.6), ("llama3-405b", 405.9)])
def test_llama3_parameter_counts(name, billions):
    # Dubey et al. 2024 (arXiv:2407.21783) / the released model cards: 8.03B, 70.6B, 405.9B, within 0.5%.
    model = resolve_model(_spec(preset=name))
    assert model.num_params == pytest.approx(billions * 1e9, rel=0.005)


def test_gpt3_and_1t_parameter_counts():
    # Narayanan et al. 2021 eq. (2), 12 l h^2 (1 + 13/12h + (V + s)/12lh): 174.6B for GPT-3 with learned
    # positions (s h = 25M, which Model does not count) and 1.008T for the 1T model (Table 1: "1008").
    gpt3 = resolve_model(_spec(preset="gpt3-175b"))
    assert gpt3.num_params + 2048 * 12288 == pytest.approx(174.6e9, rel=0.001)
    one_t = resolve_model(_spec(preset="megatron-1t"))
    assert one_t.num_params == pytest.approx(1008e9, rel=0.002)
    # 530B: Table 1 / Table 2 of Narayanan et al. 2021 say 529.6B (with learned positions, s h = 42M)
    mt = resolve_model(_spec(preset="megatron-530b"))
    assert mt.num_params + 2048 * 20480 == pytest.approx(529.6e9, rel=0.002)


def test_inline_fields_override_a_preset():
    model = resolve_model(_spec(preset="gpt3-175b", seq_length=4096, num_layers=48))
    assert (model.seq_length, model.num_layers, model.hidden_size) == (4096, 48, 12288)


def test_unknown_preset_lists_the_valid_names():
    with pytest.raises(PresetError, match="llama3-70b") as err:
        resolve_model(_spec(preset="gpt-5"))
    assert err.value.field == "model.preset"


def test_inline_decoder_defaults_and_inline_mlp():
    model = resolve_model(_spec(num_layers=2, hidden_size=64, num_attention_heads=4))
    assert (model.ffn_hidden_size, model.num_query_groups, model.kind) == (256, 4, "decoder")
    mlp = resolve_model(_spec(kind="mlp", num_layers=4, hidden_size=1024))
    assert (mlp.kind, mlp.seq_length, mlp.num_attention_heads) == ("mlp", 1, 0)
    assert mlp.num_params == 4 * (1024 * 1024 + 1024)
    lecture = resolve_model(_spec(preset="cs336-mlp"))
    assert (lecture.num_layers, lecture.hidden_size, lecture.kind) == (4, 1024, "mlp")


def test_inline_decoder_needs_heads_but_an_mlp_does_not():
    doc = parse_yaml("{num_layers: 2, hidden_size: 64}", "m.yaml")
    with pytest.raises(SpecError, match="num_attention_heads"):
        validate(ModelSpec, doc)
    assert validate(ModelSpec, parse_yaml("{kind: mlp, num_layers: 2, hidden_size: 64}", "m.yaml")).kind == "mlp"


def test_heads_must_divide_into_query_groups():
    with pytest.raises(SpecError, match="num_query_groups") as err:
        resolve_model(_spec(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=3))
    assert err.value.field == "model.num_query_groups"


LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
}


def test_hf_config_round_trip(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
    model = resolve_model(_spec(hf_config="config.json"), base_dir=tmp_path)
    preset = resolve_model(_spec(preset="llama3-8b"))
    fields = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
              "seq_length", "vocab_size", "swiglu", "tied_embeddings")
    assert {f: getattr(model, f) for f in fields} == {f: getattr(preset, f) for f in fields}
    assert model.num_params == preset.num_params
    # seq_length in the spec wins over max_position_embeddings; a GPT-2-like config is GELU, MHA, tied.
    assert resolve_model(_spec(hf_config=tmp_path / "config.json", seq_length=2048)).seq_length == 2048
    gpt = {k: v for k, v in LLAMA3_8B_CONFIG.items() if k not in ("num_key_value_heads", "tie_word_embeddings")}
    (tmp_path / "gpt.json").write_text(json.dumps({**gpt, "architectures": ["GPTNeoXForCausalLM"],
                                                   "model_type": "gpt_neox", "hidden_act": "gelu"}))
    other = resolve_model(_spec(hf_config=tmp_path / "gpt.json"))
    assert (other.swiglu, other.num_query_groups, other.tied_embeddings) == (False, 32, True)


def test_hf_config_errors_name_the_field_and_key(tmp_path):
    broken = {k: v for k, v in LLAMA3_8B_CONFIG.items() if k != "intermediate_size"}
    (tmp_path / "config.json").write_text(json.dumps(broken))
    with pytest.raises(SpecError, match="intermediate_size") as err:
        resolve_model(_spec(hf_config=tmp_path / "config.json"))
    assert err.value.field.startswith("model.hf_config")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SpecError, match="JSON") as err:
        resolve_model(_spec(hf_config=tmp_path / "bad.json"))
    assert err.value.field == "model.hf_config"
    with pytest.raises(SpecError, match="file not found"):
        resolve_model(_spec(hf_config=tmp_path / "missing.json"))
