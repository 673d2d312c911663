"""Model presets and the resolution of a ``ModelSpec`` (preset, inline, or Hugging Face config.json) to a ``Model``.

The presets are data: one YAML file per model under ``models/`` at the top of the repository (shipped in the
wheel beside ``topologies/``), each value cited under the file's ``sources:``. A preset gives every field;
inline fields written beside ``preset`` override it (``{preset: gpt3-175b, seq_length: 4096}``). An inline model
fills what it omits with the GPT conventions of Megatron-LM (``ffn_hidden_size`` = 4 h, ``num_query_groups`` =
heads, ``seq_length`` 2048, ``vocab_size`` 51200 as in Narayanan et al. 2021). A ``hf_config`` is read with the
json module (no transformers import).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from simdist.errors import PresetError, SpecError
from simdist.plan.model import Model
from simdist.spec.preset_file import bundled_dir, read_preset
from simdist.spec.scenario import ModelSpec

MOE_FIELDS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
              "moe_layer_freq", "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
              "qk_pos_emb_head_dim", "v_head_dim", "qk_layernorm", "window_size", "window_attn_skip_freq",
              "mtp_num_layers")
"""ModelSpec fields of mixture-of-experts, MLA, QK-norm, sliding-window and MTP models (simdist.plan.model)."""
_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
           "vocab_size", "swiglu", "tied_embeddings", "kv_channels", *MOE_FIELDS)


def _tupled(fields: dict[str, Any]) -> dict[str, Any]:
    """Per-layer lists as tuples (Model is frozen and hashable)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}


def _load() -> dict[str, tuple[Model, str]]:
    """name -> (Model, source) from ``models/*.yaml``: the file name is the preset name, ``source`` its citation
    and ``sources`` that of every value (simdist.spec.preset_file). Every number is the source's."""
    presets: dict[str, tuple[Model, str]] = {}
    for path in sorted(bundled_dir("models").glob("*.yaml")):
        spec, _, doc = read_preset(path, ModelSpec, keep=("source",))
        source = doc.data.get("source")
        if not isinstance(source, str) or not source.strip():
            raise SpecError("a model preset needs 'source': the citation of its numbers", field="source",
                            source=str(path), fix="add 'source: <paper, table>'")
        written = _tupled({k: getattr(spec, k) for k in _FIELDS if getattr(spec, k) is not None})
        presets[path.stem] = (Model(path.stem, spec.kind or "decoder", **written), source)
    return presets


_PRESETS = _load()

# Llama-family Hugging Face model types / architectures whose `silu` MLP is gated (SwiGLU).
_GATED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "olmo", "phi3")


def model_presets() -> list[str]:
    """Names a scenario may write as ``model.preset``."""
    return sorted(_PRESETS)


def preset_source(name: str) -> str:
    """The citation of a preset's numbers."""
    return _preset(name)[1]


def _preset(name: str) -> tuple[Model, str]:
    try:
        return _PRESETS[name]
    except KeyError:
        raise PresetError(
            f"unknown model preset {name!r}; valid presets: {', '.join(model_presets())}",
            field="model.preset",
            fix=f"write one of {', '.join(model_presets())}, or describe the model inline",
        ) from None


_INLINE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
                  "seq_length", "vocab_size", "swiglu", "kind", "tied_embeddings", "kv_channels", *MOE_FIELDS)


def _written(spec: ModelSpec) -> dict[str, Any]:
    return _tupled({k: getattr(spec, k) for k in _INLINE_FIELDS if getattr(spec, k) is not None})


def resolve_model(spec: ModelSpec, *, base_dir: Path | None = None) -> Model:
    """The model a spec describes; ``base_dir`` resolves a relative ``hf_config`` path (the scenario's folder)."""
    if spec.preset is not None:
        base, _ = _preset(spec.preset)
        model = replace(base, **_written(spec))
    elif spec.hf_config is not None:
        path = spec.hf_config if spec.hf_config.is_absolute() or base_dir is None else base_dir / spec.hf_config
        model = replace(_from_hf_config(path, seq_length=spec.seq_length), **_written(spec))
    else:
        model = _inline(spec)
    return _checked(model)


