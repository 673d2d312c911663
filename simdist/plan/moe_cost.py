"""The MLP half of a mixture-of-experts layer on one GPU: router, token dispatch, the local experts' GEMMs, combine,
shared experts, forward and backward, with the expert-parallel collectives.

What runs is Megatron-Core's MoELayer (megatron/core/transformer/moe/moe_layer.py, router.py, token_dispatcher.py,
experts.py, shared_experts.py), forward:

1. the shared experts (a dense MLP of moe_shared_expert_intermediate_size, tensor-parallel over tp like the dense
   MLP: SharedExpertMLP), computed before routing;
2. the router: logits = x W (h x num_experts, replicated over tp) on this TP peer's own tokens (b s / (cp tp): MoE
   with tp > 1 runs under sequence parallelism), softmax / top-k;
3. ``alltoall`` (MoEAlltoAllTokenDispatcher): permutation 1 gathers each token once per chosen expert, grouped by
   destination (T x topk rows); all-to-all over the ep group; with etp > 1 an all-gather over the expert-TP group
   (gather_from_sequence_parallel_region on expt_tp); permutation 2 sorts the received rows by local expert
   (sort_chunks_by_idxs, when a rank holds more than one expert);
4. the local experts (num_experts / ep of them): fc1 h -> moe_ffn (x 2 with SwiGLU) / etp (GPT-OSS's clamp of its
   output in eager kernels: simdist.plan.glu_clamp), the activation, which
   weights each row by its router probability (the permuted probabilities travel with the rows: Megatron-LM !2668,
   "perf(MoE): Memory efficient token permutation", April 2025, TEGroupedMLP's weighted bias-SwiGLU), fc2 -> h; one
   grouped GEMM per linear (TEGroupedMLP, --moe-grouped-gemm: Transformer Engine launches it as one cuBLASLt GEMM
   per local expert on four side streams, simdist.plan.kernel_work.TE_GEMM_STREAMS) or one GEMM per expert
   (SequentialMLP); under FP8 each
   expert's rows padded to the GEMMs' alignment, in copies before fc1 and after fc2 behind the alltoall and allgather
   dispatchers (simdist.plan.moe_padding);
5. the reverse: unsort, reduce-scatter over etp, all-to-all back (combine), unpermutation (summing a token's copies:
   `unpermute` without probabilities in every dispatcher since !2668), plus the shared experts' output.

``allgather`` (MoEAllGatherTokenDispatcher) gathers every token of the expert-TP x EP group (tp_ep group) with its
routing map and probabilities, permutes out the local experts' rows, and reduce-scatters the unpermuted outputs back
(in the probabilities' fp32). ``flex`` (MoEFlexTokenDispatcher with DeepEP or HybridEP, DeepSeek-V3 sec. 3.2.2):
fused dispatch/combine kernels that send a token once per destination rank rather than once per expert (and sum a
token's local experts' outputs before sending it back), so the all-to-all moves T x (expected distinct destination
ranks) rows instead of T x topk; the received rows are permuted to the local experts as in ``alltoall``. Where the
expert-parallel group spans several NVLink domains (``ExpertParallel.domains``: nodes of 8 GPUs; a GB200 NVL72 rack
is one), both send a token over RDMA once per destination domain, to the GPU of the same local index there, which
forwards it over NVLink to its destination ranks (DeepEP's internode normal kernels: "forwarding data from NVLink
domain to RDMA domain", github.com/deepseek-ai/DeepEP docs/legacy.md; HybridEP likewise, Megatron-LM
moe_flex_dispatcher_backend), and combine back the same way: the network carries T x (expected distinct remote
domains) rows a GPU, not T x (remote destination ranks).

# Assumption: a cross-domain flex dispatch is priced as an even all-to-all over ep of T x (expected distinct
# destination domains) rows: its cross-domain share, (domains - 1) / domains of it, is the one copy per remote
# domain the network carries; the NVLink forwarding inside each domain runs beside it (DeepEP pipelines the two)
# and is not priced on its own (the network is the slower of the two: 50 GB/s a GPU against 450 on an H100 node;
# DeepEP measures its RDMA side as the bottleneck in the table of github.com/deepseek-ai/DeepEP docs/legacy.md).

Routing imbalance: ``moe_imbalance`` x = the busiest expert-parallel rank's routed tokens / the mean. Every rank
waits for the busiest at the combine, so the layer runs at the busiest rank's pace: its permutation 2, expert GEMMs
and activation process x times the mean share (the collectives carry ``imbalance`` x: the busiest peer's receive
buffer / the mean). A capacity factor c (--moe-expert-capacity-factor) drops the tokens beyond c x an expert's
balanced share (megatron/core/transformer/moe/moe_utils.py get_capacity: ceil(tokens x topk / num_experts x c)), so
the busiest rank processes min(x, c) x the mean and every rank at most c x its own. Model FLOPs count a token's topk
experts at the balanced share (no imbalance, no drops): imbalance is time, not model work.
"""

