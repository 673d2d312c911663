"""Each model chunk's cost: the layers a pipeline stage runs for one model part, in seconds on its GPU, with the
collectives they need (`chunk_cost`: simdist.plan.layer_cost kernels on the simdist.hardware.compute roofline, the
framework's kernels, recompute and CUDA graphs as simdist.plan.execution says).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simdist.errors import LayoutError
from simdist.hardware.compute import compute_efficiency, kernel_time_s, kernels_time_s
from simdist.hardware.tp_overlap import gemm_slowdown
from simdist.plan.comm_overlap import a2a_overlapped
from simdist.plan.graph_scope import replayed, replayed_run
from simdist.plan.layer_cost import Work, layer_work
from simdist.plan.layer_params import layer_param_shards, layer_tensors
from simdist.plan.model_ends import embedding_work, head_work, mtp_work
from simdist.plan.moe_pairing import segments
from simdist.plan.recompute import full_layers
from simdist.plan.step_config import LayerKinds, StepConfig

__all__ = ["ChunkCost", "chunk_cost", "chunk_cost_key", "chunk_parts", "memo_chunk_cost"]

@dataclass(frozen=True, slots=True)
class ChunkCost:
    """Durations and collectives of one model chunk (the layers one stage runs for one model part)."""

    forward_s: float
    backward_s: float
    recompute_s: float
    forward_comm: tuple[tuple[str, float, str, int, float, str], ...]
    """(op, nbytes, axis, count, imbalance, kernel) run back to back after the forward compute; ``imbalance``: an
    all_to_all's busiest peer's bytes / the mean (simdist.plan.layer_cost.CommWork.imbalance; 1.0: even); ``kernel``:
    what moves it (CommWork.kernel)."""
    recompute_comm: tuple[tuple[str, float, str, int, float, str], ...]
    backward_overlapped_comm: tuple[tuple[str, float, str, int, float, str], ...]
    backward_comm: tuple[tuple[str, float, str, int, float, str], ...]
    ring_forward_comm: tuple[tuple[str, float, str, int, float, str], ...]
    """Context-parallel ring exchanges (cp_comm_type p2p) of the forward, beside ``ring_forward_s`` of its compute."""
    ring_backward_comm: tuple[tuple[str, float, str, int, float, str], ...]
    ring_forward_s: float
    """Of forward_s, the ring steps' attention (the compute the ring exchanges overlap)."""
    ring_backward_s: float
    model_flops_forward: float
    model_flops_backward: float
    recompute_flops: float
    num_params: float
    """Parameters this chunk holds on one GPU (its tp shard)."""
    num_tensors: int
    """Parameter tensors (weights and biases), for per-parameter gradient reduction."""
    first_part: bool = False
    """The chunk is model part 0 (pipeline rank 0's first chunk): where Megatron-LM cuts gradients into buckets."""
    expert_params: float = 0.0
    """Of ``num_params``, the routed experts' parameters on one GPU (its ep x etp shard): their gradients reduce over
    the expert-data-parallel group, not dp (Megatron-Core expert_data_parallel group)."""
    num_layers: int = 0
    """Decoder layers in the chunk (and multi-token-prediction layers): its FSDP units (simdist.plan.fsdp)."""
    embedding_params: float = 0.0
    """Of ``num_params``, the word embedding's on one GPU (the first model part's)."""
    head_params: float = 0.0
    """Of ``num_params``, the output layer's on one GPU (the last model part's, untied)."""
    moe_pairing: tuple[float, ...] = ()
    """Under the 1F1B A2A overlap: the per-layer compute segments of its MoE layers and their number
    (simdist.plan.moe_pairing.segments); () otherwise."""



def _comm_groups(work_comm: tuple, phase: str, overlappable: bool | None, times: int, ring: bool = False) -> tuple:
    """(op, nbytes, axis, count, imbalance, kernel) of a Work's collectives of one phase (``overlappable`` None:
    either), alike ones counted together; ``ring``: the context-parallel ring exchanges instead of the others."""
    agg: dict[tuple[str, float, str, float, str], int] = {}
    for c in work_comm:
        if c.phase == phase and (overlappable is None or c.overlappable == overlappable) and c.ring == ring:
            key = (c.op, float(c.nbytes), c.axis, float(c.imbalance), c.kernel)
            agg[key] = agg.get(key, 0) + times
    return tuple((op, nbytes, axis, n, x, kernel) for (op, nbytes, axis, x, kernel), n in agg.items())


