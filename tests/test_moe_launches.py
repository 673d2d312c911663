"""Kernels that stand for several launches (simdist.plan.kernel_work.Kernel.launches): Transformer Engine's grouped
GEMM, one cuBLASLt GEMM per local expert over four side streams, and the router's auxiliary-loss chain
(simdist.plan.moe_router); what the GPU and the host pay for them."""

from __future__ import annotations

import dataclasses

import pytest

from simdist.hardware.compute import compute_efficiency, kernel_time_s
from simdist.hardware.gpus import GPU_PRESETS
from simdist.hardware.host import HostOverhead
from simdist.plan.expert_parallel import ExpertParallel
from simdist.plan.kernel_work import TE_GEMM_STREAMS, Kernel, gemm, gemm_grads
from simdist.plan.layer_cost import layer_work
from simdist.plan.model import Model
from simdist.plan.moe_router import AUX_LOSS_KERNELS, aux_loss_kernels
from tests.test_moe_cost import TINY

H100 = GPU_PRESETS["h100-sxm"]
US = 1e-6


def test_a_kernel_pays_a_launch_gap_per_round_of_its_side_streams():
    eff = compute_efficiency(H100)
    one = Kernel("k", 0.0, 1e6, "memory")
    base = kernel_time_s(H100, one, "bf16", eff)
    # 8 launches on 4 streams: two rounds, two gaps; 5 on 4: still two; 3 launches on one stream: three
    for launches, streams, gaps in ((8, 4, 2), (5, 4, 2), (4, 4, 1), (3, 1, 3)):
        k = dataclasses.replace(one, launches=launches, streams=streams)
        assert k.launch_gaps == gaps
        assert kernel_time_s(H100, k, "bf16", eff) == pytest.approx(base + (gaps - 1) * eff.launch_overhead_s,
                                                                     rel=1e-12)


def test_the_host_issues_a_dispatch_per_call_and_a_launch_per_kernel():
    host = HostOverhead(launch_s=5 * US, dispatch_s=3 * US, step_gap_s=20 * US)
    single = Kernel("k", 0.0, 0.0, "memory")
    grouped = dataclasses.replace(single, launches=8, streams=4)  # one call, eight GEMMs
    chain = dataclasses.replace(single, launches=28, calls=21)
    assert host.issue_s(single) == pytest.approx(host.op_s) == pytest.approx(8 * US)
    assert host.issue_s(grouped) == pytest.approx((3 + 8 * 5) * US)
    assert host.issue_s(chain) == pytest.approx((21 * 3 + 28 * 5) * US)
    assert host.run_time_s(1e-3, [single, grouped, chain]) == pytest.approx(1e-3)  # GPU-bound
    assert host.run_time_s(1 * US, [single, grouped, chain]) == pytest.approx((8 + 43 + 203) * US)
    # after a wait: the grouped call's 43 us of issuing delay the kernel after it (1, 1 and 1 us on the GPU):
    # it reaches the GPU at 20 + 8 + 43 = 71 us and ends at 72
    issue = [host.issue_s(k) for k in (single, grouped, single)]
    assert host.ramp_time_s([1 * US] * 3, issue) == pytest.approx(72 * US, rel=1e-12)


# ----------------------------------------------------------------------------- Transformer Engine's grouped GEMM
def test_transformer_engines_grouped_gemm_launches_a_gemm_per_local_expert_on_four_streams():
    assert TE_GEMM_STREAMS == 4
    g = gemm("g", 128, 256, 64, 2, batch=8, grouped=True)
    assert (g.launches, g.streams, g.launch_gaps, g.calls) == (8, 4, 2, 1)
    assert all((k.launches, k.streams) == (8, 4) for k in gemm_grads("g", 128, 256, 64, 2, batch=8, grouped=True))
    two = gemm("g", 128, 256, 64, 2, batch=2, grouped=True)
    assert (two.launches, two.streams, two.launch_gaps) == (2, 2, 1)
    # a batched GEMM (attention's heads) and a single GEMM are one launch
    assert gemm("g", 128, 256, 64, 2, batch=8).launches == gemm("g", 128, 256, 64, 2, grouped=True).launches == 1


def _launches(work) -> int:
    return sum(k.launches for k in (*work.forward, *work.backward))


