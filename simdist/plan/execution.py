"""How a framework runs the step's work: the part of a step's configuration that is the framework's, not the layout's.

One frozen value, `Execution`, carried by `simdist.plan.step_config.StepConfig` and read by the one step model: the
kernel style of element-wise work (simdist.plan.elementwise), CUDA graphs, the optimizer's kernels
(simdist.plan.optimizer), FSDP's per-unit traffic (simdist.plan.fsdp), which activations are recomputed
(simdist.plan.recompute), how context parallelism moves keys and values (simdist.plan.context_parallel) and
asynchronous tensor parallelism. ``Execution()`` is Megatron-Core's way, simdist's default.
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.plan.elementwise import kernel_style
from simdist.plan.graph_scope import graph_tags, whole_step
from simdist.plan.recompute import OP_SAC_SAVED_ATTENTION

__all__ = ["LOSS_COMPILED_WITH_MODEL", "MEGATRON", "Execution", "execution_of", "keeps_master_copy", "loss_compiled"]


@dataclass(frozen=True, slots=True)
class Execution:
    framework: str = "megatron_core"
    style: str = "fused"
    """fused | eager | compiled (simdist.plan.elementwise)."""
    loss_style: str = "fused"
    """The cross-entropy loss's style: compiled only where the framework compiles the loss (`loss_compiled`)."""
    cuda_graphs: bool = False
    """Kernels replayed from CUDA graphs: no host launch per kernel, the graph's gap between kernels."""
    graph_tags: frozenset[str] = frozenset()
    """The layer parts replayed from CUDA graphs where not every kernel is (training.cuda_graph_scope: kernel tags of
    simdist.plan.graph_scope)."""
    optimizer: str = "fused"
    """fused | foreach | for_loop (simdist.plan.optimizer)."""
    loss_fusion: bool = False
    """One fused softmax cross-entropy kernel per pass."""
    z_loss: bool = False
    """The loss adds a z-loss (training.z_loss_multiplier > 0): its log-sum-exp over the logits and gradient."""
    fsdp_version: int = 2
    reshard_after_forward: bool = True
    backward_prefetch: str = "pre"
    """pre (the next unit's gather issued before the current unit's gradient computation) | post (after it)."""
    grad_sync: str = "microbatch"
    """microbatch: ZeRO-2/3 reduce-scatter every micro-batch's gradients; last: FSDP accumulates them unsharded and
    reduce-scatters unit by unit in the last micro-batch's backward (training.fsdp_no_sync); step: once after the last
    backward, the parameters kept gathered (PyTorch pipelining's REDUCE_GRAD, DeepSpeed's pipeline engine)."""
    recompute_modules: tuple[str, ...] = ("core_attn",)
    recompute_method: str | None = None
    """uniform | block | every (full recompute's layers); None: every layer."""
    recompute_num_layers: int | None = None
    cp_comm_type: str = "p2p"
    async_tp: bool = False
    fp8_weight_cache: bool = True
    """FP8 weights cast once per step and reused by its micro-batches (Transformer Engine, given is_first_microbatch);
    False: cast in every forward (torchao Float8Linear)."""
    fp8_attention: bool = False
    """The fused attention runs in fp8 (Transformer Engine's FP8 DotProductAttention: training.fp8_attention)."""
    tp_inputs: str = "module"
    """module | per_projection: where a module's input changes layout for its column-parallel projections
    (training.tp_input_layouts, simdist.plan.tp_plan)."""
    loss_parallel: bool = True
    """The loss runs on each tp rank's vocabulary shard; False: over the gathered logits (training.loss_parallel)."""
    recompute_early_stop: bool = False
    """Eager full recompute stops at the last tensor the backward saved (training.recompute_early_stop)."""
    op_sac_saved_attention: tuple[str, ...] = OP_SAC_SAVED_ATTENTION
    """Under recompute op, the attention kernels whose outputs the op policy saves (training.op_sac_saved_attention);
    others are run again in the backward (simdist.plan.recompute)."""
    clip_grad: bool = True
    """Gradient clipping by the global norm before the optimizer step (simdist.plan.optimizer)."""
    master_copy: bool = True
    """The optimizer keeps fp32 master weights beside 16-bit model weights and writes both (Megatron-LM, DeepSpeed);
    False: the fp32 shard is the parameter and the gather casts it (PyTorch FSDP with mixed precision)."""
    master_dtype: str = "fp32"
    """The master weights' dtype (training.main_params_dtype): the optimizer's copy, or where ``master_copy`` is
    False the sharded parameters themselves (bf16 for a model built in bf16)."""

