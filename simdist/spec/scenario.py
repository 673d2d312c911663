"""Scenario files (``scenarios/*.yaml``): the external contract (docs/architecture.md, "External contract").

Hardware, model and execution are separate inputs (as in Calculon): ``cluster`` names a topology preset
and overrides any of its fields, ``model`` names a model preset or describes one inline, ``parallel``,
``training`` and ``schedule`` describe the execution. Megatron-LM argument names are accepted as aliases
(``tensor_model_parallel_size`` for ``tp``, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, create_model, field_validator, model_validator

from simdist.limits import (
    FFN_HIDDEN_SIZE,
    GLOBAL_BATCH,
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
from simdist.spec.base import BucketSize, Duration, FieldProblem, Spec, count
from simdist.spec.faults import FaultsSpec
from simdist.spec.topology import TopologySpec


def _alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


def _megatron_switch(data: Any, switch: str, field: str, on: Any, off: Any) -> Any:
    """Translate Megatron-LM's boolean argument ``switch`` (e.g. ``overlap_grad_reduce: true``) into simdist's
    ``field`` (``on`` when true, ``off`` when false; ``off`` None: false leaves the default), refusing a
    contradiction with ``field`` given too."""
    if not isinstance(data, dict) or switch not in data:
        return data
    value = data[switch]
    if not isinstance(value, bool):
        raise FieldProblem((switch,), f"{switch} is a Megatron-LM switch: write true or false (fix: "
                                      f"write {switch}: true, or set {field} instead)")
    out = {k: v for k, v in data.items() if k != switch}
    wanted = on if value else off
    if wanted is None:
        if field in out and out[field] == on:
            raise FieldProblem((switch,), f"{switch}: false contradicts {field}: {on} (fix: drop one of them)")
        return out
    if field in out and out[field] != wanted:
        raise FieldProblem((switch,), f"{switch}: {str(value).lower()} contradicts {field}: {out[field]} "
                                      "(fix: drop one of them)")
    out[field] = wanted
    return out


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
        default=None, validation_alias=_alias("num_query_groups", "num_kv_heads"),
        description="key/value heads (grouped-query attention); default: num_attention_heads")
    kv_channels: count(HIDDEN_SIZE) | None = Field(
        default=None, validation_alias=_alias("kv_channels", "head_dim"),
        description="width of one attention head (Megatron-LM's kv_channels, alias head_dim); default hidden_size / "
                    "num_attention_heads; Qwen3 and GPT-OSS shapes differ; not read under multi_latent_attention "
                    "(qk_head_dim, qk_pos_emb_head_dim, v_head_dim)")
    ffn_hidden_size: count(FFN_HIDDEN_SIZE) | None = Field(default=None, description="MLP width; default 4 h")
    seq_length: count(SEQ_LENGTH) | None = Field(default=None, validation_alias=_alias("seq_length", "seq_len"),
                                                description="tokens per sequence s; default 2048")
    vocab_size: count(VOCAB_SIZE) | None = Field(
        default=None, validation_alias=_alias("vocab_size", "padded_vocab_size"),
        description="vocabulary (padded, as Megatron-LM pads it); default 51200")
    swiglu: bool | None = Field(default=None, description="SwiGLU MLP (three matrices) instead of GeLU (two)")
    kind: Literal["decoder", "mlp"] | None = Field(
        default=None, description="decoder (GPT/Llama transformer, the default) or mlp (the CS336 lecture's MLP)"
    )
    tied_embeddings: bool | None = Field(
        default=None, validation_alias=_alias("tied_embeddings", "tie_word_embeddings"),
        description="input and output embeddings share one matrix (default true)"
    )
    # Mixture of experts (Megatron-LM argument names; simdist.plan.model documents how each is costed).
    num_experts: count(NUM_EXPERTS) | None = Field(
        default=None, validation_alias=_alias("num_experts", "num_moe_experts"),
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


class ParallelSpec(Spec):
    """Parallel layout; axis sizes multiply to the number of GPUs used (tp innermost)."""

    tp: count(GPUS) = Field(default=1, validation_alias=_alias("tp", "tensor_model_parallel_size"),
                            description="tensor-parallel size (alias tensor_model_parallel_size)")
    pp: count(GPUS) = Field(default=1, validation_alias=_alias("pp", "pipeline_model_parallel_size"),
                            description="pipeline stages (alias pipeline_model_parallel_size)")
    dp: count(GPUS) = Field(default=1, validation_alias=_alias("dp", "data_parallel_size"),
                            description="data-parallel replicas (alias data_parallel_size)")
    vpp: count(VPP) = Field(default=1, validation_alias=_alias("vpp", "virtual_pipeline_model_parallel_size"),
                            description="model chunks per stage, interleaved_1f1b only (alias "
                                        "virtual_pipeline_model_parallel_size)")
    cp: count(GPUS) = Field(default=1, validation_alias=_alias("cp", "context_parallel_size"),
                            description="context-parallel size (alias context_parallel_size)")
    ep: count(GPUS) = Field(
        default=1, validation_alias=_alias("ep", "expert_model_parallel_size"),
        description="expert-parallel size: each MoE layer's routed experts sharded over ep ranks, carved out of "
                    "dp x cp as Megatron-Core does (alias expert_model_parallel_size)")
    etp: count(GPUS) | None = Field(
        default=None, validation_alias=_alias("etp", "expert_tensor_parallel_size"),
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
        default=None, validation_alias=_alias("pipeline_layout", "pipeline_model_parallel_layout"),
        description="Megatron-LM's --pipeline-model-parallel-layout: parts (chunk c of stage s is part c x pp + s) "
                    "separated by '|', E embedding, t decoder layer, L loss, (...)*n and x*n repeat, e.g. "
                    "'E|(t|)*126,L' (alias pipeline_model_parallel_layout)")
    account_for_embedding_in_pipeline_split: bool = Field(
        default=False, description="Megatron-LM's flag: the embedding takes a decoder layer's place in the first "
                                   "chunk")
    account_for_loss_in_pipeline_split: bool = Field(
        default=False, description="Megatron-LM's flag: the loss (output layer) takes a decoder layer's place in the "
                                   "last chunk")
    partition_method: str | None = Field(
        default=None, validation_alias=_alias("partition_method", "pp_partition_method"),
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
    def _megatron_names(cls, data: Any) -> Any:
        # Megatron-LM's --use-distributed-optimizer is ZeRO-1 (optimizer state sharded over data parallelism).
        return _megatron_switch(data, "use_distributed_optimizer", "zero_stage", 1, None)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp


class HostOverheadSpec(Spec):
    """Host-side costs of the eager framework (simdist.hardware.host); each unset one keeps its default from
    simdist/hardware/data/host_overhead.csv."""

    launch: Duration | None = Field(default=None, description="CPU time of one kernel launch (default 5 us)")
    dispatch: Duration | None = Field(default=None, description="framework time of one eager op before its launch "
                                                                "(default 3.3 us)")
    step_gap: Duration | None = Field(default=None, description="GPU idle time at the start of each pipeline step, "
                                                                "after Megatron's synchronize following the send/recv "
                                                                "(default 20 us); 0 for none")


class TrainingSpec(Spec):
    """Training settings: batch, recompute, precision, kernels and gradient reduction."""

    micro_batch_size: count(GLOBAL_BATCH) = Field(default=1, description="sequences per micro-batch")
    global_batch_size: count(GLOBAL_BATCH) = Field(description="sequences per step (all replicas)")
    recompute: Literal["none", "selective", "full"] = Field(
        default="none", validation_alias=_alias("recompute", "recompute_granularity"),
        description="activation recompute: none, selective (attention, Korthikanti et al. 2022) or full "
                    "(alias recompute_granularity)"
    )
    precision: Literal["fp32", "tf32", "bf16", "fp16", "fp8"] = Field(
        default="bf16", description="the dtype of the matrix multiplications (its dense peak is used)")
    attention: Literal["flash", "flash2", "flash3", "cudnn", "materialized"] = Field(
        default="flash", description="attention kernel: flash = flash2 (FlashAttention-2, scores never stored), "
                                     "flash3 (FlashAttention-3, Hopper), cudnn (cuDNN fused attention, as Transformer "
                                     "Engine runs on Hopper), each priced from its published benchmark figures; or "
                                     "materialized (the a x s x s scores in memory, as Megatron-LM in 2021-22)")
    attention_mask: Literal["causal", "full"] = Field(
        default="causal", validation_alias=_alias("attention_mask", "attn_mask_type"),
        description="causal (decoder LMs: fused kernels skip the masked half, model FLOPs count half the scores) or "
                    "full (no mask) (alias attn_mask_type)")
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8", "blockwise"] = Field(
        default="delayed", description="under precision fp8, how the linear layers' GEMMs are scaled (Megatron-LM "
                                       "--fp8-recipe): delayed (TE DelayedScaling), tensorwise (current scaling), "
                                       "mxfp8 (Blackwell block scaling), blockwise (1x128 blocks); attention, norms "
                                       "and communication stay bf16")
    fp8_param_gather: bool = Field(
        default=False, description="under precision fp8 with the distributed optimizer or ZeRO, gather parameters "
                                   "in fp8 (Megatron-LM --fp8-param-gather)")

    @field_validator("fp8_recipe", mode="before")
    @classmethod
    def _fp8_recipe_names(cls, value: object) -> object:
        """Transformer Engine's recipe class names are accepted for Megatron-LM's --fp8-recipe names."""
        names = {"delayedscaling": "delayed", "float8currentscaling": "tensorwise", "current": "tensorwise",
                 "mxfp8blockscaling": "mxfp8", "float8blockscaling": "blockwise"}
        return names.get(str(value).lower(), value) if isinstance(value, str) else value
    tp_comm_overlap: bool = Field(
        default=False, description="overlap the sequence-parallel all-gathers and reduce-scatters with their GEMMs "
                                   "(Megatron-LM --tp-comm-overlap, Transformer Engine userbuffers); needs "
                                   "parallel.sequence_parallel and tp > 1")
    moe_token_dispatcher_type: Literal["alltoall", "allgather", "flex"] = Field(
        default="alltoall", description="how MoE layers move tokens to their experts (Megatron-LM "
                                        "--moe-token-dispatcher-type): alltoall (dispatch and combine all-to-all over "
                                        "ep), allgather (gather every token, reduce-scatter back), flex (DeepEP-style "
                                        "fused dispatch)")
    moe_expert_capacity_factor: float | None = Field(
        default=None, gt=0.0, le=1024.0,
        description="tokens an expert takes, as a multiple of its balanced share (--moe-expert-capacity-factor); "
                    "tokens beyond it are dropped; null: dropless")
    moe_imbalance: float = Field(
        default=1.0, ge=1.0, le=1024.0,
        description="routing imbalance: the busiest expert-parallel rank's routed tokens / the mean (1.0: "
                    "perfectly balanced); the busiest rank's extra tokens cost compute and all-to-all time")
    moe_grouped_gemm: bool = Field(
        default=True, description="the local experts' GEMMs as one grouped GEMM (--moe-grouped-gemm) instead of "
                                  "one GEMM per expert")
    overlap_moe_expert_parallel_comm: bool = Field(
        default=False, description="overlap the MoE all-to-all with another micro-batch's compute "
                                   "(Megatron-LM --overlap-moe-expert-parallel-comm, the 1F1B A2A overlap)")
    grad_reduce: Literal["per_parameter", "bucketed", "overlapped"] = Field(
        default="bucketed", description="data-parallel gradient reduction: one all-reduce per parameter tensor "
                                        "(the lecture), buckets after the backward, or buckets overlapped with it "
                                        "(Megatron-LM's overlap_grad_reduce: true is accepted for overlapped)")
    grad_reduce_in_fp32: bool | None = Field(
        default=None, validation_alias=_alias("grad_reduce_in_fp32", "accumulate_allreduce_grads_in_fp32"),
        description="16-bit training's gradients accumulated and reduced in fp32 (4 bytes each) or in the parameters' "
                    "16-bit dtype (false, as Megatron-Bridge's performance recipes run); default as Megatron-LM: fp32 "
                    "for bf16 and fp8, fp16 for fp16 (alias accumulate_allreduce_grads_in_fp32)")
    grad_bucket_size: BucketSize | None = Field(
        default=None, description="gradient bucket size (at least 1 MB), on every model chunk; default as "
                                  "Megatron-Core: one bucket per chunk, and with grad_reduce: overlapped buckets of "
                                  "max(40M, 1M x dp x cp) parameters on pipeline rank 0's first chunk")
    overlap_param_gather: bool = Field(
        default=False, description="overlap the distributed optimizer's parameter all-gather with the next step's "
                                   "forward: each gradient bucket's gather runs asynchronously and the first "
                                   "micro-batch's forward waits for it before the layers that use it (Megatron-LM "
                                   "--overlap-param-gather); needs parallel.zero_stage: 1 (use_distributed_optimizer) "
                                   "and grad_reduce: overlapped")
    zero3_fetch: Literal["prefetch", "per_parameter"] = Field(
        default="prefetch", description="ZeRO-3 parameter traffic: prefetch (one all-gather per model chunk, issued "
                                        "ahead of the compute, as PyTorch FSDP) or per_parameter (each tensor "
                                        "gathered before each use and its gradient reduce-scattered, blocking, "
                                        "through list collectives: DeepSpeed ZeRO-3 as of 2021)")
    dp_batch_split: list[count(GLOBAL_BATCH)] | None = Field(
        default=None, description="local batch of each data-parallel rank (sums to global_batch_size)")
    host_overhead: HostOverheadSpec = Field(
        default=HostOverheadSpec(), description="host costs per kernel launch, per eager op and per pipeline step "
                                                "(defaults from published measurements)")

    @model_validator(mode="before")
    @classmethod
    def _megatron_names(cls, data: Any) -> Any:
        # Megatron-LM's --overlap-grad-reduce: the gradient buckets reduce while the backward runs.
        return _megatron_switch(data, "overlap_grad_reduce", "grad_reduce", "overlapped", None)


Schedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "zb_h1"]


class ScenarioSpec(Spec):
    """One training step to predict: cluster x model x layout x training settings x schedule."""

    name: str = Field(default="", description="a title for reports")
    cluster: ClusterSpec = Field(description="a topology preset or file, with any of its fields "  # type: ignore[valid-type]
                                             "overridden")
    model: ModelSpec = Field(description="a model preset, inline fields, or a Hugging Face config.json")
    parallel: ParallelSpec = Field(default=ParallelSpec(), description="the parallel layout")
    training: TrainingSpec = Field(description="batch, recompute, precision and gradient reduction")
    schedule: Schedule = Field(default="1f1b", description="pipeline schedule: gpipe, 1f1b, interleaved_1f1b or "
                                                           "zb_h1")
    calibration: Path | None = Field(
        default=None, description="a calibration file (simdist calibrate), relative to this scenario file")
    faults: FaultsSpec = Field(default_factory=FaultsSpec, description="what-ifs: slow GPUs, degraded links, and "
                                                                       "the checkpoint/restart costs of goodput")
