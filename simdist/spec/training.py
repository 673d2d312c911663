"""The ``training:`` section of a scenario: batch, recompute, precision, kernels, the framework that runs the step and
how it reduces gradients and gathers parameters.

``framework`` names how the step is run (simdist.spec.framework): its profile fills every field of this section
(and of ``parallel:``) the file leaves out, each default with its source in ``simdist/spec/data/frameworks.csv``;
a field given in the file wins. The frameworks' own argument names are accepted as aliases (simdist.spec.aliases).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from simdist.limits import GLOBAL_BATCH, NUM_LAYERS
from simdist.spec.aliases import alias, switch, torchtitan_checkpointing
from simdist.spec.base import BucketSize, Duration, FieldProblem, Spec, count

__all__ = ["FRAMEWORKS", "RECOMPUTE_MODULES", "HostOverheadSpec", "TrainingSpec"]

class HostOverheadSpec(Spec):
    """Host-side costs of the eager framework (simdist.hardware.host); each unset one keeps its default from
    simdist/hardware/data/host_overhead.csv."""

    launch: Duration | None = Field(default=None, description="CPU time of one kernel launch (default 5 us)")
    dispatch: Duration | None = Field(default=None, description="framework time of one eager op before its launch "
                                                                "(default 8.48 us)")
    step_gap: Duration | None = Field(default=None, description="GPU idle time at the start of each pipeline step, "
                                                                "after Megatron's synchronize following the send/recv "
                                                                "(default 20 us); 0 for none")


FRAMEWORKS = ("megatron_core", "nemo", "torchtitan", "fsdp", "deepspeed", "composer")
"""The frameworks whose way of running a step simdist models (simdist.spec.framework; README "Frameworks")."""
_FRAMEWORK_NAMES = {"megatron": "megatron_core", "megatron-lm": "megatron_core", "megatron_lm": "megatron_core",
                    "megatron-core": "megatron_core", "mcore": "megatron_core", "megatron-bridge": "nemo",
                    "megatron_bridge": "nemo", "pytorch_fsdp": "fsdp", "pytorch-fsdp": "fsdp",
                    "llm-foundry": "composer", "llm_foundry": "composer", "llmfoundry": "composer",
                    "mosaic": "composer"}
RECOMPUTE_MODULES = ("core_attn", "mlp", "layernorm", "moe_act", "moe", "shared_experts", "mla_up_proj")
"""Megatron-Core's --recompute-modules (megatron/core/transformer/transformer_config.py, recompute_modules)."""
ATTENTION_KERNELS = ("flash", "flash2", "flash3", "flash4", "cudnn", "sdpa", "efficient", "triton", "flex",
                     "materialized")