from __future__ import annotations

from simdist.plan.elementwise import ew
from simdist.plan.expert_parallel import (
    ExpertParallel,
    RoutedTokens,
    check_experts,
    expected_destination_ranks,
    routed_tokens,
)
from simdist.plan.glu_clamp import clamp_kernels
from simdist.plan.kernel_work import Kernel, LayerShape, Pass, elementwise, gemm, gemm_grads
from simdist.plan.model import Model
from simdist.plan.moe_bias import fc2_bias_kernels
from simdist.plan.moe_padding import copies_padding, padding_kernels, router_pads
from simdist.plan.moe_router import aux_loss_kernels


def moe_mlp_block(model: Model, shape: LayerShape, experts: ExpertParallel) -> tuple[Pass, Pass, int, int]:
    """(forward, backward) of one MoE layer's MLP half, from its norm to the combined output (no residual), and how
    many of the forward's first kernels and of the backward's last are its pre-MLP norm, unoverlapped shared experts
    and router (Megatron-Core's moe_router CUDA graph scope: simdist.plan.graph_scope)."""
    check_experts(model, tp=shape.tp, sequence_parallel=shape.sequence_parallel, experts=experts)
    h, m, bpe, tp, fp8 = model.hidden_size, shape.tokens, shape.bpe, shape.tp, shape.fp8
    sp = shape.sequence_parallel
    resid = m * h // tp if sp else m * h
    r = routed_tokens(model, shape, experts)
    t, e = r.local, model.num_experts
    fwd, bwd = Pass("forward"), Pass("backward")
    fwd.add(*ew(shape.norm, resid, bpe, shape.style))

    # 1. shared experts: the dense MLP's kernels and TP collectives at their width (Megatron-LM SharedExpertMLP).
    # Assumption: they run on the main stream before routing (--moe-shared-expert-overlap, which overlaps them with
    # the dispatch all-to-all, is not modelled); the all-to-alls block the next kernel (overlappable False: their
    # overlap with another micro-batch, --overlap-moe-expert-parallel-comm, is the step recipe's, not the layer's).
    shared = model.moe_shared_expert_intermediate_size
    shared_bwd = Pass("backward")
    if shared:
        f_l = shared // tp
        up_n = 2 * f_l if model.swiglu else f_l
        if tp > 1:
            fwd.issue("all_gather", m * h * bpe)
        fwd.add(*shape.casts("shared_up", m * h), gemm("shared_up", m, up_n, h, bpe, fp8),
                _activation("shared", model, m * f_l, bpe), *shape.casts("shared_down", m * f_l),
                gemm("shared_down", m, h, f_l, bpe, fp8))
        if tp > 1:
            fwd.issue("reduce_scatter", m * h * bpe)
            shared_bwd.issue("all_gather", m * h * bpe)
        shared_bwd.add(*shape.casts("shared_down_grad", m * h), *gemm_grads("shared_down", m, h, f_l, bpe, fp8),
                       _activation_grad("shared", model, m * f_l, bpe), *shape.casts("shared_up_grad", m * up_n))
        dgrad, wgrad = gemm_grads("shared_up", m, up_n, h, bpe, fp8)
        shared_bwd.add(dgrad)
        if tp > 1:
            shared_bwd.issue("reduce_scatter", m * h * bpe, overlappable=True)
        shared_bwd.add(wgrad)

    # 2. router (Megatron-LM TopKRouter: a plain linear, not an FP8 GEMM), softmax and top-k: reads the bf16 logits,
    # writes the fp32 scores and the top-k probabilities and routing map.
    # The auxiliary load-balancing loss's small kernels follow, as the launches they are (simdist.plan.moe_router).
    # Assumption: the dispatcher's metadata (the tokens-per-expert all-gather over tp_ep and its device-to-host sync)
    # costs nothing; the probabilities' own all-to-all (T x topk of them, beside the tokens') is left out: under
    # 4 / (h x 2) of the tokens' bytes; the router's GEMM is priced in the hidden states' dtype whatever
    # moe_router_dtype (the probabilities' bytes follow it: ExpertParallel.prob_bytes).
    pb = experts.prob_bytes(bpe)
    fwd.add(gemm("router", t, e, h, bpe), elementwise("router_topk", t * e, bpe + 4 + 1 + pb, 8.0),
            aux_loss_kernels(t, e, experts.router_fusion, "forward"))
    router_forward = len(fwd.kernels)

    # 3-5. dispatch, experts, combine.
    exp_fwd, exp_bwd = _routed_experts(model, shape, experts, r)
    fwd.then(exp_fwd)
    if shared:
        fwd.add(elementwise("shared_expert_add", t * h, 3 * bpe))  # output += shared_expert_output
    bwd.then(exp_bwd)
    router_backward = len(bwd.kernels)
    bwd.add(aux_loss_kernels(t, e, experts.router_fusion, "backward"),
            elementwise("router_topk_grad", t * e, 4 + 4 + bpe, 8.0), *gemm_grads("router", t, e, h, bpe))
    bwd.then(shared_bwd)
    bwd.add(*ew(f"{shape.norm}_grad", resid, bpe, shape.style))
    return fwd, bwd, router_forward, len(bwd.kernels) - router_backward


