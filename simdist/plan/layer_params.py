"""A decoder layer's parameters on one GPU: how many split over tensor parallelism, how many every tp peer holds
whole and how many are routed experts (split over ep x etp), and how many tensors they are (what per-parameter
gradient reduction issues). Read by the memory model (simdist.plan.memory) and the chunk costs
(simdist.plan.chunk_cost)."""

from __future__ import annotations

from functools import lru_cache

from simdist.plan.model import Model

__all__ = ["layer_param_shards", "layer_tensors"]


@lru_cache(maxsize=65536)
def layer_param_shards(model: Model, layer: int) -> tuple[int, int, int]:
    """(split over tp, replicated on every tp peer, routed experts) parameters of layer ``layer`` (0-based); together
    Model.layer_params(layer).

    Replicated: an MoE layer's router (Megatron-Core TopKRouter.weight is not tensor-parallel) and multi-latent
    attention's down projections and latent norms (TELinear parallel_mode "duplicated", MLASelfAttention); the routed
    experts are split over ep x etp instead of tp. Assumption: the small norm weights and biases are split over tp
    with the rest (as stage_params always did).
    """
    total = model.layer_params(layer)
    if model.kind != "decoder":
        return total, 0, 0
    replicated = routed = 0
    if model.moe_layer_flags()[layer]:
        replicated += model.router_params
        routed = model.num_experts * model.expert_params
    if model.multi_latent_attention:
        h, qr, kvr = model.hidden_size, model.q_lora_rank, model.kv_lora_rank
        replicated += h * (qr + kvr + model.qk_pos_emb_head_dim)
        if model.qk_layernorm:
            norm = 1 if model.swiglu else 2
            replicated += norm * ((qr if qr else 0) + kvr)
    return total - replicated - routed, replicated, routed


def layer_tensors(model: Model, layer: int, *, ep: int = 1) -> int:
    """Parameter tensors (weights and biases) of layer ``layer`` on one GPU, for per-parameter gradient reduction."""
    if model.kind == "mlp":
        return 2  # weight and bias
    # Llama: q/k/v (fused qkv counts 1), proj, gate+up, down, 2 norms; GPT: + biases of each linear and norm.
    per_linear, norm = (1, 1) if model.swiglu else (2, 2)
    if model.multi_latent_attention:
        linears = (2 if model.q_lora_rank else 1) + 2 + 1  # q (down, up), kv down, kv up, projection
        attention = linears * per_linear + norm * (1 + (2 if model.qk_layernorm else 0))
    else:
        attention = 2 * per_linear + norm * (3 if model.qk_layernorm else 1)
    if not model.moe_layer_flags()[layer]:
        return attention + 2 * per_linear + norm
    # Transformer Engine's GroupedLinear keeps one weight per local expert (weight0 ... weightN-1)
    shared = 2 * per_linear if model.moe_shared_expert_intermediate_size else 0
    return attention + norm + 1 + 2 * per_linear * (model.num_experts // ep) + shared