_LAYERS: dict[tuple, Work] = {}
"""`layer_work` of each kind of layer under each configuration `chunk_parts` has asked for (a search prices the same
layers in the chunks of every pipeline depth and stage), at most `_LAYERS_MAX`."""
_LAYERS_MAX = 4096
_TIMES: dict[int, tuple[Work, dict[tuple[str, int], float]]] = {}
"""For each Work `_LAYERS` holds, by id (alive while held: cleared together): the Work and the seconds of its kernels
by (phase, pricing's number) (`chunk_cost`'s ``total``)."""
_PRICINGS: dict[tuple, int] = {}
"""A number for each (GPU, precision, efficiency constants, host costs, CUDA graphs) `chunk_cost` priced under."""


def chunk_parts(cfg: StepConfig, layers: LayerKinds, first_part: bool, last_part: bool) -> list[tuple[Work, int]]:
    """The work of one model chunk as `chunk_cost` prices it: (a layer's or module's `Work`, how many of it) for the
    decoder ``layers`` of one model part (full recompute split over them as simdist.plan.recompute says), the
    embedding on the first part, the head and the multi-token-prediction modules on the last."""
    kw = dict(tp=cfg.mesh.tp, cp=cfg.mesh.cp, sequence_parallel=cfg.sequence_parallel,
              micro_batch_size=cfg.micro_batch_size, precision=cfg.precision)
    m, experts, ex = cfg.model, cfg.expert_parallel, cfg.execution

    decoder = m.kind == "decoder"
    keeps = cfg.op_keeps_attention  # (torchtitan's op-level policy: only where its save list names the kernel)
    base = (m, cfg.tp_style, cfg.attention, cfg.attention_mask, cfg.fp8_recipe, experts, ex.style, ex.fp8_weight_cache,
            ex.recompute_modules, ex.cp_comm_type, ex.fp8_attention, ex.tp_inputs, ex.recompute_early_stop, keeps,
            ex.async_tp, *kw.values())

    def layer(i: int, recompute: str = cfg.recompute) -> Work:
        # what of the layer's index layer_work reads: whether its MLP is the experts and whether it attends over a
        # window; the Work of one kind of layer is shared by every chunk of every layout that asks for it
        key = (base, recompute, *((m.moe_layer_flags()[i], m.window_layer_flags()[i]) if decoder else ()))
        w = _LAYERS.get(key)
        if w is None:
            if len(_LAYERS) >= _LAYERS_MAX:
                _LAYERS.clear()
                _TIMES.clear()
            w = _LAYERS[key] = layer_work(
                m, recompute=recompute, tp_style=cfg.tp_style, attention=cfg.attention,
                attention_mask=cfg.attention_mask, fp8_recipe=cfg.fp8_recipe, layer=i, experts=experts, style=ex.style,
                fp8_weight_cache=ex.fp8_weight_cache, recompute_modules=ex.recompute_modules,
                cp_comm_type=ex.cp_comm_type, fp8_attention=ex.fp8_attention, tp_inputs=ex.tp_inputs,
                early_stop=ex.recompute_early_stop, op_keeps_attention=keeps, async_tp=ex.async_tp, **kw)
            _TIMES[id(w)] = (w, {})
        return w

    parts: list[tuple[Work, int]] = []
    if cfg.recompute == "full" and ex.recompute_method not in (None, "uniform"):
        # Full recompute of some of the chunk's layers (simdist.plan.recompute.full_layers), the others none.
        # Assumption: where the chunk mixes kinds of layers, the recomputed ones are spread over the kinds in
        # proportion.
        total = sum(n for _, n in layers)
        redo = full_layers(ex.recompute_method, ex.recompute_num_layers, total)
        left = redo
        for j, (i, n) in enumerate(layers):
            k = left if j == len(layers) - 1 else min(left, round(redo * n / total)) if total else 0
            left -= k
            parts += [(w, c) for w, c in ((layer(i, "full"), k), (layer(i, "none"), n - k)) if c]
    else:
        parts = [(layer(i), n) for i, n in layers]
    if first_part and m.kind == "decoder":
        parts.append((embedding_work(m, style=ex.style, **kw), 1))
    if last_part:
        parts.append((head_work(m, style=ex.style, loss_fusion=ex.loss_fusion, loss_style=ex.loss_style,
                                loss_parallel=ex.loss_parallel, z_loss=ex.z_loss, **kw), 1))
    mtp = m.mtp_layers if last_part else 0
    if mtp:
        # DeepSeek-V3 sec. 2.2 / Megatron-LM: the MTP modules run on the last pipeline stage after the main model:
        # each an embedding lookup, its norms and projection, a layer built like the last one, the shared head.
        parts += [(layer(m.num_layers - 1), mtp), (mtp_work(m, **kw), mtp),
                  (embedding_work(m, style=ex.style, **kw), mtp),
                  (head_work(m, style=ex.style, loss_fusion=ex.loss_fusion, loss_style=ex.loss_style,
                                loss_parallel=ex.loss_parallel, z_loss=ex.z_loss, **kw), mtp)]
    return parts