def _sync_point(dispatcher: str, ep: int, num_local_experts: int, capacity_factor: float | None,
                router_padding: bool = False) -> str:
    """Where a dropless MoE layer's forward waits for the device: the host needs the routed token counts on the CPU
    (the all-to-all's split sizes, the grouped GEMM's rows per expert).

    ``alltoall``: Megatron-Core MoEAlltoAllTokenDispatcher.preprocess sets ``cuda_sync_point``: ``before_permutation_1``
    when a capacity factor drops tokens or the router pads for FP8 (``router_padding``: num_out_tokens), else
    ``before_ep_alltoall`` when ep > 1 or the rank holds several experts (input_splits / output_splits), else
    ``before_finish`` (tokens_per_expert), and _maybe_update_cuda_sync_point synchronizes the stream there
    (megatron/core/transformer/moe/token_dispatcher.py).
    ``flex`` (DeepEP's normal-mode dispatch): the CPU waits for the received-token counts the notify kernel writes to
    host-mapped memory before it sizes the dispatch's output (deep_ep buffer.py / intranode.cu, notify_dispatch): at the
    dispatch. ``allgather``: MoEAllGatherTokenDispatcher copies tokens_per_expert to the CPU after the gathers, before
    the local permutation.
    # Assumption: backward reuses the forward's counts (TE GroupedLinear keeps m_splits), so it has no synchronization.
    """
    if dispatcher == "allgather":
        return "before_finish"
    if dispatcher == "alltoall" and (capacity_factor is not None or router_padding):
        return "before_permutation_1"
    if ep > 1 or num_local_experts > 1:
        return "before_ep_alltoall"
    return "before_finish"


def _activation(prefix: str, model: Model, elements: float, bpe: int, share: float | None = None,
                width: float | None = None, prob_bytes: int = 4) -> Kernel:
    """The experts' activation of ``elements`` outputs; ``width``: outputs per routed row, where the activation also
    weights each row by its probability of ``prob_bytes`` (read once a row, one more multiply an element)."""
    probs = (prob_bytes / width, 1.0) if width else (0.0, 0.0)
    if model.swiglu:
        return elementwise(f"{prefix}_swiglu", elements, 3 * bpe + probs[0], 6.0 + probs[1], useful_share=share)
    return elementwise(f"{prefix}_gelu", elements, 2 * bpe + probs[0], 8.0 + probs[1], useful_share=share)


def _activation_grad(prefix: str, model: Model, elements: float, bpe: int, share: float | None = None,
                     width: float | None = None, prob_bytes: int = 4) -> Kernel:
    """Its backward; ``width``: also the probability's gradient, a row's dot product of the output gradient and the
    unweighted activation (the probability read, its gradient written: 2 x prob_bytes a row, 2 FLOPs an element)."""
    probs = (2 * prob_bytes / width, 2.0) if width else (0.0, 0.0)
    if model.swiglu:
        return elementwise(f"{prefix}_swiglu_grad", elements, 5 * bpe + probs[0], 8.0 + probs[1], useful_share=share)
    return elementwise(f"{prefix}_gelu_grad", elements, 3 * bpe + probs[0], 10.0 + probs[1], useful_share=share)


