"""The checks of a resolved `Model` (after a preset's overrides, an inline description or a config.json): fields
that contradict each other are one SpecError naming the field and the fix, before anything is costed."""

from __future__ import annotations

from dataclasses import fields, replace

from simdist.errors import SpecError
from simdist.plan.model import Model

__all__ = ["check_model"]

_MOE_ONLY = ("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_layer_freq",
             "activation_func_clamp_value")
_MLA_ONLY = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
_DECODER_ONLY = ("num_experts", *_MOE_ONLY, "multi_latent_attention", *_MLA_ONLY, "qk_layernorm", "window_size",
                 "window_attn_skip_freq", "mtp_num_layers", "yarn_rotary_scaling_factor", "yarn_mscale",
                 "yarn_mscale_all_dim")
_DEFAULTS = {f.name: f.default for f in fields(Model)}


def _fail(name: str, problem: str, fix: str) -> SpecError:
    return SpecError(problem, field=f"model.{name}", fix=fix)


def _written(model: Model, name: str) -> bool:
    return getattr(model, name) != _DEFAULTS[name]


def _per_layer(model: Model, name: str) -> None:
    value = getattr(model, name)
    if isinstance(value, tuple) and len(value) != model.num_layers:
        raise _fail(name, f"{name} lists {len(value)} layers but the model has num_layers {model.num_layers}",
                    "give one 0/1 per layer, or an integer k (every k-th layer)")


def _check_moe(model: Model) -> None:
    if not model.is_moe:
        for name in _MOE_ONLY:
            if _written(model, name):
                raise _fail(name, f"{name} is set but the model has no experts (num_experts)",
                            f"set model.num_experts, or drop {name}")
        return
    if model.moe_router_topk > model.num_experts:
        raise _fail("moe_router_topk", f"moe_router_topk {model.moe_router_topk} routes each token to more experts "
                                       f"than the {model.num_experts} there are",
                    f"choose moe_router_topk <= num_experts ({model.num_experts})")
    if model.activation_func_clamp_value is not None and not model.swiglu:
        raise _fail("activation_func_clamp_value", "activation_func_clamp_value clamps the two halves of a gated "
                                                   "expert's fc1 output, and this model's experts are not gated",
                    "set model.swiglu: true (gated experts, as GPT-OSS), or drop activation_func_clamp_value")
    _per_layer(model, "moe_layer_freq")
    if not any(model.moe_layer_flags()):
        raise _fail("moe_layer_freq", "moe_layer_freq marks no layer as a mixture of experts",
                    "mark at least one layer 1, or drop num_experts for a dense model")


def _check_attention(model: Model) -> None:
    a, g, h = model.num_attention_heads, model.num_query_groups, model.hidden_size
    mla = model.multi_latent_attention
    # Megatron-LM asserts it only where kv_channels is derived (MLA's head dims are given)
    if a < 1 or (h % a and not model.kv_channels and not mla):
        raise _fail("num_attention_heads", f"hidden_size {h} is not divisible by num_attention_heads {a}",
                    "choose a head count that divides hidden_size, or give model.kv_channels (the head dim)")
    if g < 1 or a % g:
        raise _fail("num_query_groups", f"num_attention_heads {a} is not divisible by num_query_groups {g}",
                    "choose a query-group (KV head) count that divides num_attention_heads")
    if mla:
        for name in ("kv_lora_rank", "qk_head_dim", "v_head_dim"):
            if not getattr(model, name):
                raise _fail(name, f"multi_latent_attention needs {name}",
                            f"give model.{name} (DeepSeek-V3: kv_lora_rank 512, qk_head_dim 128, v_head_dim 128)")
        if g != a:
            # DeepSeek-V2 sec. 2.1.2: every head's K and V come up from the one latent; there are no KV groups.
            raise _fail("num_query_groups", f"multi_latent_attention has no key/value groups (num_query_groups {g}, "
                                            f"num_attention_heads {a})", "drop num_query_groups")
    else:
        for name in _MLA_ONLY:
            if _written(model, name):
                raise _fail(name, f"{name} is set but multi_latent_attention is not",
                            f"set model.multi_latent_attention: true, or drop {name}")


def _check_window(model: Model) -> None:
    if not model.window_size:
        if _written(model, "window_attn_skip_freq"):
            raise _fail("window_attn_skip_freq", "window_attn_skip_freq is set but window_size is not",
                        "set model.window_size (keys per query), or drop window_attn_skip_freq")
        return
    _per_layer(model, "window_attn_skip_freq")


def check_model(model: Model) -> Model:
    """``model``, its fields checked against each other; an ``mlp`` with its decoder fields cleared."""
    if model.kind == "mlp":
        for name in _DECODER_ONLY:
            if _written(model, name):
                raise _fail(name, f"{name} is a decoder field; the mlp kind has no attention and no experts",
                            f"drop {name}, or describe a decoder")
        # Model docstring: an mlp has no attention and no vocabulary and sees one token per sample.
        return replace(model, num_attention_heads=0, num_query_groups=0, ffn_hidden_size=0, seq_length=1,
                       vocab_size=0, swiglu=False, tied_embeddings=False)
    _check_attention(model)
    _check_moe(model)
    _check_window(model)
    _check_yarn(model)
    return model


def _check_yarn(model: Model) -> None:
    for name in ("yarn_mscale", "yarn_mscale_all_dim"):
        if _written(model, name) and not model.yarn_rotary_scaling_factor:
            raise _fail(name, f"{name} is set without yarn_rotary_scaling_factor (YaRN's factor it scales)",
                        f"set model.yarn_rotary_scaling_factor, or drop {name}")
    if model.yarn_rotary_scaling_factor and not model.swiglu:
        raise _fail("yarn_rotary_scaling_factor", "YaRN scales rotary embeddings, and a GeLU (GPT) model has "
                                                  "learned positions here",
                    "drop yarn_rotary_scaling_factor, or set model.swiglu: true (a Llama-style model with RoPE)")
