"""One validity check of a parallel layout, and the one function that builds a step's `StepConfig` from a scenario.

`simdist run`, `simdist check` and `simdist search` (both fidelities) go through `step_config_of`, which checks
the layout with `check_layout` first: a layout is valid for one command exactly when it is valid for the others.
Each rule raises a `LayoutRuleError` naming the field, the fix and the rule (search counts pruned layouts by rule).

The rules are those Megatron-LM enforces (megatron/training/arguments.py and its schedules):
- heads / kv-heads: tensor parallelism splits the attention heads and the key/value heads (or replicates them);
- sequence: context parallelism splits the sequence into 2 x cp chunks (Megatron's causal load balancing);
  the lecture's MLP has no sequence; width: the MLP's width splits over tp;
- batch: the global batch is micro-batch x dp x (number of micro-batches), or the explicit local batches of
  ``training.dp_batch_split`` add up to it in multiples of the micro-batch;
- interleaving: vpp > 1 needs the interleaved schedule, whose micro-batches come in groups of pp (Megatron's
  interleaved schedule asserted it);
- layers: the layers split over the pipeline stages and their chunks (simdist.plan.layer_split.choose_split: any
  layer count on any pp and vpp; a chunk may hold only the embedding, only the loss, or nothing);
- zero: ``zero3_fetch: per_parameter`` describes ZeRO-3; unequal local batches cannot combine with ZeRO-2/3
  (ranks would issue different numbers of per-micro-batch collectives); ``overlap_param_gather`` needs the
  distributed optimizer (zero_stage 1) and the overlapped gradient reduction (megatron/training/arguments.py:
  "--overlap-param-gather only supported with distributed optimizer", "Must use --overlap-param-gather with
  --overlap-grad-reduce");
- experts (`check_experts`): ep and etp > 1 need a model with experts; the routed experts split over ep
  (megatron/training/arguments.py: "Number of experts should be a multiple of expert model parallel_size"); the
  expert generator's etp x ep divides the stage's tp x cp x dp ranks (Megatron-Core parallel_state.py: world_size
  divisible by etp x ep x pp), so ep need not divide dp x cp alone: with etp < tp it may take ranks of tp too;
  etp splits each expert's FFN width; tp > 1 needs sequence parallelism (Megatron-Core MoELayer) and splits the
  shared experts' width; the flex dispatcher is modelled with etp 1 (simdist.plan.moe_cost); the dense and the
  expert pipeline groups coincide (Megatron-Core asserts it: with pp outer to every other axis they do); the
  busiest ep rank holds at most every routed token (moe_imbalance <= ep); --overlap-moe-expert-parallel-comm needs
  ep > 1, the alltoall or flex dispatcher, no full recompute, bf16/fp16, and with pp > 1 the interleaved schedule
  (megatron/core/transformer/transformer_config.py); moe_a2a_overlap_share, the share of each all-to-all that
  overlap runs beside the compute, needs the overlap.
ZeRO-2/3 with pipeline parallelism is allowed: FSDP with pipeline stages is what torchtitan runs and what
Llama 3 405B trained with (Dubey et al. 2024 sec 3.3.2).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from simdist.collectives.ep_kernels import check_kernel_sms, dispatch_kernel
from simdist.errors import LayoutError, SimdistError, SpecError
from simdist.hardware.gemm import BLACKWELL, architecture
from simdist.hardware.gpus import gpu_preset
from simdist.hardware.host import HostOverhead, host_overhead
from simdist.hardware.topology import Topology
from simdist.hardware.variability import gpu_variability
from simdist.plan.chunk_cost import chunk_cost
from simdist.plan.execution import execution_of
from simdist.plan.expert_parallel import ExpertParallel
from simdist.plan.expert_parallel import check_experts as check_moe_cost
from simdist.plan.graph_scope import check_graph_scope
from simdist.plan.layer_split import LayerSplit, choose_split
from simdist.plan.memory import optimizer_state_bytes
from simdist.plan.mesh import Mesh, parse_order
from simdist.plan.model import Model
from simdist.plan.moe_routing import checked_histogram, scenario_imbalance
from simdist.plan.schedule import TWO_CHUNK_SCHEDULES, check_schedule
from simdist.plan.step_config import StepConfig
from simdist.plan.training_checks import check_execution, check_fp8
from simdist.spec.gpu import GpuSpec
from simdist.spec.scenario import ScenarioSpec

__all__ = ["RULES", "LayoutRuleError", "check_layout", "step_config_of"]

RULES = ("heads", "kv-heads", "sequence", "width", "batch", "interleaving", "layers", "zero", "experts", "memory")
"""Rule names, in the order they are checked (``memory`` is search's filter: `simdist run` reports it)."""


class LayoutRuleError(LayoutError):
    """A layout breaks one of `RULES` (``rule``)."""

    def __init__(self, problem: str, *, rule: str = "layout", field: str | None = None, source: str | None = None,
                 fix: str | None = None) -> None:
        self.rule = rule
        super().__init__(problem, field=field, source=source, fix=fix)


def _fail(rule: str, problem: str, field: str, fix: str) -> LayoutRuleError:
    return LayoutRuleError(problem, rule=rule, field=field, fix=fix)


def check_layout(spec: ScenarioSpec, model: Model) -> LayerSplit:
    """Raise a LayoutRuleError unless ``spec``'s layout can run ``model``; returns its layer split."""
    p, t = spec.parallel, spec.training
    if model.kind == "decoder":
        if model.num_attention_heads % p.tp:
            raise _fail("heads", f"{model.num_attention_heads} attention heads do not split over tp = {p.tp}",
                        "parallel.tp", f"choose tp dividing {model.num_attention_heads}")
        if model.num_query_groups % p.tp and p.tp % model.num_query_groups:
            raise _fail("kv-heads", f"{model.num_query_groups} key/value heads do not split over tp = {p.tp}",
                        "parallel.tp", f"choose tp dividing {model.num_query_groups}")
        if p.cp > 1 and model.seq_length % (2 * p.cp):
            raise _fail("sequence", f"sequence length {model.seq_length} does not split into 2 x cp = {2 * p.cp} "
                        "chunks", "parallel.cp",
                        "choose cp with seq_length divisible by 2 x cp (Megatron's load balancing)")
        if p.cp > 1 and t.cp_comm_type == "a2a" and (model.num_attention_heads // p.tp) % p.cp:
            # Ulysses trades the sequence split for a head split: each rank attends over heads / cp
            raise _fail("heads", f"cp_comm_type a2a splits {model.num_attention_heads // p.tp} attention heads per "
                        f"tensor-parallel rank over cp = {p.cp}", "parallel.cp",
                        "choose cp dividing the heads per tp rank, or cp_comm_type p2p")
    else:
        if p.cp > 1:
            raise _fail("sequence", "context parallelism needs a sequence; the mlp model has none", "parallel.cp",
                        "set parallel.cp: 1")
        if p.tp > 1 and model.hidden_size % p.tp:
            raise _fail("width", f"width {model.hidden_size} does not split over tp = {p.tp}", "parallel.tp",
                        f"choose tp dividing {model.hidden_size}")
    if t.dp_batch_split is not None:
        if len(t.dp_batch_split) != p.dp or sum(t.dp_batch_split) != t.global_batch_size:
            raise _fail("batch", f"dp_batch_split {list(t.dp_batch_split)} must list dp = {p.dp} local batches "
                        f"summing to global_batch_size = {t.global_batch_size}", "training.dp_batch_split",
                        f"give {p.dp} local batches that add up to {t.global_batch_size}")
        bad = [b for b in t.dp_batch_split if b % t.micro_batch_size]
        if bad:
            raise _fail("batch", f"dp_batch_split entry {bad[0]} is not a multiple of micro_batch_size "
                        f"{t.micro_batch_size}", "training.dp_batch_split",
                        "make every local batch a multiple of micro_batch_size")
        counts = [b // t.micro_batch_size for b in t.dp_batch_split]
    elif t.global_batch_size % (t.micro_batch_size * p.dp):
        raise _fail("batch", f"global_batch_size ({t.global_batch_size}) is not a multiple of micro_batch_size x "
                    f"dp ({t.micro_batch_size} x {p.dp})", "training.global_batch_size",
                    f"use a multiple of {t.micro_batch_size * p.dp}, or change micro_batch_size or dp")
    else:
        counts = [t.global_batch_size // (t.micro_batch_size * p.dp)]
    if p.vpp > 1 and spec.schedule not in ("interleaved_1f1b", *TWO_CHUNK_SCHEDULES):
        raise _fail("interleaving", f"vpp = {p.vpp} needs schedule: interleaved_1f1b (got {spec.schedule})",
                    "parallel.vpp", "set parallel.vpp: 1, or schedule: interleaved_1f1b")
    for m in sorted(set(counts)):
        try:
            check_schedule(spec.schedule, num_stages=p.pp, num_microbatches=m, vpp=p.vpp)
        except SpecError as err:
            raise _fail("interleaving", err.problem, err.field or "schedule", err.fix or "") from None
    try:
        layers = choose_split(model, pp=p.pp, vpp=p.vpp, pipeline_split=p.pipeline_split,
                              layers_per_stage=p.layers_per_stage, pipeline_layout=p.pipeline_layout,
                              account_for_embedding=p.account_for_embedding_in_pipeline_split,
                              account_for_loss=p.account_for_loss_in_pipeline_split,
                              partition_method=p.partition_method, precision=t.precision, schedule=spec.schedule)
    except LayoutError as err:
        rule = "interleaving" if err.field == "parallel.vpp" else "layers"
        raise _fail(rule, err.problem, err.field or "parallel.pp", err.fix or "") from None
    if t.zero3_fetch == "per_parameter" and p.zero_stage != 3:
        raise _fail("zero", f"training.zero3_fetch: per_parameter describes ZeRO-3's parameter traffic, but "
                    f"zero_stage is {p.zero_stage}", "training.zero3_fetch",
                    "set parallel.zero_stage: 3, or drop zero3_fetch")
    if t.overlap_param_gather and p.zero_stage != 1:
        raise _fail("zero", "overlap_param_gather overlaps the distributed optimizer's parameter all-gather with the "
                    f"forward, but zero_stage is {p.zero_stage}", "training.overlap_param_gather",
                    "set parallel.zero_stage: 1 (use_distributed_optimizer: true), or drop overlap_param_gather")
    if t.overlap_param_gather and t.grad_reduce != "overlapped":
        raise _fail("zero", "overlap_param_gather needs the gradient reduction overlapped too (Megatron-LM: "
                    f"--overlap-param-gather with --overlap-grad-reduce), got grad_reduce: {t.grad_reduce}",
                    "training.overlap_param_gather",
                    "set training.grad_reduce: overlapped (overlap_grad_reduce: true), or drop overlap_param_gather")
    if t.dp_batch_split is not None and p.zero_stage >= 2 and len(set(t.dp_batch_split)) > 1:
        raise _fail("zero", "unequal local batches with ZeRO-2/3: ranks would issue different numbers of "
                    "per-micro-batch collectives", "training.dp_batch_split",
                    "use zero_stage 0 or 1, or equal local batches")
    check_experts(spec, model)
    return layers


def _expert_mesh(spec: ScenarioSpec) -> Mesh:
    p = spec.parallel
    shard = p.dp_shard if p.dp_shard not in (None, p.dp) else 0
    return Mesh(tp=p.tp, cp=p.cp, dp=p.dp, pp=p.pp, order=parse_order(p.order), ep=p.ep, etp=p.etp, dp_shard=shard)


def check_experts(spec: ScenarioSpec, model: Model) -> None:
    """The ``experts`` rules of the module docstring."""
    p, t = spec.parallel, spec.training
    etp = p.tp if p.etp is None else p.etp
    if t.moe_a2a_overlap_share != 1.0 and not t.overlap_moe_expert_parallel_comm:
        raise _fail("experts", f"moe_a2a_overlap_share {t.moe_a2a_overlap_share} without "
                    "overlap_moe_expert_parallel_comm: it is the share that overlap hides",
                    "training.moe_a2a_overlap_share",
                    "set training.overlap_moe_expert_parallel_comm: true, or drop moe_a2a_overlap_share")
    if t.delay_wgrad_compute and not t.overlap_moe_expert_parallel_comm:
        # Megatron-Core asserts it (transformer_config.py: "overlap_moe_expert_parallel_comm must be enabled when
        # enabling delay_wgrad_compute")
        raise _fail("experts", "delay_wgrad_compute without overlap_moe_expert_parallel_comm: it delays the weight "
                    "gradients for that overlap", "training.delay_wgrad_compute",
                    "set training.overlap_moe_expert_parallel_comm: true, or drop delay_wgrad_compute")
    check_graph_scope(t.cuda_graph_scope, has_experts=model.is_moe,
                      drop_and_pad=t.moe_expert_capacity_factor is not None)
    if not model.is_moe:
        if p.ep > 1:
            raise _fail("experts", f"parallel.ep = {p.ep} on a model without experts", "parallel.ep",
                        "set parallel.ep: 1, or give model.num_experts")
        if etp != p.tp:
            raise _fail("experts", f"parallel.etp = {etp} on a model without experts", "parallel.etp",
                        "drop parallel.etp (it splits experts)")
        if t.overlap_moe_expert_parallel_comm:
            raise _fail("experts", "overlap_moe_expert_parallel_comm on a model without experts",
                        "training.overlap_moe_expert_parallel_comm", "set it to false")
        if t.moe_router_dtype is not None:
            raise _fail("experts", f"moe_router_dtype {t.moe_router_dtype} on a model without experts",
                        "training.moe_router_dtype", "drop it (it is the router's dtype)")
        if t.moe_router_padding_for_quantization:
            raise _fail("experts", "moe_router_padding_for_quantization on a model without experts",
                        "training.moe_router_padding_for_quantization", "set it to false")
        if t.moe_router_fusion:
            raise _fail("experts", "moe_router_fusion on a model without experts", "training.moe_router_fusion",
                        "set it to false")
        return
    if t.moe_router_padding_for_quantization and t.precision != "fp8":
        raise _fail("experts", f"moe_router_padding_for_quantization pads the experts' rows for FP8 GEMMs, and "
                    f"precision is {t.precision}", "training.moe_router_padding_for_quantization",
                    "set training.precision: fp8, or drop moe_router_padding_for_quantization")
    if model.num_experts % p.ep:
        raise _fail("experts", f"{model.num_experts} experts do not split over ep = {p.ep}", "parallel.ep",
                    f"choose ep dividing {model.num_experts}")
    ranks = p.tp * p.cp * p.dp
    if ranks % (etp * p.ep):
        raise _fail("experts", f"etp x ep = {etp} x {p.ep} does not divide a stage's tp x cp x dp = {ranks} ranks "
                    "(Megatron-Core's expert groups are carved out of them)", "parallel.ep",
                    f"choose ep x etp dividing {ranks}")
    ffn = model.moe_ffn_hidden_size or model.ffn_hidden_size
    if etp > 1 and ffn % etp:
        raise _fail("experts", f"expert FFN width {ffn} does not split over etp = {etp}", "parallel.etp",
                    f"choose etp dividing {ffn}")
    if p.tp > 1 and not p.sequence_parallel:
        raise _fail("experts", "an MoE model with tp > 1 trains with sequence parallelism (Megatron-Core MoELayer "
                    "raises without it)", "parallel.sequence_parallel", "set parallel.sequence_parallel: true, or tp 1")
    shared = model.moe_shared_expert_intermediate_size
    if shared % p.tp:
        raise _fail("experts", f"the shared experts' width {shared} does not split over tp = {p.tp}", "parallel.tp",
                    f"choose tp dividing {shared}")
    if t.moe_token_dispatcher_type == "flex" and etp > 1:
        raise _fail("experts", "the flex (DeepEP) dispatcher is modelled with etp 1 only",
                    "training.moe_token_dispatcher_type", "use etp 1, or the alltoall dispatcher")
    if t.moe_routing == "histogram":
        try:
            checked_histogram(t.moe_routing_file, model)
        except LayoutError as err:
            raise _fail("experts", err.problem, err.field or "training.moe_routing_file", err.fix or "") from None
    try:  # what the MoE layer's cost relies on (simdist.plan.moe_cost), so search prunes what run would refuse
        check_moe_cost(model, tp=p.tp, sequence_parallel=p.sequence_parallel, experts=ExpertParallel(
            p.ep, etp, t.moe_token_dispatcher_type, t.moe_imbalance, t.moe_expert_capacity_factor,
            t.moe_grouped_gemm))
    except SimdistError as err:
        raise _fail("experts", err.problem, err.field or "parallel.ep", err.fix or "") from None
    if not _expert_mesh(spec).pipeline_groups_agree():
        raise _fail("experts", f"axis order {p.order} gives the expert layers other pipeline groups than the dense "
                    "ones (Megatron-Core requires the same)", "parallel.order",
                    "put pp last in parallel.order, e.g. tp-cp-ep-dp-pp")
    if p.ep > 1 and t.moe_imbalance > p.ep:
        raise _fail("experts", f"moe_imbalance {t.moe_imbalance} exceeds ep = {p.ep}: the busiest expert-parallel "
                    "rank cannot receive more than every routed token", "training.moe_imbalance",
                    f"use a value between 1 and {p.ep}")
    if t.overlap_moe_expert_parallel_comm:
        # Megatron-Core's TransformerConfig checks (megatron/core/transformer/transformer_config.py): bf16 or fp16
        # parameters (fp8 GEMMs run beside bf16 ones), no full recompute and no recomputed "moe" module, at most one
        # MTP layer, and virtual pipeline stages when pp > 1.
        why = ("needs ep > 1" if p.ep == 1 else
               "needs moe_token_dispatcher_type alltoall or flex" if t.moe_token_dispatcher_type == "allgather" else
               "does not run with full recompute" if t.recompute == "full" else
               "does not run with the moe module recomputed" if "moe" in (t.recompute_modules or ()) else
               "needs bf16 or fp16 parameters (fp8 runs with bf16)" if t.precision in ("fp32", "tf32") else
               "supports at most one multi-token-prediction layer" if model.mtp_num_layers > 1 else
               "needs schedule: interleaved_1f1b with pp > 1" if p.pp > 1 and spec.schedule != "interleaved_1f1b"
               else "")
        if why:
            raise _fail("experts", f"overlap_moe_expert_parallel_comm {why} (Megatron-Core's 1F1B A2A overlap)",
                        "training.overlap_moe_expert_parallel_comm", "set it to false, or change the layout")


def _host_of(spec: ScenarioSpec, gpu: GpuSpec) -> HostOverhead | None:
    """The scenario's host costs over the data file's defaults (None: all defaults)."""
    given = spec.training.host_overhead
    if given.launch is None and given.dispatch is None and given.step_gap is None:
        return None
    base = host_overhead(gpu)
    return HostOverhead(launch_s=base.launch_s if given.launch is None else given.launch,
                        dispatch_s=base.dispatch_s if given.dispatch is None else given.dispatch,
                        step_gap_s=base.step_gap_s if given.step_gap is None else given.step_gap)


def _ep_domains(mesh: Mesh, topology: Topology, dispatcher: str) -> int:
    """NVLink domains (`Topology.nvlink_domain_size` GPUs each; rank r on GPU r) one expert-parallel group spans, for
    flex (DeepEP, HybridEP: the same number of ranks in each); 1 for the dispatchers that do not read it.
    # Assumption: every expert-parallel group spans as many domains as the first (the mesh's groups are translates).
    """
    if mesh.ep <= 1 or dispatcher != "flex":
        return 1
    size = max(1, topology.nvlink_domain_size)
    counts = Counter(r // size for r in mesh.group("ep", 0))
    if len(set(counts.values())) > 1:
        raise _fail("experts", f"the flex dispatcher's expert-parallel group of {mesh.ep} has "
                    f"{'/'.join(str(n) for n in counts.values())} ranks in the {len(counts)} NVLink domains "
                    f"({size} GPUs each) it spans; DeepEP and HybridEP take the same number in each", "parallel.ep",
                    f"choose an ep that fills whole domains (a multiple of {size}) or stays inside one")
    return len(counts)


def step_config_of(spec: ScenarioSpec, topology: Topology, model: Model) -> StepConfig:
    """The step configuration of a scenario on its cluster (after `check_layout`): the one place a StepConfig is
    built from a scenario."""
    split = check_layout(spec, model)
    p, t = spec.parallel, spec.training
    check_fp8(spec, topology)
    if t.tp_comm_overlap and not (p.sequence_parallel and p.tp > 1):
        # Megatron-LM (megatron/training/arguments.py): "Tensor parallel communication/GEMM overlap can happen only
        # when sequence parallelism is enabled".
        raise SpecError("tp_comm_overlap overlaps the sequence-parallel collectives: it needs tp > 1 and "
                        "parallel.sequence_parallel", field="training.tp_comm_overlap",
                        fix="set parallel.sequence_parallel: true with tp > 1, or drop tp_comm_overlap")
    check_execution(spec)
    moe_kernel = dispatch_kernel(t.moe_token_dispatcher_type, t.moe_flex_dispatcher_backend,
                                 t.moe_flex_dispatcher_num_sms)
    if moe_kernel != "nccl" and model.num_experts:
        check_kernel_sms(moe_kernel, architecture(topology.gpu).num_sms, topology.gpu.name,
                         "training.moe_flex_dispatcher_num_sms")
    ex = execution_of(spec, p.pp)
    mesh = _expert_mesh(spec)
    slow = []
    for i, st in enumerate(spec.faults.stragglers):
        if st.rank >= mesh.num_ranks:
            raise LayoutError(f"straggler rank {st.rank} is outside the layout's {mesh.num_ranks} ranks",
                              field=f"faults.stragglers.{i}.rank", fix=f"use a rank in 0..{mesh.num_ranks - 1}")
        slow.append((st.rank, 1.0 + st.slower_by))
    cfg = StepConfig(
        compute_slowdown=tuple(slow),
        model=model, gpu=topology.gpu, mesh=mesh, schedule=spec.schedule, micro_batch_size=t.micro_batch_size,
        global_batch_size=t.global_batch_size, layers_per_stage=split.layers_per_stage, vpp=p.vpp,
        recompute=t.recompute,
        precision=t.precision, sequence_parallel=p.sequence_parallel, zero_stage=p.zero_stage,
        tp_style=p.tp_style, attention=t.attention, attention_mask=t.attention_mask, fp8_recipe=t.fp8_recipe,
        fp8_param_gather=t.fp8_param_gather, grad_reduce=t.grad_reduce, grad_bucket_bytes=t.grad_bucket_size,
        overlap_param_gather=t.overlap_param_gather,
        zero3_fetch=t.zero3_fetch, scatter_gather=p.scatter_gather,
        dp_batch_split=tuple(t.dp_batch_split) if t.dp_batch_split is not None else None,
        capacity_bytes=topology.gpu.hbm_capacity, host=_host_of(spec, topology.gpu),
        gpu_variability=gpu_variability(topology.gpu, topology.spec.gpu_speed_cv, mesh.num_ranks),
        gpu_speed_cv=topology.spec.gpu_speed_cv,
        layers_per_part=split.parts, split_method=split.method,
        expert_parallel=ExpertParallel(
            p.ep, p.tp if p.etp is None else p.etp, t.moe_token_dispatcher_type, scenario_imbalance(t, p, model),
            t.moe_expert_capacity_factor, t.moe_grouped_gemm, _ep_domains(mesh, topology, t.moe_token_dispatcher_type),
            moe_kernel, t.moe_router_dtype, t.moe_router_padding_for_quantization, t.moe_router_fusion),
        moe_overlap=t.overlap_moe_expert_parallel_comm,
        moe_overlap_share=t.moe_a2a_overlap_share,
        delay_wgrad=t.delay_wgrad_compute,
        grad_reduce_in_fp32=t.grad_reduce_in_fp32, tp_comm_overlap=t.tp_comm_overlap,
        optimizer_state_bytes=optimizer_state_bytes(t.precision, exp_avg=t.exp_avg_dtype,
                                                    exp_avg_sq=t.exp_avg_sq_dtype, main_params=t.main_params_dtype,
                                                    master_copy=ex.master_copy),
        execution=ex,
    )
    return _with_other_gpus(cfg, spec, topology) if spec.faults.heterogeneous_nodes else cfg


def _with_other_gpus(cfg: StepConfig, spec: ScenarioSpec, topology: Topology) -> StepConfig:
    """``cfg`` with the GPUs of ``faults.heterogeneous_nodes`` slower (or faster) by their kernel model's time
    factor, and the smallest GPU memory as the capacity.

    # Assumption: a node of another GPU runs every compute kernel of the step (forward, backward, recompute,
    # optimizer) f times as long, f = its first model part's forward + backward kernel time on that GPU over the same
    # on the cluster's (the kernel model: simdist.hardware.compute, tile quantization and efficiency curves of each
    # GPU); the node keeps the cluster's NVLink, NICs and fabric. Its peers wait for it as for a straggler.
    # Assumption: a GPU faster than the cluster's is timed as the cluster's (StepConfig.rank_factor is at least 1):
    # name the faster GPU as the cluster's and list the slower nodes.
    """
    factors: dict[int, float] = dict(cfg.compute_slowdown)
    capacity = cfg.capacity_bytes
    base = chunk_cost(cfg, cfg.part_layers(0), True, cfg.mesh.pp * cfg.vpp == 1)
    seen: set[int] = set()
    gpn = topology.gpus_per_node
    for i, entry in enumerate(spec.faults.heterogeneous_nodes):
        field = f"faults.heterogeneous_nodes.{i}"
        try:
            gpu = gpu_preset(entry.gpu)
        except SimdistError as err:
            raise SpecError(err.problem, field=f"{field}.gpu", fix=err.fix) from None
        if cfg.precision == "fp8" and gpu.peak_flops("fp8") <= 0:
            raise SpecError(f"{gpu.name} has no fp8 tensor cores, and the step trains in fp8", field=f"{field}.gpu",
                            fix="give a GPU with fp8 (Hopper or Blackwell), or train in bf16")
        if cfg.precision == "fp8" and spec.training.fp8_recipe == "mxfp8" and architecture(gpu).name not in BLACKWELL:
            # the same rule check_fp8 applies to the cluster's own GPU: every GPU of the step runs the recipe
            raise SpecError(f"fp8_recipe mxfp8 needs Blackwell block-scaled tensor cores; {gpu.name} has none",
                            field=f"{field}.gpu", fix="give a Blackwell GPU, or use delayed, tensorwise or blockwise")
        # the same host costs (the host is not the GPU), the other GPU's uncalibrated kernel model
        other = chunk_cost(dataclasses.replace(cfg, gpu=gpu, compute_efficiency=None, host=cfg.host_overhead),
                           cfg.part_layers(0), True, cfg.mesh.pp * cfg.vpp == 1)
        f = (other.forward_s + other.backward_s) / (base.forward_s + base.backward_s)
        capacity = min(capacity, gpu.hbm_capacity)
        for node in entry.nodes:
            if node >= topology.num_nodes:
                raise LayoutError(f"node {node} is outside the cluster's {topology.num_nodes} nodes",
                                  field=f"{field}.nodes", fix=f"use nodes 0..{topology.num_nodes - 1}")
            if node in seen:
                raise LayoutError(f"node {node} is listed twice", field=f"{field}.nodes",
                                  fix="give each node one GPU model")
            seen.add(node)
            for rank in range(node * gpn, min((node + 1) * gpn, cfg.mesh.num_ranks)):
                factors[rank] = factors.get(rank, 1.0) * f
    return dataclasses.replace(cfg, compute_slowdown=tuple(sorted(factors.items())), capacity_bytes=capacity)
