"""Model presets and the resolution of a ``ModelSpec`` (preset, inline, or Hugging Face config.json) to a ``Model``.

The presets are data: one YAML file per model under ``models/`` at the top of the repository (shipped in the
wheel beside ``topologies/``), each value cited under the file's ``sources:``. A preset gives every field;
inline fields written beside ``preset`` override it (``{preset: gpt3-175b, seq_length: 4096}``). An inline model
fills what it omits with the GPT conventions of Megatron-LM (``ffn_hidden_size`` = 4 h, ``num_query_groups`` =
heads, ``seq_length`` 2048, ``vocab_size`` 51200 as in Narayanan et al. 2021). A ``hf_config`` is read with the
json module (no transformers import).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from simdist.errors import PresetError, SpecError
from simdist.plan.hf_model import model_of_hf_config
from simdist.plan.model import Model
from simdist.plan.model_check import check_model
from simdist.spec.preset_file import bundled_dir, read_preset
from simdist.spec.scenario import ModelSpec

MOE_FIELDS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
              "moe_layer_freq", "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
              "qk_pos_emb_head_dim", "v_head_dim", "qk_layernorm", "window_size", "window_attn_skip_freq",
              "mtp_num_layers", "yarn_rotary_scaling_factor", "yarn_mscale", "yarn_mscale_all_dim")
"""ModelSpec fields of mixture-of-experts, MLA, QK-norm, sliding-window, MTP and YaRN models (simdist.plan.model)."""
_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
           "vocab_size", "swiglu", "tied_embeddings", "kv_channels", "add_bias_linear",
           "activation_func_clamp_value", *MOE_FIELDS)


def _tupled(fields: dict[str, Any]) -> dict[str, Any]:
    """Per-layer lists as tuples (Model is frozen and hashable)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}


def _read(path: Path) -> tuple[Model, str]:
    """(Model, source) of one ``models/<name>.yaml``: the file name is the preset name, ``source`` its citation
    and ``sources`` that of every value (simdist.spec.preset_file). Every number is the source's."""
    spec, _, doc = read_preset(path, ModelSpec, keep=("source",))
    source = doc.data.get("source")
    if not isinstance(source, str) or not source.strip():
        raise SpecError("a model preset needs 'source': the citation of its numbers", field="source",
                        source=str(path), fix="add 'source: <paper, table>'")
    written = _tupled({k: getattr(spec, k) for k in _FIELDS if getattr(spec, k) is not None})
    return Model(path.stem, spec.kind or "decoder", **written), source


_PRESETS: dict[str, tuple[Model, str]] = {}
"""The presets read so far (each file is read when first asked for: a run reads the one it names)."""


def model_presets() -> list[str]:
    """Names a scenario may write as ``model.preset``."""
    return sorted(path.stem for path in bundled_dir("models").glob("*.yaml"))


def preset_source(name: str) -> str:
    """The citation of a preset's numbers."""
    return _preset(name)[1]


def _preset(name: str) -> tuple[Model, str]:
    got = _PRESETS.get(name)
    if got is not None:
        return got
    names = model_presets()
    if name not in names:  # only the folder's file names (so no path such as '../x' is read)
        raise PresetError(
            f"unknown model preset {name!r}; valid presets: {', '.join(names)}",
            field="model.preset",
            fix=f"write one of {', '.join(names)}, or describe the model inline",
        )
    got = _PRESETS[name] = _read(bundled_dir("models") / f"{name}.yaml")
    return got


_INLINE_FIELDS = ("kind", *_FIELDS)
"""What an inline description may write: a preset's fields and the kind."""


def _written(spec: ModelSpec) -> dict[str, Any]:
    return _tupled({k: getattr(spec, k) for k in _INLINE_FIELDS if getattr(spec, k) is not None})


def resolve_model(spec: ModelSpec, *, base_dir: Path | None = None) -> Model:
    """The model a spec describes; ``base_dir`` resolves a relative ``hf_config`` path (the scenario's folder)."""
    if spec.preset is not None:
        base, _ = _preset(spec.preset)
        model = replace(base, **_written(spec))
    elif spec.hf_config is not None:
        path = spec.hf_config if spec.hf_config.is_absolute() or base_dir is None else base_dir / spec.hf_config
        model = replace(model_of_hf_config(path, seq_length=spec.seq_length), **_written(spec))
    else:
        model = _inline(spec)
    return _checked(model)


def _inline(spec: ModelSpec) -> Model:
    given = _written(spec)
    kind = given.get("kind", "decoder")
    h = given.get("hidden_size")
    if kind == "mlp":
        # The lecture's MLP: square layers, no attention, one "token" per sample (Model docstring).
        # Its decoder fields are kept only for check_model to refuse them.
        return Model("inline-mlp", "mlp", num_layers=given["num_layers"], hidden_size=h,
                     **{k: given[k] for k in MOE_FIELDS if k in given})
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
        # the rest as written, else Model's defaults
        **{k: given[k] for k in ("add_bias_linear", "activation_func_clamp_value", *MOE_FIELDS) if k in given},
    )


def _checked(model: Model) -> Model:
    """The fields checked against each other (simdist.plan.model_check)."""
    return check_model(model)
