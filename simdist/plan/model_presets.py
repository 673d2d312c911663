"""Model presets and the resolution of a ``ModelSpec`` (preset, inline, or Hugging Face config.json) to a ``Model``.

A preset gives every field; inline fields written beside ``preset`` override it (``{preset: gpt3-175b,
seq_length: 4096}``). An inline model fills what it omits with the GPT conventions of Megatron-LM
(``ffn_hidden_size`` = 4 h, ``num_query_groups`` = heads, ``seq_length`` 2048, ``vocab_size`` 51200 as in
Narayanan et al. 2021). A ``hf_config`` is read with the json module (no transformers import).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from simdist.errors import PresetError, SpecError
from simdist.plan.model import Model
from simdist.spec.scenario import ModelSpec

LLAMA3 = "Dubey et al. 2024, 'The Llama 3 Herd of Models' (arXiv:2407.21783), Table 3"

# name -> (Model, source). Every number is the source's.
_PRESETS: dict[str, tuple[Model, str]] = {
    # GPT-3 175B: Brown et al. 2020 (arXiv:2005.14165) Table 2.1: 96 layers, d_model 12288, 96 heads,
    # context 2048, d_ff = 4 d_model; BPE vocabulary of GPT-2 (50257) padded to 51200 as Megatron-LM does
    # (Narayanan et al. 2021 sec. 5.1 uses V = 51,200). GELU MLP; input and output embeddings tied (GPT-2).
    "gpt3-175b": (
        Model("gpt3-175b", "decoder", num_layers=96, hidden_size=12288, num_attention_heads=96,
              num_query_groups=96, ffn_hidden_size=4 * 12288, seq_length=2048, vocab_size=51200,
              tied_embeddings=True),
        "Brown et al. 2020 (arXiv:2005.14165) Table 2.1; vocab 51200 as Narayanan et al. 2021 sec. 5.1",
    ),
    # Megatron 530B: Narayanan et al. 2021 (arXiv:2104.04473) Table 1 and Korthikanti et al. 2022 (arXiv:2205.05198)
    # Table 3 (105 layers, hidden 20480, 128 heads, seq 2048); vocab 51200 (Narayanan sec. 5.1).
    "megatron-530b": (
        Model("megatron-530b", "decoder", num_layers=105, hidden_size=20480, num_attention_heads=128,
              num_query_groups=128, ffn_hidden_size=4 * 20480, seq_length=2048, vocab_size=51200,
              tied_embeddings=True),
        "Narayanan et al. 2021 (arXiv:2104.04473) Table 1; Korthikanti et al. 2022 (arXiv:2205.05198) Table 3",
    ),
    # Megatron 1T: Narayanan et al. 2021 (arXiv:2104.04473) Table 1 (128 layers, hidden 25600, 160 heads) and
    # Korthikanti et al. 2022 (arXiv:2205.05198) Table 3 (same, seq 2048); vocab 51200 (Narayanan sec. 5.1).
    "megatron-1t": (
        Model("megatron-1t", "decoder", num_layers=128, hidden_size=25600, num_attention_heads=160,
              num_query_groups=160, ffn_hidden_size=4 * 25600, seq_length=2048, vocab_size=51200,
              tied_embeddings=True),
        "Narayanan et al. 2021 (arXiv:2104.04473) Table 1; Korthikanti et al. 2022 (arXiv:2205.05198) Table 3",
    ),
    # Llama 3 (Dubey et al. 2024 Table 3): SwiGLU, 8 KV heads (GQA), vocab 128,000 + 256 reserved = 128256
    # (the released config.json), untied embeddings, sequence 8192 (the pre-training context, sec. 3.4.1).
    "llama3-8b": (
        Model("llama3-8b", "decoder", num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
              ffn_hidden_size=14336, seq_length=8192, vocab_size=128256, swiglu=True),
        LLAMA3,
    ),
    "llama3-70b": (
        Model("llama3-70b", "decoder", num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8,
              ffn_hidden_size=28672, seq_length=8192, vocab_size=128256, swiglu=True),
        LLAMA3,
    ),
    "llama3-405b": (
        Model("llama3-405b", "decoder", num_layers=126, hidden_size=16384, num_attention_heads=128,
              num_query_groups=8, ffn_hidden_size=53248, seq_length=8192, vocab_size=128256, swiglu=True),
        LLAMA3,
    ),
    # The MLP of Stanford CS336 (Spring 2025) lecture 8 (stanford-cs336/spring2025-lectures lecture_08.py,
    # data/tensor/pipeline parallelism examples): num_layers 4 linear layers of num_dim 1024, GELU after each.
    "cs336-mlp": (
        Model("cs336-mlp", "mlp", num_layers=4, hidden_size=1024),
        "Stanford CS336 Spring 2025 lecture 8 (stanford-cs336/spring2025-lectures lecture_08.py)",
    ),
}

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
                  "seq_length", "vocab_size", "swiglu", "kind", "tied_embeddings", "kv_channels")


def _written(spec: ModelSpec) -> dict[str, Any]:
    return {k: getattr(spec, k) for k in _INLINE_FIELDS if getattr(spec, k) is not None}


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
