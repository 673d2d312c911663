"""Scenario files (``scenarios/*.yaml``): the external contract (docs/architecture.md, "External contract").

Hardware, model and execution are separate inputs (as in Calculon): ``cluster`` names a topology preset
and overrides any of its fields, ``model`` names a model preset or describes one inline, ``parallel``,
``training`` and ``schedule`` describe the execution. Megatron-LM argument names are accepted as aliases
(``tensor_model_parallel_size`` for ``tp``, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, create_model, model_validator

from simdist.limits import (
    FFN_HIDDEN_SIZE,
    GPUS,
    GPUS_PER_NODE,
    HIDDEN_SIZE,
    NUM_EXPERTS,
    NUM_HEADS,
    NUM_LAYERS,
    NUM_NODES,
    SEQ_LENGTH,
    VOCAB_SIZE,
    VPP,
)
from simdist.spec.aliases import alias, choice, switch
from simdist.spec.base import FieldProblem, Spec, count
from simdist.spec.faults import FaultsSpec
from simdist.spec.framework import with_framework_defaults
from simdist.spec.topology import TopologySpec
from simdist.spec.training import TrainingSpec


# A cluster is a topology preset (or file) plus overrides of any topology field. The override fields
# mirror TopologySpec's own, so that a typo is refused here with the field named; their values are
# validated when merged into the preset (simdist.spec.load.resolve_cluster).
class _OneTopology(Spec):
    @model_validator(mode="after")
    def _preset_or_file(self) -> _OneTopology:
        if getattr(self, "preset", None) is not None and getattr(self, "file", None) is not None:
            raise ValueError("give the cluster's preset or its file, not both")
        return self


class PlacementSpec(Spec):
    """The GPUs a job uses when it uses part of the cluster: the first gpus_per_node GPUs (whole hosts) of each of
    the first num_nodes nodes; the rest stay idle (simdist.hardware.placement)."""

    num_nodes: count(NUM_NODES) | None = Field(default=None, description="nodes the job uses; default all")
    gpus_per_node: count(GPUS_PER_NODE) | None = Field(
        default=None, description="GPUs the job uses on each of its nodes (whole hosts: a multiple of the GPUs per "
                                  "server or tray); default all")


ClusterSpec = create_model(
    "ClusterSpec",
    __base__=_OneTopology,
    __doc__="A topology preset or file, with any of its fields overridden (deep merge).",
    preset=(str | None, Field(default=None, description="a name from `simdist topo list`")),
    placement=(PlacementSpec | None, Field(
        default=None, description="a job on part of the cluster, e.g. {num_nodes: 4, gpus_per_node: 64} on "
                                  "gb300-nvl72 racks; without it the layout must use every GPU")),
    file=(Path | None, Field(default=None, description="a topology YAML file instead of a preset (relative to "
                                                       "the scenario file)")),
    **{name: (Any, Field(default=None, description=f"overrides the topology's {name} (simdist schema topology)"))
       for name in TopologySpec.model_fields if name != "name"},
)


class ModelSpec(Spec):
    """A model preset, an inline description, or a Hugging Face config.json (exactly one)."""

    preset: str | None = Field(default=None, description="a model preset (gpt3-175b, llama3-405b, ...); fields "
                                                         "given beside it override the preset's")
    hf_config: Path | None = Field(default=None, description="a Hugging Face config.json of a decoder, dense or "
                                                             "mixture-of-experts (Mixtral, Qwen3-MoE, DeepSeek-V3 "
                                                             "with MLA, GPT-OSS; relative to the scenario file); a "
                                                             "key that changes the cost and is not modelled is an "
                                                             "error naming it")
    num_layers: count(NUM_LAYERS) | None = Field(default=None, description="transformer layers (or MLP layers)")
    hidden_size: count(HIDDEN_SIZE) | None = Field(default=None, description="model width h")
    num_attention_heads: count(NUM_HEADS) | None = Field(default=None, description="attention heads a")
    num_query_groups: count(NUM_HEADS) | None = Field(
        default=None, validation_alias=alias("num_query_groups", "num_kv_heads"),
        description="key/value heads (grouped-query attention); default: num_attention_heads")
    kv_channels: count(HIDDEN_SIZE) | None = Field(
        default=None, validation_alias=alias("kv_channels", "head_dim"),
        description="width of one attention head (Megatron-LM's kv_channels, alias head_dim); default hidden_size / "
                    "num_attention_heads; Qwen3 and GPT-OSS shapes differ; not read under multi_latent_attention "
                    "(qk_head_dim, qk_pos_emb_head_dim, v_head_dim)")
    ffn_hidden_size: count(FFN_HIDDEN_SIZE) | None = Field(default=None, description="MLP width; default 4 h")
    seq_length: count(SEQ_LENGTH) | None = Field(default=None, validation_alias=alias("seq_length", "seq_len"),
                                                description="tokens per sequence s; default 2048")
    vocab_size: count(VOCAB_SIZE) | None = Field(
        default=None, validation_alias=alias("vocab_size", "padded_vocab_size"),
        description="vocabulary (padded, as Megatron-LM pads it); default 51200")
    swiglu: bool | None = Field(default=None, description="SwiGLU MLP (three matrices) instead of GeLU (two)")
    kind: Literal["decoder", "mlp"] | None = Field(
        default=None, description="decoder (GPT/Llama transformer, the default) or mlp (the CS336 lecture's MLP)"
    )
    tied_embeddings: bool | None = Field(
        default=None, validation_alias=alias("tied_embeddings", "tie_word_embeddings"),
        description="input and output embeddings share one matrix (default true)"
    )
    yarn_rotary_scaling_factor: float | None = Field(
        default=None, gt=0.0, le=1e6,
        description="YaRN's context extension factor s (Megatron-LM --yarn-rotary-scaling-factor; Hugging Face "
                    "rope_scaling factor with rope_type yarn; GPT-OSS 32); with yarn_mscale and yarn_mscale_all_dim "
                    "it sets YaRN's attention factor, which multiplies RoPE's cos and sin: where it is not 1, "
                    "Megatron-Core applies RoPE in its unfused PyTorch path (Transformer Engine's fused RoPE takes "
                    "no such factor), op by op (simdist.plan.elementwise); absent: no YaRN")
    yarn_mscale: float | None = Field(
        default=None, ge=0.0, le=1e3, description="YaRN's mscale (Megatron-LM --yarn-mscale; DeepSeek-V3 1.0); with "
                                                  "yarn_mscale_all_dim the attention factor is their ratio, "
                                                  "without them 0.1 ln(s) + 1")
    yarn_mscale_all_dim: float | None = Field(
        default=None, ge=0.0, le=1e3, description="YaRN's mscale_all_dim (Megatron-LM --yarn-mscale-all-dim)")
    add_bias_linear: bool | None = Field(
        default=None, description="the linear layers carry biases (Megatron-LM --add-bias-linear; GPT-OSS; default "
                                  "false). Costed where a bias adds kernels: a routed expert's fc2 bias, which "
                                  "Megatron-Core's grouped experts (TEGroupedMLP) add per local expert in eager "
                                  "PyTorch, weighted by each row's router probability (simdist.plan.moe_bias); a dense "
                                  "linear's bias rides in its GEMM's epilogue or a fused bias kernel and costs nothing "
                                  "here; biases are not counted in num_params")
    activation_func_clamp_value: float | None = Field(
        default=None, gt=0.0, le=1e6, validation_alias=alias("activation_func_clamp_value", "swiglu_limit"),
        description="the routed experts' gated activation first clamps fc1's two halves to this limit, the gate "
                    "at most it and the linear half within its +/- (Megatron-LM --activation-func-clamp-value; "
                    "Hugging Face swiglu_limit; GPT-OSS 7.0): Megatron-Core runs the clamp in eager PyTorch "
                    "beside its fused activation, 3 kernels forward and 9 backward (simdist.plan.glu_clamp); "
                    "needs a mixture-of-experts model with gated (swiglu) experts; absent: no clamp")
    # Mixture of experts (Megatron-LM argument names; simdist.plan.model documents how each is costed).
    num_experts: count(NUM_EXPERTS) | None = Field(
        default=None, validation_alias=alias("num_experts", "num_moe_experts"),
        description="routed experts per MoE layer (Megatron-LM --num-experts); absent: a dense model")
    moe_router_topk: count(NUM_EXPERTS) | None = Field(
        default=None, description="experts each token is routed to (--moe-router-topk; default 2)")
    moe_ffn_hidden_size: count(FFN_HIDDEN_SIZE) | None = Field(
        default=None, description="one routed expert's FFN width (--moe-ffn-hidden-size; default ffn_hidden_size)")
    moe_shared_expert_intermediate_size: count(FFN_HIDDEN_SIZE, minimum=0) | None = Field(
        default=None, description="the shared experts' total FFN width, every token through them "
                                  "(--moe-shared-expert-intermediate-size); 0 or absent: none")
    moe_layer_freq: count(NUM_LAYERS) | list[Literal[0, 1]] | None = Field(
        default=None, description="which layers are MoE (--moe-layer-freq): an int k (every k-th layer, from the "
                                  "first) or one 0/1 per layer, e.g. [0, 0, 0, 1, 1, ...]; dense layers use "
                                  "ffn_hidden_size; default 1 (every layer)")
    # Multi-latent attention (DeepSeek-V2/V3; Megatron-LM --multi-latent-attention and its MLA arguments).
    multi_latent_attention: bool | None = Field(
        default=None, description="DeepSeek's multi-latent attention: Q and KV through low-rank latents "
                                  "(q_lora_rank, kv_lora_rank), heads of qk_head_dim + qk_pos_emb_head_dim for "
                                  "Q/K and v_head_dim for V")
    q_lora_rank: count(HIDDEN_SIZE, minimum=0) | None = Field(
        default=None, description="MLA query latent rank (--q-lora-rank); 0 or absent: Q projected directly from "
                                  "the hidden state")
    kv_lora_rank: count(HIDDEN_SIZE) | None = Field(
        default=None, description="MLA key/value latent rank (--kv-lora-rank); needed with multi_latent_attention")
    qk_head_dim: count(HIDDEN_SIZE) | None = Field(
        default=None, description="MLA Q/K head dim without the rotary part (--qk-head-dim; Hugging Face "
                                  "qk_nope_head_dim); needed with multi_latent_attention")
    qk_pos_emb_head_dim: count(HIDDEN_SIZE, minimum=0) | None = Field(
        default=None, description="MLA rotary (decoupled) Q/K head dim (--qk-pos-emb-head-dim; Hugging Face "
                                  "qk_rope_head_dim); 0 or absent: none")
    v_head_dim: count(HIDDEN_SIZE) | None = Field(
        default=None, description="MLA value head dim (--v-head-dim); needed with multi_latent_attention")
    qk_layernorm: bool | None = Field(
        default=None, description="a norm on Q and K per head (--qk-layernorm; Qwen3, OLMo 2); with "
                                  "multi_latent_attention a norm on each latent instead (DeepSeek-V3), as Megatron-LM")
    window_size: count(SEQ_LENGTH, minimum=0) | None = Field(
        default=None, description="sliding-window attention: keys per query (tokens; --window-size); 0 or absent: "
                                  "full attention")
    window_attn_skip_freq: count(NUM_LAYERS) | list[Literal[0, 1]] | None = Field(
        default=None, description="which layers keep full attention under window_size (--window-attn-skip-freq): an "
                                  "int k (every k-th layer, counting from 1, full; the others windowed) or one 0/1 "
                                  "per layer (1: sliding window, 0: full, as Megatron-LM); absent: every layer "
                                  "windowed")
    mtp_num_layers: count(NUM_LAYERS, minimum=0) | None = Field(
        default=None, description="multi-token-prediction modules after the last layer (--mtp-num-layers; "
                                  "DeepSeek-V3 trains with 1), each built like the last layer; 0 or absent: none; "
                                  "their parameters are not in the reported num_params, as in the published totals")

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        inline = [k for k in ("num_layers", "hidden_size", "num_attention_heads") if getattr(self, k) is not None]
        sources = [name for name, on in (("preset", self.preset), ("hf_config", self.hf_config), ("inline", inline))
                   if on]
        if not sources:
            raise ValueError("give one of: preset, hf_config, or num_layers/hidden_size/num_attention_heads")
        if len(sources) > 1 and not (sources == ["preset", "inline"]):
            raise ValueError(f"give only one model source, not {' and '.join(sources)}")
        if sources == ["inline"]:
            # A decoder needs its attention heads; an mlp (the lecture's MLP) only its depth and width.
            needed = ("num_layers", "hidden_size") if self.kind == "mlp" else (
                "num_layers", "hidden_size", "num_attention_heads")
            missing = [k for k in needed if getattr(self, k) is None]
            if missing:
                raise ValueError(f"an inline {self.kind or 'decoder'} model also needs {', '.join(missing)}")
        return self


MEGATRON_FSDP_STRATEGIES = {"no_shard": {"zero_stage": 0}, "optim": {"zero_stage": 1},
                            "optim_grads": {"zero_stage": 2}, "optim_grads_params": {"zero_stage": 3}}
"""Megatron-FSDP's --data-parallel-sharding-strategy (megatron/core/distributed/distributed_data_parallel_config.py)
as ZeRO stages."""
FSDP_STRATEGIES = {"FULL_SHARD": {"zero_stage": 3, "reshard_after_forward": True},
                   "SHARD_GRAD_OP": {"zero_stage": 3, "reshard_after_forward": False},
                   "NO_SHARD": {"zero_stage": 0},
                   "HYBRID_SHARD": {"zero_stage": 3, "reshard_after_forward": True},
                   "_HYBRID_SHARD_ZERO2": {"zero_stage": 3, "reshard_after_forward": False}}
"""PyTorch FSDP's ShardingStrategy (torch/distributed/fsdp/api.py): FULL_SHARD reshards after forward, SHARD_GRAD_OP
keeps the parameters gathered until the backward; the hybrid ones shard inside a group (give dp_shard: FSDP shards
within a node by default) and replicate across."""


def _hsdp_degrees(data: Any) -> Any:
    """torchtitan's ``data_parallel_replicate_degree`` (with ``data_parallel_shard_degree`` = dp_shard) as dp and
    dp_shard: dp = replicate x shard; a hybrid FSDP strategy without dp_shard is refused (its group is the node)."""
    if not isinstance(data, dict):
        return data
    strategy = str(data.get("sharding_strategy", "")).upper()
    out = dict(data)
    shard = out.get("dp_shard", out.get("data_parallel_shard_degree"))
    if "data_parallel_replicate_degree" in out:
        replicate = out.pop("data_parallel_replicate_degree")
        if not (isinstance(replicate, int) and not isinstance(replicate, bool) and replicate >= 1):
            raise FieldProblem(("data_parallel_replicate_degree",), "data_parallel_replicate_degree must be a positive "
                                                                    "integer (fix: e.g. 2)")
        if not (isinstance(shard, int) and not isinstance(shard, bool) and shard >= 1):
            raise FieldProblem(("data_parallel_replicate_degree",), "data_parallel_replicate_degree needs "
                                                                    "data_parallel_shard_degree (fix: give both; "
                                                                    "dp = their product)")
        dp = out.get("dp", out.get("data_parallel_size"))
        if dp is not None and dp != replicate * shard:
            raise FieldProblem(("data_parallel_replicate_degree",),
                               f"dp = {dp} is not data_parallel_replicate_degree x data_parallel_shard_degree = "
                               f"{replicate * shard} (fix: drop dp or correct it)")
        out["dp"] = replicate * shard
    elif shard is not None and "dp" not in out and "data_parallel_size" not in out:
        out["dp"] = shard  # torchtitan: the shard degree alone is the data-parallel size
    if strategy.startswith(("HYBRID_SHARD", "_HYBRID")) and shard is None:
        raise FieldProblem(("sharding_strategy",), f"{strategy} shards inside a group and replicates across: give "
                                                   "parallel.dp_shard (FSDP's default group is one node: its GPUs)")
    return out


class ParallelSpec(Spec):
    """Parallel layout; axis sizes multiply to the number of GPUs used (tp innermost)."""

    TRANSLATED: ClassVar[dict[str, tuple[str, ...]]] = {
        "use_distributed_optimizer": ("zero_stage",), "data_parallel_sharding_strategy": ("zero_stage",),
        "sharding_strategy": ("zero_stage", "reshard_after_forward"), "data_parallel_replicate_degree": ("dp",)}
    """The frameworks' argument names this section translates, and the fields each sets (simdist.spec.aliases)."""

    tp: count(GPUS) = Field(default=1, validation_alias=alias("tp", "tensor_model_parallel_size",
                                                                "tensor_parallel_degree"),
                            description="tensor-parallel size (alias tensor_model_parallel_size, torchtitan's "
                                        "tensor_parallel_degree)")
    pp: count(GPUS) = Field(default=1, validation_alias=alias("pp", "pipeline_model_parallel_size",
                                                                "pipeline_parallel_degree"),
                            description="pipeline stages (alias pipeline_model_parallel_size, torchtitan's "
                                        "pipeline_parallel_degree)")
    dp: count(GPUS) = Field(default=1, validation_alias=alias("dp", "data_parallel_size"),
                            description="data-parallel replicas (alias data_parallel_size); with torchtitan's names "
                                        "data_parallel_shard_degree x data_parallel_replicate_degree")
    dp_shard: count(GPUS) | None = Field(
        default=None, validation_alias=alias("dp_shard", "data_parallel_shard_degree"),
        description="hybrid sharding (HSDP, ZeRO++ hpZ-like): the ZeRO / FSDP shards live over groups of dp_shard "
                    "consecutive data-parallel ranks and are replicated over dp / dp_shard groups, whose gradients are "
                    "all-reduced after the reduce-scatter (PyTorch FSDP HYBRID_SHARD, FSDP2 2-D mesh, torchtitan "
                    "data_parallel_shard_degree); default dp (full sharding)")
    reshard_after_forward: bool | None = Field(
        default=None, description="ZeRO-3 / FSDP: free each unit's gathered parameters after its forward and gather "
                                  "them again for its backward (true: FSDP FULL_SHARD, FSDP2's default), or keep "
                                  "them until the backward (false: SHARD_GRAD_OP, ZeRO-2-like memory, one gather "
                                  "per micro-batch); default true, but false under pipeline parallelism with "
                                  "framework torchtitan or fsdp (torchtitan: reshard_after_forward = not "
                                  "pp_enabled). Under PyTorch pipelining true gathers every micro-batch's "
                                  "backward, the parameters then staying gathered into the next forward")
    vpp: count(VPP) = Field(default=1, validation_alias=alias("vpp", "virtual_pipeline_model_parallel_size"),
                            description="model chunks per stage, interleaved_1f1b only (alias "
                                        "virtual_pipeline_model_parallel_size)")
    cp: count(GPUS) = Field(default=1, validation_alias=alias("cp", "context_parallel_size"),
                            description="context-parallel size (alias context_parallel_size)")
    ep: count(GPUS) = Field(
        default=1, validation_alias=alias("ep", "expert_model_parallel_size"),
        description="expert-parallel size: each MoE layer's routed experts sharded over ep ranks, carved out of "
                    "dp x cp as Megatron-Core does (alias expert_model_parallel_size)")
    etp: count(GPUS) | None = Field(
        default=None, validation_alias=alias("etp", "expert_tensor_parallel_size"),
        description="tensor parallelism inside each expert, separate from attention's tp (alias "
                    "expert_tensor_parallel_size); default tp, as Megatron-Core")
    sequence_parallel: bool = Field(default=False, description="Megatron's sequence parallelism (tp > 1): norms "
                                                               "and dropout split along the sequence")
    zero_stage: Literal[0, 1, 2, 3] = Field(default=0, description="ZeRO stage: 1 optimizer state, 2 also "
                                                                   "gradients, 3 also parameters sharded over dp")
    order: str = Field(default="tp-cp-dp-pp",
                       description="mesh axes innermost first (Megatron-LM's RankGenerator order); rank r runs on "
                                   "GPU r, so tp innermost keeps tensor-parallel groups inside a node")
    pipeline_split: Literal["auto", "even", "lighter_ends"] = Field(
        default="auto", description="layers per stage: auto (what Megatron-LM runs: even where the layers divide by "
                                    "pp x vpp, else the embedding and/or the loss in a layer's place, else a layout "
                                    "spreading them evenly; the split chosen is printed), even, or lighter_ends (one "
                                    "layer fewer on the first and last stage, Llama 3)")
    layers_per_stage: list[count(NUM_LAYERS) | list[count(NUM_LAYERS, minimum=0)]] | None = Field(
        default=None, description="explicit decoder layers per pipeline stage; an entry may list the stage's vpp "
                                  "chunks, e.g. [0, 1, 1, 1] (a chunk of 0 holds only the embedding or the loss)")
    pipeline_layout: str | None = Field(
        default=None, validation_alias=alias("pipeline_layout", "pipeline_model_parallel_layout"),
        description="Megatron-LM's --pipeline-model-parallel-layout: parts (chunk c of stage s is part c x pp + s) "
                    "separated by '|', E embedding, t decoder layer, m multi-token prediction layer (all of them "
                    "in the last part, before L), L loss, (...)*n and x*n repeat, e.g. 'E|(t|)*126,L' (alias "
                    "pipeline_model_parallel_layout)")
    account_for_embedding_in_pipeline_split: bool = Field(
        default=False, description="Megatron-LM's flag: the embedding takes a decoder layer's place in the first "
                                   "chunk")
    account_for_loss_in_pipeline_split: bool = Field(
        default=False, description="Megatron-LM's flag: the loss (output layer) takes a decoder layer's place in the "
                                   "last chunk")
    partition_method: str | None = Field(
        default=None, validation_alias=alias("partition_method", "pp_partition_method"),
        description="DeepSpeed PipelineModule's partition (Megatron-DeepSpeed, vpp 1): uniform, parameters or "
                    "type:REGEX over its layer classes, e.g. type:transformer (alias pp_partition_method)")
    tp_style: Literal["megatron", "column"] = Field(
        default="megatron", description="megatron: column+row parallel pairs (all-reduce); column: the CS336 "
                                        "lecture's column-parallel layers (all-gather forward, reduce-scatter "
                                        "backward)")
    scatter_gather: bool = Field(default=True, description="Megatron's pipeline scatter/gather: each tp peer "
                                                           "sends 1/tp of the activation between stages")

    @model_validator(mode="before")
    @classmethod
    def _framework_names(cls, data: Any) -> Any:
        # Megatron-LM's --use-distributed-optimizer is ZeRO-1 (optimizer state sharded over data parallelism).
        data = switch(data, "use_distributed_optimizer", "zero_stage", 1, None)
        data = choice(data, "data_parallel_sharding_strategy", MEGATRON_FSDP_STRATEGIES, "Megatron-FSDP")
        data = _hsdp_degrees(data)
        return choice(data, "sharding_strategy", FSDP_STRATEGIES, "PyTorch FSDP")

    @model_validator(mode="after")
    def _shard_group(self) -> ParallelSpec:
        if self.dp_shard is not None and self.dp % self.dp_shard:
            raise FieldProblem(("dp_shard",), f"dp_shard = {self.dp_shard} does not divide dp = {self.dp} (fix: use a "
                                              "divisor of dp, the ranks of one shard group)")
        return self

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp


Schedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "dualpipe", "dualpipev"]


class ScenarioSpec(Spec):
    """One training step to predict: cluster x model x layout x training settings x schedule."""

    @model_validator(mode="before")
    @classmethod
    def _framework_defaults(cls, data: Any) -> Any:
        """The fields ``training.framework`` decides and the file leaves out (simdist.spec.framework)."""
        return with_framework_defaults(data, {"training": TrainingSpec, "parallel": ParallelSpec})

    name: str = Field(default="", description="a title for reports")
    cluster: ClusterSpec = Field(description="a topology preset or file, with any of its fields "  # type: ignore[valid-type]
                                             "overridden")
    model: ModelSpec = Field(description="a model preset, inline fields, or a Hugging Face config.json")
    parallel: ParallelSpec = Field(default=ParallelSpec(), description="the parallel layout")
    training: TrainingSpec = Field(description="batch, recompute, precision and gradient reduction")
    schedule: Schedule = Field(default="1f1b", description="pipeline schedule: gpipe, 1f1b, interleaved_1f1b or "
                                                           "zb_h1 (zb_v, dualpipe, dualpipev: simdist bubble "
                                                           "only, for now)")
    calibration: Path | None = Field(
        default=None, description="a calibration file (simdist calibrate), relative to this scenario file")
    faults: FaultsSpec = Field(default_factory=FaultsSpec, description="what-ifs: slow GPUs, degraded links, and "
                                                                       "the checkpoint/restart costs of goodput")
