"""The model's ends on one GPU for one micro-batch: the word embedding, the output head with its loss, and the
multi-token-prediction modules' own kernels (their transformer layer is simdist.plan.layer_cost's). Units and
conventions as simdist.plan.layer_cost's: a GEMM of (m, n, k) costs 2mnk FLOPs, byte counts are HBM reads plus
writes."""

from __future__ import annotations

from simdist.plan.elementwise import ew
from simdist.plan.kernel_work import (
    CommWork,
    Pass,
    Work,
    bytes_per_element,
    elementwise,
    gemm,
    gemm_grads,
    work_of,
)
from simdist.plan.model import Model

__all__ = ["embedding_work", "head_work", "mtp_work"]


def embedding_work(model: Model, *, tp: int, cp: int = 1, sequence_parallel: bool = False,
                   micro_batch_size: int = 1, precision: str = "bf16", style: str = "fused") -> Work:
    """The word-embedding lookup (vocab-parallel over tp, Megatron-LM VocabParallelEmbedding)."""
    if model.kind == "mlp":
        return Work((), (), (), (), 0.0, 0.0)
    bpe = bytes_per_element(precision)
    m = micro_batch_size * model.seq_length // cp
    h = model.hidden_size
    # Read each token's row (masked outside this rank's vocabulary slice) and write b x s x h; GPT adds learned
    # positions and embedding dropout (read + write again, mask).
    gpt = not model.swiglu
    fwd = [elementwise("embedding", m * h, 2 * bpe + (3 * bpe + 1 if gpt else 0))]
    # Backward: scatter-add of the output gradient into the fp32 embedding gradient (read + write 4 B).
    bwd = [elementwise("embedding_grad", m * h, bpe + 8 + (2 * bpe + 1 if gpt else 0))]
    if style != "fused":
        # PyTorch's embedding backward (embedding_dense_backward) accumulates into a zero-filled gradient of the whole
        # vocab x h (/ tp) table in the parameter's dtype each micro-batch; Megatron-Core accumulates into its
        # persistent fp32 main_grad buffer instead.
        bwd.insert(0, elementwise("embedding_grad_zero", -(-model.vocab_size // tp) * h, bpe, 0.0))
    comm: list[CommWork] = []
    if tp > 1:
        full = float(m * h * bpe)
        # VocabParallelEmbedding reduces its partial lookups: all-reduce (reduce-scatter under sequence
        # parallelism, Korthikanti sec. 4.2.2); the backward of the all-reduce is the identity, of the
        # reduce-scatter an all-gather.
        comm.append(CommWork("reduce_scatter" if sequence_parallel else "all_reduce", full, "forward", False,
                             issued_after=1))
        if sequence_parallel:
            comm.append(CommWork("all_gather", full, "backward", False, issued_after=0))
    return work_of(fwd, bwd, (), comm)


def head_work(model: Model, *, tp: int, cp: int = 1, sequence_parallel: bool = False,
              micro_batch_size: int = 1, precision: str = "bf16", style: str = "fused",
              loss_fusion: bool = False, loss_style: str | None = None, loss_parallel: bool = True,
              z_loss: bool = False) -> Work:
    """Final norm + logits GEMM + vocab-parallel softmax cross-entropy (decoder); squared-mean loss (mlp).

    ``style``: the final norm's kernels (simdist.plan.elementwise); ``loss_style``: the loss's (None: ``style``; fused
    Megatron-LM's vocab-parallel loss, eager F.cross_entropy's upcast, log_softmax and nll_loss, compiled Inductor's
    fused reduction; simdist.plan.execution.loss_compiled); ``loss_fusion``: one fused kernel per pass;
    ``loss_parallel`` False: the tp ranks' logits are all-gathered and each rank's loss covers the whole vocabulary;
    ``z_loss``: the z-loss's log-sum-exp over the same logits and its gradient (simdist.plan.elementwise; none of its
    own under ``loss_fusion``, whose kernel computes it).
    # Assumption: the final norm runs in the blocks' style (a few hundred microseconds either way)."""
    loss_style = loss_style or style
    bpe = bytes_per_element(precision)
    b = micro_batch_size
    h = model.hidden_size
    if model.kind == "mlp":
        # The lecture's loss: x.square().mean() over the (gathered) final activation b x h, and its gradient 2x/N.
        return work_of([elementwise("loss", b * h, bpe, 2.0)], [elementwise("loss_grad", b * h, 2 * bpe, 2.0)], (), [])
    m = b * model.seq_length // cp
    v_l = -(-model.vocab_size // tp)  # vocabulary rows per rank (Megatron pads V to a multiple of tp)
    resid = m * h // tp if sequence_parallel else m * h
    norm = "rmsnorm" if model.swiglu else "layernorm"
    loss = "fused_cross_entropy" if loss_fusion else "cross_entropy"
    # Without loss parallelism (tp > 1) DTensor's ColwiseParallel(output_layouts=Replicate()) all-gathers the logits
    # after their GEMM and every rank computes the loss over the whole vocabulary; the gradient of the replicated
    # logits is sliced back to the rank's columns (no collective).
    gathered = tp > 1 and not loss_parallel
    v_loss = model.vocab_size if gathered else v_l
    z = z_loss and not loss_fusion
    z_fwd = ew("z_loss", m * v_loss, bpe, loss_style) if z else []
    z_bwd = ew("z_loss_grad", m * v_loss, bpe, loss_style) if z else []
    fwd = [*ew(norm, resid, bpe, style), gemm("logits", m, v_l, h, bpe), *ew(loss, m * v_loss, bpe, loss_style), *z_fwd]
    dgrad, wgrad = gemm_grads("logits", m, v_l, h, bpe)
    loss_grad = [*ew(f"{loss}_grad", m * v_loss, bpe, loss_style), *z_bwd]
    bwd = [*loss_grad, dgrad, wgrad, *ew(f"{norm}_grad", resid, bpe, style)]
    at_logits = len(ew(norm, 1.0, bpe, style)) + 1  # the forward's kernels up to the logits GEMM
    at_dgrad = len(loss_grad) + 1  # the backward's up to the input-gradient GEMM
    comm: list[CommWork] = []
    if tp > 1:
        full = float(m * h * bpe)
        if sequence_parallel:
            comm.append(CommWork("all_gather", full, "forward", False, issued_after=at_logits - 1))
            comm.append(CommWork("reduce_scatter", full, "backward", True, issued_after=at_dgrad))
        else:
            comm.append(CommWork("all_reduce", full, "backward", True, issued_after=at_dgrad))
        if gathered:
            comm.append(CommWork("all_gather", float(m * v_l * tp * bpe), "forward", False, issued_after=at_logits))
        else:
            # The cross-entropy's all-reduces of per-token max, sum of exps and target logit (fp32, b x s each).
            comm += [CommWork("all_reduce", 4.0 * m, "forward", False, issued_after=at_logits) for _ in range(3)]
    return work_of(fwd, bwd, (), comm)


def mtp_work(model: Model, *, tp: int, cp: int = 1, sequence_parallel: bool = False, micro_batch_size: int = 1,
             precision: str = "bf16") -> Work:
    """One multi-token-prediction module's own kernels besides its transformer layer, embedding lookup and output
    head (DeepSeek-V3, arXiv:2412.19437 sec. 2.2, eq. (21); Megatron-LM MultiTokenPredictionLayer): RMSNorm of the
    hidden state (hnorm) and of the next token's embedding (enorm), their concatenation projected 2h -> h by eh_proj
    (column-parallel; its output gathered over tp and scattered back to the sequence-parallel split)."""
    bpe = bytes_per_element(precision)
    h, m = model.hidden_size, micro_batch_size * model.seq_length // cp
    resid = m * h // tp if sequence_parallel else m * h
    fwd = Pass("forward").add(elementwise("mtp_hnorm", resid, 2 * bpe, 8.0, norm=True),
                              elementwise("mtp_enorm", resid, 2 * bpe, 8.0, norm=True))
    bwd = Pass("backward")
    if tp > 1 and sequence_parallel:
        fwd.issue("all_gather", m * 2 * h * bpe)
        bwd.issue("all_gather", m * h * bpe)  # scatter_to_sequence_parallel_region's adjoint
    fwd.add(gemm("mtp_eh_proj", m, h // tp, 2 * h, bpe))
    if tp > 1:
        fwd.issue("all_gather", m * h * bpe)  # gather_from_tensor_model_parallel_region (its adjoint: a split)
    dgrad, wgrad = gemm_grads("mtp_eh_proj", m, h // tp, 2 * h, bpe)
    bwd.add(dgrad)
    if tp > 1:
        bwd.issue("reduce_scatter" if sequence_parallel else "all_reduce", m * 2 * h * bpe, overlappable=True)
    bwd.add(wgrad, elementwise("mtp_norms_grad", 2 * resid, 4 * bpe, 10.0, norm=True))
    return work_of(fwd.kernels, bwd.kernels, (), fwd.comm + bwd.comm)
