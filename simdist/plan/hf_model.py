"""A Hugging Face ``config.json`` read as a `Model` (transformers' PretrainedConfig keys, with the json module).

What is read, by family (keys, not model_type, decide, so a fine-tuned copy reads the same):

- dense decoders: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
  intermediate_size, vocab_size, max_position_embeddings, tie_word_embeddings, hidden_act (SwiGLU where gated);
- experts: num_local_experts (Mixtral, GPT-OSS), num_experts (Qwen2/Qwen3-MoE, OLMoE) or n_routed_experts
  (DeepSeek-V2/V3); experts per token num_experts_per_tok or experts_per_token (GPT-OSS); one expert's width
  moe_intermediate_size where given, else intermediate_size (Mixtral, GPT-OSS); shared experts
  n_shared_experts x moe_intermediate_size (DeepSeek) or shared_expert_intermediate_size (Qwen2-MoE);
- which layers are MoE: Qwen's decoder_sparse_step and mlp_only_layers, DeepSeek's first_k_dense_replace and
  moe_layer_freq (the dense ones use intermediate_size);
- MLA (DeepSeek-V2/V3): q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  num_nextn_predict_layers (MTP modules);
- YaRN: rope_scaling with rope_type yarn (factor, mscale, mscale_all_dim; GPT-OSS, DeepSeek-V3);
- sliding windows: layer_types (GPT-OSS, newer transformers), Qwen's use_sliding_window / max_window_layers,
  Gemma's sliding_window_pattern, else sliding_window on every layer (Mistral).

Keys simdist does not model but that change the cost are refused first (simdist.spec.hf_config).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simdist.errors import SpecError
from simdist.plan.model import Model
from simdist.spec.hf_config import check_hf_config, is_set

__all__ = ["model_of_hf_config"]

# Model types / architectures whose `silu` MLP is gated (SwiGLU): transformers' LlamaMLP, MixtralBlockSparseTop2MLP,
# Qwen3MoeMLP, DeepseekV3MLP, GptOssExperts compute down(act(gate(x)) * up(x)) (Shazeer 2020).
_GATED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "olmo", "phi3", "deepseek", "gpt_oss")
# QK-norm: transformers' Qwen3Attention and Gemma3Attention normalise each head's Q and K (RMSNorm of head_dim).
# Assumption: OLMo 2 / OLMoE normalise the whole of Q and K instead: counted per head as Megatron-LM's
# --qk-layernorm does (the difference, (heads - 1) x head_dim scales per layer, is under 1e-5 of the parameters).
_QK_NORM_MODEL_TYPES = ("qwen3", "gemma3", "olmo2", "olmoe")


class _Config:
    """The keys of one config.json, each read with the error that names it."""

    def __init__(self, path: Path, doc: dict[str, Any]) -> None:
        self.path, self.doc = path, doc

    def fail(self, key: str, problem: str, fix: str) -> SpecError:
        return SpecError(f"{self.path}: {problem}", field=f"model.hf_config.{key}", fix=fix)

    def has(self, key: str) -> bool:
        return is_set(self.doc.get(key))

    def count(self, key: str, *, minimum: int = 1, default: int | None = None) -> int:
        """A non-negative integer key (at least ``minimum``); ``default`` where it is absent or null."""
        value = self.doc.get(key)
        if value is None and default is not None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            what = "missing" if value is None else f"not an integer of at least {minimum} ({value!r})"
            raise self.fail(key, f"key {key!r} is {what}", f"add \"{key}\" to the config.json, or describe the "
                                                          "model inline")
        return value

    def layer_indices(self, key: str, num_layers: int) -> set[int]:
        value = self.doc.get(key) or []
        if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                  and 0 <= i < num_layers for i in value):
            raise self.fail(key, f"{key} must list layer indices 0..{num_layers - 1} ({value!r})",
                            f"fix {key} in the config.json")
        return set(value)


def _freq(flags: tuple[bool, ...]) -> int | tuple[int, ...]:
    """Megatron-LM's int form where it says the same (moe_layer_freq k: layer i MoE where i % k == 0), else a 0/1
    per layer."""
    if all(flags):
        return 1
    for k in range(2, len(flags) + 1):
        if flags == tuple(i % k == 0 for i in range(len(flags))):
            return k
    return tuple(int(f) for f in flags)


def _window_freq(windowed: tuple[bool, ...]) -> int | tuple[int, ...]:
    """window_attn_skip_freq in Megatron-LM's int form where it says the same (k: every layer windowed but each
    k-th, 1-based; simdist.plan.model.Model.window_layer_flags), else a 0/1 per layer (1: windowed); 0: every
    layer windowed."""
    if all(windowed):
        return 0
    for k in range(2, len(windowed) + 1):
        if windowed == tuple((i + 1) % k != 0 for i in range(len(windowed))):
            return k
    return tuple(int(w) for w in windowed)


def _experts(c: _Config, num_layers: int, ffn: int) -> dict[str, Any]:
    keys = [k for k in ("num_local_experts", "num_experts", "n_routed_experts") if c.has(k)]
    counts = {k: c.count(k) for k in keys}
    if len(set(counts.values())) > 1:
        raise c.fail(keys[1], f"expert counts disagree ({counts})", "keep one expert-count key")
    num_experts = next(iter(counts.values()), 0)
    if num_experts <= 1:
        return {}  # no experts, or one: a dense MLP
    topk_keys = [k for k in ("num_experts_per_tok", "experts_per_token") if c.doc.get(k) is not None]
    if not topk_keys:
        raise c.fail("num_experts_per_tok", f"{keys[0]} {num_experts} without num_experts_per_tok",
                     "add \"num_experts_per_tok\" (experts each token is routed to)")
    topks = {k: c.count(k) for k in topk_keys}
    if len(set(topks.values())) > 1:
        raise c.fail(topk_keys[1], f"experts per token disagree ({topks})", "keep one experts-per-token key")
    topk = topks[topk_keys[0]]
    if topk > num_experts:
        raise c.fail(topk_keys[0], f"{topk} experts per token of {num_experts}", "route to at most num_experts")
    expert_ffn = c.count("moe_intermediate_size") if c.doc.get("moe_intermediate_size") is not None else ffn
    shared = 0
    if c.has("n_shared_experts"):
        # DeepSeekMoE (Dai et al. 2024, arXiv:2401.06066 sec. 3.2; transformers DeepseekV3MoE): the shared
        # experts are one MLP of n_shared_experts x moe_intermediate_size.
        shared = c.count("n_shared_experts") * c.count("moe_intermediate_size")
    if c.has("shared_expert_intermediate_size"):
        # Qwen2-MoE: one shared expert MLP of that width (its sigmoid gate, h x 1, is not counted).
        shared += c.count("shared_expert_intermediate_size")
    # Which layers are MoE.
    # transformers Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: layer i is MoE unless in mlp_only_layers, where
    # (i + 1) % decoder_sparse_step == 0.
    step = c.count("decoder_sparse_step", default=1)
    dense_only = c.layer_indices("mlp_only_layers", num_layers)
    # transformers DeepseekV3DecoderLayer (and DeepSeek's modeling_deepseek.py): MoE where
    # i >= first_k_dense_replace and i % moe_layer_freq == 0; only moe_layer_freq's int form exists there.
    first_dense = c.count("first_k_dense_replace", minimum=0, default=0)
    if c.doc.get("moe_layer_freq") is not None and not isinstance(c.doc["moe_layer_freq"], int):
        raise c.fail("moe_layer_freq", f"moe_layer_freq {c.doc['moe_layer_freq']!r} is not DeepSeek's integer form, "
                                       "which is the one simdist reads", "write an integer, or describe the model "
                                                                         "inline with a 0/1 list per layer")
    freq = c.count("moe_layer_freq", default=1)
    flags = tuple(i not in dense_only and (i + 1) % step == 0 and i >= first_dense and i % freq == 0
                  for i in range(num_layers))
    if not any(flags):
        raise c.fail("first_k_dense_replace", "no layer is a mixture of experts (decoder_sparse_step, "
                                              "mlp_only_layers, first_k_dense_replace, moe_layer_freq)",
                     "fix the layer pattern, or describe a dense model")
    out = {"num_experts": num_experts, "moe_router_topk": topk, "moe_ffn_hidden_size": expert_ffn,
           "moe_shared_expert_intermediate_size": shared, "moe_layer_freq": _freq(flags)}
    # GPT-OSS: transformers' GptOssExperts clamps the gate to at most swiglu_limit and the linear half to within
    # +/- it (Megatron-Bridge's bridge: activation_func_clamp_value = 7.0); costed by simdist.plan.glu_clamp.
    limit = c.doc.get("swiglu_limit")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit <= 1e6:
            raise c.fail("swiglu_limit", f"swiglu_limit must be a positive number, not {limit!r}",
                         "fix the config's swiglu_limit (GPT-OSS: 7.0)")
        out["activation_func_clamp_value"] = float(limit)
    return out


def _latent_attention(c: _Config) -> dict[str, Any]:
    if not c.has("kv_lora_rank"):
        return {}
    # DeepSeek-V2 (arXiv:2405.04434 sec. 2.1) / V3: q_lora_rank null projects Q directly (V2-Lite). The latent
    # norms q_a_layernorm / kv_a_layernorm are always there: Megatron-LM builds them under --qk-layernorm.
    return {"multi_latent_attention": True, "q_lora_rank": c.count("q_lora_rank", minimum=0, default=0),
            "kv_lora_rank": c.count("kv_lora_rank"), "qk_head_dim": c.count("qk_nope_head_dim"),
            "qk_pos_emb_head_dim": c.count("qk_rope_head_dim", minimum=0, default=0),
            "v_head_dim": c.count("v_head_dim")}


def _sliding_window(c: _Config, num_layers: int, model_type: str) -> dict[str, Any]:
    types = c.doc.get("layer_types")
    if types is not None:
        # transformers' layer_types (GPT-OSS: sliding and full alternate, sliding first).
        known = {"sliding_attention": True, "full_attention": False}
        if not isinstance(types, list) or len(types) != num_layers or not all(t in known for t in types):
            raise c.fail("layer_types", "layer_types must give sliding_attention or full_attention for each of the "
                                        f"{num_layers} layers (other layer kinds are not modelled)",
                         "describe the model inline, or give a config of attention layers")
        windowed = tuple(known[t] for t in types)
    elif "use_sliding_window" in c.doc:
        # Qwen2/Qwen3 configs: sliding_window applies only under use_sliding_window, to layers
        # i >= max_window_layers (transformers Qwen2Config's layer_types).
        on = c.has("use_sliding_window") and c.has("sliding_window")
        first = c.count("max_window_layers", minimum=0, default=0) if on else num_layers
        windowed = tuple(on and i >= first for i in range(num_layers))
    elif c.has("sliding_window_pattern"):
        # Gemma 3: layer i windowed where (i + 1) % sliding_window_pattern != 0 (Megatron's int form).
        k = c.count("sliding_window_pattern")
        windowed = tuple((i + 1) % k != 0 for i in range(num_layers))
    elif c.has("sliding_window") and model_type == "gemma2":
        windowed = tuple(i % 2 == 0 for i in range(num_layers))  # Gemma 2: even layers windowed
    else:
        # Mistral 7B: sliding_window on every layer; null (Mixtral) none.
        windowed = (c.has("sliding_window"),) * num_layers
    if not any(windowed):
        return {}
    return {"window_size": c.count("sliding_window"), "window_attn_skip_freq": _window_freq(windowed)}


def _yarn(c: _Config) -> dict[str, Any]:
    """YaRN's factor, mscale and mscale_all_dim from rope_scaling with rope_type (or type) yarn (GPT-OSS,
    DeepSeek-V3): they set Model.rotary_concentration; other rope scalings change RoPE's frequencies, not its cost."""
    scaling = c.doc.get("rope_scaling")
    if not isinstance(scaling, dict) or str(scaling.get("rope_type", scaling.get("type", ""))).lower() != "yarn":
        return {}
    out: dict[str, Any] = {}
    for key, field in (("factor", "yarn_rotary_scaling_factor"), ("mscale", "yarn_mscale"),
                       ("mscale_all_dim", "yarn_mscale_all_dim")):
        value = scaling.get(key)
        if value is None and key != "factor":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e6 or (
                key == "factor" and value <= 0):
            raise c.fail(f"rope_scaling.{key}", f"rope_scaling.{key} of a yarn scaling must be a positive number, "
                                                f"not {value!r}", "fix the config's rope_scaling")
        out[field] = float(value)
    return out


