"""What a scenario's training settings need of its GPU and its layout, one clear error each (exit 2): precision
(fp8 tensor cores, MXFP8 on Blackwell, fp8 attention, the fp8 parameter gather) and the framework's switches (async TP,
hybrid sharding, ZeRO-3's per-unit fetch, context-parallel communication). `simdist.plan.layout.step_config_of` runs
both before it builds a step; `simdist check` runs `check_fp8` on the cluster's GPU as `run` does."""

from __future__ import annotations

from simdist.errors import SpecError
from simdist.hardware.gemm import BLACKWELL, architecture
from simdist.hardware.topology import Topology
from simdist.plan.execution import keeps_master_copy
from simdist.plan.schedule import SPLIT_BACKWARD
from simdist.spec.scenario import ScenarioSpec

__all__ = ["check_execution", "check_fp8"]


def check_fp8(spec: ScenarioSpec, topology: Topology) -> None:
    """FP8 needs fp8 tensor cores; MXFP8 needs Blackwell's block-scaled MMA (Transformer Engine MXFP8BlockScaling:
    compute capability 10.0+); the fp8 parameter all-gather needs fp8 training and a sharded optimizer state."""
    t, gpu = spec.training, topology.gpu
    if t.precision == "fp8":
        gpu.peak_flops("fp8")  # one line naming training.precision where the GPU has no fp8 tensor cores
        if t.fp8_recipe == "mxfp8" and architecture(gpu).name not in BLACKWELL:
            raise SpecError(f"fp8_recipe mxfp8 needs Blackwell block-scaled tensor cores; {gpu.name} has none",
                            field="training.fp8_recipe", fix="use delayed, tensorwise or blockwise on this GPU")
    if t.fp8_attention:
        # Transformer Engine's FP8 DotProductAttention in its FusedAttention (cuDNN) backend quantizes Q, K and V as
        # the recipe does: delayed, current (tensorwise) or MXFP8 (transformer_engine/pytorch/attention/
        # dot_product_attention/backends.py FusedAttnFunc: qkv_type delayed | current | mxfp8); simdist prices it
        # from cuDNN's fp8 figures (simdist/hardware/data/attention_fp8.csv)
        why = ("needs precision fp8" if t.precision != "fp8" else
               "needs attention cudnn (Transformer Engine's FusedAttention, the kernel whose fp8 figures simdist "
               "has)" if t.attention != "cudnn" else
               "runs under the delayed, tensorwise or mxfp8 recipe" if t.fp8_recipe == "blockwise" else "")
        if why:
            raise SpecError(f"fp8_attention {why}", field="training.fp8_attention",
                            fix="set precision: fp8, attention: cudnn and a delayed, tensorwise or mxfp8 recipe, or "
                                "drop fp8_attention")
    if t.fp8_param_gather and (t.precision != "fp8" or spec.parallel.zero_stage < 1):
        raise SpecError("fp8_param_gather gathers fp8 parameters of fp8 training with the distributed optimizer "
                        "or ZeRO", field="training.fp8_param_gather",
                        fix="set precision: fp8 and parallel.zero_stage >= 1, or drop fp8_param_gather")


def check_execution(spec: ScenarioSpec) -> None:
    """The framework settings' requirements on the layout (one line each, exit 2)."""
    p, t = spec.parallel, spec.training
    if t.async_tp and not (p.sequence_parallel and p.tp > 1):
        raise SpecError("async_tp pipelines the sequence-parallel collectives with their GEMMs: it needs tp > 1 and "
                        "parallel.sequence_parallel", field="training.async_tp",
                        fix="set parallel.sequence_parallel: true with tp > 1, or drop async_tp")
    if t.async_tp and not t.compile:
        # torchtitan: "Async TP is only effective when compile is enabled" (v0.2.0 raises an error without it)
        raise SpecError("async_tp is a torch.compile pass (micro_pipeline_tp): it needs compile",
                        field="training.async_tp", fix="set training.compile: true, or drop async_tp")
    if t.async_tp and t.tp_comm_overlap:
        raise SpecError("async_tp and tp_comm_overlap are two ways of overlapping the same collectives",
                        field="training.async_tp", fix="keep one of them")
    if p.dp_shard not in (None, p.dp) and p.zero_stage != 3:
        raise SpecError(f"dp_shard = {p.dp_shard} (hybrid sharding) shards ZeRO-3 / FSDP's parameters inside groups; "
                        f"zero_stage is {p.zero_stage}", field="parallel.dp_shard",
                        fix="set parallel.zero_stage: 3, or drop dp_shard")
    if p.zero_stage == 3 and t.zero3_fetch == "per_layer" and spec.schedule in SPLIT_BACKWARD:
        raise SpecError(f"zero3_fetch per_layer reduce-scatters each unit's gradients in its backward; "
                        f"{spec.schedule} splits the weight gradients out of it", field="training.zero3_fetch",
                        fix="use schedule 1f1b, or zero3_fetch prefetch")
    if t.fsdp_no_sync and not (p.zero_stage == 3 and t.zero3_fetch == "per_layer"):
        raise SpecError("fsdp_no_sync is FSDP's gradient accumulation (no_sync, set_requires_gradient_sync(False)): it "
                        f"needs ZeRO-3 run unit by unit; zero_stage is {p.zero_stage}, zero3_fetch {t.zero3_fetch}",
                        field="training.fsdp_no_sync",
                        fix="set parallel.zero_stage: 3 with training.zero3_fetch: per_layer, or drop fsdp_no_sync")
    if t.main_params_dtype == "bf16" and t.precision not in ("fp32", "tf32") and keeps_master_copy(spec):
        raise SpecError("main_params_dtype bf16 is a model built in bf16 whose FSDP shards are the master weights; "
                        "an optimizer's separate master copy (Megatron-LM --main-params-dtype) is fp32 or fp16",
                        field="training.main_params_dtype",
                        fix="use fp32 or fp16, or run framework torchtitan, fsdp or composer with zero_stage 3")
    if p.cp > 1 and t.cp_comm_type == "a2a+p2p":
        raise SpecError("cp_comm_type a2a+p2p (a2a inside a group, p2p across) is not modelled: its two groups are not "
                        "axes of simdist's mesh", field="training.cp_comm_type", fix="use p2p, all_gather or a2a")
