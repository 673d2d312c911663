"""Checks of a Hugging Face ``config.json`` before it is read as a model (``model: {hf_config: ...}``).

simdist reads decoders, dense or mixture-of-experts: Llama-style dense keys, Mixtral, Qwen2/Qwen3-MoE,
DeepSeek-V2/V3 (MLA, shared experts, first dense layers, MTP) and GPT-OSS (sliding-window layers); the reading
is simdist.plan.hf_model. A file it would misread is refused here, with the key named and never read as a
smaller dense model: a key that changes what a step computes or moves and that simdist does not model
(`UNSUPPORTED_KEYS`), a multimodal config whose language model is nested, and sizes beyond the physical limits
that inline model fields have (simdist.limits).

Keys that only steer routing (which experts a token picks, not how many) are read as nothing on purpose: a token
still goes to num_experts_per_tok experts, so the expert GEMMs and the all-to-all volume are the same.
DeepSeek-V3's ``n_group`` / ``topk_group`` (node-limited routing: a token's experts on at most topk_group of
n_group groups), ``topk_method``, ``scoring_func``, ``routed_scaling_factor``, ``norm_topk_prob``, ``aux_loss_alpha``,
``seq_aux``, Mixtral's ``router_jitter_noise``, ``router_aux_loss_coef`` are such keys.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from simdist.errors import SpecError
from simdist.files import loads_json, read_text
from simdist.limits import (
    FFN_HIDDEN_SIZE,
    HIDDEN_SIZE,
    NUM_EXPERTS,
    NUM_HEADS,
    NUM_LAYERS,
    SEQ_LENGTH,
    VOCAB_SIZE,
    Limit,
)

__all__ = ["UNSUPPORTED_KEYS", "check_hf_config", "is_set"]

UNSUPPORTED_KEYS: dict[str, str] = {
    # Mixture-of-experts spellings of families simdist does not read: their layer pattern and expert widths are
    # elsewhere, so the experts would be costed wrongly.
    "ffn_config": "DBRX's experts (moe_num_experts, moe_top_k, ffn_hidden_size) nested in ffn_config",
    "moe_num_experts": "an expert count of a family simdist does not read (DBRX, ERNIE 4.5)",
    "moe_k": "ERNIE 4.5's experts per token",
    "moe_topk": "an experts-per-token key of a family simdist does not read",
    "router_topk": "an experts-per-token key of a family simdist does not read",
    "num_experts_per_token": "an experts-per-token key of a family simdist does not read",
    "moe_layer_start_index": "ERNIE 4.5's MoE layer range",
    "interleave_moe_layer_step": "Llama 4's MoE layer pattern (its dense layers' intermediate_size_mlp)",
    "intermediate_size_mlp": "Llama 4's dense-layer width",
    "expert_layer_period": "Jamba's expert-layer pattern",
    "expert_layer_offset": "Jamba's expert-layer pattern",
    # Layers other than attention + MLP: simdist has no cost for them.
    "attn_layer_period": "Jamba's Mamba layers between attention layers",
    "attn_layer_offset": "Jamba's Mamba layers between attention layers",
    "mamba_d_state": "Mamba (state-space) layers",
    "ssm_state_size": "state-space layers",
    "hybrid_override_pattern": "hybrid Mamba/attention layers (Nemotron-H)",
    "layers_block_type": "hybrid layer types (Mamba, attention, ...)",
    "full_attention_interval": "Qwen3-Next's linear-attention (Gated DeltaNet) layers",
    "linear_num_key_heads": "linear-attention layers",
    "attention_chunk_size": "chunked local attention (Llama 4): keys per query differ from full attention",
    "cross_attention_layers": "cross-attention layers (Mllama)",
}
"""Keys that change a step's cost and that simdist does not model: refused when set (not null, false, 0 or empty)."""

_BOUNDS: dict[str, Limit] = {
    "hidden_size": HIDDEN_SIZE, "num_attention_heads": NUM_HEADS, "num_key_value_heads": NUM_HEADS,
    "num_hidden_layers": NUM_LAYERS, "intermediate_size": FFN_HIDDEN_SIZE, "max_position_embeddings": SEQ_LENGTH,
    "vocab_size": VOCAB_SIZE, "head_dim": HIDDEN_SIZE, "num_local_experts": NUM_EXPERTS, "num_experts": NUM_EXPERTS,
    "n_routed_experts": NUM_EXPERTS, "n_shared_experts": NUM_EXPERTS, "num_experts_per_tok": NUM_EXPERTS,
    "experts_per_token": NUM_EXPERTS, "moe_intermediate_size": FFN_HIDDEN_SIZE,
    "shared_expert_intermediate_size": FFN_HIDDEN_SIZE, "q_lora_rank": HIDDEN_SIZE, "kv_lora_rank": HIDDEN_SIZE,
    "qk_nope_head_dim": HIDDEN_SIZE, "qk_rope_head_dim": HIDDEN_SIZE, "v_head_dim": HIDDEN_SIZE,
    "first_k_dense_replace": NUM_LAYERS, "moe_layer_freq": NUM_LAYERS, "decoder_sparse_step": NUM_LAYERS,
    "num_nextn_predict_layers": NUM_LAYERS, "sliding_window": SEQ_LENGTH, "max_window_layers": NUM_LAYERS,
    "sliding_window_pattern": NUM_LAYERS,
}


def is_set(value: Any) -> bool:
    """A key that is on: not null, false, zero or empty."""
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)):
        return value != 0
    return bool(value)


def check_hf_config(path: str | Path, *, field: str = "model.hf_config") -> dict[str, Any]:
    """The config as a JSON object, refused (one SpecError) where simdist would misread it."""
    p = Path(path)
    text = read_text(p, field=field)
    try:
        doc = loads_json(text)
    except ValueError as err:
        raise SpecError(f"{p} is not JSON ({err})", field=field, fix="give a Hugging Face config.json") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{p} is not a JSON object", field=field, fix="give a Hugging Face config.json")
    if isinstance(doc.get("text_config"), dict):
        raise SpecError(f"{p} nests its language model under text_config (a multimodal model), which simdist does "
                        "not read", field=f"{field}.text_config",
                        fix="give the language model's own config.json (text_config's keys at the top level)")
    for key, what in UNSUPPORTED_KEYS.items():
        if key in doc and is_set(doc[key]):
            raise SpecError(f"{p}: {key} ({what}) is not modelled by simdist, so the prediction would be wrong",
                            field=f"{field}.{key}",
                            fix="describe the model inline with the fields simdist models (simdist schema "
                                "scenario), or choose a supported config")
    for key, limit in _BOUNDS.items():
        value = doc.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (
                not math.isfinite(value) or value > limit.value):
            raise SpecError(f"{p}: {key} {value!r} is above the limit of {limit.text()} ({limit.reason})",
                            field=f"{field}.{key}", fix="give the model's real size")
    return doc