class TrainingSpec(Spec):
    """Training settings: batch, recompute, precision, kernels and gradient reduction."""

    TRANSLATED: ClassVar[dict[str, tuple[str, ...]]] = {
        "overlap_grad_reduce": ("grad_reduce",),
        "disable_loss_parallel": ("loss_parallel",),
        "activation_checkpoint": ("recompute", "recompute_method", "recompute_num_layers"),
        "selective_ac_option": ("recompute", "recompute_method", "recompute_num_layers")}
    """The frameworks' argument names this section translates, and the fields each sets (simdist.spec.aliases)."""

    framework: Literal[FRAMEWORKS] = Field(  # type: ignore[valid-type]
        default="megatron_core",
        description="the framework that runs the step, as a set of defaults for every field it decides "
                    "(kernels, attention, optimizer, FSDP, recompute, gradient dtype): megatron_core (Megatron-LM with "
                    "Transformer Engine, the default), nemo (Megatron-Bridge / NeMo recipes), torchtitan (FSDP2 + "
                    "TP/PP/CP), fsdp (PyTorch FSDP in a plain training loop), deepspeed (DeepSpeed ZeRO), composer "
                    "(MosaicML Composer / llm-foundry); each profile's values and sources: "
                    "simdist/spec/data/frameworks.csv and README 'Frameworks'; a field given here wins")
    micro_batch_size: count(GLOBAL_BATCH) = Field(default=1, description="sequences per micro-batch")
    global_batch_size: count(GLOBAL_BATCH) = Field(description="sequences per step (all replicas)")
    recompute: Literal["none", "selective", "full", "op"] = Field(
        default="none", validation_alias=alias("recompute", "recompute_granularity"),
        description="activation recompute: none; selective (Megatron-Core: the modules of recompute_modules, by "
                    "default the attention core, Korthikanti et al. 2022); full (each layer's input kept, its forward "
                    "redone; recompute_method / recompute_num_layers choose the layers); or op (torchtitan's op-level "
                    "selective checkpointing: matmul and attention outputs saved, every other op redone) "
                    "(alias recompute_granularity)"
    )
    recompute_modules: list[Literal[RECOMPUTE_MODULES]] | None = Field(  # type: ignore[valid-type]
        default=None, description="under recompute: selective, the modules whose forward is redone in backward "
                                  "(Megatron-Core --recompute-modules): core_attn, mlp, layernorm, moe_act, moe, "
                                  "shared_experts, mla_up_proj; default [core_attn]")
    op_sac_saved_attention: list[Literal["flash", "flash2", "flash3", "flash4", "cudnn", "efficient", "triton", "flex",
                                         "materialized"]] | None = Field(
        default=None,
        description="under recompute: op, the attention kernels whose outputs the op policy saves; one it does not "
                    "save is run again in the backward (torchtitan's op_sac_save_list names SDPA's flash and "
                    "efficient ops and flex attention; its cuDNN op only since pytorch/torchtitan PR #2095, "
                    "2025-12-01, so earlier runs whose SDPA picked cuDNN recomputed their attention: write [flash, "
                    "efficient, flex]); default [flash, efficient, cudnn, flex]; FlashAttention-3/4, Triton and "
                    "materialized attention are no op of that list")
    recompute_method: Literal["uniform", "block", "every"] | None = Field(
        default=None, description="under recompute: full, which layers: uniform (every layer, checkpointed in groups "
                                  "of recompute_num_layers: Megatron-Core), block (the first recompute_num_layers "
                                  "layers of each pipeline chunk: Megatron-Core) or every (every recompute_num_layers"
                                  "-th layer: torchtitan's selective_ac_option: N); default uniform with groups of 1")
    recompute_num_layers: count(NUM_LAYERS) | None = Field(
        default=None, description="the layer count recompute_method reads (Megatron-Core --recompute-num-layers)")
    precision: Literal["fp32", "tf32", "bf16", "fp16", "fp8"] = Field(
        default="bf16", description="the dtype of the matrix multiplications (its dense peak is used)")
    attention: Literal[ATTENTION_KERNELS] = Field(  # type: ignore[valid-type]
        default="flash", description="attention kernel: flash = flash2 (FlashAttention-2, scores never stored), "
                                     "flash3 (FlashAttention-3, Hopper), flash4 (FlashAttention-4, Blackwell), cudnn "
                                     "(cuDNN fused attention, as Transformer Engine runs it), sdpa (PyTorch "
                                     "scaled_dot_product_attention: the backend PyTorch picks for the GPU), efficient "
                                     "(the memory-efficient / xformers kernel), triton (Triton FlashAttention), flex "
                                     "(FlexAttention), each priced from published kernel benchmarks "
                                     "(simdist.hardware.attention); or materialized (the a x s x s scores in memory, "
                                     "as Megatron-LM in 2021-22 and SDPA's math backend)")
    attention_mask: Literal["causal", "full"] = Field(
        default="causal", validation_alias=alias("attention_mask", "attn_mask_type"),
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
    fp8_attention: bool = Field(
        default=False, validation_alias=alias("fp8_attention", "fp8_dot_product_attention", "fp8_dpa"),
        description="the fused attention runs in fp8 (Megatron-LM --fp8-dot-product-attention, Transformer Engine's "
                    "FP8 DotProductAttention on cuDNN): its kernels at cuDNN's measured fp8 (mxfp8 under the mxfp8 "
                    "recipe) rate, and it keeps Q, K and V for backward at 1 byte an element; needs precision fp8 "
                    "with the delayed, tensorwise or mxfp8 recipe and attention cudnn (aliases "
                    "fp8_dot_product_attention, fp8_dpa)")
    moe_token_dispatcher_type: Literal["alltoall", "allgather", "flex"] = Field(
        default="alltoall", description="how MoE layers move tokens to their experts (Megatron-LM "
                                        "--moe-token-dispatcher-type): alltoall (dispatch and combine all-to-all over "
                                        "ep), allgather (gather every token, reduce-scatter back), flex (DeepEP-style "
                                        "fused dispatch)")
    moe_flex_dispatcher_backend: Literal["deepep", "hybridep"] = Field(
        default="deepep", description="the flex dispatcher's kernels (Megatron-LM --moe-flex-dispatcher-backend): "
                                      "deepep or hybridep; both send a token once per destination rank, and once "
                                      "per destination NVLink domain over the network where ep spans several "
                                      "(simdist.plan.moe_cost); inside an NVLink domain each reaches the share of "
                                      "NVLink its published benchmarks measure at Megatron's SM count "
                                      "(simdist.collectives.ep_kernels: HybridEP 0.65, DeepEP 0.44 on Blackwell)")
    moe_flex_dispatcher_num_sms: int | None = Field(
        default=None, ge=1, le=1024,
        validation_alias=alias("moe_flex_dispatcher_num_sms", "moe_deepep_num_sms", "moe_hybridep_num_sms"),
        description="SMs the flex dispatcher's kernels run on (Megatron-Core moe_flex_dispatcher_num_sms; aliases "
                    "moe_deepep_num_sms, moe_hybridep_num_sms): their NVLink rate follows the published rates at "
                    "that count, linear between the counts published and flat beyond them; null: Megatron's "
                    "default (DeepEP 20, HybridEP 32 as Megatron-Bridge runs it)")
    moe_expert_capacity_factor: float | None = Field(
        default=None, gt=0.0, le=1024.0,
        description="tokens an expert takes, as a multiple of its balanced share (--moe-expert-capacity-factor); "
                    "tokens beyond it are dropped; null: dropless")
    moe_imbalance: float = Field(
        default=1.0, ge=1.0, le=1024.0,
        description="routing imbalance: the busiest expert-parallel rank's routed tokens / the mean (1.0: "
                    "perfectly balanced); the busiest rank's extra tokens cost compute and all-to-all time")
    moe_routing: Literal["balanced", "multinomial", "zipf", "histogram"] | None = Field(
        default=None, description="routing load as a distribution instead of moe_imbalance (simdist.plan.moe_routing): "
                                  "balanced (every expert exactly its share, an idealisation), multinomial (uniform "
                                  "experts, per-micro-batch fluctuation: also Megatron-LM "
                                  "--moe-router-force-load-balancing, whose router draws random logits), zipf (expert "
                                  "popularity ~ rank^-moe_routing_skew) or histogram (each expert's share measured "
                                  "in a run, moe_routing_file); the busiest ep rank's expected load per micro-batch "
                                  "becomes the imbalance")
    moe_routing_skew: float = Field(
        default=1.0, ge=0.0, le=8.0, description="the Zipf exponent s of moe_routing: zipf (0: uniform)")
    moe_routing_file: Path | None = Field(
        default=None, description="moe_routing: histogram's measured tokens per expert, a CSV file relative to this "
                                  "scenario: header 'expert,tokens' (or 'layer,expert,tokens', one histogram per MoE "
                                  "layer), one row per expert (simdist.spec.routing_histogram)")
    moe_grouped_gemm: bool = Field(
        default=True, description="the local experts' GEMMs as one grouped GEMM (--moe-grouped-gemm) instead of "
                                  "one GEMM per expert")
    moe_router_dtype: Literal["fp32", "fp64"] | None = Field(
        default=None, description="dtype of the router's logits and probabilities (Megatron-LM --moe-router-dtype); "
                                  "null: the hidden states' dtype (bf16 under bf16 and fp8 training), as Megatron-Core "
                                  "(TopKRouter.gating); the permuted probabilities travel with the routed rows and "
                                  "weight the experts' outputs in this dtype (simdist.plan.moe_bias)")
    moe_router_fusion: bool = Field(
        default=False, description="the router's top-k and auxiliary-loss kernels as Transformer Engine's fused ones "
                                   "(Megatron-LM --moe-router-fusion): 14 small kernels a layer instead of 45, "
                                   "forward and backward (simdist.plan.moe_router)")
    moe_router_padding_for_quantization: bool = Field(
        default=False, validation_alias=alias("moe_router_padding_for_quantization", "moe_router_padding_for_fp8"),
        description="under FP8 the router pads each rank's token count of every expert to the grouped GEMMs' "
                    "alignment, 16 rows (32 under MXFP8), so the experts need no padding copies (Megatron-LM "
                    "--moe-router-padding-for-quantization, formerly --moe-router-padding-for-fp8; the alltoall "
                    "dispatcher): the padding rows travel in the all-to-alls and the host synchronizes before "
                    "permutation 1. false (default): Transformer Engine's Fp8Padding copies the rows into padded "
                    "blocks before fc1 and back after fc2 (simdist.plan.moe_padding)")
    overlap_moe_expert_parallel_comm: bool = Field(
        default=False, description="overlap the MoE all-to-all with another micro-batch's compute "
                                   "(Megatron-LM --overlap-moe-expert-parallel-comm, the 1F1B A2A overlap)")
    moe_a2a_overlap_share: float = Field(
        default=1.0, gt=0.0, le=1.0,
        description="with overlap_moe_expert_parallel_comm: the share of each overlapped expert-parallel all-to-all "
                    "that runs beside the compute; the rest stays in the step's path after it. 1 (default): all of "
                    "it, less what Megatron's layer-by-layer pairing of each all-to-all with one compute segment of "
                    "the other micro-batch leaves exposed (simdist.plan.moe_pairing). From your own profile: 1 - "
                    "(communication time with nothing beside it, overlap on) / (communication time, overlap off); "
                    "NVIDIA's Nsight A/B of Qwen3-30B on 16 H100 (Megatron-Bridge skill "
                    "nemo-mbridge-perf-moe-comm-overlap) gives 1 - 6.87 / 8.25 = 0.17 (README)")
    delay_wgrad_compute: bool = Field(
        default=False,
        description="with overlap_moe_expert_parallel_comm: run each MoE layer's weight gradients after its backward "
                    "dispatch is issued, so that all-to-all runs beside them (Megatron-LM --delay-wgrad-compute; "
                    "Megatron-Bridge comm_overlap.delay_wgrad_compute, which its performance scripts set with "
                    "moe_a2a_overlap). false (Megatron's default): the backward dispatch waits for them "
                    "(simdist.plan.moe_pairing)")
    grad_reduce: Literal["per_parameter", "bucketed", "overlapped"] = Field(
        default="bucketed", description="data-parallel gradient reduction: one all-reduce per parameter tensor "
                                        "(the lecture), buckets after the backward, or buckets overlapped with it "
                                        "(Megatron-LM's overlap_grad_reduce: true is accepted for overlapped)")
    grad_reduce_in_fp32: bool | None = Field(
        default=None, validation_alias=alias("grad_reduce_in_fp32", "accumulate_allreduce_grads_in_fp32"),
        description="16-bit training's gradients accumulated and reduced in fp32 (4 bytes each) or in the parameters' "
                    "16-bit dtype (false, as Megatron-Bridge's performance recipes run); default as Megatron-LM: fp32 "
                    "for bf16 and fp8, fp16 for fp16 (alias accumulate_allreduce_grads_in_fp32)")
    exp_avg_dtype: Literal["fp32", "bf16", "fp16", "fp8"] = Field(
        default="fp32", description="dtype of Adam's first moment (Megatron-LM --exp-avg-dtype with "
                                    "--use-precision-aware-optimizer; DeepSeek-V3 keeps it in bf16): 4, 2, 2 or 1 "
                                    "bytes per parameter of optimizer state")
    exp_avg_sq_dtype: Literal["fp32", "bf16", "fp16", "fp8"] = Field(
        default="fp32", description="dtype of Adam's second moment (Megatron-LM --exp-avg-sq-dtype)")
    main_params_dtype: Literal["fp32", "fp16", "bf16"] = Field(
        default="fp32", description="dtype of 16-bit training's master weights: the optimizer's copy of the "
                                    "parameters (Megatron-LM --main-params-dtype: fp32 or fp16) or, under PyTorch "
                                    "FSDP's mixed precision (torchtitan, fsdp, composer at ZeRO-3), the sharded "
                                    "parameters themselves, the model's own dtype (bf16 for a model built in bf16, "
                                    "as KempnerForge's train.mixed_precision bf16 builds it); fp32 and tf32 training "
                                    "keep none")
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
    zero3_fetch: Literal["prefetch", "per_layer", "per_parameter"] = Field(
        default="prefetch", description="ZeRO-3 parameter traffic: prefetch (one all-gather per model chunk, issued "
                                        "ahead of the compute), per_layer (PyTorch FSDP / FSDP2, DeepSpeed ZeRO-3 "
                                        "with prefetch: each transformer block a unit, gathered one unit ahead of "
                                        "its compute, its gradients reduce-scattered as the next unit's backward "
                                        "runs; simdist.plan.fsdp) or per_parameter (each tensor gathered before "
                                        "each use and its gradient reduce-scattered, blocking, through list "
                                        "collectives: DeepSpeed ZeRO-3 as of 2021)")
    fsdp_version: Literal[1, 2] = Field(
        default=2, description="under zero3_fetch: per_layer, PyTorch FSDP's implementation: 1 (FlatParameter: "
                               "gathers into and reduces from one flat buffer) or 2 (fully_shard, per-parameter "
                               "DTensor shards: a copy into the gather buffer and out of it per unit, and a copy "
                               "into the reduce-scatter buffer; simdist.plan.fsdp)")
    fsdp_no_sync: bool = Field(
        default=False, description="under zero3_fetch: per_layer, accumulate the gradients of every micro-batch but "
                                   "the last unsharded, in the reduction's dtype, and reduce-scatter them once, unit "
                                   "by unit in the last micro-batch's backward (PyTorch FSDP1 no_sync(), FSDP2 "
                                   "set_requires_gradient_sync(False): FSDPParam.to_accumulated_grad_if_needed); "
                                   "false: every micro-batch reduce-scatters its own (torchtitan's way)")
    backward_prefetch: Literal["pre", "post"] = Field(
        default="pre", description="under zero3_fetch: per_layer, when the next unit's parameter all-gather is issued "
                                   "in backward (PyTorch FSDP backward_prefetch: BACKWARD_PRE / BACKWARD_POST): pre "
                                   "(before the current unit's gradient computation: it runs beside it; FSDP's default "
                                   "and FSDP2's only behaviour) or post (after it: the gather is exposed, the "
                                   "reduce-scatter hides; Composer's default)")
    kernel_fusion: Literal["fused", "eager"] = Field(
        default="fused", description="how element-wise work runs: fused (Megatron-Core with Transformer Engine / "
                                     "Apex: norm, rotary, bias-activation, bias-dropout-add and softmax each one "
                                     "kernel) or eager (one CUDA kernel per PyTorch op: composite norms, complex "
                                     "rotary, separate activation and multiply, residual adds, fp32 casts; "
                                     "simdist.plan.elementwise)")
    compile: bool = Field(
        default=False, validation_alias=alias("compile", "torch_compile"),
        description="torch.compile of each block (torchtitan compile, Composer compile_config): Inductor fuses each "
                    "chain of element-wise and reduction ops between two GEMM or attention kernels into one kernel "
                    "(simdist.plan.elementwise); GEMMs and attention unchanged (alias torch_compile)")
    compile_loss: bool | None = Field(
        default=None,
        description="torch.compile of the cross-entropy loss (torchtitan --compile.components loss): Inductor fuses "
                    "its upcast, softmax and gradient; false: the loss runs eagerly after the compiled model "
                    "(KempnerForge, OLMo-core, fms-fsdp, torchtitan before 2025-08); null: the framework's way, "
                    "compiled with the model in torchtitan, eager elsewhere (simdist.plan.execution)")
    cuda_graphs: bool = Field(
        default=False, validation_alias=alias("cuda_graphs", "enable_cuda_graph"),
        description="the step's kernels replayed from CUDA graphs (Megatron-LM --enable-cuda-graph, torch.compile "
                    "mode reduce-overhead): no host dispatch or launch per kernel, and the GPU's gap between kernels "
                    "shrinks to a graph's (simdist.hardware.host) (alias enable_cuda_graph)")
    cuda_graph_scope: list[Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "full",
                                   "full_iteration"]] | None = Field(
        default=None, validation_alias=alias("cuda_graph_scope", "cuda_graph_scopes"),
        description="which parts of each layer Megatron-Core replays from Transformer Engine CUDA graphs (Megatron-LM "
                    "--cuda-graph-scope with --cuda-graph-impl transformer_engine): attn (input norm, attention, its "
                    "residual), mlp (a dense layer's norm and MLP), moe (a drop-and-pad MoE layer's whole MLP), "
                    "moe_router (the pre-MLP norm, router and unoverlapped shared experts), moe_preprocess (the "
                    "dispatcher's metadata, with moe_router); full / full_iteration: every kernel, as cuda_graphs; "
                    "a scope given turns its graphs on (simdist.plan.graph_scope)")
    optimizer_implementation: Literal["fused", "foreach", "for_loop"] = Field(
        default="fused", validation_alias=alias("optimizer_implementation", "optimizer_impl"),
        description="how the Adam step runs: fused (one multi-tensor kernel: Apex / Transformer Engine "
                    "FusedAdam, DeepSpeed FusedAdam, torch.optim fused=True), foreach (torch.optim's default on GPU "
                    "tensors: one multi-tensor kernel per arithmetic op, each a pass over the state) or for_loop (one "
                    "kernel per op per parameter tensor); simdist.plan.optimizer")
    clip_grad: float = Field(
        default=1.0, ge=0.0, le=1e6, validation_alias=alias("clip_grad", "gradient_clipping", "max_norm"),
        description="gradient clipping by the global norm before the optimizer step (Megatron-LM --clip-grad, default "
                    "1.0; torchtitan max_norm; DeepSpeed gradient_clipping, default 0): any value above 0 adds a norm "
                    "pass and a scaling pass over the gradients (simdist.plan.optimizer); 0: off")
    cross_entropy_loss_fusion: bool = Field(
        default=False, description="the loss as one fused softmax cross-entropy kernel per pass (Megatron-LM "
                                   "--cross-entropy-loss-fusion, llm-foundry's fused_crossentropy) instead of the "
                                   "framework's separate fp32 kernels")
    z_loss_multiplier: float = Field(
        default=0.0, ge=0.0, le=1.0, validation_alias=alias("z_loss_multiplier", "z_loss", "lse_square_scale"),
        description="the z-loss beside the cross-entropy (PaLM's multiplier x logsumexp(logits)^2; OLMo-core "
                    "z_loss_multiplier, flash-attn lse_square_scale): above 0 the loss also takes the log-sum-exp "
                    "of the logits and its gradient, in the loss's kernel style (simdist.plan.elementwise; inside the "
                    "kernel under cross_entropy_loss_fusion); 0: off. Not Megatron-LM's --moe-z-loss-coeff (the "
                    "router's)")
    cp_comm_type: Literal["p2p", "all_gather", "a2a", "a2a+p2p"] = Field(
        default="p2p", description="how context parallelism moves keys and values (Megatron-LM --cp-comm-type): p2p "
                                   "(ring attention: cp - 1 exchanges of a KV block, each beside a block's "
                                   "attention), all_gather (all keys and values gathered before attention, Llama 3), "
                                   "a2a (Ulysses: all-to-alls of Q, K, V and the output over heads) or a2a+p2p "
                                   "(a2a inside a node, p2p across); simdist.plan.context_parallel")
    async_tp: bool = Field(
        default=False, validation_alias=alias("async_tp", "enable_async_tensor_parallel"),
        description="torchtitan's asynchronous tensor parallelism (micro-pipelined all-gather-matmul and "
                    "matmul-reduce-scatter over symmetric memory): each sequence-parallel collective runs in tp "
                    "pieces beside the GEMM it feeds, which runs as tp smaller GEMMs; needs "
                    "parallel.sequence_parallel, tp > 1 and compile (alias enable_async_tensor_parallel)")
    tp_input_layouts: Literal["module", "per_projection"] = Field(
        default="module",
        description="where a tensor-parallel module's input changes layout (sequence-sharded to replicated): module "
                    "(once per module: Megatron-LM's column-parallel region, torchtitan's PrepareModuleInput on "
                    "attention and feed_forward) or per_projection (each column-parallel projection redistributes "
                    "its own input: DTensor ColwiseParallel(input_layouts=Shard(1)) on each of q, k, v and of gate, "
                    "up, as KempnerForge plans it): one backward reduce-scatter (all-reduce without sequence "
                    "parallelism) per projection, and eagerly one forward all-gather per projection, one under "
                    "compile (Inductor merges the gathers of one input); simdist.plan.tp_plan")
    recompute_early_stop: bool = Field(
        default=False,
        description="eager full recompute stops once every tensor the backward saved is recomputed "
                    "(torch.utils.checkpoint's non-reentrant early stop, torch's default, kept by KempnerForge's "
                    "checkpoint_wrapper; torchtitan passes early_stop=False, Megatron-LM's checkpointing redoes the "
                    "whole layer): a dense layer's last reduce-scatter and residual add are not redone "
                    "(simdist.plan.recompute; under compile the down projection neither, whatever this says)")
    loss_parallel: bool = Field(
        default=True,
        description="the cross-entropy runs on each tensor-parallel rank's vocabulary shard (Megatron-LM's "
                    "vocab-parallel loss, torchtitan's loss_parallel); false: the logits are all-gathered and every "
                    "rank computes the loss over the whole vocabulary (DTensor ColwiseParallel(output_layouts="
                    "Replicate()) on the output layer, KempnerForge; torchtitan --parallelism.disable_loss_parallel, "
                    "alias disable_loss_parallel: true)")
    dp_batch_split: list[count(GLOBAL_BATCH)] | None = Field(
        default=None, description="local batch of each data-parallel rank (sums to global_batch_size)")
    host_overhead: HostOverheadSpec = Field(
        default=HostOverheadSpec(), description="host costs per kernel launch, per eager op and per pipeline step "
                                                "(defaults from published measurements)")

    @field_validator("backward_prefetch", mode="before")
    @classmethod
    def _fsdp_prefetch_names(cls, value: object) -> object:
        """PyTorch FSDP's enum names (BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST) for pre and post."""
        if isinstance(value, str):
            name = value.rsplit(".", 1)[-1].lower()
            return {"backward_pre": "pre", "backward_post": "post"}.get(name, value)
        return value

    @field_validator("framework", mode="before")
    @classmethod
    def _framework_names(cls, value: object) -> object:
        """Other spellings of the frameworks' names (megatron, llm-foundry, ...)."""
        return _FRAMEWORK_NAMES.get(str(value).lower(), value) if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _framework_names_of_fields(cls, data: Any) -> Any:
        # Megatron-LM's --overlap-grad-reduce: the gradient buckets reduce while the backward runs.
        data = switch(data, "overlap_grad_reduce", "grad_reduce", "overlapped", None)
        # torchtitan's --parallelism.disable_loss_parallel.
        data = switch(data, "disable_loss_parallel", "loss_parallel", False, True, framework="torchtitan")
        return torchtitan_checkpointing(data)

    @model_validator(mode="after")
    def _routing_fields(self) -> TrainingSpec:
        # (a value other than the default: a dumped and re-read spec sets every field)
        if self.moe_routing is not None and self.moe_imbalance != 1.0:
            raise FieldProblem(("moe_imbalance",), "moe_imbalance states the imbalance that moe_routing derives (fix: "
                                                   "give one of them)")
        if self.moe_routing_skew != 1.0 and self.moe_routing != "zipf":
            raise FieldProblem(("moe_routing_skew",), "moe_routing_skew is the exponent of moe_routing: zipf (fix: set "
                                                      "moe_routing: zipf, or drop moe_routing_skew)")
        if (self.moe_routing == "histogram") != (self.moe_routing_file is not None):
            if self.moe_routing_file is None:
                raise FieldProblem(("moe_routing",), "moe_routing: histogram reads its shares from moe_routing_file "
                                                     "(fix: give moe_routing_file: a CSV of tokens per expert)")
            raise FieldProblem(("moe_routing_file",), "moe_routing_file is the histogram of moe_routing: histogram "
                                                      "(fix: set moe_routing: histogram, or drop moe_routing_file)")
        return self

    @model_validator(mode="after")
    def _recompute_fields(self) -> TrainingSpec:
        if self.recompute_modules is not None and self.recompute != "selective":
            raise FieldProblem(("recompute_modules",), "recompute_modules chooses what selective recompute redoes "
                                                       "(fix: set recompute: selective, or drop recompute_modules)")
        if (self.recompute_method is None) != (self.recompute_num_layers is None):
            raise FieldProblem(("recompute_method",), "recompute_method and recompute_num_layers go together (fix: "
                                                      "give both, e.g. recompute_method: block, recompute_num_layers: "
                                                      "4, or neither)")
        if self.op_sac_saved_attention is not None and self.recompute != "op":
            raise FieldProblem(("op_sac_saved_attention",), "op_sac_saved_attention is the save list of op-level "
                                                            "recompute (fix: set recompute: op, or drop "
                                                            "op_sac_saved_attention)")
        if self.recompute_method is not None and self.recompute != "full":
            raise FieldProblem(("recompute_method",), "recompute_method chooses the layers of full recompute (fix: "
                                                      "set recompute: full, or drop recompute_method)")
        return self
