"""A resolved model: the numbers every cost and memory formula reads.

``ModelSpec`` (simdist.spec.scenario) is what a user writes; ``Model`` is what it resolves to (a preset,
an inline description or a Hugging Face config.json; see simdist.plan.model_presets). Two kinds:

- ``decoder``: a GPT/Llama-style decoder-only transformer (multi-head or grouped-query attention, GELU
  or SwiGLU MLP, learned/rotary positions, untied or tied embeddings).
- ``mlp``: the CS336 lecture's MLP: ``num_layers`` square linear layers of width ``hidden_size``, GELU
  after each, loss = mean of the squared final activation; no attention, no vocabulary, ``seq_length`` 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ModelKind = Literal["decoder", "mlp"]


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    kind: ModelKind
    num_layers: int
    hidden_size: int
    num_attention_heads: int = 0
    """0 for ``mlp``."""
    num_query_groups: int = 0
    """Key/value heads (grouped-query attention); equal to num_attention_heads for multi-head attention."""
    ffn_hidden_size: int = 0
    """MLP inner width; 4 x hidden_size for GPT-3, Llama 3's intermediate_size with SwiGLU."""
    seq_length: int = 1
    vocab_size: int = 0
    swiglu: bool = False
    tied_embeddings: bool = False
    kv_channels: int = 0
    """Width of one attention head (Megatron-LM's --kv-channels, Hugging Face's head_dim); 0: hidden_size /
    num_attention_heads, Megatron's default. Qwen3 and GPT-OSS shapes set it (e.g. Qwen3-32B: h 5120, 64 heads of
    128)."""

    # Mixture of experts (Megatron-LM names; simdist.spec.scenario.ModelSpec documents each). 0 experts: dense.
    num_experts: int = 0
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0
    moe_shared_expert_intermediate_size: int = 0
    moe_layer_freq: int | tuple[int, ...] = 1
    """An int k: layer i (0-based) is MoE where i % k == 0 (Megatron-LM's moe_layer_pattern); or one 0/1 per layer."""
    # Multi-latent attention (DeepSeek-V2/V3).
    multi_latent_attention: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    qk_pos_emb_head_dim: int = 0
    v_head_dim: int = 0
    qk_layernorm: bool = False
    window_size: int = 0
    """Sliding-window attention: keys per query; 0 full attention in every layer."""
    window_attn_skip_freq: int | tuple[int, ...] = 0
    """Which layers keep full attention under window_size: an int k or one 0/1 per layer (1: full); 0: none."""
    mtp_num_layers: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def moe_layer_flags(self) -> tuple[bool, ...]:
        """One flag per layer: True where the layer's MLP is the routed experts (Megatron-LM moe_layer_pattern)."""
        if not self.is_moe:
            return (False,) * self.num_layers
        freq = self.moe_layer_freq
        if isinstance(freq, tuple):
            return tuple(bool(x) for x in freq)
        return tuple(i % freq == 0 for i in range(self.num_layers))

    @property
    def head_dim(self) -> int:
        if self.kv_channels:
            return self.kv_channels
        return self.hidden_size // self.num_attention_heads if self.num_attention_heads else 0

    @property
    def q_hidden_size(self) -> int:
        """Width of Q (and of the attention output the projection reads): num_attention_heads x head_dim
        (Megatron-LM's query_projection_size); hidden_size unless kv_channels says otherwise."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_hidden_size(self) -> int:
        """Width of K (and of V): num_query_groups x head_dim."""
        return self.num_query_groups * self.head_dim

    @property
    def params_per_layer(self) -> int:
        """Weights and biases of one layer.

        mlp: h x h weights + h biases (the lecture's nn.Linear layers).
        decoder: Narayanan et al. 2021 (arXiv:2104.04473) eq. (2) counts 12h^2 + 13h per GPT layer:
        QKV 3h^2 + 3h, projection h^2 + h, MLP 8h^2 + 5h (two h x 4h matrices), two layer norms 4h.
        Written out per matrix so GQA (K and V of width kv = g x head_dim), a head dim other than h / a (Q of
        width q = a x head_dim, the projection q x h) and SwiGLU (three h x f matrices, no biases in Llama) follow
        from the same arithmetic.
        """
        h = self.hidden_size
        if self.kind == "mlp":
            return h * h + h
        q, kv = self.q_hidden_size, self.kv_hidden_size
        f = self.ffn_hidden_size
        if self.swiglu:
            # Llama style (Touvron et al. 2023, arXiv:2302.13971 sec. 2.2): no biases, RMSNorm (scale only),
            # SwiGLU MLP with three h x f matrices (gate, up, down).
            return h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h
        attention = h * (q + 2 * kv) + (q + 2 * kv) + q * h + h  # QKV weights + biases, projection + bias
        mlp = 2 * h * f + f + h  # h x f and f x h with biases
        norms = 4 * h  # two layer norms, scale and shift
        return attention + mlp + norms

    @property
    def embedding_params(self) -> int:
        """Word embedding (vocab x h); the output projection is the same matrix when tied, else another."""
        if self.kind == "mlp":
            return 0
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def num_params(self) -> int:
        final_norm = (self.hidden_size if self.swiglu else 2 * self.hidden_size) if self.kind == "decoder" else 0
        return self.num_layers * self.params_per_layer + self.embedding_params + final_norm