def test_a_grouped_layer_launches_as_many_gemms_as_one_gemm_per_expert():
    # TINY's MoE layer, 8 experts on ep 1: TEGroupedMLP and SequentialMLP both launch a GEMM per expert and linear
    # (fc1, fc2 forward; their input and weight gradients backward); in bf16 there is nothing else per expert
    grouped = layer_work(TINY, layer=1, experts=ExpertParallel(ep=1, grouped_gemm=True))
    looped = layer_work(TINY, layer=1, experts=ExpertParallel(ep=1, grouped_gemm=False))
    (fc1,) = [k for k in grouped.forward if k.name == "expert_fc1"]
    assert (fc1.launches, fc1.streams) == (8, 4)
    assert _launches(grouped) == _launches(looped)
    assert len([k for k in looped.forward if k.name == "expert_fc1"]) == 8


# ----------------------------------------------------------------------------- the router's auxiliary loss
def test_the_routers_auxiliary_loss_chain_as_counted_with_and_without_fusion():
    t, e = 4096, 128  # Qwen3-30B-A3B's micro-batch on one GPU: the counted case (simdist.plan.moe_router)
    for (fusion, phase), (launches, calls, per) in AUX_LOSS_KERNELS.items():
        k = aux_loss_kernels(t, e, fusion, phase)
        assert (k.launches, k.calls, k.streams, k.kind) == (launches, calls, 1, "memory")
        assert k.hbm_bytes == pytest.approx(per * t * e)
    # beyond simdist's gating GEMM, top-k and their gradients: 45 kernels unfused, 14 with Transformer Engine's
    unfused = AUX_LOSS_KERNELS[False, "forward"][0] + AUX_LOSS_KERNELS[False, "backward"][0] + 2
    fused = AUX_LOSS_KERNELS[True, "forward"][0] + AUX_LOSS_KERNELS[True, "backward"][0] + 2
    assert (unfused, fused) == (45, 14)
    plain = layer_work(TINY, layer=1, experts=ExpertParallel(ep=1))
    fast = layer_work(TINY, layer=1, experts=ExpertParallel(ep=1, router_fusion=True))
    assert _launches(plain) - _launches(fast) == 31
    eff = compute_efficiency(H100)
    time = sum(kernel_time_s(H100, k, "bf16", eff) for k in (*plain.forward, *plain.backward))
    assert time > sum(kernel_time_s(H100, k, "bf16", eff) for k in (*fast.forward, *fast.backward))



# ----------------------------------------------------------------------------- the QK-norm's split under Megatron-Core
def _qk_model(groups: int) -> Model:
    # 8 heads of 16 (q 128 wide), QK-norm, RoPE (swiglu), 128 tokens
    return Model("qk", "decoder", num_layers=1, hidden_size=128, num_attention_heads=8, num_query_groups=groups,
                 ffn_hidden_size=256, seq_length=128, vocab_size=1000, swiglu=True, qk_layernorm=True)


def test_megatron_copies_q_k_and_v_after_splitting_the_qkv_output_and_concatenates_their_gradients():
    m, q, bpe = 128, 128, 2
    work = layer_work(_qk_model(2), attention="cudnn", style="fused")
    fwd, bwd = {k.name: k for k in work.forward}, {k.name: k for k in work.backward}
    k_w = 2 * 16  # 2 groups of 16
    # the query's reshape copies (2 groups of 4 heads: not a view), K and V made contiguous: read + write each
    assert fwd["query_reshape_copy"].hbm_bytes == 2 * bpe * m * q
    assert fwd["key_contiguous"].hbm_bytes == fwd["value_contiguous"].hbm_bytes == 2 * bpe * m * k_w
    # Q's and K's norms and RoPEs one kernel each; each norm's backward a main and a finalize kernel and its
    # weight's main_grad addition; the split's backward one concatenation of dq, dk, dv
    assert (fwd["qk_norm"].launches, fwd["rotary"].launches, bwd["rotary_grad"].launches) == (2, 2, 2)
    assert (bwd["qk_norm_grad"].launches, bwd["qk_norm_grad"].calls) == (6, 4)
    assert bwd["qkv_split_grad_cat"].hbm_bytes == 2 * bpe * m * (q + 2 * k_w)
    # one group (MQA) or a group a head (MHA): the query's reshape is a view
    for groups in (1, 8):
        names = {k.name for k in layer_work(_qk_model(groups), attention="cudnn", style="fused").forward}
        assert "query_reshape_copy" not in names and "key_contiguous" in names
    # compiled PyTorch (OLMo-core, torchtitan) has neither the copies nor TE's launches
    compiled = layer_work(_qk_model(2), attention="cudnn", style="compiled")
    assert not {"query_reshape_copy", "key_contiguous", "qkv_split_grad_cat"} & {k.name for k in compiled.forward
                                                                                 + compiled.backward}
    assert all(k.launches == 1 for k in (*compiled.forward, *compiled.backward))