def model_of_hf_config(path: Path, *, seq_length: int | None = None) -> Model:
    """The model a Hugging Face ``config.json`` describes; ``seq_length`` in place of max_position_embeddings."""
    c = _Config(path, check_hf_config(path))
    doc = c.doc
    heads = c.count("num_attention_heads")
    kv = c.count("num_key_value_heads") if doc.get("num_key_value_heads") is not None else heads
    num_layers = c.count("num_hidden_layers")
    ffn = c.count("intermediate_size")
    model_type = str(doc.get("model_type", "")).lower()
    architectures = " ".join(str(a) for a in doc.get("architectures") or []).lower()
    act = str(doc.get("hidden_act", doc.get("activation_function", "gelu"))).lower()
    gated = any(t in model_type or t in architectures for t in _GATED_MODEL_TYPES)
    mla = _latent_attention(c)
    # GPT-OSS's linear layers carry biases (transformers' GptOssExperts: gate_up_proj_bias and down_proj_bias on every
    # expert; Megatron-Bridge's GPT-OSS bridge sets add_bias_linear = True): costed where they add kernels, the routed
    # experts' fc2 bias (simdist.plan.moe_bias).
    # Assumption: the biases (under 0.1% of GPT-OSS-120B's parameters) and GPT-OSS's attention sinks (one learned
    # logit per head in the softmax denominator) are not counted in the parameters.
    return Model(
        str(doc.get("_name_or_path") or path.parent.name or "hf-config"),
        "decoder",
        num_layers=num_layers,
        hidden_size=c.count("hidden_size"),
        num_attention_heads=heads,
        num_query_groups=kv,
        ffn_hidden_size=ffn,
        seq_length=seq_length or c.count("max_position_embeddings"),
        vocab_size=c.count("vocab_size"),
        swiglu=act in ("silu", "swish") and gated,
        # transformers' PretrainedConfig default: tie_word_embeddings = True.
        tied_embeddings=bool(doc.get("tie_word_embeddings", True)),
        add_bias_linear=model_type == "gpt_oss",
        # Qwen3 / GPT-OSS configs give head_dim (LlamaConfig too, = hidden_size / heads when absent); MLA's heads
        # are qk_nope_head_dim + qk_rope_head_dim and v_head_dim instead.
        kv_channels=c.count("head_dim") if doc.get("head_dim") is not None and not mla else 0,
        qk_layernorm=bool(mla) or any(model_type.startswith(t) for t in _QK_NORM_MODEL_TYPES),
        mtp_num_layers=c.count("num_nextn_predict_layers", minimum=0, default=0),
        **_experts(c, num_layers, ffn),
        **mla,
        **_sliding_window(c, num_layers, model_type),
        **_yarn(c),
    )