def chunk_cost(cfg: StepConfig, layers: LayerKinds | int, first_part: bool, last_part: bool) -> ChunkCost:
    """Cost of the decoder ``layers`` of one model part (`StepConfig.part_layers`; an int n: n layers of a model whose
    layers are all alike) + the embedding on the first model part, + the head (and the multi-token-prediction
    modules) on the last, per micro-batch."""
    m = cfg.model
    if isinstance(layers, int):
        if m.kind == "decoder" and len(set(zip(m.moe_layer_flags(), m.window_layer_flags(), strict=True))) > 1:
            raise LayoutError(f"model {m.name!r} mixes kinds of layers: a chunk's cost needs its layer indices",
                              field="model.moe_layer_freq", fix="pass StepConfig.part_layers(part)")
        layers = ((0, layers),) if layers else ()
    parts = chunk_parts(cfg, layers, first_part, last_part)
    ex = cfg.execution
    mtp = m.mtp_layers if last_part else 0
    host = cfg.host_overhead
    eff = cfg.compute_efficiency or compute_efficiency(cfg.gpu)
    if ex.cuda_graphs:
        # Kernels replayed from CUDA graphs: no host launch per kernel, and the graph's smaller gap between kernels
        # (simdist.hardware.compute.ComputeEfficiency.graph_launch_overhead_s).
        eff = eff.replayed()

    if len(_PRICINGS) >= _LAYERS_MAX:
        _PRICINGS.clear()
        _TIMES.clear()  # (their seconds are keyed by the numbers just forgotten)
        _LAYERS.clear()
    pricing = _PRICINGS.setdefault((cfg.gpu, cfg.precision, eff, host, ex.cuda_graphs, ex.graph_tags),
                                   len(_PRICINGS))
    # Megatron-Core's partial CUDA graphs (training.cuda_graph_scope): the kernels of the replayed parts at the graph's
    # gap between kernels, the host one call per replay (simdist.plan.graph_scope)
    graph_eff = eff.replayed() if ex.graph_tags else eff

    def total(phase: str) -> float:
        # Each part's kernels take their roofline time, or the host's time to issue them where that is longer
        # (simdist.hardware.host: one eager op per modelled kernel, or its calls and launches where it stands for
        # several: Kernel.launches); under CUDA graphs the GPU's time alone.
        # Assumption: one framework op per kernel simdist models (fused kernels as Megatron-LM fuses them) unless the
        # kernel says otherwise.
        # Where the host waits for the device (Work.host_syncs: an MoE layer's token counts), its lead is lost: the
        # kernels on either side are issued and run as runs of their own, and the run after the wait starts on an
        # empty GPU queue: the step gap (simdist.hardware.host: the same idle as after Megatron's synchronize
        # following a pipeline send/recv), then each kernel as the host issues it (HostOverhead.ramp_time_s).
        # Assumption: under CUDA graphs the synchronization stays (a dropless MoE layer's expert part is not
        # captured: Megatron-Core's partial graphs stop at it) and costs the gap.
        out = 0.0
        for w, n in parts:
            entry = _TIMES.get(id(w))
            seconds = entry[1] if entry is not None and entry[0] is w else None
            t = seconds.get((phase, pricing)) if seconds is not None else None
            if t is None:
                kernels = getattr(w, phase)
                cuts = w.host_syncs if phase == "forward" else w.recompute_syncs if phase == "recompute" else ()
                bounds = list(zip((0, *cuts), (*cuts, len(kernels)), strict=True))
                flags = replayed(w, phase, ex.graph_tags)
                t = 0.0
                for i, (a, b) in enumerate(bounds):
                    run = kernels[a:b]
                    if ex.cuda_graphs:  # replayed: the GPU's time, and the gap after each wait
                        t += (host.step_gap_s if i else 0.0) + kernels_time_s(cfg.gpu, run, cfg.precision, eff)
                        continue
                    gpu_s = [kernel_time_s(cfg.gpu, k, cfg.precision, eff) for k in run]
                    issue = [host.issue_s(k) for k in run]
                    if flags and any(flags[a:b]):
                        copy = w.graph_input
                        gpu_s, issue = replayed_run(
                            gpu_s, issue, flags[a:b],
                            [kernel_time_s(cfg.gpu, k, cfg.precision, graph_eff) if hit else 0.0
                             for k, hit in zip(run, flags[a:b], strict=True)], host.op_s,
                            kernel_time_s(cfg.gpu, copy, cfg.precision, eff) if copy else 0.0,
                            host.issue_s(copy) if copy else 0.0)
                    if i:  # after a wait: the ramp from an empty queue
                        t += host.ramp_time_s(gpu_s, issue)
                    else:  # the host ahead of the queue: the GPU's time or the host's, the longer
                        t += max(sum(gpu_s), sum(issue))
                if seconds is not None:
                    seconds[phase, pricing] = t
            out += t * n
        return out

    def comm(phase: str, overlappable: bool | None, ring: bool = False) -> tuple:
        out: dict[tuple[str, float, str, float, str], int] = {}
        for w, n in parts:
            for op, nbytes, axis, k, x, kernel in _comm_groups(w.comm, phase, overlappable, n, ring):
                out[(op, nbytes, axis, x, kernel)] = out.get((op, nbytes, axis, x, kernel), 0) + k
        return tuple((op, nb, ax, k, x, kernel) for (op, nb, ax, x, kernel), k in out.items())

    def ring_s(kernels_of) -> float:
        # Context-parallel ring attention (cp_comm_type p2p): the cp - 1 ring steps of each attention core run beside
        # the exchanges of KV blocks (simdist.plan.context_parallel); Assumption: the steps take (cp - 1) / cp of the
        # core's time (the first step, causal on the rank's own chunks, is 1 / cp of its work).
        if cfg.mesh.cp < 2 or ex.cp_comm_type != "p2p":
            return 0.0
        share = (cfg.mesh.cp - 1) / cfg.mesh.cp
        return share * sum(kernel_time_s(cfg.gpu, k, cfg.precision, eff) * n
                           for w, n in parts for k in kernels_of(w) if k.kind == "attention")

    # Model FLOPs per the causal convention (Kernel.model_flops: the masked half of the scores not counted; a
    # token's topk experts at the balanced share).
    # (matmul FLOPs only, as simdist.plan.kernel_work.work_of counts them: element-wise kernels carry FLOPs for the
    # roofline, not for the model-FLOP convention)
    fwd_model = sum(sum(k.model_flops for k in w.forward if k.kind != "memory") * n for w, n in parts)
    bwd_model = sum(sum(k.model_flops for k in w.backward if k.kind != "memory") * n for w, n in parts)
    rec = sum(sum(k.flops for k in w.recompute) * n for w, n in parts)
    # Parameters this chunk holds on one GPU: each layer's dense weights over tp and its routed experts over
    # ep x etp (simdist.plan.layer_params.layer_param_shards), the embedding on the first part and the output
    # projection on the last (each vocab x h / tp; Megatron's vocab-parallel embedding), the MTP modules there too.
    tp, experts_gpus = cfg.mesh.tp, cfg.ep * cfg.etp
    split = replicated = routed = tensors = 0
    for i, n in layers:
        s_i, r_i, e_i = layer_param_shards(m, i)
        split, replicated, routed = split + s_i * n, replicated + r_i * n, routed + e_i * n
        tensors += layer_tensors(m, i, ep=cfg.ep) * n
    if mtp:
        s_i, r_i, e_i = layer_param_shards(m, m.num_layers - 1)
        own = m.mtp_params // mtp - m.layer_params(m.num_layers - 1)  # its norms and eh_proj, split over tp
        split, replicated, routed = split + (s_i + own) * mtp, replicated + r_i * mtp, routed + e_i * mtp
        tensors += mtp * (layer_tensors(m, m.num_layers - 1, ep=cfg.ep) + 4)
    params = split / tp
    emb_params = head_params = 0.0
    if m.kind == "decoder":
        emb = m.vocab_size * m.hidden_size / tp
        emb_params = emb if first_part else 0.0
        head_params = emb if last_part and not m.tied_embeddings else 0.0
        params += emb_params + head_params
        tensors += (1 if first_part else 0) + (1 if last_part and not m.tied_embeddings else 0)
    expert_params = routed / experts_gpus
    if replicated or routed:
        params += replicated + expert_params
    tax = tax_backward = 0.0
    if ex.async_tp and cfg.mesh.tp > 1:
        # torchtitan's async TP splits each GEMM beside a sequence-parallel collective into tp GEMMs of m / tp rows
        # (torch/_inductor/fx_passes/micro_pipeline_tp.py: fused_all_gather_matmul / fused_matmul_reduce_scatter, one
        # matmul per shard), forward and backward; the copies run on the copy engines (symmetric memory), not the
        # SMs. Charged: the smaller GEMMs' lost efficiency (size and wave quantization: simdist.hardware.gemm).
        split = cfg.mesh.tp
        for w, n in parts:
            for k in (*w.forward, *w.backward):
                if k.kind == "gemm" and k.gemm_mnk and k.name.removesuffix("_input_grad") in _ASYNC_TP_GEMMS:
                    m_, n_, k_ = k.gemm_mnk
                    piece = dataclasses.replace(k, flops=k.flops / split, hbm_bytes=k.hbm_bytes / split,
                                                gemm_mnk=(max(1, m_ // split), n_, k_))
                    extra = n * (split * kernel_time_s(cfg.gpu, piece, cfg.precision, eff)
                                 - kernel_time_s(cfg.gpu, k, cfg.precision, eff))
                    if k.name.endswith("_input_grad"):
                        tax_backward += extra
                    else:
                        tax += extra
    if cfg.tp_comm_overlap and cfg.mesh.tp > 1:
        # the forward GEMMs whose reduce-scatter runs beside them lose the SMs its kernels take (tp_overlap)
        for w, n in parts:
            for k in w.forward:
                f = gemm_slowdown(cfg.gpu, cfg.precision, k.name) if k.kind == "gemm" else 1.0
                if f > 1.0:
                    tax += n * (f - 1.0) * kernel_time_s(cfg.gpu, k, cfg.precision, eff)
    # Megatron-Core's 1F1B A2A overlap pairs each all-to-all with one compute segment of the other micro-batch's layer
    # (simdist.plan.moe_pairing); the segments' GPU time (the host's lead is the step's, not the segment's)
    pairing = segments(parts, lambda ks: kernels_time_s(cfg.gpu, ks, cfg.precision, eff), cfg.delay_wgrad) \
        if a2a_overlapped(cfg) and cfg.moe_overlap_share >= 1.0 else ()
    return ChunkCost(
        forward_s=total("forward") + tax,
        backward_s=total("backward") + tax_backward,
        recompute_s=total("recompute"),
        forward_comm=comm("forward", False) + comm("forward", True),
        ring_forward_comm=comm("forward", None, ring=True),
        ring_backward_comm=comm("backward", None, ring=True),
        ring_forward_s=ring_s(lambda w: w.forward),
        ring_backward_s=ring_s(lambda w: w.backward),
        recompute_comm=comm("recompute", False) + comm("recompute", True),
        backward_overlapped_comm=comm("backward", True),
        backward_comm=comm("backward", False),
        model_flops_forward=fwd_model,
        model_flops_backward=bwd_model,
        recompute_flops=rec,
        num_params=params,
        num_tensors=tensors,
        first_part=first_part,
        expert_params=expert_params,
        num_layers=sum(n for _, n in layers) + mtp,
        embedding_params=emb_params,
        head_params=head_params,
        moe_pairing=pairing,
    )


_ASYNC_TP_GEMMS = frozenset({"qkv", "mlp_up", "projection", "mlp_down"})
"""The GEMMs beside a sequence-parallel all-gather (qkv, mlp_up; in backward the projection's and mlp_down's input
gradients) or reduce-scatter (projection, mlp_down; in backward qkv's and mlp_up's input gradients)."""


def chunk_cost_key(cfg: StepConfig) -> tuple:
    """Every StepConfig field `chunk_cost` reads besides the chunk's layers and position."""
    return (cfg.model, cfg.gpu, cfg.mesh.tp, cfg.mesh.cp, cfg.sequence_parallel, cfg.micro_batch_size, cfg.recompute,
            cfg.attention, cfg.attention_mask, cfg.fp8_recipe, cfg.precision, cfg.tp_style, cfg.compute_efficiency,
            cfg.host_overhead, cfg.expert_parallel, cfg.tp_comm_overlap, cfg.execution,
            a2a_overlapped(cfg), cfg.moe_overlap_share, cfg.delay_wgrad)  # (the 1F1B A2A overlap's pairing)


_MEMO: dict[tuple, ChunkCost] = {}
_MEMO_MAX = 20_000


def memo_chunk_cost(cfg: StepConfig, layers: LayerKinds, first_part: bool, last_part: bool) -> ChunkCost:
    """`chunk_cost`, kept by `chunk_cost_key` and the chunk's layers and position: the closed form's chunk costs
    (simdist.analytic.pricing, which keys them by tokens of the same) and the stage loads that pace a pipeline
    under a spread of GPU speeds (simdist.plan.stage_pace) are then priced once."""
    key = (chunk_cost_key(cfg), layers, first_part, last_part)
    hit = _MEMO.get(key)
    if hit is None:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        hit = _MEMO[key] = chunk_cost(cfg, layers, first_part, last_part)
    return hit
