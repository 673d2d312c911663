"""A resolved model: the numbers every cost and memory formula reads.

``ModelSpec`` (simdist.spec.scenario) is what a user writes; ``Model`` is what it resolves to (a preset,
an inline description or a Hugging Face config.json; see simdist.plan.model_presets). Two kinds:

- ``decoder``: a GPT/Llama-style decoder-only transformer (multi-head or grouped-query attention, GELU
  or SwiGLU MLP, learned/rotary positions, untied or tied embeddings).
- ``mlp``: the CS336 lecture's MLP: ``num_layers`` square linear layers of width ``hidden_size``, GELU
  after each, loss = mean of the squared final activation; no attention, no vocabulary, ``seq_length`` 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
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
    add_bias_linear: bool = False
    """The linear layers carry biases (Megatron-LM --add-bias-linear): priced where they add kernels, a routed
    expert's fc2 bias (simdist.plan.moe_bias); not counted in the parameters."""
    activation_func_clamp_value: float | None = None
    """The routed experts' gated activation clamps its two halves of fc1's output to this limit first (Megatron-LM
    --activation-func-clamp-value; GPT-OSS 7.0): eager kernels beside the fused activation (simdist.plan.glu_clamp);
    None: no clamp."""
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
    """Which layers keep full attention under window_size (Megatron-LM --window-attn-skip-freq): an int k (every k-th
    layer, 1-based, full) or one 0/1 per layer (1: sliding window, 0: full, as Megatron-LM); 0: every layer windowed."""
    mtp_num_layers: int = 0
    yarn_rotary_scaling_factor: float = 0.0
    """YaRN's context extension factor s (0: no YaRN); with yarn_mscale and yarn_mscale_all_dim (None: not given; 0
    is a value, as Megatron-LM reads it) it sets `rotary_concentration`."""
    yarn_mscale: float | None = None
    yarn_mscale_all_dim: float | None = None

    def __post_init__(self) -> None:
        # Megatron-LM's defaults (megatron/training/arguments.py): --moe-router-topk 2, --moe-ffn-hidden-size
        # = --ffn-hidden-size. Filled here so that every reader of a Model sees the values costed.
        if self.num_experts > 0:
            if self.moe_router_topk == 0:
                object.__setattr__(self, "moe_router_topk", 2)
            if self.moe_ffn_hidden_size == 0:
                object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)

    @property
    def rotary_concentration(self) -> float:
        """YaRN's attention factor, which multiplies RoPE's cos and sin: 1 without YaRN. Peng et al. 2023 (YaRN,
        arXiv:2309.00071 sec. 3.4): sqrt(1/t) = 0.1 ln(s) + 1; with mscale and mscale_all_dim given (DeepSeek-V3),
        the ratio of 0.1 m ln(s) + 1 at the two (Megatron-LM megatron/core/models/common/embeddings/
        yarn_rotary_pos_embedding.py, _yarn_get_concentration_factor and _yarn_get_mscale: 1 where s <= 1)."""
        s = self.yarn_rotary_scaling_factor
        if s <= 1.0:
            return 1.0

        def mscale(m: float) -> float:
            return 0.1 * m * math.log(s) + 1.0

        if self.yarn_mscale is not None and self.yarn_mscale_all_dim is not None:
            return mscale(self.yarn_mscale) / mscale(self.yarn_mscale_all_dim)
        return mscale(1.0)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def moe_layer_flags(self) -> tuple[bool, ...]:
        """One flag per layer: True where the layer's MLP is the routed experts (Megatron-LM moe_layer_pattern)."""
        return _moe_layer_flags(self.is_moe, self.moe_layer_freq, self.num_layers)

    def window_layer_flags(self) -> tuple[bool, ...]:
        """One flag per layer: True where layer i (0-based) attends over a sliding window of window_size keys.

        After Megatron-LM's is_layer_window_attention (megatron/core/transformer/utils.py, layer_number 1-based):
        no window_size: none; window_attn_skip_freq unset (0 here): every layer; an int k: every layer but each
        k-th (layer_number % k == 0 keeps full attention); a list: its entry per layer, 1 = sliding window,
        0 = full (Megatron's TransformerConfig: "[1,1,1,1,0,0,0,0], where 1 represents SWA").
        """
        if self.kind != "decoder" or not self.window_size:
            return (False,) * self.num_layers
        freq = self.window_attn_skip_freq
        if isinstance(freq, tuple):
            return tuple(bool(x) for x in freq)
        if freq == 0:
            return (True,) * self.num_layers
        return tuple((i + 1) % freq != 0 for i in range(self.num_layers))

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

    # ------------------------------------------------------------------ parameter counts
    # Conventions (those of the existing dense formulas, Narayanan et al. 2021 eq. (2) and Llama): a SwiGLU model
    # is Llama-style, no biases and RMSNorm (a scale per channel); a GELU model is GPT-style, biases on every
    # linear layer and LayerNorm (scale and shift). Every count is unsharded (tensor/expert parallelism split it).

    def _norm(self, width: int) -> int:
        """One norm over ``width`` channels: RMSNorm (scale) with SwiGLU, LayerNorm (scale, shift) otherwise."""
        return width if self.swiglu else 2 * width

    def _mlp(self, ffn: int) -> int:
        """One MLP h -> ffn -> h without its norm: SwiGLU's three h x ffn matrices (gate, up, down; Shazeer 2020),
        or GELU's two with their biases (ffn + h)."""
        h = self.hidden_size
        if ffn == 0:
            return 0
        return 3 * h * ffn if self.swiglu else 2 * h * ffn + ffn + h

    @property
    def attention_params(self) -> int:
        """One layer's attention with its input norm (0 for ``mlp``).

        MHA/GQA: Q (h x q), K and V (h x kv each), the output projection (q x h), with biases in a GELU model
        (Narayanan et al. 2021 eq. (2)); with qk_layernorm a norm of one head's width on Q and one on K (Qwen3's
        q_norm/k_norm, Megatron-LM's q_layernorm/k_layernorm over hidden_size_per_attention_head).

        MLA (DeepSeek-V2, arXiv:2405.04434 sec. 2.1.2-2.1.3, eqs. (9)-(14), (37)-(38); DeepSeek-V3 sec. 2.1.1;
        Megatron-LM MLASelfAttention): with a = heads, d = qk_head_dim, r = qk_pos_emb_head_dim, dv = v_head_dim,
        Q through its latent h x q_lora_rank then q_lora_rank x a(d + r) (q_lora_rank 0: h x a(d + r) directly),
        the KV latent and the shared rotary key h x (kv_lora_rank + r), K's and V's up projection
        kv_lora_rank x a(d + dv), the output projection a dv x h; no biases. With qk_layernorm a norm on each
        latent (q_lora_rank, kv_lora_rank), as Megatron-LM's MLA layer spec builds q_layernorm / kv_layernorm
        only under --qk-layernorm (DeepSeek-V3's q_a_layernorm / kv_a_layernorm).
        """
        if self.kind != "decoder":
            return 0
        h = self.hidden_size
        norm = self._norm(h)
        if self.multi_latent_attention:
            a, d, r, dv = self.num_attention_heads, self.qk_head_dim, self.qk_pos_emb_head_dim, self.v_head_dim
            qr, kvr = self.q_lora_rank, self.kv_lora_rank
            q = h * qr + qr * a * (d + r) if qr else h * a * (d + r)
            kv = h * (kvr + r) + kvr * a * (d + dv)
            latent_norms = (self._norm(qr) if qr else 0) + self._norm(kvr) if self.qk_layernorm else 0
            return q + kv + a * dv * h + latent_norms + norm
        q, kv = self.q_hidden_size, self.kv_hidden_size
        weights = h * (q + 2 * kv) + q * h
        biases = 0 if self.swiglu else (q + 2 * kv) + h
        qk_norm = 2 * self._norm(self.head_dim) if self.qk_layernorm else 0
        return weights + biases + qk_norm + norm

    @property
    def dense_mlp_params(self) -> int:
        """One dense MLP of ffn_hidden_size with its (pre-MLP) norm; the ``mlp`` kind's layer is h x h + h."""
        if self.kind == "mlp":
            return self.hidden_size * self.hidden_size + self.hidden_size
        return self._mlp(self.ffn_hidden_size) + self._norm(self.hidden_size)

    @property
    def expert_params(self) -> int:
        """ONE routed expert: an MLP of moe_ffn_hidden_size (SwiGLU or GELU as the dense MLP), no norm; 0 if dense."""
        return self._mlp(self.moe_ffn_hidden_size) if self.is_moe else 0

    @property
    def shared_expert_params(self) -> int:
        """All shared experts of one MoE layer: one MLP of moe_shared_expert_intermediate_size (Megatron-LM's
        SharedExpertMLP: DeepSeek's n_shared_experts x moe_intermediate_size as one wider MLP); 0 if none."""
        return self._mlp(self.moe_shared_expert_intermediate_size) if self.is_moe else 0

    @property
    def router_params(self) -> int:
        """One MoE layer's router: the h x num_experts gating matrix (Megatron-LM TopKRouter.weight); 0 if dense.

        # Assumption: the router's bias terms (DeepSeek-V3's e_score_correction_bias, GPT-OSS's router bias:
        # num_experts each) are left out: under 1e-6 of any preset's parameters."""
        return self.hidden_size * self.num_experts if self.is_moe else 0

    @property
    def moe_mlp_params(self) -> int:
        """One MoE layer's MLP block, every expert counted: the pre-MLP norm, the router, num_experts routed experts
        and the shared experts."""
        if not self.is_moe:
            return 0
        return (self._norm(self.hidden_size) + self.router_params + self.num_experts * self.expert_params
                + self.shared_expert_params)

    @property
    def moe_active_mlp_params(self) -> int:
        """A token's share of one MoE layer's MLP block: norm, router, moe_router_topk routed experts, shared."""
        if not self.is_moe:
            return 0
        return (self._norm(self.hidden_size) + self.router_params + self.moe_router_topk * self.expert_params
                + self.shared_expert_params)

    def _layer_index(self, i: int) -> int:
        if not 0 <= i < self.num_layers:
            raise IndexError(f"layer {i} of a {self.num_layers}-layer model")
        return i

    def layer_counts(self, *, active: bool = False) -> tuple[int, ...]:
        """layer_params(i) of every layer in model order (active: layer_active_params(i)), in one pass (computed
        once per model: memory and search read it per layer, layouts by the thousand)."""
        return _layer_counts(self, active)

    def layer_params(self, i: int) -> int:
        """Layer i's (0-based) weights and biases: attention + its MLP (the routed experts where moe_layer_flags()[i],
        every expert counted; ffn_hidden_size's dense MLP otherwise). Equal to Narayanan et al. 2021 eq. (2)'s
        12h^2 + 13h for a GPT layer."""
        return self.layer_counts(active=False)[self._layer_index(i)]

    def layer_active_params(self, i: int) -> int:
        """Layer i's parameters one token passes through: as layer_params(i), with moe_router_topk routed experts
        in place of num_experts (a token's forward matmul FLOPs are 2 x this, attention scores aside)."""
        return self.layer_counts(active=True)[self._layer_index(i)]

    @property
    def params_per_layer(self) -> int:
        """Weights and biases of one layer, where every layer has the same count (every dense model: unchanged).

        mlp: h x h weights + h biases (the lecture's nn.Linear layers).
        decoder: Narayanan et al. 2021 (arXiv:2104.04473) eq. (2) counts 12h^2 + 13h per GPT layer:
        QKV 3h^2 + 3h, projection h^2 + h, MLP 8h^2 + 5h (two h x 4h matrices), two layer norms 4h.
        Written out per matrix so GQA (K and V of width kv = g x head_dim), a head dim other than h / a (Q of
        width q = a x head_dim, the projection q x h) and SwiGLU (three h x f matrices, no biases in Llama) follow
        from the same arithmetic (attention_params + dense_mlp_params).

        An MoE model whose every layer is MoE gets the count with EVERY expert (the weights a layer holds, not
        what a token computes: see layer_active_params). A model whose layers differ (moe_layer_freq other than
        1, DeepSeek-V3's first dense layers) has no one count: ValueError; read layer_params(i).
        """
        counts = set(self.layer_counts(active=False))
        if len(counts) > 1:
            raise ValueError(f"model {self.name!r} has layers of different sizes (moe_layer_freq): "
                             "read layer_params(i), not params_per_layer")
        return counts.pop()

    @property
    def embedding_params(self) -> int:
        """Word embedding (vocab x h); the output projection is the same matrix when tied, else another."""
        if self.kind == "mlp":
            return 0
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def final_norm_params(self) -> int:
        """The norm after the last layer (0 for ``mlp``)."""
        return self._norm(self.hidden_size) if self.kind == "decoder" else 0

    @property
    def num_params(self) -> int:
        """Every parameter of the model, every expert counted: layers, embeddings (the output projection again when
        untied), final norm. Multi-token-prediction modules are NOT counted (see mtp_params): the published totals
        leave them out (DeepSeek-V3's 671B excludes its MTP module; the Hugging Face checkpoint's 685B includes
        it, with its own copies of the embedding and the output head)."""
        return sum(self.layer_counts(active=False)) + self.embedding_params \
            + self.final_norm_params

    @property
    def num_active_params(self) -> int:
        """The parameters one token passes through: num_params with moe_router_topk routed experts per MoE layer
        in place of num_experts (shared experts, attention, dense layers, both embeddings and the final norm
        counted in full); equal to num_params for a dense model. MTP modules are not counted (as num_params).

        Convention: Mistral's 12.9B for Mixtral 8x7B and Qwen's 3.3B for Qwen3-30B-A3B count the input embedding
        too; OpenAI's 5.1B for GPT-OSS-120B (model card Table 1) and DeepSeek's 37B leave it out (a lookup, no
        FLOPs): subtract vocab_size x hidden_size for theirs (tests/test_moe_models.py).
        """
        return sum(self.layer_counts(active=True)) + self.embedding_params \
            + self.final_norm_params

    @property
    def mtp_layers(self) -> int:
        """The multi-token-prediction modules the model builds (DeepSeek-V3 sec. 2.2): mtp_num_layers for a decoder,
        none for other kinds."""
        return self.mtp_num_layers if self.kind == "decoder" else 0

    @property
    def mtp_params(self) -> int:
        """All multi-token-prediction modules (mtp_num_layers of them), not in num_params. One module (DeepSeek-V3
        sec. 2.2, Megatron-LM MultiTokenPredictionLayer): norms on the hidden state and on the next token's
        embedding (enorm, hnorm), the 2h x h projection eh_proj, one transformer layer built like the model's last
        (Megatron-LM get_gpt_mtp_block_spec takes the decoder's last layer spec), its final norm; the embedding and
        the output head are the main model's, shared, not counted again."""
        if not self.mtp_layers:
            return 0
        h = self.hidden_size
        one = 2 * self._norm(h) + 2 * h * h + self.layer_params(self.num_layers - 1) + self._norm(h)
        return self.mtp_layers * one


@lru_cache(maxsize=256)
def _layer_counts(model: Model, active: bool) -> tuple[int, ...]:
    if model.kind == "mlp":
        return (model.dense_mlp_params,) * model.num_layers
    attention, dense = model.attention_params, model.dense_mlp_params
    moe = model.moe_active_mlp_params if active else model.moe_mlp_params
    return tuple(attention + (moe if flag else dense) for flag in model.moe_layer_flags())


@lru_cache(maxsize=256)
def _moe_layer_flags(is_moe: bool, freq: int | tuple[int, ...], num_layers: int) -> tuple[bool, ...]:
    if not is_moe:
        return (False,) * num_layers
    if isinstance(freq, tuple):
        return tuple(bool(x) for x in freq)
    return tuple(i % freq == 0 for i in range(num_layers))