MEGATRON = Execution()

LOSS_COMPILED_WITH_MODEL = frozenset({"torchtitan"})
"""Frameworks whose torch.compile covers the loss as well as the model unless told otherwise: torchtitan's
compile.components defaults to ["model", "loss"] (pytorch/torchtitan PR #1608, 2025-08-20; @ 29624e37
torchtitan/config/job_config.py, Compile). Elsewhere the loss runs outside the compiled model: KempnerForge calls
F.cross_entropy on the compiled model's logits (KempnerInstitute/KempnerForge scripts/train.py: model =
torch.compile(model); kempnerforge/training/loss.py), OLMo-core compiles each block (allenai/OLMo-core
TransformerTrainModule compile_model), fms-fsdp and plain FSDP loops compile the model and call the loss after it."""


def loss_compiled(training) -> bool:
    """Whether the step's cross-entropy runs compiled: training.compile_loss, else the framework's way
    (`LOSS_COMPILED_WITH_MODEL`: with the model's compile)."""
    if training.compile_loss is not None:
        return bool(training.compile_loss)
    return bool(training.compile) and training.framework in LOSS_COMPILED_WITH_MODEL


def keeps_master_copy(spec) -> bool:
    """Whether the optimizer keeps master weights beside the model's 16-bit ones (`Execution.master_copy`): not under
    PyTorch FSDP's mixed precision, whose sharded parameters are the optimizer's (FSDP2 MixedPrecisionPolicy, FSDP1
    MixedPrecision): no separate 16-bit copy to keep or write."""
    return not (spec.parallel.zero_stage == 3 and spec.training.framework in ("torchtitan", "fsdp", "composer"))


def execution_of(spec, pp: int) -> Execution:
    """The `Execution` of a validated ScenarioSpec (``pp``: its pipeline stages)."""
    t, p = spec.training, spec.parallel
    pipelined_fsdp = pp > 1 and t.framework in ("torchtitan", "fsdp")
    # PyTorch pipelining runs every micro-batch's backward without gradient sync and reduce-scatters once per stage
    # after the last one (torch/distributed/pipelining/stage.py: backward_maybe_with_nosync, perform_reduce_grad);
    # torchtitan keeps the parameters gathered between forward and backward under PP (parallelize.py: reshard_after_
    # forward = not pp_enabled): the default there where the scenario does not say (FSDP2's own default, true,
    # elsewhere). DeepSpeed's pipeline engine reduces gradients at the last step (pipe/schedule.py).
    grad_sync = "step" if pipelined_fsdp else "last" if t.fsdp_no_sync else "microbatch"
    reshard = (not pipelined_fsdp) if p.reshard_after_forward is None else p.reshard_after_forward
    return Execution(
        framework=t.framework, style=kernel_style(t.kernel_fusion, t.compile),
        loss_style=kernel_style(t.kernel_fusion, loss_compiled(t)),
        cuda_graphs=t.cuda_graphs or whole_step(t.cuda_graph_scope),
        graph_tags=frozenset() if t.cuda_graphs else graph_tags(t.cuda_graph_scope),
        optimizer=t.optimizer_implementation, loss_fusion=t.cross_entropy_loss_fusion, z_loss=t.z_loss_multiplier > 0,
        fsdp_version=t.fsdp_version,
        reshard_after_forward=reshard, backward_prefetch=t.backward_prefetch, grad_sync=grad_sync,
        recompute_modules=tuple(t.recompute_modules or ("core_attn",)), recompute_method=t.recompute_method,
        recompute_num_layers=t.recompute_num_layers, cp_comm_type=t.cp_comm_type, async_tp=t.async_tp,
        fp8_weight_cache=t.kernel_fusion == "fused", fp8_attention=t.fp8_attention, clip_grad=t.clip_grad > 0,
        master_copy=keeps_master_copy(spec), tp_inputs=t.tp_input_layouts, loss_parallel=t.loss_parallel,
        recompute_early_stop=t.recompute_early_stop,
        op_sac_saved_attention=tuple(t.op_sac_saved_attention) if t.op_sac_saved_attention is not None
        else OP_SAC_SAVED_ATTENTION,
        master_dtype=t.main_params_dtype)