def _routed_experts(model: Model, shape: LayerShape, experts: ExpertParallel, r: RoutedTokens) -> tuple[Pass, Pass]:
    """Dispatch, the local experts, combine: forward and backward (backward in reverse order)."""
    h, bpe, fp8 = model.hidden_size, shape.bpe, shape.fp8
    ep, etp, e = experts.ep, experts.etp, model.num_experts
    t, nl, rows = r.local, r.num_local_experts, r.busiest
    imb = experts.a2a_imbalance
    kind = experts.dispatcher
    a2a = kind in ("alltoall", "flex")
    pb = experts.prob_bytes(bpe)
    # flex across NVLink domains: a token once per destination domain (the module docstring), the even all-to-all of
    # T x (expected distinct destination domains) rows
    wire = (t * expected_destination_ranks(e, model.moe_router_topk, experts.domains) * experts.kept_share
            if kind == "flex" and experts.domains > 1 else r.sent)
    send_bytes = wire * h * bpe
    gathered = t * etp * ep  # allgather: every token of the expert-TP x EP group
    # (axis, gathered rows) of the allgather dispatcher's one all-gather over the expert-TP x EP group, written as one
    # over etp then one over ep: a ring moves (etp ep - 1) T rows per rank either way ((etp - 1) T + (ep - 1) etp T).
    gathers = [(axis, size) for axis, size, n in (("etp", t * etp, etp), ("ep", gathered, ep)) if n > 1]
    sort = kind != "alltoall" or nl > 1  # alltoall sorts by local expert only when a rank holds several
    even = r.balanced / rows  # of the busiest rank's rows, the share a balanced rank has (counted as model FLOPs)
    fwd, bwd = Pass("forward"), Pass("backward")

    # ---- dispatch
    # The host learns the token counts once per layer forward, in a blocking device-to-host copy (`host_sync`).
    sync_at = _sync_point(kind, ep, nl, experts.capacity_factor, router_pads(shape.recipe, experts))
    if sync_at == "before_permutation_1":
        fwd.sync()
    if kind == "alltoall":
        fwd.add(elementwise("moe_permute", r.sent * h, 2 * bpe, 0.0))  # permutation 1: a row per chosen expert
    if sync_at == "before_ep_alltoall":
        fwd.sync()
    if a2a and ep > 1:
        fwd.issue("all_to_all", send_bytes, axis="ep", imbalance=imb, kernel=experts.kernel)
    if a2a and etp > 1:
        # the busiest expert-TP group gathers its peers' received rows (every peer of the group is equally busy)
        fwd.issue("all_gather", rows * h * bpe, axis="etp")
    if kind == "allgather":
        for axis, size in gathers:  # the tokens, then their routing map and probabilities
            fwd.issue("all_gather", size * h * bpe, axis=axis)
            fwd.issue("all_gather", size * e * (1 + pb), axis=axis)  # the routing map (bool), the probabilities
    if sync_at == "before_finish":
        fwd.sync()
    if sort:
        # alltoall: permutation 2 (sort_chunks_by_idxs); allgather: the local experts' rows out of every token;
        # flex: a received token expanded to each of its local experts: the busiest rank's rows, read and written
        fwd.add(elementwise("moe_sort_chunks", rows * h, 2 * bpe, 0.0, useful_share=even))

    # ---- the local experts: one grouped GEMM per linear, or one GEMM per expert (each its own waves of tiles)
    f_l = model.moe_ffn_hidden_size // etp
    up_n = 2 * f_l if model.swiglu else f_l
    te = r.per_expert
    # Model FLOPs of each GEMM: the balanced rows (a token's topk experts, no imbalance, no drops)
    useful_up, useful_down = 2.0 * r.balanced * up_n * h, 2.0 * r.balanced * h * f_l
    batch, calls = (nl, 1) if experts.grouped_gemm else (1, nl)
    # a grouped GEMM's operand is quantized expert by expert (simdist.plan.kernel_work.fp8_cast: TE's split_quantize)

    # Transformer Engine's grouped GEMM launches one cuBLASLt GEMM per local expert (kernel_work.TE_GEMM_STREAMS)
    grouped = experts.grouped_gemm

    def linear(name: str, n: int, k: int, useful: float) -> list[Kernel]:
        return [*shape.casts(name, te * k * batch, parts=batch),
                gemm(name, te, n, k, bpe, fp8, batch=batch, useful=useful / calls, grouped=grouped)] * calls

    def linear_grads(name: str, n: int, k: int, useful: float) -> list[Kernel]:
        return [*shape.casts(f"{name}_grad", te * n * batch, parts=batch),
                *gemm_grads(name, te, n, k, bpe, fp8, batch=batch, useful=useful / calls, grouped=grouped)] * calls

    # a clamped gated activation (GPT-OSS) clamps fc1's output in eager kernels first (simdist.plan.glu_clamp)
    # Assumption: SequentialMLP (moe_grouped_gemm false), which clamps expert by expert, is priced as one chain.
    clamp_fwd, clamp_bwd = (clamp_kernels(rows * f_l, bpe, even) if model.activation_func_clamp_value is not None
                            else ([], []))
    # FP8 grouped GEMMs behind the alltoall / allgather dispatchers: the rows padded per expert in copies, before fc1
    # and after fc2 (simdist.plan.moe_padding)
    pad_fwd, unpad_fwd, unpad_bwd, pad_bwd = (
        padding_kernels(rows, h, bpe, pb, even)
        if copies_padding(shape.recipe, experts)
        else ([], [], [], []))
    fwd.add(*pad_fwd, *linear("expert_fc1", up_n, h, useful_up), *clamp_fwd,
            _activation("expert", model, rows * f_l, bpe, even, f_l, pb),
            *linear("expert_fc2", h, f_l, useful_down))
    # fc2's bias, added per local expert after the grouped GEMM (simdist.plan.moe_bias)
    bias_fwd, bias_bwd = (fc2_bias_kernels(te, nl, h, bpe, pb, even) if model.add_bias_linear and experts.grouped_gemm
                          else ([], []))
    fwd.add(*bias_fwd, *unpad_fwd)

    # ---- combine
    if sort and kind != "allgather":
        fwd.add(elementwise("moe_unsort_chunks", rows * h, 2 * bpe, 0.0, useful_share=even))
    if a2a and etp > 1:
        fwd.issue("reduce_scatter", rows * h * bpe, axis="etp")
    if a2a and ep > 1:
        fwd.issue("all_to_all", send_bytes, axis="ep", imbalance=imb, kernel=experts.kernel)
    if kind == "allgather":
        # the outputs (weighted by their probabilities in the experts' activation), scattered into a zero-filled fp32
        # buffer of every gathered
        # token and reduce-scattered back in fp32 (token_combine: reduce_scatter_to_sequence_parallel_region on tp_ep)
        fwd.add(elementwise("moe_unpermute_fill", gathered * h, 4.0 + bpe * rows / gathered, 1.0))
        for axis, size in reversed(gathers):
            fwd.issue("reduce_scatter", size * h * 4.0, axis=axis)
    else:
        # unpermutation 1 (flex: DeepEP's combine): each returned row summed into its token (already weighted by the
        # experts' activation): the rows read, T x h written
        fwd.add(elementwise("moe_unpermute", r.sent * h, bpe + bpe * t / r.sent, 1.0))

    # ---- backward, in reverse
    if kind == "allgather":
        for axis, size in gathers:
            bwd.issue("all_gather", size * h * 4.0, axis=axis)
        bwd.add(elementwise("moe_unpermute_fill_grad", rows * h, 2 * bpe, 0.0, useful_share=even))  # a gather
    else:
        bwd.add(elementwise("moe_unpermute_grad", r.sent * h, 2 * bpe, 0.0))  # d(row) = dy of its token: a gather
    if a2a and ep > 1:
        bwd.issue("all_to_all", send_bytes, axis="ep", imbalance=imb, kernel=experts.kernel)
    if a2a and etp > 1:
        bwd.issue("all_gather", rows * h * bpe, axis="etp")
    if sort and kind != "allgather":
        bwd.add(elementwise("moe_unsort_chunks_grad", rows * h, 2 * bpe, 0.0, useful_share=even))
    bwd.add(*unpad_bwd, *bias_bwd, *linear_grads("expert_fc2", h, f_l, useful_down),
            _activation_grad("expert", model, rows * f_l, bpe, even, f_l, pb), *clamp_bwd,
            *linear_grads("expert_fc1", up_n, h, useful_up), *pad_bwd)
    if sort:
        bwd.add(elementwise("moe_sort_chunks_grad", rows * h, 2 * bpe, 1.0, useful_share=even))
    if a2a and etp > 1:
        bwd.issue("reduce_scatter", rows * h * bpe, axis="etp")
    if a2a and ep > 1:
        bwd.issue("all_to_all", send_bytes, axis="ep", imbalance=imb, kernel=experts.kernel)
    if kind == "allgather":
        for axis, size in reversed(gathers):
            bwd.issue("reduce_scatter", size * h * bpe, axis=axis)
    if kind == "alltoall":
        bwd.add(elementwise("moe_permute_grad", r.sent * h, 2 * bpe, 1.0))  # scatter-add of a token's rows
    return fwd, bwd