def _inline(spec: ModelSpec) -> Model:
    given = _written(spec)
    kind = given.get("kind", "decoder")
    h = given.get("hidden_size")
    if kind == "mlp":
        # The lecture's MLP: square layers, no attention, one "token" per sample (Model docstring).
        return Model("inline-mlp", "mlp", num_layers=given["num_layers"], hidden_size=h)
    heads = given["num_attention_heads"]
    # Assumption: an inline decoder without these fields is a GPT of Megatron-LM's defaults: ffn 4h
    # (Vaswani et al. 2017 sec. 3.3; Brown et al. 2020 Table 2.1), multi-head attention, seq 2048 and the
    # padded GPT-2 vocabulary 51200 (Narayanan et al. 2021 sec. 5.1), embeddings tied (Megatron-LM default).
    return Model(
        "inline",
        "decoder",
        num_layers=given["num_layers"],
        hidden_size=h,
        num_attention_heads=heads,
        num_query_groups=given.get("num_query_groups", heads),
        ffn_hidden_size=given.get("ffn_hidden_size", 4 * h),
        seq_length=given.get("seq_length", 2048),
        vocab_size=given.get("vocab_size", 51200),
        swiglu=given.get("swiglu", False),
        tied_embeddings=given.get("tied_embeddings", True),
        kv_channels=given.get("kv_channels", 0),
        **{k: given[k] for k in MOE_FIELDS if k in given},
    )


def _checked(model: Model) -> Model:
    if model.kind == "mlp":
        # Model docstring: an mlp has no attention and no vocabulary and sees one token per sample.
        return replace(model, num_attention_heads=0, num_query_groups=0, ffn_hidden_size=0, seq_length=1,
                       vocab_size=0, swiglu=False, tied_embeddings=False)
    a, g, h = model.num_attention_heads, model.num_query_groups, model.hidden_size
    if a < 1 or (h % a and not model.kv_channels):  # Megatron-LM asserts it only where kv_channels is derived
        raise SpecError(
            f"hidden_size {h} is not divisible by num_attention_heads {a}",
            field="model.num_attention_heads",
            fix="choose a head count that divides hidden_size, or give model.kv_channels (the head dim)",
        )
    if g < 1 or a % g:
        raise SpecError(
            f"num_attention_heads {a} is not divisible by num_query_groups {g}",
            field="model.num_query_groups",
            fix="choose a query-group (KV head) count that divides num_attention_heads",
        )
    return model


def _from_hf_config(path: Path, *, seq_length: int | None = None) -> Model:
    """A Hugging Face ``config.json`` (transformers' PretrainedConfig keys, read with the json module)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"no such file: {path}", field="model.hf_config",
                        fix="give the path of a config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecError(f"cannot read {path} as JSON ({err})", field="model.hf_config",
                        fix="give a Hugging Face config.json") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{path} is not a JSON object", field="model.hf_config", fix="give a Hugging Face config.json")

    def need(key: str) -> int:
        value = doc.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            what = "missing" if value is None else f"not a positive integer ({value!r})"
            raise SpecError(f"{path}: key {key!r} is {what}", field=f"model.hf_config.{key}",
                            fix=f"add \"{key}\" to the config.json, or describe the model inline")
        return value

    h = need("hidden_size")
    heads = need("num_attention_heads")
    kv = need("num_key_value_heads") if doc.get("num_key_value_heads") is not None else heads
    model_type = str(doc.get("model_type", "")).lower()
    architectures = " ".join(str(a) for a in doc.get("architectures") or []).lower()
    act = str(doc.get("hidden_act", doc.get("activation_function", "gelu"))).lower()
    # transformers' LlamaMLP: down(act(gate(x)) * up(x)) with hidden_act silu = SwiGLU (Shazeer 2020).
    gated = any(t in model_type or t in architectures for t in _GATED_MODEL_TYPES)
    swiglu = act in ("silu", "swish") and gated
    return Model(
        str(doc.get("_name_or_path") or path.parent.name or "hf-config"),
        "decoder",
        num_layers=need("num_hidden_layers"),
        hidden_size=h,
        num_attention_heads=heads,
        num_query_groups=kv,
        ffn_hidden_size=need("intermediate_size"),
        seq_length=seq_length or need("max_position_embeddings"),
        vocab_size=need("vocab_size"),
        swiglu=swiglu,
        # transformers' PretrainedConfig default: tie_word_embeddings = True.
        tied_embeddings=bool(doc.get("tie_word_embeddings", True)),
        # Qwen3 / GPT-OSS configs give head_dim (LlamaConfig too, = hidden_size / heads when absent)
        kv_channels=need("head_dim") if doc.get("head_dim") is not None else 0,
    )
